"""An ASGI middleware for vLLM's API server: every route needs the API key, except health and metrics.

vLLM's own ``--api-key`` guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``
(vLLM 0.33.0 ``vllm/entrypoints/serve/middleware/authenticate.py`` GUARDED_PREFIX; its ``--api-key``
help says ``/invocations``, "which exposes the same inference capabilities as /v1", stays open, and
so do ``/tokenize``, ``/detokenize``, ``/abort_requests`` and the rest). This middleware inverts
that: a request without ``Authorization: Bearer <VLLM_API_KEY>`` gets 401 on every path except
``OPEN_PATHS`` (the probes' ``/health`` and Prometheus' ``/metrics``); CORS preflights
(``OPTIONS``) pass like in vLLM's own middleware.

The server loads it with ``--middleware kimi_vllm_api_guard.RequireApiKey`` (vLLM's documented
hook: ``app.add_middleware(cls)``), the module's directory on ``PYTHONPATH``. It runs on the
node, inside the vLLM image: standard library only. The key is read once from ``VLLM_API_KEY``
(the same secret vLLM reads); without a key it lets everything through, as vLLM does.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Served without the key: the startup/liveness probes and the Prometheus scrape.
OPEN_PATHS = frozenset({"/health", "/metrics"})
API_KEY_ENV = "VLLM_API_KEY"


class RequireApiKey:
    """ASGI middleware: 401 unless the bearer token is the API key, on every path but ``OPEN_PATHS``.

    Args:
        app: the wrapped ASGI app (vLLM's FastAPI app).
        api_key: the key; default ``$VLLM_API_KEY``. Empty or unset: no check at all.
    """

    def __init__(self, app: ASGIApp, api_key: str | None = None) -> None:
        self.app = app
        key = os.environ.get(API_KEY_ENV, "") if api_key is None else api_key
        self._key_sha256 = hashlib.sha256(key.encode()).digest() if key else None

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and self._key_sha256 is not None:
                    return hmac.compare_digest(hashlib.sha256(token.strip().encode()).digest(), self._key_sha256)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._key_sha256 is None or scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        if path in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


if __name__ == "__main__":  # vLLM imports this module; run by hand (`--help`) it says what it is
    print(__doc__)

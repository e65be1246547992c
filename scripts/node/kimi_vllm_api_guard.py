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
(the same secret vLLM reads).

It fails closed: a key that is unset, empty or shorter than ``MIN_API_KEY_CHARS`` stops the server
at the start of its HTTP side. Starlette builds its middleware inside the first ASGI call (the
lifespan startup), where uvicorn's default ``lifespan="auto"`` swallows an exception ("ASGI
'lifespan' protocol appears unsupported") and serves on; so the guard does not raise there: it
answers the lifespan startup with ``lifespan.startup.failed`` and its reason, which uvicorn logs
("Application startup failed. Exiting.") before it exits with status 3 (uvicorn 0.54
``STARTUP_FAILURE``). A server run without a lifespan gets 503 on every route, probes included.
The reason names the variable and the minimum, never the key.

The engine-cache gate: while ``KIMI_ENGINE_CACHE_GATE`` names a file that does not exist yet, every
route but ``OPEN_PATHS`` answers 503 with ``GATE_HEADER: closed``, key or not, so no request reaches
the engine before ``scripts/node/engine_cache.py save`` has snapshotted the compile caches it wrote
at start (the save creates the file right after). The file is checked at each request until it
exists; unset, the guard does not gate.
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
# The shortest key the guard serves with, characters: NIST SP 800-63B-4 (August 2024) section
# 3.1.1.2, "passwords that are used as a single-factor authentication mechanism [...] a minimum of
# 15 characters". The same figure as components/core/vllm.py API_KEY_MIN_CHARS (the deploy-time
# check; tests/test_api_guard.py holds them equal): this file runs in the image, standard library only.
MIN_API_KEY_CHARS = 15
# The engine-cache gate (scripts/node/engine_cache.py GATE_HEADER, held equal by the tests).
GATE_ENV = "KIMI_ENGINE_CACHE_GATE"
GATE_HEADER = "x-kimi-engine-cache-gate"


def key_refusal(key: str | None) -> str | None:
    """Why ``key`` cannot guard the server (a one-line reason that never contains the key), or None.

    Args:
        key: the configured API key; None or empty when unset.
    """
    if not key:
        return (f"kimi_vllm_api_guard: {API_KEY_ENV} is unset or empty: the server would be open to anyone; "
                f"refusing to serve (set the stack secret kimi-deploy:apiKey, or unset it to have one generated)")
    if len(key) < MIN_API_KEY_CHARS:
        return (f"kimi_vllm_api_guard: {API_KEY_ENV} is shorter than {MIN_API_KEY_CHARS} characters "
                f"(NIST SP 800-63B-4 section 3.1.1.2); refusing to serve")
    return None


class RequireApiKey:
    """ASGI middleware: 401 unless the bearer token is the API key, on every path but ``OPEN_PATHS``.

    Args:
        app: the wrapped ASGI app (vLLM's FastAPI app).
        api_key: the key; default ``$VLLM_API_KEY``. Unset, empty or shorter than
            ``MIN_API_KEY_CHARS``: ``refusal`` says why, the lifespan startup fails with it and
            every request gets 503 (the wrapped app never runs).
        gate: the engine-cache gate file; default ``$KIMI_ENGINE_CACHE_GATE`` (empty: no gate).
            Until it exists every route but ``OPEN_PATHS`` gets 503 with ``GATE_HEADER: closed``.
    """

    def __init__(self, app: ASGIApp, api_key: str | None = None, gate: str | None = None) -> None:
        self.app = app
        self._gate = os.environ.get(GATE_ENV) or None if gate is None else gate or None
        key = os.environ.get(API_KEY_ENV, "") if api_key is None else api_key
        self.refusal = key_refusal(key)
        self._key_sha256 = hashlib.sha256(key.encode()).digest() if self.refusal is None else None

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer" and self._key_sha256 is not None:
                    return hmac.compare_digest(hashlib.sha256(token.strip().encode()).digest(), self._key_sha256)
        return False

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """No usable key: fail the lifespan startup (uvicorn exits), 503 or close any request."""
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.startup":
                pass
            await send({"type": "lifespan.startup.failed", "message": self.refusal})
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1011})  # internal error
        elif scope["type"] == "http":
            body = json.dumps({"error": "Service Unavailable: the API key is not configured"}).encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

    async def _gated(self, scope: Scope, send: Send) -> None:
        """The engine-cache gate is closed: 503 (``GATE_HEADER: closed``), or close a websocket."""
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        body = json.dumps({"error": "Service Unavailable: the engine is starting"}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", b"10"), (GATE_HEADER.encode(), b"closed")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.refusal is not None:
            await self._refuse(scope, receive, send)
            return
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        root = scope.get("root_path") or ""
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        if path not in OPEN_PATHS and self._gate is not None:
            if not os.path.exists(self._gate):
                await self._gated(scope, send)
                return
            self._gate = None  # open for good: no more stat per request
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

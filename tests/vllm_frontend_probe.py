#!/usr/bin/env python3
"""Helper (not a test module), run with the vLLM parser venv's python: does the pinned vLLM's Python
API frontend put the API guard in front of every route it serves?

stdin: ``{"argv": [MODEL, FLAG, ...], "key": KEY}``: a role's ``vllm serve`` argv (its ``--middleware``
included); the caller puts the directory holding ``kimi_vllm_api_guard.py`` on ``PYTHONPATH``, as the
node's env does. The app is vLLM's own: ``vllm.entrypoints.launchers.app.build_app`` over the argv
parsed by vLLM's parser, with ``VLLM_API_KEY`` set, as ``vllm serve`` builds it before the engine is
attached. Every route of that app is called through the whole middleware stack (ASGI, in process,
no socket, no engine) without a key and with the key; a route whose handler then fails for want of
an engine has still been reached.

stdout, one JSON object: ``{"middleware": [class names, outermost first],
"routes": [{"path", "method", "without_key": status | "reached", "with_key": status | "reached"}]}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any


async def _call(app: Any, path: str, method: str, key: str | None) -> int | str:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "state": {}}
    try:
        await app(scope, receive, send)
    except Exception:  # noqa: BLE001 - the handler ran without an engine: the request got past the guard
        return "reached"
    return next((m["status"] for m in sent if m["type"] == "http.response.start"), "reached")


def build_pinned_app(argv: list[str], key: str) -> Any:
    """The pinned vLLM's own API app (``build_app``) over ``vllm serve ARGV`` parsed by vLLM's own
    parser, with ``VLLM_API_KEY`` set to ``key``, on CPU, no engine. Shared with
    ``vllm_guard_startup_probe.py`` (run from this directory, so it imports this module)."""
    os.environ.update({"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "VLLM_API_KEY": key})
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.app import build_app
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = ServeSubcommand()
    serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
    args = parser.parse_args(["serve", *argv])
    args.model = args.model_tag
    return build_app(args, supported_tasks=("generate",))


def main() -> int:
    request = json.load(sys.stdin)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM logs on import: stdout carries the JSON alone
    app = build_pinned_app(request["argv"], request["key"])
    routes = sorted({(r.path, sorted(getattr(r, "methods", None) or {"GET"})[0]) for r in app.routes})

    async def run() -> list[dict[str, Any]]:
        rows = []
        for path, method in routes:
            concrete = path.replace("{", "").replace("}", "")  # /v1/responses/{response_id} -> a value
            rows.append({"path": path, "method": method, "without_key": await _call(app, concrete, method, None),
                         "with_key": await _call(app, concrete, method, request["key"])})
        return rows

    report = {"middleware": [m.cls.__name__ for m in app.user_middleware], "routes": asyncio.run(run())}
    out.write(json.dumps(report) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Helper (not a test module), run with the vLLM parser venv's python: does the pinned vLLM's HTTP
server stop at its start when the API guard has no usable key?

stdin: ``{"argv": [MODEL, FLAG, ...], "key": KEY}``: a role's ``vllm serve`` argv (its ``--middleware``
included); the caller puts the directory holding ``kimi_vllm_api_guard.py`` on ``PYTHONPATH``, as the
node's env does. The app is vLLM's own (``build_app`` over the argv parsed by vLLM's parser, with
``VLLM_API_KEY`` set to KEY), served by vLLM's own ``serve_http`` (uvicorn with the options vLLM
gives it) on 127.0.0.1, an ephemeral port, no engine. The process's exit status and stderr are the
answer: uvicorn exits 3 when the lifespan startup fails; a server that starts is stopped by this
helper as soon as it is up, and the helper then prints ``served`` and exits 0.
"""

from __future__ import annotations

import asyncio
import json
import sys


def main() -> int:
    request = json.load(sys.stdin)
    # The same app the route probe builds (sys.path[0] is this file's directory, tests/).
    from vllm_frontend_probe import build_pinned_app

    app = build_pinned_app(request["argv"], request["key"])
    from vllm.entrypoints.launchers.launcher import serve_http

    app.state.engine_client = None  # no engine: what init_app_state would set, without one
    app.state.log_stats = False

    async def run() -> None:
        task = asyncio.ensure_future(serve_http(app, sock=None, host="127.0.0.1", port=0))
        while not task.done():  # started: stop it (a guard that lets the server start fails the caller)
            server = getattr(app.state, "server", None)
            if server is not None and server.started and not server.should_exit:
                server.should_exit = True
                print("served", flush=True)
            await asyncio.sleep(0.05)
        await task

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())

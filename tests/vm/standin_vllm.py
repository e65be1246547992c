#!/usr/bin/python3
"""The ``vllm`` entry point of the VM tier's stand-in image (the GPU server cannot run there).

``vllm serve MODEL [--served-model-name NAME...] [--host H] [--port P] [--api-key K] ...``, the
argv ``kimi-vllm.service`` runs (other vLLM flags are accepted and ignored). It does what the
real server does that the boot chain depends on: refuses a model directory without
``config.json``; reads every file of it (the weights, as vLLM's loader does); writes into
``$VLLM_CACHE_ROOT`` as vLLM's compile step does (so the engine-cache save has something to
archive, and a restored cache is reported); then serves ``/health`` (200) and ``/v1/models``
(with ``--api-key`` or ``VLLM_API_KEY`` set, only with ``Authorization: Bearer <key>``, as
vLLM 0.33.0's ``--api-key`` guards ``/v1``), printing uvicorn's "Application startup complete."
when it is ready. Standard library only; stops cleanly on SIGTERM (``docker stop``).

SIGUSR1 (``docker kill --signal USR1``) makes it hang as a wedged engine does: the process stays
up, every later ``/health`` request is accepted and never answered (the watchdog's case,
``components/aws/userdata.py`` ``watch_script``); a new start serves again.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READ_CHUNK_BYTES = 1 << 20
COMPILE_MARKER = "torch_compile_cache/standin-compiled.json"


def log(message: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [standin-vllm] {message}", flush=True)


def load(model: str) -> tuple[int, int, str]:
    """Read every file under ``model`` (weight-sync state excluded). Returns (files, bytes, sha256 of the tree)."""
    if not os.path.isfile(os.path.join(model, "config.json")):
        raise SystemExit(f"ERROR [standin-vllm] {model}: no config.json (not a model directory)")
    tree = hashlib.sha256()
    files = total = 0
    for dirpath, dirnames, filenames in os.walk(model):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(READ_CHUNK_BYTES):
                    digest.update(chunk)
                    total += len(chunk)
            tree.update(f"{os.path.relpath(path, model)} {digest.hexdigest()}\n".encode())
            files += 1
    return files, total, tree.hexdigest()


def compile_cache(tree_sha256: str) -> str:
    """``hit`` when ``$VLLM_CACHE_ROOT`` already holds this model's compile output, else write it
    (``compiled``); ``none`` without ``VLLM_CACHE_ROOT``."""
    root = os.environ.get("VLLM_CACHE_ROOT")
    if not root:
        return "none"
    path = os.path.join(root, COMPILE_MARKER)
    try:
        with open(path) as f:
            if json.load(f).get("weights_sha256") == tree_sha256:
                return "hit"
    except (OSError, ValueError):
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"weights_sha256": tree_sha256, "compiled_at": time.time()}, f)
    return "compiled"


HANG_LINE = "/health hangs from now on (SIGUSR1): the process stays up"


def serve(args: argparse.Namespace, api_key: str | None) -> None:
    names = args.served_model_name or [args.model]
    hung = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, status: int, doc: dict | None) -> None:
            body = json.dumps(doc).encode() if doc is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                if hung.is_set():
                    threading.Event().wait()  # never answered (a daemon thread: stopping does not wait for it)
                return self._send(200, None)
            if self.path.startswith("/v1/"):
                if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                    return self._send(401, {"error": "Unauthorized"})
                if self.path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [
                        {"id": n, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": args.model,
                         "max_model_len": args.max_model_len} for n in names]})
            return self._send(404, {"error": "Not Found"})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    # docker stop sends SIGTERM: stop serving and exit 0 (shutdown() must run off the serving thread).
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    signal.signal(signal.SIGUSR1, lambda *_: (hung.set(), log(HANG_LINE)))
    log(f"serving {names} from {args.model} on {args.host}:{args.port}")
    print("INFO:     Application startup complete.", flush=True)
    server.serve_forever()
    log("shutting down")
    server.server_close()


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print("usage: vllm serve MODEL [options] (VM tier stand-in)", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    p.add_argument("model")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--middleware", action="append", default=[])
    args, ignored = p.parse_known_args(argv[1:])
    # As vLLM 0.33.0 does at start-up (vllm/entrypoints/serve/middleware/register.py: importlib of each
    # --middleware path): a class that cannot be imported from the container's PYTHONPATH ends the server.
    for path in args.middleware:
        module_name, _, class_name = path.rpartition(".")
        getattr(importlib.import_module(module_name), class_name)
        log(f"middleware {path} loaded from {sys.modules[module_name].__file__}")
    started = time.monotonic()
    files, total, tree = load(args.model)
    log(f"loaded {files} files, {total} bytes from {args.model} in {time.monotonic() - started:.1f} s (sha256 {tree[:16]})")
    log(f"compile cache: {compile_cache(tree)}")
    log(f"ignored flags of the real server: {len([a for a in ignored if a.startswith('--')])}")
    serve(args, args.api_key or os.environ.get("VLLM_API_KEY"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

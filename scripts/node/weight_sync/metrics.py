"""Progress of a sync as Prometheus metrics: the bytes it has moved so far, served on
``/metrics`` while it runs, so an alert can tell a slow copy (bytes still moving) from a stalled
one (bytes stopped), instead of timing the run.

Enabled by the environment variable ``KIMI_SYNC_METRICS_PORT`` (a TCP port; unset or empty: no
server). On Kubernetes the node-local copy (the ``weight-sync`` init container) and the sync Jobs
set it and declare the port as ``sync-metrics``, which the stack's PodMonitor scrapes
(``components/k8s/vllm_service.py``; the names are ``components/core/metrics.py``'s, a test keeps
them equal). The server is a daemon thread of the standard library: it answers while the copy
threads block in I/O, and ends with the process.

Series (text exposition format 0.0.4, no labels of its own; the scrape adds namespace, pod,
container):
- ``kimi_weight_sync_transferred_bytes_total`` (counter, bytes): bytes written or verified by this
  process (every byte the progress counter sees: downloads, copies, local checks).
- ``kimi_weight_sync_planned_bytes`` (gauge, bytes): bytes this run set out to move (0 until the
  plan is known).
"""
from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT_ENV = "KIMI_SYNC_METRICS_PORT"
TRANSFERRED_BYTES = "kimi_weight_sync_transferred_bytes_total"
PLANNED_BYTES = "kimi_weight_sync_planned_bytes"

_lock = threading.Lock()
_transferred = 0
_planned = 0


def add_transferred(n_bytes: int) -> None:
    """Count ``n_bytes`` more bytes moved (thread-safe)."""
    global _transferred
    with _lock:
        _transferred += n_bytes


def add_planned(n_bytes: int) -> None:
    """Count ``n_bytes`` more bytes planned (each transfer phase adds what it will move)."""
    global _planned
    with _lock:
        _planned += n_bytes


def exposition() -> str:
    """The metrics in Prometheus' text format (version 0.0.4)."""
    with _lock:
        moved, planned = _transferred, _planned
    return (
        f"# HELP {TRANSFERRED_BYTES} Bytes the weight sync has moved so far (this process).\n"
        f"# TYPE {TRANSFERRED_BYTES} counter\n"
        f"{TRANSFERRED_BYTES} {moved}\n"
        f"# HELP {PLANNED_BYTES} Bytes the weight sync set out to move (this process).\n"
        f"# TYPE {PLANNED_BYTES} gauge\n"
        f"{PLANNED_BYTES} {planned}\n"
    )


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404)
            return
        body = exposition().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        return  # one line per scrape would drown the progress log


def serve_from_env(host: str = "0.0.0.0") -> ThreadingHTTPServer | None:
    """Start the server on ``$KIMI_SYNC_METRICS_PORT`` in a daemon thread; None when unset.

    Raises:
        ValueError: the variable is not a port number (1-65535).
        OSError: the port cannot be bound.
    """
    raw = os.environ.get(PORT_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"{PORT_ENV}={raw!r}: expected a TCP port 1-65535")
    server = ThreadingHTTPServer((host, int(raw)), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="sync-metrics", daemon=True).start()
    return server

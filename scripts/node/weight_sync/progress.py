"""Progress reporting on stderr: a bar on a terminal, else a log line every few seconds."""
from __future__ import annotations

import sys
import threading
import time

from . import metrics
from .model import LOG_INTERVAL_SECONDS, human_bytes

# ---------------------------------------------------------------------------------------------
# Progress


class Progress:
    """Thread-safe byte counter with a reporter: a bar on a terminal, else a log line every
    LOG_INTERVAL_SECONDS. All output goes to stderr. Every count also feeds the sync's
    ``/metrics`` (``metrics.py``): planned bytes at creation, moved bytes as they arrive."""

    def __init__(self, total_bytes: int, total_files: int, enabled: bool = True):
        self.total_bytes, self.total_files = total_bytes, total_files
        self.done_bytes = self.done_files = 0
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._tty = sys.stderr.isatty()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True) if enabled else None
        metrics.add_planned(total_bytes)

    def start(self) -> Progress:
        self._start = time.monotonic()
        if self._thread:
            self._thread.start()
        return self

    def add(self, n_bytes: int) -> None:
        with self._lock:
            self.done_bytes += n_bytes
        metrics.add_transferred(n_bytes)

    def file_done(self) -> None:
        with self._lock:
            self.done_files += 1

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        rate = self.done_bytes / elapsed
        left = max(self.total_bytes - self.done_bytes, 0)
        eta = f"{int(left / rate) // 60}:{int(left / rate) % 60:02d}" if rate > 0 else "--:--"
        pct = 100.0 * self.done_bytes / self.total_bytes if self.total_bytes else 100.0
        text = (f"{human_bytes(self.done_bytes)}/{human_bytes(self.total_bytes)} ({pct:.0f}%) "
                f"{human_bytes(rate)}/s ETA {eta} files {self.done_files}/{self.total_files}")
        if self._tty:
            filled = int(30 * pct / 100)
            return f"\r[{'#' * filled}{'.' * (30 - filled)}] {text}\x1b[K"
        return f"weight_sync: {text}\n"

    def _run(self) -> None:
        while not self._stop.wait(0.5 if self._tty else LOG_INTERVAL_SECONDS):
            sys.stderr.write(self.line())
            sys.stderr.flush()

    def stop(self) -> None:
        if self._thread and self._thread.is_alive():
            self._stop.set()
            self._thread.join()
            if self.total_files:
                sys.stderr.write(self.line() + ("\n" if self._tty else ""))
                sys.stderr.flush()


"""Completion you can trust on every storage: a copy is ready when its marker, its manifest and
every file the manifest lists (name and size) are there, not when the marker alone is.

Why the marker is not enough: on an FSx for Lustre file system fed by a data repository
association, files appear through an asynchronous import of S3 events, in no particular order
("Automatically import updates from your S3 bucket", FSx for Lustre user guide); the publish step
writes the marker to S3 last, but it can be imported before shards that were written earlier. The
import brings each file's metadata, its full size included, at once (content loads on first read),
so names and sizes tell when the import has produced every listed file.

Two users: ``wait_until_complete`` (the vLLM pods' readiness gate on a claim, run from the zipapp by
``main``) and ``wait_for_file`` (a ``file://`` source fed by an import: ``sources.FileSource`` with
``--source-wait-seconds``: a file that is not there yet is waited for, then read).

Standard library only. ``python3 weight_sync.pyz`` is the copy; the gate runs this module out of
the same zipapp: ``python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from weight_sync.ready
import main; sys.exit(main(sys.argv[2:]))' weight_sync.pyz DIR BUDGET_SECONDS``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

from .model import MANIFEST_NAME, MARKER_NAME, FileEntry, SyncError, manifest_digest, parse_manifest

# Seconds between two looks at a directory that is not complete yet.
POLL_SECONDS = 2.0
# Missing files named in a message (the rest are counted).
SHOWN_FILES = 3


def _read_json(path: str) -> object:
    with open(path) as f:
        return json.load(f)


def _file_problem(path: str, size_bytes: int) -> str | None:
    """Why ``path`` is not the listed file yet (missing, or another size), or None."""
    try:
        actual = os.stat(path).st_size
    except FileNotFoundError:
        return "missing"
    if actual != size_bytes:
        return f"{actual} bytes, the manifest lists {size_bytes}"
    return None


def completeness_problem(root: str) -> str | None:
    """Why ``root`` is not a complete copy yet, in one line, or None when it is: the completion
    marker and manifest.json are there and agree (the marker's ``manifest_sha256`` is the
    manifest's digest), and every file the manifest lists exists at its listed size."""
    marker_path, manifest_path = os.path.join(root, MARKER_NAME), os.path.join(root, MANIFEST_NAME)
    try:
        marker = _read_json(marker_path)
    except FileNotFoundError:
        return f"no completion marker {MARKER_NAME}"
    except (OSError, ValueError) as exc:
        return f"{MARKER_NAME} is not readable JSON yet ({exc.__class__.__name__})"
    try:
        _, entries = parse_manifest(_read_json(manifest_path), manifest_path)
    except FileNotFoundError:
        return f"no {MANIFEST_NAME}"
    except (OSError, ValueError, SyncError) as exc:
        return f"{MANIFEST_NAME} is not a readable manifest yet ({str(exc).splitlines()[0][:120]})"
    wanted = marker.get("manifest_sha256") if isinstance(marker, dict) else None
    if wanted != manifest_digest(entries):
        return f"{MARKER_NAME} names manifest {str(wanted)[:12]}..., {MANIFEST_NAME} is {manifest_digest(entries)[:12]}..."
    return listed_files_problem(root, entries)


def listed_files_problem(root: str, entries: list[FileEntry]) -> str | None:
    """Which listed files are not in ``root`` at their listed size (the first ``SHOWN_FILES``
    named, the rest counted), in one line, or None when all are."""
    bad = [(e.path, p) for e in entries if (p := _file_problem(os.path.join(root, *e.path.split("/")), e.size_bytes))]
    if not bad:
        return None
    shown = ", ".join(f"{path} ({why})" for path, why in bad[:SHOWN_FILES])
    more = f" and {len(bad) - SHOWN_FILES} more" if len(bad) > SHOWN_FILES else ""
    return f"{len(bad)} of {len(entries)} listed files not there yet: {shown}{more}"


def wait_until_complete(
    root: str, budget_seconds: float, poll_seconds: float = POLL_SECONDS, log: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Wait until ``root`` is a complete copy (``completeness_problem`` is None), looking every
    ``poll_seconds`` for at most ``budget_seconds``; ``log`` gets a line when the reason changes.

    Returns:
        The marker document.

    Raises:
        SyncError: still incomplete after the budget: one line with the last reason.
    """
    deadline = clock() + budget_seconds
    last = None
    while True:
        problem = completeness_problem(root)
        if problem is None:
            return _read_json(os.path.join(root, MARKER_NAME))  # type: ignore[return-value]  # checked: a dict
        if log is not None and problem != last:
            log(f"waiting for {root}: {problem}")
        last = problem
        if clock() >= deadline:
            raise SyncError(
                f"weights at {root} not complete after {budget_seconds:.0f} s: {problem} (on an FSx file system "
                "linked to S3 the import has not produced them: check the data repository association's "
                "auto-import and `aws fsx describe-data-repository-tasks`; elsewhere the weight-sync Job has "
                "not finished)"
            )
        sleep(min(poll_seconds, max(deadline - clock(), 0.0)))


def wait_for_file(
    path: str, size_bytes: int, deadline: float, what: str, poll_seconds: float = POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until ``path`` exists at ``size_bytes`` bytes, at most until ``deadline`` (a ``clock``
    value); ``what`` names the file in the error.

    Raises:
        SyncError: still missing or of another size at the deadline: one line.
    """
    while (problem := _file_problem(path, size_bytes)) is not None:
        if clock() >= deadline:
            raise SyncError(
                f"{what}: {problem} in {os.path.dirname(path) or '.'} when the import wait ran out "
                "(--source-wait-seconds): the file system's import from S3 (data repository association) has not "
                "produced it; check the association's auto-import and `aws fsx describe-data-repository-tasks`"
            )
        sleep(min(poll_seconds, max(deadline - clock(), 0.0)))


def main(argv: list[str] | None = None) -> int:
    """``DIR BUDGET_SECONDS [POLL_SECONDS]``: exit 0 when ``DIR`` is a complete copy (one line on
    stdout), 1 when it is still not after the budget (one line on stderr), 2 on a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        root, budget = args[0], float(args[1])
        poll = float(args[2]) if len(args) > 2 else POLL_SECONDS
        if budget < 0 or poll <= 0 or len(args) > 3:
            raise ValueError
    except (IndexError, ValueError):
        print("weight_sync.ready: usage error: expected DIR BUDGET_SECONDS [POLL_SECONDS] (numbers >= 0, poll > 0)",
              file=sys.stderr)
        return 2

    def log(message: str) -> None:
        print(f"weight_sync.ready: {message}", file=sys.stderr, flush=True)

    try:
        marker = wait_until_complete(root, budget, poll, log=log)
    except SyncError as exc:
        print(f"weight_sync.ready: error: {exc}", file=sys.stderr)
        return 1
    print(f"weights complete: {marker.get('file_count')} files, {marker.get('total_bytes')} bytes, "
          f"revision {marker.get('revision')} at {root}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

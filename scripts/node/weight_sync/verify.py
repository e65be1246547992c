"""Verification of the bytes as they stream in: the Sink (hashes and checksums while writing),
stall detection, and the comparison with the manifest."""
from __future__ import annotations

import base64
import hashlib
import os
import time
import zlib
from typing import Any, Protocol

from .fsio import advise_sequential, start_writeback
from .model import CHUNK_BYTES, LOCAL_CHUNK_BYTES, FileEntry, IntegrityError, TransientError
from .progress import Progress

# Stall detection: a file transfer that delivers fewer than MIN_BYTES_PER_SECOND on average over
# any THROUGHPUT_WINDOW_SECONDS is abandoned as transient (then retried, then the run fails). A
# read timeout alone never fires on a connection that trickles a few bytes at a time.
# --min-bytes-per-second / --throughput-window-seconds set them; 0 turns the check off.
MIN_BYTES_PER_SECOND = 1_000_000
THROUGHPUT_WINDOW_SECONDS = 120.0
# ---------------------------------------------------------------------------------------------
# Sink: a temporary file that hashes what is written to it


class Sink:
    """Write-only temporary file that computes sha256 (and the git blob sha1 when asked) of the
    bytes as they are written. Sources call `write` with chunks in order, or `adopt` a file a
    library has written (then it is hashed in one read)."""

    def __init__(self, tmp_path: str, progress: Progress, git_blob_size: int | None = None,
                 sha256: bool = True, checksums: tuple[str, ...] = ()):
        self.tmp_path, self.progress = tmp_path, progress
        os.makedirs(os.path.dirname(tmp_path), exist_ok=True)
        self._file = open(tmp_path, "wb", buffering=0)
        # sha256 of the bytes (None: not computed, the copy is checked by a checksum instead).
        self.sha256 = hashlib.sha256() if sha256 else None
        # CRC state per checksum algorithm (see CHECKSUM_BYTES); an algorithm S3 validated in
        # flight for this object is dropped from it (``validated_by_s3``).
        fns = checksum_functions()
        self.crcs: dict[str, int] = {name: 0 for name in checksums if name in fns}
        self._crc_fns = fns
        self.validated_by_s3: dict[str, str] = {}
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
        if self.sha256 is not None:
            self.sha256.update(view)
        for name, crc in self.crcs.items():
            self.crcs[name] = self._crc_fns[name](view, crc)
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
                if self.sha256 is not None:
                    self.sha256.update(memoryview(buf)[:n])
                for name, crc in self.crcs.items():
                    self.crcs[name] = self._crc_fns[name](memoryview(buf)[:n], crc)
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


class Fetcher(Protocol):
    """What ``fetch_verified`` needs of a checkpoint source (``sources.Source`` and its kinds): write
    one file's bytes into a ``Sink``. Declared here, where it is used, so this module imports
    nothing of ``sources`` (which imports ``Sink`` from here)."""

    def fetch(self, entry: FileEntry, sink: Sink) -> None:
        """Write ``entry``'s bytes into ``sink``, in order."""


class _WriteOnly:
    """Hides seek/tell so s3transfer writes parts in order (its non-seekable download path)."""

    def __init__(self, sink: Sink):
        self.write = sink.write


def hash_file(path: str, progress: Progress | None = None) -> tuple[int, str]:
    """(size_bytes, sha256 hex) of a local file, read once in LOCAL_CHUNK_BYTES pieces."""
    size, sha, _ = digest_file(path, progress)
    return size, sha


def digest_file(path: str, progress: Progress | None = None,
                checksums: tuple[str, ...] = ()) -> tuple[int, str, dict[str, str]]:
    """(size_bytes, sha256 hex, {algorithm: S3-form checksum}) of a local file, read once."""
    sha, size, buf = hashlib.sha256(), 0, bytearray(LOCAL_CHUNK_BYTES)
    fns = checksum_functions()
    crcs = {name: 0 for name in checksums if name in fns}
    with open(path, "rb", buffering=0) as f:
        advise_sequential(f.fileno())
        while n := f.readinto(buf):
            view = memoryview(buf)[:n]
            sha.update(view)
            for name, crc in crcs.items():
                crcs[name] = fns[name](view, crc)
            size += n
            if progress:
                progress.add(n)
    return size, sha.hexdigest(), {name: encode_checksum(name, crc) for name, crc in crcs.items()}


# Object checksums (S3 "additional checksums": https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html),
# name -> width in bytes. Values are S3's form: base64 of the big-endian CRC (x-amz-checksum-*).
# crc32 is the standard library's (zlib, about 0.4 CPU s/GB here); crc64nvme needs awscrt
# (hardware CRC, about 0.1 CPU s/GB here; what botocore uses for it too). Preferred first.
CHECKSUM_BYTES = {"crc64nvme": 8, "crc32": 4}
_CHECKSUM_FNS: dict[str, Any] = {}


def checksum_functions() -> dict[str, Any]:
    """Available CRC functions ``fn(data, previous) -> int``: crc32 always, crc64nvme with awscrt."""
    if not _CHECKSUM_FNS:
        _CHECKSUM_FNS["crc32"] = zlib.crc32
        try:
            from awscrt import checksums  # optional: boto3[crt]; imported only when checksums are used

            _CHECKSUM_FNS["crc64nvme"] = checksums.crc64nvme
        except ImportError:
            pass
    return _CHECKSUM_FNS


def encode_checksum(name: str, value: int) -> str:
    """S3's form of a checksum: base64 of the big-endian value (4 bytes crc32, 8 crc64nvme)."""
    return base64.b64encode(value.to_bytes(CHECKSUM_BYTES[name], "big")).decode("ascii")


def usable_checksum(entry: FileEntry) -> str | None:
    """The preferred algorithm the manifest lists for ``entry`` and this host can compute, or None."""
    fns = checksum_functions()
    return next((n for n in CHECKSUM_BYTES if n in (entry.checksums or {}) and n in fns), None)

def sink_checksums(sink: Sink) -> dict[str, str]:
    """The checksums a sink computed, in S3's form."""
    return {name: encode_checksum(name, crc) for name, crc in sink.crcs.items()}


def check_checksum(entry: FileEntry, sink: Sink, algorithm: str) -> None:
    """Compare the object checksum ``algorithm`` of what was received with the manifest's: the
    value S3 returned and botocore validated in flight (``sink.validated_by_s3``), else the one
    the sink computed. Raises IntegrityError on a mismatch."""
    expected = (entry.checksums or {}).get(algorithm)
    got = sink.validated_by_s3.get(algorithm) or sink_checksums(sink).get(algorithm)
    if got != expected:
        raise IntegrityError(f"{entry.path}: {algorithm} {got} does not match the manifest's {expected}")


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


def fetch_verified(source: Fetcher, entry: FileEntry, tmp_path: str, progress: Progress,
                   durable: bool = True, writeback: bool = False, by_checksum: bool = False,
                   checksums: tuple[str, ...] = (), checksums_out: dict[str, str] | None = None) -> str:
    """Fetch `entry` into `tmp_path`, checking the bytes as they arrive; return its sha256 hex.

    by_checksum: when the manifest lists a checksum this host can compute (``usable_checksum``),
    check size + that checksum (validated in flight by botocore where S3 returns it, else by the
    sink) instead of sha256, and return the manifest's sha256 (verified when the mirror was
    filled). checksums: algorithms to compute besides sha256 (publishing: they go in the
    manifest), written into ``checksums_out``. On any failure the partial file is removed and
    its bytes taken off the progress count.
    Raises IntegrityError, SyncError, or the source's own (possibly transient) errors."""
    algorithm = usable_checksum(entry) if by_checksum and entry.sha256 else None
    sink = Sink(tmp_path, progress, entry.size_bytes if entry.git_sha1 else None,
                sha256=algorithm is None, checksums=(algorithm,) if algorithm else checksums)
    ok = False
    try:
        source.fetch(entry, sink)
        sink.close(durable=durable, writeback=writeback)
        if algorithm and entry.sha256 and entry.checksums:
            check_checksum(entry, sink, algorithm)
            sha = check_bytes(entry, sink.size_bytes, entry.sha256)
        else:
            assert sink.sha256 is not None  # sha256=True above
            sha = check_bytes(entry, sink.size_bytes, sink.sha256.hexdigest(),
                              sink.git_sha1.hexdigest() if sink.git_sha1 is not None else None)
        if checksums_out is not None:
            checksums_out.update(sink_checksums(sink))
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




# Bytes per copy_file_range/sendfile call: large and aligned (a multiple of the page size and of
# RAID0 stripe sizes), so the kernel copies in big extents without a user-space buffer.
COPY_RANGE_BYTES = 64 << 20


def copy_file(src: str, dst: str, progress: Progress | None = None) -> int:
    """Copy ``src`` to a new file ``dst`` inside the kernel: ``os.copy_file_range`` (Linux 4.5+;
    reflinks or server-side copies where the file system can), else ``os.sendfile``, else
    read/write; then start the writeback of ``dst`` (durability comes from the destination's
    syncfs). Returns the bytes copied. No hashing: only for sources already verified.

    Raises:
        OSError: reading or writing failed (ENOSPC is permanent for the retry layer).
    """
    copied = 0
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        advise_sequential(fin.fileno())
        size = os.fstat(fin.fileno()).st_size
        fn = getattr(os, "copy_file_range", None)
        while copied < size:
            try:
                if fn is not None:
                    n = fn(fin.fileno(), fout.fileno(), COPY_RANGE_BYTES)
                else:
                    n = os.sendfile(fout.fileno(), fin.fileno(), None, COPY_RANGE_BYTES)
            except OSError as exc:  # EXDEV/ENOSYS/EINVAL on some file systems: fall back
                if fn is None or exc.errno not in (18, 38, 22, 95):
                    raise
                fn = None
                continue
            if n == 0:
                break
            copied += n
            if progress:
                progress.add(n)
        start_writeback(fout.fileno())
    return copied

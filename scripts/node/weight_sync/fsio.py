"""File-system helpers: atomic JSON, fsync of directories, syncfs, writeback and read hints."""
from __future__ import annotations

import json
import os


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


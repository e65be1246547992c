#!/usr/bin/env python3
"""Restore or save vLLM's compile and kernel caches (one tar archive per key) next to the weights.

  engine_cache.py restore --uri s3://B/P/_engine-cache/KEY.tar --dir /models/.kimi-engine-cache/KEY --key KEY
  engine_cache.py save    --uri ... --dir ... --key KEY [--wait-url http://127.0.0.1:8000/health]

restore: before vLLM starts. A directory already holding KEY is kept; else the archive's sha256
manifest (``KEY.tar.manifest.json`` beside it, written after the archive) is fetched, then the
archive: an archive whose sha256 is not the manifest's, whose recorded key
(``engine-cache-key.json``, the first member) is not KEY, or whose extracted files are not exactly
the manifest's (path, size, sha256) is refused and the engine starts cold (never a cache of another
build or layout, nor one changed after it was saved). An archive without a manifest is refused too.
Members are extracted only inside the directory (no absolute paths, ``..``, devices or links
pointing out of it). A missing archive is not an error (first start).
save: after the first start that answered the health URL: snapshots the directory (which must
record KEY) into a local archive at once, then opens ``--gate`` (a file the pod's readiness waits
for: no request reaches the engine before the snapshot is taken), then uploads the archive and its
manifest unless a manifest exists already (the first successful start wins; never overwritten).

Standard library only, plus boto3 for s3:// (present in the vLLM image); file:// URIs and plain
paths work too (tests, local mirrors). Exit codes: 0 done or skipped (the engine can start
either way), 1 failed, 2 usage error. The key is computed by ``components/core/engine_cache.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request

KEY_FILE_NAME = "engine-cache-key.json"
# The sha256 manifest of an archive: the archive's URI plus this suffix (uploaded after the archive).
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1
WAIT_POLL_SECONDS = 10.0


class CacheError(Exception):
    """The archive cannot be used (exit 1)."""


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket or not key:
        raise CacheError(f"{uri}: expected s3://BUCKET/KEY")
    return bucket, key


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _s3():
    import boto3

    return boto3.client("s3")


def exists(uri: str) -> bool:
    """Whether the archive exists."""
    if uri.startswith("s3://"):
        bucket, key = _split_s3(uri)
        try:
            _s3().head_object(Bucket=bucket, Key=key)
            return True
        except Exception as exc:  # botocore ClientError 404
            if "404" in str(exc) or "Not Found" in str(exc) or "NoSuchKey" in str(exc):
                return False
            raise
    return os.path.isfile(_local(uri))


def fetch(uri: str, path: str) -> bool:
    """Download the archive to ``path``; False when it does not exist."""
    if uri.startswith("s3://"):
        if not exists(uri):
            return False
        bucket, key = _split_s3(uri)
        _s3().download_file(bucket, key, path)
        return True
    if not os.path.isfile(_local(uri)):
        return False
    shutil.copyfile(_local(uri), path)
    return True


def put(path: str, uri: str) -> None:
    """Upload ``path`` as the archive (through a temporary name for local targets)."""
    if uri.startswith("s3://"):
        bucket, key = _split_s3(uri)
        _s3().upload_file(path, bucket, key)
        return
    dest = _local(uri)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    tmp = dest + ".tmp"
    shutil.copyfile(path, tmp)
    os.replace(tmp, dest)


def manifest_uri(uri: str) -> str:
    """Where the sha256 manifest of the archive at ``uri`` is kept."""
    return uri + MANIFEST_SUFFIX


def sha256_file(path: str) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_files(directory: str) -> dict[str, dict[str, object]]:
    """Every regular file under ``directory`` but the key file: relative path -> size and sha256
    (a symlink is recorded as its target text)."""
    out: dict[str, dict[str, object]] = {}
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if rel == KEY_FILE_NAME:
                continue
            if os.path.islink(path):
                out[rel] = {"link": os.readlink(path)}
            else:
                out[rel] = {"size": os.path.getsize(path), "sha256": sha256_file(path)}
    return out


def manifest_document(key: str, archive: str, directory: str) -> dict[str, object]:
    """The manifest of an archive of ``directory``: the key, the archive's sha256 and every file's."""
    return {"version": MANIFEST_VERSION, "key": key, "archive_sha256": sha256_file(archive), "files": tree_files(directory)}


def fetch_manifest(uri: str, tmp: str) -> dict | None:
    """The manifest of the archive at ``uri``, or None when there is none or it is unreadable."""
    path = os.path.join(tmp, "manifest.json")
    try:
        if not fetch(manifest_uri(uri), path):
            return None
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), dict) else None


def recorded_key(directory: str) -> str | None:
    """The key a cache directory records, or None."""
    try:
        with open(os.path.join(directory, KEY_FILE_NAME)) as f:
            return json.load(f).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


def _safe_members(tar: tarfile.TarFile, root: str):
    root = os.path.realpath(root)
    for m in tar.getmembers():
        target = os.path.realpath(os.path.join(root, m.name))
        if os.path.isabs(m.name) or not (target == root or target.startswith(root + os.sep)):
            raise CacheError(f"archive member {m.name!r} points outside the cache directory")
        if m.isdev() or m.isfifo():
            raise CacheError(f"archive member {m.name!r} is a device or fifo")
        if m.issym() or m.islnk():
            link = os.path.realpath(os.path.join(os.path.dirname(target), m.linkname))
            if not link.startswith(root + os.sep):
                raise CacheError(f"archive link {m.name!r} points outside the cache directory")
        yield m


def restore(uri: str, directory: str, key: str, log=print) -> str:
    """Restore the cache of ``key`` into ``directory``. Returns what happened: ``present``,
    ``missing`` (no archive yet), ``refused`` (the archive records another key) or ``restored``.

    Raises:
        CacheError: the archive is unreadable or unsafe.
    """
    if recorded_key(directory) == key:
        return "present"
    parent = os.path.dirname(os.path.abspath(directory)) or "."
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".restore-") as tmp:
        archive = os.path.join(tmp, "cache.tar")
        manifest = fetch_manifest(uri, tmp)
        if not fetch(uri, archive):
            log(f"engine-cache: no archive at {uri}; the engine compiles and the cache is saved after its first start")
            return "missing"
        if manifest is None:
            log(f"engine-cache: {uri} has no readable sha256 manifest ({manifest_uri(uri)}): refused, the engine starts cold")
            return "refused"
        if manifest.get("key") != key or manifest.get("archive_sha256") != sha256_file(archive):
            log(f"engine-cache: {uri} does not match its manifest (key or archive sha256): refused, the engine starts cold")
            return "refused"
        try:
            with tarfile.open(archive) as tar:
                first = tar.next()
                if first is None or first.name != KEY_FILE_NAME:
                    raise CacheError(f"{uri}: the first member is not {KEY_FILE_NAME}")
                key_file = tar.extractfile(first)
                if key_file is None:
                    raise CacheError(f"{uri}: {KEY_FILE_NAME} is not a regular file")
                got = json.load(key_file).get("digest")
                if got != key:
                    log(f"engine-cache: {uri} records key {got}, not {key}: refused, the engine starts cold")
                    return "refused"
                staging = os.path.join(tmp, "dir")
                os.makedirs(staging)
                tar.extractall(staging, members=list(_safe_members(tar, staging)))
        except (tarfile.TarError, ValueError, KeyError) as exc:
            raise CacheError(f"{uri}: unreadable archive ({exc})") from None
        if recorded_key(staging) != key:
            raise CacheError(f"{uri}: restored directory does not record key {key}")
        if tree_files(staging) != manifest["files"]:
            log(f"engine-cache: {uri}: the extracted files are not the manifest's: refused, the engine starts cold")
            return "refused"
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)
    log(f"engine-cache: restored {uri} -> {directory}")
    return "restored"


def wait_healthy(url: str, timeout_seconds: float, poll_seconds: float = WAIT_POLL_SECONDS) -> bool:
    """Poll ``url`` until it answers 200 or ``timeout_seconds`` pass."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_seconds)


def open_gate(gate: str | None) -> None:
    """Create the file the pod's readiness waits for (nothing when ``gate`` is None)."""
    if gate:
        os.makedirs(os.path.dirname(gate) or ".", exist_ok=True)
        with open(gate, "w") as f:
            f.write("snapshot taken\n")


def save(uri: str, directory: str, key: str, log=print, gate: str | None = None) -> str:
    """Snapshot ``directory`` (recording ``key``), open ``gate``, then upload the snapshot and its
    sha256 manifest to ``uri`` unless a manifest exists there. Returns ``exists``, ``empty``
    (nothing compiled yet), ``late`` (the gate was open already: nothing archived) or ``saved``.
    The gate opens in every case (``main`` opens it after an error too): the snapshot is what the
    engine wrote before the pod could be Ready.

    Raises:
        CacheError: the directory records another key.
    """
    if gate and os.path.exists(gate):
        # The gate is open (an earlier attempt failed after opening it): the pod may be serving, so
        # the directory may hold what a request wrote. Nothing is archived; the next pod saves.
        log(f"engine-cache: {gate} is open already: the moment before the first request has passed; not saved")
        return "late"
    if exists(manifest_uri(uri)):
        open_gate(gate)
        return "exists"
    if not os.path.isdir(directory) or not any(n != KEY_FILE_NAME for n in os.listdir(directory)):
        open_gate(gate)
        return "empty"
    got = recorded_key(directory)
    if got is not None and got != key:
        raise CacheError(f"{directory} records key {got}, not {key}: not saved")
    with tempfile.TemporaryDirectory(prefix=".save-") as tmp:
        key_path = os.path.join(tmp, KEY_FILE_NAME)
        with open(key_path, "w") as f:
            json.dump({"digest": key}, f)
        snapshot = os.path.join(tmp, "snapshot")
        shutil.copytree(directory, snapshot, symlinks=True, ignore=shutil.ignore_patterns(KEY_FILE_NAME))
        open_gate(gate)  # the snapshot is taken: requests may come
        archive = os.path.join(tmp, "cache.tar")
        with tarfile.open(archive, "w") as tar:
            tar.add(key_path, arcname=KEY_FILE_NAME)
            for name in sorted(os.listdir(snapshot)):
                tar.add(os.path.join(snapshot, name), arcname=name)
        manifest_path = os.path.join(tmp, "manifest.json")
        with open(manifest_path, "w") as f:
            json.dump(manifest_document(key, archive, snapshot), f, sort_keys=True)
        put(archive, uri)
        put(manifest_path, manifest_uri(uri))  # last: a manifest names a complete archive
    log(f"engine-cache: saved {directory} -> {uri} (sha256 manifest {manifest_uri(uri)})")
    return "saved"


def mark(directory: str, key: str) -> None:
    """Record ``key`` in ``directory`` (created): the directory vLLM writes its caches into."""
    os.makedirs(directory, exist_ok=True)
    if recorded_key(directory) not in (None, key):
        raise CacheError(f"{directory} records another key")
    with open(os.path.join(directory, KEY_FILE_NAME), "w") as f:
        json.dump({"digest": key}, f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="engine_cache.py", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("action", choices=("restore", "save"), help="restore before vLLM starts; save after its first healthy start")
    p.add_argument("--uri", required=True, help="the archive: s3://BUCKET/KEY.tar, file:///PATH or a path")
    p.add_argument("--dir", required=True, help="the cache directory of this key on the node (mounted into vLLM)")
    p.add_argument("--key", required=True, help="the cache key (components/core/engine_cache.py)")
    p.add_argument("--wait-url", help="save: wait until this URL answers 200 first (vLLM's /health)")
    p.add_argument("--wait-seconds", type=float, default=4 * 3600, help="save: how long to wait for --wait-url (default 4 h)")
    p.add_argument("--gate", help="save: a file created once the snapshot is taken (the pod's readiness waits for it)")
    args = p.parse_args(argv)
    try:
        if args.action == "restore":
            restore(args.uri, args.dir, args.key)
            mark(args.dir, args.key)
            return 0
        try:
            if args.wait_url and not wait_healthy(args.wait_url, args.wait_seconds):
                print(f"engine-cache: {args.wait_url} not healthy after {args.wait_seconds:.0f} s; not saved", file=sys.stderr)
                return 1
            save(args.uri, args.dir, args.key, gate=args.gate)
            return 0
        finally:
            open_gate(args.gate)  # a failed save never keeps the pod from Ready (nothing is archived after)
    except CacheError as exc:
        print(f"engine-cache: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

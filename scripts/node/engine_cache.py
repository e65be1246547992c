#!/usr/bin/env python3
"""Restore or save vLLM's compile and kernel caches (one tar archive per key) next to the weights.

  engine_cache.py restore --uri s3://B/P/_engine-cache/KEY.tar --dir /models/.kimi-engine-cache/KEY --key KEY
  engine_cache.py save    --uri ... --dir ... --key KEY [--wait-url http://127.0.0.1:8000/health]

restore: before vLLM starts. A directory already on the node is moved aside first and kept only when
its files are exactly the manifest's (path, size, sha256; what a request wrote after the snapshot,
or a changed file, fails that), else dropped; then the archive's sha256
manifest (``KEY.tar.manifest.json`` beside it, written after the archive) is fetched, then the
archive: an archive whose sha256 is not the manifest's, whose recorded key
(``engine-cache-key.json``, the first member) is not KEY, or whose extracted files are not exactly
the manifest's (path, size, sha256) is refused and the engine starts cold (never a cache of another
build or layout, nor one changed after it was saved). An archive without a manifest is refused too.
Members are extracted only inside the directory (no absolute paths, ``..``, devices or links
pointing out of it). A missing archive is not an error (first start).
save: after the first start that answered the health URL: snapshots the directory (which must
record KEY) into a local archive at once, then opens ``--gate`` (a file the API guard and the pod's
readiness wait for: no request reaches the engine before the snapshot is taken), then uploads the
archive and its manifest unless a manifest exists already (the first successful start wins; never
overwritten).

A copy spanning nodes (``--node-index-env``, ``--group-nodes``): node i keeps KEY-node<i> (read from
the named variable, so no argv carries a reference the kubelet would expand). A worker (i > 0)
snapshots after the leader's ``/health`` answers, then asks the leader's API guard whether its gate is
still closed (``GATE_PROBE_PATH`` answers 503 with ``GATE_HEADER: closed``); only then is its snapshot
from before any request reached the group, and it is uploaded, else discarded (``late``). The leader
opens its gate once every worker's manifest exists or ``--group-wait-seconds`` pass.

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
import urllib.parse
import urllib.request

KEY_FILE_NAME = "engine-cache-key.json"
# The sha256 manifest of an archive: the archive's URI plus this suffix (uploaded after the archive).
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1
WAIT_POLL_SECONDS = 10.0
# The leader's API guard (scripts/node/kimi_vllm_api_guard.py GATE_HEADER, held equal by the tests)
# answers every route but /health and /metrics with 503 and this header while its gate is closed.
GATE_HEADER = "x-kimi-engine-cache-gate"
GATE_PROBE_PATH = "/v1/models"


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
    """Restore the cache of ``key`` into ``directory``. Returns what happened: ``present`` (the
    node's directory matches the manifest), ``missing`` (no archive yet), ``refused`` (the archive
    does not match its manifest or records another key) or ``restored``. A directory already there
    that does not match the manifest is removed, whatever follows.

    Raises:
        CacheError: the archive is unreadable or unsafe.
    """
    parent = os.path.dirname(os.path.abspath(directory)) or "."
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".restore-") as tmp:
        # A directory already here is untrusted until it matches the manifest: moved aside first, so
        # an error on the way (the manifest unreadable, S3 down) leaves no directory: a cold start.
        local = os.path.join(tmp, "local")
        if os.path.lexists(directory):
            os.replace(directory, local)
        archive = os.path.join(tmp, "cache.tar")
        manifest = fetch_manifest(uri, tmp)
        if os.path.isdir(local) and not os.path.islink(local):
            if (manifest is not None and manifest.get("key") == key and recorded_key(local) == key
                    and tree_files(local) == manifest["files"]):
                os.replace(local, directory)
                return "present"
            log(f"engine-cache: {directory} on the node does not match the sha256 manifest of {uri} "
                f"(or there is none): dropped")
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


def manifests_present(uris, timeout_seconds: float, poll_seconds: float | None = None) -> bool:
    """Wait until the manifest of every archive in ``uris`` exists, or ``timeout_seconds`` pass
    (polled every ``poll_seconds``, default ``WAIT_POLL_SECONDS``)."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        if all(exists(manifest_uri(u)) for u in uris):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(WAIT_POLL_SECONDS if poll_seconds is None else poll_seconds)


def gate_closed(url: str) -> bool:
    """Whether the API guard at ``url`` (a route it guards) says its gate is still closed: 503 with
    ``GATE_HEADER: closed``. Anything else (an answer, an error, no answer) counts as open."""
    try:
        with urllib.request.urlopen(url, timeout=10):
            return False
    except urllib.error.HTTPError as exc:
        return exc.code == 503 and (exc.headers.get(GATE_HEADER) or "") == "closed"
    except (urllib.error.URLError, OSError):
        return False


def node_archive(uri: str, directory: str, key: str, index: str) -> tuple[str, str, str]:
    """The archive URI, directory and key of node ``index`` of a copy whose are ``uri``,
    ``directory``, ``key`` (``components/core/engine_cache.py node_key``: ``<key>-node<index>``).

    Raises:
        CacheError: ``index`` is not a non-negative integer.
    """
    if not index.isdigit():
        raise CacheError(f"node index {index!r} is not a non-negative integer")
    base = uri[: -len(".tar")] if uri.endswith(".tar") else uri
    return f"{base}-node{index}.tar", f"{directory}-node{index}", f"{key}-node{index}"


def save(uri: str, directory: str, key: str, log=print, gate: str | None = None, *,
         worker_uris: tuple[str, ...] = (), group_wait_seconds: float = 0.0, leader_gate_url: str | None = None) -> str:
    """Snapshot ``directory`` (recording ``key``), open ``gate``, then upload the snapshot and its
    sha256 manifest to ``uri`` unless a manifest exists there. Returns ``exists``, ``empty``
    (nothing compiled yet), ``late`` (the gate was open already: nothing archived) or ``saved``.
    The gate opens in every case (``main`` opens it after an error too): the snapshot is what the
    engine wrote before the pod could be Ready.

    A copy's leader passes ``worker_uris``: its gate opens only once their manifests exist (or
    ``group_wait_seconds`` passed), so a worker's snapshot is taken before the group serves. A
    worker passes ``leader_gate_url``: its snapshot is uploaded only when the leader's gate was
    still closed after it was taken (``gate_closed``), else nothing is archived (``late``).

    Raises:
        CacheError: the directory records another key.
    """
    if gate and os.path.exists(gate):
        # The gate is open (an earlier attempt failed after opening it): the pod may be serving, so
        # the directory may hold what a request wrote. Nothing is archived; the next pod saves.
        log(f"engine-cache: {gate} is open already: the moment before the first request has passed; not saved")
        return "late"

    def release() -> None:
        # The leader serves only once its workers' snapshots are saved (or the wait is over).
        if worker_uris and not manifests_present(worker_uris, group_wait_seconds):
            log(f"engine-cache: the workers' archives are not all saved after {group_wait_seconds:.0f} s; serving")
        open_gate(gate)

    if exists(manifest_uri(uri)):
        release()
        return "exists"
    if not os.path.isdir(directory) or not any(n != KEY_FILE_NAME for n in os.listdir(directory)):
        release()
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
        release()  # the snapshot is taken (the workers' too): requests may come
        if leader_gate_url and not gate_closed(leader_gate_url):
            log(f"engine-cache: the leader's gate ({leader_gate_url}) is open: its requests may have reached "
                f"this node before the snapshot; not saved")
            return "late"
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
    p.add_argument("--gate", help="save: a file created once the snapshot is taken (the API guard and readiness wait for it)")
    p.add_argument("--node-index-env", help="a copy spanning nodes: the variable holding this node's index (uri, dir "
                   "and key gain -node<index>)")
    p.add_argument("--group-nodes", type=int, default=1, help="save: nodes of the copy (the leader, index 0, waits "
                   "for the others' manifests before it opens its gate)")
    p.add_argument("--group-wait-seconds", type=float, default=0.0, help="save: how long the leader waits for them")
    p.add_argument("--wait-host-env", help="save: the variable holding --wait-url's host (a worker: the leader's address; "
                   "it also asks the leader's API guard whether its gate is closed)")
    args = p.parse_args(argv)
    try:
        uri, directory, key = args.uri, args.dir, args.key
        index = None
        if args.node_index_env:
            index = os.environ.get(args.node_index_env, "")
            uri, directory, key = node_archive(uri, directory, key, index)
        if args.action == "restore":
            restore(uri, directory, key)
            mark(directory, key)
            return 0
        try:
            wait_url = args.wait_url
            leader_gate_url = None
            if args.wait_host_env and wait_url:
                parsed = urllib.parse.urlsplit(wait_url)
                host = os.environ.get(args.wait_host_env, "")
                if not host or any(c in host for c in "/@?#"):
                    raise CacheError(f"{args.wait_host_env}={host!r} is not a host name")
                netloc = f"{host}:{parsed.port}" if parsed.port else host
                wait_url = urllib.parse.urlunsplit(parsed._replace(netloc=netloc))
                leader_gate_url = urllib.parse.urlunsplit(parsed._replace(netloc=netloc, path=GATE_PROBE_PATH))
            workers: tuple[str, ...] = ()
            if index == "0" and args.group_nodes > 1:
                workers = tuple(node_archive(args.uri, args.dir, args.key, str(i))[0] for i in range(1, args.group_nodes))
            if wait_url and not wait_healthy(wait_url, args.wait_seconds):
                print(f"engine-cache: {wait_url} not healthy after {args.wait_seconds:.0f} s; not saved", file=sys.stderr)
                return 1
            save(uri, directory, key, gate=args.gate, worker_uris=workers,
                 group_wait_seconds=args.group_wait_seconds, leader_gate_url=leader_gate_url)
            return 0
        finally:
            open_gate(args.gate)  # a failed save never keeps the pod from Ready (nothing is archived after)
    except CacheError as exc:
        print(f"engine-cache: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

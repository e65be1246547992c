"""A small local Hugging Face hub for tests, reached through HF_ENDPOINT.

It implements the endpoints huggingface_hub calls for `HfApi.model_info(files_metadata=True)`
and `hf_hub_download` (HEAD and GET on /resolve/, with Range), plus fault injection: a number
of 5xx answers per file, corrupted bytes on the first download of a file, a delay per download,
a required token, and an outage (every request answers one status, e.g. 503). Access modes
answer as the real hub does (status and ``X-Error-Code`` /
``X-Error-Message`` headers, which huggingface_hub/utils/_http.py ``hf_raise_for_status`` maps to
its exception classes): gated repos (metadata public, files 401 GatedRepo without a token and 403
GatedRepo for an account not granted), private repos (401 RepoNotFound without a token, 404
RepoNotFound for a token without access), and revoked tokens (401 "Invalid credentials in
Authorization header", no error code). Files of 1 KiB or more, and every *.safetensors, are "LFS" files (the hub
gives their sha256); others are plain git blobs (the hub gives their git blob id).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def git_blob_sha1(data: bytes) -> str:
    """Git blob object id of `data` (what the hub reports as blobId)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(path: str, data: bytes | DiskFile) -> bool:
    return path.endswith(".safetensors") or len(data) >= 1024


@dataclass(frozen=True)
class DiskFile:
    """A repo file served from disk (checkpoints of several GB: benchmarks), not held in memory.

    Attributes:
        path: the file on disk.
        size_bytes: its size.
        sha256: its sha256 (hex), what the hub reports for an LFS file and sends as its ETag.
    """

    path: str
    size_bytes: int
    sha256: str

    def __len__(self) -> int:
        return self.size_bytes

    def lfs_pointer_blob_sha1(self) -> str:
        """The git blob id of the file's LFS pointer (what the hub reports as an LFS file's blobId)."""
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size_bytes}\n"
        return git_blob_sha1(pointer.encode())


def _sha256_of(data: bytes | DiskFile) -> str:
    return data.sha256 if isinstance(data, DiskFile) else hashlib.sha256(data).hexdigest()


def _blob_id(data: bytes | DiskFile) -> str:
    return data.lfs_pointer_blob_sha1() if isinstance(data, DiskFile) else git_blob_sha1(data)


class HubState:
    """Repositories and faults. repos: repo_id -> {"branches": {name: commit}, "commits":
    {commit: {path: bytes}}}. Fault dicts are keyed by file path."""

    def __init__(self):
        self.repos: dict[str, dict] = {}
        self.fail_statuses: dict[str, list[int]] = {}  # path -> statuses to answer, in order
        self.corrupt_once: set[str] = set()
        self.truncate_always: set[str] = set()
        self.download_delay_seconds = 0.0
        self.required_token: str | None = None
        self.gated: dict[str, set[str]] = {}  # repo_id -> tokens whose account was granted access
        self.private: dict[str, set[str]] = {}  # repo_id -> tokens that may read it
        self.invalid_tokens: set[str] = set()  # revoked or expired: every request answers 401
        self.outage_status: int | None = None  # an outage: every request answers this (e.g. 503)
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def add_repo(self, repo_id: str, files: dict[str, bytes | DiskFile], branch: str = "main") -> str:
        """Add (or update) a repo with one commit on `branch`; returns the 40-hex commit id.
        A ``DiskFile`` value is served from disk (always as an LFS file)."""
        commit = hashlib.sha1(repr(sorted((p, _sha256_of(d)) for p, d in files.items())).encode()
                              + repo_id.encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, {"branches": {}, "commits": {}})
        repo["commits"][commit] = dict(files)
        repo["branches"][branch] = commit
        return commit

    def downloads_of(self, path: str) -> int:
        """How many GET /resolve/ requests named `path`."""
        with self.lock:
            return sum(1 for method, p in self.requests if method == "GET" and p.endswith("/" + path))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HubServer

    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head_only: bool = False):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head_only:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head_only: bool = False):
        body = json.dumps({"error": message}).encode()
        headers = {"X-Error-Code": code} if code else {}  # the hub sends no code for a revoked token
        self._send(status, body, {**headers, "X-Error-Message": message, "Content-Type": "application/json"},
                   head_only)

    def _resolve(self, repo_id: str, rev: str):
        repo = self.server.state.repos.get(repo_id)
        if repo is None:
            return None, "RepoNotFound"
        commit = repo["branches"].get(rev, rev)
        if commit not in repo["commits"]:
            return None, "RevisionNotFound"
        return commit, repo["commits"][commit]

    def _authorized(self, head_only: bool) -> bool:
        token = self.server.state.required_token
        if token and self.headers.get("Authorization") != f"Bearer {token}":
            self._error(401, "RepoNotFound", "Invalid credentials", head_only)
            return False
        sent = self._token()
        if sent and sent in self.server.state.invalid_tokens:
            self._error(401, "", "Invalid credentials in Authorization header", head_only)
            return False
        return True

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[len("Bearer "):] if auth.startswith("Bearer ") else None

    def _repo_access(self, repo_id: str, files_route: bool, head_only: bool) -> bool:
        """Private and gated repos, answered as huggingface.co does. False when refused (sent)."""
        state, token = self.server.state, self._token()
        if repo_id in state.private and token not in state.private[repo_id]:
            if token is None:
                self._error(401, "RepoNotFound", "Repository not found", head_only)
            else:
                self._error(404, "RepoNotFound", "Repository not found", head_only)
            return False
        if files_route and repo_id in state.gated and token not in state.gated[repo_id]:
            if token is None:
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to "
                            "it and be authenticated to access it. Please log in.", head_only)
            else:
                self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                            f"authorized list. Visit https://huggingface.co/{repo_id} to ask for access.", head_only)
            return False
        return True

    def do_GET(self):
        self._handle(head_only=False)

    def do_HEAD(self):
        self._handle(head_only=True)

    def _handle(self, head_only: bool):
        state = self.server.state
        path = urllib.parse.urlsplit(self.path).path
        with state.lock:
            state.requests.append(("HEAD" if head_only else "GET", path))
        if state.outage_status:
            return self._error(state.outage_status, "", "injected outage", head_only)
        if not self._authorized(head_only):
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m:
            if not self._repo_access(m.group(1), files_route=False, head_only=head_only):
                return
            commit, files = self._resolve(m.group(1), urllib.parse.unquote(m.group(2)))
            if commit is None:
                return self._error(404, files, f"{files}: {m.group(1)}@{m.group(2)}", head_only)
            siblings = []
            for p, data in sorted(files.items()):
                sib = {"rfilename": p, "size": len(data), "blobId": _blob_id(data)}
                if is_lfs(p, data):
                    sib["lfs"] = {"size": len(data), "sha256": _sha256_of(data), "pointerSize": 134}
                siblings.append(sib)
            body = json.dumps({"id": m.group(1), "modelId": m.group(1), "sha": commit, "siblings": siblings}).encode()
            return self._send(200, body, {"Content-Type": "application/json"}, head_only)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path)
        if m:  # HfApi.list_repo_tree (snapshot_download, `hf download`): one page, every file
            if not self._repo_access(m.group(1), files_route=False, head_only=head_only):
                return
            commit, files = self._resolve(m.group(1), urllib.parse.unquote(m.group(2)))
            if commit is None:
                return self._error(404, files, f"{files}: {m.group(1)}@{m.group(2)}", head_only)
            entries = []
            for p, data in sorted(files.items()):
                entry = {"type": "file", "oid": _blob_id(data), "size": len(data), "path": p}
                if is_lfs(p, data):
                    entry["lfs"] = {"oid": _sha256_of(data), "size": len(data), "pointerSize": 134}
                entries.append(entry)
            return self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head_only)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if not m:
            return self._error(404, "NotFound", f"no route {path}", head_only)
        if not self._repo_access(m.group(1), files_route=True, head_only=head_only):
            return
        commit, files = self._resolve(m.group(1), urllib.parse.unquote(m.group(2)))
        if commit is None:
            return self._error(404, files, f"{files}: {m.group(1)}", head_only)
        file_path = urllib.parse.unquote(m.group(3))
        if file_path not in files:
            return self._error(404, "EntryNotFound", f"EntryNotFound: {file_path}", head_only)
        data = files[file_path]
        etag = _sha256_of(data) if is_lfs(file_path, data) else _blob_id(data)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if head_only:
            headers["Content-Length"] = str(len(data))
            return self._send(200, b"", headers, head_only=True)
        with state.lock:
            statuses = state.fail_statuses.get(file_path)
            status = statuses.pop(0) if statuses else None
            corrupt = file_path in state.corrupt_once
            state.corrupt_once.discard(file_path)
        if status:
            return self._error(status, "ServerError", f"injected {status}")
        if state.download_delay_seconds:
            time.sleep(state.download_delay_seconds)
        if isinstance(data, DiskFile):
            return self._send_disk_file(data, headers)
        if corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        if file_path in state.truncate_always:
            data = data[: len(data) // 2]
        start = 0
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if rng:
            start = int(rng.group(1))
            end = int(rng.group(2)) if rng.group(2) else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            return self._send(206, data[start:end + 1], headers)
        return self._send(200, data, headers)


    def _send_disk_file(self, blob: DiskFile, headers: dict) -> None:
        """GET of a ``DiskFile`` (with Range), streamed by ``os.sendfile`` (no copy through Python)."""
        start, end = 0, blob.size_bytes - 1
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        status = 200
        if rng:
            start = int(rng.group(1))
            end = min(int(rng.group(2)), end) if rng.group(2) else end
            headers["Content-Range"] = f"bytes {start}-{end}/{blob.size_bytes}"
            status = 206
        headers["Content-Length"] = str(end - start + 1)
        self._send(status, b"", headers, head_only=True)
        self.wfile.flush()
        with open(blob.path, "rb") as f:
            offset, left = start, end - start + 1
            while left > 0:
                sent = os.sendfile(self.connection.fileno(), f.fileno(), offset, min(left, 1 << 30))
                if sent == 0:
                    break
                offset, left = offset + sent, left - sent


class HubServer(ThreadingHTTPServer):
    """Threaded HTTP server on 127.0.0.1 with a HubState; `endpoint` is the HF_ENDPOINT value."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = HubState()
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


def disk_repo_files(root: str, sha256_by_path: dict[str, str] | None = None) -> dict[str, bytes | DiskFile]:
    """The files under ``root`` as repo files: LFS-sized ones as ``DiskFile`` (sha256 from
    ``sha256_by_path`` where given, else hashed once here), small non-LFS ones as bytes."""
    files: dict[str, bytes | DiskFile] = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            size = os.path.getsize(full)
            if not is_lfs(rel, b"\0" * min(size, 1024)):
                with open(full, "rb") as f:
                    files[rel] = f.read()
                continue
            sha = (sha256_by_path or {}).get(rel)
            if sha is None:
                digest = hashlib.sha256()
                with open(full, "rb") as f:
                    while chunk := f.read(8 << 20):
                        digest.update(chunk)
                sha = digest.hexdigest()
            files[rel] = DiskFile(full, size, sha)
    return files


def main(argv: list[str] | None = None) -> int:
    """Serve a directory as one hub repo until SIGTERM (benchmarks run the hub in its own process,
    so its CPU is not counted as the client's). Prints one JSON line: endpoint, repo, commit."""
    import argparse
    import signal
    import sys

    p = argparse.ArgumentParser(prog="python -m tests.hub_server", description=main.__doc__)
    p.add_argument("--serve", required=True, metavar="DIR", help="directory whose files are the repo's")
    p.add_argument("--repo", required=True, help="repo id, ORG/NAME")
    p.add_argument("--exclude", action="append", default=[], help="a file name to leave out (repeatable)")
    p.add_argument("--sha256-from", metavar="MANIFEST", help="a manifest.json whose files[].sha256 to use")
    args = p.parse_args(argv)
    known = None
    if args.sha256_from:
        with open(args.sha256_from) as f:
            known = {e["path"]: e["sha256"] for e in json.load(f)["files"]}
    files = {k: v for k, v in disk_repo_files(args.serve, known).items() if k not in set(args.exclude)}
    server = HubServer()
    commit = server.state.add_repo(args.repo, files)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"endpoint": server.endpoint, "repo": args.repo, "commit": commit}), flush=True)
    with server:
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(main())

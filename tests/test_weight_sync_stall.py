"""weight_sync detects a stalled or trickling transfer (a minimum throughput over a window, not
only a read timeout), retries it, then fails: against moto on 127.0.0.1 behind the fault proxy
in trickle mode (a body dripped in small pieces, never silent long enough for a read timeout)."""
from __future__ import annotations

import json
import os
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import scripts.node.weight_sync as ws  # noqa: E402
from scripts.node.weight_sync import retry, verify  # noqa: E402
from tests.sync_fixtures import FaultProxy, checkpoint_files, publish_mirror, read_tree  # noqa: E402

pytest.importorskip("moto.server")

SLOW = "model-00002-of-00002"
GUARD = ["--min-bytes-per-second", "200000", "--throughput-window-seconds", "0.2"]


@pytest.fixture
def moto(moto_server):
    return moto_server


@pytest.fixture
def s3(sync_s3, monkeypatch):
    monkeypatch.setattr(retry, "RETRY_MAX_SECONDS", 0.05)
    # run() sets the module's guard from the flags: restore it after each test.
    monkeypatch.setattr(verify, "MIN_BYTES_PER_SECOND", verify.MIN_BYTES_PER_SECOND)
    monkeypatch.setattr(verify, "THROUGHPUT_WINDOW_SECONDS", verify.THROUGHPUT_WINDOW_SECONDS)
    return sync_s3


def _run(capsys, *argv):
    rc = ws.main([*argv, "--json", "--quiet", "--s3-client", "boto3"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def _mirror(s3):
    files = checkpoint_files(n_shards=2, shard_bytes=40_000, seed=11)
    bucket = "ws-" + uuid.uuid4().hex[:12]
    publish_mirror(s3, bucket, "m", files)
    return files, bucket


def test_a_trickling_transfer_is_abandoned_and_retried(tmp_path, s3, moto, capsys, monkeypatch):
    files, bucket = _mirror(s3)
    # 4 KB every 0.1 s = 40 KB/s, far below the 200 KB/s minimum; only the first GET trickles.
    with FaultProxy(moto.port, trickle_pattern=SLOW, trickles=1, trickle_bytes=4096, trickle_interval_seconds=0.1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        rc, summary, err = _run(capsys, "--source", f"s3://{bucket}/m", "--dest", str(tmp_path / "d"), *GUARD)
    assert rc == 0, err
    assert proxy.trickles_sent == 1 and proxy.gets_of(SLOW) == 2
    assert "stalled transfer" in err and "retry 1/" in err
    assert read_tree(str(tmp_path / "d")) == files  # the second GET, untrickled, brought the shard whole


def test_a_transfer_that_keeps_trickling_fails_the_run_without_a_marker(tmp_path, s3, moto, capsys, monkeypatch):
    _, bucket = _mirror(s3)
    dest = tmp_path / "d"
    with FaultProxy(moto.port, trickle_pattern=SLOW, trickles=100, trickle_bytes=4096, trickle_interval_seconds=0.1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        rc, _, err = _run(capsys, "--source", f"s3://{bucket}/m", "--dest", str(dest), *GUARD)
    assert rc == 1 and "stalled transfer" in err and f"giving up after {ws.RETRY_ATTEMPTS} attempts" in err
    assert proxy.gets_of(SLOW) == ws.RETRY_ATTEMPTS
    assert not (dest / ws.MARKER_NAME).exists()


def test_the_same_trickle_passes_when_the_guard_is_off(tmp_path, s3, moto, capsys, monkeypatch):
    """Not vacuous: without the guard the slow body is simply waited for (no read timeout fires)."""
    files, bucket = _mirror(s3)
    with FaultProxy(moto.port, trickle_pattern=SLOW, trickles=1, trickle_bytes=8192, trickle_interval_seconds=0.05) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        rc, _, err = _run(capsys, "--source", f"s3://{bucket}/m", "--dest", str(tmp_path / "d"),
                          "--min-bytes-per-second", "0")
    assert rc == 0, err
    assert proxy.gets_of(SLOW) == 1 and "stalled" not in err and read_tree(str(tmp_path / "d")) == files

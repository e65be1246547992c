"""A completion marker (``.weights-complete.json``) is reused only by the source it names: the same
repo and revision from another source (``model.source`` huggingface vs modelscope: another URI) is
synced again and the marker then names the new source. Two file:// trees with the same bytes stand in
for the two hubs, each with a manifest.json giving every sha256 as a hub listing does: equal content is
the hardest case (every digest matches, only the source differs)."""

from __future__ import annotations

import json
import uuid

import pytest

import scripts.node.weight_sync as ws
from scripts.node.weight_sync import retry
from tests.sync_fixtures import checkpoint_files, manifest_for, write_tree


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(retry, "RETRY_BASE_SECONDS", 0.01)


def run_json(capsys, *argv) -> dict:
    rc = ws.main([*argv, "--json", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture
def two_sources(tmp_path):
    files = checkpoint_files(seed=7)
    for name in ("hub-a", "hub-b"):
        # A manifest.json with every sha256, as a hub's LFS listing gives: the copy's digests all match.
        write_tree(str(tmp_path / name), files)
        (tmp_path / name / ws.MANIFEST_NAME).write_text(json.dumps(manifest_for(files, revision="a" * 40)))
    return f"file://{tmp_path / 'hub-a'}", f"file://{tmp_path / 'hub-b'}", files


def test_a_directory_marker_from_another_source_is_not_reused(tmp_path, two_sources, capsys):
    a, b, files = two_sources
    dest = tmp_path / "dst"
    run_json(capsys, "--source", a, "--dest", str(dest))
    assert run_json(capsys, "--source", a, "--dest", str(dest))["files_skipped"] == len(files)  # same source: reused
    run_json(capsys, "--source", b, "--dest", str(dest))
    # A new sync (files the journal verified with these digests are kept), ending with b's marker; the
    # old code took a's marker as b's and returned at once.
    assert json.loads((dest / ws.MARKER_NAME).read_text())["source"] == b
    assert run_json(capsys, "--source", b, "--dest", str(dest))["files_skipped"] == len(files)


def test_a_mirror_marker_from_another_source_is_not_reused(two_sources, sync_s3, capsys):
    pytest.importorskip("moto.server")
    a, b, files = two_sources
    s3 = sync_s3
    bucket = f"kimi-test-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/models/moonshotai/Kimi-K3.1-Pro/main"
    run_json(capsys, "--source", a, "--dest", uri)
    run_json(capsys, "--source", b, "--dest", uri)
    key = f"models/moonshotai/Kimi-K3.1-Pro/main/{ws.MARKER_NAME}"
    assert json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())["source"] == b
    # The marker naming b is reused by b.
    assert run_json(capsys, "--source", b, "--dest", uri)["files_skipped"] == len(files)

"""weight_sync core: local sources and destinations, manifest rules, marker rules, resume,
free space, path traversal, command line. S3 and hub sources are in test_weight_sync_s3.py
and test_weight_sync_hf.py."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import types

import pytest

import scripts.node.weight_sync as ws
from components.sync_artifact import build_sync_artifact
from scripts.node.weight_sync import cli, destinations, retry
from tests.sync_fixtures import checkpoint_files, manifest_for, read_tree, write_tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# How users run it from a checkout (kimi-deploy sync dispatches to the same main).
SYNC = [sys.executable, "-m", "scripts.node.weight_sync"]


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(retry, "RETRY_BASE_SECONDS", 0.01)


def run_json(capsys, *argv) -> tuple[int, dict | None, str]:
    rc = ws.main([*argv, "--json", "--quiet"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


@pytest.fixture
def src(tmp_path):
    files = checkpoint_files()
    root = tmp_path / "src"
    write_tree(str(root), files)
    return root, files


def test_module_exports_names_and_imports_only_stdlib():
    assert ws.MARKER_NAME == ".weights-complete.json" and ws.MANIFEST_NAME == "manifest.json"
    code = ("import sys; import scripts.node.weight_sync as ws; "
            "bad = [m for m in ('boto3', 'botocore', 'huggingface_hub', 'modelscope') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_file_names_equal_the_cores_and_the_shipped_zipapp_agrees(tmp_path):
    """The package's own names (it imports nothing of the repository: tests/test_layout.py) equal
    components/core/naming.py's; the zipapp shipped alone to a node (ConfigMap, S3 object: no
    components package, standard library only: `python -I -S`) holds the same values."""
    from components.core import naming

    assert (ws.MARKER_NAME, ws.MANIFEST_NAME, ws.S3_PART_CONCURRENCY) == (
        naming.MARKER_NAME, naming.MANIFEST_NAME, naming.S3_PART_CONCURRENCY)
    pyz = tmp_path / "weight_sync.pyz"
    pyz.write_bytes(build_sync_artifact().data)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from weight_sync import model as m; "
            "print(m.MARKER_NAME, m.MANIFEST_NAME, m.S3_PART_CONCURRENCY, 'components' in sys.modules)")
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(pyz)], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [naming.MARKER_NAME, naming.MANIFEST_NAME, str(naming.S3_PART_CONCURRENCY), "False"]


def test_help_explains_every_flag():
    out = subprocess.run([*SYNC, "--help"], capture_output=True, text=True, check=True).stdout
    for flag in ("--source", "--dest", "--workers", "--verify", "--json", "--s3-client", "--staging-dir", "--quiet"):
        assert flag in out
    assert "hf://" in out and "modelscope://" in out and "file:///" in out and "fast" in out and "full" in out


@pytest.mark.parametrize("argv, needle", [
    (["--source", "ftp://x/y", "--dest", "/tmp/x"], "expected hf://"),
    (["--source", "hf://not-a-repo", "--dest", "/tmp/x"], "ORG/REPO"),
    (["--source", "file://relative", "--dest", "/tmp/x"], "ABSOLUTE"),
    (["--source", "s3://B/x", "--dest", "/tmp/x"], "bucket"),
    (["--source", "file:///tmp", "--dest", "gs://b/p"], "--dest"),
    (["--source", "file:///tmp", "--dest", "/tmp/x", "--workers", "0"], "--workers"),
    (["--source", "file:///tmp", "--dest", "/tmp/x", "--verify", "sometimes"], "invalid choice"),
])
def test_usage_errors_exit_2_with_one_line_and_no_traceback(argv, needle):
    r = subprocess.run([*SYNC, *argv], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_file_to_dir_copies_verifies_and_marks(tmp_path, src, capsys):
    root, files = src
    dest = tmp_path / "dst"
    rc, summary, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest), "--workers", "3")
    assert rc == 0, err
    assert read_tree(str(dest)) == files
    assert summary["files_transferred"] == len(files) and summary["files_verified"] == len(files)
    assert summary["bytes_transferred"] == sum(map(len, files.values())) and summary["files_skipped"] == 0
    marker = json.loads((dest / ws.MARKER_NAME).read_text())
    expected = [ws.FileEntry(p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    assert marker["manifest_sha256"] == ws.manifest_digest(expected)
    assert marker["file_count"] == len(files) and marker["total_bytes"] == sum(map(len, files.values()))
    manifest = json.loads((dest / ws.MANIFEST_NAME).read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {e.path: e.sha256 for e in expected}
    assert not list((dest / ws.STATE_DIR_NAME).glob("partial/*"))


def test_second_run_transfers_nothing_and_full_verify_rehashes(tmp_path, src, capsys):
    root, files = src
    dest = tmp_path / "dst"
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0
    rc, again, _ = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 0 and again["files_transferred"] == 0 and again["files_skipped"] == len(files)
    assert again["files_verified"] == 0 and again["bytes_transferred"] == 0
    rc, full, _ = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest), "--verify", "full")
    assert rc == 0 and full["files_transferred"] == 0 and full["files_verified"] == len(files)
    assert (dest / ws.MARKER_NAME).exists()


def test_source_manifest_is_used_and_a_corrupt_source_file_fails_after_two_fetches(tmp_path, src, capsys, monkeypatch):
    root, files = src
    (root / ws.MANIFEST_NAME).write_text(json.dumps(manifest_for(files, revision="a" * 40)))
    shard = "model-00002-of-00006.safetensors"
    data = bytearray(files[shard])
    data[100] ^= 1  # same size, wrong bytes
    (root / shard).write_bytes(bytes(data))
    calls = []
    original = ws.FileSource.fetch
    monkeypatch.setattr(ws.FileSource, "fetch", lambda self, e, sink: (calls.append(e.path), original(self, e, sink)))
    dest = tmp_path / "dst"
    rc, _, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest), "--workers", "1")
    assert rc == 1 and shard in err and "sha256" in err and "fetched 2 times" in err
    assert calls.count(shard) == 2
    assert not (dest / shard).exists() and not (dest / ws.MARKER_NAME).exists()


def test_file_fetched_once_more_after_a_transient_corruption(tmp_path, src, capsys, monkeypatch):
    root, files = src
    (root / ws.MANIFEST_NAME).write_text(json.dumps(manifest_for(files)))
    shard = "model-00003-of-00006.safetensors"
    original, state = ws.FileSource.fetch, {"corrupted": 0}

    def flaky(self, entry, sink):
        if entry.path == shard and not state["corrupted"]:
            state["corrupted"] = 1
            sink.write(b"\0" * entry.size_bytes)
            return
        original(self, entry, sink)

    monkeypatch.setattr(ws.FileSource, "fetch", flaky)
    rc, summary, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(tmp_path / "dst"))
    assert rc == 0, err
    assert "fetching it once more" in err and read_tree(str(tmp_path / "dst")) == files


def test_damaged_destination_files_are_repaired(tmp_path, src, capsys):
    root, files = src
    dest = tmp_path / "dst"
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0
    truncated, flipped = "model-00004-of-00006.safetensors", "model-00005-of-00006.safetensors"
    with open(dest / truncated, "r+b") as f:
        f.truncate(1000)
    st = os.stat(dest / flipped)
    data = bytearray((dest / flipped).read_bytes())
    data[5] ^= 0xFF
    (dest / flipped).write_bytes(bytes(data))
    os.utime(dest / flipped, ns=(st.st_atime_ns, st.st_mtime_ns))  # silent bit rot: same size and mtime
    rc, fast, _ = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 0 and fast["files_transferred"] == 1  # the truncated one; fast mode trusts size+mtime
    assert (dest / truncated).read_bytes() == files[truncated]
    rc, full, _ = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest), "--verify", "full")
    assert rc == 0 and full["files_transferred"] == 1 and (dest / flipped).read_bytes() == files[flipped]


def test_resume_keeps_completed_files_after_a_crash(tmp_path, src, capsys, monkeypatch):
    root, files = src
    dest = tmp_path / "dst"
    original, fetched = ws.FileSource.fetch, []

    def crash_on_fourth(self, entry, sink):
        if len(fetched) == 3:
            sink.write(b"partial bytes")
            raise KeyboardInterrupt  # like SIGINT mid-file; SIGKILL is covered in the hub tests
        fetched.append(entry.path)
        original(self, entry, sink)

    monkeypatch.setattr(ws.FileSource, "fetch", crash_on_fourth)
    rc, _, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest), "--workers", "1")
    assert rc == 1 and "resume" in err
    assert not (dest / ws.MARKER_NAME).exists()
    assert all((dest / p).read_bytes() == files[p] for p in fetched)
    monkeypatch.setattr(ws.FileSource, "fetch", original)
    rc, summary, _ = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest), "--workers", "1")
    assert rc == 0 and summary["files_skipped"] == 3 and summary["files_transferred"] == len(files) - 3
    assert read_tree(str(dest)) == files and not list((dest / ws.STATE_DIR_NAME / "partial").glob("*"))


def test_marker_is_removed_when_a_new_sync_starts_and_written_only_at_the_end(tmp_path, src, capsys, monkeypatch):
    root, files = src
    dest = tmp_path / "dst"
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0
    (root / "config.json").write_bytes(b'{"model_type": "kimi_k3", "changed": true}')
    seen_marker = []
    original = ws.FileSource.fetch

    def observe(self, entry, sink):
        seen_marker.append((dest / ws.MARKER_NAME).exists())
        raise ws.SyncError("source went away")

    monkeypatch.setattr(ws.FileSource, "fetch", observe)
    rc, _, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 1 and "source went away" in err
    assert seen_marker == [False] and not (dest / ws.MARKER_NAME).exists()
    monkeypatch.setattr(ws.FileSource, "fetch", original)
    rc, summary, _ = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 0 and summary["files_transferred"] == 1 and (dest / ws.MARKER_NAME).exists()


def test_free_space_check_counts_only_missing_bytes(tmp_path, src, capsys, monkeypatch):
    root, files = src
    dest = tmp_path / "dst"
    total = sum(map(len, files.values()))
    monkeypatch.setattr(destinations, "disk_free_bytes", lambda path: 1000)
    rc, _, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 1 and "not enough free space" in err and f"({total} bytes" in err and "(1000 bytes)" in err
    assert read_tree(str(dest)) == {}
    # With all but one shard present and valid, only that shard's bytes are needed.
    monkeypatch.undo()
    monkeypatch.setattr(retry, "RETRY_BASE_SECONDS", 0.01)
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0
    missing = "model-00006-of-00006.safetensors"
    os.unlink(dest / missing)
    need = len(files[missing])
    monkeypatch.setattr(destinations, "disk_free_bytes", lambda path: need - 1)
    rc, _, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 1 and f"({need} bytes" in err
    monkeypatch.setattr(destinations, "disk_free_bytes", lambda path: need)
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0


@pytest.mark.parametrize("bad", ["../evil.safetensors", "/etc/evil", "a/../../evil", "a//b", "./a", "a\\..\\b",
                                 "", ".weights-sync/journal", ".weights-complete.json", "C:/x"])
def test_unsafe_manifest_paths_are_rejected(bad):
    with pytest.raises(ws.SyncError):
        ws.validate_relative_path(bad)


@pytest.mark.parametrize("good", ["model.safetensors", "tokenizer/tiktoken.model", "a/b/c.json", "..hidden"])
def test_safe_manifest_paths_are_accepted(good):
    assert ws.validate_relative_path(good) == good


def test_traversal_in_a_source_manifest_writes_nothing_outside(tmp_path, src, capsys):
    root, files = src
    doc = manifest_for(files)
    doc["files"].append({"path": "../outside.bin", "size_bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()})
    (root / ws.MANIFEST_NAME).write_text(json.dumps(doc))
    dest = tmp_path / "dst"
    rc, _, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 1 and "../outside.bin" in err
    assert not (tmp_path / "outside.bin").exists() and read_tree(str(dest)) == {}


def test_symlinked_directory_in_destination_cannot_lead_outside(tmp_path, src, capsys):
    root, files = src
    dest, elsewhere = tmp_path / "dst", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, dest / "tokenizer")
    rc, _, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 1 and "outside the destination" in err and not list(elsewhere.iterdir())


def test_modelscope_source_through_the_sdk(tmp_path, capsys, monkeypatch):
    files = checkpoint_files(n_shards=2)
    calls = []

    class HubApi:
        def get_valid_revision_detail(self, model_id, revision=None):
            calls.append(("revision", model_id, revision))
            return {"Revision": revision, "CommitId": "b" * 40}

        def get_model_files(self, model_id, revision=None, recursive=True):
            calls.append(("list", model_id, revision, recursive))
            listing = [{"Path": "tokenizer", "Type": "tree", "Size": 0}]
            for p, d in files.items():  # the SDK reports sha256 for some files only
                listing.append({"Path": p, "Type": "blob", "Size": len(d),
                                "Sha256": hashlib.sha256(d).hexdigest() if p.endswith(".safetensors") else None})
            return listing

    def model_file_download(model_id, file_path, revision=None, local_dir=None):
        calls.append(("download", file_path, revision))
        path = os.path.join(local_dir, *file_path.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(files[file_path])
        return path

    pkg = types.ModuleType("modelscope")
    hub = types.ModuleType("modelscope.hub")
    api = types.ModuleType("modelscope.hub.api")
    dl = types.ModuleType("modelscope.hub.file_download")
    api.HubApi, dl.model_file_download = HubApi, model_file_download
    for name, mod in {"modelscope": pkg, "modelscope.hub": hub, "modelscope.hub.api": api,
                      "modelscope.hub.file_download": dl}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    dest = tmp_path / "dst"
    rc, summary, err = run_json(capsys, "--source", "modelscope://moonshotai/Kimi-K3.1-Pro@master", "--dest", str(dest))
    assert rc == 0, err
    assert read_tree(str(dest)) == files and summary["revision"] == "b" * 40
    assert {c[2] for c in calls if c[0] == "download"} == {"b" * 40}
    assert json.loads((dest / ws.MARKER_NAME).read_text())["revision"] == "b" * 40


def journal_lines(dest) -> list[dict]:
    return [json.loads(line) for line in (dest / ws.STATE_DIR_NAME / ws.JOURNAL_NAME).read_text().splitlines()]


def test_marker_follows_one_sync_of_the_destination_and_no_fsync_per_file(tmp_path, src, capsys, monkeypatch):
    root, files = src
    dest = tmp_path / "dst"
    events, real_syncfs, real_fsync = [], ws.syncfs, os.fsync
    monkeypatch.setattr(destinations, "syncfs", lambda path: (events.append(("syncfs", (dest / ws.MARKER_NAME).exists())),
                                                    real_syncfs(path)))
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", None)), real_fsync(fd)))
    rc, summary, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest), "--workers", "3")
    assert rc == 0, err
    assert events.count(("syncfs", False)) == 1 and ("syncfs", True) not in events
    # after the sync: the compacted journal, manifest.json and the marker (file + directory each)
    assert events.index(("syncfs", False)) == len(events) - 6 and events.count(("fsync", None)) == 5
    lines = journal_lines(dest)
    assert {rec["path"] for rec in lines[:-1]} == set(files)
    assert lines[-1] == {"synced_through": max(rec["seq"] for rec in lines[:-1])}


def test_periodic_sync_points_cover_only_files_recorded_before_them(tmp_path, src, capsys, monkeypatch):
    root, files = src
    dest = tmp_path / "dst"
    monkeypatch.setattr(destinations, "SYNC_EVERY_BYTES", 150_000)
    monkeypatch.setattr(cli, "LocalDestination", type("NoCompact", (ws.LocalDestination,), {
        "_finish": lambda self, summary, revision, entries: self._sync_point()}))
    rc, _, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest), "--workers", "1")
    assert rc == 0, err
    lines = journal_lines(dest)
    syncs = [i for i, rec in enumerate(lines) if "synced_through" in rec]
    assert len(syncs) >= 3 and syncs[-1] == len(lines) - 1
    for i in syncs:  # with one worker, a sync point covers exactly the records before it
        assert lines[i]["synced_through"] == max(rec["seq"] for rec in lines[:i] if "seq" in rec)


def _power_loss_after_last_sync(dest, shard: str, files: dict) -> None:
    """What a power loss can leave: the last file renamed and journaled after the last sync
    point, its journal line on disk, its data not (same size here, wrong bytes, same mtime)."""
    path = dest / shard
    st = os.stat(path)
    os.unlink(dest / ws.MARKER_NAME)
    with open(path, "r+b") as f:
        f.write(b"\0" * 4096)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    journal = dest / ws.STATE_DIR_NAME / ws.JOURNAL_NAME
    lines = journal_lines(dest)
    synced = lines[-1]["synced_through"]
    rec = next(r for r in lines if r.get("path") == shard)
    with open(journal, "a") as f:
        f.write(json.dumps(dict(rec, seq=synced + 1)) + "\n")


def test_fast_resume_rehashes_a_file_journaled_after_the_last_sync_point(tmp_path, src, capsys):
    root, files = src
    (root / ws.MANIFEST_NAME).write_text(json.dumps(manifest_for(files)))
    dest = tmp_path / "dst"
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0
    shard = "model-00003-of-00006.safetensors"
    _power_loss_after_last_sync(dest, shard, files)
    rc, summary, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 0, err
    assert summary["files_transferred"] == 1 and summary["files_skipped"] == len(files) - 1
    assert read_tree(str(dest)) == files and (dest / ws.MARKER_NAME).exists()
    # An intact file journaled after the sync point is re-hashed and kept, not fetched again.
    os.unlink(dest / ws.MARKER_NAME)
    lines = journal_lines(dest)
    rec = next(r for r in lines if r.get("path") == shard)
    with open(dest / ws.STATE_DIR_NAME / ws.JOURNAL_NAME, "a") as f:
        f.write(json.dumps(dict(rec, seq=lines[-1]["synced_through"] + 1)) + "\n")
    rc, summary, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 0 and summary["files_transferred"] == 0 and summary["files_verified"] == 1
    # ... and the same damage under a record the last sync point covers is trusted (fast mode).
    st = os.stat(dest / shard)
    os.unlink(dest / ws.MARKER_NAME)
    with open(dest / shard, "r+b") as f:
        f.write(b"\0" * 4096)
    os.utime(dest / shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, summary, _ = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 0 and summary["files_transferred"] == 0 and summary["files_verified"] == 0


def test_untrusted_record_of_a_manifestless_source_is_rehashed_too(tmp_path, src, capsys):
    root, files = src  # no manifest: the sha256 comes from the journal (same source size and mtime)
    dest = tmp_path / "dst"
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0
    _power_loss_after_last_sync(dest, "model-00002-of-00006.safetensors", files)
    rc, summary, err = run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))
    assert rc == 0 and summary["files_transferred"] == 1, err
    assert read_tree(str(dest)) == files


def test_new_records_continue_the_sequence_after_a_lost_tail(tmp_path, src, capsys, monkeypatch):
    root, files = src
    dest = tmp_path / "dst"
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0
    last = journal_lines(dest)[-1]["synced_through"]
    os.unlink(dest / ws.MARKER_NAME)
    os.unlink(dest / "config.json")
    with open(dest / ws.STATE_DIR_NAME / ws.JOURNAL_NAME, "a") as f:  # an old unsynced line
        f.write(json.dumps({"path": "x", "seq": last + 5}) + "\n")
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(dest))[0] == 0
    rec = next(r for r in journal_lines(dest) if r.get("path") == "config.json")
    assert rec["seq"] > last + 5


# --- new-user trial defects: empty sources, empty paths, one-line usage errors -------------------


def test_empty_source_directory_fails_and_writes_nothing(tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)  # directories but no file
    dest = tmp_path / "dst"
    rc, _, err = run_json(capsys, "--source", f"file://{empty}", "--dest", str(dest))
    assert rc == 1 and "source has no files" in err and len(err.strip().splitlines()) == 1, err
    assert not dest.exists()  # no marker, not even the state directory


def test_source_manifest_listing_no_files_fails(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / ws.MANIFEST_NAME).write_text(json.dumps({"version": 1, "revision": "0" * 40, "files": []}))
    dest = tmp_path / "dst"
    rc, _, err = run_json(capsys, "--source", f"file://{src}", "--dest", str(dest))
    assert rc == 1 and "source has no files" in err
    assert not (dest / ws.MARKER_NAME).exists()


@pytest.mark.parametrize("argv, needle", [
    (["--source", "file://{src}", "--dest", ""], "--dest ''"),
    (["--source", "", "--dest", "{dst}"], "--source ''"),
    (["--source", "file://{src}", "--dest", " "], "--dest ' '"),
    (["--source", "file://{src}", "--dest", "{dst}", "--dst", "{dst}"], "unrecognized arguments: --dst"),  # no abbreviations
    (["--source", "file://{src}", "--de", "{dst}"], "required: --dest"),
    (["--source", "file://{src}", "--dest", "{dst}", "--work", "2"], "unrecognized arguments: --work"),
    (["--dest", "{dst}"], "--source"),
])
def test_empty_paths_and_abbreviations_are_one_line_usage_errors(tmp_path, argv, needle):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    paths = {"src": str(tmp_path / "no-such-source"), "dst": str(tmp_path / "dst")}
    r = subprocess.run([*SYNC, *(a.format(**paths) for a in argv)], capture_output=True, text=True, cwd=cwd)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd"] and list(cwd.iterdir()) == []  # no .weights-sync/ anywhere


def test_zipapp_is_byte_reproducible_and_only_carries_the_package(tmp_path):
    """Same source -> same bytes -> same sha256, whatever the files' mtimes, modes or stray
    bytecode; a one-byte change gives another hash (the ConfigMap and S3 object names use it)."""
    import shutil
    import zipfile

    from components.sync_artifact import FIXED_ZIP_DATE, SYNC_PACKAGE_DIR

    first = build_sync_artifact()
    copy = tmp_path / "weight_sync"
    shutil.copytree(SYNC_PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for i, path in enumerate(sorted(copy.iterdir())):
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i * 7))
        path.chmod(0o600 if i % 2 else 0o755)
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"stray")
    (copy / "notes.txt").write_text("not shipped")
    again = build_sync_artifact(copy)
    assert again.data == first.data and again.sha256 == first.sha256 == hashlib.sha256(first.data).hexdigest()
    assert first.size_bytes == len(first.data) < 1 << 20  # far below the ConfigMap limit (1 MiB)
    assert first.data.startswith(b"#!/usr/bin/env python3\n")
    (tmp_path / "a.pyz").write_bytes(first.data)
    with zipfile.ZipFile(tmp_path / "a.pyz") as archive:
        infos = archive.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names) and names[0] == "__main__.py"
    assert set(names[1:]) == {f"weight_sync/{p.name}" for p in SYNC_PACKAGE_DIR.glob("*.py")}
    assert {i.date_time for i in infos} == {FIXED_ZIP_DATE} and {i.compress_type for i in infos} == {zipfile.ZIP_STORED}
    (copy / "cli.py").write_bytes((copy / "cli.py").read_bytes() + b"\n")
    assert build_sync_artifact(copy).sha256 != first.sha256


def test_zipapp_runs_alone_with_the_standard_library(tmp_path, src):
    """What a node runs: `python3 weight_sync.pyz ...` in isolated mode (no site-packages, no
    checkout on the path) copies, verifies and marks a local directory."""
    root, files = src
    pyz = tmp_path / "weight_sync.pyz"
    pyz.write_bytes(build_sync_artifact().data)
    r = subprocess.run([sys.executable, "-I", "-S", str(pyz), "--source", f"file://{root}", "--dest",
                        str(tmp_path / "d"), "--json", "--quiet"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files_transferred"] == len(files)
    assert read_tree(str(tmp_path / "d")) == files and (tmp_path / "d" / ws.MARKER_NAME).is_file()


def test_a_verified_copy_is_copied_without_hashing_and_sha256_mode_still_hashes(tmp_path, src, capsys, monkeypatch):
    """dir -> dir from a directory this program completed (marker + manifest with the same digest):
    kernel-side copy (copy_file), no hashing, sizes checked. `--verify sha256` hashes every byte,
    so a same-size corruption of the source is caught there (and only there: the trade-off)."""
    root, files = src
    first = tmp_path / "first"
    assert run_json(capsys, "--source", f"file://{root}", "--dest", str(first))[0] == 0
    copies: list[str] = []
    real_copy = destinations.copy_file
    monkeypatch.setattr(destinations, "copy_file", lambda s, d, p=None: (copies.append(s), real_copy(s, d, p))[1])
    rc, summary, err = run_json(capsys, "--source", f"file://{first}", "--dest", str(tmp_path / "second"))
    assert rc == 0, err
    assert len(copies) == len(files) and read_tree(str(tmp_path / "second")) == files
    marker = json.loads((tmp_path / "second" / ws.MARKER_NAME).read_text())
    assert marker["manifest_sha256"] == json.loads((first / ws.MARKER_NAME).read_text())["manifest_sha256"]
    bad = next(p for p in files if p.startswith("model-"))
    (first / bad).write_bytes(bytes(len(files[bad])))  # same size, other bytes
    rc, _, err = run_json(capsys, "--source", f"file://{first}", "--dest", str(tmp_path / "third"), "--verify", "sha256")
    assert rc == 1 and bad in err and "sha256" in err
    copies.clear()
    (first / ws.MARKER_NAME).unlink()  # no longer a verified copy: hashed while copied
    rc, _, err = run_json(capsys, "--source", f"file://{first}", "--dest", str(tmp_path / "fourth"))
    assert rc == 1 and bad in err and copies == []

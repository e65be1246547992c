"""What a node's boot asks of weight_sync (components/aws/userdata.py weights.sh): the publish step
is a true no-op on a complete mirror (hub files outside LFS included, the marker never deleted), a
pinned mirror is recognised with the hub down, a weight file changed in place on the array is
fetched again before it is served, and ``--check-local`` proves a complete local copy without
contacting anything. The real huggingface_hub against tests/hub_server.py and boto3 against moto
in server mode; the program runs as a subprocess, as on the node."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from tests.hub_server import HubServer, is_lfs
from tests.sync_fixtures import S3_ENV, checkpoint_files, read_tree

pytest.importorskip("huggingface_hub")
pytest.importorskip("moto.server")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNC = [sys.executable, "-m", "scripts.node.weight_sync"]
HF_REPO = "moonshotai/Kimi-K3.1-Pro"


@pytest.fixture
def hub():
    with HubServer() as server:
        yield server


@pytest.fixture
def bucket(sync_s3):
    name = "boot-" + uuid.uuid4().hex[:12]
    sync_s3.create_bucket(Bucket=name)
    # Versioning keeps every write and delete of the marker visible to the test.
    sync_s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


def sync(hub, moto_server, tmp_path, source: str, dest: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "AWS_"))}
    env.update(S3_ENV, AWS_ENDPOINT_URL=moto_server.endpoint, HF_ENDPOINT=hub.endpoint,
               HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_ETAG_TIMEOUT="5",
               PYTHONPATH=REPO)
    return subprocess.run([*SYNC, "--source", source, "--dest", dest, "--json", "--quiet", *extra],
                          env=env, capture_output=True, text=True, timeout=180, cwd=REPO)


def marker_writes(client, bucket: str, key: str) -> list[str]:
    """Every write (version) and delete (delete marker) of ``key``, oldest first (S3 stamps to the second: same-second
    events keep no order, so use it where there is at most one)."""
    listing = client.list_object_versions(Bucket=bucket, Prefix=key)
    events = [(v["LastModified"], "put") for v in listing.get("Versions", []) if v["Key"] == key]
    events += [(d["LastModified"], "delete") for d in listing.get("DeleteMarkers", []) if d["Key"] == key]
    return [kind for _, kind in sorted(events)]


def resolve_gets(hub) -> int:
    return sum(1 for m, p in hub.state.requests if m == "GET" and "/resolve/" in p)


def test_publish_is_a_true_no_op_on_a_complete_mirror_hub_files_outside_lfs_included(hub, moto_server, sync_s3, bucket,
                                                                                     tmp_path):
    files = checkpoint_files(seed=31)
    assert any(not is_lfs(p, d) for p, d in files.items())  # config.json and the remote code are plain git blobs
    hub.state.add_repo(HF_REPO, files)
    uri = f"s3://{bucket}/models/{HF_REPO}/main"
    first = sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", uri, "--staging-dir", str(tmp_path / "stage"))
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["files_transferred"] == len(files)
    marker_key = f"models/{HF_REPO}/main/.weights-complete.json"
    assert marker_writes(sync_s3, bucket, marker_key) == ["put"]
    downloads = resolve_gets(hub)
    manifest = json.loads(sync_s3.get_object(Bucket=bucket, Key=f"models/{HF_REPO}/main/manifest.json")["Body"].read())
    blobs = {f["path"]: f.get("git_sha1") for f in manifest["files"]}
    assert all(blobs[p] for p, d in files.items() if not is_lfs(p, d))  # recorded for the next publish

    again = sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", uri, "--staging-dir", str(tmp_path / "stage"))
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["files_transferred"] == 0 and summary["files_skipped"] == len(files)
    assert resolve_gets(hub) == downloads  # nothing downloaded from the hub again
    assert marker_writes(sync_s3, bucket, marker_key) == ["put"]  # never deleted, never rewritten


def test_a_mirror_published_before_blob_ids_were_recorded_is_repaired_once(hub, moto_server, sync_s3, bucket, tmp_path):
    files = checkpoint_files(seed=32)
    hub.state.add_repo(HF_REPO, files)
    uri = f"s3://{bucket}/m"
    assert sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", uri).returncode == 0
    key = "m/manifest.json"
    doc = json.loads(sync_s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    for f in doc["files"]:
        f.pop("git_sha1", None)
    sync_s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(doc).encode())
    plain = sum(1 for p, d in files.items() if not is_lfs(p, d))
    # Without --follow-branch the complete mirror keeps its commit without the hub (no repair needed:
    # nothing compares blob ids then); following the branch compares them with the hub's.
    kept = sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", uri)
    assert kept.returncode == 0 and json.loads(kept.stdout)["files_transferred"] == 0
    repair = sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", uri, "--follow-branch")
    assert repair.returncode == 0 and json.loads(repair.stdout)["files_transferred"] == plain
    again = sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", uri, "--follow-branch")
    assert json.loads(again.stdout)["files_transferred"] == 0
    # Written, withdrawn while the repair ran, written again: once. S3 stamps LastModified to the second here, so
    # the delete and a put may share a stamp; the order is checked as "the delete lies between the two puts".
    listing = sync_s3.list_object_versions(Bucket=bucket, Prefix="m/.weights-complete.json")
    puts = sorted(v["LastModified"] for v in listing.get("Versions", []))
    deletes = [d["LastModified"] for d in listing.get("DeleteMarkers", [])]
    assert len(puts) == 2 and len(deletes) == 1 and puts[0] <= deletes[0] <= puts[1]
    assert any(v["IsLatest"] for v in listing["Versions"])  # the marker stands at the end, not its delete


def test_a_complete_mirror_of_a_pinned_commit_needs_no_hub(hub, moto_server, sync_s3, bucket, tmp_path):
    files = checkpoint_files(seed=33)
    commit = hub.state.add_repo(HF_REPO, files)
    source, uri = f"hf://{HF_REPO}@{commit}", f"s3://{bucket}/models/{HF_REPO}/{commit}"
    assert sync(hub, moto_server, tmp_path, source, uri).returncode == 0
    hub.state.outage_status = 503
    requests = len(hub.state.requests)
    r = sync(hub, moto_server, tmp_path, source, uri)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files_skipped"] == len(files)
    assert len(hub.state.requests) == requests  # the hub was not asked
    # A branch cannot be known without the hub: the outage fails that publish (exit 1, one line).
    r = sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", f"s3://{bucket}/models/{HF_REPO}/main")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "503" in r.stderr


def _node_copy(hub, moto_server, sync_s3, bucket, tmp_path, files):
    hub.state.add_repo(HF_REPO, files)
    mirror = f"s3://{bucket}/models/{HF_REPO}/main"
    assert sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", mirror).returncode == 0
    dest = tmp_path / "nvme" / "main"
    r = sync(hub, moto_server, tmp_path, mirror, str(dest))
    assert r.returncode == 0, r.stderr
    return mirror, dest


def test_a_weight_file_changed_in_place_is_fetched_again_before_it_is_served(hub, moto_server, sync_s3, bucket, tmp_path):
    files = checkpoint_files(seed=34)
    mirror, dest = _node_copy(hub, moto_server, sync_s3, bucket, tmp_path, files)
    shard = next(p for p in sorted(files) if p.endswith(".safetensors"))
    time.sleep(0.01)  # a later mtime, as any write on the array gives
    with open(dest / shard, "r+b") as f:  # same size, one byte flipped: bit rot or a stray write
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    r = sync(hub, moto_server, tmp_path, mirror, str(dest))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files_transferred"] == 1
    assert read_tree(str(dest)) == files


def test_check_local_proves_a_complete_copy_without_contacting_anything(hub, moto_server, sync_s3, bucket, tmp_path):
    files = checkpoint_files(seed=35)
    mirror, dest = _node_copy(hub, moto_server, sync_s3, bucket, tmp_path, files)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "AWS_"))}
    env.update(S3_ENV, AWS_ENDPOINT_URL="http://127.0.0.1:9", HF_ENDPOINT="http://127.0.0.1:9", PYTHONPATH=REPO)
    code = ("import json, sys; import scripts.node.weight_sync as ws; rc = ws.main(sys.argv[1:]); "
            "print(json.dumps([rc, 'boto3' in sys.modules, 'huggingface_hub' in sys.modules]))")

    def check() -> tuple[subprocess.CompletedProcess, list]:
        r = subprocess.run([sys.executable, "-c", code, "--source", mirror, "--dest", str(dest), "--check-local", "--json"],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
        return r, json.loads(r.stdout.splitlines()[-1])

    r, verdict = check()
    assert verdict == [0, False, False], r.stderr
    assert json.loads(r.stdout.splitlines()[0])["files_skipped"] == len(files)
    shard = next(p for p in sorted(files) if p.endswith(".safetensors"))
    os.utime(dest / shard, ns=(0, 0))  # same bytes, another mtime: not as verified
    r, verdict = check()
    assert verdict[0] == 1 and shard in r.stderr and r.stderr.count("\n") == 1
    assert r.stderr.startswith("weight_sync: check-local: ")  # a finding, not an error of the program
    (dest / ".weights-complete.json").unlink()
    r, verdict = check()
    assert verdict[0] == 1 and "no completion marker" in r.stderr
    r = subprocess.run([*SYNC, "--source", f"hf://{HF_REPO}@main", "--dest", mirror, "--check-local"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "--check-local needs a local --dest" in r.stderr


def _plan_step_args(step, bucket: str, models_dir) -> list[str]:
    """A plan step's arguments after the program (``python3 weight_sync.pyz``), with the node's
    ``/models`` mount at ``models_dir`` (the bucket is the test's own)."""
    from components.core.weights import SYNC_SCRIPT_PATH, WEIGHTS_MOUNT_PATH

    args = list(step.argv[step.argv.index(SYNC_SCRIPT_PATH) + 1:])
    return [a.replace(WEIGHTS_MOUNT_PATH + "/", f"{models_dir}/", 1) if a.startswith(WEIGHTS_MOUNT_PATH + "/") else a
            for a in args]


def test_serve_loads_the_commit_staging_resolved_whatever_the_branch_has_become(hub, moto_server, sync_s3, bucket, tmp_path):
    """b300 ships ``model.revision: main``. The stage's publish resolves main and records the commit
    in the mirror's marker; main then moves; serve's publish and node copy (the plan's own argv) ask
    the hub nothing and load the staged commit. ``--follow-branch`` publishes the new one."""
    from components.core.load import load_stack
    from components.core.weights import sync_steps
    from tests.conftest import FIXED_NOW

    spec = load_stack("b300", now=FIXED_NOW)
    assert spec.revision == "main" and spec.hub_repo == HF_REPO
    publish, node_copy = sync_steps(spec, bucket)
    staged_files = checkpoint_files(seed=36)
    staged = hub.state.add_repo(HF_REPO, staged_files)
    models = tmp_path / "models"

    def step(s, *extra: str) -> subprocess.CompletedProcess:
        args = _plan_step_args(s, bucket, models)
        source, dest = args[args.index("--source") + 1], args[args.index("--dest") + 1]
        rest = [a for i, a in enumerate(args) if a not in ("--source", "--dest", "--json") and args[i - 1] not in
                ("--source", "--dest")]
        return sync(hub, moto_server, tmp_path, source, dest, *rest, *extra)

    stage = step(publish)  # phase: stage
    assert stage.returncode == 0, stage.stderr
    assert json.loads(stage.stdout)["revision"] == staged
    marker_key = f"models/{HF_REPO}/main/.weights-complete.json"
    assert json.loads(sync_s3.get_object(Bucket=bucket, Key=marker_key)["Body"].read())["revision"] == staged

    moved_files = {**staged_files, "model-00002-of-00006.safetensors": b"a new commit on main" * 5000}
    moved = hub.state.add_repo(HF_REPO, moved_files)
    assert moved != staged
    requests = len(hub.state.requests)
    serve = step(publish)  # phase: serve, on the GPU node
    assert serve.returncode == 0, serve.stderr
    summary = json.loads(serve.stdout)
    assert summary["revision"] == staged and summary["files_transferred"] == 0
    assert f"commit {staged}; kept without asking the hub" in serve.stderr
    copy = step(node_copy)
    assert copy.returncode == 0, copy.stderr
    assert len(hub.state.requests) == requests  # the hub was asked nothing at serve
    served = models / spec.model.name / "main"
    assert read_tree(str(served)) == staged_files
    assert json.loads((served / ".weights-complete.json").read_text())["revision"] == staged

    follow = step(publish, "--follow-branch")
    assert follow.returncode == 0, follow.stderr
    assert json.loads(follow.stdout)["revision"] == moved and json.loads(follow.stdout)["files_transferred"] == 1
    assert json.loads(sync_s3.get_object(Bucket=bucket, Key=marker_key)["Body"].read())["revision"] == moved
    wrong = sync(hub, moto_server, tmp_path, f"hf://{HF_REPO}@main", str(tmp_path / "local"), "--follow-branch")
    assert wrong.returncode == 2 and "--follow-branch applies to an s3:// --dest" in wrong.stderr

"""weight_sync with a Hugging Face source: the real huggingface_hub client against a local hub
(tests/hub_server.py) reached through HF_ENDPOINT. The program runs as a subprocess, as in the
Kubernetes Job, so huggingface_hub reads HF_ENDPOINT fresh; that also allows a real SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.hub_server import HubServer
from tests.sync_fixtures import checkpoint_files, read_tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("huggingface_hub")
SCRIPT = os.path.join(REPO, "scripts", "weight_sync.py")
MARKER = ".weights-complete.json"


@pytest.fixture
def hub(tmp_path):
    with HubServer() as server:
        yield server


def env_for(hub, tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_ETAG_TIMEOUT="5", **extra)
    return env


def sync(hub, tmp_path, source: str, dest, *extra, **env_extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, "--source", source, "--dest", str(dest), "--json", *extra],
                          env=env_for(hub, tmp_path, **env_extra), capture_output=True, text=True, timeout=120)


def test_branch_is_resolved_to_its_commit_and_every_file_verified(hub, tmp_path):
    files = checkpoint_files(seed=10)
    commit = hub.state.add_repo("moonshotai/Kimi-K3.1-Pro", files)
    dest = tmp_path / "dst"
    r = sync(hub, tmp_path, "hf://moonshotai/Kimi-K3.1-Pro@main", dest, "--workers", "3")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["revision"] == commit and summary["files_verified"] == len(files)
    assert read_tree(str(dest)) == files
    marker = json.loads((dest / MARKER).read_text())
    assert marker["revision"] == commit and marker["source"] == "hf://moonshotai/Kimi-K3.1-Pro@main"
    downloads = [p for m, p in hub.state.requests if m == "GET" and "/resolve/" in p]
    assert downloads and all(f"/resolve/{commit}/" in p for p in downloads)  # pinned, never the branch
    r = sync(hub, tmp_path, "hf://moonshotai/Kimi-K3.1-Pro@main", dest)
    again = json.loads(r.stdout)
    assert again["files_transferred"] == 0 and again["files_skipped"] == len(files) and again["seconds"] < 2
    assert len([p for m, p in hub.state.requests if m == "GET" and "/resolve/" in p]) == len(downloads)


def test_a_new_commit_on_the_branch_fetches_only_what_changed(hub, tmp_path):
    files = checkpoint_files(seed=11)
    hub.state.add_repo("org/model", files)
    dest = tmp_path / "dst"
    assert sync(hub, tmp_path, "hf://org/model@main", dest).returncode == 0
    files["config.json"] = b'{"model_type": "kimi_k3", "rope": 2}'
    new_commit = hub.state.add_repo("org/model", files)
    r = sync(hub, tmp_path, "hf://org/model@main", dest)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files_transferred"] == 1 and read_tree(str(dest)) == files
    assert json.loads((dest / MARKER).read_text())["revision"] == new_commit


def test_corrupt_download_is_fetched_once_more(hub, tmp_path):
    files = checkpoint_files(seed=12)
    hub.state.add_repo("org/model", files)
    hub.state.corrupt_once |= {"config.json", "model-00002-of-00006.safetensors"}  # git blob and LFS
    r = sync(hub, tmp_path, "hf://org/model@main", tmp_path / "dst")
    assert r.returncode == 0, r.stderr
    assert "git blob id" in r.stderr and "sha256" in r.stderr and "once more" in r.stderr
    assert hub.state.downloads_of("config.json") == 2 and read_tree(str(tmp_path / "dst")) == files


def test_always_truncated_download_fails_loudly_without_marker(hub, tmp_path):
    files = checkpoint_files(seed=13)
    hub.state.add_repo("org/model", files)
    bad = "model-00004-of-00006.safetensors"
    hub.state.truncate_always.add(bad)
    r = sync(hub, tmp_path, "hf://org/model@main", tmp_path / "dst")
    assert r.returncode == 1 and bad in r.stderr and "fetched 2 times" in r.stderr and "Traceback" not in r.stderr
    assert hub.state.downloads_of(bad) == 2
    assert not (tmp_path / "dst" / MARKER).exists() and not (tmp_path / "dst" / bad).exists()


def test_transient_5xx_are_retried(hub, tmp_path):
    files = checkpoint_files(seed=14)
    hub.state.add_repo("org/model", files)
    hub.state.fail_statuses.update({"model-00001-of-00006.safetensors": [500, 503], "config.json": [429]})
    r = sync(hub, tmp_path, "hf://org/model@main", tmp_path / "dst")
    assert r.returncode == 0, r.stderr
    assert "retry" in r.stderr and read_tree(str(tmp_path / "dst")) == files
    assert hub.state.downloads_of("model-00001-of-00006.safetensors") == 3


@pytest.mark.parametrize("source, needle", [
    ("hf://org/missing@main", "RepositoryNotFoundError"),
    ("hf://org/model@no-such-branch", "RevisionNotFoundError"),
])
def test_unknown_repo_or_revision_is_permanent(hub, tmp_path, source, needle):
    hub.state.add_repo("org/model", checkpoint_files(seed=15))
    started = time.monotonic()
    r = sync(hub, tmp_path, source, tmp_path / "dst")
    assert r.returncode == 1 and needle in r.stderr and "retry" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and time.monotonic() - started < 20


def test_token_comes_from_the_environment_and_is_never_printed(hub, tmp_path):
    files = checkpoint_files(seed=16)
    hub.state.add_repo("org/private", files)
    hub.state.required_token = "hf_right_token_123"
    r = sync(hub, tmp_path, "hf://org/private@main", tmp_path / "a", HF_TOKEN="hf_wrong_token_456")
    assert r.returncode == 1 and "hf_wrong_token_456" not in r.stderr + r.stdout
    r = sync(hub, tmp_path, "hf://org/private@main", tmp_path / "b", HF_TOKEN="hf_right_token_123")
    assert r.returncode == 0, r.stderr
    assert read_tree(str(tmp_path / "b")) == files and "hf_right_token_123" not in r.stderr + r.stdout


def test_sigkill_mid_run_keeps_completed_files_and_resumes(hub, tmp_path):
    files = checkpoint_files(n_shards=10, seed=17)
    hub.state.add_repo("org/model", files)
    hub.state.download_delay_seconds = 0.25
    dest = tmp_path / "dst"
    proc = subprocess.Popen([sys.executable, SCRIPT, "--source", "hf://org/model@main", "--dest", str(dest),
                             "--workers", "1", "--quiet"], env=env_for(hub, tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(read_tree(str(dest)) if dest.exists() else {}) < 4:
        assert not (dest / MARKER).exists()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = read_tree(str(dest))
    assert 4 <= len(done_before) < len(files) and not (dest / MARKER).exists()
    assert all(files[p] == d for p, d in done_before.items())  # final names only hold verified bytes
    hub.state.download_delay_seconds = 0
    r = sync(hub, tmp_path, "hf://org/model@main", dest)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["files_skipped"] >= len(done_before)
    assert summary["files_transferred"] == len(files) - summary["files_skipped"]
    assert read_tree(str(dest)) == files and (dest / MARKER).exists()


def test_hub_repo_without_files_fails_without_a_marker(hub, tmp_path):
    hub.state.add_repo("moonshotai/empty", {})
    dest = tmp_path / "dst"
    r = sync(hub, tmp_path, "hf://moonshotai/empty@main", dest)
    assert r.returncode == 1 and "source has no files" in r.stderr, r.stderr
    assert not (dest / MARKER).exists()

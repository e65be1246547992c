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
SYNC = [sys.executable, "-m", "scripts.node.weight_sync"]
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
    return subprocess.run([*SYNC, "--source", source, "--dest", str(dest), "--json", *extra],
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
    ("hf://org/missing@main", "hf://org/missing@main on 127.0.0.1:"),
    ("hf://org/model@no-such-branch", "revision 'no-such-branch' does not exist in org/model"),
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
    proc = subprocess.Popen([*SYNC, "--source", "hf://org/model@main", "--dest", str(dest),
                             "--workers", "1", "--quiet"], env=env_for(hub, tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def verified_finals() -> int:
        # Only files under their final name with their final bytes: the hub client's own temp files
        # (``.cache/huggingface/...incomplete``) move out of view when the sync stages them, so a plain
        # count of the tree can go down between the check and the kill.
        tree = read_tree(str(dest)) if dest.exists() else {}
        return sum(1 for p, d in tree.items() if files.get(p) == d)

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and verified_finals() < 4:
        assert not (dest / MARKER).exists()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {p: d for p, d in read_tree(str(dest)).items() if p in files}
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


# Hub errors a user can act on: one line naming the repo, revision and host and what to do, never
# the token. The local hub answers as huggingface.co does (status + X-Error-Code, see hub_server).
GRANTED, NOT_GRANTED, REVOKED = "hf_granted_token_111", "hf_not_granted_222", "hf_revoked_token_333"


def _one_line_error(r, *needles):
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.strip().splitlines() if "error" in line]  # progress lines aside
    assert len(lines) == 1 and lines[0].startswith("weight_sync: error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    for token in (GRANTED, NOT_GRANTED, REVOKED):
        assert token not in r.stderr + r.stdout
    assert "Traceback" not in r.stderr and "retry" not in r.stderr
    return lines[0]


@pytest.mark.parametrize("token, needles", [
    (None, ["gated model and no token was sent", "accept the model's terms", "kimi-deploy:hfToken"]),
    (NOT_GRANTED, ["has not been granted access", "accept the model's terms", "/org/gated"]),
])
def test_gated_repo_says_accept_the_terms_and_set_the_token(hub, tmp_path, token, needles):
    files = checkpoint_files(seed=20)
    hub.state.add_repo("org/gated", files)
    hub.state.gated["org/gated"] = {GRANTED}
    extra = {"HF_TOKEN": token} if token else {}
    line = _one_line_error(sync(hub, tmp_path, "hf://org/gated@main", tmp_path / "dst", **extra),
                           "hf://org/gated@main", "127.0.0.1", *needles)
    assert not (tmp_path / "dst" / MARKER).exists() and line.startswith("weight_sync: error: ")
    r = sync(hub, tmp_path, "hf://org/gated@main", tmp_path / "dst", HF_TOKEN=GRANTED)
    assert r.returncode == 0, r.stderr
    assert read_tree(str(tmp_path / "dst")) == files


@pytest.mark.parametrize("token, needles", [
    (None, ["repository not found, or private/gated and no token was sent", "kimi-deploy:hfToken"]),
    (NOT_GRANTED, ["private and the token's account cannot read it", "kimi-deploy:hfToken"]),
])
def test_private_repo_names_the_repo_and_the_token_key(hub, tmp_path, token, needles):
    hub.state.add_repo("org/private", checkpoint_files(seed=21))
    hub.state.private["org/private"] = {GRANTED}
    extra = {"HF_TOKEN": token} if token else {}
    _one_line_error(sync(hub, tmp_path, "hf://org/private@v1", tmp_path / "dst", **extra),
                    "hf://org/private@v1", "127.0.0.1", *needles)


def test_revoked_token_says_make_a_new_one(hub, tmp_path):
    hub.state.add_repo("org/model", checkpoint_files(seed=22))
    hub.state.invalid_tokens.add(REVOKED)
    _one_line_error(sync(hub, tmp_path, "hf://org/model@main", tmp_path / "dst", HF_TOKEN=REVOKED),
                    "hf://org/model@main", "rejected the token", "invalid or expired",
                    "https://huggingface.co/settings/tokens", "kimi-deploy:hfToken")


def test_unknown_revision_names_the_revision_and_the_config_key(hub, tmp_path):
    hub.state.add_repo("org/model", checkpoint_files(seed=23))
    _one_line_error(sync(hub, tmp_path, "hf://org/model@no-such-branch", tmp_path / "dst"),
                    "hf://org/model@no-such-branch", "revision 'no-such-branch' does not exist",
                    "kimi-deploy:model.revision")


def test_unreachable_host_names_the_endpoint_and_hf_endpoint(hub, tmp_path):
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = env_for(hub, tmp_path)
    env["HF_ENDPOINT"] = dead
    started = time.monotonic()
    r = subprocess.run([*SYNC, "--source", "hf://org/model@main", "--dest", str(tmp_path / "d")],
                       env=env, capture_output=True, text=True, timeout=60)
    _one_line_error(r, "hf://org/model@main", "cannot reach the hub at " + dead, "HF_ENDPOINT (set)")
    assert time.monotonic() - started < 30


def test_hub_error_message_is_none_for_other_errors():
    from scripts.node import weight_sync
    assert weight_sync.hub_error_message(ValueError("x"), "hf", "org/m", "main") is None
    assert weight_sync.hub_error_message(OSError(28, "No space left"), "hf", "org/m", "main") is None


def test_modelscope_errors_name_the_modelscope_key_and_host(monkeypatch):
    """The ModelScope SDK's own classes, matched by name (the SDK is not a dependency here)."""
    from scripts.node import weight_sync

    class NotExistError(Exception):
        pass

    class HTTPError(OSError):
        def __init__(self, status):
            super().__init__(f"{status} Client Error")
            self.response = type("R", (), {"status_code": status})()

    monkeypatch.delenv("MODELSCOPE_API_TOKEN", raising=False)
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "https://user:pw@ms.example.cn")
    missing = weight_sync.hub_error_message(NotExistError("model not exist"), "modelscope", "org/m", None)
    assert missing.startswith("modelscope://org/m@master on ms.example.cn: repository not found")
    assert "kimi-deploy:modelscopeToken" in missing and "pw" not in missing
    revision = weight_sync.hub_error_message(NotExistError("Revision v9 not exist"), "modelscope", "org/m", "v9")
    assert "revision 'v9' does not exist" in revision and "kimi-deploy:model.revision" in revision
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms-secret-token-123")
    rejected = weight_sync.hub_error_message(HTTPError(401), "modelscope", "org/m", "master")
    assert "rejected the token" in rejected and "ms-secret-token-123" not in rejected
    refused = weight_sync.hub_error_message(ConnectionRefusedError(111, "refused"), "modelscope", "org/m", "master")
    assert "cannot reach the hub at https://ms.example.cn" in refused and "MODELSCOPE_DOMAIN (set)" in refused
    assert "pw" not in refused

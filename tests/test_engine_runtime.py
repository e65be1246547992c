"""`kimi-deploy engine verify` and its container runtime: which runtime is used (the first of docker,
podman on PATH whose `info` answers), with stand-in runtimes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import cli
from scripts.ops import engine_verify
from tests import fake_runtime

NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


def _verify(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["engine", "verify", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def bindir(tmp_path, monkeypatch) -> Path:
    """A PATH holding only the stand-ins a test installs (no runtime of the machine's is found)."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    return path


# --- which runtime ---------------------------------------------------------------------------------


def test_a_docker_without_its_daemon_is_skipped_and_podman_is_used(bindir, capsys):
    docker = fake_runtime.install(bindir, "docker", "without_daemon")
    podman = fake_runtime.install(bindir, "podman", "answers")
    code, out, err = _verify(capsys, "--image", "vllm/vllm-openai:v0.34.0", "--stack", "b300")
    assert code == 1 and err == ""  # podman answered; the (made-up) pull is what fails: not proven
    assert f"  runtime: podman ({podman}); skipped docker: {NO_DAEMON}" in out.splitlines()
    assert "cannot be pulled" in out.splitlines()[-1] and "manifest unknown" in out.splitlines()[-1]
    assert [c for c in fake_runtime.calls(bindir) if c[0] == "docker"] == [["docker", "info", "--format", "{{json .}}"]]
    assert ["podman", "pull", "vllm/vllm-openai:v0.34.0"] in fake_runtime.calls(bindir)
    code, out, _ = _verify(capsys, "--image", "vllm/vllm-openai:v0.34.0", "--stack", "b300", "--json")
    runtime = json.loads(out)["runtime"]
    assert runtime == {"name": "podman", "path": str(podman), "skipped": [{"name": "docker", "why": NO_DAEMON}]}
    assert docker.is_file()


def test_a_docker_that_does_not_answer_in_time_is_skipped(bindir, capsys, monkeypatch):
    fake_runtime.install(bindir, "docker", "hangs")
    fake_runtime.install(bindir, "podman", "answers")
    monkeypatch.setattr(engine_verify, "RUNTIME_PROBE_TIMEOUT_SECONDS", 2)
    selection = engine_verify.select_runtime()
    assert selection.chosen is not None and selection.chosen.name == "podman"
    assert [(p.name, p.problem) for p in selection.skipped] == [("docker", "`docker info` did not answer within 2 s")]


def test_the_first_runtime_that_answers_is_used_and_the_next_is_not_tried(bindir):
    docker = fake_runtime.install(bindir, "docker", "answers")
    fake_runtime.install(bindir, "podman", "answers")
    selection = engine_verify.select_runtime()
    assert selection.chosen == engine_verify.RuntimeProbe("docker", str(docker), None) and selection.skipped == ()
    assert selection.describe() == f"docker ({docker})"
    assert {c[0] for c in fake_runtime.calls(bindir)} == {"docker"}


def test_a_forced_runtime_that_does_not_answer_is_one_line_exit_2_and_no_other_is_tried(bindir, capsys):
    fake_runtime.install(bindir, "docker", "without_daemon")
    fake_runtime.install(bindir, "podman", "answers")
    code, out, err = _verify(capsys, "--image", "vllm/vllm-openai:v0.34.0", "--stack", "b300", "--runtime", "docker")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err == f"error: --runtime: no container runtime (docker) answers (docker: {NO_DAEMON})\n"
    assert {c[0] for c in fake_runtime.calls(bindir)} == {"docker"}
    code, out, err = _verify(capsys, "--image", "vllm/vllm-openai:v0.34.0", "--stack", "b300", "--runtime", "podman")
    assert code == 1 and f"runtime: podman ({bindir / 'podman'})" in out  # forced: nothing else is said skipped


def test_no_runtime_names_each_one_tried_and_why(bindir, capsys):
    fake_runtime.install(bindir, "docker", "without_daemon")
    code, _, err = _verify(capsys, "--image", "vllm/vllm-openai:v0.34.0", "--stack", "b300")
    assert code == 2 and err.count("\n") == 1
    assert err == (f"error: --runtime: no container runtime (docker or podman) answers (docker: {NO_DAEMON}; "
                   "podman: not on PATH)\n")
    assert engine_verify.select_runtime().describe() == f"no container runtime answers (docker: {NO_DAEMON}; podman: not on PATH)"


@pytest.mark.parametrize("image", ["", " ", "\t", ":v0.34.0", "vllm/vllm-openai: v0.34.0"])
def test_an_image_that_names_nothing_is_blamed_on_image_not_stack(bindir, capsys, image):
    code, out, err = _verify(capsys, "--image", image)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: --image: {image!r} is ") and "--stack" not in err
    assert "repo:vX.Y.Z, repo:nightly-<40-hex commit> or repo@sha256:<64 hex>" in err
    assert fake_runtime.calls(bindir) == []  # said offline, before any runtime

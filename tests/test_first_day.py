"""The first-day path is true on a fresh machine: the policy pack in the venv Pulumi makes, the
Debian packages and CRDs `make test` needs, and every README/docs section the repository points at."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

# --- the policy pack, in the venv Pulumi makes ------------------------------------------------------

# What Pulumi's policy runtime does with the pack (PulumiPolicy.yaml: runtime python, virtualenv
# venv): runpy.run_path(<pack dir>). PolicyPack() registers with the engine, absent here: it is
# replaced by a recorder, so importing the pack and building its policies is what runs.
_RUN_PACK = r"""
import runpy, sys
import pulumi_policy
made = []
pulumi_policy.PolicyPack = lambda name, policies, **kw: made.append((name, [p.name for p in policies]))
runpy.run_path(sys.argv[1], run_name="__main__")
print(made[0][0], len(made[0][1]))
"""


def _venv_as_pulumi_makes_it(where: Path) -> Path:
    """``python -m venv`` and ``pip install -r policy/requirements.txt`` in the pack directory, as
    the Pulumi CLI does for a pack whose venv does not exist yet. Skips (fails under CI) when PyPI
    cannot be reached."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    python = where / "bin" / "python"
    pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                          "requirements.txt"], cwd=REPO_ROOT / "policy", capture_output=True, text=True, timeout=900)
    if pip.returncode != 0:
        reason = f"pip install -r policy/requirements.txt failed (PyPI reachable?): {pip.stderr.strip()[-300:]}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)
    return python


def test_the_policy_pack_in_the_venv_pulumi_makes_says_to_run_make_policy_venv_then_works(tmp_path):
    """The README's first-day step 3 runs `make policy-venv` before `--policy-pack policy`: a venv
    from policy/requirements.txt alone lacks the project the rules import, and the pack says so in
    one line; with the project installed (the last step of `make policy-venv`) the pack loads."""
    python = _venv_as_pulumi_makes_it(tmp_path / "venv")
    # As Pulumi runs it: no PYTHONPATH (the suite puts this checkout on it for its own subprocesses).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bare = subprocess.run([str(python), "-c", _RUN_PACK, str(REPO_ROOT / "policy")], cwd=REPO_ROOT / "policy",
                          capture_output=True, text=True, timeout=300, env=env)
    assert bare.returncode == 1 and "Traceback" not in bare.stderr, bare.stderr
    assert bare.stderr.strip().splitlines() == [
        "kimi-deploy policy pack: its virtualenv (policy/venv) lacks the kimi-deploy project the rules import (No module "
        "named 'components'): run `make policy-venv` once in the repository root, then the pulumi command again"
    ]
    # make policy-venv's steps after Pulumi's (Makefile: -r policy/requirements.txt, then the project).
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "$(POLICY_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e ." in makefile
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "-e",
                    str(REPO_ROOT)], check=True, capture_output=True, timeout=600)
    ok = subprocess.run([str(python), "-c", _RUN_PACK, str(REPO_ROOT / "policy")], cwd=REPO_ROOT / "policy",
                        capture_output=True, text=True, timeout=300, env=env)
    assert ok.returncode == 0, ok.stderr
    name, count = ok.stdout.split()
    assert name == "kimi-deploy-guardrails" and int(count) >= 7


def test_the_first_day_path_runs_make_policy_venv_before_the_policy_pack():
    readme = (REPO_ROOT / "README.md").read_text()
    step = readme[readme.index("**3. Serve.**"):readme.index("**4. ")]
    assert step.index("make policy-venv") < step.index("--policy-pack policy")
    assert "make policy-venv" in (REPO_ROOT / "docs" / "pull-requests.md").read_text()
    workflow = (REPO_ROOT / ".github" / "workflows" / "preview.yml").read_text()
    assert "make policy-venv" in workflow


# --- make test on a fresh machine: Debian packages and CRDs --------------------------------------------


def test_make_test_installs_the_debian_packages_first_and_says_the_one_command_otherwise(tmp_path):
    """`make test` runs `system-packages` first; without root or sudo, a missing package stops it
    with the one command to run (the script, with a stand-in dpkg that knows no package)."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    test_target = next(line for line in makefile.splitlines() if line.startswith("test:"))
    assert test_target.split(":", 1)[1].split()[0] == "system-packages"
    assert "bash scripts/dev/system_packages.sh" in makefile
    assert "bash scripts/dev/system_packages.sh" in (REPO_ROOT / ".ci" / "run").read_text()
    assert "sudo make system-packages" in " ".join((REPO_ROOT / "README.md").read_text().split())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, script in (("dpkg", "exit 1"), ("id", 'echo 1000'), ("sudo", "exit 1")):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run(["bash", "scripts/dev/system_packages.sh"], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    listed = [p for p in (REPO_ROOT / ".ci" / "apt-packages.txt").read_text().split() if not p.startswith("#")]
    assert all(p in out.stderr for p in listed) and out.stderr.strip().endswith("run: sudo make system-packages")
    (bin_dir / "dpkg").write_text("#!/bin/sh\nexit 0\n")  # everything installed: silent
    quiet = subprocess.run(["bash", "scripts/dev/system_packages.sh"], cwd=REPO_ROOT, env=env, capture_output=True,
                           text=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stdout == quiet.stderr == ""


def test_make_test_reads_the_crds_beside_the_clone_like_ci(tmp_path):
    """The Makefile's CRD directory: KIMI_CRDS_DIR, else a copy in shared/crds beside the clone (as
    .ci/run used), else .crds; `make test` passes it to pytest and downloads only when none exists."""
    printer = tmp_path / "print.mk"
    printer.write_text("print-crds:\n\t@echo CRDS_DIR=$(CRDS_DIR)\n")

    def crds_dir(cwd: Path, env: dict[str, str]) -> str:
        out = subprocess.run(["make", "--no-print-directory", "-s", "-f", str(REPO_ROOT / "Makefile"), "-f", str(printer),
                              "print-crds"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        return next(line.split("=", 1)[1].strip() for line in out.stdout.splitlines() if line.startswith("CRDS_DIR="))

    clone = tmp_path / "clone"
    clone.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KIMI_CRDS_DIR"}
    assert crds_dir(clone, env) == ".crds"
    (tmp_path / "shared" / "crds").mkdir(parents=True)
    assert crds_dir(clone, env) == os.path.join("..", "shared", "crds")
    assert crds_dir(clone, {**env, "KIMI_CRDS_DIR": "/opt/crds"}) == "/opt/crds"
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "KIMI_CRDS_DIR=$(abspath $(CRDS_DIR))" in makefile
    clean = next(line for line in makefile.splitlines() if line.startswith("\trm -rf $(VENV)"))
    assert "$(CRDS_DOWNLOAD)" in clean and "$(CRDS_DIR)" not in clean  # make clean never removes a shared copy


# --- every README and docs section the repository points at exists --------------------------------


def _slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _headings(path: Path, *, lead_ins: bool = False) -> set[str]:
    """The Markdown headings of ``path`` (outside code blocks); with ``lead_ins`` also the bold
    lead-in of a paragraph (``**Upgrading GPU nodes on reserved capacity.** ...``), which a quoted
    reference may name but no anchor reaches."""
    titles, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.+)$", line)):
            titles.add(m.group(1).strip())
        elif not fenced and lead_ins and (m := re.match(r"^\*\*([^*]+?)\.?\*\*", line)):
            titles.add(m.group(1).strip())
    return titles


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [REPO_ROOT / n for n in listed
            if n.endswith((".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt")) or n in ("Makefile", ".ci/run")]


# `README "Title"`, `docs/x.md "Title"`, `(docs/x.md, "Title")` in comments, docstrings and docs.
_QUOTED = re.compile(r"\b(README|docs/[a-z-]+\.md)(?:\.md)?,? \"([^\"]+)\"")
# Markdown links with an anchor: `(docs/x.md#anchor)`, `(../README.md#anchor)`, `(#anchor)`.
_LINKED = re.compile(r"\]\(((?:\.\./)?(?:docs/)?[A-Za-z-]*(?:\.md)?)#([^)\s]+)\)")


def test_every_section_the_repository_points_at_exists():
    """A stack file, a docstring or a page that names a README or docs section by title or anchor
    names one that exists (the stack files pointed at a README section that was never there)."""
    missing = []
    for path in _tracked_text_files():
        if not path.is_file() or path.name == "test_first_day.py":
            continue
        text = path.read_text(errors="replace")
        for doc, quoted in _QUOTED.findall(text):
            title = " ".join(quoted.split())  # a title wrapped across lines reads as one line in Markdown
            target = REPO_ROOT / ("README.md" if doc == "README" else doc)
            if title not in _headings(target, lead_ins=True):
                missing.append(f"{path.relative_to(REPO_ROOT)}: {doc} \"{title}\"")
        if path.suffix != ".md":
            continue
        for target_name, anchor in _LINKED.findall(text):
            target = path if not target_name else (path.parent / target_name).resolve()
            if target.suffix == ".md" and anchor not in {_slug(t) for t in _headings(target)}:
                missing.append(f"{path.relative_to(REPO_ROOT)}: {target_name}#{anchor}")
    assert missing == [], missing


def test_the_section_check_sees_the_references():
    stacks = "\n".join(p.read_text() for p in (REPO_ROOT / "stacks").glob("Pulumi.*.yaml"))
    assert ("README", "Engine builds") in _QUOTED.findall(stacks)
    assert _slug("First day: from clone to a validated endpoint") == "first-day-from-clone-to-a-validated-endpoint"
    assert "License of the model" in _headings(REPO_ROOT / "README.md")
    assert "mi355x only: pulumi config set --secret kimi-deploy:kubeconfig < ~/.kube/mi355x.yaml" not in _headings(
        REPO_ROOT / "README.md")  # a comment in a code block is no heading
    assert shutil.which("git")

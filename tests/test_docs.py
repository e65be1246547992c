"""The docs show what the commands print, link what exists, and tell no change history.

- Every ``<!-- output: CMD -->`` block in README.md and docs/*.md is the real output of CMD
  (``scripts/dev/doc_blocks.py``; refresh with ``scripts/dev/doc_blocks.py --write``): the plan, the help
  texts, the stage-then-serve figures, a config error.
- Every relative link points at a file (and a heading) that exists.
- The user docs hold no change history ("(changed)", "was 2,885", "issue 14").
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from scripts.dev import doc_blocks
from tests.conftest import REPO_ROOT
from tests.user_docs import DOC_PATHS

BLOCKS = [block for path in DOC_PATHS for block in doc_blocks.blocks_in(path, path.read_text(encoding="utf-8"))]


def test_the_front_page_shows_the_plan_and_the_help():
    """The README's own blocks: the default stack's plan, `kimi-deploy --help`; testing.md: `make help`."""
    commands = {(b.path.name, b.command) for b in BLOCKS}
    assert ("README.md", "kimi-deploy plan --stack b300 --now 2026-12-01T00:00:00Z") in commands
    assert ("README.md", "kimi-deploy --help") in commands and ("testing.md", "make help") in commands


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.path.name}:{b.line}" for b in BLOCKS])
def test_a_documented_output_is_the_real_output(block):
    status, output = doc_blocks.run_command(block)
    assert status == block.exit_status, f"`{block.command}` exited {status}, expected {block.exit_status}:\n{output}"
    text = block.path.read_text(encoding="utf-8")
    assert text[block.start:block.end] == doc_blocks.rendered(block, output), (
        f"{block.path.name}:{block.line}: the output of `{block.command}` changed: run scripts/dev/doc_blocks.py --write")


def test_check_names_a_stale_block_and_write_refreshes_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- output: echo one -->\n```\n$ echo one\ntwo\n```\n<!-- end output -->\nend\n")
    run = subprocess.run([sys.executable, "scripts/dev/doc_blocks.py", "--check", str(page)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "`echo one` changed" in run.stdout + run.stderr
    run = subprocess.run([sys.executable, "scripts/dev/doc_blocks.py", "--write", str(page)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert page.read_text() == "intro\n<!-- output: echo one -->\n```\n$ echo one\none\n```\n<!-- end output -->\nend\n"
    page.write_text("<!-- output exit=3: false -->\n<!-- end output -->\n")
    run = subprocess.run([sys.executable, "scripts/dev/doc_blocks.py", "--check", str(page)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "exited 1, the marker expects 3" in run.stdout + run.stderr
    # A command missing from PATH behind a pipe (bash exits 127, the pipeline 0) is never written as output.
    block = ("<!-- output: no-such-kimi-command --help | cat -->\n```\n$ no-such-kimi-command --help | cat\n```\n"
             "<!-- end output -->\n")
    page.write_text(block)
    run = subprocess.run([sys.executable, "scripts/dev/doc_blocks.py", "--write", str(page)], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "no-such-kimi-command: command not found" in run.stdout + run.stderr
    assert page.read_text() == block


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("path", DOC_PATHS, ids=[p.name for p in DOC_PATHS])
def test_every_relative_link_resolves(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{path.name}: links to nothing: {broken}"


HISTORY = re.compile(r"\(changed\)|\bwas [0-9][0-9,.]*|\bissue \d+\b|\bround (?:two|three|four|\d)\b|\bno longer\b")


@pytest.mark.parametrize("path", DOC_PATHS, ids=[p.name for p in DOC_PATHS])
def test_no_change_history_in_user_docs(path):
    hits = [line for line in path.read_text(encoding="utf-8").splitlines() if HISTORY.search(line)]
    assert not hits, f"{path.name} tells history (say what is, not what changed): {hits[:3]}"

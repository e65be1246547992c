"""Keep the command output shown in the docs equal to what the commands print.

A block of output in README.md or docs/*.md is written between two markers that name the command::

    <!-- output: kimi-deploy cost --stack b300 --tasks-per-month 1000 -->
    ```
    $ kimi-deploy cost --stack b300 --tasks-per-month 1000
    ...what it printed...
    ```
    <!-- end output -->

``--write`` runs every marked command and puts its output between the markers; ``--check`` runs
them and exits 1 naming each block whose text differs (``tests/test_docs.py`` runs it, so a
change that alters a documented output fails until the docs are refreshed with ``--write``).

How a command runs: ``bash -c COMMAND`` at the repository root, with the project's ``.venv/bin``
first on PATH (so ``kimi-deploy`` is this checkout's), ``COLUMNS=100`` (a width a docs page shows
without wrapping), ``TERM=dumb`` and ``NO_COLOR=1`` (no escape codes), no
``KIMI_DEPLOY_CONFIG_OVERLAY`` (the stacks as shipped), and stdout and stderr together as a
terminal shows them. A marker may set the exit status it expects (``exit=1``: a refused preflight,
``--strict`` on a blocked stack) and the width (``columns=80``)::

    <!-- output exit=1 columns=80: kimi-deploy plan --stack b300 --strict -->

Commands whose output depends on the clock take ``--now`` in the marker, so the docs are stable.

Exit status: 0 every block is current (``--check``) or was written (``--write``); 1 a block is
stale or a command exited with a status other than the one its marker expects; 2 usage errors.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a file: the project may not be installed here; scripts/ops/_cli.py's hook
    # first (a missing package, or the project itself, prints `make setup`, not a traceback)
    import os
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops", "_cli.py"), run_name="_cli")

from scripts.ops._cli import EXIT_CHECK_FAILED, EXIT_OK, CliParser, UsageError, prog_name, run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_COLUMNS = 100
# A documented command must finish within this (a plan takes seconds; a hung command fails the check).
COMMAND_TIMEOUT_SECONDS = 300

_OPEN = re.compile(r"^<!-- output(?P<opts>(?: [a-z]+=\d+)*): (?P<command>.+?) -->\n", re.M)
_CLOSE = "<!-- end output -->"


@dataclass(frozen=True)
class Block:
    """One marked block: its file, the command, the exit status and width it runs with, and the
    character span of the text between the markers (the fenced output)."""

    path: Path
    command: str
    exit_status: int
    columns: int
    start: int
    end: int
    line: int


def doc_files(root: Path = REPO_ROOT) -> list[Path]:
    """README.md and every Markdown file under docs/, sorted."""
    return [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]


def blocks_in(path: Path, text: str) -> Iterator[Block]:
    """The marked blocks of ``text`` (the content of ``path``).

    Raises:
        UsageError: a marker without its end, or an option other than exit= and columns=.
    """
    for match in _OPEN.finditer(text):
        opts = dict(part.split("=", 1) for part in match.group("opts").split())
        unknown = set(opts) - {"exit", "columns"}
        line = text.count("\n", 0, match.start()) + 1
        if unknown:
            raise UsageError(f"{path.name}:{line}: unknown output option {sorted(unknown)[0]} (allowed: exit, columns)")
        end = text.find(_CLOSE, match.end())
        if end < 0:
            raise UsageError(f"{path.name}:{line}: '<!-- output: ... -->' has no '{_CLOSE}'")
        yield Block(path, match.group("command"), int(opts.get("exit", 0)), int(opts.get("columns", DEFAULT_COLUMNS)),
                    match.end(), end, line)


# bash's line for a command it cannot find (exit 127), which a pipeline's last command hides.
_NOT_FOUND = re.compile(r"^bash: (?:line \d+: )?\S+: command not found$", re.M)


def run_command(block: Block, root: Path = REPO_ROOT) -> tuple[int, str]:
    """``(exit status, stdout+stderr)`` of the block's command, run as the module docstring says."""
    env = {k: v for k, v in os.environ.items() if k not in ("KIMI_DEPLOY_CONFIG_OVERLAY", "MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    env.update(COLUMNS=str(block.columns), TERM="dumb", NO_COLOR="1",
               PATH=os.pathsep.join([str(root / ".venv" / "bin"), env.get("PATH", "")]))
    proc = subprocess.run(["bash", "-c", block.command], cwd=root, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT_SECONDS)
    return proc.returncode, proc.stdout


def rendered(block: Block, output: str) -> str:
    """The text between the markers: a fence holding ``$ command`` and the output."""
    body = output if output.endswith("\n") or not output else output + "\n"
    return f"```\n$ {block.command}\n{body}```\n"


def refresh(paths: Sequence[Path], *, write: bool, root: Path = REPO_ROOT) -> list[str]:
    """Run every block of ``paths``; write the new text when ``write``. Returns one problem line
    per stale block or unexpected exit status (empty: all current)."""
    problems: list[str] = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        pieces: list[str] = []
        pos = 0
        for block in blocks_in(path, text):
            status, output = run_command(block, root)
            where = f"{path.relative_to(root) if path.is_relative_to(root) else path}:{block.line}"
            if status != block.exit_status:
                problems.append(f"{where}: `{block.command}` exited {status}, the marker expects {block.exit_status}: "
                                + (output.strip().splitlines() or ["(no output)"])[-1])
                continue
            missing = _NOT_FOUND.search(output)
            if missing:  # a pipeline's last command hides bash's 127: the output would document the error
                problems.append(f"{where}: `{block.command}`: {missing.group(0).strip()} (is .venv set up? make setup)")
                continue
            new = rendered(block, output)
            if text[block.start:block.end] != new:
                problems.append(f"{where}: the output of `{block.command}` changed"
                                + (": rewritten" if write else ": run scripts/dev/doc_blocks.py --write"))
                pieces += [text[pos:block.start], new]
                pos = block.end
        if write and pieces:
            path.write_text("".join(pieces) + text[pos:], encoding="utf-8")
    return problems


def build_parser() -> CliParser:
    parser = CliParser(prog=prog_name("scripts/dev/doc_blocks.py"), description=__doc__.split("\n\n", 1)[0],
                       epilog="Markers and how commands run: see the module docstring (scripts/dev/doc_blocks.py).")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 naming every block whose output changed")
    mode.add_argument("--write", action="store_true", help="run every command and write its output into the docs")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/**/*.md)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    paths = [p.resolve() for p in args.files] or doc_files()
    for path in paths:
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
    problems = refresh(paths, write=args.write)
    for line in problems:
        print(line, file=sys.stderr)
    if args.write:
        stale = [p for p in problems if "changed" in p]
        print(f"doc_blocks: {len(stale)} block(s) rewritten", file=sys.stderr)
        return EXIT_CHECK_FAILED if len(stale) != len(problems) else EXIT_OK
    return EXIT_CHECK_FAILED if problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(run_cli(main))

#!/usr/bin/env python3
"""Offline plan diff: what a change does to a stack, with no cloud account and no secret.

``scripts/ops/plan.py --stack S --diff-against GIT_REF`` calls ``main_diff``: the stack is rendered
at GIT_REF (in a temporary ``git worktree``, by that commit's own ``scripts/ops/plan.py`` in an
isolated interpreter, so only the old program renders the old plan) and in the working tree, both
with the same clock, and the two plan documents are compared. When the base cannot be rendered
(no scripts/ops/plan.py there, or old code that fails on the stack) the whole new plan is shown as
added under a banner ``base could not be rendered at REF: <reason>`` (JSON ``base_error``):

- resources keyed by (type, name): added, removed, changed with each changed input as a dotted
  path (``rootBlockDevice.volumeSize``, ``spec.template.spec.containers[0].image``) and its old
  and new value;
- a change that forces the provider to replace the resource (delete and create: data on it is
  lost, a GPU node is gone for the load time) is marked from ``REPLACE_ON_CHANGE``; a change
  that updates in place but disrupts (stop/start of an instance wipes its NVMe; node groups
  recycle their nodes) is marked from ``DISRUPTIVE_ON_CHANGE``;
- the serving side: vLLM image, each role's flags and environment, sizing, cost, expiry,
  outputs and warnings.

``render_markdown`` makes a pull-request comment (summary line, a table per change kind,
collapsible details, ⚠ on replacements). Inputs in plan documents are already masked
(``[secret]``); values that look like credentials are redacted again here as a second fence.

The parts live in ``scripts/ops/diff/``: ``rules`` (the replace and disrupt tables, a source per
row), ``engine`` (``diff_documents``), ``render`` (Markdown, table, redaction) and ``worktree``
(rendering a stack at a git ref). This file is the command line and re-exports their public names.

Run directly: ``python scripts/ops/plan_diff.py --stack b300 --against origin/main``
(``kimi-deploy diff`` is the same command).
Exit codes: 0 ok (with or without changes, also when the base could not be rendered); 1 the new
plan has a secret leak; 2 usage, git or config error (or the working tree's plan fails).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from scripts.ops._cli import (  # standard library only
    CliParser,
    UsageError,
    check_output_path,
    print_overlay_notice,
    prog_name,
)
from scripts.ops.diff.engine import IGNORED_DOC_KEYS, diff_documents, diff_values, flatten, has_changes
from scripts.ops.diff.render import (
    MARKDOWN_LIMIT_CHARS,
    VALUE_CHARS,
    fmt_pair,
    redact,
    redact_tree,
    render_markdown,
    render_table,
    value_pair,
)
from scripts.ops.diff.rules import DISRUPTIVE_ON_CHANGE, IN_PLACE, REPLACE_ON_CHANGE, FieldRule
from scripts.ops.diff.worktree import (
    REPO_ROOT,
    PlanDiffError,
    RenderError,
    all_stacks,
    diff_against,
    render_at_ref,
    render_tree,
)

__all__ = [
    "DISRUPTIVE_ON_CHANGE",
    "FORMATS",
    "IGNORED_DOC_KEYS",
    "IN_PLACE",
    "MARKDOWN_LIMIT_CHARS",
    "REPLACE_ON_CHANGE",
    "REPO_ROOT",
    "VALUE_CHARS",
    "FieldRule",
    "PlanDiffError",
    "RenderError",
    "diff_against",
    "diff_documents",
    "diff_values",
    "flatten",
    "fmt_pair",
    "has_changes",
    "main",
    "main_diff",
    "make_parser",
    "redact",
    "redact_tree",
    "render_at_ref",
    "render_markdown",
    "render_table",
    "render_tree",
    "value_pair",
]

FORMATS = ("markdown", "json", "table")


def main_diff(
    stack: str,
    ref: str,
    *,
    fmt: str = "markdown",
    now: datetime | None = None,
    output: str | None = None,
    repo_root: Path = REPO_ROOT,
) -> int:
    """What ``scripts/ops/plan.py --diff-against REF`` runs. Returns the exit code (0, 1 leak, 2 error)."""
    print_overlay_notice(f"over the working tree's stack file only (the base at {ref} is read as committed)")
    try:
        diff = diff_against(stack, ref, repo_root, now)
    except PlanDiffError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if fmt == "table":
        render_table(diff)
        text = None
    elif fmt == "json":
        text = json.dumps(redact_tree(diff), indent=2) + "\n"
    else:
        text = render_markdown(diff, stack, ref)
    if text is not None:
        if output:
            Path(output).write_text(text)
        else:
            sys.stdout.write(text)
    return 1 if diff["secret_leaks"] else 0


def make_parser() -> argparse.ArgumentParser:
    """The command line of ``plan_diff.py`` (one-line usage errors, exit 2: ``CliParser``)."""
    parser = CliParser(
        prog=prog_name("scripts/ops/plan_diff.py"),
        description="Offline plan diff of kimi-deploy stacks between a git ref and the working tree "
        "(no cloud account, no Pulumi CLI, no secret). Same as `scripts/ops/plan.py --diff-against`.",
    )
    parser.add_argument(
        "--stack", action="append", help="stack name (repeatable; default: every stack in stacks/ at either side)"
    )
    parser.add_argument(
        "--against", required=True, metavar="GIT_REF", help="the base to compare with, e.g. origin/main or a commit"
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="markdown",
        help="markdown for pull-request comments (default), json for machines, table for people",
    )
    parser.add_argument(
        "--now", help="clock for both renders, ISO 8601 (default: now); fixes trial expiries so they do not show as changes"
    )
    parser.add_argument("--output", metavar="FILE", help="write to FILE instead of standard output")
    parser.add_argument("--header", default="", help="markdown only: a first line for the comment (e.g. a title)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``plan_diff.py`` / ``kimi-deploy diff``: one diff per stack. Returns the exit code (0, 1 leak, 2 error)."""
    args = make_parser().parse_args(argv)
    if args.header and args.format != "markdown":
        print(f"error: --header is read only with --format markdown (a comment's first line); --format {args.format} "
              "has no header: leave it out", file=sys.stderr)
        return 2
    if args.output is not None:
        try:  # never a stack file, Pulumi.yaml or a file holding secure: values
            check_output_path("--output", args.output)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    try:
        now = None
        if args.now is not None:  # an empty --now is refused, not read as "now"
            from components.core.config import parse_clock
            from components.core.errors import ConfigError

            try:
                now = parse_clock(args.now, "--now")
            except ConfigError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
        now = now or datetime.now(UTC).replace(microsecond=0)
        print_overlay_notice(f"over the working tree's stack files only (the base at {args.against} is read as committed)")
        stacks = args.stack or all_stacks(REPO_ROOT, args.against)
        diffs = [diff_against(s, args.against, REPO_ROOT, now) for s in stacks]
    except PlanDiffError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.format == "table":
        for d in diffs:
            render_table(d)
        text = None
    elif args.format == "json":
        text = json.dumps(redact_tree(diffs if len(diffs) != 1 else diffs[0]), indent=2) + "\n"
    else:
        parts = [args.header + "\n"] if args.header else []
        parts += [render_markdown(d, d["stack"], args.against) for d in diffs]
        text = "\n".join(parts)
    if text is not None:
        if args.output:
            Path(args.output).write_text(text)
        else:
            sys.stdout.write(text)
    return 1 if any(d["secret_leaks"] for d in diffs) else 0


if __name__ == "__main__":
    sys.exit(main())

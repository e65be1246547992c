"""``kimi-deploy``: one command with a subcommand per operator script.

    kimi-deploy plan --stack b300              # scripts/ops/plan.py
    kimi-deploy diff --against origin/main     # scripts/ops/plan_diff.py
    kimi-deploy preflight --stack b300         # scripts/ops/preflight.py
    kimi-deploy validate --base-url URL ...    # scripts/ops/validate.py
    kimi-deploy cost --stack b300              # scripts/ops/cost.py
    kimi-deploy measure --log vllm.log         # scripts/ops/measure.py
    kimi-deploy sweep --region us-east-1       # scripts/ops/sweep.py
    kimi-deploy sync --source S --dest D       # scripts/node/weight_sync/ (package)
    kimi-deploy bench                          # scripts/dev/bench_sync.py
    kimi-deploy engine verify --image IMAGE    # scripts/ops/engine_verify.py
    kimi-deploy iam-policy --stack b300        # scripts/ops/deploy_policy.py
    kimi-deploy vllm-argv < request.json       # scripts/ops/vllm_parser.py
    kimi-deploy config explain vllm.port       # scripts/ops/config_explain.py

Installed as a console script by ``pip install -e .`` (``make setup``; pyproject.toml
``[project.scripts]``); ``python -m scripts.cli`` is the same command. It sits above what it dispatches: every
operator program (``scripts/ops/``) with a ``main(argv)`` is a subcommand (tests/test_layout.py), and
nothing under ``components/`` or ``scripts/`` imports this module. Each subcommand
imports its script module only when chosen and calls the script's own ``main(argv)`` with the
remaining arguments, so ``kimi-deploy plan --help`` is plan.py's help and exit codes are the
script's: 0 ok, 1 a check failed, 2 usage or config error (the project convention, scripts/ops/_cli.py). The programs
stay runnable directly (``python scripts/ops/plan.py``) once the package is installed.

Only the standard library is imported here: ``kimi-deploy --help`` is instant.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

PROG = "kimi-deploy"


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: ``module`` (importable, has ``main(argv) -> int``) and a one-line ``summary``.

    ``hard_exit``: leave with ``os._exit`` after flushing, as the script's own ``__main__`` does
    (plan.py: Pulumi's mock monitor leaves threads whose teardown prints noise at exit).
    """

    module: str
    summary: str
    hard_exit: bool = False


SUBCOMMANDS: dict[str, Subcommand] = {
    "plan": Subcommand(
        "scripts.ops.plan", "offline plan of a stack: resources, vLLM command per node, sizing, cost", hard_exit=True
    ),
    "diff": Subcommand(
        "scripts.ops.plan_diff", "offline plan diff against a git ref (every stack or --stack), for pull requests"
    ),
    "preflight": Subcommand(
        "scripts.ops.preflight", "before `pulumi up`: offered in the AZ, quota, capacity reservation, mirror, cluster"
    ),
    "validate": Subcommand(
        "scripts.ops.validate", "after `pulumi up`: tool calls, reasoning round trip, long context, throughput"
    ),
    "cost": Subcommand("scripts.ops.cost", "self-hosting vs the API price for a monthly volume"),
    "measure": Subcommand(
        "scripts.ops.measure", "read a running server's KV-cache tokens, engine start and copy rate as the config keys to set"
    ),
    "sweep": Subcommand("scripts.ops.sweep", "find (and with --destroy end) expired trial stacks in a region"),
    "sync": Subcommand("scripts.node.weight_sync", "copy and verify the weights: hub -> S3 mirror -> node (what the nodes run)"),
    "bench": Subcommand("scripts.dev.bench_sync", "weight-sync benchmark beside s5cmd and cp (figures, not a test)"),
    "engine": Subcommand(
        "scripts.ops.engine_verify", "engine verify --image IMAGE: prove a vLLM build serves the model before a GPU pulls it"
    ),
    "iam-policy": Subcommand(
        "scripts.ops.deploy_policy", "IAM policy the deploying identity needs for a stack (from its resource types)"
    ),
    "config": Subcommand(
        "scripts.ops.config_explain", "config explain KEY: a key's type, default, allowed values, stacks' values, what "
        "a change forces"
    ),
    "vllm-argv": Subcommand(
        "scripts.ops.vllm_parser", "check `vllm serve` argvs (JSON on stdin) with the pinned vLLM's own code (.venv-vllm)"
    ),
}


def version() -> str:
    """The installed distribution's version (pyproject.toml ``version``), or ``unknown`` in a
    checkout that was never installed (``make setup`` installs it)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("kimi-deploy")
    except PackageNotFoundError:
        return "unknown (not installed: make setup)"


def usage() -> str:
    """The top-level help text: every subcommand with its summary."""
    width = max(len(name) for name in SUBCOMMANDS)
    lines = [
        f"usage: {PROG} <command> [options]",
        "",
        "Self-host Kimi K3.1 Pro behind vLLM: plan, check, validate, cost and clean up deployments.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {sub.summary}" for name, sub in SUBCOMMANDS.items()),
        "",
        f"`{PROG} <command> --help` explains a command's options; `{PROG} --version` prints the version.",
        "exit codes: 0 ok, 1 a check failed, 2 usage or config error.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv`` (default ``sys.argv[1:]``) to a subcommand's ``main``; return its exit code.

    No command or ``-h``/``--help``: the usage on stdout, exit 0. An unknown command: one line on
    stderr, exit 2. The subcommand's parser sees ``kimi-deploy <command>`` as its program name.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    if args[0] == "--version":
        print(f"{PROG} {version()}")
        return 0
    name, rest = args[0], args[1:]
    sub = SUBCOMMANDS.get(name)
    if sub is None:
        print(f"error: {PROG}: unknown command {name!r} (allowed: {', '.join(SUBCOMMANDS)}; see --help)", file=sys.stderr)
        return 2
    module = importlib.import_module(sub.module)
    from scripts.ops._cli import run_cli

    # argparse's default prog is basename(sys.argv[0]): make the subcommand's help read
    # "usage: kimi-deploy plan ..." rather than "usage: kimi-deploy ...".
    saved, sys.argv = sys.argv, [f"{PROG} {name}", *rest]
    try:
        return run_cli(module.main, rest)
    finally:
        sys.argv = saved


def console_main() -> None:  # pragma: no cover - exercised through the installed command
    """The console script: run ``main`` and exit with its code (``hard_exit`` as the script does)."""
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if name in SUBCOMMANDS and SUBCOMMANDS[name].hard_exit:
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console_main()

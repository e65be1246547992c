"""``kimi-deploy config explain [KEY]``: one config key in a terminal, from the same source as the
configuration reference (docs/configuration.md, ``scripts/dev/config_reference.py``: the typed
model in ``components/core/config/raw.py``, the checks' rules, the platform table, the stack files
and the stored derivation of what a change forces).

    kimi-deploy config explain storage.fsx.throughputPerTib   # type, default, allowed, stacks, forces, example
    kimi-deploy config explain vllm                            # the keys of a section
    kimi-deploy config explain                                 # every key by section

Offline (reads files only). Exit codes: 0 printed; 2 usage error or a name that is no key or
section (one line with the nearest key).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

if not __package__:  # run as a file: scripts/ops/_cli.py's hook first (a missing package prints `make setup`)
    import os
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cli.py"), run_name="_cli")

from scripts.ops._cli import EXIT_OK, CliParser, prog_name, run_cli, terminal_width


def make_parser() -> CliParser:
    """The command line: ``explain [KEY]`` (one-line usage errors, exit 2)."""
    parser = CliParser(
        prog=prog_name("scripts/ops/config_explain.py"),
        description="Explain config keys: type, default, allowed values, the platforms and settings that read it, the "
        "value each stack in stacks/ has, what a change forces, where it is declared and checked, and an example "
        "`pulumi config set` line (the blocks of docs/configuration.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="explain", required=True, parser_class=CliParser)
    explain = actions.add_parser("explain", help="explain KEY (e.g. vllm.port, kimi-deploy:storage.kind, aws:region, "
                                 "hfToken), the keys of a section (vllm), or list every key")
    explain.add_argument("key", nargs="?", metavar="KEY", help="a config key or section; none: every key by section")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print what ``config explain [KEY]`` asks for. Returns the exit code.

    Raises:
        UsageError: KEY names no key or section (``run_cli`` prints it as one line, exit 2).
    """
    args = make_parser().parse_args(argv)
    from scripts.dev.config_reference import explain

    width = max(60, min(terminal_width(default=100), 120))
    sys.stdout.write(explain(args.key, width=width))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_cli(main))

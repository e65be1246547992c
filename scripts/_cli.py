"""Shared command-line helpers: exit codes, one-line errors, check statuses, rich tables vs --json.

STYLE.md rule 10: exit 0 ok / 1 a check failed / 2 usage or config error, and no traceback for
a user's mistake. A script's ``main(argv) -> int`` raises ``UsageError`` (or the core's
``ConfigError``) for mistakes; ``run_cli(main)`` turns them into one line on stderr and exit 2::

    if __name__ == "__main__":
        sys.exit(run_cli(main))

Only the standard library is imported at module level; rich is imported when a table is drawn.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Iterable, NoReturn, Sequence, TextIO

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2

# Check statuses, worst last. Only FAIL makes a run exit 1.
PASS, SKIP, UNKNOWN, WARN, FAIL = "pass", "skip", "unknown", "warn", "fail"
STATUSES: tuple[str, ...] = (PASS, SKIP, UNKNOWN, WARN, FAIL)
_STATUS_STYLES = {PASS: "green", SKIP: "dim", UNKNOWN: "cyan", WARN: "yellow", FAIL: "bold red"}


class UsageError(Exception):
    """The command line is wrong (exit 2). ``str(err)`` is one line naming the flag."""


class CliParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` for every script here (STYLE.md rule 10).

    - Flags must be spelled out: ``allow_abbrev=False``, so ``--api-key sk-x`` is rejected
      instead of being taken as ``--api-key-env``.
    - A usage error is ONE line on stderr, ``error: <message> (see --help)``, and exit 2 (no
      multi-line usage block). Values of unrecognized arguments are left out of the message:
      they may be secrets typed as the wrong flag (only the flag names are echoed).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"error: {one_line(usage_message(message))} (see --help)\n")


def usage_message(message: str) -> str:
    """argparse's ``message`` with the values of unrecognized arguments dropped (flag names kept)."""
    head = "unrecognized arguments: "
    if not message.startswith(head):
        return message
    tokens = message[len(head):].split()
    flags = [token.split("=", 1)[0] for token in tokens if token.startswith("-")]
    hidden = sum(1 for token in tokens if not token.startswith("-") or "=" in token)
    shown = " ".join(flags) if flags else "(no flag)"
    return f"unrecognized arguments: {shown}" + (f" ({hidden} value(s) not shown)" if hidden else "")


def one_line(text: object) -> str:
    """``text`` as a single line (newlines folded), for error messages and table cells."""
    return " ".join(str(text).split())


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main(argv)`` and map user mistakes to exit 2 with one line on stderr.

    ``UsageError`` and the core's ``ConfigError`` print ``error: <message>``; Ctrl-C exits 130;
    ``SystemExit`` from argparse (``--help``, bad flags) passes its code through. Any other
    exception is a bug and keeps its traceback.
    """
    from components.spec.config import ConfigError

    try:
        return int(main(argv) or 0)
    except (UsageError, ConfigError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


def exit_code(statuses: Iterable[str]) -> int:
    """``EXIT_CHECK_FAILED`` when any status is ``fail``, else ``EXIT_OK``."""
    return EXIT_CHECK_FAILED if any(s == FAIL for s in statuses) else EXIT_OK


def print_json(data: Any, file: TextIO | None = None) -> None:
    """``data`` as indented JSON on stdout (datetimes and other objects via ``str``)."""
    print(json.dumps(data, indent=2, default=str), file=file or sys.stdout)


def styled_status(status: str) -> str:
    """Rich markup for a check status (``[green]pass[/]``)."""
    return f"[{_STATUS_STYLES.get(status, 'white')}]{status}[/]"


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    status_column: int | None = None,
    caption: str | None = None,
    file: TextIO | None = None,
) -> None:
    """Draw a rich table for people. ``status_column`` (index) gets the status colours."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for name in columns:
        table.add_column(name, overflow="fold")
    for row in rows:
        cells = ["" if cell is None else str(cell) for cell in row]
        if status_column is not None:
            cells[status_column] = styled_status(cells[status_column])
        table.add_row(*cells)
    Console(file=file or sys.stdout, width=_width()).print(table)


def _width() -> int | None:
    """Terminal width, or 120 columns when stdout is not a terminal (logs, pipes)."""
    return None if sys.stdout.isatty() else 120

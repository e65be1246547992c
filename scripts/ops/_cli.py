"""Shared command-line helpers: exit codes, one-line errors, check statuses, rich tables vs --json.

The project's convention: exit 0 ok / 1 a check failed / 2 usage or config error, and no traceback for
a user's mistake. A script's ``main(argv) -> int`` raises ``UsageError`` (or the core's
``ConfigError``) for mistakes; ``run_cli(main)`` turns them into one line on stderr and exit 2::

    if __name__ == "__main__":
        sys.exit(run_cli(main))

Only the standard library is imported at module level; rich is imported when a table is drawn.
Importing this module first (every script does, before any third-party import) installs
``missing_module_hook``: run without the project's virtualenv, a script prints how to set it up
(``make setup``) and exits 2 instead of a ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, TextIO

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2

# Check statuses, worst last. Only FAIL makes a run exit 1.
PASS, SKIP, UNKNOWN, WARN, FAIL = "pass", "skip", "unknown", "warn", "fail"
STATUSES: tuple[str, ...] = (PASS, SKIP, UNKNOWN, WARN, FAIL)
_STATUS_STYLES = {PASS: "green", SKIP: "dim", UNKNOWN: "cyan", WARN: "yellow", FAIL: "bold red"}


# The program name the dispatcher (scripts/cli.py) puts in sys.argv[0]: "kimi-deploy <command>".
DISPATCHED_PREFIX = "kimi-deploy "


def prog_name(script: str) -> str:
    """The ``prog`` of a script's parser: ``kimi-deploy <command>`` when run through the
    ``kimi-deploy`` command (``scripts/cli.py`` sets ``sys.argv[0]``), else ``script`` (e.g.
    ``scripts/ops/plan.py``), so ``--help`` and usage errors name the command the user typed."""
    first = sys.argv[0] if sys.argv else ""
    return first if first.startswith(DISPATCHED_PREFIX) else script


class UsageError(Exception):
    """The command line is wrong (exit 2). ``str(err)`` is one line naming the flag."""


class _StoreOnce(argparse._StoreAction):
    """argparse's ``store`` that refuses a second value for the same option: by default the last one
    wins in silence (``plan --stack A --stack B`` planned B alone). Repeatable options say so with
    ``action="append"``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        seen = namespace.__dict__.setdefault("_given_once", {})
        if self.dest in seen and option_string is not None:
            parser.error(f"{option_string} is given twice ({seen[self.dest]!r}, then {values!r}): give it once")
        seen[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class CliParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` for every script here.

    - Flags must be spelled out: ``allow_abbrev=False``, so ``--api-key sk-x`` is rejected
      instead of being taken as ``--api-key-env``.
    - An option that takes one value refuses a second (``--stack A --stack B``; ``_StoreOnce``);
      repeatable options are declared ``action="append"``.
    - A usage error is ONE line on stderr, ``error: <message> (see --help)``, and exit 2 (no
      multi-line usage block). Values of unrecognized arguments are left out of the message:
      they may be secrets typed as the wrong flag (only the flag names are echoed).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, rest = super().parse_known_args(args, namespace)
        parsed.__dict__.pop("_given_once", None)  # bookkeeping of _StoreOnce, not an option
        return parsed, rest

    def error(self, message: str) -> NoReturn:
        options = [o for o in self._option_string_actions if o.startswith("--")]
        self.exit(EXIT_USAGE, f"error: {one_line(usage_message(message, options))} (see --help)\n")


def usage_message(message: str, options: Sequence[str] = ()) -> str:
    """argparse's ``message`` with the values of unrecognized arguments dropped (flag names kept),
    and for a misspelt flag the nearest of ``options`` (``--stak`` -> did you mean --stack?)."""
    import difflib

    head = "unrecognized arguments: "
    if not message.startswith(head):
        return message
    tokens = message[len(head):].split()
    flags = [token.split("=", 1)[0] for token in tokens if token.startswith("-")]
    hidden = sum(1 for token in tokens if not token.startswith("-") or "=" in token)
    if not flags:
        return (f"unrecognized arguments: {hidden} value(s) with no flag before them (not shown: values may be "
                "secrets); every argument of this command is a flag, e.g. --stack NAME" if "--stack" in options
                else f"unrecognized arguments: {hidden} value(s) with no flag before them (not shown: values may be secrets)")
    hints = [f"{flag}: did you mean {near[0]}?" for flag in flags
             if (near := difflib.get_close_matches(flag, options, n=1, cutoff=0.6))]
    return (f"unrecognized arguments: {' '.join(flags)}" + (f" ({hidden} value(s) not shown)" if hidden else "")
            + (f"; {'; '.join(hints)}" if hints else ""))


def one_line(text: object) -> str:
    """``text`` as a single line (newlines folded), for error messages and table cells."""
    return " ".join(str(text).split())


# errno values of a failed write to a file or terminal (errno(3)): reported in one line, not a traceback.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main(argv)`` and map user mistakes to exit 2 with one line on stderr.

    ``UsageError`` and the core's ``ConfigError`` print ``error: <message>``; Ctrl-C exits 130;
    ``SystemExit`` from argparse (``--help``, bad flags) passes its code through. An output that
    cannot be written (a full disk, ``/dev/full``) is one line and exit 2, a usage error, never
    exit 1 (a check failed). A reader that
    stops reading (``kimi-deploy plan | head``) ends the run quietly with exit 0, as ``git log |
    head`` does: standard output then points at /dev/null so no later flush fails. Any other
    exception is a bug and keeps its traceback.
    """
    from components.core.errors import ConfigError

    _rich_broken_pipe_raises()
    try:
        return int(main(argv) or 0)
    except (UsageError, ConfigError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as err:
        if not _is_third_party(err):
            raise
        print(missing_module_message(err), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_OK
    except OSError as err:
        # The output could not be written (a full disk, a quota, /dev/full, a read-only file): one line,
        # exit 2 like any other unusable --output (exit 1 means a check failed, e.g. a secret in the plan).
        if err.errno not in _WRITE_ERRNOS:
            raise
        _stdout_to_devnull()
        print(f"error: cannot write the output: {err.strerror or err}", file=sys.stderr)
        return EXIT_USAGE


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null: what is still buffered for a closed pipe is dropped at
    the next flush instead of raising again (the Python docs' advice for SIGPIPE, "Note on SIGPIPE")."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test's capture): nothing to redirect
        pass


def _rich_broken_pipe_raises() -> None:
    """rich's ``Console.on_broken_pipe`` ends the process with ``SystemExit(1)``; make it raise
    ``BrokenPipeError`` so ``run_cli`` treats a closed pipe alike for rich and ``print`` (exit 0)."""
    try:
        from rich.console import Console
    except ModuleNotFoundError:  # rich is a runtime requirement; without it no table is drawn
        return

    def on_broken_pipe(self: Any) -> None:
        self.quiet = True
        raise BrokenPipeError

    Console.on_broken_pipe = on_broken_pipe  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------------------
# --output: never a file the command reads, never a file holding secrets

# The project's root (scripts/ops/_cli.py -> the checkout): its stack files and Pulumi.yaml are what
# the commands with --output read.
_REPO_ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A Pulumi secret in a YAML file: a ``secure:`` key with a value (Pulumi stack settings files store
# each secret as ``key: {secure: <ciphertext>}``, written ``secure: v1:...`` on its own line).
_SECURE_VALUE = re.compile(rb"""(?m)(?:^|[\s{,])["']?secure["']?:[ \t]*[^\s}]""")
# How much of an existing file is read to look for secrets before it is overwritten.
_SECRET_SCAN_BYTES = 4 * 1024 * 1024


# What the commands with --output read besides the stacks: the program they run (its code, its
# packaging, its git metadata and virtualenvs: `plan --output __main__.py` would replace the program).
_PROJECT_DIRS = ("components", "scripts", "policy", "tests", "docs", ".ci", ".github", ".git", ".venv", ".venv-vllm",
                 ".venv-vllm-engine", ".venv-checkov")
_PROJECT_FILES = ("__main__.py", "pyproject.toml", "Makefile", "README.md", ".gitignore", "requirements.txt",
                  "requirements-dev.txt", "requirements-vllm.txt", "requirements-vllm-engine.txt",
                  "requirements-checkov.txt")


def command_inputs(repo_root: str | None = None) -> tuple[str, ...]:
    """Real paths of what the commands with ``--output`` (plan, diff) read: the project file
    ``Pulumi.yaml`` and the stack directory ``stacks/`` (every stack file, and any file a new one
    would be: Pulumi reads ``stacks/Pulumi.<name>.yaml`` by name), and the program they run: its
    code and docs directories, packaging files, git metadata and virtualenvs."""
    root = os.path.realpath(repo_root or _REPO_ROOT_DIR)
    return tuple(os.path.join(root, name) for name in ("Pulumi.yaml", "stacks", *_PROJECT_DIRS, *_PROJECT_FILES))


def check_output_path(flag: str, path: str, inputs: Iterable[str] | None = None) -> None:
    """Refuse an output file the command would destroy something by writing: one rule for every
    command with ``--output``.

    ``path`` is resolved as the OS will open it (``os.path.realpath``: symbolic links, ``..``,
    doubled slashes), then refused when it is, or lies in, one of ``inputs`` (default
    ``command_inputs()``: the stack files and ``Pulumi.yaml``), when it is a directory, or when it
    is an existing file holding a Pulumi secret (a ``secure:`` value, e.g. a stack file copied
    elsewhere): writing the plan there would replace the ciphertexts for good.

    Raises:
        UsageError: one line naming ``flag``, the path and why it is refused.
    """
    real = os.path.realpath(path)
    for item in (command_inputs() if inputs is None else inputs):
        item_real = os.path.realpath(item)
        if real == item_real or real.startswith(item_real.rstrip("/") + "/"):
            raise UsageError(
                f"{flag}: {path!r} is {'' if real == item_real else 'in '}{_shown(item_real)}, "
                f"{_what_input(item_real)}: write the output elsewhere, e.g. --output plan.txt")
    if os.path.isdir(real):
        raise UsageError(f"{flag}: {path!r} is a directory; give a file name")
    if os.path.isfile(real):
        try:
            with open(real, "rb") as existing:
                head = existing.read(_SECRET_SCAN_BYTES)
        except OSError:
            return  # unreadable: opening it for writing reports the error in one line
        if _SECURE_VALUE.search(head):
            raise UsageError(
                f"{flag}: {path!r} holds secure: values (Pulumi secrets): writing the output there would destroy "
                "them; write it elsewhere")


# What each input is, for the refusal (a new-user trial: README.md was called something the command reads).
_CONFIG_INPUTS = ("Pulumi.yaml", "stacks")
_PROGRAM_INPUTS = ("components", "scripts", "policy", "__main__.py", "pyproject.toml", ".venv", ".venv-vllm",
                   ".venv-vllm-engine", ".venv-checkov", "requirements.txt", "requirements-dev.txt",
                   "requirements-vllm.txt", "requirements-vllm-engine.txt", "requirements-checkov.txt")


def _what_input(real: str) -> str:
    """Why the output may not replace ``real`` (a real path from ``command_inputs``), as a clause."""
    name = os.path.basename(real.rstrip("/"))
    if name in _CONFIG_INPUTS:
        return "which this command reads (the stack's config, its secure: values included)"
    if name in _PROGRAM_INPUTS:
        return "part of the program this command runs"
    if name == ".git":
        return "the checkout's git metadata"
    return "a file of the project's checkout (its docs, tests or build files), not a place for output"


def _shown(real: str) -> str:
    """``real`` relative to the checkout when it lies there (``stacks``), else as it is."""
    root = os.path.realpath(_REPO_ROOT_DIR)
    return os.path.relpath(real, root) if real.startswith(root + "/") else real


def overlay_notice(where: str = "over every stack file", stack: str | None = None) -> str | None:
    """The line a command that reads stack config prints first while ``KIMI_DEPLOY_CONFIG_OVERLAY``
    is set: which keys it sets (with ``stack``, those it sets for that stack: keys scoped to other
    stacks are not named) and that `pulumi up` never reads it; None when unset, or when it is not
    valid JSON (the command then refuses it in one line of its own)."""
    from components.core.config import config_overlay
    from components.core.config.stack_file import CONFIG_OVERLAY_ENV, overlay_keys
    from components.core.errors import ConfigError

    try:
        extra = config_overlay()
    except ConfigError:
        return None
    if extra is None:
        return None
    keys = ", ".join(overlay_keys(extra, stack)) or (
        "nothing (an empty object)" if stack is None or not extra else "nothing for this stack (its keys name other stacks)")
    return (f"note: {CONFIG_OVERLAY_ENV} is active: {keys} set {where} (offline commands only; `pulumi up` reads "
            "the stack file alone)")


def print_overlay_notice(where: str = "over every stack file", *, stack: str | None = None,
                         file: TextIO | None = None) -> None:
    """``overlay_notice`` on standard error (``file``), when there is one; with ``stack``, said
    ``over stacks/Pulumi.<stack>.yaml`` and only when that file exists (a wrong ``--stack`` is
    the command's one-line error alone: nothing is read over it)."""
    if stack is not None:
        from components.core.config import STACKS_DIR

        if not (STACKS_DIR / f"Pulumi.{stack}.yaml").is_file():
            return
        where = f"over stacks/Pulumi.{stack}.yaml"
    notice = overlay_notice(where, stack)
    if notice:
        print(notice, file=file or sys.stderr, flush=True)


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
    Console(file=file or sys.stdout, width=terminal_width(file or sys.stdout)).print(table)


def terminal_width(stream: TextIO | None = None, default: int = 120) -> int:
    """Columns to lay text out in for ``stream`` (default standard output): ``COLUMNS`` when set (as
    rich and ``shutil.get_terminal_size`` read it), else the terminal's width when ``stream`` is one,
    else ``default`` (logs, pipes)."""
    import os

    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = stream or sys.stdout
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        pass
    return default


def print_note(text: str, *, label: str = "note", file: TextIO | None = None) -> None:
    """``label: text`` on ``file`` (default standard error), wrapped to its ``terminal_width`` with
    the continuation lines indented two spaces."""
    import textwrap

    stream = file or sys.stderr
    lines = textwrap.wrap(f"{label}: {one_line(text)}", width=max(40, terminal_width(stream)), subsequent_indent="  ",
                          break_long_words=False, break_on_hyphens=False)
    print("\n".join(lines), file=stream)


# ---------------------------------------------------------------------------------------------
# Verdicts: "ok" only when the checks ran


def status_counts(statuses: Iterable[str]) -> dict[str, int]:
    """How many checks ended in each status: ``{"pass": 3, "skip": 8, ...}`` (every status, 0s kept)."""
    counts = dict.fromkeys(STATUSES, 0)
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return counts


_COUNT_WORDS = {PASS: "passed", WARN: "warned", FAIL: "failed", UNKNOWN: "unknown", SKIP: "skipped"}


def counts_text(counts: dict[str, int]) -> str:
    """``"3 passed, 1 warned, 8 skipped"``: the non-zero counts, failures first."""
    order = (FAIL, PASS, WARN, UNKNOWN, SKIP)
    return ", ".join(f"{counts[s]} {_COUNT_WORDS[s]}" for s in order if counts.get(s)) or "no checks"


def verdict(counts: dict[str, int]) -> tuple[str, int]:
    """The one-line result of a run of checks and its exit code.

    - any ``fail``: ``"FAILED (1 failed, 3 passed, ...)"``, exit 1;
    - nothing passed, warned or failed (every check skipped or unknown): ``"NOTHING CHECKED
      (8 skipped, 3 unknown)"``, exit 2: there is no green light without a check that ran;
    - every check passed: ``"ok (11 passed)"``, exit 0; some warned (none failed, none left
      unchecked): ``"ok, with warnings to read (1 passed, 1 warned)"``, exit 0 (a bare "ok" read
      over a warning, e.g. a mirror that is not complete);
    - otherwise ``"nothing failed, but not everything was checked (3 passed, 8 skipped)"``, exit 0.
    """
    text = counts_text(counts)
    if counts.get(FAIL):
        return f"FAILED ({text})", EXIT_CHECK_FAILED
    if not (counts.get(PASS) or counts.get(WARN)):
        return f"NOTHING CHECKED ({text})", EXIT_USAGE
    if counts.get(UNKNOWN) or counts.get(SKIP):
        return f"nothing failed, but not everything was checked ({text})", EXIT_OK
    if counts.get(WARN):
        return f"ok, with warnings to read ({text})", EXIT_OK
    return f"ok ({text})", EXIT_OK


# ---------------------------------------------------------------------------------------------
# AWS sessions: one way for every script to read credentials and AWS_ENDPOINT_URL

# Credentials used when AWS_ENDPOINT_URL is a local endpoint (moto) and none are configured.
DUMMY_AWS_CREDENTIALS = ("testing", "testing")
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def local_aws_endpoint() -> str | None:
    """``AWS_ENDPOINT_URL`` when it points at this machine (localhost, 127.0.0.0/8, ::1), else None."""
    import os
    from urllib.parse import urlsplit

    url = os.environ.get("AWS_ENDPOINT_URL", "")
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return None
    return url if host in _LOCAL_HOSTS or host.startswith("127.") else None


def aws_session(notes: list[str] | None = None) -> Any:
    """A boto3 ``Session`` as every script here makes it (preflight, sweep).

    Endpoints are left to botocore, which reads ``AWS_ENDPOINT_URL`` and the per-service
    ``AWS_ENDPOINT_URL_<SERVICE>`` (and ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS``) itself, so no
    script passes ``endpoint_url`` (that would override the per-service variables). Source:
    https://docs.aws.amazon.com/sdkref/latest/guide/feature-ss-endpoints.html. Credentials come
    from boto3's usual chain; when there are none and ``AWS_ENDPOINT_URL`` is on this machine
    (a local moto), dummy credentials are used and a line is appended to ``notes``.
    """
    import boto3

    session = boto3.session.Session()
    endpoint = local_aws_endpoint()
    if endpoint and _aws_credentials(session) is None:
        session = boto3.session.Session(aws_access_key_id=DUMMY_AWS_CREDENTIALS[0],
                                        aws_secret_access_key=DUMMY_AWS_CREDENTIALS[1])
        if notes is not None:
            notes.append(f"no AWS credentials set: using dummy credentials for the local endpoint {endpoint}")
    return session


def _aws_credentials(session: Any) -> Any:
    try:
        return session.get_credentials()
    except Exception:  # noqa: BLE001 - a broken profile is reported as no credentials
        return None


# ---------------------------------------------------------------------------------------------
# Run without the virtualenv: say how to set it up

_OWN_PACKAGES = ("components", "scripts", "tests")
# Modules only the test and benchmark tools need (requirements-dev.txt): `make setup-dev`.
_DEV_MODULES = ("moto", "pytest", "hypothesis", "cfn_lint", "ruff")


def _is_third_party(err: ModuleNotFoundError) -> bool:
    top = (err.name or "").split(".")[0]
    return bool(top) and top not in _OWN_PACKAGES


def missing_module_message(err: ModuleNotFoundError) -> str:
    """One line for a script run without the project's virtualenv: which module is missing,
    for which interpreter, and the command that installs it (``make setup``, which creates
    ``.venv`` from requirements.txt; ``make setup-dev`` for the test tools)."""
    import os

    top = (err.name or "?").split(".")[0]
    target = "setup-dev" if top in _DEV_MODULES else "setup"
    script = os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0] else "scripts/ops/<script>.py"
    return (f"error: the Python module {top!r} is not installed for {sys.executable}: run `make {target}` once "
            f"(creates .venv from requirements{'-dev' if target == 'setup-dev' else ''}.txt; a minute or two the first "
            f"time), then `.venv/bin/python {script} ...` (or `source .venv/bin/activate` first)")


def missing_module_hook(exc_type: type, exc: BaseException, tb: Any) -> None:
    """``sys.excepthook``: a third-party ``ModuleNotFoundError`` reaching the top is one line
    (``missing_module_message``) and exit 2; anything else goes to the previous hook."""
    # A third-party package, or this project itself (``components``/``scripts`` resolve only once
    # `make setup` has installed it, editable, into .venv): either way the fix is `make setup`.
    # (A missing module *inside* this project, components.core.x, is a bug or a wrong checkout: traceback.)
    if isinstance(exc, ModuleNotFoundError) and exc.name and (_is_third_party(exc) or exc.name in _OWN_PACKAGES):
        import os

        print(missing_module_message(exc), file=sys.stderr)
        sys.stderr.flush()
        os._exit(EXIT_USAGE)
    _previous_hook(exc_type, exc, tb)


_previous_hook = sys.excepthook
if sys.excepthook is sys.__excepthook__:  # leave a debugger's or test runner's hook alone
    sys.excepthook = missing_module_hook


if __name__ == "__main__":  # a library, not a command; it still answers --help
    print(__doc__.strip() + "\n\nThis module is imported by the scripts in scripts/; run those (each answers --help).")
    sys.exit(EXIT_OK if sys.argv[1:] in ([], ["-h"], ["--help"]) else EXIT_USAGE)

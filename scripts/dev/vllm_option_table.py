#!/usr/bin/env python3
"""Record the `vllm serve` options of the pinned vLLM as a table the offline plan reads.

Run it with the python of the vLLM venv (``make vllm-parser`` makes ``.venv-vllm``); it imports
vLLM (CPU only, no network, no model) and builds the ``serve`` sub-parser exactly as
``vllm/entrypoints/cli/main.py`` does:

    .venv-vllm/bin/python scripts/dev/vllm_option_table.py            # the table, JSON on stdout
    .venv-vllm/bin/python scripts/dev/vllm_option_table.py --write    # rewrite the recorded table

The table (``components/core/data/vllm_serve_options.json``) holds one row per argparse action of
the parser: ``dest``, every ``options`` string (hidden spellings such as ``--no-enable-*``
included), ``action`` (argparse's class name), ``nargs``, ``type`` (the value parser's name;
``optional:int`` for vLLM's ``optional_type(int)``, which also takes ``""`` and ``"None"``),
``choices``, ``keys`` (the fields a JSON-object option's config dataclass takes; vLLM refuses
others) and ``bounds``: the ``ge``/``gt``/``le``/``lt`` constraints the option's config class
puts on its field (pydantic ``Field(ge=1)`` and the like; the argparse group of an option is named
after its config class). ``tests/test_vllm_contract.py`` runs this script and fails when its output
and the recorded table differ, so the table cannot go stale; ``components/core/vllm_options.py``
reads it (the core never imports vLLM).

Standard library and vLLM only: it runs in the vLLM venv, not in the project's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

TABLE_PATH = Path(__file__).resolve().parents[2] / "components" / "core" / "data" / "vllm_serve_options.json"

# As scripts/ops/vllm_argv_check.py: no device, no hub, no telemetry.
_FORCED_ENV = {
    "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "",
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
_BOUND_NAMES = ("ge", "gt", "le", "lt")


def _type_name(value_type: Any) -> str | None:
    """The value parser of an action by name; vLLM's wrappers (``optional_type``, ``parse_type``)
    by the name of what they wrap."""
    if value_type is None:
        return None
    name = getattr(value_type, "__name__", type(value_type).__name__)
    inner = None
    for cell in getattr(value_type, "__closure__", None) or ():
        with contextlib.suppress(ValueError):
            if callable(cell.cell_contents):
                inner = cell.cell_contents
    if name == "_optional_type" and inner is not None:
        return "optional:" + (_type_name(inner) or "?").removeprefix("parse:")
    if name == "_parse_type" and inner is not None:
        return "parse:" + (_type_name(inner) or "?")
    return name


def _json_keys(value_type: Any) -> list[str] | None:
    """The fields a JSON-object option takes: vLLM's ``parse_dataclass`` validates the value as its
    config dataclass (``TypeAdapter(cls).validate_json``, vllm/engine/arg_utils.py), which refuses
    any other key. None for other value parsers."""
    seen = 0
    while value_type is not None and seen < 4:
        seen += 1
        if getattr(value_type, "__name__", "") == "parse_dataclass":
            cls = (getattr(value_type, "__defaults__", None) or (None,))[0]
            fields = getattr(cls, "__pydantic_fields__", None)
            if fields is None and cls is not None:
                import dataclasses

                fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
            return sorted(fields) if fields is not None else None
        cells = [c.cell_contents for c in getattr(value_type, "__closure__", None) or () if callable(c.cell_contents)]
        value_type = cells[0] if cells else None
    return None


def _bounds(config_class: Any, dest: str) -> dict[str, Any]:
    fields = getattr(config_class, "__pydantic_fields__", None) or {}
    info = fields.get(dest)
    out: dict[str, Any] = {}
    for item in getattr(info, "metadata", None) or ():
        for bound in _BOUND_NAMES:
            value = getattr(item, bound, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[bound] = value
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(getattr(value, "value", value))


def option_table() -> dict[str, Any]:
    """The serve parser's options as rows (see the module docstring), with the vLLM version."""
    os.environ.update(_FORCED_ENV)
    import vllm
    import vllm.config as vllm_config
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand().subparser_init(top.add_subparsers(required=False, dest="subparser"))
    group_of: dict[int, str] = {}
    for group in serve._action_groups:
        for action in group._group_actions:
            group_of[id(action)] = group.title or ""
    # Every option string argparse resolves, the hidden ones too (EnableDisableAction registers
    # --no-enable-* in _option_string_actions only, vllm/utils/argparse_utils.py).
    strings: dict[int, list[str]] = {}
    for option, action in serve._option_string_actions.items():
        strings.setdefault(id(action), []).append(option)
    rows = []
    for action in serve._actions:
        group = group_of.get(id(action), "")
        config_class = getattr(vllm_config, group, None) if group.endswith("Config") else None
        nargs = action.nargs
        rows.append({
            "dest": action.dest,
            "options": list(action.option_strings) + sorted(set(strings.get(id(action), [])) - set(action.option_strings)),
            "action": type(action).__name__,
            "nargs": nargs if nargs is None or isinstance(nargs, (int, str)) else str(nargs),
            "type": _type_name(action.type),
            "choices": None if action.choices is None else [_jsonable(c) for c in action.choices],
            "bounds": _bounds(config_class, action.dest) if config_class is not None else {},
            "keys": _json_keys(action.type),
            "group": group,
        })
    return {
        "vllm_version": vllm.__version__,
        "source": "vllm serve sub-parser (vllm/entrypoints/cli/main.py, ServeSubcommand.subparser_init); bounds: "
                  "pydantic constraints of the config class each argparse group is named after (vllm/config/*.py)",
        "generated_by": "scripts/dev/vllm_option_table.py",
        "allow_abbrev": bool(serve.allow_abbrev),
        "actions": rows,
    }


def render(table: dict[str, Any]) -> str:
    """The table as it is recorded: indented JSON, one row per line, a final newline."""
    head = {k: v for k, v in table.items() if k != "actions"}
    lines = json.dumps(head, indent=1, sort_keys=True)[:-2] + ',\n "actions": [\n'
    lines += ",\n".join("  " + json.dumps(row, sort_keys=True) for row in table["actions"])
    return lines + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {TABLE_PATH.name} instead of printing")
    args = parser.parse_args(argv)
    # vLLM may print while importing: keep stdout for the table alone.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    text = render(option_table())
    if args.write:
        TABLE_PATH.parent.mkdir(parents=True, exist_ok=True)
        TABLE_PATH.write_text(text)
        print(f"wrote {TABLE_PATH} ({text.count(chr(10))} lines)", file=sys.stderr)
    else:
        out.write(text)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

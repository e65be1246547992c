"""The recorded corpus of config inputs and the exact outcome of each (tests/fixtures/config_errors.json).

``tests/test_config_parts.py`` replays every case through today's ``parse_spec`` / ``load_stack``
and compares the outcome with the recording: the first error message of a bad file (byte for
byte), or the warnings and blockers of a good one. So splitting ``components/core/config`` or
re-ordering its checks cannot change what a user reads without the fixture changing with it.

Where the cases come from (``python -m tests.config_corpus`` rewrites the fixture):

1. Harvested: the config tests run under a pytest plugin (this module) that records every
   ``parse_spec`` and ``load_stack`` call they make (``HARVEST_TESTS``); calls made under a
   test's monkeypatch (a patched target table, ...) are dropped by a clean replay.
2. Mutations: every field of ``RawConfig`` (by its camelCase key) set to values of the wrong
   type or out of range, and removed, in each stack of ``stacks/``; one case is kept per
   (stack, key, outcome), so every distinct message stays with the smallest input giving it.

A case is stored as a delta over a base: the ``kimi-deploy`` namespace of a stack file as it was
when recorded (``bases``), with whole top-level keys replaced (``set``) or removed (``unset``).
The bases are snapshotted in the fixture, so later edits of ``stacks/`` do not move the corpus.
A ``stack`` case is a whole stack file's config map through ``load_stack``; a ``file`` case is a
stack file that ``read_stack_config`` refused (its bytes, base64, and the
``KIMI_DEPLOY_CONFIG_OVERLAY`` it was read with): a file that is not UTF-8, not YAML, or an
overlay that cannot be set as ``pulumi config set --path`` would.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import sys
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import yaml

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "config_errors.json"
HARVEST_TESTS = (
    "tests/test_config.py",
    "tests/test_aws_config.py",
    "tests/test_aws_cloud_rules.py",
    "tests/test_config_reader.py",
    "tests/test_survivors.py",
    "tests/test_credentials.py",
    "tests/test_autoscaling.py",
    "tests/test_serve_transport.py",
    "tests/test_k8s_config_schema.py",
    "tests/test_observability.py",
    "tests/test_time_to_ready.py",
    "tests/test_sizing.py",
    "tests/test_engine.py",
    "tests/test_config_inputs.py",
    "tests/test_platform_keys.py",
)
DEFAULT_NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
OVERLAY_ENV = "KIMI_DEPLOY_CONFIG_OVERLAY"


# --- JSON with datetimes ---------------------------------------------------------------------


def encode(value: Any) -> Any:
    """``value`` as JSON data: datetimes and dates tagged, tuples and sets as lists."""
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(encode(v) for v in value)
    return value


def decode(value: Any) -> Any:
    """The inverse of ``encode``."""
    if isinstance(value, dict):
        if set(value) == {"$datetime"}:
            return datetime.fromisoformat(value["$datetime"])
        if set(value) == {"$date"}:
            return date.fromisoformat(value["$date"])
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


# --- outcomes --------------------------------------------------------------------------------


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def outcome_of_spec(spec: Any) -> dict[str, Any]:
    return {"warnings": list(spec.warnings), "blockers": [_describe(b) for b in spec.blockers]}


def run_case(case: dict[str, Any], bases: dict[str, Any]) -> dict[str, Any]:
    """Replay one case; ``{"error": "ConfigError: ..."}`` or ``{"ok": {"warnings": [...], ...}}``."""
    from components.core import load as cfg

    now = datetime.fromisoformat(case.get("now", DEFAULT_NOW.isoformat()))
    if case["kind"] == "parse":
        config = materialize(case, bases)
        try:
            spec = cfg.parse_spec(
                config,
                stack=case.get("stack", "test"),
                project=case.get("project", cfg.NAMESPACE),
                now=now,
                secrets_set=frozenset(case.get("secrets", ())),
            )
        except Exception as err:  # noqa: BLE001  the outcome is the exception, whatever it is
            return {"error": _describe(err)}
        return {"ok": outcome_of_spec(spec)}
    # kind "stack": a whole stack file through load_stack (the secret checks, the config reader);
    # kind "file": the bytes of a stack file and the overlay it was read with.
    saved = os.environ.pop(OVERLAY_ENV, None)
    if case["kind"] == "file" and case.get("overlay") is not None:
        os.environ[OVERLAY_ENV] = case["overlay"]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            name = case.get("stack", "test")
            path = Path(tmp) / f"Pulumi.{name}.yaml"
            if case["kind"] == "file":
                path.write_bytes(base64.b64decode(case["bytes_b64"]))
            else:
                path.write_text(yaml.safe_dump({"config": decode(case["file"])}, sort_keys=False))
            try:
                spec = cfg.load_stack(name, stacks_dir=Path(tmp), now=now)
            except Exception as err:  # noqa: BLE001
                # The temporary directory is not part of what a user reads.
                return {"error": _describe(err).replace(str(path), f"<stacks>/Pulumi.{name}.yaml")}
            return {"ok": outcome_of_spec(spec)}
    finally:
        os.environ.pop(OVERLAY_ENV, None)
        if saved is not None:
            os.environ[OVERLAY_ENV] = saved


def materialize(case: dict[str, Any], bases: dict[str, Any]) -> dict[str, Any]:
    """The namespace config of a ``parse`` case: its base with ``set`` and ``unset`` applied."""
    config = copy.deepcopy(decode(bases[case["base"]])) if case.get("base") else {}
    for key in case.get("unset", ()):
        config.pop(key, None)
    config.update(decode(case.get("set", {})))
    if "path" in case:  # a mutation: one key set or removed
        config = _set_path(config, tuple(case["path"]), decode(case.get("value")), remove=bool(case.get("remove")))
    return config


def _delta(config: dict[str, Any], bases: dict[str, Any]) -> dict[str, Any]:
    """The smallest ``base``/``set``/``unset`` over ``bases`` giving ``config`` (JSON-encoded)."""
    enc = encode(config)
    best: dict[str, Any] = {"base": None, "set": enc, "unset": []}
    best_size = len(json.dumps(enc))
    for name, base in bases.items():
        changed = {k: v for k, v in enc.items() if base.get(k) != v}
        removed = sorted(k for k in base if k not in enc)
        size = len(json.dumps(changed)) + len(json.dumps(removed))
        if size < best_size:
            best, best_size = {"base": name, "set": changed, "unset": removed}, size
    return best


# --- harvesting from the tests (a pytest plugin: `pytest -p tests.config_corpus`) ---------------

_RECORDED: list[dict[str, Any]] = []


def pytest_configure(config: Any) -> None:  # noqa: ARG001  pytest hook signature
    """Wrap ``parse_spec`` and ``load_stack`` before any test module imports them."""
    from components.core import load as cfg
    from components.core.config import stack_file

    real_parse, real_load = cfg.parse_spec, cfg.load_stack
    in_load = [False]  # load_stack's own call of parse_spec is the stack case, not a parse case of its own

    def parse_spec(config_map: Any, *, stack: str, project: str = cfg.NAMESPACE, now: Any = None,
                   secrets_set: Any = frozenset()) -> Any:
        if in_load[0]:
            return real_parse(config_map, stack=stack, project=project, now=now, secrets_set=secrets_set)
        _RECORDED.append({
            "kind": "parse", "config": encode(dict(config_map)), "stack": stack, "project": project,
            "now": (now or DEFAULT_NOW).isoformat(), "secrets": sorted(secrets_set),
        })
        return real_parse(config_map, stack=stack, project=project, now=now, secrets_set=secrets_set)

    def load_stack(stack: str, *, stacks_dir: Path = stack_file.STACKS_DIR, now: Any = None, project: str = cfg.NAMESPACE) -> Any:
        try:
            full = stack_file.read_stack_config(stack, stacks_dir)
        except Exception:  # noqa: BLE001  a file-level error: recorded as the file's bytes when readable
            full = None
            try:
                data = (Path(stacks_dir) / f"Pulumi.{stack}.yaml").read_bytes()
            except OSError:
                data = None
            if data is not None:
                _RECORDED.append({"kind": "file", "bytes_b64": base64.b64encode(data).decode(), "stack": stack,
                                  "overlay": os.environ.get(OVERLAY_ENV), "now": (now or DEFAULT_NOW).isoformat()})
        if full is not None:
            _RECORDED.append({"kind": "stack", "file": encode(full), "stack": stack, "now": (now or DEFAULT_NOW).isoformat()})
        in_load[0] = True
        try:
            return real_load(stack, stacks_dir=stacks_dir, now=now, project=project)
        finally:
            in_load[0] = False

    cfg.parse_spec = parse_spec  # type: ignore[assignment]  # a recording wrapper: Any-typed arguments
    cfg.load_stack = load_stack


def pytest_unconfigure(config: Any) -> None:  # noqa: ARG001
    out = os.environ.get("KIMI_CORPUS_OUT")
    if out:
        Path(out).write_text(json.dumps(_RECORDED))


# --- mutations -------------------------------------------------------------------------------

# Wrong types and out-of-range values tried for every key, by the key's declared type.
_REMOVE = object()
_GENERIC: tuple[Any, ...] = ("", "not a valid value!", -1, 0, 1.5, 10**7, True, [], ["x"], {}, {"bogus": 1})


def _field_paths() -> list[tuple[tuple[str, ...], Any]]:
    """``(camelCase path, annotation)`` of every leaf and section of ``RawConfig``."""
    from pydantic import BaseModel

    from components.core.config import RawConfig

    out: list[tuple[tuple[str, ...], Any]] = []

    def walk(model: Any, prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            key = prefix + (info.alias or name,)
            out.append((key, info.annotation))
            sub = next((c for c in (info.annotation, *getattr(info.annotation, "__args__", ()))
                        if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if sub is not None:
                walk(sub, key)

    walk(RawConfig, ())
    return out


def _set_path(config: dict[str, Any], path: tuple[str, ...], value: Any, remove: bool = False) -> dict[str, Any]:
    out = copy.deepcopy(config)
    node = out
    for part in path[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    if remove:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return out


def _semantic_values(path: tuple[str, ...], current: Any) -> list[Any]:
    """Values of the right type but wrong content, from the key's current value."""
    values: list[Any] = []
    if isinstance(current, str):
        values += [current + "x", current.upper(), " " + current, current + "/..", "../" + current]
    elif isinstance(current, bool):
        values += [not current]
    elif isinstance(current, int):
        values += [current + 1, current * 100, -current]
    elif isinstance(current, float):
        values += [current * 10, current / 10, 0.0]
    elif isinstance(current, list):
        values += [current * 2, [*current, "bogus"], current[:1] * 2]
    return values


def mutation_cases(bases: dict[str, Any]) -> list[dict[str, Any]]:
    """Every RawConfig key of every base set to wrong values, and removed (parse cases)."""
    cases: list[dict[str, Any]] = []
    for stack, base in bases.items():
        base_cfg = decode(base)
        for path, _annotation in _field_paths():
            node: Any = base_cfg
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            values = [*_GENERIC, *_semantic_values(path, node)]
            for value in [*values, _REMOVE]:
                case: dict[str, Any] = {"kind": "parse", "base": stack, "stack": stack, "path": list(path),
                                        "now": DEFAULT_NOW.isoformat(), "secrets": []}
                if value is _REMOVE:
                    case["remove"] = True
                else:
                    case["value"] = encode(value)
                case["key"] = ".".join(path)
                cases.append(case)
    return cases


# --- building the fixture --------------------------------------------------------------------


def _bases() -> dict[str, Any]:
    from components.core.config import namespace_config, read_stack_config, stack_names

    saved = os.environ.pop(OVERLAY_ENV, None)
    try:
        return {name: encode(namespace_config(read_stack_config(name))[0]) for name in stack_names()}
    finally:
        if saved is not None:
            os.environ[OVERLAY_ENV] = saved


# The words that follow the echoed value in a ConfigError line ("KEY: VALUE is not ...").
_AFTER_VALUE = re.compile(
    r"^(\S+): (.*?) (is|must|has|does|needs|exceeds|and|differs|sets|left|cannot|leaves|names|turns|are|looks|was) "
)


def _template(result: dict[str, Any]) -> str:
    """An outcome with the echoed value cut out: mutations giving the same message for another
    value of the same key are one case."""
    if "error" in result:
        return _AFTER_VALUE.sub(r"\1: <value> \3 ", result["error"])
    return json.dumps(result, sort_keys=True)


def build() -> dict[str, Any]:
    """Harvest the tests, add the mutations, replay all in this clean process, keep the stable ones."""
    import subprocess

    bases = _bases()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "recorded.json"
        env = {**os.environ, "KIMI_CORPUS_OUT": str(out)}
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.config_corpus", *HARVEST_TESTS],
            env=env, check=False, stdout=subprocess.DEVNULL,
        )
        recorded = json.loads(out.read_text())
    cases: list[dict[str, Any]] = []
    seen: set[str] = set()
    for rec in recorded:
        if rec["kind"] == "parse":
            case = {"kind": "parse", **_delta(decode(rec["config"]), bases), "stack": rec["stack"], "now": rec["now"],
                    "secrets": rec["secrets"]}
            if rec["project"] != "kimi-deploy":
                case["project"] = rec["project"]
        elif rec["kind"] == "file":
            case = {key: rec[key] for key in ("kind", "bytes_b64", "overlay", "stack", "now")}
        else:
            case = {"kind": "stack", "file": rec["file"], "stack": rec["stack"], "now": rec["now"]}
        ident = json.dumps(case, sort_keys=True)
        if ident not in seen:
            seen.add(ident)
            cases.append(case)
    harvested = len(cases)
    # Replay: a harvested call made under a test's monkeypatch gives another outcome here; drop it.
    kept: list[dict[str, Any]] = []
    for case in cases:
        result = run_case(case, bases)
        if "expected" not in case:
            case["expected"] = result
        kept.append(case)
    by_outcome: set[str] = set()
    for case in mutation_cases(bases):
        result = run_case(case, bases)
        ident = json.dumps([case["key"], _template(result)], sort_keys=True)
        ident_input = json.dumps(materialize(case, bases), sort_keys=True, default=str)
        if ident in by_outcome or ident_input in seen:
            continue
        by_outcome.add(ident)
        seen.add(ident_input)
        case["expected"] = result
        kept.append(case)
    print(f"harvested {harvested} distinct calls; {len(kept) - harvested} mutation cases; {len(kept)} in all", file=sys.stderr)
    return {"bases": bases, "cases": kept}


def _stable(corpus: dict[str, Any]) -> dict[str, Any]:
    """Keep the cases whose outcome is the same in a fresh process (drops monkeypatched calls)."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.json"
        path.write_text(json.dumps(corpus))
        code = (
            "import json,sys; from tests.config_corpus import run_case; c=json.load(open(sys.argv[1]));"
            "print(json.dumps([run_case(x, c['bases']) == x['expected'] for x in c['cases']]))"
        )
        env = {k: v for k, v in os.environ.items() if k != OVERLAY_ENV}
        same = json.loads(subprocess.run([sys.executable, "-c", code, str(path)], env=env, check=True,
                                         capture_output=True, text=True).stdout)
    dropped = same.count(False)
    print(f"dropped {dropped} cases whose outcome depends on a test's monkeypatch", file=sys.stderr)
    return {"bases": corpus["bases"], "cases": [c for c, ok in zip(corpus["cases"], same, strict=True) if ok]}


def main() -> int:
    os.environ.pop(OVERLAY_ENV, None)
    corpus = _stable(build())
    # One case per line: a changed message is a one-line diff.
    lines = [json.dumps(c, ensure_ascii=False) for c in corpus["cases"]]
    bases = json.dumps(corpus["bases"], ensure_ascii=False)
    FIXTURE.write_text('{"bases": ' + bases + ',\n"cases": [\n' + ",\n".join(lines) + "\n]}\n")
    errors = sum(1 for c in corpus["cases"] if "error" in c["expected"])
    print(f"wrote {FIXTURE}: {len(corpus['cases'])} cases, {errors} errors", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

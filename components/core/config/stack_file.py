"""Stack files: ``stacks/Pulumi.<stack>.yaml`` read (duplicate keys rejected, the offline
overlay applied) and its namespace decoded by ``config.reader`` as the engine hands it
(``load.load_stack`` turns the result into a ``DeploymentSpec``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from .reader import cli_config_strings, read_config_strings

REPO_ROOT = Path(__file__).resolve().parents[3]
STACKS_DIR = REPO_ROOT / "stacks"




# Top-level keys of a Pulumi stack settings file (pulumi/pulumi sdk/go/common/workspace/project.go,
# ProjectStack: secretsprovider, encryptedkey, encryptionsalt, config, environment).
STACK_FILE_KEYS: tuple[str, ...] = ("config", "encryptedkey", "encryptionsalt", "environment", "secretsprovider")


class StackFileError(ConfigError):
    """A stack file is missing or not a Pulumi stack config file."""


# YAML 1.2 core schema scalars (https://yaml.org/spec/1.2.2/#1032-tag-resolution), as the Pulumi
# CLI reads stack files (gopkg.in/yaml.v3 implements YAML 1.2). PyYAML's SafeLoader is YAML 1.1,
# where `1:12` is the sexagesimal int 72, `yes`/`on`/`off` are booleans and `017` is octal: the
# plan would accept values `pulumi up` reads as text and refuses.
_YAML12_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)\Z")
_YAML12_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)\Z")
_YAML12_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_YAML11_TAGS = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars (``_YAML12_*``) that rejects a key given twice in one
    map (YAML would keep the last silently)."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML11_TAGS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_yaml_int(self, node):
        """A YAML 1.2 int: decimal (a leading 0 stays decimal), ``0o`` octal or ``0x`` hex."""
        text = self.construct_scalar(node)
        if text.startswith(("0o", "0x")):
            return int(text, 0)
        return int(text, 10)

    def construct_mapping(self, node, deep=False):
        # A key written twice in one map is refused; YAML merge keys (`<<: *anchor`, which the
        # Pulumi CLI's go-yaml v3 reads) are not keys: the merged map's keys come first and a key
        # written beside the merge overrides them, as in go-yaml (PyYAML's flatten_mapping).
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _YAML12_BOOL, list("tTfF"))
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:int", _YAML12_INT, list("-+0123456789"))
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _UniqueKeyLoader.construct_yaml_int)


# Bounds on a YAML document checked on its events, before any node is built: PyYAML expands an alias
# to the whole anchored node and composes nested collections by recursion, so a 12-line alias bomb
# (each level nine aliases of the last) grows without bound (MemoryError after a minute) and 5,000
# nested brackets end in RecursionError. go-yaml v3, which the Pulumi CLI reads stack files with,
# refuses both ("document contains excessive aliasing", "exceeded max depth"). A stack file holds a
# few hundred nodes, nested under ten deep.
MAX_YAML_DEPTH = 100
MAX_YAML_NODES = 100_000


def yaml_bounds_problem(text: str) -> str | None:
    """Why ``text`` is refused before it is built, or None: collections nested deeper than
    ``MAX_YAML_DEPTH``, or more than ``MAX_YAML_NODES`` nodes once every alias is expanded. Reads
    the parser's events only (linear in the text; aliases are counted, never copied).

    Raises:
        yaml.YAMLError: the text is not valid YAML (the caller's one-line message names where).
    """
    from yaml.events import (
        AliasEvent,
        CollectionEndEvent,
        CollectionStartEvent,
        ScalarEvent,
    )

    anchored: dict[str, tuple[int, int]] = {}  # anchor -> (nodes once expanded, depth below it)
    open_nodes: list[list[Any]] = []  # [anchor, nodes so far, depth below so far, line]
    top = 0
    for event in yaml.parse(text, Loader=_UniqueKeyLoader):
        if isinstance(event, CollectionStartEvent):
            open_nodes.append([event.anchor, 1, 0, event.start_mark.line + 1])
            if len(open_nodes) > MAX_YAML_DEPTH:
                return (f"nests collections more than {MAX_YAML_DEPTH} deep (line {event.start_mark.line + 1}; a "
                        "stack file needs under ten)")
            continue
        if isinstance(event, CollectionEndEvent):
            anchor, nodes, below, _ = open_nodes.pop()
            depth = below + 1
            if anchor:
                anchored[anchor] = (nodes, depth)
        elif isinstance(event, ScalarEvent):
            nodes, depth = 1, 0
            if event.anchor:
                anchored[event.anchor] = (1, 0)
        elif isinstance(event, AliasEvent):
            nodes, depth = anchored.get(event.anchor or "", (1, 0))
            if len(open_nodes) + depth > MAX_YAML_DEPTH:
                return (f"nests collections more than {MAX_YAML_DEPTH} deep through alias *{event.anchor} "
                        f"(line {event.start_mark.line + 1})")
        else:
            continue
        if open_nodes:
            parent = open_nodes[-1]
            parent[1] += nodes
            parent[2] = max(parent[2], depth)
            total, line = parent[1], parent[3]
        else:
            top += nodes
            total, line = top, event.start_mark.line + 1
        if total > MAX_YAML_NODES:
            return (f"expands its aliases to more than {MAX_YAML_NODES:,} nodes (from line {line}; go-yaml, which "
                    "`pulumi up` reads it with, refuses excessive aliasing)")
    return None


def read_text_file(path: Path, key: str, value: Any, what: str) -> str:
    """The UTF-8 text of ``path`` (a leading byte-order mark is dropped, as YAML allows).

    Pulumi reads stack files as UTF-8 (go-yaml v3); so do the scripts' other inputs.

    Raises:
        StackFileError: one line naming ``key`` and ``value``: the file cannot be read (the OS
            error), or is not UTF-8 (the first bad byte, its line and column).
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise StackFileError(key, value, f"{what} cannot be read: {err.strerror or err}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise StackFileError(
            key, value,
            f"{what} is not UTF-8 text: byte 0x{data[err.start]:02x} at line {line}, column {column} (save it as UTF-8)",
        ) from None


def stack_names(stacks_dir: Path = STACKS_DIR) -> list[str]:
    """Names of the stacks with a file ``stacks/Pulumi.<name>.yaml``, sorted."""
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in stacks_dir.glob("Pulumi.*.yaml"))


def read_stack_config(stack: str, stacks_dir: Path = STACKS_DIR) -> dict[str, Any]:
    """The ``config:`` map of ``stacks/Pulumi.<stack>.yaml`` with full keys (``kimi-deploy:target``).

    Secure values (``{secure: ...}``) are kept as they are: only their presence matters offline.

    Raises:
        StackFileError: no such stack file, or it is not valid YAML with a ``config`` map.
    """
    if not stack or "/" in stack or stack.endswith((".yaml", ".yml")):
        # A path or a file name where a stack name goes (`--stack stacks/Pulumi.b300.yaml`).
        raise StackFileError("--stack", stack, f"is not a stack name: give the name of a stack in {stacks_dir.name}/ "
                                               f"({', '.join(stack_names(stacks_dir)) or 'none'}), not a path")
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise StackFileError(
            "--stack",
            stack,
            f"has no file {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path} (stacks: "
            f"{', '.join(stack_names(stacks_dir)) or 'none'})",
        )
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    text = read_text_file(path, "--stack", stack, f"file {shown}")
    try:
        problem = yaml_bounds_problem(text)
        if problem is not None:
            raise StackFileError("--stack", stack, f"file {shown} {problem}")
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise StackFileError("--stack", stack, f"file {shown} is not valid YAML: {_yaml_error_text(err)}") from None
    if data is None:
        raise StackFileError("--stack", stack, f"file {shown} is empty (it needs a 'config:' map; see stacks/Pulumi.b300.yaml)")
    if isinstance(data, dict):
        from ..errors import did_you_mean

        for top in data:
            if top not in STACK_FILE_KEYS:
                raise StackFileError(
                    "--stack", stack,
                    f"file {shown} has a top-level key {top!r} that Pulumi does not read (allowed: {', '.join(STACK_FILE_KEYS)})"
                    + did_you_mean(str(top), STACK_FILE_KEYS),
                )
        raw_config = data.get("config")
        for key in raw_config if isinstance(raw_config, dict) else ():
            if not isinstance(key, str):
                raise StackFileError(
                    "--stack", stack, f"file {shown} has a config key {key!r} that is not a string (write namespace:key)"
                )
    config = data.get("config", {}) if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise StackFileError("--stack", stack, "file has no 'config:' map")
    return _overlay(config, stack)


# Offline runs only (scripts/ops/plan.py, preflight, tests; `pulumi up` reads config through Pulumi):
# JSON config applied over every stack file, each leaf as `pulumi config set --path` would set it
# (``overlay_config``): e.g. {"kimi-deploy:vllm": {"image": "vllm/vllm-openai:nightly-<commit>"}}.
# Under the top-level key "stacks", full keys for named stacks only, applied after the rest:
# {"stacks": {"gb300": {"kimi-deploy:network": {"apiServerPublicCidrs": ["198.51.100.7/32"]}}}}, so one
# overlay can try a key that only some platforms read across `plan --all` ("stacks" is no config key:
# every full key holds a namespace, "kimi-deploy:...").
CONFIG_OVERLAY_ENV = "KIMI_DEPLOY_CONFIG_OVERLAY"
OVERLAY_STACKS_KEY = "stacks"


def config_overlay() -> dict[str, Any] | None:
    """The offline overlay in ``KIMI_DEPLOY_CONFIG_OVERLAY`` (a JSON object of full keys), or None
    when the variable is unset or blank.

    Raises:
        StackFileError: not JSON, or not a JSON object.
    """
    import json
    import os

    text = os.environ.get(CONFIG_OVERLAY_ENV, "").strip()
    if not text:
        return None
    from ..errors import did_you_mean

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        twice = next((key for key in keys if keys.count(key) > 1), None)
        if twice is not None:  # json keeps the last silently; the stack files refuse a duplicate key too
            raise StackFileError(CONFIG_OVERLAY_ENV, twice, "is a key given twice in one JSON object (each key once)")
        return dict(pairs)

    # The stack files' bound on nesting holds here too, counted on the text before parsing: a bracket
    # outside a string opens a level (json's own recursion would end in a traceback past ~1,000).
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (not escaped and char == "\\"), in_string and (escaped or char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    if deepest > MAX_YAML_DEPTH:
        raise StackFileError(CONFIG_OVERLAY_ENV, text[:40], f"nests collections {deepest} deep (at most {MAX_YAML_DEPTH})")
    try:
        extra = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as err:
        raise StackFileError(CONFIG_OVERLAY_ENV, text[:40], f"is not valid JSON ({err.msg})") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise StackFileError(CONFIG_OVERLAY_ENV, text[:40], f"is not usable JSON ({str(err).split(';')[0]})") from None
    if not isinstance(extra, dict):
        raise StackFileError(CONFIG_OVERLAY_ENV, text[:40], "must be a JSON object of full config keys")
    scoped = extra.get(OVERLAY_STACKS_KEY, {})
    if not isinstance(scoped, dict) or not all(isinstance(v, dict) for v in scoped.values()):
        raise StackFileError(CONFIG_OVERLAY_ENV, OVERLAY_STACKS_KEY,
                             'must map stack names to JSON objects of full config keys ({"gb300": {"kimi-deploy:...": ...}})')
    known = stack_names()
    for name in scoped:
        if known and name not in known:  # a misspelt stack would apply to nothing, silently
            raise StackFileError(CONFIG_OVERLAY_ENV, f"{OVERLAY_STACKS_KEY}.{name}",
                                 f"names no stack file in stacks/ (stacks: {', '.join(known)})" + did_you_mean(name, known))
    return extra


def overlay_for_stack(extra: Mapping[str, Any], stack: str) -> dict[str, Any]:
    """The part of an overlay that applies to ``stack``: its full keys, then (set after them) the
    full keys under ``"stacks"`` for that stack. ``{"stacks": {...}}`` alone is ``{}`` for a stack
    it does not name."""
    general = {key: value for key, value in extra.items() if key != OVERLAY_STACKS_KEY}
    return overlay_config(general, extra.get(OVERLAY_STACKS_KEY, {}).get(stack, {}))


def overlay_keys(extra: Mapping[str, Any], stack: str | None = None) -> tuple[str, ...]:
    """The keys an overlay sets, as ``pulumi config set --path`` names them
    (``kimi-deploy:vllm.image``), in the overlay's order: what the commands that read config name
    in their first line while it is active. With ``stack``, what it sets for that stack; without,
    every key, a stack-scoped one followed by ``(stack NAME)``."""
    if stack is not None:
        return tuple(".".join((key, *path)) for key, value in overlay_for_stack(extra, stack).items()
                     for path, _ in _leaves(value))
    names = [".".join((key, *path)) for key, value in extra.items() if key != OVERLAY_STACKS_KEY for path, _ in _leaves(value)]
    for name, scoped in extra.get(OVERLAY_STACKS_KEY, {}).items():
        names += [f"{'.'.join((key, *path))} (stack {name})" for key, value in scoped.items() for path, _ in _leaves(value)]
    return tuple(names)


def _overlay(config: dict[str, Any], stack: str) -> dict[str, Any]:
    extra = config_overlay()
    return config if extra is None else overlay_config(config, overlay_for_stack(extra, stack))


def _leaves(value: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """``(path, value)`` of every leaf of ``value``: a non-empty map is walked, anything else
    (a scalar, a list, an empty map) is one leaf."""
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*path, str(key)))]
    return [(path, value)]


def overlay_config(config: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a stack file's ``config:`` map) with every leaf of ``extra`` set the way
    ``pulumi config set --path '<key>.<a>.<b>' <value>`` sets it, so a nested override keeps its
    siblings (``{"kimi-deploy:compute": {"capacity": {"type": "odcr"}}}`` changes the capacity
    type and keeps ``reservationId``). Values keep their JSON types, as with ``--path --json``.

    Rules of pulumi/pulumi ``sdk/go/common/resource/config/map.go`` (``Map.Set`` with a path):
    a top-level key alone replaces the value; below it, a scalar top-level value is replaced by a
    map; a missing map on the way is created; a scalar or list on the way is an error ("a map was
    expected"); a map left as exactly ``{"secure": ...}`` is reserved for secrets (an error).
    ``config`` is not modified.

    Raises:
        StackFileError: a leaf would be set inside a value that is not a map, or into a secret.
    """
    import copy

    merged = copy.deepcopy(dict(config))
    for key, value in extra.items():
        for path, leaf in _leaves(value):
            where = ".".join((key, *path))
            if not path:
                merged[key] = copy.deepcopy(leaf)
                continue
            root = merged.get(key)
            if isinstance(root, dict) and set(root) == {"secure"}:
                raise StackFileError(CONFIG_OVERLAY_ENV, where, f"cannot be set: {key} is a secret in the stack file")
            if isinstance(root, list):
                raise StackFileError(CONFIG_OVERLAY_ENV, where, _not_a_map(key, root))
            if not isinstance(root, dict):
                root = merged[key] = {}  # map.go: a top-level scalar is overwritten by the map
            node = root
            for depth, part in enumerate(path[:-1], start=1):
                child = node.get(part)
                if child is None:
                    child = node[part] = {}
                elif not isinstance(child, dict):
                    raise StackFileError(CONFIG_OVERLAY_ENV, where, _not_a_map(".".join((key, *path[:depth])), child))
                node = child
            node[path[-1]] = copy.deepcopy(leaf)
            if set(node) == {"secure"}:
                raise StackFileError(
                    CONFIG_OVERLAY_ENV, where, "cannot be set: a map holding only 'secure' is reserved for secret values"
                )
    return merged


def _not_a_map(where: str, value: Any) -> str:
    """The error words for a leaf set inside ``value`` at ``where``, which is not a map."""
    if isinstance(value, list):
        kind = "a list"
    elif isinstance(value, bool):
        kind = f"the boolean {str(value).lower()}"
    elif isinstance(value, (int, float)):
        kind = f"the number {value}"
    else:
        kind = f"the text {str(value)!r}"
    return f"cannot be set: {where} is {kind} in the stack file, not a map (`pulumi config set --path` refuses it too)"


def _yaml_error_text(err: yaml.YAMLError) -> str:
    """A PyYAML error as ``line L, column C: reason`` (1-based, as editors count)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    reason = getattr(err, "problem", None) or str(err).splitlines()[0]
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and context not in reason:
        where = (
            f" started at line {context_mark.line + 1}, column {context_mark.column + 1}"
            if context_mark is not None and context_mark is not mark
            else ""
        )
        reason = f"{reason} ({context}{where})"
    return f"line {mark.line + 1}, column {mark.column + 1}: {reason}" if mark is not None else reason


def namespace_config(full_config: Mapping[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """The ``kimi-deploy`` namespace map (prefix removed, plus ``region`` from ``aws:region``) and
    the set of secret keys that have a value, read from a stack file's ``config:`` map exactly as
    ``pulumi up`` reads it: converted to the strings the CLI hands the program
    (``config.reader.cli_config_strings``), then decoded by the program's reader
    (``config.reader.read_config_strings``).

    Raises:
        ConfigError: an unknown namespace or key, or a value not of its key's type.
    """
    secure = {k for k, v in full_config.items() if isinstance(v, dict) and set(v) == {"secure"}}
    return read_config_strings(cli_config_strings(full_config), secure)

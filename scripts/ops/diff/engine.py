"""Compare two plan documents: resources added, removed and changed (each changed input as a
dotted path, marked ``replaces``/``disrupts`` from ``scripts.ops.diff.rules``), the vLLM command per
role, plan settings and warnings. No git, no rendering; the CRD rules evaluate CEL (cel-python).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scripts.ops.diff.rules import (
    DISRUPTIVE_ON_CHANGE,
    LAUNCH_TEMPLATE,
    RECYCLED_ON_UPDATE,
    REPLACE_ON_CHANGE,
    TEMPLATE_FOLLOWERS,
    FieldRule,
    first_rule,
    template_versioned_change,
)

# Document keys that are not part of what gets deployed (never diffed).
# config_overlay: the diff states the overlay once (plan_diff.py: the working tree's side only).
IGNORED_DOC_KEYS = frozenset({"generated_at", "resources", "vllm", "warnings", "secret_leaks", "stack", "config_overlay"})


def propagate_template_versions(changed: list[dict[str, Any]], n_idx: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
    """Mark what launches from a launch template whose change makes a new version: the offline
    plan shows the template's ``latestVersion`` as unchanged (the mock cannot know the next
    number), so the follower's own inputs do not change. Adds a synthetic field
    ``launchTemplate.version`` (old ``latest``, new ``latest+1``) to the follower, marked replace
    (instances: terraform-provider-aws forces a new ``aws_instance``) or disruptive (node groups:
    EKS recycles every node). Mutates ``changed`` in place.

    The follower's ``launchTemplate.id`` is found through the plan's ``references`` (``{"launchTemplate.id":
    "gpu-lt.id"}``: the value is provider-computed, shown as ``<known after pulumi up>``), or, in a
    document without them, as the mock id ``<template name>-id``.
    """
    new_versions = {c["name"] for c in changed if c["type"] == LAUNCH_TEMPLATE and template_versioned_change(c["fields"])}
    if not new_versions:
        return
    by_key = {(c["type"], c["name"]): c for c in changed}
    for (rtype, name), res in n_idx.items():
        follow = TEMPLATE_FOLLOWERS.get(rtype)
        if follow is None:
            continue
        origin = (res.get("references") or {}).get("launchTemplate.id", "")
        template = origin[: -len(".id")] if origin.endswith(".id") else None
        if template is None:
            lt_id = str(((res.get("inputs") or {}).get("launchTemplate") or {}).get("id", ""))
            template = lt_id[: -len("-id")] if lt_id.endswith("-id") else None
        if template not in new_versions:
            continue
        action, note = follow
        entry = by_key.get((rtype, name))
        if entry is None:
            entry = {"type": rtype, "name": name, "action": "update", "disruptive": False, "fields": []}
            changed.append(entry)
            by_key[(rtype, name)] = entry
        entry["fields"].append(
            {
                "path": "launchTemplate.version",
                "old": "latest",
                "new": "latest+1",
                "replaces": action == "replace",
                "disrupts": action != "replace",
                "note": f"{note} (launch template {template})",
            }
        )
        if action == "replace":
            entry["action"] = "replace"
        entry["disruptive"] = True


MISSING = "<absent>"
# A value shorter than this is not followed from an ignored input into other resources (a short
# value such as "72" or "true" also appears where it was never carried).
MIN_CARRIED_VALUE_CHARS = 8
# An RFC 3339 UTC time with seconds (``2026-12-03T12:00:00Z``), as the program writes expires-at.
_UTC_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def is_ignored(path: str, ignore_changes: list[str] | tuple[str, ...]) -> bool:
    """Whether ``path`` (``spec.replicas``, ``keepers.expiresAt``) lies under one of a resource's
    ``ignore_changes`` paths (Pulumi's property paths: a path covers everything below it; list
    indexes may be written ``[*]``)."""
    norm = re.sub(r"\[\d+\]", "[*]", path)
    for pattern in ignore_changes:
        for candidate in (path, norm):
            if candidate == pattern or candidate.startswith(pattern + ".") or candidate.startswith(pattern + "["):
                return True
    return False


def _carried(field: Mapping[str, Any], pairs: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The (old, new) pair of an ignored input whose change ``field`` only carries (the whole value,
    or every occurrence inside a string), else None."""
    old, new = field["old"], field["new"]
    if not isinstance(old, str) or not isinstance(new, str):
        return None
    for a, b in pairs:
        if old == a and new == b:
            return a, b
        if a in old and old.replace(a, b) == new:
            return a, b
    return None


def drop_ignored_changes(
    changed: list[dict[str, Any]], n_idx: Mapping[tuple[str, str], Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Remove from ``changed`` (``[{type, name, fields}]``) what ``pulumi up`` does not apply, and
    return it as ``[{type, name, path, old, new, why}]``:

    - a field under the resource's ``ignore_changes`` in the new document (the options of the
      program being deployed count, not the old one's): the engine keeps the value from the state
      (pulumi ``ResourceOptions.ignore_changes``);
    - a field whose change only carries such an ignored value into another resource (a trial's
      expiry kept in ``random.RandomId`` keepers and tagged everywhere): the kept value flows on.
      Only string values of at least ``MIN_CARRIED_VALUE_CHARS`` characters are followed.

    A resource left with no field is removed from ``changed``. Mutates ``changed`` in place.
    """
    dropped: list[dict[str, Any]] = []
    pairs: list[tuple[str, str]] = []
    for entry in changed:
        key = (entry["type"], entry["name"])
        ignore = list((n_idx.get(key) or {}).get("ignore_changes") or [])
        if not ignore:
            continue
        kept = []
        for f in entry["fields"]:
            if is_ignored(f["path"], ignore):
                dropped.append({"type": key[0], "name": key[1], "path": f["path"], "old": f["old"], "new": f["new"],
                                "why": "ignore_changes"})
                if isinstance(f["old"], str) and isinstance(f["new"], str) and len(f["old"]) >= MIN_CARRIED_VALUE_CHARS:
                    pairs.append((f["old"], f["new"]))
                    if _UTC_TIME.fullmatch(f["old"]) and _UTC_TIME.fullmatch(f["new"]):
                        # The same time written without its UTC designator: the expiry schedule's
                        # at(yyyy-mm-ddThh:mm:ss) expression (components/aws/expiry.py).
                        pairs.append((f["old"][:-1], f["new"][:-1]))
            else:
                kept.append(f)
        entry["fields"] = kept
    if pairs:
        for entry in changed:
            kept = []
            for f in entry["fields"]:
                if _carried(f, pairs) is not None:
                    dropped.append({"type": entry["type"], "name": entry["name"], "path": f["path"], "old": f["old"],
                                    "new": f["new"], "why": "carries a value kept by ignore_changes"})
                else:
                    kept.append(f)
            entry["fields"] = kept
    changed[:] = [entry for entry in changed if entry["fields"]]
    return dropped


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted-path leaves of ``value``. Lists of scalars are one leaf (subnet ids, instance
    types); lists of objects are indexed (``containers[0].image``); empty containers are leaves."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        if not value and prefix:
            out[prefix] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list) and value and any(isinstance(v, (Mapping, list)) for v in value):
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
    else:
        out[prefix] = value
    return out


def diff_values(old: Any, new: Any, prefix: str = "") -> list[dict[str, Any]]:
    """``[{path, old, new}]`` for every leaf that differs (absent leaves as ``<absent>``)."""
    a, b = flatten(old, prefix), flatten(new, prefix)
    changes = []
    for path in sorted(set(a) | set(b), key=_path_key):
        va, vb = a.get(path, MISSING), b.get(path, MISSING)
        if va != vb:
            changes.append({"path": path, "old": va, "new": vb})
    return changes


def _path_key(path: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", path) if p]


def _resource_index(doc: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(r["type"], r["name"]): r for r in doc.get("resources", [])}


def _argv_flags(argv: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``(positionals before the first flag, {flag: [values]})``; a flag may repeat."""
    head: list[str] = []
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for token in argv:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            current = name
            flags.setdefault(current, [])
            if eq:
                flags[current].append(value)
        elif current is None:
            head.append(token)
        else:
            flags[current].append(token)
    return head, flags


def _diff_argv(old: list[str], new: list[str]) -> list[dict[str, Any]]:
    """Flag-level changes of a command line: ``[{flag, old, new}]`` (None = absent, "" = bare flag)."""
    oh, of = _argv_flags(old)
    nh, nf = _argv_flags(new)
    out: list[dict[str, Any]] = []
    if oh != nh:
        out.append({"flag": "(command)", "old": " ".join(oh), "new": " ".join(nh)})
    for flag in list(dict.fromkeys([*of, *nf])):
        a = " ".join(of[flag]) if flag in of else None
        b = " ".join(nf[flag]) if flag in nf else None
        if a != b:
            out.append({"flag": flag, "old": a, "new": b})
    return out


def _diff_vllm(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"fields": [], "roles": []}
    scalar_old = {k: v for k, v in (old or {}).items() if k != "roles"}
    scalar_new = {k: v for k, v in (new or {}).items() if k != "roles"}
    result["fields"] = diff_values(scalar_old, scalar_new)
    o_roles = {r["name"]: r for r in (old or {}).get("roles", [])}
    n_roles = {r["name"]: r for r in (new or {}).get("roles", [])}
    for name in list(dict.fromkeys([*o_roles, *n_roles])):
        a, b = o_roles.get(name), n_roles.get(name)
        if a is None or b is None:
            result["roles"].append(
                {"name": name, "status": "added" if a is None else "removed", "argv": [], "env": [], "nodes": None}
            )
            continue
        argv = _diff_argv(a.get("argv", []), b.get("argv", []))
        env = diff_values(
            {"env": a.get("env", {}), "secret_env": a.get("secret_env", {})},
            {"env": b.get("env", {}), "secret_env": b.get("secret_env", {})},
        )
        nodes = (a.get("nodes"), b.get("nodes")) if a.get("nodes") != b.get("nodes") else None
        if argv or env or nodes:
            result["roles"].append({"name": name, "status": "changed", "argv": argv, "env": env, "nodes": nodes})
    return result


def diff_documents(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Compare two plan documents (``scripts/ops/plan.py build_plan_document``; ``{}`` = nothing).

    Returns a JSON-serializable dict::

        {"summary": {"added", "removed", "changed", "replaced", "disruptive", "recycled"},
         "added": [{type, name, inputs}], "removed": [{type, name, inputs}],
         "changed": [{type, name, action: "replace"|"update", disruptive: bool,
                      fields: [{path, old, new, replaces, disrupts, note}]}],
         "vllm": {fields: [{path, old, new}], roles: [{name, status, nodes, argv: [{flag, old, new}], env}]},
         "plan": [{path, old, new}]      # target, sizing, model, nodes, expiry, outputs ...
         "ignored": [{type, name, path, old, new, why}]   # not applied by `pulumi up` (drop_ignored_changes)
         "warnings": {"added": [...], "removed": [...]},
         "secret_leaks": [...]}          # of the new document (must be empty)

    Absent values are ``"<absent>"``.
    """
    old, new = old or {}, new or {}
    o_idx, n_idx = _resource_index(old), _resource_index(new)
    added = [dict(n_idx[k]) for k in n_idx if k not in o_idx]
    removed = [dict(o_idx[k]) for k in o_idx if k not in n_idx]
    changed: list[dict[str, Any]] = []
    for key in n_idx:
        if key not in o_idx:
            continue
        fields = diff_values(o_idx[key].get("inputs", {}) or {}, n_idx[key].get("inputs", {}) or {})
        if fields:
            changed.append({"type": key[0], "name": key[1], "fields": fields})
    ignored = drop_ignored_changes(changed, n_idx)
    for entry in changed:
        key = (entry["type"], entry["name"])
        oi, ni = o_idx[key].get("inputs", {}) or {}, n_idx[key].get("inputs", {}) or {}
        fields = entry["fields"]
        rtype = key[0]
        own = list(n_idx[key].get("replace_on_changes") or [])
        for f in fields:
            rep = first_rule(REPLACE_ON_CHANGE.get(rtype, ()), f["path"], f["old"], f["new"], oi, ni)
            if rep is None and own and is_ignored(f["path"], own):
                rep = FieldRule(f["path"], "replace_on_changes: the program replaces the resource on this change")
            dis = None if rep else first_rule(DISRUPTIVE_ON_CHANGE.get(rtype, ()), f["path"], f["old"], f["new"], oi, ni)
            f["replaces"] = rep is not None
            f["disrupts"] = dis is not None
            rule = rep or dis
            f["note"] = rule.note if rule else ""
        replace = any(f["replaces"] for f in fields)
        entry["action"] = "replace" if replace else "update"
        entry["disruptive"] = replace or any(f["disrupts"] for f in fields)
    propagate_template_versions(changed, n_idx)
    plan_old = {k: v for k, v in old.items() if k not in IGNORED_DOC_KEYS}
    plan_new = {k: v for k, v in new.items() if k not in IGNORED_DOC_KEYS}
    ow, nw = list(old.get("warnings", [])), list(new.get("warnings", []))
    return {
        "summary": {
            "added": len(added),
            "removed": len(removed),
            "changed": len(changed),
            "replaced": sum(1 for c in changed if c["action"] == "replace"),
            "disruptive": sum(1 for c in changed if c["disruptive"] and c["action"] != "replace"),
            # Node groups whose nodes are all replaced by a rolling update (a new launch-template
            # version, AMI release or Kubernetes version): the weights load again on every node.
            "recycled": sum(
                1 for c in changed if c["type"] in RECYCLED_ON_UPDATE and c["disruptive"] and c["action"] != "replace"
            ),
        },
        "added": added,
        "removed": removed,
        "changed": changed,
        "vllm": _diff_vllm(old.get("vllm", {}), new.get("vllm", {})),
        "plan": diff_values(plan_old, plan_new),
        "ignored": ignored,
        "warnings": {"added": [w for w in nw if w not in ow], "removed": [w for w in ow if w not in nw]},
        "secret_leaks": list(new.get("secret_leaks", [])),
    }


def has_changes(diff: Mapping[str, Any]) -> bool:
    """Whether anything at all differs."""
    s = diff["summary"]
    return bool(
        s["added"] or s["removed"] or s["changed"] or diff["plan"] or diff["vllm"]["fields"] or diff["vllm"]["roles"]
        or diff["warnings"]["added"] or diff["warnings"]["removed"]
    )

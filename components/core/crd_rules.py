"""Transition rules of the CRDs the project renders: which changes of a custom resource the API
server refuses, so that only a replacement (delete, then create) can apply them.

A CRD's ``x-kubernetes-validations`` rule that reads ``oldSelf`` is a transition rule (Kubernetes
docs, "Validation rules", Transition rules): it is evaluated on update only, with ``self`` the new
value and ``oldSelf`` the stored one at the same schema node, and the update is refused when it
is false. pulumi-kubernetes applies a changed custom resource with a patch (no field of a custom
resource is in its ``forcenew.go``), so a refused change fails ``pulumi up`` unless the resource's
``replace_on_changes`` names the path.

``TRANSITION_RULES`` is the table, recorded from the pinned CRDs (``scripts/dev/crds.py``: LWS
v0.9.0, the NVIDIA DRA driver v25.12.0, KEDA v2.20.2, prometheus-operator v0.93.0);
``transition_rules_of`` reads them from a CRD document, and tests/test_crd_rules.py checks that the
table is exactly what the pinned files say. Consumers:

- the resource options: ``replace_on_changes(api_version, kind)``, the paths of rules that refuse
  every change (``self == oldSelf``): Pulumi then replaces the resource on any change there;
- the plan diff (``scripts/ops/diff/rules.py``): a changed input under a rule's path is a
  replacement when the rule, evaluated with CEL on the old and new value
  (``update_refused``), is false.

A rule that is more than ``self == oldSelf`` (a value that may only grow, a field that may be set
once) refuses only some changes; ``replace_on_changes`` cannot say which, so it is not listed there
(Pulumi would replace on changes the API server accepts) and only the diff, evaluating it, marks
the changes it refuses. Pure: no Pulumi; CEL by cel-python (``celpy``, requirements.txt).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# The CEL variable of the stored value in a transition rule.
OLD_SELF = "oldSelf"
_OLD_SELF_REF = re.compile(r"\boldSelf\b")
# Rules that refuse every change of their node (whitespace ignored).
_IMMUTABLE_RULES = frozenset({"self==oldSelf", "oldSelf==self"})


@dataclass(frozen=True)
class TransitionRule:
    """One ``x-kubernetes-validations`` rule that reads ``oldSelf``.

    Attributes:
        api_version: ``group/version`` of the served version that carries it.
        kind: the CRD's kind.
        path: the schema node, as a dotted property path from the object's root (``spec``,
            ``spec.channel``); list items are ``[*]``, map values ``{*}``.
        rule: the CEL expression.
        message: the API server's message when it is false.
        source: the CRD file and release it was read from.
    """

    api_version: str
    kind: str
    path: str
    rule: str
    message: str
    source: str = ""

    @property
    def immutable(self) -> bool:
        """True when the rule refuses every change of its node (``self == oldSelf``)."""
        return re.sub(r"\s+", "", self.rule) in _IMMUTABLE_RULES


def _walk(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), Mapping):
        yield from _walk(schema["items"], f"{path}[*]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from _walk(schema["additionalProperties"], f"{path}{{*}}")


def validation_rules_of(crd: Mapping[str, Any], source: str = "") -> tuple[TransitionRule, ...]:
    """Every ``x-kubernetes-validations`` rule of one CRD document (``apiextensions.k8s.io/v1``),
    every served version, as ``TransitionRule`` records (``is_transition`` tells them apart).

    Args:
        crd: the parsed CustomResourceDefinition.
        source: recorded on each rule (file and release).

    Returns:
        Rules in schema order: versions as listed, then depth first, properties as listed.

    Raises:
        KeyError: ``crd`` is not a CRD document (no ``spec.group``, ``spec.names.kind`` or ``spec.versions``).
    """
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    out: list[TransitionRule] = []
    for version in crd["spec"]["versions"]:
        if not version.get("served", True):
            continue
        schema = ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
        for path, node in _walk(schema, ""):
            for entry in node.get("x-kubernetes-validations") or ():
                out.append(TransitionRule(f"{group}/{version['name']}", kind, path, str(entry.get("rule", "")),
                                          str(entry.get("message", "")), source))
    return tuple(out)


def is_transition(rule: TransitionRule) -> bool:
    """Whether ``rule`` reads ``oldSelf`` (evaluated on update only)."""
    return bool(_OLD_SELF_REF.search(rule.rule))


def transition_rules_of(crd: Mapping[str, Any], source: str = "") -> tuple[TransitionRule, ...]:
    """The transition rules (those that read ``oldSelf``) of one CRD document: ``validation_rules_of``
    filtered by ``is_transition``.

    Raises:
        KeyError: ``crd`` is not a CRD document.
    """
    return tuple(r for r in validation_rules_of(crd, source) if is_transition(r))


def object_refused(rule: TransitionRule, obj: Any) -> bool:
    """Whether a rule that does not read ``oldSelf`` refuses ``obj`` (on create and update alike):
    evaluated with CEL at the rule's node when ``obj`` holds it (``[*]``/``{*}`` nodes: every item).

    Raises:
        ValueError: the rule is a transition rule, or does not evaluate to a bool (``evaluate``).
    """
    if is_transition(rule):
        raise ValueError(f"{rule.kind} {rule.path}: {rule.rule!r} reads oldSelf (see update_refused)")
    return any(not evaluate(rule.rule, value, None) for value in _values_at(obj, rule.path))


def _values_at(obj: Any, path: str) -> list[Any]:
    steps = re.findall(r"[^.\[\]{}]+|\[\*\]|\{\*\}", path)
    current = [obj]
    for step in steps:
        nxt: list[Any] = []
        for value in current:
            if step == "[*]" and isinstance(value, list):
                nxt += value
            elif step == "{*}" and isinstance(value, Mapping):
                nxt += list(value.values())
            elif isinstance(value, Mapping) and step in value:
                nxt.append(value[step])
        current = nxt
    return current


# Recorded from the pinned CRDs (scripts/dev/crds.py); tests/test_crd_rules.py reads them again.
# The LeaderWorkerSet (v0.9.0), ScaledObject and TriggerAuthentication (KEDA v2.20.2), PodMonitor,
# ServiceMonitor and PrometheusRule (prometheus-operator v0.93.0) CRDs have no rule that reads oldSelf.
TRANSITION_RULES: tuple[TransitionRule, ...] = (
    TransitionRule(
        "resource.nvidia.com/v1beta1", "ComputeDomain", "spec", "self == oldSelf", "A computeDomain.spec is immutable",
        "NVIDIA/k8s-dra-driver-gpu v25.12.0 deployments/helm/nvidia-dra-driver-gpu/crds/resource.nvidia.com_computedomains.yaml",
    ),
)


def rules_for(api_version: str, kind: str, rules: tuple[TransitionRule, ...] = TRANSITION_RULES) -> tuple[TransitionRule, ...]:
    """The transition rules of ``kind`` at ``api_version`` (``resource.nvidia.com/v1beta1``)."""
    return tuple(r for r in rules if r.api_version == api_version and r.kind == kind)


def replace_on_changes(api_version: str, kind: str, rules: tuple[TransitionRule, ...] = TRANSITION_RULES) -> list[str]:
    """Pulumi ``replace_on_changes`` paths of a custom resource: the nodes whose rules refuse every
    change (``TransitionRule.immutable``), in table order, without duplicates. List and map nodes
    (``[*]``, ``{*}``) are given as Pulumi property paths with ``[*]`` / ``.*``."""
    paths = [r.path.replace("{*}", ".*") for r in rules_for(api_version, kind, rules) if r.immutable]
    return list(dict.fromkeys(paths))


_MISSING = object()


def value_at(obj: Any, path: str, index_path: str | None = None) -> Any:
    """The value at a rule's ``path`` in ``obj`` (a manifest or a resource's inputs), or a sentinel
    object when it is absent. ``[*]`` and ``{*}`` steps take the index or key found at the same
    place in ``index_path`` (a concrete changed path such as ``spec.items[2].name``); without one,
    the node is absent."""
    steps = re.findall(r"[^.\[\]{}]+|\[\*\]|\{\*\}", path)
    concrete = re.findall(r"[^.\[\]]+|\[\d+\]", index_path or "")
    cur = obj
    for i, step in enumerate(steps):
        if step in ("[*]", "{*}"):
            pick = concrete[i] if i < len(concrete) else None
            if pick is None:
                return _MISSING
            key: Any = int(pick[1:-1]) if step == "[*]" and pick.startswith("[") else pick
        else:
            key = step
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return cur


def evaluate(rule: str, new: Any, old: Any) -> bool:
    """Evaluate a transition rule with cel-python: ``self`` = ``new``, ``oldSelf`` = ``old`` (JSON values).

    Raises:
        ValueError: the rule does not compile or does not evaluate to a bool (the message names it).
    """
    import celpy  # cel-python (requirements.txt)
    from celpy import celtypes

    env = celpy.Environment()
    try:
        program = env.program(env.compile(rule))
    except celpy.CELParseError as err:
        raise ValueError(f"CEL rule {rule!r} does not compile: {str(err).splitlines()[0]}") from err
    try:
        result = program.evaluate({"self": celpy.json_to_cel(new), "oldSelf": celpy.json_to_cel(old)})
    except celpy.CELEvalError as err:
        raise ValueError(f"CEL rule {rule!r} fails to evaluate: {err}") from err
    if not isinstance(result, celtypes.BoolType):
        raise ValueError(f"CEL rule {rule!r} evaluated to {result!r}, not a bool")
    return bool(result)


def update_refused(rule: TransitionRule, old_obj: Any, new_obj: Any, changed_path: str | None = None) -> bool:
    """Whether the API server refuses updating ``old_obj`` to ``new_obj`` by ``rule``: the rule
    is evaluated only where the node exists in both (a transition rule is skipped when the old or
    the new value is absent), and refuses when it is false.

    Args:
        rule: the transition rule.
        old_obj, new_obj: the stored and the new object (manifest or resource inputs).
        changed_path: the concrete changed path, to resolve ``[*]``/``{*}`` steps of the rule's path.

    Raises:
        ValueError: the rule does not evaluate to a bool (``evaluate``).
    """
    old, new = value_at(old_obj, rule.path, changed_path), value_at(new_obj, rule.path, changed_path)
    if old is _MISSING or new is _MISSING:
        return False
    return not evaluate(rule.rule, new, old)


__all__ = [
    "OLD_SELF", "TRANSITION_RULES", "TransitionRule", "evaluate", "is_transition", "object_refused", "replace_on_changes",
    "rules_for", "transition_rules_of", "update_refused", "validation_rules_of", "value_at",
]

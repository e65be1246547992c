"""Config-time validation of the free-form Kubernetes fields against the Kubernetes schema.

``kubernetes.tolerations`` and ``kubernetes.nodeSelector`` go into pod specs verbatim. They are
validated here, naming the key, instead of failing at the API server half-way through
``pulumi up``:

1. Structure and types: JSON Schema (``jsonschema``, a runtime requirement) against the fragment
   shipped in ``data/k8s_scheduling_schema.json``: ``PodSpec.nodeSelector`` and
   ``io.k8s.api.core.v1.Toleration`` extracted from kubernetes-validate 1.37.0's
   ``kubernetes-json-schema/v<version>-local-strict`` with the descriptions removed. The structure
   is the same for Kubernetes 1.25 to 1.37 (the file lists them and names its source);
   tests/test_k8s_config_schema.py re-derives it from the installed dev dependency and requires
   the pinned ``versions.KUBERNETES_VERSION`` among them. Strict: unknown fields
   (``tolerationSecond``) are errors. The runtime needs only ``jsonschema``, not the 40 MB
   kubernetes-validate.
2. What the schema leaves to the API server (``ValidateTolerations`` and label validation in
   kubernetes/kubernetes ``pkg/apis/core/validation/validation.go``): operator ``Equal`` or
   ``Exists``; an empty key needs ``Exists``; ``Exists`` takes no value; effect ``NoSchedule``,
   ``PreferNoSchedule`` or ``NoExecute``; ``tolerationSeconds`` only with ``NoExecute``; label
   keys are qualified names and values label values (``limits``).

Affinity is not a config key (the program derives node affinity itself), so it has no check here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from .limits import label_key_problem, label_value_problem

SCHEMA_FILE = Path(__file__).with_name("data") / "k8s_scheduling_schema.json"
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@lru_cache(maxsize=1)
def scheduling_schema() -> dict[str, Any]:
    """The shipped schema fragment: ``{"source", "kubernetesVersions", "nodeSelector", "toleration"}``."""
    return json.loads(SCHEMA_FILE.read_text())


def _schema_error(schema: Mapping[str, Any], value: Any) -> tuple[str, str] | None:
    """``(path inside value, message)`` of the first JSON Schema error, or None."""
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    err = errors[0]
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
    return path, err.message


def tolerations_problem(tolerations: Sequence[Any]) -> tuple[str, Any, str] | None:
    """The first problem of ``kubernetes.tolerations`` as ``(suffix of the key, value, why)``, or None."""
    schema = scheduling_schema()["toleration"]
    for i, tol in enumerate(tolerations):
        found = _schema_error(schema, tol)
        if found:
            return f"[{i}]{found[0]}", tol, f"does not match the Kubernetes Toleration schema: {found[1]}"
        key = tol.get("key") or ""
        operator = tol.get("operator") or "Equal"
        effect = tol.get("effect") or ""
        value = tol.get("value") or ""
        if operator not in TOLERATION_OPERATORS:
            return (
                f"[{i}].operator",
                tol.get("operator"),
                f"is not a toleration operator (allowed: {', '.join(TOLERATION_OPERATORS)})",
            )
        if not key and operator != "Exists":
            return f"[{i}].operator", tol.get("operator"), "must be Exists when the key is empty (tolerate every taint)"
        if key and (why := label_key_problem(key)):
            return f"[{i}].key", key, why
        if operator == "Exists" and value:
            return f"[{i}].value", value, "must be empty when operator is Exists"
        if operator == "Equal" and (why := label_value_problem(value)):
            return f"[{i}].value", value, why
        if effect and effect not in TAINT_EFFECTS:
            return f"[{i}].effect", effect, f"is not a taint effect (allowed: {', '.join(TAINT_EFFECTS)}, or empty for all)"
        if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
            return f"[{i}].tolerationSeconds", tol["tolerationSeconds"], "is only allowed with effect NoExecute"
    return None


def node_selector_problem(selector: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    """The first problem of ``kubernetes.nodeSelector`` as ``(suffix of the key, value, why)``, or None."""
    found = _schema_error(scheduling_schema()["nodeSelector"], dict(selector))
    if found:
        return found[0], dict(selector), f"does not match the Kubernetes nodeSelector schema: {found[1]}"
    for key, value in selector.items():
        if why := label_key_problem(key):
            return f".{key}", key, why
        if why := label_value_problem(value or ""):
            return f".{key}", value, why
    return None

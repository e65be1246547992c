"""Every Kubernetes object in every stack's plan validates against the Kubernetes OpenAPI schema
of the pinned minor version (kubernetes-validate, strict: unknown fields fail), and the
LeaderWorkerSet and ComputeDomain objects against the upstream CRD schemas read from
``$KIMI_CRDS_DIR`` or ``.crds`` (``make crds``: the pinned upstream releases, scripts/dev/crds.py). Helm releases
are not manifests: their chart, version and values are asserted in test_k8s_workloads.py."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from components.core import crd_rules
from components.core.versions import KUBERNETES_VERSION
from scripts.dev.crds import CRDS, DEFAULT_DEST
from scripts.dev.crds import verify as verify_crds
from tests.conftest import plan_for
from tests.test_k8s_workloads import K8S_STACKS, k8s_objects, manifest, of_kind, one

CRDS_ENV = "KIMI_CRDS_DIR"
# Kinds with an upstream CRD in $KIMI_CRDS_DIR (file name per kind).
CRD_FILES = {
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "ComputeDomain": "resource.nvidia.com_computedomains.yaml",
    "ScaledObject": "keda.sh_scaledobjects.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}
# Custom resources of a model copy spanning nodes (the others come with autoscaling/observability).
MULTI_NODE_KINDS = {"LeaderWorkerSet", "ComputeDomain"}
NOT_CORE = set(CRD_FILES)
# Every pinned CRD (scripts/dev/crds.py: project, tag, sha256), the loader's table.
ALL_CRD_FILES = {c.kind: c.file for c in CRDS}


def validate_core(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def crds_dir() -> Path:
    """``$KIMI_CRDS_DIR``, else ``.crds`` (``make crds``). Missing: skip on a laptop, FAIL under
    ``CI=true`` (the schema tests must never be skipped in CI)."""
    value = os.environ.get(CRDS_ENV)
    path = Path(value) if value else DEFAULT_DEST
    if not path.is_dir():
        why = (f"{CRDS_ENV}={value} is not a directory" if value else
               f"{CRDS_ENV} is not set and {DEFAULT_DEST.name}/ does not exist")
        message = f"{why}: run `make crds` (downloads the pinned upstream CRDs) or point {CRDS_ENV} at a local copy"
        if _ci():
            pytest.fail(f"CI=true and the CRD schema tests cannot run: {message}", pytrace=False)
        pytest.skip(message)
    return path


@functools.cache
def _load_crd(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def crd_schema(kind: str, api_version: str) -> dict[str, Any]:
    """The openAPIV3Schema of ``kind`` at ``api_version`` from its CRD file."""
    crd = _load_crd(crds_dir() / ALL_CRD_FILES[kind])
    group, _, version = api_version.partition("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            assert entry["served"], f"{kind} {api_version} is not served"
            return entry["schema"]["openAPIV3Schema"]
    raise AssertionError(f"{kind}: no version {version} in the CRD")


def unknown_fields(instance: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server would prune (not in a structural schema's properties)."""
    found: list[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return found
    if isinstance(instance, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            if props is not None and key in props:
                found += unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None and extra is not True and not (path == "" and key in ("apiVersion", "kind", "metadata")):
                found.append(f"{path}.{key}")
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(instance):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def validate_against_crd(doc: dict[str, Any]) -> None:
    """jsonschema validation plus unknown-field detection against the upstream CRD.

    Raises:
        jsonschema.ValidationError: a value violates the schema.
        AssertionError: a field is not in the schema (the API server would drop it silently).
    """
    schema = crd_schema(doc["kind"], doc["apiVersion"])
    jsonschema.Draft7Validator(schema).validate(doc)
    pruned = unknown_fields(doc, schema)
    assert not pruned, f"{doc['kind']}: fields not in the CRD schema: {pruned}"
    # The CRD's CEL rules (x-kubernetes-validations) that hold on create, evaluated with cel-python.
    crd = _load_crd(crds_dir() / ALL_CRD_FILES[doc["kind"]])
    for rule in crd_rules.validation_rules_of(crd):
        if rule.api_version == doc["apiVersion"] and not crd_rules.is_transition(rule):
            if crd_rules.object_refused(rule, doc):
                raise jsonschema.ValidationError(f"{doc['kind']} .{rule.path}: {rule.message} ({rule.rule})")


# -- core objects ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", K8S_STACKS)
def test_every_core_object_validates_against_the_kubernetes_schema(name):
    run = plan_for(name)
    checked = 0
    for res in k8s_objects(run):
        doc = manifest(res)
        if doc["kind"] in NOT_CORE:
            continue
        try:
            validate_core(doc)
        except kubernetes_validate.ValidationError as err:  # pragma: no cover - failure path
            pytest.fail(f"{name}: {res.type} {res.name}: {err}")
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("name", [s for s in K8S_STACKS if of_kind(plan_for(s), "LeaderWorkerSet")])
def test_leaderworkerset_pod_templates_validate_as_core_pod_templates(name):
    tmpl = one(plan_for(name), "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        validate_core(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"check-{role.lower()}"}, "template": tmpl[role]}
        )


def test_pod_monitor_is_validated_by_fields():
    from tests.test_k8s_workloads import with_k8s

    run = plan_for("mi355x", overrides=with_k8s("mi355x", installedAddons=["amd-gpu-operator", "prometheus-operator"]))
    monitor = one(run, "PodMonitor")
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
    validate_core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": monitor["metadata"]})  # metadata is valid ObjectMeta


def test_core_validation_can_fail():
    deployment = one(plan_for("mi355x"), "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(broken)
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["startupProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(typo)


def test_pinned_kubernetes_minor_is_shipped_by_the_validator():
    assert KUBERNETES_VERSION in kubernetes_validate.utils.all_versions() or any(
        kubernetes_validate.utils.major_minor(v) == KUBERNETES_VERSION for v in kubernetes_validate.utils.all_versions()
    )
    version = kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}, KUBERNETES_VERSION, strict=True
    )
    assert version == KUBERNETES_VERSION


# -- custom resources ------------------------------------------------------------------------------


def _custom_resources(name: str) -> list[dict]:
    return [manifest(r) for r in k8s_objects(plan_for(name)) if r.inputs.get("kind") in CRD_FILES]


@pytest.mark.parametrize("name", [s for s in K8S_STACKS if _custom_resources(s)])
def test_custom_resources_validate_against_upstream_crds(name):
    for doc in _custom_resources(name):
        validate_against_crd(doc)


@pytest.mark.parametrize("name", K8S_STACKS)
def test_only_multi_node_copies_declare_custom_resources(name):
    multi_node = plan_for(name).context.spec.nodes_per_copy > 1
    assert bool([d for d in _custom_resources(name) if d["kind"] in MULTI_NODE_KINDS]) == multi_node


def test_gb300_has_both_custom_resources():
    kinds = sorted(manifest(r)["kind"] for r in k8s_objects(plan_for("gb300")) if r.inputs.get("kind") in MULTI_NODE_KINDS)
    assert kinds == ["ComputeDomain", "LeaderWorkerSet"]


def test_crd_validation_can_fail():
    run = plan_for("gb300")
    lws = one(run, "LeaderWorkerSet")
    bad_policy = copy.deepcopy(lws)
    bad_policy["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        validate_against_crd(bad_policy)
    typo = copy.deepcopy(lws)
    typo["spec"]["leaderWorkerTemplate"]["groupSize"] = 2
    with pytest.raises(AssertionError, match="groupSize"):
        validate_against_crd(typo)
    cd = copy.deepcopy(one(run, "ComputeDomain"))
    cd["spec"]["numNodes"] = -1
    with pytest.raises(jsonschema.ValidationError):
        validate_against_crd(cd)


# -- the pinned CRDs themselves --------------------------------------------------------------------


def test_the_crd_directory_matches_the_pins():
    """The files the tests read are the pinned upstream releases (scripts/dev/crds.py sha256s)."""
    assert verify_crds(crds_dir()) == []


@pytest.mark.parametrize("crd", CRDS, ids=lambda c: c.kind)
def test_every_pinned_crd_loads_with_a_structural_schema(crd):
    schema = crd_schema(crd.kind, crd.api_version)
    assert schema["type"] == "object" and "spec" in schema["properties"]


def test_crd_cel_rules_are_evaluated_on_the_rendered_objects():
    """KEDA's ScaledObject CRD refuses minReplicaCount above maxReplicaCount by a CEL rule, which
    jsonschema does not read: validate_against_crd evaluates it."""
    scaled = one(plan_for("mi355x"), "ScaledObject")
    validate_against_crd(scaled)
    broken = copy.deepcopy(scaled)
    broken["spec"]["minReplicaCount"] = broken["spec"]["maxReplicaCount"] + 1
    jsonschema.Draft7Validator(crd_schema("ScaledObject", broken["apiVersion"])).validate(broken)  # the schema alone passes
    with pytest.raises(jsonschema.ValidationError, match="minReplicaCount must be less than or equal to maxReplicaCount"):
        validate_against_crd(broken)


def test_pod_monitor_validates_against_the_prometheus_operator_crd():
    from tests.test_k8s_workloads import with_k8s

    run = plan_for("mi355x", overrides=with_k8s("mi355x", installedAddons=["amd-gpu-operator", "prometheus-operator"]))
    monitor = one(run, "PodMonitor")
    validate_against_crd(monitor)
    typo = copy.deepcopy(monitor)
    typo["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    with pytest.raises(AssertionError, match="intervall"):
        validate_against_crd(typo)


def test_missing_crds_fail_under_ci_and_skip_elsewhere(tmp_path):
    import subprocess
    import sys

    test = f"{Path(__file__).resolve()}::test_the_crd_directory_matches_the_pins"
    env = {**os.environ, CRDS_ENV: str(tmp_path / "absent")}
    for ci, expected in (("true", 1), ("", 0)):
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", test],
                             env={**env, "CI": ci}, capture_output=True, text=True, timeout=120)
        assert out.returncode == expected, out.stdout[-2000:]
        assert "make crds" in out.stdout

"""Objects the controllers create on their own (components/core/controller_objects.py): no object a
stack declares takes the kind, namespace and name of one of them, on every Kubernetes stack, as
shipped and with autoscaling on (KEDA, and the HPA controller); and the client Service selects
only the pods that serve the API (on a LeaderWorkerSet the leader, read from the labels the LWS
controller gives its pods)."""

from __future__ import annotations

from typing import Any

import pytest

from components.core import controller_objects as co
from components.core.config import read_stack_config
from components.core.naming import VLLM_CLIENT_SERVICE
from components.k8s.common import VLLM_NAME
from tests.conftest import plan_for
from tests.test_autoscaling import TURN_ON
from tests.test_k8s_workloads import HELM_RELEASE, K8S_STACKS, k8s_objects, manifest, of_kind, one


def _hpa(name: str) -> dict[str, Any]:
    """``TURN_ON[name]`` with ``autoscaling.controller: hpa`` (and the adapter it needs)."""
    turn_on = dict(TURN_ON[name]) or {"kimi-deploy:autoscaling": dict(read_stack_config(name)["kimi-deploy:autoscaling"])}
    k8s_cfg = dict(turn_on.get("kimi-deploy:kubernetes") or read_stack_config(name)["kimi-deploy:kubernetes"])
    k8s_cfg["installedAddons"] = [*k8s_cfg.get("installedAddons", []), "prometheus-adapter"]
    return {**turn_on, "kimi-deploy:autoscaling": {**turn_on["kimi-deploy:autoscaling"], "controller": "hpa"},
            "kimi-deploy:kubernetes": k8s_cfg}


VARIANTS = ["shipped", "keda", "hpa"]


def run_of(name: str, variant: str):
    """The mock run of ``name`` as shipped, autoscaled by KEDA, or autoscaled by an HPA."""
    if variant == "hpa":
        return plan_for(name, overrides=_hpa(name))
    if variant == "keda" and TURN_ON[name]:
        return plan_for(name, overrides=TURN_ON[name])
    return plan_for(name)  # mi355x ships autoscaled by KEDA


def declared(run) -> list[dict[str, Any]]:
    """Every object the stack declares, as manifests; Helm releases as ``HELM_RELEASE_KIND``."""
    out = [manifest(r) for r in k8s_objects(run)]
    for release in (r for r in run.resources if r.type == HELM_RELEASE):
        out.append({
            "kind": co.HELM_RELEASE_KIND,
            "metadata": {"name": release.inputs["name"], "namespace": release.inputs["namespace"]},
            "spec": {"createNamespace": bool(release.inputs.get("createNamespace"))},
        })
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", K8S_STACKS)
def test_no_declared_object_takes_the_name_of_one_a_controller_creates(name, variant):
    run = run_of(name, variant)
    objects = declared(run)
    if variant != "shipped":
        kind = "HorizontalPodAutoscaler" if variant == "hpa" else "ScaledObject"
        assert of_kind(run, kind), f"{name}/{variant}: no {kind}: autoscaling is not on"
    found = co.collisions(objects)
    assert not found, "\n".join(
        f"{name}/{variant}: {ref.kind} {ref.namespace}/{ref.name} is also created by {p.row.controller} for "
        f"{p.owner.kind} {p.owner.name} ({p.row.source})" for ref, p in found
    )


@pytest.mark.parametrize("name", sorted(TURN_ON))
def test_switching_the_scaler_from_keda_to_an_hpa_takes_no_name_keda_holds(name):
    """`pulumi up` creates the new objects before it deletes the old ones: the HPA declared for
    `controller: hpa` is created while the ScaledObject's HPA (KEDA's) still exists."""
    before = [o for o in declared(run_of(name, "keda")) if o["kind"] == "ScaledObject"]
    after = [o for o in declared(run_of(name, "hpa")) if o["kind"] == "HorizontalPodAutoscaler"]
    assert before and after
    found = co.collisions(before + after)
    assert not found, [(ref.name, p.row.source) for ref, p in found]


def test_the_check_finds_a_client_service_named_after_the_leaderworkerset():
    """The declaration gb300 had: its client Service named like the set. The LWS controller
    creates that Service itself (headless, every pod of the group)."""
    objects = declared(plan_for("gb300"))
    service = next(o for o in objects if o["kind"] == "Service")
    service["metadata"]["name"] = VLLM_NAME
    found = co.collisions(objects)
    assert [(ref.kind, ref.name, p.owner.kind) for ref, p in found] == [("Service", VLLM_NAME, "LeaderWorkerSet")]
    assert "reconcileHeadlessServices" in found[0][1].row.source


def test_the_check_finds_names_keda_deployments_and_charts_take():
    lws = {"kind": "LeaderWorkerSet", "metadata": {"name": "m", "namespace": "ns"}, "spec": {}}
    unique = {**lws, "spec": {"networkConfig": {"subdomainPolicy": "UniquePerReplica"}}}
    scaled = {"kind": "ScaledObject", "metadata": {"name": "m", "namespace": "ns"}, "spec": {}}
    named = {**scaled, "spec": {"advanced": {"horizontalPodAutoscalerConfig": {"name": "m-hpa"}}}}
    deployment = {"kind": "Deployment", "metadata": {"name": "m", "namespace": "ns"}}
    release = {"kind": co.HELM_RELEASE_KIND, "metadata": {"name": "keda", "namespace": "keda"},
               "spec": {"createNamespace": True}}
    namespace = {"kind": "Namespace", "metadata": {"name": "ns"}}

    def hits(owner: dict[str, Any], kind: str, ns: str | None, obj: str) -> bool:
        return bool(co.collisions([owner, {"kind": kind, "metadata": {"name": obj, **({"namespace": ns} if ns else {})}}]))

    assert hits(lws, "Service", "ns", "m") and not hits(lws, "Service", "ns", "m-api") and not hits(lws, "Service", "x", "m")
    assert hits(unique, "Service", "ns", "m-0") and not hits(unique, "Service", "ns", "m")
    assert hits(lws, "StatefulSet", "ns", "m") and hits(lws, "StatefulSet", "ns", "m-1")
    assert hits(scaled, "HorizontalPodAutoscaler", "ns", "keda-hpa-m")
    assert hits(named, "HorizontalPodAutoscaler", "ns", "m-hpa")
    assert not hits(named, "HorizontalPodAutoscaler", "ns", "keda-hpa-m")
    assert hits(deployment, "ReplicaSet", "ns", "m-7d4b9c8f5b") and not hits(deployment, "ReplicaSet", "ns", "m")
    assert hits(release, "ConfigMap", "keda", "anything") and hits(release, "Namespace", None, "keda")
    assert hits(namespace, "ServiceAccount", "ns", "default") and hits(namespace, "ConfigMap", "ns", "kube-root-ca.crt")


def test_every_row_names_its_source_at_a_version():
    for row in co.CREATED_OBJECTS:
        assert row.source.startswith("https://"), row
        assert row.controller and row.owner_kind and row.kind, row


# -- the client Service ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", K8S_STACKS)
def test_client_service_has_its_own_name_and_the_outputs_name_it(name):
    run = plan_for(name)
    service = one(run, "Service")
    assert service["metadata"]["name"] == VLLM_CLIENT_SERVICE != VLLM_NAME
    ns = run.context.spec.config.kubernetes.namespace
    assert run.outputs["serviceUrl"] == f"http://{VLLM_CLIENT_SERVICE}.{ns}.svc.cluster.local:8000/v1"


def test_gb300_client_service_selects_the_leader_and_never_a_worker():
    run = plan_for("gb300")
    selector = one(run, "Service")["spec"]["selector"]
    lws = one(run, "LeaderWorkerSet")
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    size = tmpl["size"]
    lws_name = lws["metadata"]["name"]
    for group in range(2):
        leader = co.lws_pod_labels(lws_name, tmpl["leaderTemplate"]["metadata"]["labels"], group, 0)
        assert co.selector_matches(selector, leader), (selector, leader)
        for index in range(1, size):
            worker = co.lws_pod_labels(lws_name, tmpl["workerTemplate"]["metadata"]["labels"], group, index)
            assert not co.selector_matches(selector, worker), (selector, worker)
    # The controller's own Service selects every pod of the group (the worker serves no HTTP).
    lws_service_selector = {co.LWS_SET_NAME_LABEL: lws_name}
    worker = co.lws_pod_labels(lws_name, tmpl["workerTemplate"]["metadata"]["labels"], 0, 1)
    assert co.selector_matches(lws_service_selector, worker)
    # Even with a worker template labelled like the leader, the LWS leader mark keeps workers out.
    same = co.lws_pod_labels(lws_name, tmpl["leaderTemplate"]["metadata"]["labels"], 0, 1)
    assert not co.selector_matches(selector, same)


@pytest.mark.parametrize("name", ["b300-prod", "mi355x"])
def test_single_node_client_service_selects_the_server_pods(name):
    run = plan_for(name)
    selector = one(run, "Service")["spec"]["selector"]
    labels = one(run, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert co.selector_matches(selector, labels)
    assert co.LWS_WORKER_INDEX_LABEL not in selector

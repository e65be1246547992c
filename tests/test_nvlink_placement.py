"""GB300: the GPU nodes get their NVLink clique label (GPU Feature Discovery with NFD), and a
LeaderWorkerSet group is scheduled into one clique (a required pod affinity on the label, keyed to
the group by ``matchLabelKeys``). The scheduler's rule is modelled after kube-scheduler's
interpodaffinity filter (``satisfyPodAffinity``) and the API server's ``matchLabelKeys`` merge."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate

from components.core.controller_objects import LWS_GROUP_KEY_LABEL, lws_pod_labels
from components.core.naming import GPU_TAINT_KEY
from components.core.targets import NVLINK_CLIQUE_LABEL
from components.core.versions import KUBERNETES_VERSION
from components.k8s import addons as k8s_addons
from components.k8s.common import VLLM_NAME, gpu_placement
from tests.conftest import plan_for
from tests.test_k8s_workloads import HELM_RELEASE, one


def _device_plugin_values(stack: str) -> dict[str, Any]:
    [release] = [r for r in plan_for(stack).of_type(HELM_RELEASE) if r.name == "addon-nvidia-device-plugin"]
    return release.inputs["values"]


def test_gb300_runs_gpu_feature_discovery_with_nfd_on_the_gpu_nodes():
    values = _device_plugin_values("gb300")
    assert values["gfd"] == {"enabled": True}
    # The subchart's condition is `nfd.enabled,gfd.enabled`: the first that is set decides.
    assert values["nfd"]["enabled"] is True
    spec = plan_for("gb300").context.spec
    worker = values["nfd"]["worker"]
    assert {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in worker["tolerations"]
    assert worker["nodeSelector"] == gpu_placement(spec).node_selector_dict()
    assert values == k8s_addons.addon_values(spec, "nvidia-device-plugin")


def test_single_node_copies_install_no_feature_discovery():
    values = _device_plugin_values("b300-prod")
    assert values["gfd"] == {"enabled": False} and values["nfd"] == {"enabled": False}


def _templates() -> dict[str, dict[str, Any]]:
    tmpl = one(plan_for("gb300"), "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    return {"leader": tmpl["leaderTemplate"], "worker": tmpl["workerTemplate"]}


def test_both_templates_require_the_group_in_one_clique():
    for role, template in _templates().items():
        [term] = template["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == NVLINK_CLIQUE_LABEL, role
        assert term["matchLabelKeys"] == [LWS_GROUP_KEY_LABEL], role
        # API validation: matchLabelKeys needs a labelSelector, and no key may be in both.
        keys = {e["key"] for e in term["labelSelector"]["matchExpressions"]}
        assert keys and LWS_GROUP_KEY_LABEL not in keys, role
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"check-{role}"}, "template": template},
            KUBERNETES_VERSION, strict=True,
        )


# -- a model of the scheduler's required pod affinity -------------------------------------------------


def _pod(role: str, group: int, index: int) -> dict[str, Any]:
    """A pod of group ``group`` as the API server stores it: template labels plus the controller's and
    webhook's (group key included), affinity terms with ``matchLabelKeys`` merged into the selector."""
    template = copy.deepcopy(_templates()[role])
    labels = lws_pod_labels(VLLM_NAME, template["metadata"]["labels"], group, index)
    labels[LWS_GROUP_KEY_LABEL] = f"group-key-{group}"
    terms = []
    for term in (template["spec"].get("affinity") or {}).get("podAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", []
    ):
        exprs = list(term["labelSelector"]["matchExpressions"])
        exprs += [{"key": k, "operator": "In", "values": [labels[k]]} for k in term.get("matchLabelKeys", []) if k in labels]
        terms.append({"topologyKey": term["topologyKey"], "match": exprs})
    return {"labels": labels, "terms": terms}


def _selects(exprs: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    for e in exprs:
        present = e["key"] in labels
        if e["operator"] == "In" and not (present and labels[e["key"]] in e["values"]):
            return False
        if e["operator"] == "Exists" and not present:
            return False
        if e["operator"] == "NotIn" and present and labels[e["key"]] in e["values"]:
            return False
    return True


def _feasible(pod: dict[str, Any], nodes: dict[str, dict[str, str]], placed: list[tuple[dict, str]]) -> set[str]:
    """Nodes where ``pod`` passes the required pod affinity (kube-scheduler interpodaffinity
    ``satisfyPodAffinity``: every term's topology label on the node; a matching scheduled pod in the
    node's domain for every term, or, when no scheduled pod matches any term anywhere, the pod's
    match of its own terms)."""
    counts: dict[tuple[str, str], int] = {}
    for term in pod["terms"]:
        for other, node in placed:
            value = nodes[node].get(term["topologyKey"])
            if value is not None and _selects(term["match"], other["labels"]):
                counts[(term["topologyKey"], value)] = counts.get((term["topologyKey"], value), 0) + 1
    self_match = all(_selects(t["match"], pod["labels"]) for t in pod["terms"])
    out = set()
    for name, labels in nodes.items():
        if any(t["topologyKey"] not in labels for t in pod["terms"]):
            continue
        if all(counts.get((t["topologyKey"], labels[t["topologyKey"]]), 0) > 0 for t in pod["terms"]):
            out.add(name)
        elif not counts and self_match:
            out.add(name)
    return out


NODES = {
    **{f"a{i}": {NVLINK_CLIQUE_LABEL: "uuid-1.1"} for i in range(3)},
    **{f"b{i}": {NVLINK_CLIQUE_LABEL: "uuid-1.2"} for i in range(3)},
    "unlabelled": {},
}


def test_a_worker_follows_its_leader_into_its_clique_and_groups_share_cliques():
    leader0 = _pod("leader", 0, 0)
    assert _feasible(leader0, NODES, []) == set(NODES) - {"unlabelled"}
    placed = [(leader0, "b1")]
    assert _feasible(_pod("worker", 0, 1), NODES, placed) == {"b0", "b1", "b2"}
    # A second group starts anywhere (not exclusive: several copies per NVL72 rack), including b's.
    leader1 = _pod("leader", 1, 0)
    assert _feasible(leader1, NODES, placed) == set(NODES) - {"unlabelled"}
    placed.append((leader1, "a0"))
    assert _feasible(_pod("worker", 1, 1), NODES, placed) == {"a0", "a1", "a2"}
    # A worker scheduled before its leader decides the clique the same way.
    worker2 = _pod("worker", 2, 1)
    assert _feasible(worker2, NODES, placed) == set(NODES) - {"unlabelled"}
    assert _feasible(_pod("leader", 2, 0), NODES, [*placed, (worker2, "a2")]) == {"a0", "a1", "a2"}


# -- preflight: the cluster's cliques hold every copy ---------------------------------------------------


def _node(name: str, clique: str | None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {NVLINK_CLIQUE_LABEL: clique} if clique else {}}}


def test_preflight_counts_copies_per_clique_not_gpu_nodes():
    from scripts.ops.preflight import check_nvlink_cliques

    spec = plan_for("gb300").context.spec
    assert spec.spans_nvlink_domain and spec.nodes_per_copy == 2 and spec.replicas == 1
    # Two GPU nodes, enough for the gpu-nodes check, but in two cliques: no copy fits.
    split = check_nvlink_cliques(spec, [_node("n1", "u.1"), _node("n2", "u.2")])
    assert split.status == "fail" and "hold 0 copy(ies) of 2 nodes; 1 needed" in split.reason
    unlabelled = check_nvlink_cliques(spec, [_node("n1", None), _node("n2", None)])
    assert unlabelled.status == "fail" and "2 GPU node(s) without nvidia.com/gpu.clique" in unlabelled.reason
    together = check_nvlink_cliques(spec, [_node("n1", "u.1"), _node("n2", "u.1"), _node("n3", "u.2")])
    assert together.status == "pass" and "hold 1 copy(ies)" in together.reason
    assert not plan_for("b300-prod").context.spec.spans_nvlink_domain

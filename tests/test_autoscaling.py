"""Replica autoscaling (issue 15): the config keys that turn it on for b300-prod, gb300 and
mi355x; the ScaledObject/HPA against the real schemas (KEDA CRD v2.20.2, Kubernetes OpenAPI);
scale-up early and scale-down later than a new replica takes; the scale target's scale
subresource; the plan's scaling envelope and its cost; config errors."""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import pytest
import yaml

from components.core.config import read_stack_config
from components.core.errors import ConfigError
from components.core.load import load_stack
from components.core.scaling import (
    HPA_MAX_POLICY_PERIOD_SECONDS,
    HPA_MAX_STABILIZATION_SECONDS,
    SCALE_DOWN_MARGIN_SECONDS,
    scaling_plan,
)
from components.core.sizing import compute_sizing
from components.k8s import autoscaling as asc_mod
from components.k8s import vllm_service
from tests.conftest import FIXED_NOW, TEST_RESERVATION_ID, plan_for
from tests.test_k8s_schemas import crds_dir, validate_against_crd, validate_core
from tests.test_k8s_workloads import HELM_RELEASE, of_kind, one


def _with_prometheus_operator(name: str) -> dict:
    k8s_cfg = read_stack_config(name)["kimi-deploy:kubernetes"]
    return {**k8s_cfg, "installedAddons": [*k8s_cfg.get("installedAddons", []), "prometheus-operator"]}


# The config keys that turn autoscaling on for a stack that ships without it: the two blocks and
# the Prometheus Operator listed (the scaler queries its prometheus-operated Service).
TURN_ON = {
    "b300-prod": {
        "kimi-deploy:autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 3},
        "kimi-deploy:observability": {"prometheusNamespace": "monitoring"},
        "kimi-deploy:kubernetes": _with_prometheus_operator("b300-prod"),
    },
    "gb300": {
        "kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 2},
        "kimi-deploy:observability": {"prometheusNamespace": "monitoring"},
        "kimi-deploy:kubernetes": _with_prometheus_operator("gb300"),
    },
    "mi355x": {},  # ships autoscaled (min 1, max 2)
}


def autoscaled(name: str, extra: dict | None = None):
    overrides = dict(TURN_ON[name])
    overrides.update(extra or {})
    return plan_for(name, overrides=overrides) if overrides else plan_for(name)


def spec_with(name: str, extra: dict | None = None):
    from components.core.config import namespace_config
    from components.core.load import parse_spec

    full = dict(read_stack_config(name))
    full.update(TURN_ON[name])
    full.update(extra or {})
    ns, secrets = namespace_config(full)
    return parse_spec(ns, stack=name, now=FIXED_NOW, secrets_set=secrets)


@pytest.mark.parametrize("name", sorted(TURN_ON))
def test_two_config_keys_turn_autoscaling_on_and_the_scaled_object_validates(name):
    run = autoscaled(name)
    scaled = one(run, "ScaledObject")
    validate_against_crd(scaled)
    plan = scaling_plan(run.context.spec, run.context.sizing)
    assert scaled["spec"]["minReplicaCount"] == plan.min_replicas and scaled["spec"]["maxReplicaCount"] == plan.max_replicas
    multi_node = run.context.spec.nodes_per_copy > 1
    target = scaled["spec"]["scaleTargetRef"]
    assert target == {"apiVersion": "leaderworkerset.x-k8s.io/v1" if multi_node else "apps/v1",
                      "kind": "LeaderWorkerSet" if multi_node else "Deployment", "name": "kimi-vllm"}
    workload = one(run, target["kind"])
    assert workload["metadata"]["name"] == target["name"] and workload["apiVersion"] == target["apiVersion"]
    assert "keda" in run.outputs["kubernetesAddons"]


def test_leaderworkerset_crd_has_the_scale_subresource_keda_drives():
    crd = yaml.safe_load((crds_dir() / "leaderworkerset.x-k8s.io_leaderworkersets.yaml").read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    scale = v1["subresources"]["scale"]
    assert scale["specReplicasPath"] == ".spec.replicas"
    assert scale["labelSelectorPath"] == ".status.hpaPodSelector"


@pytest.mark.parametrize("name", sorted(TURN_ON))
def test_triggers_read_queue_kv_cache_and_busy_replicas_with_a_hold_longer_than_scale_up(name):
    run = autoscaled(name)
    spec, sizing = run.context.spec, run.context.sizing
    plan = scaling_plan(spec, sizing)
    triggers = {t["name"]: t for t in one(run, "ScaledObject")["spec"]["triggers"]}
    assert set(triggers) == {"queue", "kv-cache", "busy-replicas"}
    assert plan.scale_up_bound_seconds >= sizing.startup_budget_seconds
    assert plan.scale_down_delay_seconds == max(plan.scale_up_bound_seconds, plan.scale_up_seconds) + SCALE_DOWN_MARGIN_SECONDS
    for _name, trig in triggers.items():
        meta = trig["metadata"]
        assert trig["type"] == "prometheus" and trig["metricType"] == "AverageValue"
        # an empty result is an error that engages the fallback (KEDA's default reads it as 0)
        assert meta["ignoreNullValues"] == "false" and meta["activationThreshold"] == "0"
        assert meta["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
        # every signal is held over the scale-down delay: a fall counts only after it
        assert f"[{plan.scale_down_delay_seconds}s:30s]" in meta["query"] and meta["query"].startswith("max_over_time(")
        assert f'namespace="kimi",model_name="{spec.served_model_name}"' in meta["query"]
    assert "vllm:num_requests_waiting" in triggers["queue"]["metadata"]["query"]
    assert "vllm:kv_cache_usage_perc" in triggers["kv-cache"]["metadata"]["query"]
    assert "vllm:num_requests_running" in triggers["busy-replicas"]["metadata"]["query"]
    assert triggers["busy-replicas"]["metadata"]["threshold"] == "1"  # never fewer copies than are busy
    assert triggers["queue"]["metadata"]["threshold"] == "4" and triggers["kv-cache"]["metadata"]["threshold"] == "0.8"


@pytest.mark.parametrize("name", sorted(TURN_ON))
def test_scale_up_at_once_scale_down_slowly_one_copy_at_a_time(name):
    run = autoscaled(name)
    plan = scaling_plan(run.context.spec, run.context.sizing)
    body = one(run, "ScaledObject")["spec"]
    behavior = body["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    up, down = behavior["scaleUp"], behavior["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 0
    assert up["policies"] == [
        {"type": "Pods", "value": 1, "periodSeconds": min(plan.scale_up_seconds, HPA_MAX_POLICY_PERIOD_SECONDS)}
    ]
    # autoscaling/v2 caps the window at one hour; the query hold carries the rest
    assert down["stabilizationWindowSeconds"] == HPA_MAX_STABILIZATION_SECONDS
    assert (
        down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": HPA_MAX_POLICY_PERIOD_SECONDS}]
        and down["selectPolicy"] == "Min"
    )
    assert body["cooldownPeriod"] == plan.scale_down_delay_seconds > run.context.sizing.startup_budget_seconds
    assert body["initialCooldownPeriod"] == plan.scale_up_bound_seconds
    assert body["fallback"]["behavior"] == "currentReplicasIfHigher"
    assert body["advanced"]["restoreToOriginalReplicaCount"] is False


def test_hpa_limits_hold_for_the_behaviour_the_scaler_gets():
    run = autoscaled("b300-prod")
    body = copy.deepcopy(one(run, "ScaledObject")["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"])
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
           "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 2, "behavior": body}}
    validate_core(hpa)
    assert body["scaleDown"]["stabilizationWindowSeconds"] <= 3600 and body["scaleDown"]["policies"][0]["periodSeconds"] <= 1800


def test_schedule_adds_cron_triggers_and_allows_scale_to_zero():
    schedule = [{"start": "0 8 * * 1-5", "end": "0 20 * * 1-5", "timezone": "Europe/Berlin"}]
    extra = {"kimi-deploy:autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2, "schedule": schedule}}
    run = plan_for("mi355x", overrides=extra)
    scaled = one(run, "ScaledObject")
    validate_against_crd(scaled)
    assert scaled["spec"]["minReplicaCount"] == 0
    (cron,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "cron"]
    assert cron["metadata"] == {
        "timezone": "Europe/Berlin",
        "start": "0 8 * * 1-5",
        "end": "0 20 * * 1-5",
        "desiredReplicas": "1",
    }
    assert scaled["spec"]["fallback"]["replicas"] == 1
    # the plan says what happens to requests at zero replicas, and how to start a replica at once
    from components.core.scaling import KEDA_FORCE_ACTIVATION_ANNOTATION

    notes = scaling_plan(run.context.spec, run.context.sizing).notes
    (zero,) = [n for n in notes if n.startswith("at zero replicas")]
    assert "requests fail until the next window opens" in zero
    assert f"kubectl -n kimi annotate scaledobject kimi-vllm {KEDA_FORCE_ACTIVATION_ANNOTATION}=true" in zero
    assert not [n for n in scaling_plan(spec_with("mi355x"), compute_sizing(spec_with("mi355x"))).notes
                if n.startswith("at zero replicas")]


def test_hpa_controller_on_external_metrics_validates_and_the_plan_lists_adapter_rules():
    extra = {
        "kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 2, "controller": "hpa"},
        "kimi-deploy:kubernetes": {**read_stack_config("mi355x")["kimi-deploy:kubernetes"],
                                   "installedAddons": ["amd-gpu-operator", "prometheus-operator", "prometheus-adapter"]},
    }
    run = plan_for("mi355x", overrides=extra)
    assert not of_kind(run, "ScaledObject")
    hpa = one(run, "HorizontalPodAutoscaler")
    validate_core(hpa)
    assert [m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == list(asc_mod.HPA_EXTERNAL_METRICS.values())
    assert "keda" not in [r.name.removeprefix("addon-") for r in run.of_type(HELM_RELEASE)]
    rules = asc_mod.adapter_rules(run.context.spec, scaling_plan(run.context.spec, run.context.sizing))
    assert {r["name"]["as"] for r in rules} == set(asc_mod.HPA_EXTERNAL_METRICS.values())


def test_scaled_object_validation_can_fail():
    scaled = one(autoscaled("b300-prod"), "ScaledObject")
    bad = copy.deepcopy(scaled)
    bad["spec"]["minReplicaCount"] = -1
    with pytest.raises(jsonschema.ValidationError):
        validate_against_crd(bad)
    typo = copy.deepcopy(scaled)
    typo["spec"]["cooldownSeconds"] = 10
    with pytest.raises(AssertionError, match="cooldownSeconds"):
        validate_against_crd(typo)


def test_workload_replicas_are_the_first_count_and_then_owned_by_the_scaler():
    spec = spec_with("b300-prod")
    assert vllm_service.replicas_owned_by_scaler(spec) == ["spec.replicas"]
    assert vllm_service.replicas_owned_by_scaler(load_stack("b300-prod", now=FIXED_NOW)) == []
    run = autoscaled("b300-prod")
    assert one(run, "Deployment")["spec"]["replicas"] == 2  # compute.replicas, the initial count
    # rolling updates may touch every copy up to the maximum
    sizing = compute_sizing(spec)
    assert vllm_service.rollout_timeouts(spec, sizing)[1] == vllm_service.per_pod_budget_seconds(spec, sizing) * 3


def test_compute_domain_node_count_is_left_to_the_driver_with_or_without_autoscaling():
    # numNodes is deprecated and "recommended to be set to zero" (the CRD, driver 25.12): the
    # immutable spec then survives a change of the replica count.
    assert one(plan_for("gb300"), "ComputeDomain")["spec"]["numNodes"] == 0
    assert one(autoscaled("gb300"), "ComputeDomain")["spec"]["numNodes"] == 0


def test_stacks_without_autoscaling_declare_no_scaler():
    for name in ("b300-prod", "gb300"):
        run = plan_for(name)
        assert not of_kind(run, "ScaledObject") and not of_kind(run, "HorizontalPodAutoscaler")
        assert "keda" not in run.outputs["kubernetesAddons"]


# -- the plan's envelope and cost -----------------------------------------------------------------


def _doc(name: str, extra: dict | None = None) -> dict:
    from scripts.ops.plan import scaling_section

    spec = spec_with(name, extra)
    return scaling_section(spec, compute_sizing(spec))


def test_plan_scaling_section_odcr_says_scaling_down_saves_nothing():
    sc = _doc("b300-prod")["scaling"]
    assert {"min_replicas", "max_replicas", "scale_up_seconds", "usd_per_hour_at_min", "usd_per_hour_at_max"} <= set(sc)
    assert (sc["min_replicas"], sc["max_replicas"], sc["gpu_nodes_min"], sc["gpu_nodes_max"]) == (1, 3, 1, 3)
    per_node = 142.416  # p6-b300.48xlarge on-demand us-east-1 (targets.py)
    assert sc["usd_per_hour_at_min"] == sc["usd_per_hour_at_max"] == pytest.approx(3 * per_node)
    assert sc["scale_down_saves"] is False
    assert any("saves nothing" in n and TEST_RESERVATION_ID in n for n in sc["notes"])


def test_plan_scaling_section_on_demand_prices_each_end():
    cap = {"kimi-deploy:compute": {"replicas": 2, "availabilityZone": "us-east-1c", "capacity": {"type": "on-demand"}}}
    sc = _doc("b300-prod", cap)["scaling"]
    assert sc["usd_per_hour_at_min"] == pytest.approx(142.416) and sc["usd_per_hour_at_max"] == pytest.approx(3 * 142.416)
    assert sc["scale_down_saves"] is True


def test_plan_scaling_section_for_mi355x_and_none_without_autoscaling():
    sc = _doc("mi355x")["scaling"]
    assert (sc["min_replicas"], sc["max_replicas"]) == (1, 2)
    assert sc["usd_per_hour_at_min"] is None and "compute.usdPerHour" in sc["price_source"]
    assert any("frees 8 GPUs" in n for n in sc["notes"])
    # mi355x has no mirror: a fresh node downloads from the hub before loading
    assert sc["scale_up_bound_seconds"] > compute_sizing(spec_with("mi355x")).startup_budget_seconds
    from scripts.ops.plan import scaling_section

    plain = load_stack("gb300", now=FIXED_NOW)
    assert scaling_section(plain, compute_sizing(plain)) == {}


def test_plan_json_carries_scaling_and_the_table_rows(tmp_path):
    from scripts.ops import plan as plan_script

    doc = plan_script.build_plan_document("mi355x", now=FIXED_NOW)
    assert doc["scaling"]["max_replicas"] == 2
    json.dumps(doc)  # serializable
    rows = dict(plan_script.summary_rows(doc))
    assert rows["autoscaling"].startswith("1..2 replicas (keda)")
    assert "cost at min / max" in rows


# -- config errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {"kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 1, "minReplicas": 2}},
            r"autoscaling.maxReplicas: 1 is below autoscaling.minReplicas 2",
        ),
        (
            {"kimi-deploy:autoscaling": {"enabled": True, "minReplicas": 0}},
            r"autoscaling.minReplicas: 0 needs autoscaling.schedule",
        ),
        (
            {
                "kimi-deploy:autoscaling": {
                    "enabled": True,
                    "maxReplicas": 3,
                    "schedule": [{"start": "8 * * 1-5", "end": "0 20 * * 1-5"}],
                }
            },
            r"autoscaling.schedule.0.start: '8 \* \* 1-5' is not a 5-field cron expression",
        ),
        (
            {"kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 3,
                                         "schedule": [{"start": "61 8 * * 1-5", "end": "0 20 * * 1-5"}]}},
            r"autoscaling.schedule.0.start: '61 8 \* \* 1-5' has minute 61, outside 0-59",
        ),
        (
            {"kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 3,
                                         "schedule": [{"start": "0 8 * * 1-7", "end": "0 20 * * 1-5"}]}},
            r"autoscaling.schedule.0.start: '0 8 \* \* 1-7' has day-of-week 7, outside 0-6",
        ),
        (
            {"kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 3,
                                         "schedule": [{"start": "0 8 * * 1-5", "end": "0  8 * * 1-5"}]}},
            r"autoscaling.schedule.0.end: '0  8 \* \* 1-5' equals its start",
        ),
        (
            {
                "kimi-deploy:autoscaling": {
                    "enabled": True,
                    "maxReplicas": 3,
                    "schedule": [{"start": "0 8 * * *", "end": "0 9 * * *", "timezone": "Mars/Base"}],
                }
            },
            r"autoscaling.schedule.0.timezone: 'Mars/Base' is not an IANA time zone",
        ),
        (
            {"kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 3, "controller": "hpa"}},
            r"autoscaling.controller: 'hpa' needs an external metrics adapter",
        ),
        (
            {"kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 1}},
            r"compute.replicas: 2 is the initial replica count and must lie within",
        ),
        ({"kimi-deploy:observability": {}}, r"autoscaling.enabled: true needs observability.prometheusNamespace"),
        (
            {"kimi-deploy:observability": {"prometheusNamespace": "Monitoring"}},
            r"observability.prometheusNamespace: 'Monitoring' is not a valid namespace",
        ),
        (
            {"kimi-deploy:observability": {"prometheusUrl": "http://user:pw@prom:9090"}},
            r"observability.prometheusUrl: '\[URL with credentials\]' holds credentials",
        ),
        (
            {"kimi-deploy:autoscaling": {"enabled": True, "maxReplicas": 3, "scaleDownDelaySeconds": 600}},
            r"autoscaling.scaleDownDelaySeconds: 600 must exceed the scale-up time",
        ),
        ({"kimi-deploy:autoscaling": {"enabled": True, "maxReplica": 3}}, r"autoscaling.maxReplica: .* is not a known key"),
    ],
)
def test_autoscaling_config_errors_are_one_line(extra, message):
    with pytest.raises(ConfigError, match=message) as err:
        spec = spec_with("b300-prod", extra)
        scaling_plan(spec, compute_sizing(spec))
    assert "\n" not in str(err.value) and str(err.value).startswith("kimi-deploy:")


def test_autoscaling_is_refused_on_aws_ec2():
    from components.core.config import namespace_config
    from components.core.load import parse_spec

    full = dict(read_stack_config("b300"))
    full["kimi-deploy:autoscaling"] = {"enabled": True}
    ns, secrets = namespace_config(full)
    with pytest.raises(
        ConfigError, match=r"kimi-deploy:autoscaling.enabled: true is read only on aws-eks, kubernetes"
    ):
        parse_spec(ns, stack="b300", now=FIXED_NOW, secrets_set=secrets)


def test_subquery_hold_rejects_windows_below_one_step():
    from components.core.metrics import scaling_queries

    with pytest.raises(ValueError, match="at least 30"):
        scaling_queries("kimi", "m", 10, workload_name="kimi-vllm", multi_node=False)
    assert re.search(r"\[3600s:30s\]", scaling_queries("kimi", "m", 3600, workload_name="kimi-vllm", multi_node=False).queue)


# -- GPU node capacity --------------------------------------------------------------------------


def _gpu_node_group(run) -> dict:
    (group,) = [r for r in run.of_type("aws:eks/nodeGroup:NodeGroup") if r.name.endswith("-gpu")]
    return group.inputs["scalingConfig"]


def test_gpu_node_group_range_follows_the_replicas_and_reservations_keep_min_zero():
    assert _gpu_node_group(plan_for("b300-prod")) == {"minSize": 0, "desiredSize": 2, "maxSize": 2}
    # ODCR: max follows maxReplicas, min stays 0 (reserved capacity), desired is the first count
    assert _gpu_node_group(autoscaled("b300-prod")) == {"minSize": 0, "desiredSize": 2, "maxSize": 3}
    # gb300: two trays per copy, capacity block
    assert _gpu_node_group(autoscaled("gb300")) == {"minSize": 0, "desiredSize": 2, "maxSize": 4}
    on_demand = {"kimi-deploy:compute": {"replicas": 2, "availabilityZone": "us-east-1c", "capacity": {"type": "on-demand"}}}
    assert _gpu_node_group(autoscaled("b300-prod", on_demand)) == {"minSize": 1, "desiredSize": 2, "maxSize": 3}



@pytest.mark.parametrize("name", ["b300-prod", "gb300"])
def test_the_commented_keys_in_the_stack_file_turn_autoscaling_on(name):
    from components.core.config import STACKS_DIR

    text = (STACKS_DIR / f"Pulumi.{name}.yaml").read_text()
    block = text[text.index("  # Replica autoscaling"):].splitlines()[1:]
    keys = yaml.safe_load("\n".join(line.replace("  # ", "  ", 1) for line in block if line.startswith("  # ")))
    assert sorted(keys) == ["kimi-deploy:autoscaling", "kimi-deploy:observability"]
    # and the commented installedAddons line of the kubernetes block
    (addons,) = [line.strip().removeprefix("# ") for line in text.splitlines() if line.startswith("    # installedAddons:")]
    keys["kimi-deploy:kubernetes"] = {**read_stack_config(name)["kimi-deploy:kubernetes"], **yaml.safe_load(addons)}
    run = plan_for(name, overrides=keys)
    validate_against_crd(one(run, "ScaledObject"))
    one(run, "PodMonitor")
    with pytest.raises(ConfigError, match="lacks prometheus-operator"):
        plan_for(name, overrides={k: v for k, v in keys.items() if k != "kimi-deploy:kubernetes"})


def test_scale_up_time_uses_the_time_to_ready_model_where_present():
    spec = spec_with("b300-prod")
    sizing = compute_sizing(spec)
    plan = scaling_plan(spec, sizing)
    try:
        from components.core.time_to_ready import time_to_ready
    except ImportError:
        # Without the model: the budget-based bound, and the plan says so.
        assert plan.scale_up_seconds == plan.scale_up_bound_seconds
        assert plan.scale_up_source.startswith("per-node weight copy") and "startup budget" in plan.scale_up_source
        return
    from components.core.weights import sync_steps

    expected = time_to_ready(spec, sizing, sync_steps(spec, "mirror-bucket")).scenarios["replaced_node"].total_seconds
    assert plan.scale_up_seconds == int(expected) and plan.scale_up_source.startswith("time-to-ready model")
    assert plan.scale_down_delay_seconds > max(plan.scale_up_seconds, plan.scale_up_bound_seconds)


def test_cluster_autoscaler_runs_with_its_pod_identity_on_autoscaled_eks_only():
    import parliament

    from components.aws.common import resource_prefix
    from components.aws.node_autoscaler import cluster_autoscaler_policy
    from components.core.naming import CLUSTER_AUTOSCALER_NAMESPACE, CLUSTER_AUTOSCALER_SERVICE_ACCOUNT
    from components.k8s.addons import addon_values

    run = autoscaled("b300-prod")
    spec = run.context.spec
    cluster = resource_prefix(spec.project, spec.stack)
    (assoc,) = [r for r in run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
                if r.inputs["serviceAccount"] == CLUSTER_AUTOSCALER_SERVICE_ACCOUNT]
    assert assoc.inputs["namespace"] == CLUSTER_AUTOSCALER_NAMESPACE == "kube-system"
    (policy,) = [r for r in run.of_type("aws:iam/rolePolicy:RolePolicy") if r.inputs["name"] == "cluster-autoscaler"]
    doc = json.loads(policy.inputs["policy"])
    assert policy.inputs["policy"] == cluster_autoscaler_policy(cluster)
    (scale,) = [s for s in doc["Statement"] if s["Sid"] == "ScaleOwnNodeGroups"]
    assert scale["Condition"] == {"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster}": "owned"}}
    assert parliament.analyze_policy_string(policy.inputs["policy"]).findings == []
    (release,) = [r for r in run.of_type(HELM_RELEASE) if r.name == "addon-cluster-autoscaler"]
    values = release.inputs["values"]
    assert values == addon_values(spec, "cluster-autoscaler")
    assert values["autoDiscovery"]["clusterName"] == cluster and values["awsRegion"] == "us-east-1"
    assert values["rbac"]["serviceAccount"]["name"] == CLUSTER_AUTOSCALER_SERVICE_ACCOUNT
    from components.core.versions import EKS_VERSION

    assert values["image"]["tag"].startswith(f"v{EKS_VERSION}.")  # the autoscaler minor matches the cluster
    # not on stacks without autoscaling, nor on existing clusters (their node autoscaler is theirs)
    assert not [r for r in plan_for("b300-prod").of_type(HELM_RELEASE) if r.name == "addon-cluster-autoscaler"]
    assert "cluster-autoscaler" not in plan_for("mi355x").outputs["kubernetesAddons"]


@pytest.mark.parametrize("zone,warned", [("EST", True), ("CET", True), ("EST5EDT", True), ("America/New_York", False),
                                         ("UTC", False)])
def test_a_legacy_zone_name_is_warned_since_a_window_in_it_may_not_follow_local_time(zone, warned):
    # EST never observes daylight saving: an 08:00 "EST" window opens at 09:00 New York time all summer (trial, round 6).
    schedule = [{"start": "0 8 * * 1-5", "end": "0 20 * * 1-5", "timezone": zone}]
    spec = spec_with("mi355x", {"kimi-deploy:autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 2,
                                                            "schedule": schedule}})
    hits = [w for w in spec.warnings if "is a legacy zone name" in w]
    assert bool(hits) is warned, spec.warnings
    if warned:
        assert f"autoscaling.schedule.0.timezone '{zone}'" in hits[0] and "America/New_York" in hits[0]


def _scheduled_mi355x(start: str, end: str):
    from components.core.config import namespace_config
    from components.core.load import parse_spec

    ns, _ = namespace_config(read_stack_config("mi355x"))
    ns["autoscaling"] = {"enabled": True, "minReplicas": 0, "maxReplicas": 2,
                         "schedule": [{"start": start, "end": end, "timezone": "UTC"}]}
    return parse_spec(ns, stack="t", now=FIXED_NOW)


def test_a_schedule_window_shorter_than_a_scale_up_is_warned_with_both_figures():
    """Issue 35 (trial t502): 08:00-08:10 with minReplicas 0 passed while a scale-up takes ~37 min:
    the replica starts every weekday and is never ready inside its window."""
    from components.core.config.scaling import shortest_window_seconds
    from components.core.time_to_ready import stack_time_to_ready

    spec = _scheduled_mi355x("0 8 * * 1-5", "10 8 * * 1-5")
    scale_up = stack_time_to_ready(spec).scenarios["replaced_node"].total_seconds
    assert 600 < scale_up
    (warning,) = [w for w in spec.warnings if w.startswith("autoscaling.schedule.0")]
    assert "'0 8 * * 1-5' to '10 8 * * 1-5'" in warning and "window of 10 min" in warning
    assert f"modelled scale-up of {-(-scale_up // 60)} min" in warning and "minReplicas 0" in warning
    # A working day's window is long enough: no warning.
    assert not [w for w in _scheduled_mi355x("0 8 * * 1-5", "0 18 * * 1-5").warnings if "autoscaling.schedule" in w]
    # The window is the start to the next end: across midnight, and Friday evening to Monday.
    assert shortest_window_seconds("0 22 * * *", "0 6 * * *") == 8 * 3600
    assert shortest_window_seconds("0 18 * * 5", "0 8 * * 1") == (2 * 24 + 14) * 3600

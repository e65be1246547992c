"""Replica autoscaling of the vLLM workload (``kimi-deploy:autoscaling``): a KEDA ``ScaledObject``
(``keda.sh/v1alpha1``) or, with ``autoscaling.controller: hpa``, an ``autoscaling/v2``
HorizontalPodAutoscaler on external metrics served by an installed prometheus-adapter.

Signals (``components/core/metrics.py``), each a Prometheus query over vLLM's own metrics:
- ``queue``: requests waiting (``vllm:num_requests_waiting``), ``autoscaling.queuePerReplica`` per copy;
- ``kv-cache``: KV-cache usage (``vllm:kv_cache_usage_perc``), ``autoscaling.kvCacheUsageTarget`` per copy;
- ``busy-replicas``: copies with a running request, 1 per copy: the scaler never asks for fewer
  copies than are serving requests;
- ``cron`` (KEDA only): one per ``autoscaling.schedule`` window, ``compute.replicas`` copies inside.
The HPA takes the largest replica count any signal asks for.

Timing (``components/core/scaling.py``): each query is the maximum over the scale-down delay, so a
rise counts on the next poll and a fall only after the whole delay, which is longer than a
scale-up takes (load + warm-up + per-node weight copy). On top, the HPA behaviour adds one copy at
a time (no scale-up stabilisation) and removes one copy per 30 minutes after a stabilisation
window of the longest value autoscaling/v2 accepts (one hour). KEDA's ``cooldownPeriod`` (the wait
before scaling to zero) is the scale-down delay, its ``initialCooldownPeriod`` the first start's
budget.

Errors and the fallback (KEDA 2.20.2: ``pkg/scalers/prometheus_scaler.go`` ``ExecutePromQuery``,
``pkg/fallback/fallback.go``, ``pkg/scaling/executor/scale_scaledobjects.go``): with
``ignoreNullValues: "false"`` an empty query result is an error (so is an unreachable Prometheus);
after more than ``FALLBACK_FAILURE_THRESHOLD`` consecutive errors the trigger reads ``fallback.replicas`` x
its target, or the current replicas if higher (``currentReplicasIfHigher``), and counts as active;
while any trigger errs KEDA never scales to zero. So the queries return nothing exactly when the
signal is unknown (a lost scrape; ``components/core/metrics.py`` ``ScalingQueries``) and 0 at zero
replicas, where a failing trigger would bring a replica back. An HPA on prometheus-adapter treats an
empty result as a metric it cannot read, and does not scale down while one is missing.

Scale-from-zero: with no replica there is nothing whose demand the queries could see; requests
outside the serving windows fail until the next window opens (the plan says so, and how to start a
replica at once: ``components/core/scaling.py`` ``KEDA_FORCE_ACTIVATION_ANNOTATION``).

Target: the Deployment (``apps/v1``) or the LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``),
whose CRD declares the scale subresource (``specReplicasPath: .spec.replicas``,
``labelSelectorPath: .status.hpaPodSelector``) that KEDA's HPA drives. Scaling down removes the
highest-index LeaderWorkerSet group; a Deployment's ReplicaSet removes not-ready pods first
(``controller.ActivePodsWithRanks``), so a replica still loading goes before a serving one.
The workload keeps ``replicas: compute.replicas`` for its creation and ignores later changes to it
(``ignoreChanges: spec.replicas``) so `pulumi up` never fights the scaler.

Sources: KEDA ScaledObject spec and Prometheus/cron scalers (keda.sh docs, CRD v2.20.2 in the
tests); Kubernetes HorizontalPodAutoscaler v2 API reference (behaviour limits).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.core.config import DeploymentSpec
from components.core.metrics import ScalingQueries, scaling_queries
from components.core.scaling import (
    HPA_MAX_POLICY_PERIOD_SECONDS,
    HPA_MAX_STABILIZATION_SECONDS,
    POLLING_INTERVAL_SECONDS,
    ScalingPlan,
)
from components.core.sizing import Sizing

from .common import VLLM_NAME, metadata

# Consecutive failed Prometheus reads before KEDA's fallback holds the replica count.
FALLBACK_FAILURE_THRESHOLD = 6
# Service of the Prometheus Operator's Prometheus in its namespace (the operator creates it).
PROMETHEUS_OPERATED_SERVICE = "prometheus-operated"
PROMETHEUS_PORT = 9090
# External metric names the HPA asks prometheus-adapter for (its rules must map them; see
# ``adapter_rules``).
HPA_EXTERNAL_METRICS = {
    "queue": "kimi_vllm_requests_waiting",
    "kv-cache": "kimi_vllm_kv_cache_usage",
    "busy-replicas": "kimi_vllm_busy_replicas",
}


def prometheus_url(spec: DeploymentSpec) -> str:
    """The Prometheus the scaler queries: ``observability.prometheusUrl``, else the Prometheus
    Operator's ``prometheus-operated`` Service in ``observability.prometheusNamespace``.

    Raises:
        ValueError: neither is configured (config validation rejects that for autoscaled stacks).
    """
    obs = spec.config.observability
    if obs.prometheus_url:
        return obs.prometheus_url
    if obs.prometheus_namespace:
        return f"http://{PROMETHEUS_OPERATED_SERVICE}.{obs.prometheus_namespace}.svc:{PROMETHEUS_PORT}"
    raise ValueError("no Prometheus configured: set observability.prometheusNamespace or observability.prometheusUrl")


def workload_ref(multi_node: bool) -> dict[str, str]:
    """The scale target: the LeaderWorkerSet of a multi-node copy, else the Deployment."""
    if multi_node:
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": VLLM_NAME}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": VLLM_NAME}


def queries(spec: DeploymentSpec, plan: ScalingPlan) -> ScalingQueries:
    """The scaling queries of ``spec`` held over the plan's scale-down delay, for the scaled
    workload (the LeaderWorkerSet of a multi-node copy, else the Deployment)."""
    return scaling_queries(
        spec.config.kubernetes.namespace, spec.served_model_name, plan.scale_down_delay_seconds,
        workload_name=VLLM_NAME, multi_node=spec.nodes_per_copy > 1,
    )


def _targets(spec: DeploymentSpec) -> dict[str, str]:
    """Per-replica target of each signal, as the strings KEDA and the HPA take."""
    asc = spec.config.autoscaling
    return {"queue": f"{asc.queue_per_replica:g}", "kv-cache": f"{asc.kv_cache_usage_target:g}", "busy-replicas": "1"}


def hpa_behavior(plan: ScalingPlan) -> dict[str, Any]:
    """autoscaling/v2 behaviour: add one copy at once, at most one per scale-up time (capped at the
    API's 30-minute period); remove one copy per 30 minutes after the longest window allowed."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": 1, "periodSeconds": min(plan.scale_up_seconds, HPA_MAX_POLICY_PERIOD_SECONDS)}
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": min(plan.scale_down_delay_seconds, HPA_MAX_STABILIZATION_SECONDS),
            "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": HPA_MAX_POLICY_PERIOD_SECONDS}],
        },
    }


def scaled_object_spec(spec: DeploymentSpec, sizing: Sizing, plan: ScalingPlan, multi_node: bool) -> dict[str, Any]:
    """The KEDA ScaledObject ``spec`` (keda.sh/v1alpha1)."""
    q = queries(spec, plan)
    server = prometheus_url(spec)
    targets = _targets(spec)
    triggers: list[dict[str, Any]] = []
    for name, query in (("queue", q.queue), ("kv-cache", q.kv_cache), ("busy-replicas", q.busy_replicas)):
        triggers.append({
            "type": "prometheus",
            "name": name,
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": server,
                "query": query,
                "threshold": targets[name],
                # Active (scale from zero) only when there is demand.
                "activationThreshold": "0",
                # An empty result is an error (KEDA's default reads it as 0): a lost scrape engages
                # the fallback instead of looking idle. The queries return 0 at zero replicas.
                "ignoreNullValues": "false",
            },
        })
    for i, window in enumerate(spec.config.autoscaling.schedule):
        triggers.append(
            {
                "type": "cron",
                "name": f"window-{i}",
                "metadata": {
                    "timezone": window.timezone,
                    "start": window.start,
                    "end": window.end,
                    "desiredReplicas": str(plan.initial_replicas),
                },
            }
        )
    body: dict[str, Any] = {
        "scaleTargetRef": workload_ref(multi_node),
        "pollingInterval": POLLING_INTERVAL_SECONDS,
        "cooldownPeriod": plan.scale_down_delay_seconds,
        # A first start loads for up to the scale-up bound: no scale-to-zero before that.
        "initialCooldownPeriod": plan.scale_up_bound_seconds,
        "minReplicaCount": plan.min_replicas,
        "maxReplicaCount": plan.max_replicas,
        "fallback": {
            "failureThreshold": FALLBACK_FAILURE_THRESHOLD,
            "replicas": max(plan.min_replicas, 1),
            "behavior": "currentReplicasIfHigher",
        },
        "advanced": {
            "restoreToOriginalReplicaCount": False,
            # No custom name: KEDA's own keda-hpa-<scaledobject> (controllers/keda/hpa.go getHPAName),
            # never the name the HPA of `controller: hpa` takes, so switching controllers (new objects
            # are created before old ones go) cannot collide (core/controller_objects.py).
            "horizontalPodAutoscalerConfig": {"behavior": hpa_behavior(plan)},
        },
        "triggers": triggers,
    }
    return body


def hpa_spec(spec: DeploymentSpec, sizing: Sizing, plan: ScalingPlan, multi_node: bool) -> dict[str, Any]:
    """The autoscaling/v2 HorizontalPodAutoscaler ``spec`` on external metrics (prometheus-adapter)."""
    targets = _targets(spec)
    selector = {"matchLabels": {"namespace": spec.config.kubernetes.namespace, "model_name": spec.served_model_name}}
    return {
        "scaleTargetRef": workload_ref(multi_node),
        "minReplicas": max(plan.min_replicas, 1),
        "maxReplicas": plan.max_replicas,
        "metrics": [
            {
                "type": "External",
                "external": {
                    "metric": {"name": HPA_EXTERNAL_METRICS[name], "selector": selector},
                    "target": {"type": "AverageValue", "averageValue": targets[name]},
                },
            }
            for name in ("queue", "kv-cache", "busy-replicas")
        ],
        "behavior": hpa_behavior(plan),
    }


def adapter_rules(spec: DeploymentSpec, plan: ScalingPlan) -> list[dict[str, Any]]:
    """prometheus-adapter ``rules.external`` entries serving ``HPA_EXTERNAL_METRICS`` (what the
    installed adapter needs for ``autoscaling.controller: hpa``; shown in the plan)."""
    q = queries(spec, plan)
    out = []
    # The queries carry their own label matchers (no <<.LabelMatchers>> template); an empty result is
    # a metric the adapter cannot serve, and the HPA does not scale down while one is missing.
    for name, query in (("queue", q.queue), ("kv-cache", q.kv_cache), ("busy-replicas", q.busy_replicas)):
        out.append({
            "seriesQuery": '{__name__=~"vllm:.*",namespace!="",model_name!=""}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "name": {"as": HPA_EXTERNAL_METRICS[name]},
            "metricsQuery": query,
        })
    return out


def declare_autoscaling(
    spec: DeploymentSpec,
    sizing: Sizing,
    plan: ScalingPlan,
    multi_node: bool,
    provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
) -> pulumi.Resource:
    """Declare the ScaledObject (or HPA) of the vLLM workload, after the workload and KEDA."""
    opts = pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on)
    if plan.controller == "hpa":
        # hpa_spec is the API's camelCase manifest, which pulumi's serializer passes through (pulumi/runtime/rpc.py
        # `.get(k) or k`); the schema tests validate it.
        return k8s.autoscaling.v2.HorizontalPodAutoscaler(
            "vllm-autoscaler",
            metadata=metadata(spec, VLLM_NAME, "autoscaler"),
            spec=hpa_spec(spec, sizing, plan, multi_node),
            opts=opts,
        )
    return k8s.apiextensions.CustomResource(
        "vllm-scaled-object",
        api_version="keda.sh/v1alpha1",
        kind="ScaledObject",
        metadata=metadata(spec, VLLM_NAME, "autoscaler"),
        spec=scaled_object_spec(spec, sizing, plan, multi_node),
        opts=opts,
    )

"""Wiring of autoscaling and observability into the workloads component (one call from
``KimiWorkloads``), so the component's constructor gains one line."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi
import pulumi_kubernetes as k8s

from components.core.config import DeploymentSpec
from components.core.scaling import scaling_plan
from components.core.sizing import Sizing
from components.core.time_to_ready import pod_ready_budget
from components.core.vllm import VllmCommand

from .autoscaling import declare_autoscaling
from .observability import declare_observability


def declare_scaling_and_observability(
    spec: DeploymentSpec,
    sizing: Sizing,
    command: VllmCommand,
    vllm: dict[str, pulumi.Resource],
    addons: Mapping[str, pulumi.Resource],
    provider: k8s.Provider,
    parent: pulumi.Resource,
    prereqs: list[pulumi.Resource],
) -> dict[str, pulumi.Resource]:
    """Declare the ScaledObject/HPA (``autoscaling.enabled``), the dashboard ConfigMap and the
    PrometheusRule for ``spec`` / ``sizing`` / ``command`` (the serving command: one role or a
    multi-node group). Returns role -> resource (``autoscaler``, ``dashboard``, ``alerts``)."""
    multi_node = len(command.roles) > 1
    out: dict[str, pulumi.Resource] = {}
    plan = scaling_plan(spec, sizing)
    if plan is not None:
        deps = [vllm["workload"], *([addons["keda"]] if "keda" in addons else [])]
        out["autoscaler"] = declare_autoscaling(spec, sizing, plan, multi_node, provider, parent, deps)
    out.update(
        declare_observability(spec, sizing, multi_node, pod_ready_budget(spec, sizing), provider, parent, list(prereqs))
    )
    return out

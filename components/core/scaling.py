"""The scaling envelope of a deployment: min/max replicas, how long a scale-up takes, how long a
scale-down waits, the GPU node range that follows the replicas, and the price at each end.
Pure functions over the spec and its sizing (no Pulumi import).

Timing rule: a new replica of a 1.56 TB model needs the whole startup budget (load + warm-up, x2
safety) and, on a fresh node with node-local weights, the per-node weight copy first. So the
scaler reacts at once to a rise (no scale-up stabilisation) and waits longer than that before it
removes a replica (scale-down delay = scale-up time + ``SCALE_DOWN_MARGIN_SECONDS``): a replica is
never removed while one just added could still be starting.

Where ``components/core/time_to_ready.py`` (the time-to-ready model) provides a per-replica
estimate, ``scale_up_seconds`` is the place to use it; today it is the startup budget plus the
per-node copy.

Cost: with reserved capacity (ODCR or capacity block) the instances are paid whether used or not,
so the price at min equals the price at max and scaling down saves nothing; on-demand node groups
and shared clusters pay (or free) the nodes a replica uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config.spec import DeploymentSpec
from .errors import ConfigError
from .naming import VLLM_WORKLOAD_NAME
from .sizing import Sizing, gpu_usd_per_hour, sync_expected_seconds
from .weights import SHAPE_BUCKET, sync_steps

# Added to the scale-up time to get the scale-down delay: a scale-down never lands while a
# replica added by the last scale-up may still be loading.
SCALE_DOWN_MARGIN_SECONDS = 900
# How often the scaler evaluates its triggers (KEDA pollingInterval), seconds.
POLLING_INTERVAL_SECONDS = 30
# autoscaling/v2 limits (Kubernetes API reference, HPAScalingRules): a stabilisation window of
# at most one hour, a policy period of at most 30 minutes.
HPA_MAX_STABILIZATION_SECONDS = 3_600
HPA_MAX_POLICY_PERIOD_SECONDS = 1_800
RESERVED_CAPACITY_TYPES = ("odcr", "capacity-block")
# KEDA 2.20.2 (apis/keda/v1alpha1/scaledobject_types.go ForceActivationAnnotation): "true" on a
# ScaledObject makes it active whatever its triggers read, so KEDA scales the target from zero to
# max(minReplicaCount, 1) and keeps it from scaling to zero; removing it hands back to the triggers.
KEDA_FORCE_ACTIVATION_ANNOTATION = "autoscaling.keda.sh/force-activation"


@dataclass(frozen=True)
class ScalingPlan:
    """The scaling envelope of an autoscaled deployment.

    Attributes:
        min_replicas, max_replicas: the scaler's range (min 0 only with a schedule).
        initial_replicas: copies created by the first ``pulumi up`` (``compute.replicas``).
        controller: ``keda`` (ScaledObject) or ``hpa`` (autoscaling/v2 on external metrics).
        scale_up_seconds: time from the scaler's decision to a new replica serving.
        scale_up_source: how ``scale_up_seconds`` was derived.
        scale_up_bound_seconds: the budget-based upper bound of a scale-up (startup budget plus
            the per-node copy); the scale-down delay and the first cooldown exceed it.
        scale_down_delay_seconds: how long demand must stay low before a replica is removed.
        nodes_per_replica: GPU nodes of one copy.
        node_min, node_max: GPU node range that follows the replicas (``aws-eks`` node group).
        usd_per_hour_at_min, usd_per_hour_at_max: GPU price at each end, None when unknown.
        price_source: where the price comes from.
        scale_down_saves: whether fewer replicas cost less.
        notes: what the plan must say about this envelope.
    """

    min_replicas: int
    max_replicas: int
    initial_replicas: int
    controller: str
    scale_up_seconds: int
    scale_up_source: str
    scale_up_bound_seconds: int
    scale_down_delay_seconds: int
    nodes_per_replica: int
    node_min: int
    node_max: int
    usd_per_hour_at_min: float | None
    usd_per_hour_at_max: float | None
    price_source: str
    scale_down_saves: bool
    notes: tuple[str, ...]


def autoscaling_enabled(spec: DeploymentSpec) -> bool:
    """Whether the stack's replicas follow load (``autoscaling.enabled``)."""
    return spec.config.autoscaling.enabled


def max_replicas(spec: DeploymentSpec) -> int:
    """The most copies the deployment may run: ``autoscaling.maxReplicas`` (default
    ``compute.replicas``) when autoscaled, else ``compute.replicas``."""
    asc = spec.config.autoscaling
    if asc.enabled and asc.max_replicas is not None:
        return asc.max_replicas
    return spec.replicas


def per_node_sync_seconds(spec: DeploymentSpec, sizing: Sizing) -> int:
    """Expected seconds of the per-node weight copy a fresh node needs (0 when the weights are
    shared, e.g. FSx or a claim)."""
    steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    return sum(sync_expected_seconds(spec, sizing, s) for s in steps if s.per_node)


def scale_up_bound_seconds(spec: DeploymentSpec, sizing: Sizing) -> tuple[int, str]:
    """``(seconds, source)`` bounding one scale-up: the per-node weight copy (node-local storage)
    plus the startup budget (``sizing.startup_budget_seconds``: 2x the expected load + warm-up).
    The scale-down delay and KEDA's first cooldown are derived from this bound."""
    copy_s = per_node_sync_seconds(spec, sizing)
    budget = sizing.startup_budget_seconds
    if copy_s:
        return copy_s + budget, f"per-node weight copy {copy_s} s + startup budget {budget} s"
    return budget, f"startup budget {budget} s (weights shared; no per-node copy)"


def scale_up_seconds(spec: DeploymentSpec, sizing: Sizing) -> tuple[int, str]:
    """``(seconds, source)`` of one scale-up, as the plan shows it.

    With the time-to-ready model (``components/core/time_to_ready.py``, merged separately) this
    is its ``replaced_node`` scenario: a new replica on a fresh node is exactly that (launch,
    boot, image pull, per-node copy, load, engine init). Without it, ``scale_up_bound_seconds``.
    """
    try:
        from .time_to_ready import time_to_ready  # the time-to-ready model, when present
    except ImportError:
        return scale_up_bound_seconds(spec, sizing)
    steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    scenario = time_to_ready(spec, sizing, steps).scenarios["replaced_node"]
    return int(scenario.total_seconds), "time-to-ready model, replaced-node scenario"


def scale_down_delay_seconds(spec: DeploymentSpec, sizing: Sizing) -> int:
    """``autoscaling.scaleDownDelaySeconds``, else the scale-up bound (or the time-to-ready
    estimate, whichever is longer) + ``SCALE_DOWN_MARGIN_SECONDS``.

    Raises:
        ConfigError: a configured delay not longer than that scale-up time (a replica could be
            removed while the one just added is still starting).
    """
    up = max(scale_up_bound_seconds(spec, sizing)[0], scale_up_seconds(spec, sizing)[0])
    configured = spec.config.autoscaling.scale_down_delay_seconds
    if configured is None:
        return up + SCALE_DOWN_MARGIN_SECONDS
    if configured <= up:
        raise ConfigError(
            "autoscaling.scaleDownDelaySeconds",
            configured,
            f"must exceed the scale-up time of {up} s (a replica could be removed while a new one is still starting)",
        )
    return configured


def scaling_plan(spec: DeploymentSpec, sizing: Sizing) -> ScalingPlan | None:
    """The envelope of an autoscaled stack, or None when ``autoscaling.enabled`` is false.

    Raises:
        ConfigError: ``autoscaling.scaleDownDelaySeconds`` not longer than the scale-up time.
    """
    if not autoscaling_enabled(spec):
        return None
    asc = spec.config.autoscaling
    lo, hi = asc.min_replicas, max_replicas(spec)
    nodes = spec.nodes_per_copy
    up, up_source = scale_up_seconds(spec, sizing)
    total, price_source = gpu_usd_per_hour(spec)
    per_node = total / spec.gpu_nodes if total is not None else None
    profile = spec.profile
    capacity = spec.config.compute.capacity.type if profile.provisions_aws else "existing cluster"
    reserved = capacity in RESERVED_CAPACITY_TYPES
    notes: list[str] = []
    if reserved:
        at_min = at_max = per_node * hi * nodes if per_node is not None else None
        notes.append(
            f"{capacity} capacity {spec.config.compute.capacity.reservation_id} is paid whether used or not: scaling down "
            f"saves nothing, and the reservation caps the maximum (it must hold {hi * nodes} x {spec.instance.instance_type})"
        )
    else:
        at_min = per_node * lo * nodes if per_node is not None else None
        at_max = per_node * hi * nodes if per_node is not None else None
    if not profile.creates_cluster:
        notes.append(
            f"existing cluster: {hi * nodes} GPU node(s) must be schedulable at the maximum; an idle replica frees "
            f"{spec.target.gpus_per_node * nodes} GPUs for other workloads"
        )
    elif not reserved:
        notes.append(
            f"on-demand GPU node group ranges {lo * nodes}..{hi * nodes} nodes: the cluster autoscaler (installed here) adds "
            "a node for a pending replica and removes an empty one; `pulumi up` never resets the desired size"
        )
    if per_node_sync_seconds(spec, sizing):
        notes.append(
            "a replica on a fresh node copies its weights to the node's NVMe before loading (included in the scale-up time)"
        )
    if asc.schedule:
        windows = "; ".join(f"{w.start} to {w.end} ({w.timezone})" for w in asc.schedule)
        floor = "scales to zero" if lo == 0 else f"keeps {lo}"
        notes.append(f"serving windows {windows}: at least {spec.replicas} replica(s) inside, {floor} outside when idle")
    if lo == 0:
        ns = spec.config.kubernetes.namespace
        notes.append(
            "at zero replicas nothing can see demand (no replica, no queue): outside the windows requests fail until the "
            f"next window opens and a replica has loaded (about {up} s); to serve at once: kubectl -n {ns} annotate "
            f"scaledobject {VLLM_WORKLOAD_NAME} {KEDA_FORCE_ACTIVATION_ANNOTATION}=true (remove it with "
            f"{KEDA_FORCE_ACTIVATION_ANNOTATION}- to hand back to the windows)"
        )
    return ScalingPlan(
        min_replicas=lo,
        max_replicas=hi,
        initial_replicas=spec.replicas,
        controller=asc.controller,
        scale_up_seconds=up,
        scale_up_source=up_source,
        scale_up_bound_seconds=scale_up_bound_seconds(spec, sizing)[0],
        scale_down_delay_seconds=scale_down_delay_seconds(spec, sizing),
        nodes_per_replica=nodes,
        node_min=lo * nodes,
        node_max=hi * nodes,
        usd_per_hour_at_min=at_min,
        usd_per_hour_at_max=at_max,
        price_source=price_source,
        scale_down_saves=not reserved,
        notes=tuple(notes),
    )


def gpu_node_group_size(spec: DeploymentSpec) -> dict[str, int]:
    """``min_size``/``desired_size``/``max_size`` of the EKS GPU node group.

    Desired is the first node count (``compute.replicas`` x nodes per copy; the node group ignores
    later changes, so `pulumi up` never fights the cluster autoscaler). Max is the autoscaler's
    maximum x nodes per copy (else the first count). Min is 0 for reserved capacity (a capacity
    block ends; EKS scales its node group to 0) and for stacks that are not autoscaled (the
    operator may scale to zero between sessions), else the autoscaler's minimum x nodes per copy.
    """
    nodes = spec.nodes_per_copy
    desired = spec.gpu_nodes
    if not autoscaling_enabled(spec):
        return {"min_size": 0, "desired_size": desired, "max_size": desired}
    reserved = spec.config.compute.capacity.type in RESERVED_CAPACITY_TYPES
    low = 0 if reserved else spec.config.autoscaling.min_replicas * nodes
    return {"min_size": low, "desired_size": desired, "max_size": max_replicas(spec) * nodes}

"""Time to ready: every phase between `pulumi up` and a served model, per scenario.

Scenarios (``SCENARIOS``):

- ``first_deploy``: nothing exists; the mirror is empty, so the checkpoint comes from the hub.
- ``repeat_trial``: a trial torn down and brought up again; the in-region mirror (retained on
  destroy) holds the weights and the engine's compile caches (``engine_cache.py``).
- ``replaced_node``: the stack exists; one GPU node is replaced (failure, capacity move) and
  fills its NVMe from the mirror, with the caches.

Each phase has a start, a duration, a source (a public figure, a measured value from
``kimi-deploy:timeToReady``, or the word ``estimate``) and whether it lies on the critical path.
Phases that run side by side overlap (the engine-cache restore runs beside the weight copy).
The model's inputs are the ``Fact`` constants and rates of ``time_inputs.py``, the instance facts in ``targets.py``
(network and NVMe bandwidth), the storage read bandwidth of ``sizing.py`` and the sync's
parallelism (``weights.SYNC_WORKERS`` files x ``naming.S3_PART_CONCURRENCY`` ranged parts).

Physical limit of the copy (the issue's anchor): checkpoint / min(network to S3 x achievable
fraction, connections x per-connection ceiling, NVMe write); then checkpoint / NVMe read for the load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .capacity import usable_until
from .config.spec import DeploymentSpec, format_utc
from .engine_cache import ENGINE_CACHE_GROUP_WAIT_SECONDS, restored_at_start
from .errors import ConfigError
from .prices import PRICES
from .sizing import (
    FSX_THROUGHPUT_SOURCE,
    Sizing,
    compute_sizing,
    step_hub_rate,
    sync_budget_seconds,
    sync_expected_seconds,
)
from .targets import GB, STAGING_INSTANCE
from .time_inputs import (
    ENGINE_CACHE_BYTES,
    FACTS,
    INFRASTRUCTURE_SECONDS,
    INSTANCE_BOOT_SECONDS,
    INSTANCE_LAUNCH_SECONDS,
    REPEAT_TRIAL_GOAL_SECONDS,
    Fact,
    HubRate,
    engine_init_seconds,
    fact_or_measured,
    image_pull_seconds,
    mirror_copy_rate,
    publish_hub_rate,
    stream_rate,
)
from .weights import SHAPE_BUCKET, SyncStep, sync_steps

SCENARIOS = ("first_deploy", "repeat_trial", "replaced_node")
@dataclass(frozen=True)
class Phase:
    """One phase of a scenario.

    Attributes:
        name: what happens (``image pull``, ``weight copy``...).
        start_seconds: when it starts, seconds after the scenario starts.
        seconds: how long it takes.
        source: the figures it is computed from, each with its source, or ``estimate``.
        on_critical_path: whether shortening it shortens the total.
    """

    name: str
    start_seconds: int
    seconds: int
    source: str
    on_critical_path: bool

    @property
    def end_seconds(self) -> int:
        """``start_seconds + seconds``."""
        return self.start_seconds + self.seconds

    def as_json(self) -> dict[str, Any]:
        """``{"name", "start_seconds", "seconds", "source", "on_critical_path"}``."""
        return {"name": self.name, "start_seconds": self.start_seconds, "seconds": self.seconds,
                "source": self.source, "on_critical_path": self.on_critical_path}


@dataclass(frozen=True)
class Scenario:
    """One scenario: its phases and totals.

    Attributes:
        name: one of ``SCENARIOS`` (or an alternative's name).
        phases: in start order (ties: declaration order).
        total_seconds: end of the last phase (the model is served then).
        gpu_seconds: seconds during which the GPU nodes are paid for (from the first phase on a
            GPU node: boot or launch), the wait's GPU time.
        gpu_usd: ``gpu_seconds`` x the GPU price, or None when the price is unknown.
    """

    name: str
    phases: tuple[Phase, ...]
    total_seconds: int
    gpu_seconds: int
    gpu_usd: float | None

    def as_json(self) -> dict[str, Any]:
        """``{"total_seconds": int, "gpu_usd": float | None, "phases": [...]}``."""
        return {"total_seconds": self.total_seconds, "gpu_usd": self.gpu_usd,
                "phases": [p.as_json() for p in self.phases]}

    def seconds_after(self, phase_name: str) -> int:
        """Seconds from the end of ``phase_name`` until ready.

        Raises:
            KeyError: no such phase.
        """
        for p in self.phases:
            if p.name == phase_name:
                return self.total_seconds - p.end_seconds
        raise KeyError(phase_name)


@dataclass(frozen=True)
class _Step:
    name: str
    seconds: float
    source: str
    after: tuple[str, ...]
    gpu: bool = False  # runs on (and bills) a GPU node


def schedule(name: str, steps: list[_Step], usd_per_hour: float | None) -> Scenario:
    """Place ``steps`` (each after its dependencies), mark the critical path, add up.

    Durations are rounded up to whole seconds. The critical path runs back from the phase that
    ends last through, at each step, the dependency that ends last.

    Raises:
        ValueError: a dependency names no earlier step.
    """
    ends: dict[str, int] = {}
    starts: dict[str, int] = {}
    by_name = {s.name: s for s in steps}
    for s in steps:
        for dep in s.after:
            if dep not in ends:
                raise ValueError(f"{name}: phase {s.name!r} depends on {dep!r}, which is not placed before it")
        starts[s.name] = max((ends[d] for d in s.after), default=0)
        ends[s.name] = starts[s.name] + int(math.ceil(s.seconds))
    total = max(ends.values(), default=0)
    critical: set[str] = set()
    current = max(steps, key=lambda s: ends[s.name]).name if steps else None
    while current is not None:
        critical.add(current)
        deps = by_name[current].after
        current = max(deps, key=lambda d: ends[d]) if deps else None
    phases = tuple(Phase(s.name, starts[s.name], ends[s.name] - starts[s.name], s.source, s.name in critical) for s in steps)
    gpu_start = min((starts[s.name] for s in steps if s.gpu), default=total)
    gpu_seconds = total - gpu_start
    usd = round(gpu_seconds / 3600 * usd_per_hour, 2) if usd_per_hour is not None else None
    return Scenario(name, phases, total, gpu_seconds, usd)


def _sync_phase(spec: DeploymentSpec, sizing: Sizing, step: SyncStep, cached_mirror: bool,
                staging: bool = False, slow: bool = False) -> tuple[str, float, str]:
    """(phase name, seconds, source) of one sync step; ``cached_mirror``: the mirror is full;
    ``staging``: the stage's publish (on the stager or the system nodes, not a GPU node); ``slow``:
    a hub download at the slow end of the hub's range."""

    weights = sizing.weights_bytes
    if step.name == "publish-mirror" and cached_mirror:
        return "mirror check (complete)", 1, "a complete mirror is a no-op (manifest + marker read)"
    hub = step_hub_rate(spec, step, staging)
    if hub is not None:
        mirror = step.name == "publish-mirror"
        rate = hub.low if slow else hub.expected
        return (
            "hub download -> mirror" if mirror else "hub download -> node",
            sync_expected_seconds(spec, sizing, step, staging=staging, slow=slow),
            f"{weights / 1e12:.2f} TB at {rate.bytes_per_second / GB:.2f} GB/s ({rate.bound}-bound; {rate.source}); "
            f"hub range {hub.range_text()} [{(hub.expected if slow else hub.low).source}]" + ("" if mirror else "; no mirror"),
        )
    fsx_bps = sizing.storage.fsx_read_bytes_per_second
    # As in sync_expected_seconds: without an FSx figure the step is timed as a mirror copy.
    if step.needs_fsx and fsx_bps:
        return ("weight copy FSx -> NVMe", sync_expected_seconds(spec, sizing, step),
                f"FSx {fsx_bps / GB:.2f} GB/s [{sizing.storage.fsx_capacity_gib:,} GiB x "
                f"{sizing.storage.fsx_throughput_per_tib_mbps:,} MB/s/TiB: {FSX_THROUGHPUT_SOURCE}] shared by "
                f"{spec.gpu_nodes} node(s)")
    rate = mirror_copy_rate(spec)
    return ("weight copy mirror -> NVMe", weights / rate.bytes_per_second,
            f"{weights / 1e12:.2f} TB at {rate.bytes_per_second / GB:.1f} GB/s ({rate.bound}-bound; {rate.source})")


def _load(spec: DeploymentSpec, sizing: Sizing) -> tuple[float, str]:
    st = sizing.storage
    per_node = sizing.weights_bytes / spec.nodes_per_copy
    return per_node / st.read_bytes_per_second, (
        f"{per_node / 1e12:.2f} TB per node at {st.read_bytes_per_second / GB:.1f} GB/s [{st.read_source}]"
    )


def _scenario_steps(spec: DeploymentSpec, sizing: Sizing, steps: tuple[SyncStep, ...], scenario: str,
                    streamer: bool = False, engine_cache: bool = False, slow: bool = False) -> list[_Step]:
    ttr = spec.config.time_to_ready
    platform = spec.platform
    out: list[_Step] = []
    if scenario == "replaced_node":
        # Billing starts when the instance runs, not at the request.
        out.append(_Step("instance launch", *fact_or_measured(INSTANCE_LAUNCH_SECONDS, None, ""), after=()))
        first = "instance launch"
    else:
        secs, src = fact_or_measured(INFRASTRUCTURE_SECONDS[platform], ttr.infrastructure_seconds, "infrastructureSeconds")
        out.append(_Step("infrastructure", secs, src, after=()))
        first = "infrastructure"
    secs, src = fact_or_measured(INSTANCE_BOOT_SECONDS[platform], ttr.instance_boot_seconds, "instanceBootSeconds")
    out.append(_Step("instance boot", secs, src, after=(first,), gpu=True))
    # The sync runs inside the pinned vLLM image (weights.py), so the pull precedes it.
    out.append(_Step("image pull", *image_pull_seconds(spec), after=("instance boot",), gpu=True))
    prev = "image pull"
    before_copy = prev
    cached = scenario != "first_deploy"
    mirror = any(s.name == "publish-mirror" for s in steps)
    for step in steps:
        if streamer and step.name == "node-copy":
            continue
        if scenario == "replaced_node" and step.name == "publish-mirror":
            continue
        name, secs, src = _sync_phase(spec, sizing, step, cached_mirror=cached, slow=slow)
        if step.name == "node-copy":
            before_copy = prev
        out.append(_Step(name, secs, src, after=(prev,), gpu=True))
        prev = name
    ready_after = [prev]
    restored = engine_cache and cached and mirror
    if restored:
        # The engine caches come from the mirror beside the weights (engine_cache.py). On
        # Kubernetes the restore is an init container after the weight-sync one (init containers
        # run one at a time, then vLLM starts: components/k8s/engine_cache.py), so it lies
        # between the copy and the load.
        rate = mirror_copy_rate(spec)
        in_pod = spec.profile.runs_kubernetes
        out.append(_Step("engine cache restore", ENGINE_CACHE_BYTES.value / rate.bytes_per_second,
                         f"{ENGINE_CACHE_BYTES.value / 1e9:g} GB [{ENGINE_CACHE_BYTES.source}] at the copy rate",
                         after=(prev,) if in_pod else (before_copy,), gpu=True))
        if in_pod:
            prev = "engine cache restore"
        else:
            ready_after.append("engine cache restore")
    if streamer:
        rate = stream_rate(spec)
        per_node = sizing.weights_bytes / spec.nodes_per_copy
        out.append(_Step("weight stream S3 -> GPU (runai_streamer)", per_node / rate.bytes_per_second,
                         f"{per_node / 1e12:.2f} TB at {rate.bytes_per_second / GB:.1f} GB/s ({rate.bound}-bound; {rate.source})",
                         after=(prev,), gpu=True))
        load = "weight stream S3 -> GPU (runai_streamer)"
    else:
        out.append(_Step("weight load", *_load(spec, sizing), after=(prev,), gpu=True))
        load = "weight load"
    secs, src = engine_init_seconds(spec, cached=restored)
    out.append(_Step("engine init" + (" (cached)" if restored else " (cold)"), secs, src,
                     after=tuple(dict.fromkeys([load, *ready_after[1:]])), gpu=True))
    return out


@dataclass(frozen=True)
class TimeToReady:
    """The model's result for one stack.

    Attributes:
        scenarios: ``SCENARIOS`` name -> Scenario.
        streamer_repeat_trial: the repeat trial loading with ``--load-format runai_streamer``
            straight from the mirror (no copy), side by side with the copy; None without a mirror.
        engine_cache_repeat_trial: where the boot chain does not restore the engine's compile
            caches (``engine_cache.restored_at_start``: the kubernetes platform), the repeat trial as it
            would be with them, side by side; None where they are restored (the scenarios include
            it) or without a mirror.
        goal_seconds: ``REPEAT_TRIAL_GOAL_SECONDS``.
        repeat_trial_after_running_seconds: repeat trial, from the instance running until ready.
        first_deploy_slow: ``first_deploy`` with the hub download at the slow end of the hub's range
            (``time_inputs.HUB_DOWNLOAD_LOW_BYTES_PER_SECOND``): the other end of its figure.
    """

    scenarios: dict[str, Scenario]
    streamer_repeat_trial: Scenario | None
    engine_cache_repeat_trial: Scenario | None
    goal_seconds: int
    repeat_trial_after_running_seconds: int
    first_deploy_slow: Scenario

    @property
    def goal_met(self) -> bool:
        """Whether the repeat trial is ready within ``goal_seconds`` of the instance running."""
        return self.repeat_trial_after_running_seconds <= self.goal_seconds

    def as_json(self) -> dict[str, Any]:
        """``{"first_deploy": S, "repeat_trial": S, "replaced_node": S}`` (see ``Scenario.as_json``)."""
        return {name: self.scenarios[name].as_json() for name in SCENARIOS}


def time_to_ready(spec: DeploymentSpec, sizing: Sizing, steps: tuple[SyncStep, ...]) -> TimeToReady:
    """The time-to-ready model of ``spec`` for each scenario.

    Args:
        spec: the deployment spec (its ``timeToReady`` overrides replace estimates).
        sizing: ``sizing.compute_sizing(spec)`` (weights, storage read bandwidth, price).
        steps: ``weights.sync_steps(spec, bucket)`` (which copies happen).
    """

    restored = restored_at_start(spec)
    scenarios = {name: schedule(name, _scenario_steps(spec, sizing, steps, name, engine_cache=restored), sizing.usd_per_hour)
                 for name in SCENARIOS}
    mirror = any(s.name == "publish-mirror" for s in steps)
    streamer = None
    if mirror and spec.config.storage.kind == "nvme":
        streamer = schedule("repeat_trial_runai_streamer",
                            _scenario_steps(spec, sizing, steps, "repeat_trial", streamer=True, engine_cache=restored),
                            sizing.usd_per_hour)
    cached = None
    if mirror and not restored:
        cached = schedule("repeat_trial_engine_cache",
                          _scenario_steps(spec, sizing, steps, "repeat_trial", engine_cache=True), sizing.usd_per_hour)
    repeat = scenarios["repeat_trial"]
    after_running = repeat.seconds_after(repeat.phases[0].name)
    slow = schedule("first_deploy", _scenario_steps(spec, sizing, steps, "first_deploy", engine_cache=restored, slow=True),
                    sizing.usd_per_hour)
    return TimeToReady(scenarios, streamer, cached, REPEAT_TRIAL_GOAL_SECONDS, after_running, slow)


def first_deploy_seconds(spec: DeploymentSpec, sizing: Sizing, steps: tuple[SyncStep, ...]) -> int:
    """Expected seconds from `pulumi up` to a served model on a first deploy with an empty
    mirror: ``time_to_ready``'s ``first_deploy`` scenario (infrastructure, boot, image pull,
    the sync steps, the weight load and a cold engine start)."""
    return time_to_ready(spec, sizing, steps).scenarios["first_deploy"].total_seconds


def stack_time_to_ready(spec: DeploymentSpec) -> TimeToReady:
    """``time_to_ready`` of ``spec`` with its own sizing and sync steps (the mirror named by
    ``weights.SHAPE_BUCKET`` when the stack uses one): what preflight and the plan compare the
    cloud's time with."""

    steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    return time_to_ready(spec, compute_sizing(spec), steps)


# --- a serving pod, from its creation until ready (Kubernetes platforms) ---------------------------
# What each of a serving pod's phases may take before something gives up: the startup probe and
# ``progressDeadlineSeconds``, Pulumi's custom timeouts, and the alerts that watch a pod's start
# (``components/k8s``) all read ``pod_ready_budget``. The phases themselves are the model's.
# Pulling the ~12.6 GB compressed image onto a node (the model expects about two minutes; a
# registry or a node's disk can be far slower).
IMAGE_PULL_BUDGET_SECONDS = 1_800
# The startup probe's window outlasts VLLM_ENGINE_READY_TIMEOUT_S (the startup budget) by this
# much, so vLLM's own "engine not ready within N s" error is logged and exits the container
# before the kubelet kills it for a failed probe (which would leave only "Startup probe failed").
ENGINE_TIMEOUT_MARGIN_SECONDS = 300
# The engine-cache restore init container gives up (and vLLM starts cold) after this long.
ENGINE_CACHE_RESTORE_BUDGET_SECONDS = 1_800
# A pod waiting for a node (a replaced node, a scale-up onto a new one) may wait this multiple of
# the model's launch + boot, rounded up to whole minutes.
NODE_WAIT_SAFETY_FACTOR = 2.0
NODE_WAIT_PHASE = "node wait (launch + boot)"
VLLM_START_PHASE = "vLLM start (weight load + engine init)"
ENGINE_CACHE_GROUP_PHASE = "engine cache saves of the group (leader's gate)"


@dataclass(frozen=True)
class PodPhase:
    """One phase of a serving pod's start, as the time-to-ready model schedules it.

    Attributes:
        name: the model's phase name (``image pull``, ``hub download -> node``, ...), or
            ``NODE_WAIT_PHASE`` / ``VLLM_START_PHASE`` for the model's phases they join.
        expected_seconds: the model's duration of the phase in this scenario.
        budget_seconds: how long it may take before its own timeout gives up (a budget, not an
            estimate: the sync budget of a copy, the startup budget of vLLM's start, ...).
        budget_source: where ``budget_seconds`` comes from.
        init_container: the phase runs in an init container (the node-local copy, the cache restore).
    """

    name: str
    expected_seconds: int
    budget_seconds: int
    budget_source: str
    init_container: bool = False


@dataclass(frozen=True)
class PodReadyBudget:
    """How long a serving pod takes, and may take, from its creation until it is ready.

    On a Kubernetes platform a vLLM pod runs, after it is created: a wait for a node (only where
    a node is added or replaced for it), the image pull, the node-local weight copy (an init
    container), the engine-cache restore (an init container), then vLLM's load and engine start.
    Which of these run depends on the platform and storage (the model's scenarios say it).

    Attributes:
        scenarios: ``SCENARIOS`` name -> the pod's phases in that scenario, in order.
        scenario: the scenario whose phases add up to the largest budget (``budget_seconds``).
    """

    scenarios: dict[str, tuple[PodPhase, ...]]
    scenario: str

    @property
    def phases(self) -> tuple[PodPhase, ...]:
        """The phases of ``scenario``."""
        return self.scenarios[self.scenario]

    @property
    def budget_seconds(self) -> int:
        """Creation-to-ready budget of one pod: the budgets of ``scenario``'s phases added up.
        The startup alerts, ``progressDeadlineSeconds`` and Pulumi's timeouts use it."""
        return sum(p.budget_seconds for p in self.phases)

    def expected_seconds(self, scenario: str) -> int:
        """The model's creation-to-ready time of a pod in ``scenario``.

        Raises:
            KeyError: no such scenario.
        """
        return sum(p.expected_seconds for p in self.scenarios[scenario])

    def init_budget_seconds(self) -> int:
        """What the init containers may add to a pod's start (their budgets added up)."""
        return sum(p.budget_seconds for p in self.phases if p.init_container)


def _minutes_up(seconds: float) -> int:
    return int(math.ceil(seconds / 60) * 60)


def pod_ready_budget(spec: DeploymentSpec, sizing: Sizing, steps: tuple[SyncStep, ...] | None = None) -> PodReadyBudget:
    """The phases of a serving pod's start in each scenario of ``time_to_ready(spec, sizing, steps)``,
    with each phase's budget.

    In ``first_deploy`` and ``repeat_trial`` the pods are created on nodes that exist (the workload
    is declared after the node groups; on an existing cluster the nodes are there); in
    ``replaced_node`` (also a scale-up onto a new node) a pod waits for the node's launch and boot.
    The publish to the mirror runs before the workload exists (a Job the workload depends on) and
    is not a pod phase. Budgets: ``NODE_WAIT_SAFETY_FACTOR`` x the wait, ``IMAGE_PULL_BUDGET_SECONDS``,
    the copy's ``sizing.sync_budget_seconds``, ``ENGINE_CACHE_RESTORE_BUDGET_SECONDS``, and
    ``sizing.startup_budget_seconds + ENGINE_TIMEOUT_MARGIN_SECONDS`` for vLLM's load and start.

    Args:
        spec, sizing: as ``time_to_ready``.
        steps: ``weights.sync_steps(spec, bucket)``; default: with ``SHAPE_BUCKET`` when the
            mirror is enabled (as ``stack_time_to_ready``).
    """

    if steps is None:
        steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    model = time_to_ready(spec, sizing, steps)
    copies = {_sync_phase(spec, sizing, s, cached_mirror=False)[0]: s for s in steps if s.per_node}
    start_budget = sizing.startup_budget_seconds + ENGINE_TIMEOUT_MARGIN_SECONDS
    scenarios: dict[str, tuple[PodPhase, ...]] = {}
    for name in SCENARIOS:
        by_name = {p.name: p for p in model.scenarios[name].phases}
        out: list[PodPhase] = []
        if name == "replaced_node":
            wait = sum(by_name[n].seconds for n in ("instance launch", "instance boot") if n in by_name)
            out.append(PodPhase(NODE_WAIT_PHASE, wait, _minutes_up(NODE_WAIT_SAFETY_FACTOR * wait),
                                f"{NODE_WAIT_SAFETY_FACTOR:g} x the model's instance launch + boot"))
        out.append(PodPhase("image pull", by_name["image pull"].seconds, IMAGE_PULL_BUDGET_SECONDS,
                            "IMAGE_PULL_BUDGET_SECONDS"))
        for phase_name, step in copies.items():
            if phase_name in by_name:
                out.append(PodPhase(phase_name, by_name[phase_name].seconds, sync_budget_seconds(spec, sizing, step),
                                    f"the {step.name} step's sync budget (sizing.sync_budget_seconds)", True))
        if restored_at_start(spec):
            # The restore init container runs in every pod (on a first deploy it finds nothing).
            restore = by_name.get("engine cache restore")
            out.append(PodPhase("engine cache restore", restore.seconds if restore else 0,
                                ENGINE_CACHE_RESTORE_BUDGET_SECONDS, "ENGINE_CACHE_RESTORE_BUDGET_SECONDS", True))
        load = next(p for p in model.scenarios[name].phases if p.name == "weight load")
        init = next(p for p in model.scenarios[name].phases if p.name.startswith("engine init"))
        out.append(PodPhase(VLLM_START_PHASE, load.seconds + init.seconds, start_budget,
                            "the startup budget (sizing.startup_budget_seconds) + ENGINE_TIMEOUT_MARGIN_SECONDS"))
        if restored_at_start(spec) and spec.nodes_per_copy > 1:
            # The leader's API gate waits for its workers' engine-cache saves (the same bytes as
            # the restore moves, the other way; scripts/node/engine_cache.py --group-nodes).
            restore = by_name.get("engine cache restore")
            out.append(PodPhase(ENGINE_CACHE_GROUP_PHASE, restore.seconds if restore else 0,
                                ENGINE_CACHE_GROUP_WAIT_SECONDS, "engine_cache.ENGINE_CACHE_GROUP_WAIT_SECONDS"))
        scenarios[name] = tuple(out)
    worst = max(SCENARIOS, key=lambda n: (sum(p.budget_seconds for p in scenarios[n]), n == "replaced_node"))
    return PodReadyBudget(scenarios, worst)


def pulumi_up_seconds(spec: DeploymentSpec, model: TimeToReady) -> tuple[int, str]:
    """``(seconds, how)``: the modelled duration of the first `pulumi up` of ``spec``, which the
    deploying credentials must outlive.

    Where the workloads are Kubernetes objects, pulumi-kubernetes awaits them: the weight-sync
    Jobs and the vLLM workload until ready (``components/k8s``: custom timeouts sized to the
    startup budget; ``pulumi.com/waitFor`` on the LeaderWorkerSet), so `pulumi up` lasts the whole
    ``first_deploy`` scenario. On aws-ec2 it returns once the instance runs (the sync and vLLM
    start under systemd on the instance): the ``infrastructure`` phase.
    """
    first = model.scenarios["first_deploy"]
    if spec.profile.runs_kubernetes:
        return first.total_seconds, (
            "first deploy: pulumi-kubernetes waits for the weight-sync Jobs and the vLLM workload until ready"
        )
    infrastructure = next(p for p in first.phases if p.name == "infrastructure")
    return infrastructure.end_seconds, "`pulumi up` returns once the instance runs (the sync runs on the instance)"


# Why the scenarios start the engine cold although engine_cache.py exists (docs/time-to-ready.md).
ENGINE_CACHE_NOTE = (
    "engine caches: on aws-ec2 (boot units) and aws-eks (a restore init container and a save sidecar "
    "in every vLLM pod) they are restored from the mirror before vLLM starts and saved after its "
    "first healthy start (the node program engine_cache.py, keyed by engine build, revision, layout, node of "
    "the copy and GPU); on the kubernetes platform not (the mirror's credentials there are the "
    "operator's, nothing is granted the right to save), so those scenarios start the engine cold and "
    "the cached figure is shown beside them where a mirror exists"
)


# Why runai_streamer is modelled but not the default (docs/time-to-ready.md); read from the
# vLLM 0.33.0 wheel (model_executor/model_loader/runai_streamer_loader.py, the same file in 0.34.0).
RUNAI_STREAMER_NOTE = (
    "vLLM 0.34.0 supports --load-format runai_streamer from s3:// for this model's safetensors "
    "(runai_streamer_loader.py, generic load_weights path); without --model-loader-extra-config "
    "'{\"distributed\": true}' every one of the 8 TP ranks reads the whole checkpoint (8x the S3 "
    "traffic). It skips the NVMe copy, but every engine restart streams 1.56 TB again and it "
    "replaces the recipe's fastsafetensors loader; not yet a storage.kind here (follow-up)."
)


# --- stage, then serve (config/phase.py) -------------------------------------------------------
# The stager (aws-ec2): boot, cloud-init installs docker from the AL2023 repositories, RAID0 of its
# instance store; then it pulls the engine image like a GPU node.
STAGER_BOOT_SECONDS = Fact(180, "estimate: boot + cloud-init (dnf install docker) + RAID0 of the instance store")
FACTS["STAGER_BOOT_SECONDS"] = STAGER_BOOT_SECONDS
# The EKS system node group (components/aws/cluster.py: 2 x m7i.xlarge) runs the stage's publish;
# it is billed in both phases, so what a stage adds on aws-eks is its hours of these nodes.
SYSTEM_NODE_USD_PER_HOUR = Fact(
    2 * PRICES["m7i.xlarge"].usd, f"2 x m7i.xlarge at USD {PRICES['m7i.xlarge'].usd}/h ({PRICES['m7i.xlarge'].source}, "
    f"{PRICES['m7i.xlarge'].date}; components/core/prices.py)"
)
FACTS["SYSTEM_NODE_USD_PER_HOUR"] = SYSTEM_NODE_USD_PER_HOUR
# Why the GPU saving may not be real (docs/time-to-ready.md): reserved capacity bills for its term.
RESERVATION_NOTE = (
    "capacity reservations bill for their whole term whether or not instances run (an ODCR from its "
    "start until cancelled, a capacity block for its term: `pulumi destroy` cancels neither): staging "
    "saves GPU money only when the reservation starts at the switch to serve"
)


@dataclass(frozen=True)
class StageThenServe:
    """``phase: stage`` until the mirror is complete, then ``phase: serve``, beside a single ``pulumi up``.

    Attributes:
        single_up: today's first deploy (``first_deploy``): the GPUs wait for the hub download.
        stage: the stage on its own compute (no GPU): infrastructure, the stager (or system nodes),
            image pull, hub download -> mirror. Its end is when to switch (the mirror's marker).
        serve: after the switch: the GPU nodes launch and copy from the complete mirror (the engine
            starts cold: no cache is saved before the first serve).
        staging_compute: what runs the stage (``targets.STAGING_INSTANCE``, the system nodes, the cluster's own).
        staging_usd_per_hour, staging_source: its price, or None where nothing is added.
        staging_usd: ``staging_usd_per_hour`` x the stage's hours on it, or None.
        reservation_bills_anyway: the GPU capacity is an ODCR or capacity block (``RESERVATION_NOTE``).
        single_up_slow, stage_slow, staging_usd_slow: the same at the slow end of the hub's range.
        stage_hub: the hub download rate on the staging compute (``capped_by`` says when its network,
            not the hub, bounds it).
    """

    single_up: Scenario
    stage: Scenario
    serve: Scenario
    staging_compute: str
    staging_usd_per_hour: float | None
    staging_source: str
    staging_usd: float | None
    reservation_bills_anyway: bool
    single_up_slow: Scenario
    stage_slow: Scenario
    staging_usd_slow: float | None
    stage_hub: HubRate

    @property
    def total_seconds(self) -> int:
        """Stage, then serve, switching at the mirror's completion."""
        return self.stage.total_seconds + self.serve.total_seconds

    @property
    def gpu_seconds_saved(self) -> int:
        """GPU-node seconds the single ``pulumi up`` pays for and the switch does not."""
        return self.single_up.gpu_seconds - self.serve.gpu_seconds

    @property
    def gpu_usd_saved(self) -> float | None:
        """``single_up.gpu_usd - serve.gpu_usd`` (None when the GPU price is unknown)."""
        if self.single_up.gpu_usd is None or self.serve.gpu_usd is None:
            return None
        return round(self.single_up.gpu_usd - self.serve.gpu_usd, 2)

    def _net_usd(self, single: Scenario, staging_usd: float | None) -> float | None:
        if single.gpu_usd is None or self.serve.gpu_usd is None:
            return None
        return round(single.gpu_usd - self.serve.gpu_usd - (staging_usd or 0.0), 2)

    @property
    def net_usd_saved(self) -> float | None:
        """GPU USD saved less the staging compute's USD, at the hub's expected rate (None: no GPU price)."""
        return self._net_usd(self.single_up, self.staging_usd)

    @property
    def net_usd_saved_slow(self) -> float | None:
        """``net_usd_saved`` at the slow end of the hub's range."""
        return self._net_usd(self.single_up_slow, self.staging_usd_slow)

    @property
    def pays(self) -> bool | None:
        """Whether staging first saves money: a positive net saving at the hub's expected rate and no
        reservation that bills its term anyway (None: no GPU price)."""
        if self.net_usd_saved is None:
            return None
        return self.net_usd_saved > 0 and not self.reservation_bills_anyway

    @property
    def verdict(self) -> str:
        """One plain sentence: whether staging first pays, by how much at both ends of the hub's range,
        and what it costs in time to ready."""
        later = self.total_seconds - self.single_up.total_seconds
        if max(self.total_seconds, self.single_up.total_seconds) < HOURS_SHOWN_FROM_SECONDS:
            # The difference of the two figures the plan shows beside it (44 and 51 min: 7 min later), not
            # the difference rounded up on its own (427 s: "8 min later" under 44 and 51).
            later_minutes = whole_minutes(self.total_seconds) - whole_minutes(self.single_up.total_seconds)
            when = (f"ready {abs(later_minutes)} min {'later' if later_minutes > 0 else 'sooner'}" if later_minutes
                    else "ready within the same minute")
        else:
            when = f"ready {_minutes(abs(later))} {'later' if later >= 0 else 'sooner'}"
        cap = (f"; the {self.stage_hub.capped_by} caps the stage's hub download at "
               f"{self.stage_hub.expected.bytes_per_second / GB:.2f} GB/s" if self.stage_hub.capped_by else "")
        if self.net_usd_saved is None:
            return f"staging first: no GPU price, no verdict ({when}){cap}"
        saved = (f"USD {self.net_usd_saved:,.2f} net at the hub's expected rate, USD {self.net_usd_saved_slow:,.2f} "
                 f"at its slow end")
        if self.reservation_bills_anyway:
            return (f"staging first does not pay here: the reservation bills its whole term (it would save {saved} "
                    f"only if the reservation started at the switch); {when}{cap}")
        if not self.pays:
            return f"staging first does not pay: {saved}; {when}{cap}"
        return f"staging first saves {saved}; {when}{cap}"

    def as_json(self) -> dict[str, Any]:
        """The plan's ``stage_then_serve`` section (every figure; the scenarios' phases)."""
        return {
            "single_up": self.single_up.as_json() | {"gpu_seconds": self.single_up.gpu_seconds},
            "stage": self.stage.as_json(),
            "serve": self.serve.as_json() | {"gpu_seconds": self.serve.gpu_seconds},
            "switch_at_seconds": self.stage.total_seconds,
            "switch_when": "the mirror's .weights-complete.json exists (stack output mirrorCompleteMarker; "
                           "kimi-deploy preflight: mirror pass)",
            "total_seconds": self.total_seconds,
            "gpu_seconds_saved": self.gpu_seconds_saved,
            "gpu_usd_saved": self.gpu_usd_saved,
            "staging_compute": self.staging_compute,
            "staging_usd_per_hour": self.staging_usd_per_hour,
            "staging_source": self.staging_source,
            "staging_usd": self.staging_usd,
            "reservation_bills_anyway": self.reservation_bills_anyway,
            "reservation_note": RESERVATION_NOTE if self.reservation_bills_anyway else None,
            "single_up_slow": {"total_seconds": self.single_up_slow.total_seconds, "gpu_usd": self.single_up_slow.gpu_usd},
            "stage_slow_total_seconds": self.stage_slow.total_seconds,
            "staging_usd_slow": self.staging_usd_slow,
            "net_usd_saved": self.net_usd_saved,
            "net_usd_saved_slow": self.net_usd_saved_slow,
            "stage_hub_capped_by": self.stage_hub.capped_by,
            "pays": self.pays,
            "verdict": self.verdict,
        }


# The plan's tables show a duration in whole minutes below this, in hours from it (scripts/ops/plan.py _duration).
HOURS_SHOWN_FROM_SECONDS = 7200


def whole_minutes(seconds: float) -> int:
    """``seconds`` to the nearest whole minute, as the plan's tables show a duration under
    ``HOURS_SHOWN_FROM_SECONDS`` (``scripts/ops/plan._duration``): one rounding for a figure and
    for a difference said beside it."""
    return int(f"{int(seconds) / 60:.0f}")


def _minutes(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5_400 else f"{math.ceil(seconds / 60):.0f} min"


def _staging_compute(spec: DeploymentSpec) -> tuple[str, float | None, str]:

    if spec.profile.serves_under_systemd:
        s = STAGING_INSTANCE
        return (f"{s.instance_type} stager (terminates when the mirror is complete)", s.usd_per_hour, s.price_source)
    if spec.profile.stages_on_system_nodes:
        return ("the EKS system nodes (billed in serve too)", SYSTEM_NODE_USD_PER_HOUR.value, SYSTEM_NODE_USD_PER_HOUR.source)
    return ("the cluster's own nodes (no compute added)", None, "an existing cluster: nothing is added")


def _stage(spec: DeploymentSpec, sizing: Sizing, publish: SyncStep, slow: bool) -> Scenario:
    """The stage on its own compute (``StageThenServe.stage``); ``slow``: the hub's slow end."""
    ttr = spec.config.time_to_ready
    infra, infra_src = fact_or_measured(INFRASTRUCTURE_SECONDS[spec.platform], ttr.infrastructure_seconds,
                                         "infrastructureSeconds")
    stage_steps = [_Step("infrastructure (no GPU)", infra, infra_src, after=())]
    first = "infrastructure (no GPU)"
    if spec.profile.serves_under_systemd:
        boot, boot_src = fact_or_measured(STAGER_BOOT_SECONDS, ttr.stager_boot_seconds, "stagerBootSeconds")
        stage_steps.append(_Step("stager boot", boot, boot_src, after=(first,)))
        first = "stager boot"
    stage_steps.append(_Step("image pull", *image_pull_seconds(spec), after=(first,)))
    name, secs, src = _sync_phase(spec, sizing, publish, cached_mirror=False, staging=True, slow=slow)
    stage_steps.append(_Step(name, secs, src, after=("image pull",)))
    return schedule("stage", stage_steps, None)


def _staging_usd(stage: Scenario, usd_per_hour: float | None) -> float | None:
    # The staging compute bills after the infrastructure is up (the stager from its boot to its
    # power-off; the system nodes for as long as the stage keeps the GPUs away).
    staged_seconds = stage.total_seconds - stage.phases[0].seconds
    return round(staged_seconds / 3600 * usd_per_hour, 2) if usd_per_hour is not None else None


def stage_then_serve(spec: DeploymentSpec, sizing: Sizing, steps: tuple[SyncStep, ...]) -> StageThenServe | None:
    """The stage-then-serve model of ``spec`` beside ``first_deploy``, or None without a mirror
    (nothing to stage: ``phase: stage`` is refused there, config/phase.py). Both are computed at the
    hub's expected rate and again at its slow end (``time_inputs.hub_download_rate``).

    Args:
        spec, sizing: as ``time_to_ready``.
        steps: ``weights.sync_steps(spec, bucket)`` of serve (its ``publish-mirror`` is the stage's).
    """
    publish = next((s for s in steps if s.name == "publish-mirror"), None)
    if publish is None:
        return None
    single = schedule("first_deploy", _scenario_steps(spec, sizing, steps, "first_deploy"), sizing.usd_per_hour)
    single_slow = schedule("first_deploy", _scenario_steps(spec, sizing, steps, "first_deploy", slow=True),
                           sizing.usd_per_hour)
    compute, usd_per_hour, source = _staging_compute(spec)
    stage = _stage(spec, sizing, publish, slow=False)
    stage_slow = _stage(spec, sizing, publish, slow=True)
    # After the switch the GPU nodes are new ones on a stack that exists: as a replaced node, with a
    # cold engine (the first serve saves the caches).
    serve = schedule("serve_after_stage", _scenario_steps(spec, sizing, steps, "replaced_node", engine_cache=False),
                     sizing.usd_per_hour)
    reserved = spec.config.compute.capacity.type in ("odcr", "capacity-block")
    hub = publish_hub_rate(spec, staging=True)
    return StageThenServe(single, stage, serve, compute, usd_per_hour, source, _staging_usd(stage, usd_per_hour), reserved,
                          single_slow, stage_slow, _staging_usd(stage_slow, usd_per_hour), hub)


# --- windows the stack must be ready within (issue: a window shorter than the time to ready) -------
@dataclass(frozen=True)
class ReadyWindow:
    """A time after which the stack stops serving, seen from a `pulumi up` now.

    Attributes:
        key: the config key that sets it (``trialTtlHours``, ``expiresAt``, ``compute.capacity.endsAt``).
        value: the key's value as written.
        seconds: from now until the window closes (a capacity block: until AWS starts terminating
            its instances, ``capacity.usable_until``).
        what: what closes (``the trial expires``...).
    """

    key: str
    value: object
    seconds: int
    what: str


def ready_windows(spec: DeploymentSpec, now: datetime) -> list[ReadyWindow]:
    """Every window of ``spec`` (one rule for all): an ``expiresAt``, a trial's ``trialTtlHours``
    (when it has no ``expiresAt``: its expiry is fixed at the first `pulumi up`), a capacity block's end."""
    out: list[ReadyWindow] = []
    if spec.expires_at is not None:
        out.append(ReadyWindow("expiresAt", format_utc(spec.expires_at), int((spec.expires_at - now).total_seconds()),
                               "the stack expires"))
    elif spec.environment == "trial":
        out.append(ReadyWindow("trialTtlHours", spec.trial_ttl_hours, spec.trial_ttl_hours * 3600,
                               "the trial expires"))
    cap = spec.config.compute.capacity
    if cap.type == "capacity-block" and cap.ends_at is not None:
        usable = usable_until(cap.ends_at)
        out.append(ReadyWindow("compute.capacity.endsAt", format_utc(cap.ends_at), int((usable - now).total_seconds()),
                               f"AWS terminates the capacity block's instances ({format_utc(usable)})"))
    return out


def window_blockers(spec: DeploymentSpec, now: datetime, model: TimeToReady | None = None) -> list[ConfigError]:
    """A ``ConfigError`` for each window (``ready_windows``) that closes before the first deploy can
    be ready at the slow end of the hub's range (``TimeToReady.first_deploy_slow``): `pulumi up`
    refuses it and ``plan --strict`` exits 2. Each names both figures (the window, the modelled time
    to ready at both ends of the hub's range) and the repeat trial's, from a complete mirror.

    Args:
        model: ``stack_time_to_ready(spec)`` (computed when None and a window exists).
    """
    windows = ready_windows(spec, now)
    if not windows:
        return []
    model = model or stack_time_to_ready(spec)
    first = model.scenarios["first_deploy"].total_seconds
    slow = model.first_deploy_slow.total_seconds
    repeat = model.scenarios["repeat_trial"].total_seconds
    errors = []
    for w in windows:
        if w.seconds >= slow:
            continue
        modelled = f"{_minutes(first)}" + (f"-{_minutes(slow)}" if slow != first else "")
        errors.append(ConfigError(
            w.key, w.value,
            f"leaves {_minutes(max(w.seconds, 0))} from a `pulumi up` now until {w.what}, less than the modelled first "
            f"deploy ({modelled} with an empty mirror, the hub download at both ends of its range; a repeat trial from a "
            f"complete mirror {_minutes(repeat)}): allow at least {_minutes(slow)}",
        ))
    return errors


# --- waits far beyond the modelled time to ready ---------------------------------------------------
# A startup budget (VLLM_ENGINE_READY_TIMEOUT_S, the startup probe) or a weights retry window longer
# than this is warned: a hung start or a failing weight sync keeps the GPUs billing that long before
# anything gives up. The bound is the smaller of LONG_WAIT_FIRST_DEPLOY_FACTOR x the modelled first
# deploy (slow end of the hub's range) and LONG_WAIT_HOURS (a measured figure that itself makes the
# model days long still meets the absolute bound). Both are judgement calls, not published figures.
LONG_WAIT_FIRST_DEPLOY_FACTOR = 3.0
LONG_WAIT_HOURS = 12.0


def long_wait_bound(model: TimeToReady) -> tuple[int, str]:
    """``(seconds, which)``: the bound above which a startup budget or retry window is warned, and
    which of the two rules set it (``LONG_WAIT_HOURS`` or ``LONG_WAIT_FIRST_DEPLOY_FACTOR`` x the
    modelled first deploy, slow end)."""
    slow = model.first_deploy_slow.total_seconds
    by_model = int(LONG_WAIT_FIRST_DEPLOY_FACTOR * slow)
    absolute = int(LONG_WAIT_HOURS * 3600)
    if by_model <= absolute:
        return by_model, (f"{LONG_WAIT_FIRST_DEPLOY_FACTOR:g}x the modelled first deploy of {_hours(slow)}; "
                          f"the bound is the smaller of that and {LONG_WAIT_HOURS:g} h")
    return absolute, (f"{LONG_WAIT_HOURS:g} h, the bound below {LONG_WAIT_FIRST_DEPLOY_FACTOR:g}x the modelled "
                      f"first deploy of {_hours(slow)}")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _gpu_cost(seconds: float, usd_per_hour: float | None) -> str:
    if usd_per_hour is None:
        return "the GPU cost unknown (no price: set compute.usdPerHour)"
    return f"USD {seconds / 3600 * usd_per_hour:,.0f} of GPU time at the stack's USD {usd_per_hour:,.2f}/h"


def long_wait_warnings(spec: DeploymentSpec, model: TimeToReady | None = None) -> list[str]:
    """Warnings for waits far beyond the modelled time to ready (``long_wait_bound``): the startup
    budget (``sizing.startup_budget_seconds``, named by the measured keys that make it long:
    ``storage.readGBps``, ``timeToReady.engineInitSeconds``) and the EC2 weights unit's retry window
    (``compute.weightsRetry``: (attempts - 1) x delaySeconds). Each names key, value, the hours, the
    bound and the GPU cost of waiting it out at the stack's price (``sizing.usd_per_hour``).

    Args:
        model: ``stack_time_to_ready(spec)`` (computed when None).
    """
    model = model or stack_time_to_ready(spec)
    sizing = compute_sizing(spec)
    bound, which = long_wait_bound(model)
    out: list[str] = []
    budget = sizing.startup_budget_seconds
    if budget > bound:
        init_s, _ = engine_init_seconds(spec, cached=False)
        keys = []
        read_gbps = spec.config.storage.read_gbps
        if read_gbps is not None:
            keys.append(f"storage.readGBps {read_gbps:g} (a weight load of {_hours(sizing.load_seconds)})")
        measured_init = spec.config.time_to_ready.engine_init_seconds
        if measured_init is not None:
            keys.append(f"timeToReady.engineInitSeconds {measured_init:g} ({_hours(init_s)} of engine init)")
        cause = " and ".join(keys) or (f"a weight load of {_hours(sizing.load_seconds)} ({sizing.storage.read_source}) "
                                       f"and {_hours(init_s)} of engine init")
        out.append(
            f"{cause} gives a startup budget of {_hours(budget)} (VLLM_ENGINE_READY_TIMEOUT_S, the startup probe), above "
            f"{_hours(bound)} ({which}): a hung start keeps the GPUs waiting that long, {_gpu_cost(budget, sizing.usd_per_hour)}"
            "; check the measured figure's unit"
        )
    # Read on aws-ec2 only (config/platform_keys.py); elsewhere it stays at its default, far below any bound.
    retry = spec.config.compute.weights_retry
    window = (retry.attempts - 1) * retry.delay_seconds
    if window > bound:
        out.append(
            f"compute.weightsRetry {{attempts: {retry.attempts}, delaySeconds: {retry.delay_seconds}}} keeps a failing "
            f"weights unit retrying for {_hours(window)} before it gives up, above {_hours(bound)} ({which}): the GPU "
            f"node idles meanwhile, {_gpu_cost(window, sizing.usd_per_hour)}"
        )
    return out


def schedule_window_warnings(spec: DeploymentSpec, model: TimeToReady | None = None) -> list[str]:
    """With ``autoscaling.minReplicas`` 0, a warning for each ``autoscaling.schedule`` window shorter
    than the modelled scale-up (the ``replaced_node`` scenario: launch, boot, pull, copy, load, engine
    init): its replica starts and is never ready inside the window. Names the window, its shortest
    length (``config.scaling.shortest_window_seconds``) and the modelled time, the rule
    ``window_blockers`` applies to trial windows.

    Args:
        model: ``stack_time_to_ready(spec)`` (computed when None and a window exists).
    """
    from .config.scaling import shortest_window_seconds

    asc = spec.config.autoscaling
    if not (asc.enabled and asc.min_replicas == 0 and asc.schedule):
        return []
    model = model or stack_time_to_ready(spec)
    scale_up = model.scenarios["replaced_node"].total_seconds
    out = []
    for i, w in enumerate(asc.schedule):
        length = shortest_window_seconds(w.start, w.end)
        if length is not None and length < scale_up:
            out.append(
                f"autoscaling.schedule.{i} {w.start!r} to {w.end!r} ({w.timezone}) opens a window of {_minutes(length)}, "
                f"shorter than the modelled scale-up of {_minutes(scale_up)} (a new replica on a fresh node: launch, boot, "
                f"image pull, weight load, engine init) with autoscaling.minReplicas 0: its replica is never ready inside "
                f"the window; open it at least {_minutes(scale_up)} before it must serve"
            )
    return out

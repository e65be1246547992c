"""Sizing: storage, weight-load time, the startup budget every timeout uses, KV-cache capacity
and download time. Pure functions over the spec; units are in every name.

Sources: FSx facts in ``fsx.py``; GPU and NVMe facts in ``targets.py``; KV bytes per token from
the engine's cache layout in ``kv_layout.py``, the fitted memory reserve and the recipe's claim in
``model.py``; the recipe's 3,600 s engine-ready timeout in ``versions.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .attention_backend import attention_backend_flags
from .config.compute import block_instances
from .config.spec import DeploymentSpec
from .errors import ConfigError
from .fsx import fsx_capacity_gib, fsx_read_bytes_per_second
from .kv_layout import DEFAULT_INDEXER_CACHE_DTYPE, KvCacheLayout, model_layout, recipe_argv
from .model import ModelProfile
from .targets import GB, GIB, GPUS, GpuFacts
from .time_inputs import (
    ENGINE_INIT_COLD_SECONDS,
    HubRate,
    engine_init_cold_seconds,
    mirror_copy_rate,
    publish_hub_rate,
)
from .versions import RECIPE_ENGINE_READY_TIMEOUT_S
from .weights import SyncStep

TIB = 2**40

# Room kept beside the weights on any storage: partial downloads, the manifest, and a
# checkpoint update landing beside the old one is NOT assumed (that needs 2x).
STORAGE_HEADROOM_FRACTION = 0.10

# Engine start after the weights are read (torch.compile, CUDA graphs, warm-up), no cache: the
# estimate lives in time_to_ready.py; the safety factor below covers the spread.
ENGINE_WARMUP_SECONDS = int(ENGINE_INIT_COLD_SECONDS.value)
# Every timeout gets this multiple of the expected load + warm-up time.
STARTUP_SAFETY_FACTOR = 2.0
# Timeouts are rounded up to whole minutes.
_ROUND_SECONDS = 60

# The hub download rate (a range of public figures) lives in time_inputs.py (hub_download_rate).
# FSx for Lustre: throughput = storage capacity (TiB) x throughput per TiB (FSx API reference,
# PerUnitStorageThroughput).
FSX_THROUGHPUT_SOURCE = (
    "capacity (TiB) x MB/s per TiB (docs.aws.amazon.com/fsx/latest/LustreGuide/managing-throughput-capacity.html)"
)
# Copies from the in-region mirror run at time_inputs.mirror_copy_rate (network, connections
# and NVMe write of the instance). Every sync budget gets this multiple of its expected time,
# rounded up to whole minutes, and never less than the floor (a copy bound by estimates that
# turn out 3x optimistic must not be killed by its own deadline).
SYNC_SAFETY_FACTOR = 2.0
SYNC_BUDGET_FLOOR_SECONDS = 1_800


@dataclass(frozen=True)
class StoragePlan:
    """Where the weights are served from and how fast they can be read.

    Attributes:
        kind: ``nvme``, ``fsx``, ``nvme-from-fsx`` or ``pvc`` (``storage.kind``).
        capacity_gib: capacity holding the serving copy: the RAID0 set per node for NVMe
            kinds, the file system for ``fsx``, the claim for ``pvc`` (None when unknown).
        needed_gib: weights plus headroom, GiB.
        fsx_capacity_gib: FSx capacity when a file system is created, else None.
        fsx_throughput_per_tib_mbps: FSx throughput tier, MB/s per TiB, else None.
        fsx_read_bytes_per_second: FSx aggregate read throughput, bytes/s, else None.
        read_bytes_per_second: read bandwidth of the serving copy as seen by one node, bytes/s.
        read_source: where ``read_bytes_per_second`` comes from.
    """

    kind: str
    capacity_gib: int | None
    needed_gib: int
    fsx_capacity_gib: int | None
    fsx_throughput_per_tib_mbps: int | None
    fsx_read_bytes_per_second: int | None
    read_bytes_per_second: int
    read_source: str


@dataclass(frozen=True)
class Sizing:
    """All derived figures of a deployment.

    Attributes:
        weights_bytes: checkpoint size, bytes.
        weights_gib: checkpoint size, GiB (rounded up).
        storage: the storage plan.
        load_seconds: expected time for one model copy to read its weights into GPU memory.
        startup_budget_seconds: the budget every startup timeout uses (startup probe,
            ``VLLM_ENGINE_READY_TIMEOUT_S``, Pulumi custom timeouts).
        kv_cache_tokens: KV-cache capacity of one model copy at the configured parallelism
            (``vllm.kvCacheTokens`` when measured).
        kv_cache_tokens_tp: capacity at plain tensor parallelism (DCP 1).
        kv_cache_tokens_dcp: capacity at the configured DCP size (equals ``kv_cache_tokens``).
        kv_cache_source: where ``kv_cache_tokens`` comes from (``estimate: ...`` or measured).
        kv_layout: the caches of a copy as the engine lays them out (bytes per token per term).
        kv_bytes_per_gpu: memory per GPU left for the KV cache (the estimate's budget).
        kv_claim: the published claim beside the engine-layout figure, or None.
        max_model_len: the served context length, tokens.
        full_context_sequences: how many sequences of ``max_model_len`` fit in the KV cache.
        download_seconds: hub download time of the checkpoint onto a GPU node at the expected hub rate
            (``time_inputs.hub_download_rate``); download_seconds_slow: at the range's slow end.
        usd_per_hour: price of all GPU nodes, USD/hour, or None when unknown.
        price_source: where ``usd_per_hour`` comes from.
    """

    weights_bytes: int
    weights_gib: int
    storage: StoragePlan
    load_seconds: int
    startup_budget_seconds: int
    kv_cache_tokens: int
    kv_cache_tokens_tp: int
    kv_cache_tokens_dcp: int
    kv_cache_source: str
    kv_layout: KvCacheLayout
    kv_bytes_per_gpu: int
    kv_claim: KvClaimComparison | None
    max_model_len: int
    full_context_sequences: int
    download_seconds: int
    download_seconds_slow: int
    usd_per_hour: float | None
    price_source: str


def download_seconds(weights_bytes: int, megabytes_per_second: float) -> int:
    """Seconds to download ``weights_bytes`` at ``megabytes_per_second`` (decimal MB/s), rounded up.

    Raises:
        ValueError: the bandwidth is not positive.
    """
    if megabytes_per_second <= 0:
        raise ValueError(f"bandwidth must be positive, got {megabytes_per_second} MB/s")
    return math.ceil(weights_bytes / (megabytes_per_second * 1e6))


def kv_budget_bytes_per_gpu(
    model: ModelProfile, gpu: GpuFacts, tensor_parallel_size: int, gpu_memory_utilization: float
) -> int:
    """Bytes per GPU left for the KV cache: utilization x HBM - weight shard - runtime reserve.

    May be negative (the configuration cannot hold the model with any KV cache).
    """
    usable = gpu.memory_bytes * gpu_memory_utilization
    weights_per_gpu = model.weights_bytes / tensor_parallel_size
    return int(usable - weights_per_gpu - model.runtime_reserved_bytes_per_gpu)


def kv_cache_tokens(
    model: ModelProfile,
    gpu: GpuFacts,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    kv_cache_dtype: str,
    decode_context_parallel_size: int = 1,
    *,
    indexer_cache_dtype: str = DEFAULT_INDEXER_CACHE_DTYPE,
    argv: tuple[str, ...] = (),
) -> int:
    """KV-cache capacity in tokens of one model copy: the per-GPU budget
    (``kv_budget_bytes_per_gpu``) over the bytes a token takes on each GPU in the engine's cache
    layout (``kv_layout.model_layout``; ``argv``: the command's flags, which may name the attention
    backend and so the latent format). The caches are replicated over TP ranks; DCP shards the
    ones the layout marks sharded (both DSA caches: DCP8 holds 8x the tokens).

    Raises:
        ValueError: DCP does not divide TP; an unknown KV or indexer dtype.
    """
    if tensor_parallel_size % decode_context_parallel_size:
        raise ValueError(
            f"decode context parallel size {decode_context_parallel_size} must divide TP {tensor_parallel_size}"
        )
    budget = kv_budget_bytes_per_gpu(model, gpu, tensor_parallel_size, gpu_memory_utilization)
    layout = model_layout(model, kv_cache_dtype, gpu, indexer_cache_dtype=indexer_cache_dtype, argv=argv)
    return layout.tokens(budget, decode_context_parallel_size)


@dataclass(frozen=True)
class KvClaimComparison:
    """A published KV claim (``model.PublishedKvClaim``) beside the engine-layout figures for the
    claim's own setting (its GPU, TP, KV dtype, utilization and DCP size, the vendor recipe's flags).

    Attributes:
        claim_tokens_tp, claim_tokens_dcp, decode_context_parallel_size: what is claimed.
        claim_bytes_per_token: bytes per token per GPU the claim was read with.
        engine_tokens_tp, engine_tokens_dcp: the same setting under the engine's layout and the
            fitted memory (estimate).
        engine_bytes_per_token: bytes per token per GPU in the engine's layout at TP.
        difference: one line saying why the two differ.
        source: where the claim is published.
    """

    claim_tokens_tp: int
    claim_tokens_dcp: int
    decode_context_parallel_size: int
    claim_bytes_per_token: int
    engine_tokens_tp: int
    engine_tokens_dcp: int
    engine_bytes_per_token: int
    difference: str
    source: str


def _millions(tokens: int) -> str:
    return f"{tokens / 1e6:.2f}M"


def kv_claim_comparison(model: ModelProfile) -> KvClaimComparison | None:
    """The model's published KV claim beside the engine-layout figures for the claim's setting,
    with the difference in one line; None when the model has no claim."""
    claim = model.kv_claim
    if claim is None:
        return None
    gpu, family = GPUS[claim.gpu], "cuda" if GPUS[claim.gpu].vendor == "nvidia" else "rocm"
    recipe = model.recipes[family]
    dcp = claim.decode_context_parallel_size
    budget = kv_budget_bytes_per_gpu(model, gpu, claim.gpus, claim.gpu_memory_utilization)
    tp_layout = model_layout(model, claim.kv_cache_dtype, gpu, argv=recipe_argv(recipe, 1))
    dcp_layout = model_layout(model, claim.kv_cache_dtype, gpu, argv=recipe_argv(recipe, dcp))
    tokens_tp, tokens_dcp = tp_layout.tokens(budget, 1), dcp_layout.tokens(budget, dcp)
    mla, index = tp_layout.terms[0], tp_layout.terms[1]
    latent = (
        f"the MLA latent as {mla.format} ({mla.bytes_per_token_per_layer:,} B per layer"
        + (f", {tp_layout.attention_backend}" if tp_layout.attention_backend else "") + ")"
    )
    difference = (
        f"the recipe's {_millions(claim.tokens_tp)} (TP{claim.gpus}) and {_millions(claim.tokens_dcp)} (DCP{dcp}) assume "
        f"{claim.implied_bytes_per_token:,} B/token ({claim.implied_by}); the engine also caches indexer keys "
        f"({index.layers} x {index.bytes_per_token_per_layer} B) and stores {latent}: "
        f"{tp_layout.bytes_per_token_per_gpu:,} B/token, {_millions(tokens_tp)} and {_millions(tokens_dcp)} in the same memory"
    )
    return KvClaimComparison(
        claim_tokens_tp=claim.tokens_tp,
        claim_tokens_dcp=claim.tokens_dcp,
        decode_context_parallel_size=dcp,
        claim_bytes_per_token=claim.implied_bytes_per_token,
        engine_tokens_tp=tokens_tp,
        engine_tokens_dcp=tokens_dcp,
        engine_bytes_per_token=tp_layout.bytes_per_token_per_gpu,
        difference=difference,
        source=claim.source,
    )


def serving_argv(spec: DeploymentSpec, decode_context_parallel_size: int) -> tuple[str, ...]:
    """The flags of the serving command that can choose the attention backend: the backend every CUDA
    role names (``attention_backend.attention_backend_flags``), the recipe's (with its DCP flags when
    DCP > 1), then ``vllm.extraArgs``, in the command's order."""
    recipe = spec.model.recipes[spec.target.image_family]
    extra = tuple(spec.config.vllm.extra_args)
    named = attention_backend_flags(spec.model, spec.target, kv_cache_dtype(spec), decode_context_parallel_size, extra)
    return named + recipe_argv(recipe, decode_context_parallel_size) + extra


def kv_layout(spec: DeploymentSpec) -> KvCacheLayout:
    """The caches of one copy of ``spec`` as the engine lays them out (configured DCP's flags)."""
    vcfg = spec.config.vllm
    return model_layout(
        spec.model, kv_cache_dtype(spec), spec.target.gpu, indexer_cache_dtype=vcfg.indexer_cache_dtype,
        argv=serving_argv(spec, vcfg.decode_context_parallel_size),
    )


def startup_budget_seconds(load_seconds: int, engine_init_seconds: float = ENGINE_WARMUP_SECONDS) -> int:
    """The startup budget: ``STARTUP_SAFETY_FACTOR`` x (load + cold engine init), never below
    the recipe's 3,600 s engine-ready timeout, rounded up to a whole minute."""
    raw = STARTUP_SAFETY_FACTOR * (load_seconds + engine_init_seconds)
    budget = max(RECIPE_ENGINE_READY_TIMEOUT_S, raw)
    return int(math.ceil(budget / _ROUND_SECONDS) * _ROUND_SECONDS)


def kv_cache_dtype(spec: DeploymentSpec) -> str:
    """The KV-cache dtype served: the configured one, else the vendor recipe's default."""
    return spec.config.vllm.kv_cache_dtype or spec.model.recipes[spec.target.image_family].kv_cache_dtype


def storage_plan(spec: DeploymentSpec) -> StoragePlan:
    """Where the weights are served from, its capacity and read bandwidth per node.

    Raises:
        ConfigError: ``pvc`` storage without ``storage.readGBps`` (its speed is unknown).
    """
    st = spec.config.storage
    weights = spec.model.weights_bytes
    needed_gib = math.ceil(weights * (1 + STORAGE_HEADROOM_FRACTION) / GIB)
    fsx_cap = fsx_tier = fsx_bps = None
    if st.kind in ("fsx", "nvme-from-fsx"):
        fsx_cap = st.fsx.capacity_gib or fsx_capacity_gib(weights, st.fsx.headroom_fraction)
        fsx_tier = st.fsx.throughput_per_tib
        fsx_bps = fsx_read_bytes_per_second(fsx_cap, fsx_tier)
    if st.read_gbps is not None:
        read_bps, source = int(st.read_gbps * GB), "storage.readGBps (measured)"
    elif st.kind == "fsx":
        # All nodes of all copies share the file system's throughput.
        read_bps = fsx_bps // spec.gpu_nodes  # type: ignore[operator]
        source = f"FSx {fsx_cap:,} GiB x {fsx_tier} MB/s/TiB [{FSX_THROUGHPUT_SOURCE}] shared by {spec.gpu_nodes} node(s)"
    elif st.kind == "pvc":
        raise ConfigError(
            "storage.readGBps", None, "is required for storage.kind pvc (measure the claim's read bandwidth in GB/s)"
        )
    else:
        read_bps, source = spec.instance.nvme_read_bytes_per_second, spec.instance.nvme_read_source
    if st.kind == "fsx":
        capacity = fsx_cap
    elif st.kind == "pvc":
        capacity = None
    else:
        capacity = int(spec.instance.nvme_total_bytes // GIB)
    return StoragePlan(
        kind=st.kind,
        capacity_gib=capacity,
        needed_gib=needed_gib,
        fsx_capacity_gib=fsx_cap,
        fsx_throughput_per_tib_mbps=fsx_tier,
        fsx_read_bytes_per_second=fsx_bps,
        read_bytes_per_second=read_bps,
        read_source=source,
    )


def billed_gpu_nodes(spec: DeploymentSpec) -> int:
    """GPU instances paid for: the node count, or for an UltraServer capacity block the whole
    block as bought (``config.block_instances``: e.g. 18 p6e-gb300 trays for a node group of 2)."""
    return block_instances(spec.config, spec.instance, spec.gpu_nodes) or spec.gpu_nodes


def gpu_usd_per_hour(spec: DeploymentSpec) -> tuple[float | None, str]:
    """Hourly price of all GPU capacity paid for and its source: config override (per node),
    capacity-block price (per instance), then the on-demand list price where known
    (``targets.py``). UltraServer capacity blocks are sold whole, so their price is the
    per-tray price times the trays in the block (``billed_gpu_nodes``), not times the trays used.
    """
    compute = spec.config.compute
    nodes = billed_gpu_nodes(spec)
    block = (
        ""
        if nodes == spec.gpu_nodes
        else f" x {nodes} {spec.instance.instance_type} in the UltraServer block ({spec.gpu_nodes} used)"
    )
    if compute.usd_per_hour is not None:
        return compute.usd_per_hour * nodes, f"compute.usdPerHour (config){block}"
    if compute.capacity.usd_per_hour is not None:
        return compute.capacity.usd_per_hour * nodes, f"compute.capacity.usdPerHour (capacity block price){block}"
    inst = spec.instance
    if inst.usd_per_hour_on_demand is not None and compute.capacity.type != "capacity-block":
        where = "" if spec.region == inst.price_region else f" (price from {inst.price_region}; {spec.region} may differ)"
        return inst.usd_per_hour_on_demand * nodes, f"on-demand list price {inst.price_region}{where}"
    if block:
        return (
            None,
            f"unknown: no public price for {inst.instance_type}; set compute.capacity.usdPerHour or compute.usdPerHour (per "
            f"tray-hour; billed{block})",
        )
    return None, f"unknown: no public price for {inst.instance_type}; set compute.usdPerHour"


def compute_sizing(spec: DeploymentSpec) -> Sizing:
    """All sizing figures for ``spec``.

    Raises:
        ConfigError: the configuration leaves no memory for the KV cache, or storage speed is
            unknown (``pvc`` without ``storage.readGBps``).
    """
    model, target = spec.model, spec.target
    vcfg = spec.config.vllm
    tp = target.gpus_per_copy
    dtype = kv_cache_dtype(spec)
    budget = kv_budget_bytes_per_gpu(model, target.gpu, tp, vcfg.gpu_memory_utilization)
    if budget <= 0:
        raise ConfigError(
            "vllm.gpuMemoryUtilization",
            vcfg.gpu_memory_utilization,
            f"leaves no memory for the KV cache on {tp}x {target.gpu.name} (need more than "
            f"{(model.weights_bytes / tp + model.runtime_reserved_bytes_per_gpu) / target.gpu.memory_bytes:.2f})",
        )
    dcp = vcfg.decode_context_parallel_size
    indexer = vcfg.indexer_cache_dtype
    tokens_tp = kv_cache_tokens(model, target.gpu, tp, vcfg.gpu_memory_utilization, dtype, 1,
                                indexer_cache_dtype=indexer, argv=serving_argv(spec, 1))
    tokens_dcp = kv_cache_tokens(model, target.gpu, tp, vcfg.gpu_memory_utilization, dtype, dcp,
                                 indexer_cache_dtype=indexer, argv=serving_argv(spec, dcp))
    layout = kv_layout(spec)
    kv_source = (
        (model.kv_fit.label if model.kv_fit else "estimate: the engine's cache layout")
        + f"; {layout.bytes_per_token_per_gpu:,} B per token per GPU"
    )
    if vcfg.kv_cache_tokens is not None:
        # Measured at the configured parallelism: it replaces that figure (the other stays an estimate).
        kv_source = "vllm.kvCacheTokens (measured: vLLM's 'GPU KV cache size' log line)"
        if dcp > 1:
            tokens_dcp = vcfg.kv_cache_tokens
        else:
            tokens_tp = tokens_dcp = vcfg.kv_cache_tokens
    storage = storage_plan(spec)
    bytes_per_node = model.weights_bytes / spec.nodes_per_copy
    load = math.ceil(bytes_per_node / storage.read_bytes_per_second)
    max_len = vcfg.max_model_len or model.max_context_tokens
    if tokens_dcp < max_len:
        # vLLM 0.34.0 refuses to start when one sequence of max_model_len does not fit its KV cache
        # (vllm/v1/core/kv_cache_planning.py _check_enough_kv_cache_memory: "To serve at least one request
        # with the model's max seq len ...").
        measured = vcfg.kv_cache_tokens is not None
        raise ConfigError(
            "vllm.kvCacheTokens" if measured else "vllm.maxModelLen",
            vcfg.kv_cache_tokens if measured else max_len,
            (f"holds fewer tokens than one {max_len:,}-token sequence (vllm.maxModelLen): vLLM refuses to start; "
             "lower vllm.maxModelLen or measure again" if measured else
             f"is more than the KV cache holds ({tokens_dcp:,} tokens, {kv_source}): vLLM refuses to start; lower "
             "it or raise vllm.gpuMemoryUtilization"),
        )
    price, price_source = gpu_usd_per_hour(spec)
    hub = publish_hub_rate(spec, staging=False)
    return Sizing(
        weights_bytes=model.weights_bytes,
        weights_gib=math.ceil(model.weights_bytes / GIB),
        storage=storage,
        load_seconds=load,
        startup_budget_seconds=startup_budget_seconds(load, engine_init_cold_seconds(spec)),
        kv_cache_tokens=tokens_dcp,
        kv_cache_tokens_tp=tokens_tp,
        kv_cache_tokens_dcp=tokens_dcp,
        kv_cache_source=kv_source,
        kv_layout=layout,
        kv_bytes_per_gpu=budget,
        kv_claim=kv_claim_comparison(model),
        max_model_len=max_len,
        full_context_sequences=tokens_dcp // max_len,
        download_seconds=math.ceil(model.weights_bytes / hub.expected.bytes_per_second),
        download_seconds_slow=math.ceil(model.weights_bytes / hub.low.bytes_per_second),
        usd_per_hour=price,
        price_source=price_source,
    )


def step_hub_rate(spec: DeploymentSpec, step: SyncStep, staging: bool | None = None) -> HubRate | None:
    """The hub download rate of ``step`` on the machine that runs it (``time_inputs.publish_hub_rate``;
    ``staging``: the stage's publish, default ``spec.staging``), or None when the step does not read the hub."""
    if not (step.needs_hub_token or step.source == spec.hub_uri):
        return None
    return publish_hub_rate(spec, staging=spec.staging if staging is None else staging)


def sync_expected_seconds(spec: DeploymentSpec, sizing: Sizing, step: SyncStep, *, staging: bool | None = None,
                          slow: bool = False) -> int:
    """Expected seconds of one weight-sync step on a first deploy (nothing there yet).

    Hub sources: the download at ``step_hub_rate`` (its expected rate, or with ``slow`` the range's
    slow end). FSx sources: the file system's throughput shared by all GPU nodes copying at once.
    Mirror sources: ``time_inputs.mirror_copy_rate`` per node.
    """
    hub = step_hub_rate(spec, step, staging)
    if hub is not None:
        return math.ceil(sizing.weights_bytes / (hub.low if slow else hub.expected).bytes_per_second)
    if step.needs_fsx and sizing.storage.fsx_read_bytes_per_second:
        per_node = max(1, sizing.storage.fsx_read_bytes_per_second // spec.gpu_nodes)
        return math.ceil(sizing.weights_bytes / per_node)
    return math.ceil(sizing.weights_bytes / mirror_copy_rate(spec).bytes_per_second)


def sync_budget_seconds(spec: DeploymentSpec, sizing: Sizing, step: SyncStep, *, staging: bool | None = None) -> int:
    """Seconds a sync step may take before Pulumi and the Job give up:
    ``SYNC_SAFETY_FACTOR`` x the expected time (a hub download at the range's slow end), rounded up to
    whole minutes, at least ``SYNC_BUDGET_FLOOR_SECONDS``, plus the step's wait for an import
    (``SyncStep.source_wait_seconds``)."""
    expected = sync_expected_seconds(spec, sizing, step, staging=staging, slow=True)
    budget = int(math.ceil(SYNC_SAFETY_FACTOR * expected / _ROUND_SECONDS) * _ROUND_SECONDS)
    return max(budget, SYNC_BUDGET_FLOOR_SECONDS) + step.source_wait_seconds

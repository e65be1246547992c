"""Sizing: storage, weight-load time, the startup budget every timeout uses, KV-cache capacity
and download time. Pure functions over the spec; units are in every name.

Sources: FSx facts in ``fsx.py``; GPU and NVMe facts in ``targets.py``; KV bytes per token from
the engine's cache layout in ``kv_layout.py``, the memory beside it by named term in
``engine_memory.py``, the recipe's claim in ``model.py``; the recipe's 3,600 s engine-ready timeout in ``versions.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .attention_backend import attention_backend_flags
from .config.compute import block_instances
from .config.spec import DeploymentSpec
from .engine_memory import MAX_NUM_SEQS_FLAG, WEIGHTS, MemoryBudget, memory_budget
from .errors import ConfigError
from .fsx import fsx_capacity_gib, fsx_read_bytes_per_second
from .kv_layout import FLASHINFER_MLA_SPARSE, KvCacheLayout, model_layout, recipe_argv
from .model import ModelProfile
from .prices import CAPACITY_BLOCK_PRICING
from .scheduler_limits import SchedulerLimits, scheduler_limits
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


def recipe_max_num_seqs(model: ModelProfile) -> tuple[int, str] | None:
    """A ``--max-num-seqs`` a vendor recipe of ``model`` sets (the value, and which recipe), or None.

    A smaller ``--max-num-seqs`` shrinks the indexer's logits buffer (rows x max_model_len x 4 B,
    counted 1.75x by the sizing): the plan shows what the recipe's value would buy on this target; it
    does not render it (the right value follows the workload's concurrency)."""
    for family, recipe in model.recipes.items():
        for flag, value in recipe.flags:
            if flag == MAX_NUM_SEQS_FLAG and value and value.isdigit():
                return int(value), f"the vLLM recipe's {family} value (vllm-project/recipes, Kimi-K3.yaml)"
    return None


@dataclass(frozen=True)
class MaxNumSeqsOption:
    """What a smaller ``--max-num-seqs`` buys (the plan shows it; the command does not set it).

    Attributes:
        max_num_seqs: the value considered; ``current``: the effective value now.
        tokens_gained: ``(low, high)`` KV tokens per copy it adds at each end of the estimates.
        source: where the value comes from.
    """

    max_num_seqs: int
    current: int
    tokens_gained: tuple[int, int]
    source: str


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
        kv_cache_tokens_range_tp, kv_cache_tokens_range: ``(low, high)`` at TP and at the configured
            DCP size (the span of the memory estimates; one value twice when measured).
            ``kv_cache_tokens`` is the low end.
        kv_cache_source: where ``kv_cache_tokens`` comes from (``estimate: ...`` or measured).
        kv_layout: the caches of a copy as the engine lays them out (bytes per token per term).
        memory: the per-GPU memory terms and the KV bytes they leave (``engine_memory``).
        max_num_seqs_option: what rendering ``--max-num-seqs`` would buy, or None when the command
            sets it.
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
    kv_cache_tokens_range_tp: tuple[int, int]
    kv_cache_tokens_range: tuple[int, int]
    kv_cache_source: str
    kv_layout: KvCacheLayout
    memory: MemoryBudget
    max_num_seqs_option: MaxNumSeqsOption | None
    kv_claim: KvClaimComparison | None
    max_model_len: int
    full_context_sequences: int
    download_seconds: int
    download_seconds_slow: int
    usd_per_hour: float | None
    price_source: str


def download_seconds(weights_bytes: int, bytes_per_second: float) -> int:
    """Seconds to download ``weights_bytes`` at ``bytes_per_second``, rounded up (the plan's hub download figures).

    Raises:
        ValueError: the rate is not positive.
    """
    if bytes_per_second <= 0:
        raise ValueError(f"download rate must be positive, got {bytes_per_second} B/s")
    return math.ceil(weights_bytes / bytes_per_second)


def copy_memory_budget(
    model: ModelProfile,
    gpu: GpuFacts,
    tensor_parallel_size: int,
    decode_context_parallel_size: int,
    layout: KvCacheLayout,
    *,
    argv: tuple[str, ...] = (),
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
) -> MemoryBudget:
    """The per-GPU memory of one copy of ``model`` by named term (``engine_memory.memory_budget``):
    the weight shard, the workspaces and buffers the pinned engine computes at the batch limits
    ``argv`` sets (or its defaults), the estimates, and the KV bytes its sizing leaves (a range).

    Raises:
        ValueError: a batch flag in ``argv`` that is not a positive integer.
    """
    attention = model.attention
    index_bytes = next((t.bytes_per_token_per_layer for t in layout.terms if t.name == "DSA indexer keys"), 0)
    return memory_budget(
        gpu=gpu,
        weights_bytes_per_gpu=model.weights_bytes // tensor_parallel_size,
        argv=argv,
        max_model_len=max_model_len or model.max_context_tokens,
        tensor_parallel_size=tensor_parallel_size,
        decode_context_parallel_size=decode_context_parallel_size,
        num_attention_heads=attention.num_heads if attention else 0,
        index_topk=(attention.index_topk or 0) if attention else 0,
        index_entry_bytes=index_bytes,
        flashinfer_sparse_backend=layout.attention_backend == FLASHINFER_MLA_SPARSE,
        dsa_layers=model.cache_geometry.dsa_layers if attention and attention.sparse else 0,
        gpu_memory_utilization=gpu_memory_utilization,
    )


def kv_cache_token_range(budget: MemoryBudget, layout: KvCacheLayout, decode_context_parallel_size: int) -> tuple[int, int]:
    """``(low, high)`` KV tokens of one copy: ``budget``'s KV bytes per GPU at each end of its
    estimates over the bytes a token takes on each GPU in ``layout`` (DCP shards what it marks)."""
    return (layout.tokens(budget.kv_bytes_low, decode_context_parallel_size),
            layout.tokens(budget.kv_bytes_high, decode_context_parallel_size))


@dataclass(frozen=True)
class KvClaimComparison:
    """A published KV claim (``model.PublishedKvClaim``) beside the engine's figures for the
    claim's own setting (its GPU, TP, KV dtype, utilization and DCP size, the vendor recipe's flags).

    Attributes:
        claim_tokens_tp, claim_tokens_dcp, decode_context_parallel_size: what is claimed.
        claim_bytes_per_token: bytes per token per GPU the claim was read with.
        engine_tokens_tp, engine_tokens_dcp: ``(low, high)`` for the same setting under the engine's
            layout and memory terms (``copy_memory_budget``; the range spans its estimates).
        engine_bytes_per_token: bytes per token per GPU in the engine's layout at TP.
        difference: one line saying why the two differ.
        source: where the claim is published.
    """

    claim_tokens_tp: int
    claim_tokens_dcp: int
    decode_context_parallel_size: int
    claim_bytes_per_token: int
    engine_tokens_tp: tuple[int, int]
    engine_tokens_dcp: tuple[int, int]
    engine_bytes_per_token: int
    difference: str
    source: str


def _millions(tokens: int) -> str:
    return f"{tokens / 1e6:.2f}M"


def _million_range(tokens: tuple[int, int]) -> str:
    return f"{tokens[0] / 1e6:.2f}-{tokens[1] / 1e6:.2f}M"


def kv_claim_comparison(model: ModelProfile) -> KvClaimComparison | None:
    """The model's published KV claim beside the engine's figures for the claim's setting, with
    the difference in one line; None when the model has no claim."""
    claim = model.kv_claim
    if claim is None:
        return None
    gpu, family = GPUS[claim.gpu], "cuda" if GPUS[claim.gpu].vendor == "nvidia" else "rocm"
    recipe = model.recipes[family]
    dcp = claim.decode_context_parallel_size
    ranges = []
    for size in (1, dcp):
        argv = recipe_argv(recipe, size)
        layout = model_layout(model, claim.kv_cache_dtype, gpu, argv=argv)
        budget = copy_memory_budget(model, gpu, claim.gpus, size, layout, argv=argv,
                                    gpu_memory_utilization=claim.gpu_memory_utilization)
        ranges.append(kv_cache_token_range(budget, layout, size))
    tp_layout = model_layout(model, claim.kv_cache_dtype, gpu, argv=recipe_argv(recipe, 1))
    mla, index = tp_layout.terms[0], tp_layout.terms[1]
    latent = (
        f"the MLA latent as {mla.format} ({mla.bytes_per_token_per_layer:,} B per layer"
        + (f", {tp_layout.attention_backend}" if tp_layout.attention_backend else "") + ")"
    )
    difference = (
        f"the recipe's {_millions(claim.tokens_tp)} (TP{claim.gpus}) and {_millions(claim.tokens_dcp)} (DCP{dcp}) at "
        f"--gpu-memory-utilization {claim.gpu_memory_utilization:g} assume {claim.implied_bytes_per_token:,} B/token "
        f"({claim.implied_by}); the engine also caches indexer keys ({index.layers} x {index.bytes_per_token_per_layer} B) "
        f"and stores {latent}: {tp_layout.bytes_per_token_per_gpu:,} B/token; with the memory terms at that setting, "
        f"{_million_range(ranges[0])} and {_million_range(ranges[1])}"
    )
    return KvClaimComparison(
        claim_tokens_tp=claim.tokens_tp,
        claim_tokens_dcp=claim.tokens_dcp,
        decode_context_parallel_size=dcp,
        claim_bytes_per_token=claim.implied_bytes_per_token,
        engine_tokens_tp=ranges[0],
        engine_tokens_dcp=ranges[1],
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
    if compute.capacity.type == "capacity-block":
        # A block's price is its upfront fee, known at purchase: the plan bills the per-instance-hour
        # figure the stack gives (fee / (hours x instances)), never a list price.
        per = "trays" if block else "instances"
        return (
            None,
            f"unknown: {CAPACITY_BLOCK_PRICING}; set compute.capacity.usdPerHour = fee / (hours x {per}); "
            f"billed{block or f' x {nodes} {inst.instance_type}'}",
        )
    return None, f"unknown: no public price for {inst.instance_type}; set compute.usdPerHour"


def kv_tokens_hardware_bound(memory: MemoryBudget, layout: KvCacheLayout, decode_context_parallel_size: int) -> int:
    """The most KV tokens one copy can hold at all: every byte of each GPU's memory
    (``memory.gpu_memory_bytes``) but the weights it must keep resident (the ``WEIGHTS`` term; the
    plan refuses ``--cpu-offload-gb``), at the bytes a token takes per GPU in ``layout`` with DCP
    ``decode_context_parallel_size``. An upper bound: the engine also keeps its activations, graphs
    and workspaces, and a utilization below 1."""
    free = memory.gpu_memory_bytes - memory.term(WEIGHTS).low_bytes
    return layout.tokens(max(free, 0), decode_context_parallel_size)


def check_measured_kv_tokens(tokens: int, memory: MemoryBudget, layout: KvCacheLayout, decode_context_parallel_size: int,
                             gpus: str) -> None:
    """``vllm.kvCacheTokens`` (``tokens``, measured) against what the copy's GPUs (``gpus``, e.g.
    ``8x B300``) can hold (``kv_tokens_hardware_bound``).

    Raises:
        ConfigError: more tokens than the GPUs' memory holds after the weights: not a measurement
            of this layout (a typo, or another model, KV dtype or DCP size).
    """
    bound = kv_tokens_hardware_bound(memory, layout, decode_context_parallel_size)
    if tokens > bound:
        free_gb = (memory.gpu_memory_bytes - memory.term(WEIGHTS).low_bytes) / GB
        raise ConfigError(
            "vllm.kvCacheTokens", tokens,
            f"is more than {gpus} can hold: all {free_gb:,.1f} GB per GPU left after the weights hold {bound:,} tokens "
            f"at {layout.bytes_per_token_per_gpu_at(decode_context_parallel_size):,.0f} B per token per GPU (DCP "
            f"{decode_context_parallel_size}); copy N from this stack's 'GPU KV cache size: N tokens' log line "
            f"(allowed: 1 to {bound:,})",
        )


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
    dcp = vcfg.decode_context_parallel_size
    max_len = vcfg.max_model_len or model.max_context_tokens

    def size(dcp_size: int, extra: tuple[str, ...] = ()) -> tuple[KvCacheLayout, MemoryBudget, tuple[int, int]]:
        argv = serving_argv(spec, dcp_size) + extra
        layout = model_layout(model, dtype, target.gpu, indexer_cache_dtype=vcfg.indexer_cache_dtype, argv=argv)
        memory = copy_memory_budget(model, target.gpu, tp, dcp_size, layout, argv=argv, max_model_len=max_len,
                                    gpu_memory_utilization=vcfg.gpu_memory_utilization)
        return layout, memory, kv_cache_token_range(memory, layout, dcp_size)

    _, _, range_tp = size(1)
    layout, memory, range_dcp = size(dcp)
    if memory.kv_bytes_high <= 0:
        raise ConfigError(
            "vllm.gpuMemoryUtilization" if vcfg.gpu_memory_utilization is not None else "vllm.maxModelLen",
            vcfg.gpu_memory_utilization if vcfg.gpu_memory_utilization is not None else max_len,
            f"leaves no memory for the KV cache on {tp}x {target.gpu.name} (weights and engine buffers take "
            f"{sum(t.low_bytes for t in memory.terms) / 1e9:,.1f} GB of {memory.gpu_memory_bytes / 1e9:,.1f} GB per GPU)",
        )
    seqs_option = None
    option = recipe_max_num_seqs(model)
    if option and not any(a.partition("=")[0] == MAX_NUM_SEQS_FLAG for a in serving_argv(spec, dcp)):
        _, _, with_seqs = size(dcp, (MAX_NUM_SEQS_FLAG, str(option[0])))
        seqs_option = MaxNumSeqsOption(
            option[0], memory.limits.max_num_seqs, (with_seqs[0] - range_dcp[0], with_seqs[1] - range_dcp[1]), option[1],
        )
    tokens_tp, tokens_dcp = range_tp[0], range_dcp[0]
    kv_source = (
        f"estimate: vLLM 0.34.0's memory terms, {len([t for t in memory.terms if t.estimate])} of them estimated "
        f"(range {range_dcp[0]:,}-{range_dcp[1]:,}); {layout.bytes_per_token_per_gpu:,} B per token per GPU"
    )
    if vcfg.kv_cache_tokens is not None:
        check_measured_kv_tokens(vcfg.kv_cache_tokens, memory, layout, dcp, f"{tp}x {target.gpu.name}")
        # Measured at the configured parallelism: it replaces that figure (the other stays an estimate).
        kv_source = "vllm.kvCacheTokens (measured: vLLM's 'GPU KV cache size' log line)"
        if vcfg.kv_cache_tokens > range_dcp[1]:
            kv_source += (f"; above the plan's high estimate of {range_dcp[1]:,}: check it against the log line of this "
                          "stack's own deploy")
        if dcp > 1:
            tokens_dcp = vcfg.kv_cache_tokens
            range_dcp = (tokens_dcp, tokens_dcp)
        else:
            tokens_tp = tokens_dcp = vcfg.kv_cache_tokens
            range_tp = range_dcp = (tokens_dcp, tokens_dcp)
    storage = storage_plan(spec)
    bytes_per_node = model.weights_bytes / spec.nodes_per_copy
    load = math.ceil(bytes_per_node / storage.read_bytes_per_second)
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
             "it, or measure vllm.kvCacheTokens"),
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
        kv_cache_tokens_range_tp=range_tp,
        kv_cache_tokens_range=range_dcp,
        kv_cache_source=kv_source,
        kv_layout=layout,
        memory=memory,
        max_num_seqs_option=seqs_option,
        kv_claim=kv_claim_comparison(model),
        max_model_len=max_len,
        full_context_sequences=tokens_dcp // max_len,
        download_seconds=download_seconds(model.weights_bytes, hub.expected.bytes_per_second),
        download_seconds_slow=download_seconds(model.weights_bytes, hub.low.bytes_per_second),
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


def spec_scheduler_limits(spec: DeploymentSpec) -> SchedulerLimits:
    """``scheduler_limits`` of ``spec``'s serving command: the recipe's flags (with its DCP flags)
    then ``vllm.extraArgs``, on the target's GPU, at ``vllm.maxModelLen`` (else the model's context).

    Raises:
        ConfigError: as ``scheduler_limits``.
    """
    vcfg = spec.config.vllm
    recipe = spec.model.recipes[spec.target.image_family]
    argv = recipe_argv(recipe, vcfg.decode_context_parallel_size) + tuple(vcfg.extra_args)
    gpu = spec.target.gpu
    return scheduler_limits(argv, gpu_memory_bytes=gpu.memory_bytes, gpu_name=gpu.name,
                            max_model_len=vcfg.max_model_len or spec.model.max_context_tokens)


def effective_scheduler_limits(spec: DeploymentSpec) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` the engine of ``spec`` schedules per step
    (``spec_scheduler_limits``): what the KV budget's workspaces and per-sequence buffers scale with.

    Raises:
        ConfigError: as ``scheduler_limits``.
    """
    limits = spec_scheduler_limits(spec)
    return limits.max_num_batched_tokens, limits.max_num_seqs

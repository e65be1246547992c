"""The memory of one GPU as vLLM 0.34.0 accounts for it: every term that is not KV cache, each read
from the pinned wheel (paths under ``vllm/``, line numbers of the 0.34.0 wheel built 2026-11-16) or
labelled an estimate with a low-high range, and the KV bytes the engine's own sizing leaves.

How 0.34.0 sizes the KV cache on CUDA and ROCm (the extensible KV cache, the default there):

- ``--gpu-memory-utilization`` defaults to None, resolved to 1.0 with the extensible cache
  (config/cache.py:216-234, ``resolved_gpu_memory_utilization`` l.495-501); its docs say to leave it
  unset unless something vLLM does not measure shares the GPU.
- After the profile run and warm-up the worker measures what is resident (weights, persistent
  workspaces, CUDA graphs, memory outside torch) and the transient peak of the steps it ran
  (v1/worker/gpu_worker.py:936-953, 1076-1098). ``measure_kv_cache_bytes``
  (v1/worker/extensible_kv_cache.py:594-621) gives the cache
  ``min(requested - non_kv_used, headroom - margin) - transient_peak`` with
  ``margin = max(1 GiB (3 GiB on ROCm), 0.75 x transient_peak)`` (l.64-65): the transient peak counts
  1.75 times. ``measure_kv_cache_bytes`` below is that function; ``memory_budget`` applies it to the terms here.

The terms (``MemoryTerm``): weights per GPU; the FlashInfer sparse MLA workspace
(``compute_trtllm_sparse_mla_workspace_bytes``, v1/attention/backends/mla/flashinfer_mla_sparse.py:357-385);
the sparse indexer's K-gather workspace (model_executor/layers/sparse_attn_indexer.py:603-619,
v1/attention/backends/mla/indexer.py:890-901); the indexer's logits buffer of the profile run
(sparse_attn_indexer.py:621-663); and, as estimates, the activation/sampler peak, CUDA graph memory
and memory outside torch. Every size takes the effective ``max_num_batched_tokens`` and
``max_num_seqs`` as parameters (``batch_limits`` reads them from the command's argv, else the
engine's default for the GPU: ``scheduler_limits.py``), so a command that changes them
changes the sizes. ``tests/test_engine_memory.py`` runs the wheel's own functions against these.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .scheduler_limits import scheduler_limits
from .targets import GIB, GpuFacts

MIB = 2**20
_WHEEL = "vLLM 0.34.0"

# --- Batch limits: the command's flags, else vLLM's defaults (scheduler_limits.py, one table) -------
MAX_NUM_SEQS_FLAG = "--max-num-seqs"
SPECULATIVE_CONFIG_FLAG = "--speculative-config"

# --- FlashInfer sparse MLA workspace (v1/attention/backends/mla/flashinfer_mla_sparse.py) ----------
# The default VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE (envs.py:234; _DEFAULT_WORKSPACE_BUFFER_SIZE l.354),
# allocated once per process (_get_workspace_buffer l.421-438); under DCP the trtllm-gen softmax-stats
# slab is added on top: 8 B (float2) x heads x min(tokens, 65,535) x 256 slots + 1 MiB (l.341-352, 46).
FLASHINFER_WORKSPACE_DEFAULT_BYTES = 394 * MIB
TRTLLM_GEN_SOFTMAX_STAT_BYTES = 8
TRTLLM_GEN_SOFTMAX_SLOTS_PER_TOKEN = 256
TRTLLM_GEN_SOFTMAX_GUARD_BYTES = MIB
TRTLLM_GEN_MAX_REQUESTS = 65_535
FLASHINFER_WORKSPACE_ENV = "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"
FLASHINFER_WORKSPACE_SOURCE = (
    f"{_WHEEL} v1/attention/backends/mla/flashinfer_mla_sparse.py:357-385 (compute_trtllm_sparse_mla_workspace_bytes), "
    "allocated at l.311-322 (DCP) or l.520; an explicit smaller env value is honoured with a warning (l.388-421)"
)

# --- The sparse indexer (model_executor/layers/sparse_attn_indexer.py) -----------------------------
# The profile run's dummy logits allocation (l.621-663): rows x round_up(max_model_len, row_align) x
# bytes, row_align = lcm(split_kv, 1024 / logits bytes), split_kv 384 on SM10x and 256 elsewhere; rows
# = min(max_num_seqs, max_num_batched_tokens) x (1 + speculative tokens), capped on SM10x without DCP
# by the 2,048 MiB decode budget (chunk_decode, l.591-598, 646-652); never below the 512 MiB prefill
# budget (envs.py:63-64). K3.1 passes no logits dtype: FP32 (models/kimi_k3/nvidia/dsa.py:380-405).
INDEXER_SPLIT_KV_SM10X = 384
INDEXER_SPLIT_KV_OTHER = 256
INDEXER_LOGITS_ROW_STRIDE_BYTES = 1024
INDEXER_LOGITS_BYTES = 4
INDEXER_PREFILL_LOGITS_BUDGET_BYTES = 512 * MIB
INDEXER_DECODE_LOGITS_BUDGET_BYTES = 2048 * MIB
INDEXER_CHUNK_DECODE_TOPK = (512, 1024, 2048)
INDEXER_LOGITS_SOURCE = f"{_WHEEL} model_executor/layers/sparse_attn_indexer.py:586-663 (profile-run logits buffer)"
# The K-gather workspace (l.603-619) holds get_max_prefill_buffer_size rows = max_model_len x
# (576 x 2 // 132) x factor (v1/attention/backends/mla/indexer.py:890-901), factor 5 up to 256K tokens
# of context and 2 above (config/vllm.py:1795-1803), each row an index key and its scale; plus the
# radix top-k workspace, 1 MiB (model_executor/layers/indexer_topk.py:15).
INDEXER_GATHER_ROWS_PER_FACTOR = 576 * 2 // 132
INDEXER_GATHER_FACTOR_SHORT, INDEXER_GATHER_FACTOR_LONG, INDEXER_GATHER_SHORT_LIMIT = 5, 2, 256 * 1024
RADIX_TOPK_WORKSPACE_BYTES = MIB
INDEXER_GATHER_SOURCE = (
    f"{_WHEEL} model_executor/layers/sparse_attn_indexer.py:603-619, v1/attention/backends/mla/indexer.py:890-901, "
    "config/vllm.py:1795-1803"
)

# --- Sizing (v1/worker/extensible_kv_cache.py) -----------------------------------------------------
KV_MARGIN_FLOOR_BYTES = {"nvidia": 1 * GIB, "amd": 3 * GIB}
KV_MARGIN_FRACTION = 0.75
KV_SIZING_SOURCE = (
    f"{_WHEEL} v1/worker/extensible_kv_cache.py:594-621 (measure_kv_cache_bytes; margin l.64-65), "
    "config/cache.py:216-234 and 495-501 (utilization 1.0 when unset)"
)


@dataclass(frozen=True)
class EstimateRange:
    """A figure the wheel does not fix: a low-high range, bytes per GPU, and why.

    Attributes:
        low_bytes, high_bytes: the range, bytes per GPU (``low <= high``).
        basis: where the range comes from, beginning ``estimate:``.
    """

    low_bytes: int
    high_bytes: int
    basis: str


# Not computable offline (they depend on kernels, compiled graphs and NCCL at run time); the startup
# log prints them ("Available KV cache memory", "Estimated CUDA graph memory") and `vllm.kvCacheTokens`
# replaces the estimate with the measured KV figure. Ranges read as: a dense MoE forward at 16K batched
# tokens and the sampler at 1,024 sequences x a 160K vocabulary (FP32 logits, a few copies), up to the
# fitted reading the plan used before; vLLM's CUDA graph estimate for large MoE models; CUDA context,
# NCCL and the FlashInfer all-reduce workspace.
ACTIVATION_PEAK_ESTIMATE = EstimateRange(
    4 * 10**9, 12 * 10**9,
    "estimate: the profile run's activation and sampler peak at the batch limits (not published for K3.1; "
    "the startup log's memory profile measures it)",
)
CUDA_GRAPH_ESTIMATE = EstimateRange(
    1 * 10**9, 8 * 10**9,
    "estimate: CUDA graph pools (vLLM logs 'Estimated CUDA graph memory'; sglang#24453 reports up to 20 GB per rank "
    "for Kimi K2 at DP32 with batch 128, vLLM's piecewise/decode graphs take less)",
)
NON_TORCH_ESTIMATE = EstimateRange(
    2 * 10**9, 6 * 10**9,
    "estimate: memory outside torch (CUDA context, NCCL buffers, the FlashInfer all-reduce workspace, DeepGEMM)",
)
# KDA state per sequence and GPU: 69 layers x heads/TP x 128 x 128 FP32 plus conv state; the heads
# follow the checkpoint's linear_attn_config, which the profile does not hold (32-128 heads).
KDA_STATE_PER_SEQUENCE_ESTIMATE = EstimateRange(
    16 * MIB, 64 * MIB,
    "estimate: 69 KDA layers x (32-128 heads / TP8) x 128 x 128 x 4 B (models/kimi_k3/nvidia/model.py:1606-1624 "
    "kda_state_shape; heads from the checkpoint's linear_attn_config, not in the profile); charged per request "
    "from the same pool (v1/core/kv_cache_utils.py:1082-1114)",
)


@dataclass(frozen=True)
class BatchLimits:
    """The scheduler limits every buffer below is sized at.

    Attributes:
        max_num_batched_tokens, max_num_seqs: effective values.
        num_speculative_tokens: tokens a speculative config adds per decode step (0: none).
        source: where each comes from (the command's flag or the engine default).
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    num_speculative_tokens: int
    source: str


def _last_flag(argv: Sequence[str], flag: str) -> str | None:
    found: str | None = None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        if name == flag:
            found = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def batch_limits(argv: Sequence[str], gpu: GpuFacts, max_model_len: int) -> BatchLimits:
    """The effective batch limits of a command: ``scheduler_limits.scheduler_limits`` (the command's
    ``--max-num-batched-tokens`` / ``--max-num-seqs`` in any spelling vLLM reads, else its defaults
    for ``gpu`` at ``max_model_len``), and ``num_speculative_tokens`` from ``--speculative-config`` JSON.

    Raises:
        ConfigError: a batch value vLLM would not read (key ``vllm.extraArgs``).
    """
    limits = scheduler_limits(argv, gpu_memory_bytes=gpu.memory_bytes, gpu_name=gpu.name, max_model_len=max_model_len)
    spec_tokens = 0
    spec_text = _last_flag(argv, SPECULATIVE_CONFIG_FLAG)
    if spec_text:
        try:
            spec = json.loads(spec_text)
        except ValueError:
            spec = None
        raw = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
        spec_tokens = raw if isinstance(raw, int) and raw > 0 else 0
    source = (f"max-num-batched-tokens {limits.max_num_batched_tokens:,}, max-num-seqs {limits.max_num_seqs:,} "
              f"({limits.source})")
    return BatchLimits(limits.max_num_batched_tokens, limits.max_num_seqs, spec_tokens, source)


def trtllm_sparse_mla_workspace_bytes(
    base_workspace_bytes: int, dcp_world_size: int, num_heads_per_rank: int, max_num_batched_tokens: int
) -> int:
    """Workspace bytes of FlashInfer's trtllm-gen sparse MLA decode: the base without DCP; under
    DCP the base plus the softmax-stats slab (``FLASHINFER_WORKSPACE_SOURCE``, the same arithmetic).
    At DCP8, 12 heads per rank and 16,384 tokens: 3,635,412,992 B."""
    if dcp_world_size <= 1:
        return base_workspace_bytes
    slab = (
        TRTLLM_GEN_SOFTMAX_STAT_BYTES
        * (num_heads_per_rank * dcp_world_size)
        * min(max_num_batched_tokens, TRTLLM_GEN_MAX_REQUESTS)
        * TRTLLM_GEN_SOFTMAX_SLOTS_PER_TOKEN
        + TRTLLM_GEN_SOFTMAX_GUARD_BYTES
    )
    return base_workspace_bytes + slab


def indexer_logits_bytes(
    max_model_len: int,
    limits: BatchLimits,
    *,
    decode_context_parallel_size: int,
    sm10x: bool,
    index_topk: int,
    topk_backend: str = "auto",
) -> int:
    """Bytes of the sparse indexer's FP32 logits buffer in the profile run (``INDEXER_LOGITS_SOURCE``):
    ``max(512 MiB, rows x round_up(max_model_len, row_align) x 4)``, rows from the batch limits (and the
    2,048 MiB decode budget on SM10x without DCP). 1M context, 1,024 sequences: 2,148,532,224 B on
    SM10x at TP, 4,297,064,448 B with DCP."""
    split_kv = INDEXER_SPLIT_KV_SM10X if sm10x else INDEXER_SPLIT_KV_OTHER
    row_align = math.lcm(split_kv, INDEXER_LOGITS_ROW_STRIDE_BYTES // INDEXER_LOGITS_BYTES)
    rows = min(limits.max_num_seqs, limits.max_num_batched_tokens) * (1 + limits.num_speculative_tokens)
    chunk_decode = (sm10x and decode_context_parallel_size == 1 and topk_backend in ("auto", "persistent")
                    and index_topk in INDEXER_CHUNK_DECODE_TOPK)
    if chunk_decode:
        rows = min(rows, INDEXER_DECODE_LOGITS_BUDGET_BYTES // (INDEXER_LOGITS_BYTES * max_model_len))
    padded = -(-max_model_len // row_align) * row_align
    return max(INDEXER_PREFILL_LOGITS_BUDGET_BYTES, rows * padded * INDEXER_LOGITS_BYTES)


def indexer_gather_workspace_bytes(max_model_len: int, index_entry_bytes: int) -> int:
    """Bytes of the sparse indexer's K-gather workspace and radix top-k workspace
    (``INDEXER_GATHER_SOURCE``): ``max_model_len x 8 x factor`` rows of ``index_entry_bytes``
    (132 B FP8, 68 B MXFP4 for K3.1) + 1 MiB. 1M context, FP8: 2,215,641,088 B."""
    factor = INDEXER_GATHER_FACTOR_SHORT if max_model_len <= INDEXER_GATHER_SHORT_LIMIT else INDEXER_GATHER_FACTOR_LONG
    return max_model_len * INDEXER_GATHER_ROWS_PER_FACTOR * factor * index_entry_bytes + RADIX_TOPK_WORKSPACE_BYTES


def measure_kv_cache_bytes(
    *, total_bytes: int, requested_bytes: int, non_kv_used_bytes: int, transient_peak_bytes: int, vendor: str
) -> int:
    """KV bytes per GPU as 0.34.0's extensible cache sizes them (``KV_SIZING_SOURCE``):
    ``min(requested - non_kv_used, headroom - margin) - transient_peak``, headroom = total - non_kv_used,
    margin = max(floor, 0.75 x transient_peak); at least 0."""
    headroom = total_bytes - non_kv_used_bytes
    margin = max(KV_MARGIN_FLOOR_BYTES.get(vendor, KV_MARGIN_FLOOR_BYTES["nvidia"]),
                 int(transient_peak_bytes * KV_MARGIN_FRACTION))
    available = min(requested_bytes - non_kv_used_bytes, headroom - margin) - transient_peak_bytes
    return max(available, 0)


@dataclass(frozen=True)
class MemoryTerm:
    """One use of GPU memory besides the KV cache.

    Attributes:
        name: what it is.
        low_bytes, high_bytes: bytes per GPU (equal when the wheel fixes the figure).
        transient: part of the profiled transient peak (counted 1.75x by the sizing), else resident.
        source: the wheel's lines it is computed from, or ``estimate: ...``.
    """

    name: str
    low_bytes: int
    high_bytes: int
    transient: bool
    source: str

    @property
    def estimate(self) -> bool:
        """Whether the figure is a range the wheel does not fix."""
        return self.source.startswith("estimate")


@dataclass(frozen=True)
class MemoryBudget:
    """The memory of one GPU of a copy, by term, and the KV bytes left at each end of the estimates.

    Attributes:
        gpu_memory_bytes: HBM per GPU.
        gpu_memory_utilization: the requested share (1.0 when unset: the engine's default).
        utilization_source: ``engine default`` or ``vllm.gpuMemoryUtilization``.
        limits: the batch limits the buffers are sized at.
        terms: the non-KV terms.
        kv_bytes_low, kv_bytes_high: KV bytes per GPU with every estimate at its high / low end.
    """

    gpu_memory_bytes: int
    gpu_memory_utilization: float
    utilization_source: str
    limits: BatchLimits
    terms: tuple[MemoryTerm, ...]
    kv_bytes_low: int
    kv_bytes_high: int

    def term(self, name: str) -> MemoryTerm:
        """The term called ``name``.

        Raises:
            KeyError: no such term.
        """
        for t in self.terms:
            if t.name == name:
                return t
        raise KeyError(name)


def _kv_bytes(total: int, utilization: float, terms: Sequence[MemoryTerm], vendor: str, high: bool) -> int:
    pick = (lambda t: t.high_bytes) if high else (lambda t: t.low_bytes)
    return measure_kv_cache_bytes(
        total_bytes=total,
        requested_bytes=int(total * utilization),
        non_kv_used_bytes=sum(pick(t) for t in terms if not t.transient),
        transient_peak_bytes=sum(pick(t) for t in terms if t.transient),
        vendor=vendor,
    )


# Term names (the plan and the tests address terms by them).
WEIGHTS = "weights"
FLASHINFER_WORKSPACE = "FlashInfer sparse MLA workspace"
INDEXER_GATHER = "indexer K-gather workspace"
INDEXER_LOGITS = "indexer logits buffer"
ACTIVATION_PEAK = "activation and sampler peak"
CUDA_GRAPHS = "CUDA graphs"
NON_TORCH = "outside torch"


def memory_budget(
    *,
    gpu: GpuFacts,
    weights_bytes_per_gpu: int,
    argv: Sequence[str],
    max_model_len: int,
    tensor_parallel_size: int,
    decode_context_parallel_size: int,
    num_attention_heads: int,
    index_topk: int,
    index_entry_bytes: int,
    flashinfer_sparse_backend: bool,
    dsa_layers: int,
    gpu_memory_utilization: float | None = None,
) -> MemoryBudget:
    """The per-GPU memory of one copy, term by term, and the KV bytes the engine leaves.

    Args:
        gpu: the GPU (memory, vendor, compute capability).
        weights_bytes_per_gpu: the weight shard.
        argv: the serving command's flags (the batch limits and speculative config are read there).
        max_model_len: the served context, tokens.
        tensor_parallel_size, decode_context_parallel_size: parallelism.
        num_attention_heads: query heads over all TP ranks (K3.1: 96).
        index_topk: keys the indexer keeps (K3.1: 2,048).
        index_entry_bytes: indexer key bytes per token (132 FP8, 68 MXFP4).
        flashinfer_sparse_backend: whether FLASHINFER_MLA_SPARSE serves the DSA layers (its workspace).
        dsa_layers: sparse layers (0: no indexer terms).
        gpu_memory_utilization: ``vllm.gpuMemoryUtilization``; None = the engine default, 1.0.

    Raises:
        ConfigError: a batch value in ``argv`` vLLM would not read.
    """
    limits = batch_limits(argv, gpu, max_model_len)
    cc = gpu.compute_capability
    sm10x = gpu.vendor == "nvidia" and cc is not None and cc[0] == 10
    dcp = decode_context_parallel_size
    terms = [MemoryTerm(WEIGHTS, weights_bytes_per_gpu, weights_bytes_per_gpu, False,
                        "the checkpoint's bytes / tensor-parallel size (model card size)")]
    if flashinfer_sparse_backend:
        ws = trtllm_sparse_mla_workspace_bytes(
            FLASHINFER_WORKSPACE_DEFAULT_BYTES, dcp, num_attention_heads // tensor_parallel_size, limits.max_num_batched_tokens
        )
        terms.append(MemoryTerm(FLASHINFER_WORKSPACE, ws, ws, False, FLASHINFER_WORKSPACE_SOURCE))
    if dsa_layers:
        gather = indexer_gather_workspace_bytes(max_model_len, index_entry_bytes)
        terms.append(MemoryTerm(INDEXER_GATHER, gather, gather, False, INDEXER_GATHER_SOURCE))
        logits = indexer_logits_bytes(max_model_len, limits, decode_context_parallel_size=dcp, sm10x=sm10x,
                                      index_topk=index_topk)
        terms.append(MemoryTerm(INDEXER_LOGITS, logits, logits, True, INDEXER_LOGITS_SOURCE))
    for name, est, transient in ((ACTIVATION_PEAK, ACTIVATION_PEAK_ESTIMATE, True),
                                 (CUDA_GRAPHS, CUDA_GRAPH_ESTIMATE, False), (NON_TORCH, NON_TORCH_ESTIMATE, False)):
        terms.append(MemoryTerm(name, est.low_bytes, est.high_bytes, transient, est.basis))
    utilization = 1.0 if gpu_memory_utilization is None else gpu_memory_utilization
    source = "engine default (unset)" if gpu_memory_utilization is None else "vllm.gpuMemoryUtilization"
    total = gpu.memory_bytes
    return MemoryBudget(
        gpu_memory_bytes=total,
        gpu_memory_utilization=utilization,
        utilization_source=source,
        limits=limits,
        terms=tuple(terms),
        kv_bytes_low=_kv_bytes(total, utilization, terms, gpu.vendor, high=True),
        kv_bytes_high=_kv_bytes(total, utilization, terms, gpu.vendor, high=False),
    )


def engine_computed_env(
    *, argv: Sequence[str], gpu: GpuFacts, max_model_len: int, tensor_parallel_size: int,
    decode_context_parallel_size: int, num_attention_heads: int, flashinfer_sparse_backend: bool,
) -> dict[str, int]:
    """Env buffer sizes the engine computes for a role, ``{env name: bytes}``: the FlashInfer
    workspace when FLASHINFER_MLA_SPARSE runs under DCP (a smaller explicit value is honoured and may
    overflow, flashinfer_mla_sparse.py:388-421). A role may leave them unset; it must not set less."""
    if not flashinfer_sparse_backend or decode_context_parallel_size <= 1:
        return {}
    limits = batch_limits(argv, gpu, max_model_len)
    return {FLASHINFER_WORKSPACE_ENV: trtllm_sparse_mla_workspace_bytes(
        FLASHINFER_WORKSPACE_DEFAULT_BYTES, decode_context_parallel_size,
        num_attention_heads // tensor_parallel_size, limits.max_num_batched_tokens)}

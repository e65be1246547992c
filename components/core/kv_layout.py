"""The KV cache of one model copy as vLLM lays it out: one term per cache, each with its bytes per
token per GPU, whether decode context parallelism (DCP) shards it, and where in the vLLM 0.34.0
wheel that is read.

How vLLM 0.34.0 sizes a Kimi K3.1 copy's cache (read in the wheel, paths under ``vllm/``):

- Every DSA layer caches, per token, one MLA latent row (``MLAAttention.get_kv_cache_spec``,
  model_executor/layers/attention/mla_attention.py:1567-1599) and one indexer key
  (``KimiK3IndexerCache``, models/kimi_k3/nvidia/dsa.py:199-205, sized by
  ``indexer_cache_entry_bytes``, models/kimi_k3/common/dsa_cache.py:56-61). A block row packs
  all of them: ``num_dsa x (mla_bytes_per_token + index_bytes)`` per token
  (models/kimi_k3/common/dsa_cache.py:200-206; v1/core/kv_cache_planning.py
  ``_get_packed_kv_cache_groups``).
- Both caches are replicated over tensor-parallel ranks (``max_tp_shards=1`` in both specs:
  mla_attention.py:1574, model_executor/models/deepseek_v2.py:662) and sharded over DCP ranks
  (``AttentionSpec.dcp_sharded`` defaults to True, v1/kv_cache_interface.py:560, and neither spec
  overrides it; ``FullAttentionSpec.max_memory_usage_bytes`` divides the length by the DCP size,
  kv_cache_interface.py:654-659; the indexer's slot mapping is per DCP rank,
  models/kimi_k3/common/dsa_cache.py:87-98).
- The 69 KDA (linear attention) layers keep a constant state per sequence, not per token: a
  ``MambaSpec`` of ``kda_state_shape`` (models/kimi_k3/nvidia/model.py:1606-1624) whose pages
  are blocks of the same pool; vLLM charges them per request when it reports capacity
  (``get_max_concurrency_for_kv_cache_config``, v1/core/kv_cache_utils.py:1082-1114). Its size
  follows the checkpoint's ``linear_attn_config`` (heads, head dim, conv kernel), which the
  model profile does not hold: the token figures leave it out (a few thousand tokens' worth per
  sequence, negligible against a 1M-token request, not against many short ones).
- vLLM logs the result as ``GPU KV cache size: N tokens`` (v1/core/kv_cache_utils.py:1169):
  N = max concurrency at ``--max-model-len`` x ``--max-model-len``. ``vllm.kvCacheTokens`` takes
  a measured N in place of the estimate.

Not modelled: the padding of a block row to the lcm of its pages' alignments (at most one
alignment unit per block; the block size follows the KDA state size, not in the profile).

``tests/vllm_kv_probe.py`` runs the installed vLLM's own classes and functions on CPU and
``tests/test_kv_layout.py`` compares them with the constants here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from .model import CacheGeometry, ModelProfile, VendorRecipe
from .targets import GpuFacts

# --- Facts read in the vLLM 0.34.0 wheel --------------------------------------------------------

# fp8_ds_mla, the FLASHMLA_SPARSE latent row: 512 FP8 NoPE values + 16 B of scales (4 FP32) +
# 128 B RoPE (64 BF16) = 656 B per token per layer (v1/attention/backend.py:1017-1018
# MLAAttentionImpl.get_fp8_ds_mla_row_bytes; the layout: v1/attention/backends/mla/flashmla_sparse.py:84-94).
FP8_DS_MLA_ROW_BYTES = 656
FP8_DS_MLA = "fp8_ds_mla"
# Bytes per cached value of the other latent formats: MLAAttentionSpec.page_size_bytes =
# head_size x element size, no V (v1/kv_cache_interface.py:597-613). "auto" caches in the model
# dtype (BF16 for K3.1).
KV_CACHE_ELEMENT_BYTES = {"auto": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

# The DSA indexer key cache: FP8 values + one FP32 scale per token, or MXFP4 values (two per
# byte) + one UE8M0 scale byte per 32 values (models/kimi_k3/common/dsa_cache.py:56-61;
# model_executor/layers/sparse_attn_indexer.py MXFP4_BLOCK_SIZE = 32).
INDEXER_FP8_SCALE_BYTES = 4
MXFP4_BLOCK_VALUES = 32
INDEXER_CACHE_DTYPES: tuple[str, ...] = ("fp8", "mxfp4")
DEFAULT_INDEXER_CACHE_DTYPE = "fp8"
# MXFP4 indexer keys: `--attention-config '{"indexer_kv_dtype":"mxfp4"}'` (config/attention.py:101).
# CUDA needs SM10x (v1/attention/backends/mla/indexer.py:101-106 dsa_indexer_uses_fp4); on ROCm
# only DeepSeek-V4/V4.1 are wired to it (indexer.py:83-90); K3.1 also needs LayerNorm keys with
# no indexer RoPE and no prefill context parallelism (models/kimi_k3/common/dsa_cache.py:29-53).
INDEXER_KV_DTYPE_KEY = "indexer_kv_dtype"
MXFP4_INDEXER_COMPUTE_CAPABILITY_MAJOR = 10
MXFP4_INDEXER_SOURCE = (
    "vLLM 0.34.0 v1/attention/backends/mla/indexer.py:67-107 (dsa_indexer_uses_fp4: SM10x on CUDA; on ROCm only "
    "DeepSeek-V4/V4.1) and models/kimi_k3/common/dsa_cache.py:29-53"
)

# Sparse MLA backends that serve DSA layers on SM10x. FLASHMLA_SPARSE serves any quantized KV
# dtype in the fp8_ds_mla layout (mla_attention.py:367-383 _canonicalize_sparse_mla_kv_cache_dtype);
# FLASHINFER_MLA_SPARSE keeps the plain per-tensor FP8 layout (mla_attention.py:556-564: "Using
# standard fp8 KV cache format"), head_size bytes per token (K3.1: 576).
FLASHMLA_SPARSE = "FLASHMLA_SPARSE"
FLASHINFER_MLA_SPARSE = "FLASHINFER_MLA_SPARSE"
# With no backend named, vLLM tries FLASHINFER_MLA_SPARSE then FLASHMLA_SPARSE for a quantized KV
# cache on SM10x (platforms/cuda.py:98-103), each only for the KV dtypes it lists:
# FLASHINFER_MLA_SPARSE fp8, fp8_e4m3 (v1/attention/backends/mla/flashinfer_mla_sparse.py:87-93);
# FLASHMLA_SPARSE fp8 (flashmla_sparse.py:156-162). K3.1's MLA shape passes FlashInfer's check
# (qk_nope_head_dim 128 of a 192-value query head: flashinfer_mla_sparse.py:140-160;
# models/kimi_k3/nvidia/specialized_decode/cutedsl/dsa/query_stage.py:387).
def is_quantized(kv_cache_dtype: str) -> bool:
    """Whether ``kv_cache_dtype`` is an FP8 cache (vLLM's ``is_quantized_kv_cache``)."""
    return kv_cache_dtype.startswith("fp8")


FLASH_ATTN_MLA_SPARSE_FA4 = "FLASH_ATTN_MLA_SPARSE_FA4"
ATTENTION_BACKEND_SOURCE = "vLLM 0.34.0 platforms/cuda.py l.81-128, 418-548 (the first sparse backend that validates)"
# cuda.py l.105: FA4 leads the BF16 sparse list at this many heads per rank or fewer.
FEW_HEADS_PER_RANK = 16


@dataclass(frozen=True)
class SparseBackendFacts:
    """What one sparse MLA backend's ``validate_configuration`` checks that a stack can change.

    Attributes:
        kv_cache_dtypes: the ``--kv-cache-dtype`` values it stores.
        block_multiple: a ``--block-size`` must be a multiple of this (its kernel block size).
        gathered_heads: heads per rank x DCP it runs (None: any); ``gathered_heads_dcp`` under DCP.
    """

    kv_cache_dtypes: tuple[str, ...]
    block_multiple: int
    gathered_heads: tuple[int, ...] | None = None
    gathered_heads_dcp: tuple[int, ...] | None = None


SPARSE_BACKENDS: Mapping[str, SparseBackendFacts] = MappingProxyType({
    FLASHINFER_MLA_SPARSE: SparseBackendFacts(("auto", "float16", "bfloat16", "fp8", "fp8_e4m3"), 32),
    FLASHMLA_SPARSE: SparseBackendFacts(("auto", "bfloat16", "fp8_ds_mla", "fp8", "nvfp4_ds_mla"), 64),
    FLASH_ATTN_MLA_SPARSE_FA4: SparseBackendFacts(("auto", "bfloat16"), 32, (8, 16, 32, 64, 128), (8, 16, 32, 64)),
})


def sm10_sparse_priorities(kv_cache_dtype: str, heads_per_rank: int) -> tuple[str, ...]:
    """The sparse tail of vLLM's SM 10.x MLA priorities (platforms/cuda.py l.94-115)."""
    if is_quantized(kv_cache_dtype):
        return (FLASHINFER_MLA_SPARSE, FLASHMLA_SPARSE)
    if heads_per_rank <= FEW_HEADS_PER_RANK:
        return (FLASH_ATTN_MLA_SPARSE_FA4, FLASHINFER_MLA_SPARSE, FLASHMLA_SPARSE)
    return (FLASHMLA_SPARSE, FLASHINFER_MLA_SPARSE)



# The quantized latent formats each SM10x sparse backend stores (derived from ``SPARSE_BACKENDS``) and
# vLLM's order for a quantized cache, which is where the cache layout's format depends on the backend.
SPARSE_BACKEND_KV_DTYPES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    b: tuple(d for d in SPARSE_BACKENDS[b].kv_cache_dtypes if d in KV_CACHE_ELEMENT_BYTES and is_quantized(d))
    for b in (FLASHINFER_MLA_SPARSE, FLASHMLA_SPARSE)
})
SM10X_SPARSE_BACKEND_ORDER: tuple[str, ...] = sm10_sparse_priorities("fp8", FEW_HEADS_PER_RANK)
DEFAULT_BACKEND_SOURCE = "vLLM's choice on SM10x with a quantized KV cache (platforms/cuda.py:98-103): no backend named"

_LAYOUT_SOURCE = "vLLM 0.34.0"


@dataclass(frozen=True)
class KvCacheTerm:
    """One cache of the model, as the engine sizes it.

    Attributes:
        name: what the cache holds, e.g. ``"MLA latent"``.
        layers: layers that hold this cache.
        format: the stored format (``fp8_ds_mla``, ``fp8``, ``bf16``, ``mxfp4``, ``state``).
        bytes_per_token_per_layer: bytes one token takes in one layer (0 for a per-sequence state).
        dcp_sharded: whether decode context parallelism splits its tokens over the DCP ranks.
        per_sequence: a constant state per sequence (KDA), not a per-token cache.
        source: the lines of the vLLM wheel it is read from.
    """

    name: str
    layers: int
    format: str
    bytes_per_token_per_layer: int
    dcp_sharded: bool
    per_sequence: bool
    source: str

    @property
    def bytes_per_token_per_gpu(self) -> int:
        """``layers x bytes_per_token_per_layer``: both DSA caches are whole on every TP rank."""
        return self.layers * self.bytes_per_token_per_layer


@dataclass(frozen=True)
class KvCacheLayout:
    """The caches of one model copy, one term each, and what chose their formats.

    Attributes:
        terms: the caches (per-token ones first, then per-sequence states).
        kv_cache_dtype: ``--kv-cache-dtype`` as served (``auto`` = the model dtype).
        indexer_cache_dtype: ``fp8`` or ``mxfp4`` (``vllm.indexerCacheDtype``).
        attention_backend: the sparse MLA backend whose latent format the MLA term uses, or None
            when the format does not depend on it (an unquantized cache).
        backend_source: why that backend (named in the command, or vLLM's default).
    """

    terms: tuple[KvCacheTerm, ...]
    kv_cache_dtype: str
    indexer_cache_dtype: str
    attention_backend: str | None
    backend_source: str

    @property
    def bytes_per_token_per_gpu(self) -> int:
        """Bytes one token takes on each GPU at plain tensor parallelism (the per-token terms)."""
        return sum(t.bytes_per_token_per_gpu for t in self.terms if not t.per_sequence)

    def bytes_per_token_per_gpu_at(self, decode_context_parallel_size: int) -> float:
        """Bytes one token takes on each GPU with DCP: the sharded terms divided by the DCP size."""
        dcp = decode_context_parallel_size
        return sum(t.bytes_per_token_per_gpu / (dcp if t.dcp_sharded else 1) for t in self.terms if not t.per_sequence)

    def tokens(self, kv_bytes_per_gpu: int, decode_context_parallel_size: int = 1) -> int:
        """Tokens of one copy that ``kv_bytes_per_gpu`` of KV memory on each GPU holds.

        Exact integer arithmetic: ``floor(budget x dcp / (sharded + unsharded x dcp))``.

        Raises:
            ValueError: the DCP size is below 1, or no term grows with the tokens.
        """
        dcp = decode_context_parallel_size
        if dcp < 1:
            raise ValueError(f"decode context parallel size must be >= 1, got {dcp}")
        per_token = [t for t in self.terms if not t.per_sequence]
        sharded = sum(t.bytes_per_token_per_gpu for t in per_token if t.dcp_sharded)
        unsharded = sum(t.bytes_per_token_per_gpu for t in per_token if not t.dcp_sharded)
        if sharded + unsharded <= 0:
            raise ValueError("the layout has no per-token cache: its capacity is not a number of tokens")
        return max(0, kv_bytes_per_gpu) * dcp // (sharded + unsharded * dcp)


def indexer_entry_bytes(index_head_dim: int, indexer_cache_dtype: str) -> int:
    """Indexer key bytes per token per layer: FP8 ``index_head_dim + 4``; MXFP4
    ``index_head_dim / 2 + index_head_dim / 32`` (K3.1, 128 dims: 132 or 68 B).

    Raises:
        ValueError: a dtype other than ``fp8`` / ``mxfp4``.
    """
    if indexer_cache_dtype == "fp8":
        return index_head_dim + INDEXER_FP8_SCALE_BYTES
    if indexer_cache_dtype == "mxfp4":
        return index_head_dim // 2 + index_head_dim // MXFP4_BLOCK_VALUES
    raise ValueError(f"indexer cache dtype {indexer_cache_dtype!r} (allowed: {', '.join(INDEXER_CACHE_DTYPES)})")


def mla_format(kv_cache_dtype: str, attention_backend: str | None, mla_head_size: int) -> tuple[str, int]:
    """The latent format a sparse MLA layer stores and its bytes per token, as vLLM resolves it:
    FLASHMLA_SPARSE turns any quantized dtype into ``fp8_ds_mla`` (656 B); otherwise the dtype's
    own layout, ``mla_head_size`` values of its element size (K3.1: 576 B FP8, 1,152 B BF16).

    Raises:
        ValueError: an unknown KV dtype.
    """
    if kv_cache_dtype not in KV_CACHE_ELEMENT_BYTES:
        raise ValueError(f"KV cache dtype {kv_cache_dtype!r} (allowed: {', '.join(KV_CACHE_ELEMENT_BYTES)})")
    if is_quantized(kv_cache_dtype) and attention_backend == FLASHMLA_SPARSE:
        return FP8_DS_MLA, FP8_DS_MLA_ROW_BYTES
    element = KV_CACHE_ELEMENT_BYTES[kv_cache_dtype]
    return ("bf16" if element == 2 else kv_cache_dtype), mla_head_size * element


def default_sparse_backend(kv_cache_dtype: str, gpu: GpuFacts) -> str | None:
    """The sparse MLA backend vLLM picks for a quantized cache when none is named: the first of
    ``SM10X_SPARSE_BACKEND_ORDER`` that lists the dtype, on an SM10x GPU; None otherwise (an
    unquantized cache, whose format no backend changes, or a GPU outside the table)."""
    cc = gpu.compute_capability
    if not is_quantized(kv_cache_dtype) or cc is None or cc[0] != 10:
        return None
    return next((b for b in SM10X_SPARSE_BACKEND_ORDER if kv_cache_dtype in SPARSE_BACKEND_KV_DTYPES[b]), None)


def _json_backend(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    backend = value.get("backend") if isinstance(value, dict) else None
    return backend if isinstance(backend, str) else None


def named_attention_backend(argv: Sequence[str]) -> str | None:
    """The attention backend an argv names: the last ``--attention-backend`` (``X`` or ``=X``) or
    ``--attention-config`` JSON ``backend`` key, as argparse keeps the last; None when none."""
    named: str | None = None
    for i, arg in enumerate(argv):
        flag, eq, inline = arg.partition("=")
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if flag == "--attention-backend" and value:
            named = value
        elif flag == "--attention-config":
            named = _json_backend(value) or named
    return named


def recipe_argv(recipe: VendorRecipe, decode_context_parallel_size: int) -> tuple[str, ...]:
    """The recipe's flags as the command carries them: with DCP > 1 its ``dcp_flags`` replace
    the flags of the same name and the rest follow (``vllm._common_argv`` lays them out so)."""
    dcp_flags = dict(recipe.dcp_flags) if decode_context_parallel_size > 1 else {}
    out: list[str] = []
    for flag, value in recipe.flags:
        value = dcp_flags.pop(flag, value)
        out += [flag] if value is None else [flag, value]
    for flag, value in dcp_flags.items():
        out += [flag] if value is None else [flag, value]
    return tuple(out)


def mxfp4_indexer_supported(gpu: GpuFacts) -> bool:
    """Whether vLLM writes MXFP4 indexer keys for K3.1 on ``gpu``: CUDA SM10x only (``MXFP4_INDEXER_SOURCE``)."""
    cc = gpu.compute_capability
    return gpu.vendor == "nvidia" and cc is not None and cc[0] == MXFP4_INDEXER_COMPUTE_CAPABILITY_MAJOR


def kv_cache_layout(
    geometry: CacheGeometry,
    kv_cache_dtype: str,
    gpu: GpuFacts,
    *,
    indexer_cache_dtype: str = DEFAULT_INDEXER_CACHE_DTYPE,
    argv: Sequence[str] = (),
) -> KvCacheLayout:
    """The caches of one copy of a model of ``geometry`` served with ``kv_cache_dtype`` on ``gpu``
    by a command whose flags are ``argv`` (they may name the attention backend).

    Raises:
        ValueError: an unknown KV or indexer dtype.
    """
    backend, backend_source = named_attention_backend(argv), "named in the command"
    if not is_quantized(kv_cache_dtype):
        backend, backend_source = None, "any backend: an unquantized latent has one layout"
    elif backend is None:
        backend = default_sparse_backend(kv_cache_dtype, gpu)
        backend_source = DEFAULT_BACKEND_SOURCE if backend else f"none: no sparse MLA backend of {gpu.name} listed"
    fmt, mla_bytes = mla_format(kv_cache_dtype, backend, geometry.mla_head_size)
    index_bytes = indexer_entry_bytes(geometry.index_head_dim, indexer_cache_dtype)
    mla_source = (
        f"{_LAYOUT_SOURCE} mla_attention.py:1567-1599 (MLAAttentionSpec, max_tp_shards=1); "
        + ("backend.py:1017-1018, flashmla_sparse.py:84-94 (fp8_ds_mla row)" if fmt == FP8_DS_MLA
           else f"kv_cache_interface.py:597-613 ({geometry.mla_head_size} values x {mla_bytes // geometry.mla_head_size} B)")
        + "; dcp_sharded: kv_cache_interface.py:560, 654-659"
    )
    index_source = (
        f"{_LAYOUT_SOURCE} models/kimi_k3/common/dsa_cache.py:56-61 (indexer_cache_entry_bytes), "
        "models/kimi_k3/nvidia/dsa.py:199-205, deepseek_v2.py:658-666 (max_tp_shards=1, dcp_sharded by default); "
        "per-DCP-rank slots: dsa_cache.py:87-98"
    )
    terms = (
        KvCacheTerm("MLA latent", geometry.dsa_layers, fmt, mla_bytes, True, False, mla_source),
        KvCacheTerm("DSA indexer keys", geometry.dsa_layers, indexer_cache_dtype, index_bytes, True, False, index_source),
        KvCacheTerm(
            "KDA state", geometry.state_layers, "state", 0, False, True,
            f"{_LAYOUT_SOURCE} models/kimi_k3/nvidia/model.py:1606-1624 (kda_state_shape), charged per request in "
            "v1/core/kv_cache_utils.py:1082-1114; its size follows the checkpoint's linear_attn_config (not in the profile)",
        ),
    )
    return KvCacheLayout(terms, kv_cache_dtype, indexer_cache_dtype, backend, backend_source)


def model_layout(
    model: ModelProfile,
    kv_cache_dtype: str,
    gpu: GpuFacts,
    *,
    indexer_cache_dtype: str = DEFAULT_INDEXER_CACHE_DTYPE,
    argv: Sequence[str] = (),
) -> KvCacheLayout:
    """``kv_cache_layout`` of ``model``'s cache geometry."""
    return kv_cache_layout(model.cache_geometry, kv_cache_dtype, gpu, indexer_cache_dtype=indexer_cache_dtype, argv=argv)

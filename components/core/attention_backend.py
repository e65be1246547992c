"""The attention backend every CUDA role names: the one vLLM 0.34.0 would pick itself for the model's
sparse (DSA) MLA layers on the target's GPU, KV cache dtype and decode context parallelism.

The command names it (``--attention-backend``) so the cache layout the plan sizes
(``kv_layout.py``, whose latent format depends on the backend) and the engine's choice cannot
diverge, and a change of vLLM's priorities cannot silently swap it. Pure data, no vLLM import:
``tests/test_vllm_contract.py`` runs the wheel's own selection (``CudaPlatform.get_attn_backend_cls``
with no backend named, on CPU) for every CUDA role and for a set of dtypes, DCP sizes and block
sizes, and fails when it picks another backend than ``cuda_attention_backend`` or refuses them all
where this module names one.

Source: vLLM 0.34.0 (the wheel built 2026-11-16, commit 62d4bc3c7):

- Priorities, ``vllm/platforms/cuda.py`` l.81-128 (``_get_backend_priorities``, ``use_mla``, SM 10.x):
  the dense MLA backends first (each refuses sparse layers: "sparse not supported"), then the sparse
  tail: FLASHINFER_MLA_SPARSE, FLASHMLA_SPARSE with an FP8 cache; with a BF16 cache
  FLASH_ATTN_MLA_SPARSE_FA4, FLASHINFER_MLA_SPARSE, FLASHMLA_SPARSE at 16 heads per rank or fewer,
  else FLASHMLA_SPARSE, FLASHINFER_MLA_SPARSE. The first that validates serves (l.418-456, 461-548).
- What each validates: its KV cache dtypes (``supported_kv_cache_dtypes``) and kernel block sizes
  (``get_supported_kernel_block_sizes``; a ``--block-size`` must be a multiple,
  ``v1/attention/backend.py`` l.125-141): FLASHINFER_MLA_SPARSE ``flashinfer_mla_sparse.py``
  l.87-97 (multiples of 32), FLASHMLA_SPARSE ``flashmla_sparse.py`` l.156-172 (64 with a quantized
  cache on SM 10.x, else multiples of 64), FLASH_ATTN_MLA_SPARSE_FA4 ``flashattn_mla_sparse.py``
  l.275-343 (BF16 only; 8, 16, 32, 64 or, without DCP, 128 gathered query heads: heads per rank x DCP).
"""

from __future__ import annotations

from collections.abc import Sequence

from .kv_layout import (
    SPARSE_BACKENDS,
    sm10_sparse_priorities,
)
from .model import ModelProfile
from .scheduler_limits import int_value, sized_values
from .targets import TargetProfile


def backend_refusals(backend: str, *, kv_cache_dtype: str, heads_per_rank: int, decode_context_parallel_size: int,
                     block_size: int | None) -> list[str]:
    """Why ``backend`` refuses the configuration (``SparseBackendFacts``); empty when it validates."""
    facts = SPARSE_BACKENDS[backend]
    reasons = []
    if kv_cache_dtype not in facts.kv_cache_dtypes:
        reasons.append("kv_cache_dtype not supported")
    if block_size is not None and block_size % facts.block_multiple != 0:
        reasons.append("block_size not supported")
    heads = facts.gathered_heads_dcp if decode_context_parallel_size > 1 else facts.gathered_heads
    if heads is not None and heads_per_rank * decode_context_parallel_size not in heads:
        reasons.append(f"gathered query heads {heads_per_rank * decode_context_parallel_size} not in {heads}")
    return reasons


def cuda_attention_backend(*, compute_capability: tuple[int, int] | None, sparse: bool, kv_cache_dtype: str,
                           heads_per_rank: int, decode_context_parallel_size: int = 1,
                           block_size: int | None = None) -> str | None:
    """The attention backend vLLM 0.34.0 picks for sparse MLA layers: the first of
    ``sm10_sparse_priorities`` with no ``backend_refusals``.

    Args:
        compute_capability: the GPU's (major, minor); only SM 10.x is modelled.
        sparse: whether the layers are sparse (DSA); dense MLA is not modelled.
        kv_cache_dtype: ``--kv-cache-dtype`` as the command passes it (``auto`` when unset).
        heads_per_rank: attention heads per tensor-parallel rank.
        decode_context_parallel_size: DCP size.
        block_size: ``--block-size`` when the command sets it.

    Returns:
        The backend's name (``AttentionBackendEnum`` member), or None where this module does not
        model vLLM's choice (not SM 10.x, not sparse) or no backend validates.
    """
    if not sparse or compute_capability is None or compute_capability[0] != 10:
        return None
    for backend in sm10_sparse_priorities(kv_cache_dtype, heads_per_rank):
        if not backend_refusals(backend, kv_cache_dtype=kv_cache_dtype, heads_per_rank=heads_per_rank,
                                decode_context_parallel_size=decode_context_parallel_size, block_size=block_size):
            return backend
    return None


def accepted_block_sizes(backend: str) -> str:
    """What ``--block-size`` ``backend`` accepts, in words (``SparseBackendFacts.block_multiple``)."""
    return f"a multiple of {SPARSE_BACKENDS[backend].block_multiple}"


def role_attention_backend(model: ModelProfile, target: TargetProfile, kv_cache_dtype: str,
                           decode_context_parallel_size: int, extra_args: Sequence[str] = ()) -> str | None:
    """``cuda_attention_backend`` for a model copy of ``model`` on ``target`` (TP = GPUs per copy)
    serving ``kv_cache_dtype`` with DCP ``decode_context_parallel_size`` and ``vllm.extraArgs``
    ``extra_args`` (their ``--block-size``); None off CUDA or for a model without MLA facts.

    Raises:
        ConfigError: a ``--block-size`` that is not a whole number (key ``vllm.extraArgs``).
    """
    attention = model.attention
    if target.image_family != "cuda" or attention is None:
        return None
    written = sized_values(extra_args).get("block_size")
    block = int_value("block_size", *written) if written else None
    return cuda_attention_backend(
        compute_capability=target.gpu.compute_capability, sparse=attention.sparse, kv_cache_dtype=kv_cache_dtype,
        heads_per_rank=attention.num_heads // target.gpus_per_copy,
        decode_context_parallel_size=decode_context_parallel_size, block_size=block,
    )


def attention_backend_flags(model: ModelProfile, target: TargetProfile, kv_cache_dtype: str,
                            decode_context_parallel_size: int, extra_args: Sequence[str] = ()) -> tuple[str, ...]:
    """``("--attention-backend", NAME)`` of ``role_attention_backend``, or ``()`` when it names none.
    The command and the sizing's cache layout (``sizing.serving_argv``) both carry these flags."""
    name = role_attention_backend(model, target, kv_cache_dtype, decode_context_parallel_size, extra_args)
    return () if name is None else ("--attention-backend", name)

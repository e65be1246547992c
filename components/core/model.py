"""Model profiles: what a checkpoint weighs, how vLLM must serve it, and what its API costs.

Facts for Kimi K3.1 Pro come from its model card, the vLLM recipe
(vllm-project/recipes, models/moonshotai/Kimi-K3.yaml) and the Kimi open platform price list,
and the model card (https://huggingface.co/moonshotai/Kimi-K3.1-Pro). Adding a model adds an entry to ``MODELS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .versions import KIMI_K3_1_MIN_VLLM_VERSION


@dataclass(frozen=True)
class VendorRecipe:
    """The vLLM recipe flags and environment for one GPU vendor.

    Attributes:
        load_format: ``--load-format`` value.
        kv_cache_dtype: default ``--kv-cache-dtype`` (``"auto"`` = the model dtype, flag omitted).
        flags: further flags as ``(flag, value or None)`` pairs, in recipe order.
        env: environment variables the recipe sets (the engine-ready timeout is added
            from the sizing, not here).
        dcp_flags: flags the recipe adds with decode context parallelism (DCP > 1); a flag
            also in ``flags`` replaces it there.
        dcp_env: environment added with DCP > 1.
    """

    load_format: str
    kv_cache_dtype: str
    flags: tuple[tuple[str, str | None], ...]
    env: Mapping[str, str]
    dcp_flags: tuple[tuple[str, str | None], ...] = ()
    dcp_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class EngineRequirement:
    """What the serving engine must implement to run a model on one GPU vendor.

    Attributes:
        min_version: the lowest vLLM release that serves the model (``X.Y.Z``).
        features: engine features the model needs, as named in ``versions.VLLM_RELEASE_GAPS``
            and checked in the installed wheel by ``tests/vllm_contract.py``.
        source: where the requirement comes from.
    """

    min_version: str
    features: tuple[str, ...]
    source: str


# K3.1 Pro's 24 Gated DSA layers select the top 2,048 tokens with a sparse indexer; a build
# whose Kimi-K3 MLA runs dense (no indexer) computes different attention.
SPARSE_INDEXER_MLA = "sparse-indexer-mla"


@dataclass(frozen=True)
class MlaAttention:
    """The MLA attention layers of a model, as vLLM's attention backends check them
    (``AttentionBackend.validate_configuration``; the tests run it with vLLM's own classes).

    Attributes:
        sparse: whether every MLA layer is sparse (DSA: an indexer picks the keys each query
            reads); vLLM then asks for a sparse backend (``use_sparse=True``).
        num_heads: query heads over all tensor-parallel ranks.
        kv_lora_rank: latent width; the backend's head size is ``kv_lora_rank + qk_rope_head_dim``.
        qk_nope_head_dim, qk_rope_head_dim, v_head_dim: per-head query/key and value widths.
        index_topk: keys the indexer keeps per query (None: not sparse).
        dtype: the activation dtype vLLM runs the layers in (``bfloat16``).
        source: where the figures are read.
    """

    sparse: bool
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    index_topk: int | None
    dtype: str
    source: str

    @property
    def head_size(self) -> int:
        """The MLA backend's head size: the latent plus the RoPE part (576 for K3.1)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


# K3.1 Pro's 24 MLA layers are all DSA. Dimensions read from vLLM 0.34.0's K3/K3.1 kernels (no
# config.json is read here): 96 heads (models/kimi_k3/nvidia/specialized_decode/cutedsl/mla/dcp.py,
# "96 heads" per layer), q rows of 192 = 128 NoPE + 64 RoPE (cutedsl/dsa/query_stage.py), latent
# 512, RoPE 64 and V 128 (specialized_decode/drafter/attention.py); top 2,048 keys (model card).
KIMI_K3_1_ATTENTION = MlaAttention(
    sparse=True, num_heads=96, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    index_topk=2048, dtype="bfloat16",
    source="vLLM 0.34.0 vllm/models/kimi_k3/nvidia/specialized_decode (cutedsl/mla/dcp.py, cutedsl/dsa/query_stage.py, "
    "drafter/attention.py); model card (top 2,048 tokens)",
)


@dataclass(frozen=True)
class ApiPrice:
    """The vendor API's list price per million tokens.

    Attributes:
        currency: ISO code of the prices.
        input_cache_miss_per_mtok, input_cache_hit_per_mtok, output_per_mtok: price per 1M tokens.
        source: where the prices come from.
    """

    currency: str
    input_cache_miss_per_mtok: float
    input_cache_hit_per_mtok: float
    output_per_mtok: float
    source: str


@dataclass(frozen=True)
class CacheGeometry:
    """What a checkpoint's config gives the engine to size its KV cache from (``kv_layout.py``
    turns it into bytes per token with the engine's formats).

    Attributes:
        dsa_layers: sparse-attention (DSA) layers; each caches an MLA latent row and an indexer
            key per token.
        state_layers: linear-attention (KDA) layers; each keeps a constant state per sequence.
        mla_head_size: latent values per token per DSA layer (``kv_lora_rank + qk_rope_head_dim``).
        index_head_dim: indexer key values per token per DSA layer (``dsa_config.index_head_dim``).
        source: where the figures come from.
    """

    dsa_layers: int
    state_layers: int
    mla_head_size: int
    index_head_dim: int
    source: str


@dataclass(frozen=True)
class PublishedKvClaim:
    """A published KV-capacity figure for a model, shown beside the figure from the engine's cache
    layout (it is a claim, not an input of the sizing).

    Attributes:
        gpu: the GPU model it is for (``targets.GPUS`` key); ``gpus``: GPUs of the copy.
        kv_cache_dtype: ``--kv-cache-dtype``; ``gpu_memory_utilization``: ``--gpu-memory-utilization``.
        tokens_tp: the claimed KV tokens at plain tensor parallelism.
        decode_context_parallel_size, tokens_dcp: the claimed KV tokens with that DCP size.
        implied_bytes_per_token: bytes per token per GPU the claim was read with.
        implied_by: what that byte count covers, in words.
        source: where the claim is published.
    """

    gpu: str
    gpus: int
    kv_cache_dtype: str
    gpu_memory_utilization: float
    tokens_tp: int
    decode_context_parallel_size: int
    tokens_dcp: int
    implied_bytes_per_token: int
    implied_by: str
    source: str


@dataclass(frozen=True)
class ChatMarkup:
    """The chat-format markup a model's tokenizer renders and the engine's parsers consume.

    None of it may reach the text an API client sees (``content``, ``reasoning``): when it does,
    a parser is missing or wrong (``scripts/ops/validate.py`` checks this).

    Attributes:
        special_tokens: marker tokens of the format (each one token in the model's vocabulary).
        reasoning_open, reasoning_close: what wraps the reasoning (thinking) channel.
        tools_open, tools_close: what wraps the tool-call channel of an assistant turn.
        source: where the format is read from.
    """

    special_tokens: tuple[str, ...]
    reasoning_open: str
    reasoning_close: str
    tools_open: str
    tools_close: str
    source: str


# Kimi K3's XTML chat format: every element is <|open|>NAME ATTRS<|sep|> ... <|close|>NAME<|sep|>
# built from three special tokens; channels think (reasoning), response (content), tools (calls).
KIMI_K3_MARKUP = ChatMarkup(
    special_tokens=("<|open|>", "<|close|>", "<|sep|>"),
    reasoning_open="<|open|>think<|sep|>",
    reasoning_close="<|close|>think<|sep|>",
    tools_open="<|open|>tools<|sep|>",
    tools_close="<|close|>tools<|sep|>",
    source="vLLM 0.33.0 vllm/tool_parsers/kimi_k3_tool_parser.py and vllm/reasoning/kimi_k3_reasoning_parser.py",
)


@dataclass(frozen=True)
class ModelProfile:
    """One checkpoint and how to serve it.

    Attributes:
        name: config value of ``kimi-deploy:model.profile``.
        display_name: for people and the license attribution.
        hf_repo: Hugging Face repository id.
        modelscope_repo: ModelScope model id.
        weights_bytes: total checkpoint size in bytes (decimal TB as published).
        file_count: files in the repository.
        total_params: parameters.
        max_context_tokens: longest context the model supports.
        tool_call_parser, reasoning_parser: vLLM parser names.
        chat_markup: the chat-format markup those parsers consume (must never reach API text).
        trust_remote_code: whether the repository ships code vLLM must run.
        min_vllm_version: the version the model card asks for.
        cache_geometry: the layers and dimensions the engine sizes the KV cache from
            (``kv_layout.py`` gives the bytes per token).
        recipes: image family (``cuda``/``rocm``) -> vendor recipe.
        api_price: the vendor API price, for cost comparisons.
        license_summary: the commercial conditions users must acknowledge.
        engine_requirements: image family (``cuda``/``rocm``) -> what the engine must implement
            (``engine.check_engine`` enforces it).
        kv_claim: a published KV-capacity figure, shown beside the engine-layout one (or None).
        attention: its MLA attention layers, for checking the attention backends the command
            names (None: not checked).
        reasoning_efforts: the ``reasoning_effort`` values the pinned engine accepts for this model,
            lowest to highest (``()``: the field is not supported).
        sparse_attention_tokens: how many past tokens a sparse-attention layer attends to per query
            (its top-k), None for dense attention; facts beyond this window test the selection.
    """

    name: str
    display_name: str
    hf_repo: str
    modelscope_repo: str
    weights_bytes: int
    file_count: int
    total_params: int
    max_context_tokens: int
    tool_call_parser: str
    reasoning_parser: str
    chat_markup: ChatMarkup
    trust_remote_code: bool
    min_vllm_version: str
    cache_geometry: CacheGeometry
    recipes: Mapping[str, VendorRecipe]
    api_price: ApiPrice
    license_summary: str
    engine_requirements: Mapping[str, EngineRequirement] = field(default_factory=lambda: MappingProxyType({}))
    kv_claim: PublishedKvClaim | None = None
    attention: MlaAttention | None = None
    reasoning_efforts: tuple[str, ...] = ()
    sparse_attention_tokens: int | None = None


# Kimi K3.1 Pro: 93 layers = 69 Kimi Delta Attention (constant state per sequence, no KV growth)
# + 24 Gated DSA layers (model card). Per DSA layer and token the engine caches a 576-value MLA
# latent (kv_lora_rank 512 + qk_rope_head_dim 64: the "kv_a 576" of vLLM 0.34.0's
# models/kimi_k3/nvidia/specialized_decode/cutedsl/dsa/prepared.py:30) and a 128-value indexer key
# ("wk 128" there; dsa_cache.py:30-31 gives its entry as 132 B FP8, 68 B MXFP4).
KIMI_K3_1_CACHE_GEOMETRY = CacheGeometry(
    dsa_layers=24,
    state_layers=69,
    mla_head_size=KIMI_K3_1_ATTENTION.head_size,  # 512 latent + 64 RoPE: one fact, in KIMI_K3_1_ATTENTION
    index_head_dim=128,
    source=(
        "model card (24 Gated DSA + 69 KDA layers); vLLM 0.34.0 models/kimi_k3/nvidia/specialized_decode/cutedsl/dsa/"
        "prepared.py:30 (kv_a 576, wk 128) and models/kimi_k3/common/dsa_cache.py:30-31 (132 B / 68 B index entries)"
    ),
)

# The vLLM recipe (vllm-project/recipes, Kimi-K3.yaml), as quoted for K3.1 Pro at its release: 8x B300 with FP8 KV holds about
# 2.6M tokens at plain TP8 and about 18.5M with DCP8. Read with 24 x 656 B = 15,744 B per token
# (the fp8_ds_mla MLA latent alone), as this toolkit did before it read the engine's layout.
KIMI_K3_1_KV_CLAIM = PublishedKvClaim(
    gpu="B300",
    gpus=8,
    kv_cache_dtype="fp8",
    gpu_memory_utilization=0.95,
    tokens_tp=2_600_000,
    decode_context_parallel_size=8,
    tokens_dcp=18_500_000,
    implied_bytes_per_token=24 * 656,
    implied_by="24 x 656 B: the fp8_ds_mla MLA latent alone",
    source=(
        "the vLLM recipe for Kimi K3 (vllm-project/recipes, models/moonshotai/Kimi-K3.yaml), as quoted for K3.1 Pro "
        "at its release"
    ),
)

KIMI_K3_1_PRO = ModelProfile(
    name="kimi-k3.1-pro",
    display_name="Kimi K3.1-Pro",
    hf_repo="moonshotai/Kimi-K3.1-Pro",
    modelscope_repo="moonshotai/Kimi-K3.1-Pro",
    weights_bytes=1_560_000_000_000,
    file_count=112,
    total_params=2_780_000_000_000,
    max_context_tokens=1_048_576,
    tool_call_parser="kimi_k3",
    reasoning_parser="kimi_k3",
    chat_markup=KIMI_K3_MARKUP,
    trust_remote_code=True,
    min_vllm_version=KIMI_K3_1_MIN_VLLM_VERSION,
    cache_geometry=KIMI_K3_1_CACHE_GEOMETRY,
    recipes=MappingProxyType(
        {
            "cuda": VendorRecipe(
                load_format="fastsafetensors",
                kv_cache_dtype="fp8",
                # --attention-config, re-read against 0.34.0 for DSA layers (config/attention.py,
                # model_executor/layers/attention/mla_attention.py): FLASHINFER_MLA_SPARSE keeps the
                # dense-MHA prefill path, so the layer builds the named mla_prefill_backend (FLASHINFER
                # here, TRTLLM_RAGGED with DCP; both SM10 only and made for K3.1's 128/64/128 q/k/v dims:
                # prefill/flashinfer.py, prefill/trtllm_ragged.py); a named one that does not fit raises
                # at start. use_prefill_query_quantization gives FP8 prefill queries with the FP8 KV cache
                # on SM10x with those two backends (backend_supports_prefill_query_quantization).
                flags=(
                    (
                        "--attention-config",
                        '{"use_prefill_query_quantization":true,"mla_prefill_backend":"flashinfer"}',
                    ),
                    ("--enable-prefix-caching", None),
                    ("--no-enable-flashinfer-autotune", None),
                ),
                # Without --attention-backend (plain TP), vLLM 0.34.0 picks the first backend of
                # platforms/cuda.py _get_backend_priorities (use_mla, SM10x) that validates: the
                # dense MLA backends ahead of the list refuse K3.1's DSA layers ("sparse not
                # supported"), and with an FP8 KV cache FLASHINFER_MLA_SPARSE comes before
                # FLASHMLA_SPARSE, so it serves them (tests/test_vllm_contract.py checks it).
                # The recipe's decode_context_parallelism feature (vllm-project/recipes
                # models/moonshotai/Kimi-K3.yaml, #814) was written for K3's dense MLA: all-to-all
                # DCP exchange and TRTLLM_RAGGED MLA prefill under FP8 KV are kept; its decode backend,
                # TOKENSPEED_MLA, is not sparse and vLLM refuses it for every K3.1 MLA layer (all DSA).
                # FLASHINFER_MLA_SPARSE replaces it: sparse, supports DCP (FlashInferMLASparseImpl
                # supports_dcp) and FP8 KV on SM10x (B300/GB300: SM 10.3), and takes K3.1's MLA dims
                # (qk_nope 128 in [128, 192]; index_topk set). FLASHMLA_SPARSE would validate too but
                # fails at start under DCP with FP8 KV: its FP8 decode pads 12 local heads (96 / TP8)
                # to 64 and the 96 DCP-gathered heads to 128, which its metadata builder refuses
                # (v1/attention/backends/mla/flashmla_sparse.py, "pad to the same fp8 decode kernel
                # envelope"). vLLM picks FLASHINFER_MLA_SPARSE first for an FP8 cache; every CUDA role names
                # the backend it would pick (components/core/attention_backend.py, components/core/vllm.py).
                dcp_flags=(
                    ("--dcp-comm-backend", "a2a"),
                    (
                        "--attention-config",
                        '{"use_prefill_query_quantization":true,"mla_prefill_backend":"TRTLLM_RAGGED"}',
                    ),
                ),
                # No VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE: 0.34.0 sizes the DCP workspace itself at the
                # effective max_num_batched_tokens (engine_memory.trtllm_sparse_mla_workspace_bytes); an
                # explicit smaller value is honoured and may overflow (flashinfer_mla_sparse.py:388-421).
                # The recipe also sets VLLM_USE_V2_MODEL_RUNNER=1 and VLLM_USE_RUST_FRONTEND=1; both dropped.
                # V2 runner: vLLM 0.34.0 removed V1, and its Platform.validate_environ calls the variable
                # redundant at 1 and raises at any other value (platforms/interface.py).
                # Rust frontend: `vllm serve` would hand the API to the wheel's vllm-rs binary
                # (vllm/v1/utils.py RustFrontendProcessManager), which exits 2 on --middleware ("not
                # implemented in Rust frontend yet"), and whose own key check guards only /v1, /v2 and
                # /inference (/tokenize, /detokenize, /cohere/v2/chat stay open). The Python frontend
                # loads the API guard (--middleware kimi_vllm_api_guard.RequireApiKey) outermost
                # (entrypoints/serve/middleware/register.py), so every route but /health and /metrics
                # needs the key (tests/test_vllm_contract.py runs both frontends' own code).
                env=MappingProxyType({"VLLM_ALLREDUCE_USE_FLASHINFER": "1"}),
            ),
            "rocm": VendorRecipe(
                load_format="auto",
                kv_cache_dtype="auto",
                flags=(
                    ("--mm-encoder-tp-mode", "data"),
                    ("--max-num-seqs", "128"),
                    ("--max-num-batched-tokens", "4096"),
                    (
                        "--compilation-config",
                        '{"cudagraph_mode":"FULL_DECODE_ONLY","custom_ops":["+fused_rms_norm_gated"]}',
                    ),
                ),
                env=MappingProxyType(
                    {
                        "VLLM_ROCM_USE_AITER": "1",
                        # The recipe's SAFETENSORS_FAST_GPU=1 is dropped: no code in vLLM 0.33.0 or
                        # the packages it installs reads it (tests/test_vllm_contract.py).
                        # vLLM >= 0.33.0 reads VLLM_ROCM_USE_AITER_MOE_SITUV2 (auto|a4w4|a8w4|a16w4;
                        # auto = a4w4) and derives AITER's switches from it (vllm/envs.py,
                        # vllm/_aiter_ops.py). The recipe's ..._SITUV2_A8W4 name (vllm#50582
                        # era) is read by no code in 0.33.0: a8w4 needs the new name.
                        "VLLM_ROCM_USE_AITER_MOE_SITUV2": "a8w4",
                        "AITER_BF16_FP8_MOE_BOUND": "0",
                        # Required on ROCm (recipe).
                        "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
                    }
                ),
            ),
        }
    ),
    api_price=ApiPrice(
        currency="RMB",
        input_cache_miss_per_mtok=13.0,
        input_cache_hit_per_mtok=1.3,
        output_per_mtok=68.0,
        source="Kimi open platform price list (RMB per 1M tokens)",
    ),
    license_summary=(
        "MIT plus two commercial conditions: offering the model as a service with more than "
        "USD 20M revenue over 12 months needs a separate agreement; a product with more than "
        "100M monthly active users or USD 20M monthly revenue must show 'Kimi K3.1-Pro' "
        "prominently. Internal use is exempt from both."
    ),
    engine_requirements=MappingProxyType(
        {
            family: EngineRequirement(
                min_version=KIMI_K3_1_MIN_VLLM_VERSION,
                features=(SPARSE_INDEXER_MLA,),
                source=(
                    "model card moonshotai/Kimi-K3.1-Pro (vLLM >= 0.34.0); its 24 Gated DSA layers need the "
                    f"sparse indexer MLA, {where}"
                ),
            )
            for family, where in (
                ("cuda", "which vLLM wires on NVIDIA from 0.34.0 (vllm/models/kimi_k3/nvidia/dsa.py)"),
                ("rocm", "which no vLLM release up to 0.34.0 wires on ROCm (vllm/models/kimi_k3/amd/)"),
            )
        }
    ),
    kv_claim=KIMI_K3_1_KV_CLAIM,
    attention=KIMI_K3_1_ATTENTION,
    # vLLM 0.34.0 renderers/kimi_k3.py: _K31_THINKING_EFFORTS for model_type kimi_k31 (K3 takes low,
    # high, max); the renderer maps reasoning_effort to the template's thinking_effort.
    reasoning_efforts=("low", "medium", "high", "max"),
    # The 24 Gated DSA layers attend to the top 2,048 tokens the indexer selects (model card).
    sparse_attention_tokens=2_048,
)

MODELS: Mapping[str, ModelProfile] = MappingProxyType({KIMI_K3_1_PRO.name: KIMI_K3_1_PRO})

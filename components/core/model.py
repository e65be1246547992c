"""Model profiles: what a checkpoint weighs, how vLLM must serve it, and what its API costs.

Facts for Kimi K3.1 Pro come from its model card, the vLLM recipe
(vllm-project/recipes, models/moonshotai/Kimi-K3.yaml) and the Kimi open platform price list,
and the model card (https://huggingface.co/moonshotai/Kimi-K3.1-Pro). Adding a model adds an entry to ``MODELS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


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
class FittedKvModel:
    """How the KV-cache figures of the plan are obtained: a model whose free constants were fitted
    to public figures, not a measurement. The plan shows it beside the KV figures.

    Attributes:
        label: one line for the plan, e.g. ``"estimate: fitted to 2 recipe figures"``.
        formula: the model, in words.
        figures: the public figures the constants were fitted to (one line each, with source).
        fitted: constant name -> fitted value (units in the name).
        independent_check: a third public figure the fit was tested against, or None when none
            is published (then the fit is exact on its own figures and unchecked elsewhere).
    """

    label: str
    formula: str
    figures: tuple[str, ...]
    fitted: Mapping[str, float]
    independent_check: str | None = None


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
        kv_bytes_per_token_fp8, kv_bytes_per_token_bf16: KV cache bytes one token occupies on
            each GPU at plain tensor parallelism (the MLA-style latent is replicated over TP ranks).
        runtime_reserved_bytes_per_gpu: memory vLLM keeps per GPU for everything that is
            neither weights nor KV (activations, CUDA graphs, linear-attention state, MoE buffers).
        dcp_kv_efficiency: the fraction of the ideal DCP-size-fold KV gain that DCP delivers.
        recipes: image family (``cuda``/``rocm``) -> vendor recipe.
        api_price: the vendor API price, for cost comparisons.
        license_summary: the commercial conditions users must acknowledge.
        engine_requirements: image family (``cuda``/``rocm``) -> what the engine must implement
            (``engine.check_engine`` enforces it).
        kv_fit: how ``runtime_reserved_bytes_per_gpu`` and ``dcp_kv_efficiency`` were obtained
            (None: measured or not fitted).
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
    kv_bytes_per_token_fp8: int
    kv_bytes_per_token_bf16: int
    runtime_reserved_bytes_per_gpu: int
    dcp_kv_efficiency: float
    recipes: Mapping[str, VendorRecipe]
    api_price: ApiPrice
    license_summary: str
    engine_requirements: Mapping[str, EngineRequirement] = field(default_factory=lambda: MappingProxyType({}))
    kv_fit: FittedKvModel | None = None
    reasoning_efforts: tuple[str, ...] = ()
    sparse_attention_tokens: int | None = None

    def kv_bytes_per_token(self, kv_cache_dtype: str) -> int:
        """KV bytes per token per GPU for ``kv_cache_dtype`` (``fp8*`` or ``auto``/``bfloat16``)."""
        return self.kv_bytes_per_token_fp8 if kv_cache_dtype.startswith("fp8") else self.kv_bytes_per_token_bf16


# Kimi K3.1 Pro: 93 layers = 69 Kimi Delta Attention (constant state per sequence, no KV
# growth) + 24 Gated DSA layers with an MLA-style latent KV. Per token and layer the latent
# is 512 values + 64 RoPE values; in vLLM's FP8 MLA layout that is 512 B + 16 B scales +
# 128 B BF16 RoPE = 656 B (BF16: 576 x 2 = 1,152 B). 24 layers -> 15,744 B (FP8) per token.
_KIMI_KV_LAYERS = 24
_KIMI_KV_FP8 = _KIMI_KV_LAYERS * 656
_KIMI_KV_BF16 = _KIMI_KV_LAYERS * 1_152

# FlashInfer's trtllm-gen MLA decode carves a softmax-stats slab out of vLLM's FlashInfer workspace
# when DCP needs the LSE; at DCP8 that alone took 1,611,661,312 B against the 413,138,944 B
# (394 MiB) default of VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE (vllm-project/vllm#50781, #50791).
# 2 GiB covers it with about a third to spare (estimate; the slab grows with heads x batch).
DCP_FLASHINFER_WORKSPACE_BYTES = 2 * 1024**3

# Calibration against the vLLM recipe: 8x B300 (275,040 MiB each) with FP8 KV and
# --gpu-memory-utilization 0.95 holds about 2.6M tokens at TP8 and about 18.5M with DCP8.
# 0.95 x 288.40 GB - 195.0 GB weights/GPU - 2.6M x 15,744 B = 38.0 GB per GPU left for the
# runtime, and 18.5M / (8 x 2.6M) = 0.89 of the ideal DCP8 gain.
_KIMI_RUNTIME_RESERVED = 38_000_000_000
_KIMI_DCP_EFFICIENCY = 0.89
_KIMI_KV_FIT = FittedKvModel(
    label="estimate: fitted to 2 recipe figures",
    formula=(
        "tokens at TP = (gpu_memory_utilization x GPU memory - weights/TP - runtime_reserved_bytes_per_gpu)"
        " / KV bytes per token; with DCP: x DCP size x dcp_kv_efficiency"
    ),
    figures=(
        "8x B300, FP8 KV, --gpu-memory-utilization 0.95: about 2.6M tokens at TP8 (vLLM recipe, Kimi-K3.yaml)",
        "the same with DCP8: about 18.5M tokens (vLLM recipe, Kimi-K3.yaml)",
    ),
    fitted=MappingProxyType(
        {"runtime_reserved_bytes_per_gpu": _KIMI_RUNTIME_RESERVED, "dcp_kv_efficiency": _KIMI_DCP_EFFICIENCY}
    ),
    independent_check=None,  # no third public figure (other GPU, dtype or DCP size) found
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
    min_vllm_version="0.34.0",
    kv_bytes_per_token_fp8=_KIMI_KV_FP8,
    kv_bytes_per_token_bf16=_KIMI_KV_BF16,
    runtime_reserved_bytes_per_gpu=_KIMI_RUNTIME_RESERVED,
    dcp_kv_efficiency=_KIMI_DCP_EFFICIENCY,
    recipes=MappingProxyType(
        {
            "cuda": VendorRecipe(
                load_format="fastsafetensors",
                kv_cache_dtype="fp8",
                flags=(
                    (
                        "--attention-config",
                        '{"use_prefill_query_quantization":true,"mla_prefill_backend":"flashinfer"}',
                    ),
                    ("--enable-prefix-caching", None),
                    ("--no-enable-flashinfer-autotune", None),
                ),
                # The recipe's decode_context_parallelism feature (vllm-project/recipes
                # models/moonshotai/Kimi-K3.yaml, #814): all-to-all DCP exchange, the
                # TOKENSPEED_MLA decode backend and TRTLLM_RAGGED MLA prefill under FP8 KV.
                dcp_flags=(
                    ("--dcp-comm-backend", "a2a"),
                    ("--attention-backend", "TOKENSPEED_MLA"),
                    (
                        "--attention-config",
                        '{"use_prefill_query_quantization":true,"mla_prefill_backend":"TRTLLM_RAGGED"}',
                    ),
                ),
                dcp_env=MappingProxyType({"VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE": str(DCP_FLASHINFER_WORKSPACE_BYTES)}),
                env=MappingProxyType(
                    {
                        "VLLM_ALLREDUCE_USE_FLASHINFER": "1",
                        "VLLM_USE_V2_MODEL_RUNNER": "1",
                        "VLLM_USE_RUST_FRONTEND": "1",
                    }
                ),
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
                min_version="0.34.0",
                features=(SPARSE_INDEXER_MLA,),
                source=(
                    "model card moonshotai/Kimi-K3.1-Pro (vLLM >= 0.34.0); vLLM 0.33.0 builds the "
                    f"Kimi-K3 MLA without the sparse indexer ({where})"
                ),
            )
            for family, where in (
                ("cuda", "vllm/models/kimi_k3/nvidia/mla.py: use_sparse=False, indexer=None"),
                ("rocm", "vllm/models/kimi_k3/amd/linear.py: indexer=None, is_sparse=False"),
            )
        }
    ),
    kv_fit=_KIMI_KV_FIT,
    # vLLM 0.34.0 renderers/kimi_k3.py: _K31_THINKING_EFFORTS for model_type kimi_k31 (K3 takes low,
    # high, max); the renderer maps reasoning_effort to the template's thinking_effort.
    reasoning_efforts=("low", "medium", "high", "max"),
    # The 24 Gated DSA layers attend to the top 2,048 tokens the indexer selects (model card).
    sparse_attention_tokens=2_048,
)

MODELS: Mapping[str, ModelProfile] = MappingProxyType({KIMI_K3_1_PRO.name: KIMI_K3_1_PRO})

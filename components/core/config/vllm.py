"""``vllm``: parallelism and memory against the target and the recipe, flags the toolkit owns,
the image reference, and whether the engine build can serve the model."""

from __future__ import annotations

import json

from ..attention_backend import accepted_block_sizes, role_attention_backend, sm10_sparse_priorities
from ..engine_memory import FLASHINFER_WORKSPACE_ENV, engine_computed_env
from ..errors import ConfigError
from ..kv_layout import (
    FLASHINFER_MLA_SPARSE,
    INDEXER_KV_DTYPE_KEY,
    SPARSE_BACKEND_KV_DTYPES,
    model_layout,
    mxfp4_indexer_supported,
    recipe_argv,
)
from ..model import ModelProfile
from ..scheduler_limits import check_scheduler_limits, scheduler_limits, sized_values
from ..targets import TargetProfile
from ..versions import VLLM_MASTER_PORT
from ..vllm_options import MAX_EXTRA_ARGS, OWNED_DESTS, check_parser_args, inert_option_warnings, owned_option
from .patterns import IMAGE_RE, IMAGE_TAG_RE
from .raw import RawConfig

# Linux's default net.ipv4.ip_local_port_range (kernel Documentation/networking/ip-sysctl.rst, 2026-12).
EPHEMERAL_PORTS = (32_768, 60_999)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def check_vllm(raw: RawConfig, target: TargetProfile, model: ModelProfile, warnings: list[str]) -> None:
    """``vllm.decodeContextParallelSize`` (divides TP; what DCP costs, a warning),
    ``maxModelLen``, ``kvCacheDtype`` (ROCm; a dtype no sparse MLA backend stores),
    ``indexerCacheDtype`` (mxfp4 on SM10x only), ``extraArgs``, ``imageTag`` and ``image``.

    Raises:
        ConfigError: the first invalid value, one line.
    """
    tp = target.gpus_per_copy
    dcp = raw.vllm.decode_context_parallel_size
    if tp % dcp != 0:
        divisors = [str(d) for d in range(1, tp + 1) if tp % d == 0]
        raise ConfigError(
            "vllm.decodeContextParallelSize", dcp, f"must divide the tensor-parallel size {tp} (allowed: {', '.join(divisors)})"
        )
    if dcp > 1 and target.image_family == "cuda" and model.attention is not None:
        recipe = model.recipes[target.image_family]
        argv = recipe_argv(recipe, dcp) + tuple(raw.vllm.extra_args)
        layout = model_layout(model, raw.vllm.kv_cache_dtype or recipe.kv_cache_dtype, target.gpu, argv=argv)
        gain = layout.bytes_per_token_per_gpu / layout.bytes_per_token_per_gpu_at(dcp)
        workspace = engine_computed_env(
            argv=argv, gpu=target.gpu, max_model_len=raw.vllm.max_model_len or model.max_context_tokens,
            tensor_parallel_size=tp, decode_context_parallel_size=dcp, num_attention_heads=model.attention.num_heads,
            flashinfer_sparse_backend=layout.attention_backend == FLASHINFER_MLA_SPARSE,
        ).get(FLASHINFER_WORKSPACE_ENV)
        warnings.append(
            f"DCP {dcp}: {gain:g}x the KV tokens per byte of cache of plain TP (both DSA caches shard over DCP ranks; "
            "long sessions, bigger prefix cache) for decode steps about 7-25% slower"
            + (f", a {workspace / 1024**3:.1f} GiB FlashInfer workspace per GPU that vLLM sizes itself (default 394 MiB; "
               "vllm#50781)" if workspace else "")
            + " and the DCP backends (--dcp-comm-backend a2a, FLASHINFER_MLA_SPARSE decode for the DSA layers, "
            "TRTLLM_RAGGED prefill)"
        )
    if raw.vllm.max_model_len is not None and raw.vllm.max_model_len > model.max_context_tokens:
        raise ConfigError(
            "vllm.maxModelLen", raw.vllm.max_model_len, f"exceeds the model's context of {model.max_context_tokens:,} tokens"
        )
    if target.image_family == "rocm" and raw.vllm.kv_cache_dtype not in (None, "auto", "bfloat16"):
        # The ROCm recipe serves the KV cache in the model dtype; FP8 MLA KV is a CUDA path.
        raise ConfigError(
            "vllm.kvCacheDtype", raw.vllm.kv_cache_dtype, "is not part of the MI355X recipe (allowed: auto, bfloat16)"
        )
    sparse_dtypes = sorted({d for dtypes in SPARSE_BACKEND_KV_DTYPES.values() for d in dtypes})
    if (target.image_family == "cuda" and model.cache_geometry.dsa_layers and raw.vllm.kv_cache_dtype
            and raw.vllm.kv_cache_dtype.startswith("fp8") and raw.vllm.kv_cache_dtype not in sparse_dtypes):
        # DSA layers need a sparse MLA backend; each lists the quantized dtypes it stores.
        backends = "; ".join(f"{b}: {', '.join(d)}" for b, d in SPARSE_BACKEND_KV_DTYPES.items())
        raise ConfigError(
            "vllm.kvCacheDtype", raw.vllm.kv_cache_dtype,
            f"is stored by no sparse MLA backend of vLLM for the DSA layers ({backends}) (allowed: auto, bfloat16, "
            f"{', '.join(sparse_dtypes)})",
        )
    if raw.vllm.indexer_cache_dtype == "mxfp4" and not mxfp4_indexer_supported(target.gpu):
        raise ConfigError(
            "vllm.indexerCacheDtype", "mxfp4",
            f"needs an NVIDIA SM10x GPU (vLLM writes this model's MXFP4 indexer keys only there); target {target.name} "
            f"has {target.gpu.name} (allowed: fp8)",
        )
    extra = raw.vllm.extra_args
    for i, arg in enumerate(extra):
        if INDEXER_KV_DTYPE_KEY in arg:
            raise ConfigError(
                "vllm.extraArgs", arg,
                f"sets {INDEXER_KV_DTYPE_KEY}: use vllm.indexerCacheDtype (the plan's KV figure follows it)",
            )
        # vllm.indexerCacheDtype is merged into every --attention-config JSON object of the command.
        flag, eq, inline = arg.partition("=")
        value = inline if eq else (extra[i + 1] if i + 1 < len(extra) else "")
        if flag == "--attention-config" and raw.vllm.indexer_cache_dtype != "fp8" and not _is_json_object(value):
            raise ConfigError(
                "vllm.extraArgs", value, "is not a JSON object: --attention-config must be one for vllm.indexerCacheDtype "
                "to be merged into it"
            )
    parsed = check_extra_args(raw.vllm.extra_args)
    warnings.extend(inert_option_warnings(parsed))
    check_ports(raw.vllm.port, target, parsed, warnings)
    check_sized_extra_args(raw, target, model, warnings)
    if raw.vllm.image_tag is not None and not IMAGE_TAG_RE.match(raw.vllm.image_tag):
        raise ConfigError(
            "vllm.imageTag", raw.vllm.image_tag, "is not a valid image tag (letters, digits, '_', '.', '-'; at most 128)"
        )
    if raw.vllm.image is not None and not IMAGE_RE.match(raw.vllm.image):
        raise ConfigError(
            "vllm.image", raw.vllm.image, "is not a valid image reference (registry/name:tag or name@sha256:digest)"
        )
    if raw.vllm.image and raw.vllm.image_tag:
        raise ConfigError("vllm.image", raw.vllm.image, "and vllm.imageTag are both set (set one)")


def check_extra_args(extra_args: tuple[str, ...] | list[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``vllm.extraArgs``: no item that vLLM's parser reads as an option the toolkit owns, in any
    spelling (``vllm_options.owned_option``: ``-tp 4``, ``--tensor_parallel_size=4``,
    ``--tensor-parallel 4``, ``-n2``), and no item holding a flag and its value in one string
    (vLLM's parser takes ``'--max-num-seqs 64'`` as one unknown argument and the server does not
    start); then the whole list as the pinned parser reads it (``vllm_options.check_parser_args``:
    unknown options, positional arguments, values, choices, the config classes' bounds, and the
    options this product refuses, ``REFUSED_VALUES``).

    Returns:
        what ``check_parser_args`` read: dest -> (option, values).

    Raises:
        ConfigError: the first such item, naming the owned option and where its value comes from.
    """
    if len(extra_args) > MAX_EXTRA_ARGS:
        raise ConfigError("vllm.extraArgs", f"{len(extra_args):,} items",
                          f"is more than {MAX_EXTRA_ARGS}, the most this toolkit takes (a generated or pasted list?)")
    for arg in extra_args:
        owned = owned_option(arg)
        if owned is not None:
            how = {"exact": "", "attached": " with its value attached",
                   "abbreviation": " abbreviated (vLLM's parser takes unique prefixes)"}[owned.how]
            raise ConfigError(
                "vllm.extraArgs", arg,
                f"sets {owned.option}{how}, vLLM's {owned.dest}, which the toolkit owns: {OWNED_DESTS[owned.dest].instead}",
            )
        if arg.startswith("--") and " " in arg.split("=", 1)[0]:
            raise ConfigError(
                "vllm.extraArgs", arg,
                "holds a flag and its value in one item: give each its own list item ('--flag', 'value') or write --flag=value",
            )
    return check_parser_args(extra_args)


def check_ports(port: int, target: TargetProfile, parsed: dict[str, tuple[str, tuple[str, ...]]],
                warnings: list[str]) -> None:
    """The TCP ports the engine's pod (or container) listens on, against each other: ``vllm.port``
    (the OpenAI API, the API guard and ``/metrics`` share it: the guard is middleware of the same
    server), the multi-node rendezvous of a target with more than one node per copy (the toolkit's
    ``--master-port``, torch.distributed's store on the leader: vLLM 0.34.0
    ``vllm/distributed/parallel_state.py`` l.1882-1883), and every port option of
    ``vllm.extraArgs`` (``parsed``: ``--grpc-port``, ``--data-parallel-rpc-port`` ...). A
    ``vllm.port`` in Linux's default ephemeral range (``net.ipv4.ip_local_port_range`` 32768-60999,
    kernel ip-sysctl docs), where NCCL's bootstrap, torch and vLLM's own ZMQ sockets take ports the
    kernel picks, is warned: the API may find its port taken at start.

    Raises:
        ConfigError: two of them on one port, one line naming both.
    """
    # (config key that sets it or None, the value as given, what listens there, port)
    ports: list[tuple[str | None, object, str, int]] = [
        ("vllm.port", port, "the OpenAI API (with the API guard and /metrics)", port)]
    if target.nodes_per_copy > 1:
        ports.append((None, None, f"target {target.name}'s multi-node rendezvous (the toolkit's --master-port "
                                  f"{VLLM_MASTER_PORT}; vLLM 0.34.0 distributed/parallel_state.py l.1882)", VLLM_MASTER_PORT))
    for dest, (option, values) in parsed.items():
        if dest.endswith("_port") and values and values[-1].strip().isdigit():
            ports.append(("vllm.extraArgs", f"{option} {values[-1]}", option, int(values[-1].strip())))
    for i, later in enumerate(ports):
        for earlier in ports[:i]:
            if later[3] == earlier[3]:
                key, value, _, _ = later if later[0] == "vllm.extraArgs" or earlier[0] is None else earlier
                raise ConfigError(
                    key or "vllm.port", value,
                    f"puts {earlier[2]} and {later[2]} on one port, {later[3]}: they cannot both listen on it; choose another",
                )
    if EPHEMERAL_PORTS[0] <= port <= EPHEMERAL_PORTS[1]:
        warnings.append(
            f"vllm.port {port} is in Linux's default ephemeral range {EPHEMERAL_PORTS[0]}-{EPHEMERAL_PORTS[1]}, where NCCL, "
            "torch.distributed and vLLM's ZMQ sockets take ports the kernel picks: the API can find its port taken at start"
        )


def check_sized_extra_args(raw: RawConfig, target: TargetProfile, model: ModelProfile, warnings: list[str]) -> None:
    """``vllm.extraArgs`` that change what the plan sizes, against the rules of the pinned engine:
    a ``--block-size`` that no sparse MLA backend accepts on the target (CUDA; vLLM then finds no
    backend and does not start: ``attention_backend.py``), and ``--max-num-batched-tokens``,
    ``--max-num-seqs``, ``--performance-mode`` and chunked prefill as vLLM 0.34.0 resolves and checks
    them (``scheduler_limits.py``: its ``SchedulerConfig`` refuses ``--max-num-seqs 0`` and fewer
    batched tokens than sequences when both are set). Accepted values re-size the plan
    (``sizing.effective_scheduler_limits``); a ``--max-num-batched-tokens`` that lowers vLLM's sequence
    default (``--max-num-seqs`` unset) is warned in ``warnings``, with both figures.
    Options the plan cannot size (a draft model, KV connectors) are owned (``vllm_options.py``).

    Raises:
        ConfigError: the first such value, one line naming it and what is allowed.
    """
    recipe = model.recipes.get(target.image_family)
    if recipe is None:
        return
    extra = tuple(raw.vllm.extra_args)
    dcp = raw.vllm.decode_context_parallel_size
    kv_dtype = raw.vllm.kv_cache_dtype or recipe.kv_cache_dtype
    block = sized_values(extra).get("block_size")
    attention = model.attention
    cc = target.gpu.compute_capability
    if block is not None and attention is not None and target.image_family == "cuda" and cc is not None and cc[0] == 10:
        if role_attention_backend(model, target, kv_dtype, dcp, extra) is None:
            heads = attention.num_heads // target.gpus_per_copy
            allowed = "; ".join(f"{b}: {accepted_block_sizes(b)}" for b in sm10_sparse_priorities(kv_dtype, heads))
            raise ConfigError(
                "vllm.extraArgs", f"{block[0]} {block[1]}".strip() if "=" not in block[0] else block[0],
                f"is a block size no sparse MLA backend of vLLM 0.34.0 accepts for the DSA layers on {target.gpu.name} "
                f"with KV {kv_dtype}; the engine would not start (allowed: {allowed})",
            )
    max_len = raw.vllm.max_model_len or model.max_context_tokens
    limits = scheduler_limits(recipe_argv(recipe, dcp) + extra, gpu_memory_bytes=target.gpu.memory_bytes,
                              gpu_name=target.gpu.name, max_model_len=max_len)
    check_scheduler_limits(limits, max_len)
    if limits.seqs_lowered_by_tokens:
        tokens = sized_values(extra)["max_num_batched_tokens"]
        warnings.append(
            f"vllm.extraArgs {tokens[0]}{'' if '=' in tokens[0] else ' ' + tokens[1]} also lowers vLLM's --max-num-seqs "
            f"default from {limits.default_max_num_seqs:,} to {limits.max_num_seqs:,} (vLLM 0.34.0 "
            f"vllm/engine/arg_utils.py l.3269-3271): at most {limits.max_num_seqs:,} requests are served at once; set "
            "--max-num-seqs too to choose (it may not exceed the batched tokens)"
        )

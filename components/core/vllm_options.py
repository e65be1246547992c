"""The `vllm serve` options the toolkit owns, by argparse destination, and how vLLM's own parser
reads a spelling of them (pure data and one function; no vLLM import: the core never imports it).

``vllm.extraArgs`` is appended after the toolkit's flags, and argparse keeps the last value: an
extra argument that vLLM's parser maps to a destination the toolkit sets would silently replace
what the plan, the sizing and preflight show (``-tp 4`` is TP 4 while the plan sizes TP 8). So
the check is by **destination**, not by flag text: every option string vLLM's parser maps to an
owned destination is listed in ``OWNED_DESTS``, and ``owned_option`` reads an argument the way
vLLM's parser does (``FlexibleArgumentParser.parse_args``: ``_`` as ``-`` in a ``--`` name,
``--name=value``, dotted ``--name.key value``; then argparse: exact option strings, a two-character
short option with its value attached (``-n2``), and unique prefixes, since the serve parser keeps
argparse's ``allow_abbrev=True``).

Source of the table: vLLM 0.34.0 (the wheel built 2026-11-16, commit 62d4bc3c7), the ``serve``
sub-parser as ``vllm/entrypoints/cli/main.py`` builds it, its ``_option_string_actions`` (which
also holds the hidden ``--no-enable-*`` spellings of ``EnableDisableAction``,
``vllm/utils/argparse_utils.py``). ``tests/test_vllm_contract.py`` derives the same mapping from
the installed parser (``scripts/ops/vllm_argv_check.py``, request ``options``) and fails when
vLLM maps an option string to an owned destination that is missing here (the next alias), and
when ``owned_option`` and the real parser disagree about any spelling of any option.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# The table is read from the pinned release (components/core/versions.py VLLM_VERSION):
# tests/test_vllm_contract.py compares it with that release's installed parser.
# vLLM's serve parser accepts unique prefixes of long options (argparse's default allow_abbrev).
VLLM_ALLOWS_ABBREVIATIONS = True


@dataclass(frozen=True)
class OwnedDest:
    """One argparse destination of `vllm serve` the toolkit sets (or whose value the plan sizes).

    Attributes:
        options: every option string vLLM's parser maps to it (vLLM 0.34.0).
        instead: where the value comes from instead (a config key, a secret, the target): the
            second half of the config error.
    """

    options: tuple[str, ...]
    instead: str


_LAYOUT = "the parallel layout is the target's (TP = GPUs per copy); more copies: compute.replicas"
_MULTI_NODE = "the toolkit sets the multi-node rendezvous of targets with more than one node per copy"
_MODEL = "the model profile's serving contract (model.profile), which validate checks"

OWNED_DESTS: Mapping[str, OwnedDest] = MappingProxyType({
    "model": OwnedDest(("--model",), "the toolkit serves the synced weights' path"),
    "served_model_name": OwnedDest(("--served-model-name",), "use model.servedModelName"),
    "api_key": OwnedDest(("--api-key",), "the key is the stack secret kimi-deploy:apiKey (never in argv)"),
    "hf_token": OwnedDest(("--hf-token",), "the server reads local weights offline; the sync uses kimi-deploy:hfToken"),
    "host": OwnedDest(("--host",), "the server listens on all addresses; who reaches it is network.* / kubernetes.*"),
    "port": OwnedDest(("--port",), "use vllm.port"),
    "tensor_parallel_size": OwnedDest(("--tensor-parallel-size", "-tp"), _LAYOUT),
    "pipeline_parallel_size": OwnedDest(("--pipeline-parallel-size", "-pp"), _LAYOUT),
    "prefill_context_parallel_size": OwnedDest(("--prefill-context-parallel-size", "-pcp"), _LAYOUT),
    "data_parallel_size": OwnedDest(("--data-parallel-size", "-dp"), _LAYOUT),
    "decode_context_parallel_size": OwnedDest(
        ("--decode-context-parallel-size", "-dcp"), "use vllm.decodeContextParallelSize"
    ),
    "max_model_len": OwnedDest(("--max-model-len",), "use vllm.maxModelLen"),
    "gpu_memory_utilization": OwnedDest(
        ("--gpu-memory-utilization", "--device-memory-utilization"), "use vllm.gpuMemoryUtilization"
    ),
    "kv_cache_dtype": OwnedDest(("--kv-cache-dtype",), "use vllm.kvCacheDtype"),
    "enable_prefix_caching": OwnedDest(
        ("--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-prefix-caching"),
        "use vllm.enablePrefixCaching",
    ),
    "nnodes": OwnedDest(("--nnodes", "-n"), _MULTI_NODE),
    "node_rank": OwnedDest(("--node-rank", "-r"), _MULTI_NODE),
    "master_addr": OwnedDest(("--master-addr",), _MULTI_NODE),
    "master_port": OwnedDest(("--master-port",), _MULTI_NODE),
    "headless": OwnedDest(("--headless",), _MULTI_NODE),
    "trust_remote_code": OwnedDest(("--trust-remote-code", "--no-trust-remote-code"), _MODEL),
    "enable_auto_tool_choice": OwnedDest(
        ("--enable-auto-tool-choice", "--no-enable-auto-tool-choice", "--disable-auto-tool-choice"), _MODEL
    ),
    "tool_call_parser": OwnedDest(("--tool-call-parser",), _MODEL),
    "reasoning_parser": OwnedDest(("--reasoning-parser",), _MODEL),
    # What the plan sizes and the probes reach: the loader the weight-load time models, the TCP listener,
    # the checkpoint's own number formats, the attention backend the KV layout is computed for
    # (components/core/kv_layout.py), DCP's all-to-all backend. (--middleware is appended to: the API guard stays.)
    "load_format": OwnedDest(("--load-format",), "the plan models the recipe's loader (fastsafetensors) over the "
                                                  "synced weights; another loader serves or times something else"),
    "uds": OwnedDest(("--uds",), "the server listens on TCP vllm.port, which the probes, the Service and validate reach"),
    "quantization": OwnedDest(("--quantization", "-q"), "the checkpoint's own quantization (MXFP4), read from its config"),
    "dtype": OwnedDest(("--dtype",), "the checkpoint's own dtype, read from its config"),
    "attention_config": OwnedDest(("--attention-config", "-ac"),
                                  "the attention backend the KV cache is sized for (vllm.indexerCacheDtype, "
                                  "vllm.decodeContextParallelSize)"),
    "attention_backend": OwnedDest(("--attention-backend",), "the attention backend the KV cache is sized for "
                                                             "(vllm.decodeContextParallelSize picks the DCP one)"),
    "data_parallel_size_local": OwnedDest(("--data-parallel-size-local", "-dpl"), _LAYOUT),
    "dcp_comm_backend": OwnedDest(("--dcp-comm-backend",), "use vllm.decodeContextParallelSize: the toolkit sets the "
                                                           "backend decode context parallel needs"),
    # What the plan cannot size: a draft model (its weights, KV cache and the verifier's backend choice,
    # v1/attention/selector.py use_adaptive_verification), KV connectors and offloading (the backend
    # choice: use_kv_connector; host memory and transfer buffers), a fixed KV cache size.
    "speculative_config": OwnedDest(("--speculative-config", "-sc"),
                                    "the plan sizes no draft model (its weights, its KV cache, the verifier's attention "
                                    "backend); speculative decoding is not supported by this toolkit"),
    "kv_transfer_config": OwnedDest(("--kv-transfer-config",),
                                    "the plan sizes no KV connector (it changes vLLM's attention backend choice and "
                                    "the KV memory); KV transfer is not supported by this toolkit"),
    "kv_offloading_backend": OwnedDest(("--kv-offloading-backend",),
                                       "the plan sizes no KV offloading (a KV connector and host memory)"),
    "kv_offloading_size": OwnedDest(("--kv-offloading-size",),
                                    "the plan sizes no KV offloading (a KV connector and host memory)"),
    "kv_cache_memory_bytes": OwnedDest(("--kv-cache-memory-bytes",),
                                       "the plan sizes the KV cache from GPU memory; for GPUs shared with other "
                                       "processes use vllm.gpuMemoryUtilization"),
    # A YAML file of flags read when the server starts: its settings cannot be checked here.
    "config": OwnedDest(("--config",), "write the flags themselves in vllm.extraArgs, where they are checked"),
})

# Option strings of destinations the toolkit does not own that are a prefix of an owned option
# string: an exact option wins over abbreviation, so these are not refused (vLLM 0.34.0:
# ``-dc`` is --diffusion-config, a prefix of ``-dcp``).
UNOWNED_PREFIX_OPTIONS: frozenset[str] = frozenset({"-dc"})

OWNED_OPTIONS: Mapping[str, str] = MappingProxyType(
    {option: dest for dest, owned in OWNED_DESTS.items() for option in owned.options}
)


@dataclass(frozen=True)
class OwnedOption:
    """How vLLM's parser reads an argument that sets an owned destination.

    Attributes:
        dest: the argparse destination (a key of ``OWNED_DESTS``).
        option: the owned option string it resolves to (``-tp`` for ``-tp=4``; the first in
            sorted order when an abbreviation fits more than one).
        how: ``exact``, ``attached`` (``-n2``: a short option with its value) or
            ``abbreviation`` (a prefix of an owned option string).
    """

    dest: str
    option: str
    how: str


def option_name(arg: str) -> str:
    """The option string vLLM's ``FlexibleArgumentParser.parse_args`` hands argparse for ``arg``:
    the part before ``=``, cut at the first ``.`` (dotted JSON arguments, ``--name.key``), with
    ``_`` read as ``-`` in a ``--`` name; ``arg`` itself when it is not an option."""
    name = arg.split("=", 1)[0].split(".", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


def owned_option(arg: str) -> OwnedOption | None:
    """The owned destination vLLM's parser would set from the argument ``arg`` (one item of
    ``vllm.extraArgs``), or None: not an option, or an option the toolkit does not own.

    Follows argparse (CPython 3.11/3.12 ``_parse_optional`` / ``_get_option_tuples``): an exact
    option string; else, for a single ``-``, a two-character option with its value attached;
    else a prefix of an owned option string (``VLLM_ALLOWS_ABBREVIATIONS``), unless the name is an
    exact option of another destination (``UNOWNED_PREFIX_OPTIONS``). A prefix that fits owned and
    other options alike is ambiguous to vLLM (an error at start): it is refused too.
    """
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name = option_name(arg)
    if name in OWNED_OPTIONS:
        return OwnedOption(OWNED_OPTIONS[name], name, "exact")
    if name in UNOWNED_PREFIX_OPTIONS or len(name) < 2:
        return None
    if not name.startswith("--") and len(name) > 2 and name[:2] in OWNED_OPTIONS:
        return OwnedOption(OWNED_OPTIONS[name[:2]], name[:2], "attached")
    if VLLM_ALLOWS_ABBREVIATIONS:
        fits = sorted(option for option in OWNED_OPTIONS if option.startswith(name))
        if fits:
            return OwnedOption(OWNED_OPTIONS[fits[0]], fits[0], "abbreviation")
    return None

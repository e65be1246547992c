"""The `vllm serve` options of the pinned vLLM: the ones the toolkit owns, by argparse destination,
how vLLM's own parser reads a spelling of them, every option of that parser as a recorded table
(``data/vllm_serve_options.json``) with ``vllm.extraArgs`` read against it, and the options this
product refuses with their reasons (no vLLM import: the core never imports it).

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

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from .errors import ConfigError, did_you_mean

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
    # (components/core/kv_layout.py), DCP's all-to-all backend. (--middleware is refused with its reason: REFUSED_VALUES.)
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


# --- Every option of the pinned parser, recorded, and extraArgs read against it -----------------
#
# The recorded table (data/vllm_serve_options.json) is generated from the pinned wheel by
# scripts/dev/vllm_option_table.py; tests/test_vllm_contract.py regenerates it from the installed
# parser and fails when the two differ. The plan reads it offline, without vLLM.
OPTION_TABLE_FILE = Path(__file__).with_name("data") / "vllm_serve_options.json"
PARSER_SOURCE = "vLLM 0.34.0's `vllm serve` parser"


@dataclass(frozen=True)
class ParserAction:
    """One argparse action of the pinned `vllm serve` parser, as recorded.

    Attributes:
        dest: the argparse destination.
        options: every option string that sets it.
        action: argparse's class name (``_StoreAction``, ``EnableDisableAction``, ...).
        nargs: argparse's nargs (None: exactly one value; 0: a flag; ``?``, ``+``, ``*``).
        type: the value parser's name (``int``, ``optional:int``, ``human_readable_int``, ``loads``, ...).
        choices: the values allowed, or None.
        bounds: ``ge``/``gt``/``le``/``lt`` the config class puts on the field.
        group: the argparse group, named after the config class (``SchedulerConfig``) or ``Frontend``.
        keys: the fields a JSON-object option's config dataclass takes (vLLM refuses other keys), or None.
    """

    dest: str
    options: tuple[str, ...]
    action: str
    nargs: int | str | None
    type: str | None
    choices: tuple[str, ...] | None
    bounds: Mapping[str, float]
    group: str
    keys: frozenset[str] | None


@dataclass(frozen=True)
class OptionTable:
    """The recorded parser: its version, ``allow_abbrev`` and option string -> action."""

    vllm_version: str
    allow_abbrev: bool
    by_option: Mapping[str, ParserAction]


@functools.cache
def option_table() -> OptionTable:
    """The recorded table of the pinned parser (read once).

    Raises:
        OSError, ValueError: the file is missing or not the recorded shape (a broken checkout).
    """
    data = json.loads(OPTION_TABLE_FILE.read_text())
    by_option: dict[str, ParserAction] = {}
    for row in data["actions"]:
        action = ParserAction(
            dest=row["dest"], options=tuple(row["options"]), action=row["action"], nargs=row["nargs"],
            type=row["type"], choices=None if row["choices"] is None else tuple(str(c) for c in row["choices"]),
            bounds=MappingProxyType(dict(row["bounds"])), group=row["group"],
            keys=None if row.get("keys") is None else frozenset(row["keys"]),
        )
        for option in action.options:
            by_option[option] = action
    return OptionTable(data["vllm_version"], bool(data["allow_abbrev"]), MappingProxyType(by_option))


# Values of extraArgs that the parser and the config classes take but this product must not run
# with, by destination (``Refusal``: the values refused, or any value but the allowed ones; why, with
# the place in vLLM 0.34.0's source that does it). No override: each either leaks what the guard
# protects, breaks what the plan measured, or runs what nobody verified. Three rules cover kinds of
# options, each one line of the wheel's source per option: foreign code (``_FOREIGN_CODE``), files or
# repos the node does not have (``_NOT_ON_NODE``) and outbound connections (``_OUTBOUND``).


@dataclass(frozen=True)
class Refusal:
    """An option of ``vllm.extraArgs`` this product refuses.

    Attributes:
        values: the values refused (lower case; ``"true"`` for a flag), or None for every value
            but ``allowed``.
        why: what the option makes vLLM 0.34.0 do, with the place in its source, and why that is refused.
        allowed: with ``values`` None, the values still taken (vLLM's default, which changes nothing).
        json_keys: for a JSON-object option, only these fields are refused (given in the object or
            dotted, ``--name.key value``); its other fields are taken.
    """

    values: frozenset[str] | None
    why: str
    allowed: frozenset[str] = frozenset()
    json_keys: frozenset[str] = frozenset()

    def refuses(self, given: set[str]) -> bool:
        """Whether the values ``given`` (lower case) include one refused."""
        if self.values is None:
            return bool(given - self.allowed)
        return bool(given & self.values)

    def refuses_fields(self, arg: str, values: Sequence[str]) -> bool:
        """Whether a JSON-object option given as ``arg`` with ``values`` sets a field of ``json_keys``."""
        name = arg.split("=", 1)[0]
        if "." in name:
            return name.split(".", 2)[1] in self.json_keys
        for value in values:
            try:
                parsed = json.loads(_JSON_HUMAN_NUMBER.sub("0", value))
            except ValueError:
                continue
            if isinstance(parsed, dict) and self.json_keys & set(parsed):
                return True
        return False


_HTTP_OWNED = ("the API guard (--middleware, kimi_vllm_api_guard) and TLS are the toolkit's: TLS ends at the "
               "load balancer or the ingress, and the probes, the Service and validate speak plain HTTP to vllm.port")
_FOREIGN_CODE = ("Python code from outside the pinned image then runs inside the server, beside the API key and the "
                 "GPUs, and nothing verified it; code comes in by building the image (vllm.image), not by a flag")
_NOT_ON_NODE = ("the node has only the synced, verified weights of model.repo and runs with HF_HUB_OFFLINE=1: "
                "another path or repo fails the start on GPU time, or serves files nobody verified")
_OUTBOUND = ("the server then sends to a host of the option's choosing, past the network policy, data of the "
             "requests; the toolkit's metrics are scraped from vllm.port")
_SPECULATIVE = ("builds --speculative-config from it (vllm/engine/arg_utils.py l.2141-2154): the plan sizes no draft "
                "model or speculative method; speculative decoding is not supported by this toolkit")


def _code(where: str) -> Refusal:
    return Refusal(None, f"{where}: {_FOREIGN_CODE}")


def _file(where: str) -> Refusal:
    return Refusal(None, f"{where}: {_NOT_ON_NODE}")


REFUSED_VALUES: Mapping[str, Refusal] = MappingProxyType({
    "enable_log_requests": Refusal(frozenset({"true"}), (
        "logs every request's parameters, and at VLLM_LOGGING_LEVEL=DEBUG its prompt and token ids "
        "(vllm/entrypoints/launchers/api_server/app_state.py l.54 RequestLogger; entrypoints/serve/utils/request_logger.py "
        "l.57-63): users' prompts in the pod log")),
    "uvicorn_log_level": Refusal(frozenset({"trace"}), (
        "wraps the app in uvicorn's MessageLoggerMiddleware, which logs every request's ASGI scope, its headers and so "
        "the Authorization bearer key included (vllm/entrypoints/launchers/api_server/entry.py l.148 log_level; "
        "uvicorn/config.py l.541; allowed: critical, error, warning, info, debug)")),
    "hf_overrides": Refusal(None, (
        "rewrites the model's Hugging Face config before loading (vllm/config/model.py l.631-644): layers, heads or "
        "context the plan's memory, KV and load-time sizing did not measure")),
    "cpu_offload_gb": Refusal(None, (
        "moves that many GB of weights per GPU into host memory over UVA (vllm/config/offload.py l.23, 86-116): the "
        "plan sizes the weights resident on the GPUs, and host memory and decode speed it does not model")),
    "tool_server": Refusal(None, (
        "starts an MCP client to the servers it names, or a demo tool server, from the API server "
        "(vllm/entrypoints/mcp/tool_server.py l.234-244): outbound connections and tools the network policy "
        "and the model profile do not provide")),
    "ssl_keyfile": Refusal(None, "serves TLS from a key path inside the container "
                                 "(vllm/entrypoints/launchers/api_server/entry.py l.153): " + _HTTP_OWNED),
    "ssl_certfile": Refusal(None, "serves TLS from a certificate path inside the container (entry.py l.153-154): "
                                  + _HTTP_OWNED),
    "ssl_ca_certs": Refusal(None, "asks clients for TLS certificates (entry.py l.153-156): " + _HTTP_OWNED),
    "allowed_local_media_path": Refusal(None, (
        "lets API requests read images and videos from that directory of the server's file system by file:// URL "
        "(vllm/config/model.py l.245-248, 'This is a security risk'; multimodal/media/connector.py l.190-201): "
        "any client with the key reads the container's files")),
    "tokenizer": Refusal(None, (
        "loads the tokenizer from another repo or path than the synced weights (vllm/config/model.py l.622-626): "
        "the weight sync fetches and verifies only model.repo at its commit, and the pod runs with the hub "
        "offline, so the engine fails at start or tokenizes with files nobody verified")),
    "middleware": Refusal(None, (
        "adds ASGI middleware by import path after the toolkit's API guard, and Starlette runs the last added first "
        "(vllm/entrypoints/serve/middleware/register.py l.65-71; starlette/applications.py add_middleware inserts at 0): "
        "it would see every request, its key included, before the guard; the guard owns --middleware")),
    # Foreign code: a class path or a plugin file vLLM imports.
    "tool_parser_plugin": _code("imports that module name, or executes that .py file, at start "
                                "(vllm/entrypoints/common/cli_args.py l.617-618; utils/import_utils.py l.80-115 import_plugin)"),
    "reasoning_parser_plugin": _code("imports that module name, or executes that .py file, at start "
                                     "(vllm/entrypoints/common/cli_args.py l.620-621; utils/import_utils.py l.80-115)"),
    "logits_processors": _code("imports each module:Class it names in the engine "
                               "(vllm/v1/worker/gpu/sample/logits_processor/loader.py l.78-110 importlib.import_module)"),
    "worker_cls": Refusal(None, "imports the GPU worker from that class path (vllm/v1/worker/worker_base.py l.314-316 "
                                "resolve_obj_by_qualname; allowed: auto, vLLM's default): " + _FOREIGN_CODE,
                          frozenset({"auto"})),
    "worker_extension_cls": _code("imports that class path into every GPU worker "
                                  "(vllm/v1/worker/worker_base.py l.326-328 resolve_obj_by_qualname)"),
    "scheduler_cls": _code("imports the scheduler from that class path (vllm/config/scheduler.py l.289-291 "
                           "resolve_obj_by_qualname)"),
    "model_class_overrides": _code("registers the class paths it maps as the model's implementation "
                                   "(vllm/config/model.py l.1190-1213 ModelRegistry.register_model)"),
    "ec_transfer_config": _code("imports its ec_connector_module_path and connects to its ec_ip/ec_port "
                                "(vllm/distributed/ec_transfer/ec_connector/factory.py l.69-72 importlib.import_module)"),
    "logging_config": Refusal(None, "pylogging_config_file: the same file, read the same way (vllm/logger.py "
                                    "l.218, 261-277): " + _FOREIGN_CODE, json_keys=frozenset({"pylogging_config_file"})),
    "structured_outputs_config": Refusal(None, "reasoning_parser_plugin: the engine imports that module name, or executes "
                                               "that .py file (vllm/v1/structured_output/__init__.py l.101-105; "
                                               "utils/import_utils.py l.80-115): " + _FOREIGN_CODE,
                                         json_keys=frozenset({"reasoning_parser_plugin"})),
    "log_config_file": _code("reads that JSON file into logging.config.dictConfig, whose '()' factories import any "
                             "class path (vllm/logger.py l.261-277; engine/arg_utils.py l.2272-2275)"),
    # Files and repos the node does not have.
    "chat_template": _file("reads that path inside the container as the chat template, or takes the text as one "
                           "(vllm/renderers/chat_utils/chat_template.py l.73 open); the model profile's template "
                           "(tool calls, reasoning) is the synced weights' own"),
    "lora_modules": _file("loads each adapter from that path, or downloads that Hugging Face repo "
                          "(vllm/lora/utils.py l.345-391 get_adapter_absolute_path, snapshot_download)"),
    "default_mm_loras": _file("loads the adapters it maps from those paths or repos "
                              "(vllm/entrypoints/serve/utils/api_utils.py l.288-303; lora/utils.py l.345-391)"),
    "hf_config_path": _file("reads the model's config from that repo or path, which the revision does not pin "
                            "(vllm/config/model.py l.628-629, 662-666, 698)"),
    "generation_config": Refusal(None, "reads generation_config.json from that folder instead of the model's "
                                       "(vllm/config/model.py l.1861-1876; allowed: auto, vllm): " + _NOT_ON_NODE,
                                 frozenset({"auto", "vllm"})),
    "enable_lora": Refusal(frozenset({"true"}), (
        "adds LoRA adapter slots to the model's layers (vllm/engine/arg_utils.py l.2727-2729 LoRAConfig): memory, CUDA "
        "graphs and kernels the plan's sizing did not measure, and adapters from paths or repos: " + _NOT_ON_NODE)),
    "spec_model": Refusal(None, _SPECULATIVE),
    "spec_method": Refusal(None, _SPECULATIVE),
    "spec_tokens": Refusal(None, _SPECULATIVE),
    # Outbound connections.
    "otlp_traces_endpoint": Refusal(None, "exports a trace of every request to that OTLP endpoint "
                                          "(vllm/tracing/otel.py l.74, 84 get_span_exporter; v1/engine/async_llm.py "
                                          "l.150): " + _OUTBOUND),
    "kv_events_config": Refusal(None, "publishes KV cache events, each block's prompt token ids, on a ZMQ socket it "
                                      "binds or connects to its endpoint (vllm/distributed/kv_events.py l.56-59 "
                                      "BlockStored.token_ids, l.445-448 bind/connect): " + _OUTBOUND),
    # The model's serving contract.
    "trust_request_chat_template": Refusal(frozenset({"true"}), (
        "renders the chat template a request sends instead of the model's (vllm/entrypoints/common/cli_args.py l.95-98): "
        "any client with the key changes the prompt format that the K3 tool and reasoning parsers read and that "
        "validate checks, and runs its own Jinja in the server")),
})

# Options vLLM 0.34.0 takes that change nothing in this product: the engine loads the synced weights from
# a local path with the hub offline (HF_HUB_OFFLINE=1, components/core/vllm.py), so no revision is fetched and
# no download directory is used. dest -> what the user should set instead. The plan warns (a user who
# writes one expects an effect).
INERT_DESTS: Mapping[str, str] = MappingProxyType({
    "revision": "model.revision (the weight sync fetches and verifies that commit)",
    "code_revision": "model.revision (the model's code is in the synced files)",
    "tokenizer_revision": "model.revision (the tokenizer is in the synced files)",
    "download_dir": "the storage keys (storage.*): the weights are synced before vLLM starts",
})
# The most items vllm.extraArgs may hold: far above any command a person writes (the shipped stacks use
# none; vLLM's own examples a handful), low enough that a generated or pasted list is caught before it
# reaches the EC2 user data (16 KB) or a container's argv. A product bound.
MAX_EXTRA_ARGS = 256


def inert_option_warnings(parsed: Mapping[str, tuple[str, tuple[str, ...]]]) -> list[str]:
    """One warning per option of ``parsed`` (``check_parser_args``'s result) in ``INERT_DESTS``."""
    return [f"vllm.extraArgs {option} has no effect here: vLLM loads the synced weights from a local path with the "
            f"hub offline (HF_HUB_OFFLINE=1); set {INERT_DESTS[dest]}"
            for dest, (option, _values) in parsed.items() if dest in INERT_DESTS]

# Values vLLM 0.34.0 takes without error that leave this product without an API server (no config
# class bounds them): --api-server-count 0 or less runs `vllm serve` headless
# (vllm/entrypoints/cli/serve.py l.149 run_headless): no HTTP listener on vllm.port.
PRODUCT_BOUNDS: Mapping[str, tuple[Mapping[str, float], str]] = MappingProxyType({
    "api_server_count": (MappingProxyType({"ge": 1}), "0 or less runs vLLM headless, without the API server "
                                                      "(vllm/entrypoints/cli/serve.py l.149)"),
})

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's _negative_number_matcher
_BOUND_WORDS = {"ge": "at least", "gt": "more than", "le": "at most", "lt": "less than"}
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def _looks_like_option(arg: str) -> bool:
    """Whether argparse takes ``arg`` as an option (not a value): as ``_parse_optional``, for a
    parser with no option that looks like a negative number."""
    return arg.startswith("-") and arg != "-" and not _NEGATIVE_NUMBER.match(arg) and " " not in arg


def _resolve(name: str, table: OptionTable) -> tuple[ParserAction | None, str | None, list[str]]:
    """(action, the option string, candidates) for an option name as argparse resolves it: exact,
    a two-character short option with its value attached (returned as option ``-x`` and the rest in
    the name), or a unique prefix (several candidates: ambiguous, action None)."""
    if name in table.by_option:
        return table.by_option[name], name, []
    fits = sorted(o for o in table.by_option if o.startswith(name)) if table.allow_abbrev else []
    if not name.startswith("--") and len(name) > 2 and name[:2] in table.by_option:
        fits = sorted({*fits, name[:2]})
    if len(fits) == 1:
        return table.by_option[fits[0]], fits[0], fits
    return None, None, fits


def _number(type_name: str, value: str) -> float | None:
    """``value`` as the recorded value parser reads it; None for ``""``/``None`` of an optional one.

    Raises:
        ValueError: the parser would refuse it.
    """
    base = type_name.removeprefix("optional:").removeprefix("parse:")
    if type_name.startswith("optional:") and value in ("", "None"):
        return None
    if base == "human_readable_int":
        match = _HUMAN_INT.fullmatch(value.strip())
        if match:
            number, suffix = match.groups()
            if suffix in "kmgt":
                return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
            if "." not in number:
                return int(number) * 1024 ** ("KMGT".index(suffix) + 1)
            raise ValueError(value)
        return int(value)
    return int(value) if base == "int" else float(value)


# vLLM expands human-readable numbers inside a JSON value before validating it
# (vllm/engine/arg_utils.py _expand_json_human_readable_numbers): 16k is read as a number there.
_JSON_HUMAN_NUMBER = re.compile(r"(?<=[:\[,\s])\d+(?:\.\d+)?[kKmMgGtT](?=[\s,\]}])")


def _check_json_keys(shown: str, action: ParserAction, option: str, value: str) -> None:
    """A JSON-object option's value: a JSON object whose keys its config dataclass has.

    Raises:
        ConfigError: not a JSON object, or a key the dataclass does not take (with a did-you-mean).
    """
    keys = action.keys or frozenset()
    try:
        parsed = json.loads(_JSON_HUMAN_NUMBER.sub("0", value))
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ConfigError("vllm.extraArgs", shown, f"is refused by {PARSER_SOURCE}: {option} ({action.dest}) must be a "
                                                   "JSON object (or its keys one by one: --flag.key value)")
    unknown = sorted(set(parsed) - keys)
    if unknown:
        raise ConfigError("vllm.extraArgs", shown, f"is refused by {PARSER_SOURCE}: {option} ({action.dest}) has no field "
                                                   f"{unknown[0]!r}{did_you_mean(unknown[0], keys)} ({len(keys)} fields)")


def _check_value(arg: str, action: ParserAction, option: str, value: str) -> None:
    """Choices, the value's type and the config class's bounds (then ``PRODUCT_BOUNDS``).

    Raises:
        ConfigError: key ``vllm.extraArgs``, naming the option, the value and what is allowed.
    """
    shown = arg if arg.endswith("=" + value) or arg == value else f"{arg} {value}"
    base = (action.type or "").removeprefix("optional:").removeprefix("parse:")
    if action.choices is not None and value not in action.choices:
        raise ConfigError("vllm.extraArgs", shown, f"is not a choice of {option} in {PARSER_SOURCE} "
                                                   f"(allowed: {', '.join(action.choices)})")
    if action.keys is not None and not ((action.type or "").startswith("optional:") and value in ("", "None")):
        _check_json_keys(shown, action, option, value)
        return
    number: float | None = None
    if base in ("int", "float", "human_readable_int"):
        try:
            number = _number(action.type or "", value)
        except ValueError:
            kind = {"int": "a whole number", "float": "a number",
                    "human_readable_int": "a whole number (or 16K, 25.6k)"}[base]
            raise ConfigError("vllm.extraArgs", shown,
                              f"is refused by {PARSER_SOURCE}: {option} ({action.dest}) must be {kind}") from None
    elif base == "loads" and not ((action.type or "").startswith("optional:") and value in ("", "None")):
        try:
            json.loads(value)
        except ValueError:
            raise ConfigError("vllm.extraArgs", shown,
                              f"is refused by {PARSER_SOURCE}: {option} ({action.dest}) must be JSON") from None
    if number is None:
        return
    checks = [(action.bounds, f"vLLM 0.34.0's {action.group}", "")]
    if action.dest in PRODUCT_BOUNDS:
        checks.append((PRODUCT_BOUNDS[action.dest][0], "this product", f" ({PRODUCT_BOUNDS[action.dest][1]})"))
    for bounds, who, why in checks:
        ok = {"ge": number >= bounds.get("ge", number), "gt": "gt" not in bounds or number > bounds["gt"],
              "le": number <= bounds.get("le", number), "lt": "lt" not in bounds or number < bounds["lt"]}
        if not all(ok.values()):
            allowed = ", ".join(f"{_BOUND_WORDS[b]} {bounds[b]:,}" for b in _BOUND_WORDS if b in bounds)
            raise ConfigError("vllm.extraArgs", shown, f"is refused by {who}: {option} ({action.dest}) must be {allowed}{why}")


def check_parser_args(extra_args: Sequence[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """``vllm.extraArgs`` as the pinned `vllm serve` parser reads them after the toolkit's flags
    (recorded table, ``option_table``; no vLLM import): every option known (with a did-you-mean),
    no positional argument (the toolkit gives the model path), each option with the number of
    values its ``nargs`` takes, each value among its choices, of its type and within the bounds of
    its config class, and no value of ``REFUSED_VALUES``. Mirrors ``FlexibleArgumentParser``
    (``_`` as ``-`` in ``--`` names, ``--name=value``, dotted ``--name.key value``, ``-O3``) and
    argparse (unique prefixes, ``-n2``, negative numbers as values).

    Returns:
        dest -> (the option string, its values) for every option given, the last one winning.

    Raises:
        ConfigError: key ``vllm.extraArgs``, one line naming the item, the option and what is allowed.
    """
    table = option_table()
    parsed: dict[str, tuple[str, tuple[str, ...]]] = {}
    args = list(extra_args)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            raise ConfigError("vllm.extraArgs", arg, "ends the options: vLLM's parser reads everything after it as "
                                                     "positional arguments, which it refuses (the model path is the toolkit's)")
        if not _looks_like_option(arg):
            raise ConfigError("vllm.extraArgs", arg, f"is a positional argument, which {PARSER_SOURCE} refuses after "
                                                     "the model path the toolkit gives (a model is not set here: the "
                                                     "toolkit serves the synced weights); give options, --flag value")
        name = option_name(arg)
        attached: str | None = arg.split("=", 1)[1] if "=" in arg else None
        if arg.startswith("-O") and not arg.startswith("--") and arg != "-O":  # FlexibleArgumentParser: -O3
            name, attached = "--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]
        action, option, fits = _resolve(name, table)
        if action is None or option is None:
            if fits:
                raise ConfigError("vllm.extraArgs", arg, f"is ambiguous to {PARSER_SOURCE} (could be "
                                                         f"{', '.join(fits[:6])}{', ...' if len(fits) > 6 else ''})")
            longs = [o for o in table.by_option if o.startswith("--")]
            raise ConfigError("vllm.extraArgs", arg, f"is not an option of {PARSER_SOURCE}{did_you_mean(name, longs)}")
        if option != name and not option.startswith("--") and attached is None:  # -n2: the value attached
            attached = name[2:]
        dotted = "." in arg.split("=", 1)[0]
        nargs = 1 if dotted else action.nargs
        if nargs == 0:
            if attached is not None:
                raise ConfigError("vllm.extraArgs", arg, f"gives a value to {option}, a flag that takes none in {PARSER_SOURCE}")
            values: list[str] = []
        elif attached is not None:
            values = [attached]
        else:
            values = []
            want = {None: 1, 1: 1, "?": 1}.get(nargs, len(args))
            while i < len(args) and len(values) < want and not _looks_like_option(args[i]):
                values.append(args[i])
                i += 1
            if not values and nargs not in ("?", "*"):
                raise ConfigError("vllm.extraArgs", arg, f"is missing its value: {option} takes "
                                                         f"{'one or more values' if nargs == '+' else 'one value'} "
                                                         f"in {PARSER_SOURCE} (give it as the next item or --flag=value)")
        if dotted and action.keys is not None:
            key = arg.split("=", 1)[0].split(".", 2)[1]
            if key not in action.keys:
                raise ConfigError("vllm.extraArgs", arg, f"is refused by {PARSER_SOURCE}: {option} ({action.dest}) has no "
                                                         f"field {key!r}{did_you_mean(key, action.keys)}")
        if not dotted:
            for value in values:
                _check_value(arg, action, option, value)
        refused = REFUSED_VALUES.get(action.dest)
        if refused is not None:
            flag_value = "false" if option.startswith(("--no-", "--disable-")) else "true"
            given = {v.strip().lower() for v in values} or {flag_value}
            if refused.refuses_fields(arg, values) if refused.json_keys else refused.refuses(given):
                shown = arg if not values or attached is not None else f"{arg} {' '.join(values)}"
                raise ConfigError("vllm.extraArgs", shown, f"is refused for this product: {option} {refused.why}")
        parsed[action.dest] = (option, tuple(values))
    return parsed

"""The vLLM command builder: image, argv and env for every node role of a model copy.

Flags and env come from the model's vendor recipe (``model.py``) and the spec; timeouts come
from the sizing's startup budget. The API key never enters argv: vLLM reads ``VLLM_API_KEY``,
which deployments fill from a secret (``secret_env``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from .attention_backend import attention_backend_flags
from .config.spec import DeploymentSpec
from .kv_layout import DEFAULT_INDEXER_CACHE_DTYPE, INDEXER_KV_DTYPE_KEY
from .sizing import Sizing, compute_sizing, kv_cache_dtype
from .versions import VLLM_MASTER_PORT, vllm_image
from .weights import serving_path

# Kubernetes expands $(VAR) in container args from the container's env; LeaderWorkerSet injects
# these into every pod of a group (lws docs: LWS_LEADER_ADDRESS, LWS_WORKER_INDEX, LWS_GROUP_SIZE).
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
LEADER_ADDRESS_REF = f"$({LEADER_ADDRESS_ENV})"
WORKER_INDEX_REF = f"$({WORKER_INDEX_ENV})"
# Example values used to check argv with the real vLLM parser (the references are strings there).
EXAMPLE_REF_VALUES: Mapping[str, str] = MappingProxyType({LEADER_ADDRESS_REF: "10.0.0.1", WORKER_INDEX_REF: "1"})

# NCCL settings for multi-node NVLink (GB300 trays in one NVLink domain; NCCL environment variables:
# https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
MNNVL_NCCL_ENV: Mapping[str, str] = MappingProxyType(
    {"NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1"}
)

# vLLM's --api-key (VLLM_API_KEY) guards only paths under /v1, /v2, /inference and /cohere (vLLM 0.33.0
# and 0.34.0 vllm/entrypoints/serve/middleware/authenticate.py GUARDED_PREFIX); /invocations serves the same
# inference without it (its --api-key help says so), and /tokenize, /detokenize, /scale_elastic_ep
# and others stay open too. vLLM loads extra ASGI middleware by import path (--middleware, same file
# set): this one answers 401 on every path but /health and /metrics without the key. It ships to the
# node (EC2 user data, a Kubernetes ConfigMap) and is mounted read-only at API_GUARD_CONTAINER_DIR.
API_GUARD_SOURCE = Path(__file__).resolve().parents[2] / "scripts" / "node" / "kimi_vllm_api_guard.py"
API_GUARD_MIDDLEWARE = "kimi_vllm_api_guard.RequireApiKey"
API_GUARD_CONTAINER_DIR = "/opt/kimi-deploy/api-guard"
API_GUARD_FILENAME = API_GUARD_SOURCE.name
# Served without the key (the guard's OPEN_PATHS): the probes' /health and Prometheus' /metrics.
API_OPEN_PATHS: tuple[str, ...] = ("/health", "/metrics")

# Set in every role's env, whatever the image says: vLLM 0.34.0 picks its Rust API frontend (vllm-rs)
# when VLLM_USE_RUST_FRONTEND is a non-zero integer (vllm/envs.py), and vllm-rs exits 2 on
# --middleware ("not implemented in Rust frontend yet"; tests/test_vllm_contract.py runs the binary):
# a derived image with VLLM_USE_RUST_FRONTEND=1 in its Env would never start the guarded server. The
# role's env replaces the image's value of a variable on every platform (docker run -e, the pod spec).
PINNED_FRONTEND_ENV: Mapping[str, str] = MappingProxyType({"VLLM_USE_RUST_FRONTEND": "0"})
# The API guard's PYTHONPATH replaces the image's own (neither docker run -e nor a pod's env can
# prepend to an image's value: the kubelet expands $(VAR) from the pod spec's env only), so
# `kimi-deploy engine verify` refuses an image whose Env sets PYTHONPATH (ENV_REPLACED_SEARCH_PATHS).
ENV_REPLACED_SEARCH_PATHS: tuple[str, ...] = ("PYTHONPATH",)

# NCCL docs (Environment Variables): INFO level, limited to initialisation and the network layer,
# names the transport of every channel and the network plugin in the log.
NCCL_TRANSPORT_LOG_ENV: Mapping[str, str] = MappingProxyType({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"})
# With compute.efa (an image carrying aws-ofi-nccl): libfabric may use the EFA provider only, so a
# missing device fails the start instead of NCCL falling back to TCP (libfabric fabric(7)).
EFA_NCCL_ENV: Mapping[str, str] = MappingProxyType({"FI_PROVIDER": "efa"})


@dataclass(frozen=True)
class VllmRole:
    """One kind of node in a model copy.

    Attributes:
        name: ``server`` (single node), ``leader`` or ``worker``.
        nodes: nodes per model copy running this role.
        argv: the full command, ``("vllm", "serve", MODEL_PATH, ...)``; the items at
            ``references`` are Kubernetes ``$(VAR)`` references (``LEADER_ADDRESS_REF``,
            ``WORKER_INDEX_REF``); every other item is literal text, user text included.
        env: plain environment variables.
        secret_env: env var name -> config key of the secret that fills it (never a value).
        serves_http: whether this role answers the OpenAI API (workers run ``--headless``); such a
            role loads the API guard (``--middleware``, ``PYTHONPATH``), whose file
            (``API_GUARD_SOURCE``) the platform mounts at ``API_GUARD_CONTAINER_DIR``.
        references: the positions in ``argv`` that the program wrote as a reference: known by
            where the builder put them, never by the text (a user's literal ``$(LWS_WORKER_INDEX)``
            in extraArgs stays text).
    """

    name: str
    nodes: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    secret_env: Mapping[str, str] = field(default_factory=dict)
    serves_http: bool = True
    references: frozenset[int] = frozenset()

    def concrete_argv(self) -> tuple[str, ...]:
        """``argv`` with the references (``references``) replaced by example values, for checking."""
        return tuple(EXAMPLE_REF_VALUES[a] if i in self.references else a for i, a in enumerate(self.argv))


@dataclass(frozen=True)
class VllmCommand:
    """The complete serving command of one model copy.

    Attributes:
        image: container image reference.
        model_path: weights directory inside the container.
        served_model_names: names clients may send as ``model`` (first is the primary).
        port: HTTP port of the OpenAI API.
        tensor_parallel_size, decode_context_parallel_size: parallelism.
        roles: the node roles (one for single node; leader and worker for multi-node).
    """

    image: str
    model_path: str
    served_model_names: tuple[str, ...]
    port: int
    tensor_parallel_size: int
    decode_context_parallel_size: int
    roles: tuple[VllmRole, ...]

    def role(self, name: str) -> VllmRole:
        """The role called ``name``.

        Raises:
            KeyError: no such role.
        """
        for role in self.roles:
            if role.name == name:
                return role
        raise KeyError(name)


def image(spec: DeploymentSpec) -> str:
    """The vLLM image: ``vllm.image`` verbatim, else the family's image at ``vllm.imageTag`` or the pin."""
    cfg = spec.config.vllm
    return cfg.image or vllm_image(spec.target.image_family, cfg.image_tag)


def _common_argv(spec: DeploymentSpec, sizing: Sizing) -> list[str]:
    model, cfg = spec.model, spec.config.vllm
    recipe = model.recipes[spec.target.image_family]
    names = _served_names(spec)
    argv = ["vllm", "serve", serving_path(spec), "--served-model-name", *names]
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += [
        "--tensor-parallel-size",
        str(spec.target.gpus_per_copy),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        model.tool_call_parser,
        "--reasoning-parser",
        model.reasoning_parser,
        "--load-format",
        recipe.load_format,
    ]
    if cfg.gpu_memory_utilization is not None:
        # Unset, vLLM 0.34.0 sizes the extensible KV cache from memory measured after warm-up
        # (config/cache.py:216-234: leave it unset unless something vLLM does not measure shares the GPU).
        argv += ["--gpu-memory-utilization", f"{cfg.gpu_memory_utilization:g}"]
    argv += [
        "--max-model-len",
        str(sizing.max_model_len),
    ]
    dtype = kv_cache_dtype(spec)
    if dtype != "auto":
        argv += ["--kv-cache-dtype", dtype]
    dcp = cfg.decode_context_parallel_size > 1
    if dcp:
        argv += ["--decode-context-parallel-size", str(cfg.decode_context_parallel_size)]
    # Every CUDA role names the backend vLLM would pick itself (attention_backend.py), the one the
    # plan's cache layout is computed for (sizing.serving_argv carries the same flags).
    argv += attention_backend_flags(spec.model, spec.target, dtype, cfg.decode_context_parallel_size, cfg.extra_args)
    dcp_flags = dict(recipe.dcp_flags) if dcp else {}
    for flag, value in recipe.flags:
        value = dcp_flags.pop(flag, value)
        if flag == "--enable-prefix-caching" and not cfg.enable_prefix_caching:
            continue
        argv.append(flag)
        if value is not None:
            argv.append(value)
    for flag, value in dcp_flags.items():
        argv += [flag] if value is None else [flag, value]
    if not cfg.enable_prefix_caching:
        argv.append("--no-enable-prefix-caching")
    return argv


def attention_config_keys(spec: DeploymentSpec) -> dict[str, str]:
    """Keys the toolkit merges into the ``--attention-config`` JSON: ``indexer_kv_dtype`` when
    ``vllm.indexerCacheDtype`` is not the default (vLLM 0.34.0 config/attention.py:101)."""
    dtype = spec.config.vllm.indexer_cache_dtype
    return {} if dtype == DEFAULT_INDEXER_CACHE_DTYPE else {INDEXER_KV_DTYPE_KEY: dtype}


def merge_attention_config(argv: Sequence[str], keys: Mapping[str, str]) -> list[str]:
    """``argv`` with ``keys`` merged into every ``--attention-config`` JSON object (``X`` or ``=X``;
    argparse keeps the last, so each carries them), or one ``--attention-config`` appended when
    there is none. Compact JSON, the recipe's keys first in their order. No keys: ``argv`` as is.

    Raises:
        ValueError: an ``--attention-config`` value that is not a JSON object.
    """
    if not keys:
        return list(argv)

    def merged(text: str) -> str:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError(f"--attention-config {text!r} is not a JSON object")
        return json.dumps({**value, **keys}, separators=(",", ":"))

    out: list[str] = []
    found = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--attention-config" and i + 1 < len(argv):
            out += [arg, merged(argv[i + 1])]
            found, i = True, i + 2
            continue
        if arg.startswith("--attention-config="):
            out.append("--attention-config=" + merged(arg.split("=", 1)[1]))
            found = True
        else:
            out.append(arg)
        i += 1
    if not found:
        out += ["--attention-config", json.dumps(dict(keys), separators=(",", ":"))]
    return out


def _served_names(spec: DeploymentSpec) -> tuple[str, ...]:
    names = [spec.served_model_name]
    if spec.hub_repo not in names:
        names.append(spec.hub_repo)
    return tuple(names)


def _env(spec: DeploymentSpec, sizing: Sizing) -> dict[str, str]:
    recipe = spec.model.recipes[spec.target.image_family]
    env = dict(recipe.env)
    if spec.config.vllm.decode_context_parallel_size > 1:
        env.update(recipe.dcp_env)
    env["VLLM_ENGINE_READY_TIMEOUT_S"] = str(sizing.startup_budget_seconds)
    env.update(PINNED_FRONTEND_ENV)
    # Weights are local; the server must never reach for the hub at start.
    env["HF_HUB_OFFLINE"] = "1"
    if spec.nodes_per_copy > 1 and spec.target.needs_compute_domain:
        env.update(MNNVL_NCCL_ENV)
    if spec.nodes_per_copy > 1:
        # Log the transport NCCL chose (P2P/CUMEM, NVLS, NET/OFI or NET/Socket) at startup.
        env.update(NCCL_TRANSPORT_LOG_ENV)
    if spec.efa_enabled:
        env.update(EFA_NCCL_ENV)
    return env


def build_vllm_command(spec: DeploymentSpec, sizing: Sizing | None = None) -> VllmCommand:
    """Build the serving command of one model copy.

    Args:
        spec: the validated deployment spec.
        sizing: its sizing (computed when omitted).

    Returns:
        A ``VllmCommand`` with one ``server`` role for single-node targets, or ``leader`` and
        ``worker`` roles (``--nnodes/--node-rank/--master-addr/--master-port``, ``--headless``
        on workers) for multi-node targets. The roles that serve HTTP load the API guard.

    Raises:
        ConfigError: from sizing, when the configuration cannot serve.
    """
    sizing = sizing or compute_sizing(spec)
    cfg = spec.config.vllm
    base = _common_argv(spec, sizing)
    http = ["--host", "0.0.0.0", "--port", str(cfg.port), "--middleware", API_GUARD_MIDDLEWARE]
    env = _env(spec, sizing)
    http_env = {**env, "PYTHONPATH": API_GUARD_CONTAINER_DIR}
    secret_env = {"VLLM_API_KEY": "apiKey"}
    extra = list(cfg.extra_args)
    # vllm.indexerCacheDtype rides in the recipe's --attention-config (one flag, merged JSON).
    attention_keys = attention_config_keys(spec)
    nodes = spec.nodes_per_copy
    roles: tuple[VllmRole, ...]
    if nodes == 1:
        server = merge_attention_config(base + http + extra, attention_keys)
        roles = (VllmRole("server", 1, tuple(server), http_env, secret_env),)
    else:
        multi = ["--nnodes", str(nodes), "--master-addr", LEADER_ADDRESS_REF, "--master-port", str(VLLM_MASTER_PORT)]
        rank = ["--node-rank", WORKER_INDEX_REF, "--headless"]
        leader = merge_attention_config(base + multi + ["--node-rank", "0"] + http + extra, attention_keys)
        worker = merge_attention_config(base + multi + rank + extra, attention_keys)
        # merge_attention_config rewrites items in place and appends: positions hold.
        leader_refs = frozenset({len(base) + multi.index(LEADER_ADDRESS_REF)})
        worker_refs = leader_refs | {len(base) + len(multi) + rank.index(WORKER_INDEX_REF)}
        roles = (
            VllmRole("leader", 1, tuple(leader), http_env, secret_env, references=leader_refs),
            VllmRole("worker", nodes - 1, tuple(worker), dict(env), {}, serves_http=False, references=worker_refs),
        )
        for role in roles:
            if not all(role.argv[i] in EXAMPLE_REF_VALUES for i in role.references):
                raise RuntimeError(f"the {role.name} argv lost its references' positions: {role.argv}")
    return VllmCommand(
        image=image(spec),
        model_path=serving_path(spec),
        served_model_names=_served_names(spec),
        port=cfg.port,
        tensor_parallel_size=spec.target.gpus_per_copy,
        decode_context_parallel_size=cfg.decode_context_parallel_size,
        roles=roles,
    )

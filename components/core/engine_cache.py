"""The engine's compile and kernel caches, kept in the mirror next to the weights.

Where vLLM keeps them (read in the 0.33.0 wheel; 0.34.0 has the same paths in the same files):

- torch.compile: ``$VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_<r>_<dp>/`` with the
  Inductor and Triton caches under ``<hash>/inductor_cache`` and ``<hash>/triton_cache``
  (``vllm/compilation/backends.py`` ``VllmBackend.__call__``; ``compiler_interface.py``
  ``initialize_inductor_cache``). ``VLLM_CACHE_ROOT`` defaults to ``~/.cache/vllm``
  (``vllm/envs.py``). ``<hash>`` = sha256 of [env factors (``envs.compile_factors()``: every
  vLLM env var but location-only ones such as ``VLLM_CACHE_ROOT``), ``VllmConfig.compute_hash()``
  (vLLM version, model, cache and parallel configs...), the traced source files, the compiler's
  factors], first 10 hex digits. vLLM therefore misses (recompiles) on a changed config, but
  its key does not name the GPU or the image's CUDA/driver stack.
- FlashInfer JIT: ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<compute archs>/`` (``flashinfer/jit/env.py``;
  default base ``$HOME``), keyed only by the CUDA arch list, not by FlashInfer's version.
- FlashInfer autotune results: ``$VLLM_CACHE_ROOT/flashinfer_autotune_cache/...`` keyed by
  ``VllmConfig.compute_hash(include_version=False)`` (``vllm/model_executor/warmup/flashinfer_autotune_cache.py``);
  the recipe runs with ``--no-enable-flashinfer-autotune``.

Because FlashInfer's key ignores its version and vLLM's ignores the GPU, a cache is only
restored under a key of our own (``engine_cache_key``): engine build (image and vLLM
version), model revision, parallel layout (TP, DCP, nodes per copy, the full serve argv and
env) and GPU (model and architecture). The cache lives in a directory named by that key, and
the restore refuses an archive whose recorded key differs, so a cache is never used for another
build or layout. Restore runs before vLLM starts; save runs once, after the first start that
answered its health check, and never overwrites an existing archive.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .config.spec import DeploymentSpec
from .naming import VLLM_SERVICE_ACCOUNT, WEIGHT_SYNC_SERVICE_ACCOUNT
from .versions import VLLM_VERSION
from .vllm import LEADER_ADDRESS_ENV, WORKER_INDEX_ENV
from .weights import WEIGHTS_MOUNT_PATH, mirror_key_prefix, per_node_copy_step

# The program that restores and saves an archive (stdlib + boto3; runs in the vLLM image).
ENGINE_CACHE_SCRIPT_PATH = "/opt/kimi-deploy/engine_cache.py"
# On the node's NVMe (container path), one directory per key.
ENGINE_CACHE_ROOT = f"{WEIGHTS_MOUNT_PATH}/.kimi-engine-cache"
# Where the vLLM container sees its (read-write) cache directory.
ENGINE_CACHE_CONTAINER_PATH = "/var/cache/kimi-engine"
# The key document inside every archive and directory.
KEY_FILE_NAME = "engine-cache-key.json"
KEY_HEX_DIGITS = 20
# A copy spanning nodes: the leader keeps its API gate closed (scripts/node/engine_cache.py) until
# every worker's archive is saved, at most this long (estimate: a worker's snapshot and upload of
# time_inputs.ENGINE_CACHE_BYTES take about a minute at the mirror's rate; the bound only matters
# when a worker's save fails, and then delays serving by it once).
ENGINE_CACHE_GROUP_WAIT_SECONDS = 600
# The variable naming the gate file to the API guard (scripts/node/kimi_vllm_api_guard.py GATE_ENV):
# until the file exists the guard answers 503 on every route but /health and /metrics.
GATE_ENV = "KIMI_ENGINE_CACHE_GATE"
# Where the gate lives, the same path on the EC2 host (tmpfs: gone at reboot) and in a pod (an
# in-memory emptyDir): written by the save, read-only in the vLLM container.
GATE_DIR = "/run/kimi-cache-gate"
GATE_FILE = f"{GATE_DIR}/open"


@dataclass(frozen=True)
class EngineCacheKey:
    """The key of one engine cache.

    Attributes:
        parts: what the key is made of (``engine_build``, ``model_revision``,
            ``parallel_layout``, ``gpu``), JSON-serializable.
        digest: sha256 of the canonical JSON of ``parts``, first ``KEY_HEX_DIGITS`` hex digits.
    """

    parts: Mapping[str, Any]
    digest: str

    def document(self) -> dict[str, Any]:
        """``{"digest": ..., "parts": {...}}``: what the archive and directory record."""
        return {"digest": self.digest, "parts": dict(self.parts)}


def cache_key(
    *,
    image: str,
    vllm_version: str,
    model_revision: str,
    tensor_parallel_size: int,
    decode_context_parallel_size: int,
    nodes_per_copy: int,
    serve_argv: Sequence[str],
    serve_env: Mapping[str, str],
    gpu_name: str,
    gpu_architecture: str,
) -> EngineCacheKey:
    """The key of an engine cache from its parts; any change of any part changes the digest.

    Args:
        image: the vLLM image reference (tag or digest) the engine runs in.
        vllm_version: the pinned vLLM version.
        model_revision: the model's revision (commit).
        tensor_parallel_size, decode_context_parallel_size, nodes_per_copy: the layout.
        serve_argv: the full ``vllm serve`` argv (compile-relevant flags: max-model-len,
            kv-cache-dtype, compilation and attention config...).
        serve_env: the plain environment (no secrets) of the server.
        gpu_name, gpu_architecture: e.g. ``B300``, ``blackwell``.
    """
    parts = {
        "engine_build": {"image": image, "vllm_version": vllm_version},
        "model_revision": model_revision,
        "parallel_layout": {
            "tensor_parallel_size": tensor_parallel_size,
            "decode_context_parallel_size": decode_context_parallel_size,
            "nodes_per_copy": nodes_per_copy,
            "serve_argv": list(serve_argv),
            "serve_env": {k: serve_env[k] for k in sorted(serve_env)},
        },
        "gpu": {"name": gpu_name, "architecture": gpu_architecture},
    }
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return EngineCacheKey(parts, hashlib.sha256(canonical.encode()).hexdigest()[:KEY_HEX_DIGITS])


def engine_cache_key(spec: DeploymentSpec, command) -> EngineCacheKey:
    """The key for ``spec`` served with ``command`` (``vllm.build_vllm_command``): its first
    role's argv and plain env (the leader's on multi-node copies; workers run the same build)."""
    role = command.roles[0]
    return cache_key(
        image=command.image,
        vllm_version=VLLM_VERSION,
        model_revision=spec.revision,
        tensor_parallel_size=command.tensor_parallel_size,
        decode_context_parallel_size=command.decode_context_parallel_size,
        nodes_per_copy=spec.nodes_per_copy,
        serve_argv=role.argv,
        serve_env=role.env,
        gpu_name=spec.target.gpu.name,
        gpu_architecture=spec.target.gpu.architecture,
    )


def restored_at_start(spec: DeploymentSpec) -> bool:
    """Whether the stack's boot chain restores the caches before vLLM starts (and saves them after
    its first healthy start): a mirror on a platform whose profile ``restores_engine_cache``
    (aws-ec2: the ``kimi-engine-cache-*`` units; aws-eks: the vLLM pods' restore init container
    and save sidecar, ``components/k8s/engine_cache.py``). Elsewhere every start compiles cold."""
    return spec.profile.restores_engine_cache and spec.config.storage.mirror.enabled


# The folder beside the revision's weights in the mirror that holds the archives.
MIRROR_FOLDER = "_engine-cache"


def cache_key_prefix(spec: DeploymentSpec) -> str:
    """``<mirror prefix of the revision>/_engine-cache``: the one key prefix a save writes under
    (every ``archive_uri`` of the stack lies below it; the IAM grant of the save is scoped to it)."""
    return f"{mirror_key_prefix(spec)}/{MIRROR_FOLDER}"


def node_key(key: EngineCacheKey, node_index: str) -> EngineCacheKey:
    """The key of node ``node_index`` of a copy spanning nodes.

    vLLM keeps torch.compile artifacts per rank (``torch_compile_cache/<hash>/rank_<r>_<dp>/``,
    ``vllm/compilation/backends.py``), so the cache of a copy's leader holds other ranks than a
    worker's: each node gets its own archive, ``<digest>-node<index>``, and a node never restores
    another node's archive (the restore compares the whole recorded key). ``node_index`` may be a
    Kubernetes ``$(VAR)`` reference (``vllm.WORKER_INDEX_REF``), expanded by the kubelet in argv.
    """
    return EngineCacheKey({**key.parts, "node_index": node_index}, f"{key.digest}-node{node_index}")


def vllm_pods_service_account(spec: DeploymentSpec) -> str:
    """The service account the Kubernetes vLLM pods run as (and so the one their engine-cache
    containers use): the weight-sync account where every pod copies its node's weights in an init
    container (``node-copy`` per node: ``nvme``, ``nvme-from-fsx``), else the vLLM account."""
    per_node_copy = per_node_copy_step(spec, spec.config.storage.mirror.enabled) is not None
    return WEIGHT_SYNC_SERVICE_ACCOUNT if per_node_copy else VLLM_SERVICE_ACCOUNT


def cache_dir(key: EngineCacheKey) -> str:
    """The key's directory on the node's NVMe (container path, under ``ENGINE_CACHE_ROOT``)."""
    return f"{ENGINE_CACHE_ROOT}/{key.digest}"


def archive_uri(spec: DeploymentSpec, bucket: str, key: EngineCacheKey) -> str:
    """``s3://<bucket>/<mirror prefix of the revision>/_engine-cache/<digest>.tar``."""
    return f"s3://{bucket}/{mirror_key_prefix(spec)}/_engine-cache/{key.digest}.tar"


def vllm_cache_env() -> dict[str, str]:
    """Environment that points vLLM, Inductor/Triton and FlashInfer at the mounted cache
    (``ENGINE_CACHE_CONTAINER_PATH``, the key's directory mounted read-write).

    ``VLLM_CACHE_ROOT`` is ignored by vLLM's own compile hash (``envs.compile_factors``), so
    moving the cache does not invalidate it; ``FLASHINFER_WORKSPACE_BASE`` replaces ``$HOME``
    as FlashInfer's base (``flashinfer/jit/env.py``).
    """
    return {
        "VLLM_CACHE_ROOT": f"{ENGINE_CACHE_CONTAINER_PATH}/vllm",
        "FLASHINFER_WORKSPACE_BASE": f"{ENGINE_CACHE_CONTAINER_PATH}/flashinfer",
    }


@dataclass(frozen=True)
class CacheStep:
    """One run of ``scripts/node/engine_cache.py``.

    Attributes:
        name: ``engine-cache-restore`` (before vLLM starts) or ``engine-cache-save`` (after the
            first start that passed its health check).
        argv: the complete command (inside the vLLM image, the NVMe at ``WEIGHTS_MOUNT_PATH``).
    """

    name: str
    argv: tuple[str, ...]


def cache_steps(spec: DeploymentSpec, bucket: str, key: EngineCacheKey, health_url: str,
                group_nodes: int = 1, worker: bool = False) -> tuple[CacheStep, CacheStep]:
    """The restore and save runs for ``key`` with the archive in ``bucket``'s mirror.

    ``health_url``: what the save waits for (e.g. ``http://127.0.0.1:8000/health``).
    ``group_nodes`` > 1 (a copy spanning nodes): ``key`` is the copy's; each node reads its index
    from ``vllm.WORKER_INDEX_ENV`` and keeps ``node_key(key, index)`` (no ``$(VAR)`` in the argv:
    the kubelet expands nothing the program did not mark, ``components/k8s/common.k8s_argv``); the
    leader (index 0) opens its gate once every worker's manifest exists or
    ``ENGINE_CACHE_GROUP_WAIT_SECONDS`` pass. ``worker``: the save waits for the leader's
    ``health_url`` (its host from ``vllm.LEADER_ADDRESS_ENV``) and uploads only when the leader's
    gate was still closed after the snapshot (``scripts/node/engine_cache.py``).
    """
    common: tuple[str, ...] = ("--uri", archive_uri(spec, bucket, key), "--dir", cache_dir(key), "--key", key.digest)
    save_extra: tuple[str, ...] = ()
    if group_nodes > 1:
        common += ("--node-index-env", WORKER_INDEX_ENV)
        save_extra = ("--group-nodes", str(group_nodes), "--group-wait-seconds", str(ENGINE_CACHE_GROUP_WAIT_SECONDS))
        if worker:
            save_extra += ("--wait-host-env", LEADER_ADDRESS_ENV)
    restore = CacheStep("engine-cache-restore", ("python3", ENGINE_CACHE_SCRIPT_PATH, "restore", *common))
    save = CacheStep("engine-cache-save",
                     ("python3", ENGINE_CACHE_SCRIPT_PATH, "save", *common, "--wait-url", health_url, *save_extra))
    return restore, save

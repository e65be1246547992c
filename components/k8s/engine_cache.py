"""The engine's compile caches in the Kubernetes vLLM pods (``aws-eks``): restored from the mirror
before vLLM starts, saved once after the copy's first healthy start.

The key, the archive's place (``s3://<mirror>/<prefix>/<repo>/<rev>/_engine-cache/<key>.tar``) and
the restore/save runs are the core's (``components/core/engine_cache.py``); the program is
``scripts/node/engine_cache.py``, shipped like the weight-sync program: an immutable ConfigMap whose
name ends in a hash of its text, run in the pinned vLLM image (no extra image). Per pod:

- ``engine-cache-restore``: an init container after the ``weight-sync`` one (init containers run
  one at a time, so vLLM starts only after it). It runs the core's restore argv under
  ``RUNNER_SCRIPT``: bounded by ``RESTORE_TIMEOUT_SECONDS`` and always exiting 0, so a missing,
  refused (another key) or failed archive is a cold start, never a pod that cannot start.
- ``engine-cache-save``: a native sidecar (an init container with ``restartPolicy: Always``;
  Kubernetes >= 1.29 runs it beside the main containers, and every EKS version offered here,
  ``versions.EKS_VERSIONS``, is >= 1.31). It runs the core's save argv (wait for ``/health``,
  snapshot the cache directory, open the gate, then upload the snapshot and its sha256 manifest
  once, never over an existing one) up to ``SAVE_ATTEMPTS`` times, then idles. The gate
  (``GATE_FILE`` on an in-memory emptyDir, read-only in vLLM) holds the serving role's readiness
  (``gated_readiness``): the pod joins its Service only after the snapshot is taken, so the archive
  holds what the engine wrote before any request; a failed save opens the gate too, and a retry
  that finds it open archives nothing. A sidecar that exits is restarted: a sidecar that exits is
  restarted, and while it is down the pod's Ready condition is false (the kubelet counts
  restartable init containers in ContainersReady: kubernetes ``pkg/kubelet/status/generate.go``
  ``GenerateContainersReadyCondition``), which would take a serving pod out of its Service.
- vLLM mounts the key's directory read-write at ``engine_cache.ENGINE_CACHE_CONTAINER_PATH`` and
  gets ``engine_cache.vllm_cache_env()``; everything else it mounts (the weights) stays read-only.

Where the cache lives: on the node's NVMe, in its own directory (``node_storage.node_dirs``:
``<nvme root>/kimi-deploy/engine-cache``, a hostPath volume of its own, apart from the weights,
which stay read-only for every container but the weight writer) for ``nvme`` and
``nvme-from-fsx``: it survives a pod restart on the node (the restore finds the key's directory
and does nothing), it draws on TBs of NVMe rather than the root disk's ephemeral storage (which
counts toward kubelet evictions), and the save's archive is staged beside it (``TMPDIR``). For
``fsx`` and ``pvc`` (a claim shared by several pods, never a place for one pod's cache) an
``emptyDir`` of ``EMPTY_DIR_SIZE`` holds it instead.

Copies spanning nodes (LeaderWorkerSet): each node keeps the torch.compile artifacts of its own
ranks, so each gets its own key, ``<digest>-node<index>`` (``engine_cache.node_key``;
LeaderWorkerSet 0.9.0 injects ``LWS_WORKER_INDEX`` and ``LWS_LEADER_ADDRESS`` into every container
and init container, ``pkg/utils/pod/pod_utils.go AddLWSVariables``). The program reads both from its
environment (``--node-index-env``, ``--wait-host-env``), so its argv holds no ``$(VAR)``; only the
vLLM mount's ``subPathExpr`` (a hex digest and the reference, no user text) does. A worker serves
no HTTP, so its save waits for the leader's ``/health`` (the NetworkPolicy admits all ports between
a group's pods), snapshots, and uploads only if the leader's API guard still answers "gate closed"
(so no request had reached the group); the leader opens its gate once every worker's manifest
exists (``engine_cache.ENGINE_CACHE_GROUP_WAIT_SECONDS`` at most). Every pod's archive therefore
holds only what its engine wrote before the group admitted a request.

Credentials (aws-eks): the pods run as ``engine_cache.vllm_pods_service_account``; its EKS Pod
Identity role may read the mirror prefix and write ``<revision>/_engine-cache/`` only
(``components/aws/cluster.py``, ``iam.engine_cache_policy``). The pod annotation
``eks.amazonaws.com/skip-containers: vllm`` keeps the credentials out of the vLLM container (the
Pod Identity webhook skips the named containers: aws/amazon-eks-pod-identity-webhook
``pkg/handler/handler.go getContainersToSkip``, test data ``containercredentials/rawPodSkip``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.core import engine_cache as ec
from components.core.config import REPO_ROOT, DeploymentSpec
from components.core.pod_security import SMALL_HELPER_CPU_LIMIT, helper_cpu_limit
from components.core.time_to_ready import ENGINE_CACHE_RESTORE_BUDGET_SECONDS
from components.core.vllm import WORKER_INDEX_REF, VllmCommand, VllmRole

from .common import hardened_container_security, k8s_argv, metadata, plain_env, spec_hash
from .storage import ENGINE_CACHE_VOLUME, nvme_engine_cache_volume, serving_volume

PROGRAM_SOURCE = REPO_ROOT / "scripts" / "node" / "engine_cache.py"
PROGRAM_KEY = Path(ec.ENGINE_CACHE_SCRIPT_PATH).name
PROGRAM_DIR = str(Path(ec.ENGINE_CACHE_SCRIPT_PATH).parent)
PROGRAM_CONFIGMAP_PREFIX = "kimi-engine-cache"
PROGRAM_VOLUME = "engine-cache-program"
# The pod volume of the cache: its directory on the node's NVMe, or an emptyDir (fsx, pvc).
CACHE_VOLUME = ENGINE_CACHE_VOLUME
# The caches of 8 ranks are about 5 GB (time_inputs.ENGINE_CACHE_BYTES, an estimate); the save
# stages one archive of them beside (TMPDIR): 64 GiB leaves room for both.
EMPTY_DIR_SIZE = "64Gi"
# The save sidecar creates GATE_FILE once it has snapshotted the cache directory (or found an
# archive already saved, or failed); the vLLM container's readiness waits for it, so no request
# reaches the engine before the snapshot the archive is made of (scripts/node/engine_cache.py save
# --gate). An in-memory emptyDir: written by the sidecar, read-only in the vLLM container.
GATE_VOLUME = "engine-cache-gate"
GATE_DIR = ec.GATE_DIR
GATE_FILE = ec.GATE_FILE
GATE_SIZE = "1Mi"
# The readiness exec command wrapped: the gate file first, then the original probe (stdlib only).
GATED_PROBE_SCRIPT = "import os, sys; os.path.exists(sys.argv[1]) or sys.exit(1); os.execvp(sys.argv[2], sys.argv[2:])"
RESTORE_CONTAINER = "engine-cache-restore"
SAVE_CONTAINER = "engine-cache-save"
VLLM_CONTAINER = "vllm"
# An init container has no timeout of its own: the runner bounds the restore (the EC2 unit's
# TimeoutStartSec). 5 GB at the mirror copy rate take seconds. The number is the pod budget's
# (time_to_ready.pod_ready_budget), so the startup alerts and timeouts allow for it.
RESTORE_TIMEOUT_SECONDS = ENGINE_CACHE_RESTORE_BUDGET_SECONDS
# The save itself waits up to 4 h for /health (scripts/node/engine_cache.py --wait-seconds), then
# archives; a failed attempt (S3 error, vLLM not up) is retried after SAVE_RETRY_SECONDS.
SAVE_ATTEMPTS = 3
SAVE_RETRY_SECONDS = 300
# Pod Identity / IRSA webhook annotation: containers that get no AWS credentials.
SKIP_CONTAINERS_ANNOTATION = "eks.amazonaws.com/skip-containers"

# Stdlib only (runs in the vLLM image). argv: mode (restore|save), timeout seconds per attempt
# (0 = none), attempts, pause seconds between attempts, then the command. restore: exit 0 whatever
# happened (a cold start). save: never exits (SIGTERM ends it; it is PID 1, which ignores signals
# without a handler).
RUNNER_SCRIPT = """\
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
mode, limit, attempts, pause = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
argv = sys.argv[5:]
for attempt in range(1, attempts + 1):
    try:
        rc = subprocess.run(argv, timeout=limit or None).returncode
    except subprocess.TimeoutExpired:
        rc = f"timeout after {limit:.0f} s"
    except OSError as exc:
        rc = str(exc)
    if rc == 0:
        break
    print(f"engine-cache {mode}: attempt {attempt}/{attempts} ended with {rc}", file=sys.stderr, flush=True)
    if attempt < attempts:
        time.sleep(pause)
if mode == "restore":
    sys.exit(0)
print(f"engine-cache {mode}: done; idle until the pod stops", flush=True)
while True:
    time.sleep(3600)
"""


def program_text(path: Path = PROGRAM_SOURCE) -> str:
    """The text of ``scripts/node/engine_cache.py`` as shipped in the ConfigMap.

    Raises:
        FileNotFoundError: the program is missing from the checkout.
    """
    return path.read_text()


def program_configmap_name(text: str | None = None) -> str:
    """Name of the ConfigMap carrying the program (ends in a hash of its text)."""
    return f"{PROGRAM_CONFIGMAP_PREFIX}-{spec_hash(text if text is not None else program_text())}"


def runner_argv(mode: str, argv: Any) -> Any:
    """``python3 -c RUNNER_SCRIPT`` around one core step's ``argv`` (a list, or an Output of one)."""
    if mode == "restore":
        head = ["python3", "-c", RUNNER_SCRIPT, "restore", str(RESTORE_TIMEOUT_SECONDS), "1", "0"]
    else:
        head = ["python3", "-c", RUNNER_SCRIPT, "save", "0", str(SAVE_ATTEMPTS), str(SAVE_RETRY_SECONDS)]
    return pulumi.Output.from_input(argv).apply(lambda a: [*head, *a]) if isinstance(argv, pulumi.Output) else [*head, *argv]


def _on_nvme(spec: DeploymentSpec, nvme_host_path: str) -> bool:
    volume, _ = serving_volume(spec, nvme_host_path)
    return "hostPath" in volume


def pod_key(spec: DeploymentSpec, command: VllmCommand) -> ec.EngineCacheKey:
    """The key of a pod's cache: the copy's key, per node (``$(LWS_WORKER_INDEX)``) on a copy
    spanning nodes."""
    key = ec.engine_cache_key(spec, command)
    return ec.node_key(key, WORKER_INDEX_REF) if len(command.roles) > 1 else key


def health_url(command: VllmCommand, role: VllmRole) -> str:
    """What a role's save waits for: ``http://127.0.0.1:<port>/health``; a headless worker's save
    puts the leader's address (``LWS_LEADER_ADDRESS``, read from its env) in place of the host."""
    del role  # the worker's host comes from its env (engine_cache.cache_steps), never from argv text
    return f"http://127.0.0.1:{command.port}/health"


@dataclass(frozen=True)
class EngineCachePods:
    """What one role's pod template gains.

    Attributes:
        key: the pod's key (may carry ``$(LWS_WORKER_INDEX)``).
        restore: the ``engine-cache-restore`` init container (after ``weight-sync``).
        save: the ``engine-cache-save`` native sidecar (``restartPolicy: Always``).
        volumes: pod volumes it adds (the program ConfigMap; the ``emptyDir`` off NVMe).
        vllm_mount: the key's directory, read-write at ``ENGINE_CACHE_CONTAINER_PATH`` in vLLM.
        vllm_env: ``engine_cache.vllm_cache_env()`` and the gate file (``engine_cache.GATE_ENV``).
        annotations: pod annotations (no AWS credentials in the vLLM container).
        budget_seconds: what the restore may add to a pod's start (``RESTORE_TIMEOUT_SECONDS``).
    """

    key: ec.EngineCacheKey
    restore: dict[str, Any]
    save: dict[str, Any]
    volumes: tuple[dict[str, Any], ...]
    vllm_mount: dict[str, Any]
    vllm_env: dict[str, str]
    annotations: dict[str, str]
    budget_seconds: int


def engine_cache_pods(
    spec: DeploymentSpec, command: VllmCommand, role: VllmRole, mirror_bucket: pulumi.Input[str] | None,
    nvme_host_path: str, program_configmap: str | None = None,
) -> EngineCachePods | None:
    """The restore, save and mounts of ``role``'s pods; None where the stack does not restore the
    caches (``engine_cache.restored_at_start``: aws-eks with a mirror here; aws-ec2 has its units)
    or has no bucket.

    ``mirror_bucket`` is the mirror's name (an Output from the AWS edge, or a str): the argv are
    the core's ``cache_steps`` for it. ``nvme_host_path``: the GPU nodes' NVMe RAID0 (the
    platform handle's ``GpuPlacement``); on NVMe the caches live there, else in an emptyDir.
    """
    if not ec.restored_at_start(spec) or mirror_bucket is None:
        return None
    key = pod_key(spec, command)
    copy_key = ec.engine_cache_key(spec, command)
    url = health_url(command, role)
    bucket = pulumi.Output.from_input(mirror_bucket)
    group = len(command.roles) > 1
    nodes = spec.nodes_per_copy if group else 1
    steps = bucket.apply(lambda b: ec.cache_steps(spec, b, copy_key, url, nodes, worker=not role.serves_http))
    restore_argv = runner_argv("restore", steps.apply(lambda s: list(s[0].argv)))
    save_argv = runner_argv("save", steps.apply(lambda s: [*s[1].argv, "--gate", GATE_FILE]))
    root = PurePosixPath(ec.ENGINE_CACHE_ROOT)
    directory = PurePosixPath(ec.cache_dir(key)).name
    volumes: list[dict[str, Any]] = [
        {"name": PROGRAM_VOLUME, "configMap": {"name": program_configmap or program_configmap_name(), "defaultMode": 0o444}},
    ]
    if _on_nvme(spec, nvme_host_path):
        # Its own directory on the node's NVMe (node_storage.node_dirs), not the weights' volume.
        volumes.append(nvme_engine_cache_volume(nvme_host_path))
    else:
        volumes.append({"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": EMPTY_DIR_SIZE}})
    cache_volume = CACHE_VOLUME
    cache_mount: dict[str, Any] = {"name": cache_volume, "mountPath": str(root)}
    sub = directory
    env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(root)}
    if spec.region:
        env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = spec.region
    if spec.config.storage.mirror.endpoint_url:
        env["AWS_ENDPOINT_URL_S3"] = spec.config.storage.mirror.endpoint_url
    mounts = [{"name": PROGRAM_VOLUME, "mountPath": PROGRAM_DIR, "readOnly": True}, cache_mount]

    def container(name: str, argv: Any, resources: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "image": command.image,
            "imagePullPolicy": "IfNotPresent",
            "command": k8s_argv(argv),
            "env": plain_env(env),
            "resources": resources,
            "volumeMounts": [dict(m) for m in mounts],
            "securityContext": hardened_container_security(),
        }

    restore = container(RESTORE_CONTAINER, restore_argv,
                        {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"cpu": helper_cpu_limit(spec), "memory": "8Gi"}})
    save = container(SAVE_CONTAINER, save_argv, {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                 "limits": {"cpu": SMALL_HELPER_CPU_LIMIT, "memory": "4Gi"}})
    save["restartPolicy"] = "Always"
    save["volumeMounts"].append({"name": GATE_VOLUME, "mountPath": GATE_DIR})
    volumes.append({"name": GATE_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": GATE_SIZE}})
    # $(VAR) in the path (the worker index) needs subPathExpr; a literal path stays subPath.
    vllm_mount = {"name": cache_volume, "mountPath": ec.ENGINE_CACHE_CONTAINER_PATH,
                  ("subPathExpr" if "$(" in sub else "subPath"): sub}
    # The stack binds the pods' AWS identity where it provisions AWS (EKS Pod Identity): keep it
    # out of the vLLM container.
    annotations = {SKIP_CONTAINERS_ANNOTATION: VLLM_CONTAINER} if spec.profile.provisions_aws else {}
    # The API guard of a serving role answers 503 until the gate exists (a pod IP reached past its
    # Service included); on a worker (no HTTP) it is unused.
    vllm_env = {**ec.vllm_cache_env(), ec.GATE_ENV: GATE_FILE}
    return EngineCachePods(key, restore, save, tuple(volumes), vllm_mount, vllm_env, annotations,
                           RESTORE_TIMEOUT_SECONDS)


def gated_readiness(probe: dict[str, Any]) -> dict[str, Any]:
    """``probe`` (an exec readiness probe) that fails until ``GATE_FILE`` exists, then runs as before."""
    command = probe["exec"]["command"]
    gated = k8s_argv(["python3", "-c", GATED_PROBE_SCRIPT, GATE_FILE])
    joined = command.apply(lambda items: [*gated, *items]) if isinstance(command, pulumi.Output) else [*gated, *command]
    return {**probe, "exec": {"command": joined}}


def engine_cache_budget_seconds(caches: dict[str, EngineCachePods] | None) -> int:
    """Seconds the restore may add to a pod's start (the longest of the roles'; 0 without)."""
    return max((c.budget_seconds for c in (caches or {}).values()), default=0)


def with_engine_cache(template: dict[str, Any], cache: EngineCachePods | None) -> dict[str, Any]:
    """``template`` (a pod template from ``vllm_service.pod_template``) with ``cache`` added: the
    restore after the existing init containers, then the save sidecar; the vLLM container's
    mount and env; the volumes; the annotations. Unchanged when ``cache`` is None."""
    if cache is None:
        return template
    meta = dict(template["metadata"])
    pod = dict(template["spec"])
    if cache.annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **cache.annotations}
    pod["initContainers"] = [*pod.get("initContainers", []), cache.restore, cache.save]
    containers = []
    for c in pod["containers"]:
        if c["name"] == VLLM_CONTAINER:
            c = {**c, "env": [*c.get("env", []), *plain_env(cache.vllm_env)],
                 "volumeMounts": [*c.get("volumeMounts", []), cache.vllm_mount,
                                  {"name": GATE_VOLUME, "mountPath": GATE_DIR, "readOnly": True}]}
            if "readinessProbe" in c:
                c["readinessProbe"] = gated_readiness(c["readinessProbe"])
        containers.append(c)
    pod["containers"] = containers
    have = {v["name"] for v in pod.get("volumes", [])}
    pod["volumes"] = [*pod.get("volumes", []), *(v for v in cache.volumes if v["name"] not in have)]
    return {"metadata": meta, "spec": pod}


def declare_engine_cache_program(
    spec: DeploymentSpec, provider: k8s.Provider, parent: pulumi.Resource, depends_on: list[pulumi.Resource],
) -> k8s.core.v1.ConfigMap | None:
    """The immutable ConfigMap carrying ``scripts/node/engine_cache.py`` where the pods restore the
    caches (``engine_cache.restored_at_start`` off aws-ec2), else None."""
    if not ec.restored_at_start(spec):
        return None
    text = program_text()
    meta: Any = metadata(spec, program_configmap_name(text), "engine-cache")  # a plain dict: the SDK accepts it
    return k8s.core.v1.ConfigMap(
        "engine-cache-program",
        metadata=meta,
        data={PROGRAM_KEY: text},
        immutable=True,
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on),
    )

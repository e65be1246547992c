"""Weight-sync Jobs: the ``scripts/node/weight_sync/`` package, as one deterministic zipapp
(``components/sync_artifact.py``), run in the pinned vLLM image, the program mounted from a
ConfigMap's ``binaryData`` (no extra image to build or push).

The runs are exactly ``components/core/weights.py`` ``sync_steps``: ``publish-mirror`` once (hub ->
S3 mirror, a Job), then ``node-copy``. For node-local NVMe, ``node-copy`` is NOT a Job: it is
the ``weight-sync`` init container of every vLLM pod (``node_copy_init``), so the copy runs on
whatever node the pod lands on, including nodes added or replaced after ``pulumi up`` (a Job
runs once, on the nodes of that day). Those pods run as the weight-sync service account (read
access to the mirror; the hub token only in the init container's env when it reads the hub).
For a shared claim (``pvc``) ``node-copy`` stays one Job and vLLM pods wait for its marker.

Job names end in a hash of the Job's spec (``common.spec_hash``): any change (image, revision,
bucket, program bytes) gives a new name, so Pulumi replaces the Job instead of failing on its
immutable pod template, and an unchanged, finished Job is left alone by every later ``up``
(no ``ttlSecondsAfterFinished``: a Job deleted by TTL would be recreated by the next ``up``).
Pulumi awaits each Job's completion within its sync budget; the vLLM workload depends on them.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.core import metrics
from components.core.config import DeploymentSpec
from components.core.naming import MIRROR_PUBLISH_SERVICE_ACCOUNT, WEIGHT_SYNC_SERVICE_ACCOUNT
from components.core.pod_security import SMALL_HELPER_CPU_LIMIT, helper_cpu_limit
from components.core.sizing import Sizing, sync_budget_seconds
from components.core.weights import (
    FSX_MOUNT_PATH,
    HUB_TOKEN_ENV,
    SHAPE_BUCKET,
    STAGING_DIR,
    SYNC_SCRIPT_PATH,
    WEIGHTS_MOUNT_PATH,
    SyncStep,
    per_node_copy_step,
    sync_steps,
)
from components.platform import GpuPlacement
from components.sync_artifact import ARCHIVE_PACKAGE, SYNC_PACKAGE_DIR, SyncArtifact, sync_artifact

from .common import (
    SYNC_PROGRAM_CONFIGMAP_PREFIX,
    Manifest,
    hardened_container_security,
    k8s_argv,
    labels,
    metadata,
    plain_env,
    secret_env,
    selector_labels,
    spec_hash,
)
from .storage import (
    FSX_VOLUME,
    STAGING_VOLUME,
    WEIGHTS_VOLUME,
    existing_claim_volume,
    fsx_volume,
    nvme_staging_volume,
    nvme_weights_volume,
)

# The sync package shipped into the Jobs as a zipapp (built at plan time, so its bytes are part of the plan).
SYNC_PROGRAM_SOURCE = SYNC_PACKAGE_DIR
SYNC_PROGRAM_KEY = Path(SYNC_SCRIPT_PATH).name
SYNC_PROGRAM_DIR = str(Path(SYNC_SCRIPT_PATH).parent)
# Retries of a failed sync container (it resumes from its journal) per completion.
SYNC_RETRIES_PER_COMPLETION = 6
# The node-local copy's init container in every vLLM pod (and the Jobs' container).
NODE_COPY_CONTAINER = "weight-sync"
# A stage on the EKS system nodes (cluster.SYSTEM_INSTANCE_TYPE m7i.xlarge: 4 vCPU, 16 GiB, a
# 100 GiB root that also holds the ~28.6 GB vLLM image): fewer files in flight, staged in an emptyDir
# of workers x the mean shard x 1.5 (real shards are within about +-15 % of the mean).
STAGE_SYSTEM_NODE_WORKERS = 3
STAGE_SHARD_HEADROOM = 1.5
STAGE_SYSTEM_NODE_RESOURCES = {"requests": {"cpu": "2", "memory": "6Gi"}, "limits": {"cpu": "4", "memory": "12Gi"}}
GIB = 1024**3


def stage_scratch_gib(spec: DeploymentSpec) -> int:
    """The emptyDir of a system-node stage publish, GiB: ``STAGE_SYSTEM_NODE_WORKERS`` x the mean
    file size x ``STAGE_SHARD_HEADROOM``, rounded up."""
    mean = spec.model.weights_bytes / spec.model.file_count
    return int(-(-STAGE_SYSTEM_NODE_WORKERS * mean * STAGE_SHARD_HEADROOM // GIB))


def with_workers(argv: list[str], workers: int) -> list[str]:
    """``argv`` with its ``--workers N`` set to ``workers``."""
    out = list(argv)
    out[out.index("--workers") + 1] = str(workers)
    return out


def sync_program_artifact() -> SyncArtifact:
    """The zipapp of ``scripts/node/weight_sync/`` as shipped in the ConfigMap (``binaryData``).

    Raises:
        FileNotFoundError: the package is missing from the checkout.
    """
    return sync_artifact()


def _volumes(
    spec: DeploymentSpec, step: SyncStep, program_configmap: str, nvme_host_path: str, system_nodes: bool = False
) -> tuple[list[dict], list[dict]]:
    volumes: list[dict[str, Any]] = [program_volume(program_configmap), {"name": "tmp", "emptyDir": {"sizeLimit": "16Gi"}}]
    mounts: list[dict[str, Any]] = [
        {"name": "sync-program", "mountPath": SYNC_PROGRAM_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    kind = spec.config.storage.kind
    if step.name == "publish-mirror" and system_nodes:
        # A stage on the system nodes (no NVMe there): a bounded emptyDir for its few files in flight.
        volumes.append({"name": STAGING_VOLUME, "emptyDir": {"sizeLimit": f"{stage_scratch_gib(spec)}Gi"}})
        mounts.append({"name": STAGING_VOLUME, "mountPath": STAGING_DIR})
    elif step.name == "publish-mirror":
        # The publish step stages hub files on the GPU node's NVMe (weights.STAGING_DIR): a
        # container's ephemeral storage on the root disk cannot hold the files in flight. Only its
        # own staging directory (node_storage.node_dirs), never the array or the weights.
        volumes.append(nvme_staging_volume(nvme_host_path))
        mounts.append({"name": STAGING_VOLUME, "mountPath": STAGING_DIR})
    elif kind == "pvc":
        volumes.append(existing_claim_volume(spec, read_only=False))
        mounts.append({"name": WEIGHTS_VOLUME, "mountPath": WEIGHTS_MOUNT_PATH})
    else:
        # The weight writer: the only container that mounts the weights read-write.
        volumes.append(nvme_weights_volume(nvme_host_path))
        mounts.append({"name": WEIGHTS_VOLUME, "mountPath": WEIGHTS_MOUNT_PATH})
    if step.needs_fsx:
        volumes.append(fsx_volume(read_only=True))
        mounts.append({"name": FSX_VOLUME, "mountPath": FSX_MOUNT_PATH, "readOnly": True})
    return volumes, mounts


def touches_mirror(step: SyncStep) -> bool:
    """Whether a sync step publishes to or reads the S3 mirror."""
    return step.source.startswith("s3://") or step.dest.startswith("s3://")


def mirror_region(spec: DeploymentSpec) -> str | None:
    """The mirror's AWS region: ``aws:region`` on the AWS platforms, ``storage.mirror.region`` on
    the kubernetes platform (config requires it there with a mirror)."""
    return spec.region or spec.config.storage.mirror.region


def mirror_credentials_env(spec: DeploymentSpec) -> list[dict[str, Any]]:
    """AWS credentials from ``kubernetes.mirrorCredentials.secret`` as env read through
    secretKeyRef (the values stay in the cluster's Secret); empty without one."""
    creds = spec.config.kubernetes.mirror_credentials
    if creds is None or creds.secret is None:
        return []
    secret = creds.secret
    keys = {"AWS_ACCESS_KEY_ID": secret.access_key_id_key, "AWS_SECRET_ACCESS_KEY": secret.secret_access_key_key,
            "AWS_SESSION_TOKEN": secret.session_token_key}
    return [{"name": env, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}}
            for env, key in keys.items() if key is not None]


def sync_service_account(spec: DeploymentSpec, step: SyncStep) -> str:
    """The service account a sync step's pod runs as: the mirror publisher's or the weight sync's,
    or ``kubernetes.mirrorCredentials.serviceAccountName`` for a step that touches the mirror."""
    creds = spec.config.kubernetes.mirror_credentials
    if creds is not None and creds.service_account_name and touches_mirror(step):
        return creds.service_account_name
    return MIRROR_PUBLISH_SERVICE_ACCOUNT if step.name == "publish-mirror" else WEIGHT_SYNC_SERVICE_ACCOUNT


def sync_metrics_ports() -> list[dict[str, Any]]:
    """The ``ports`` of a sync container: its progress ``/metrics`` (``metrics.SYNC_METRICS_PORT_NAME``),
    which the stack's PodMonitor scrapes while the copy runs."""
    return [{"name": metrics.SYNC_METRICS_PORT_NAME, "containerPort": metrics.SYNC_METRICS_PORT, "protocol": "TCP"}]


def _env(spec: DeploymentSpec, step: SyncStep, hub_token_set: bool) -> list[dict[str, Any]]:
    plain = {
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HF_HOME": "/tmp/hf-home",
        "MODELSCOPE_CACHE": "/tmp/modelscope",
        "HF_XET_HIGH_PERFORMANCE": "1",
        # Bytes moved on /metrics while the sync runs: the stall alert reads progress, not elapsed time.
        metrics.SYNC_METRICS_PORT_ENV: str(metrics.SYNC_METRICS_PORT),
    }
    region = mirror_region(spec) if (spec.region or touches_mirror(step)) else None
    if region:
        plain["AWS_REGION"] = region
        plain["AWS_DEFAULT_REGION"] = region
    if spec.config.storage.mirror.endpoint_url:
        plain["AWS_ENDPOINT_URL_S3"] = spec.config.storage.mirror.endpoint_url
    env = plain_env(plain)
    if touches_mirror(step):
        env += mirror_credentials_env(spec)
    if step.needs_hub_token and hub_token_set:
        env.append(secret_env(HUB_TOKEN_ENV[spec.model_source], spec.hub_token_key))
    return env


def job_spec(
    spec: DeploymentSpec, sizing: Sizing, image: str, step: SyncStep, argv: Any, program_configmap: str, hub_token_set: bool,
    placement: GpuPlacement, system_nodes: bool = False,
) -> Manifest:
    """The Job ``spec`` of one sync step (``argv`` may be an Output: it carries the bucket), on
    the GPU nodes of ``placement``; with ``system_nodes`` (a stage on aws-eks) ``placement`` is the
    system nodes', staging goes to an emptyDir and the requests fit a system node."""
    component = f"weight-sync-{step.name}"
    volumes, mounts = _volumes(spec, step, program_configmap, placement.nvme_host_path, system_nodes)
    budget = sync_budget_seconds(spec, sizing, step)
    completions = spec.gpu_nodes if step.per_node else 1
    pod_spec: dict[str, Any] = {
        "serviceAccountName": sync_service_account(spec, step),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # Retry in place: a node-local copy must resume on the node it belongs to.
        "restartPolicy": "OnFailure",
        "nodeSelector": placement.node_selector_dict(),
        "tolerations": placement.tolerations_list(),
        "securityContext": {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": NODE_COPY_CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": k8s_argv(argv),
                "env": _env(spec, step, hub_token_set),
                "ports": sync_metrics_ports(),
                "resources": _resources(spec, system_nodes),
                "volumeMounts": mounts,
                "securityContext": hardened_container_security(),
            }
        ],
        "volumes": volumes,
    }
    if step.per_node:
        pod_spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": selector_labels(spec, component)}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }
    job: dict[str, Any] = {
        "completions": completions,
        "parallelism": completions,
        "backoffLimit": SYNC_RETRIES_PER_COMPLETION * completions,
        "activeDeadlineSeconds": budget,
        "template": {"metadata": {"labels": labels(spec, component)}, "spec": pod_spec},
    }
    if step.per_node:
        job["completionMode"] = "Indexed"
    return job


def sync_resources(spec: DeploymentSpec) -> dict[str, Any]:
    """Requests and limits of a weight sync on a GPU node (the publish Job, the node-local copy):
    CPU limited to ``pod_security.helper_cpu_limit`` (half the node: vLLM is not running yet)."""
    return {"requests": {"cpu": "8", "memory": "16Gi"}, "limits": {"cpu": helper_cpu_limit(spec), "memory": "64Gi"}}


def _resources(spec: DeploymentSpec, system_nodes: bool) -> dict[str, Any]:
    if not system_nodes:
        return sync_resources(spec)
    scratch = f"{stage_scratch_gib(spec)}Gi"
    return {"requests": {**STAGE_SYSTEM_NODE_RESOURCES["requests"], "ephemeral-storage": scratch},
            "limits": {**STAGE_SYSTEM_NODE_RESOURCES["limits"], "ephemeral-storage": scratch}}


def step_argv(step: SyncStep) -> list[str]:
    """The container command of a sync step: exactly the core's argv (the EC2 path runs the same)."""
    return list(step.argv)


def sync_program_configmap_name(artifact: SyncArtifact | None = None) -> str:
    """Name of the ConfigMap that carries the sync program: ends in the first 10 hex digits of
    the zipapp's sha256 (a new program, a new immutable ConfigMap)."""
    return f"{SYNC_PROGRAM_CONFIGMAP_PREFIX}-{(artifact or sync_program_artifact()).sha256[:10]}"


def sync_program_annotations(artifact: SyncArtifact) -> dict[str, str]:
    """Annotations of the program ConfigMap: the zipapp's sha256 (hex) and size in bytes."""
    return {"kimi-deploy/sync-program-sha256": artifact.sha256, "kimi-deploy/sync-program-bytes": str(artifact.size_bytes)}


# The readiness gate of the zipapp (scripts/node/weight_sync/ready.py, imported out of the archive, whose
# package is ARCHIVE_PACKAGE): argv after it: the zipapp, the weights directory, the budget seconds.
READY_RUNNER = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    f"from {ARCHIVE_PACKAGE}.ready import main; sys.exit(main(sys.argv[2:]))"
)
READY_CONTAINER = "wait-for-weights"


def program_volume(configmap: str | None = None) -> dict[str, Any]:
    """The weight-sync program ConfigMap (``sync_program_configmap_name``) as a pod volume."""
    return {"name": "sync-program", "configMap": {"name": configmap or sync_program_configmap_name(), "defaultMode": 0o444}}


def weights_ready_init(
    image: str, weights_dir: str, volume_mount: dict[str, Any], budget_seconds: int
) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """The init container that holds a vLLM pod until ``weights_dir`` is a complete copy: its
    completion marker, its manifest and every file the manifest lists at its listed size
    (``scripts/node/weight_sync/ready.py``; on FSx fed by S3 import the marker can arrive before
    shards), for at most ``budget_seconds``, then a one-line reason.

    Args:
        image: the vLLM image (the program runs in it, from the zipapp's ConfigMap).
        weights_dir: the directory vLLM serves (container path).
        volume_mount: the read-only mount of the weights' volume.
        budget_seconds: how long to wait.

    Returns:
        ``(container, volumes)``: the init container and the pod volumes it adds (the program).
    """
    container = {
        "name": READY_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": k8s_argv(["python3", "-c", READY_RUNNER, SYNC_SCRIPT_PATH, weights_dir, str(budget_seconds)]),
        "env": plain_env({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"cpu": SMALL_HELPER_CPU_LIMIT, "memory": "256Mi"}},
        "volumeMounts": [dict(volume_mount), {"name": "sync-program", "mountPath": SYNC_PROGRAM_DIR, "readOnly": True}],
        "securityContext": hardened_container_security(),
    }
    return container, (program_volume(),)


@dataclass(frozen=True)
class NodeCopyInit:
    """The node-local copy as an init container of every vLLM pod (weights follow the node).

    Attributes:
        container: the ``weight-sync`` init container: the ``node-copy`` step's exact argv
            (``argv`` may be an Output carrying the bucket), its env and mounts; the weights
            volume is mounted read-write.
        volumes: pod volumes it needs besides the serving volume (program ConfigMap, /tmp, FSx).
        service_account: the pod's service account: the weight-sync one (mirror read access).
        budget_seconds: the step's sync budget (``sizing.sync_budget_seconds``): what a first
            copy may add to the pod's time to ready.
    """

    container: dict[str, Any]
    volumes: tuple[dict[str, Any], ...]
    service_account: str
    budget_seconds: int


def node_copy_init(
    spec: DeploymentSpec, sizing: Sizing, image: str, mirror_bucket: pulumi.Input[str] | None, hub_token_set: bool,
    nvme_host_path: str,
) -> NodeCopyInit | None:
    """The ``node-copy`` step as an init container, when that step runs per GPU node.

    Every vLLM pod runs the same resumable, verified sync onto its own node before vLLM starts,
    so a node that is added or replaced later (auto-repair, a capacity block scaled up, an AMI
    update) gets its copy with its first pod, with no Job to re-run; on a node whose copy is
    complete the sync finds the marker and manifest intact and exits in seconds. None for a
    shared claim (``pvc``: one Job) and ``fsx`` (no copy).
    """
    bucket = pulumi.Output.from_input(mirror_bucket) if mirror_bucket is not None else None
    found = per_node_copy_step(spec, bucket is not None)
    if found is None:
        return None
    index, step = found
    argv: Any = bucket.apply(lambda b: step_argv(sync_steps(spec, b)[index])) if bucket is not None else step_argv(step)
    volumes, mounts = _volumes(spec, step, sync_program_configmap_name(), nvme_host_path)
    container = {
        "name": NODE_COPY_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": k8s_argv(argv),
        "env": _env(spec, step, hub_token_set),
        "ports": sync_metrics_ports(),
        "resources": sync_resources(spec),
        "volumeMounts": mounts,
        "securityContext": hardened_container_security(),
    }
    extra = tuple(v for v in volumes if v["name"] != WEIGHTS_VOLUME)
    return NodeCopyInit(container, extra, sync_service_account(spec, step), sync_budget_seconds(spec, sizing, step))


def _step_argv_with_bucket(spec: DeploymentSpec, index: int, bucket: str, workers: int | None = None) -> list[str]:
    """The argv of ``sync_steps(spec, bucket)[index]`` (inside ``apply``: the bucket's real name),
    with ``--workers`` replaced when ``workers`` is given."""
    argv = step_argv(sync_steps(spec, bucket)[index])
    return with_workers(argv, workers) if workers is not None else argv


def _job_name(step_name: str, body: Any) -> str:
    """The Job's name: ``kimi-weights-<step>-<hash of its spec>`` (a changed spec is a new Job)."""
    return f"kimi-weights-{step_name}-{spec_hash(body)}"


def declare_weight_sync(
    spec: DeploymentSpec,
    sizing: Sizing,
    image: str,
    mirror_bucket: pulumi.Input[str] | None,
    hub_token_set: bool,
    tags: dict[str, Any],
    provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
    placement: GpuPlacement,
    program_out: list[pulumi.Resource] | None = None,
    stage_on_system_nodes: bool | None = None,
) -> list[k8s.batch.v1.Job]:
    """The sync program ConfigMap and one Job per ``sync_steps`` entry, each after the previous,
    except a per-node ``node-copy`` (an init container of the vLLM pods: ``node_copy_init``).
    ``program_out``, when given, receives the ConfigMap (the vLLM pods depend on it).

    ``mirror_bucket`` is the mirror bucket's name (the handle's, an Output) or None; the Jobs run
    on the GPU nodes of ``placement`` (the handle's). The
    step list only depends on whether a bucket is given, so it is computed with a stand-in and
    each Job's argv is recomputed from the real name by the same ``sync_steps``.

    ``stage_on_system_nodes`` (``phase: stage``): None in serve; else only the ``publish-mirror``
    Job is declared, on ``placement`` (the system nodes' when True, with ``STAGE_SYSTEM_NODE_WORKERS``
    files in flight and an emptyDir for staging; the GPU nodes' when False, requesting no GPU).
    """
    artifact = sync_program_artifact()
    cm_name = sync_program_configmap_name(artifact)
    # What is shipped, readable without decoding it: the zipapp's full sha256 and size.
    meta = metadata(spec, cm_name, "weight-sync", annotations=sync_program_annotations(artifact))
    configmap = k8s.core.v1.ConfigMap(
        "weight-sync-program",
        metadata=meta,
        binary_data={SYNC_PROGRAM_KEY: base64.b64encode(artifact.data).decode("ascii")},
        immutable=True,
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on),
    )
    if program_out is not None:
        program_out.append(configmap)  # the vLLM pods' node-copy init container mounts it too
    bucket = pulumi.Output.from_input(mirror_bucket) if mirror_bucket is not None else None
    steps = sync_steps(spec, SHAPE_BUCKET if bucket is not None else None)
    jobs: list[k8s.batch.v1.Job] = []
    previous: list[pulumi.Resource] = [configmap, *depends_on]
    staging = stage_on_system_nodes is not None
    system_nodes = bool(stage_on_system_nodes)
    workers = STAGE_SYSTEM_NODE_WORKERS if system_nodes else None
    for index, step in enumerate(steps):
        if step.name == "node-copy" and step.per_node:
            continue  # an init container of every vLLM pod (node_copy_init), not a Job
        if staging and step.name != "publish-mirror":
            continue  # a stage fills the mirror only
        if bucket is not None:
            argv: Any = bucket.apply(functools.partial(_step_argv_with_bucket, spec, index, workers=workers))
        else:
            argv = step_argv(step)
        body = job_spec(spec, sizing, image, step, argv, cm_name, hub_token_set, placement, system_nodes)
        name = pulumi.Output.from_input(body).apply(functools.partial(_job_name, step.name))
        budget = sync_budget_seconds(spec, sizing, step)
        meta = metadata(
            spec, "", f"weight-sync-{step.name}", tags,
            # A Job that failed is replaced (re-run) by the next `up` instead of awaited again.
            annotations={"pulumi.com/replaceUnready": "true"},
        )
        meta["name"] = name
        # job_spec builds the API's camelCase manifest (typed Manifest = Any), which pulumi's serializer passes
        # through unchanged (pulumi/runtime/rpc.py: `py_name_to_pulumi_name.get(k) or k`); the schema tests validate it.
        job = k8s.batch.v1.Job(
            f"weight-sync-{step.name}",
            metadata=meta,
            spec=body,
            opts=pulumi.ResourceOptions(
                parent=parent,
                provider=provider,
                depends_on=previous,
                custom_timeouts=pulumi.CustomTimeouts(create=f"{budget}s", update=f"{budget}s"),
            ),
        )
        jobs.append(job)
        previous = [job]
    return jobs

"""The vLLM workload and its front: a Deployment (single-node copy) or a LeaderWorkerSet (a copy
spanning nodes), the GB300 ComputeDomain, Service, PodDisruptionBudget, NetworkPolicy and
Prometheus scraping.

Startup: an init container copies the weights onto the node, or (a claim filled by another step:
FSx by S3 import, a Job) waits until the copy is complete: marker, manifest and every listed file
at its size (``weight_sync.weights_ready_init``); a startup probe on ``/health``
whose budget (``failureThreshold`` x ``periodSeconds``) is at least the sizing's startup budget;
liveness on ``/health`` only starts after it, so it cannot kill a server that is still loading.
Readiness proves the model is served: vLLM guards ``/v1/*`` with the API key (its
``AuthenticationMiddleware`` exempts only paths outside ``/v1``, ``/v2``, ``/inference``,
``/cohere``), so the readiness probe is an exec that reads ``VLLM_API_KEY`` from the container's
env (filled through ``secretKeyRef``) and checks ``/v1/models`` lists the served model name.

Pulumi waits for the workload with custom timeouts (per pod: the startup budget plus the image
pull budget; a rolling update replaces one copy at a time, so updates get one budget per copy)
and the Deployment's ``progressDeadlineSeconds`` matches, so neither Pulumi's default 10 minutes
nor the controller's default 600 s deadline fails a 1.5 TB load.

The Service depends on the workload and carries the same custom timeouts (plus a load balancer
provisioning budget for an internal NLB): Pulumi's Service await waits for ready endpoints (and,
for ``LoadBalancer``, an ingress address), so ``pulumi up`` reports the Service ready only when
the model is served behind it.

Disruptions: rolling updates replace one copy at a time with no surge (``maxSurge: 0``,
``maxUnavailable: 1``, Deployment and LeaderWorkerSet alike): the GPU node group cannot grow past
its reserved nodes, so a surge copy could never schedule. The PodDisruptionBudget allows one
vLLM pod to be evicted at a time and always allows evicting pods that are not ready. With one
copy (``replicas: 1``) that permits draining its node: a single copy cannot stay available
through a node replacement anyway, and a budget of 0 would make every managed node-group update
fail with ``PodEvictionFailure``.
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.core import metrics
from components.core.config import DeploymentSpec
from components.core.controller_objects import (
    LWS_GROUP_KEY_LABEL,
    LWS_LEADER_WORKER_INDEX,
    LWS_SET_NAME_LABEL,
    LWS_WORKER_INDEX_LABEL,
)
from components.core.crd_rules import replace_on_changes as crd_replace_on_changes
from components.core.naming import VLLM_CLIENT_SERVICE, VLLM_SERVICE_ACCOUNT
from components.core.pod_security import vllm_capabilities, vllm_memory_limit_gib, vllm_seccomp_profile
from components.core.scaling import autoscaling_enabled, max_replicas
from components.core.scraping import ANNOTATIONS, POD_MONITOR, scrape_path
from components.core.sizing import Sizing
from components.core.targets import NVLINK_CLIQUE_LABEL
from components.core.time_to_ready import ENGINE_TIMEOUT_MARGIN_SECONDS, pod_ready_budget
from components.core.vllm import API_GUARD_CONTAINER_DIR, API_GUARD_FILENAME, API_GUARD_SOURCE, VllmCommand, VllmRole
from components.core.weights import SHAPE_BUCKET, sync_steps
from components.platform import GpuPlacement, ServiceAccess

from .common import (
    COMPUTE_DOMAIN_CLAIM,
    COMPUTE_DOMAIN_CLAIM_TEMPLATE,
    COMPUTE_DOMAIN_NAME,
    HTTP_PORT_NAME,
    VLLM_NAME,
    k8s_argv,
    labels,
    metadata,
    plain_env,
    secret_env,
    selector_labels,
    spans_nvlink_domain,
    spec_hash,
)
from .engine_cache import EngineCachePods, with_engine_cache
from .storage import serving_volume
from .weight_sync import NodeCopyInit, weights_ready_init

# Time for the cloud provider to provision an internal NLB and publish its hostname, added to
# the Service's timeouts when it is a LoadBalancer.
LOAD_BALANCER_BUDGET_SECONDS = 900
# Probe timing (seconds).
STARTUP_PERIOD_SECONDS = 10
PROBE_TIMEOUT_SECONDS = 5
READINESS_PERIOD_SECONDS = 15
READINESS_FAILURE_THRESHOLD = 4
LIVENESS_PERIOD_SECONDS = 20
# Six misses in a row (2 minutes): a busy engine answers /health between batches long before.
LIVENESS_FAILURE_THRESHOLD = 6
# /dev/shm for NCCL/RCCL and vLLM's shared-memory message queues between workers.
SHM_SIZE = "64Gi"
# The readiness gate waits at least this long for a complete copy (the Jobs normally finished before).
MIN_MARKER_WAIT_SECONDS = 1_800

# Stdlib only. argv: port, served model name. The key comes from the env (secretKeyRef).
READINESS_SCRIPT = """\
import json, os, sys, urllib.request
port, name = sys.argv[1], sys.argv[2]
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                             headers={"Authorization": "Bearer " + os.environ["VLLM_API_KEY"]})
with urllib.request.urlopen(req, timeout=4) as resp:
    ids = {m.get("id") for m in json.load(resp).get("data", [])}
sys.exit(0 if name in ids else 1)
"""


def per_pod_budget_seconds(spec: DeploymentSpec, sizing: Sizing) -> int:
    """Seconds one vLLM pod may take from creation to ready: the time-to-ready model's pod phases
    (a wait for a node, the image pull, the init containers' node-local copy and cache restore,
    vLLM's load and start), each at its budget (``time_to_ready.pod_ready_budget``). The
    Deployment's progress deadline, Pulumi's timeouts and the startup alerts use this one number."""
    return pod_ready_budget(spec, sizing).budget_seconds


def rollout_timeouts(spec: DeploymentSpec, sizing: Sizing) -> tuple[int, int]:
    """``(create_seconds, update_seconds)`` for Pulumi's custom timeouts: copies start together
    on create; a rolling update replaces one copy at a time (``maxUnavailable: 1``)."""
    per_pod = per_pod_budget_seconds(spec, sizing)
    return per_pod, per_pod * max_replicas(spec)


def startup_probe(port: int, sizing: Sizing) -> dict[str, Any]:
    """``/health`` until the engine is up; ``failureThreshold x periodSeconds`` >= the startup budget
    (= ``VLLM_ENGINE_READY_TIMEOUT_S``) + ``ENGINE_TIMEOUT_MARGIN_SECONDS``: vLLM's timeout fires first."""
    return {
        "httpGet": {"path": "/health", "port": port},
        "periodSeconds": STARTUP_PERIOD_SECONDS,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
        "failureThreshold": math.ceil((sizing.startup_budget_seconds + ENGINE_TIMEOUT_MARGIN_SECONDS) / STARTUP_PERIOD_SECONDS),
    }


def readiness_probe(port: int, served_model_name: str) -> dict[str, Any]:
    """Ready only when ``/v1/models`` (authenticated) lists the served model."""
    return {
        "exec": {"command": k8s_argv(["python3", "-c", READINESS_SCRIPT, str(port), served_model_name])},
        "periodSeconds": READINESS_PERIOD_SECONDS,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS + 5,
        "failureThreshold": READINESS_FAILURE_THRESHOLD,
    }


def liveness_probe(port: int) -> dict[str, Any]:
    """``/health`` (unauthenticated); runs only after the startup probe succeeded."""
    return {
        "httpGet": {"path": "/health", "port": port},
        "periodSeconds": LIVENESS_PERIOD_SECONDS,
        "timeoutSeconds": PROBE_TIMEOUT_SECONDS,
        "failureThreshold": LIVENESS_FAILURE_THRESHOLD,
    }


# The API guard (components/core/vllm.py API_GUARD_*): its module from an immutable ConfigMap whose
# name ends in a hash of the text (a change rolls the pods), mounted read-only where PYTHONPATH points.
API_GUARD_CONFIGMAP_PREFIX = "kimi-vllm-api-guard"
API_GUARD_VOLUME = "api-guard"


def api_guard_text() -> str:
    """The text of ``scripts/node/kimi_vllm_api_guard.py`` as shipped in the ConfigMap."""
    return API_GUARD_SOURCE.read_text()


def api_guard_configmap_name(text: str | None = None) -> str:
    """Name of the ConfigMap carrying the API guard (ends in a hash of its text)."""
    return f"{API_GUARD_CONFIGMAP_PREFIX}-{spec_hash(text if text is not None else api_guard_text())}"


def role_component(role: VllmRole) -> str:
    """``app.kubernetes.io/component`` of a role's pods (``server``, ``leader``, ``worker``)."""
    return role.name


def serving_components(command: VllmCommand) -> list[str]:
    """Components of the pods that answer the OpenAI API."""
    return [role_component(r) for r in command.roles if r.serves_http]


def pod_template(
    spec: DeploymentSpec, sizing: Sizing, command: VllmCommand, role: VllmRole, marker_wait_seconds: int,
    scrape_annotations: bool, placement: GpuPlacement, node_copy: NodeCopyInit | None = None,
    engine_cache: dict[str, EngineCachePods] | None = None,
) -> dict[str, Any]:
    """The pod template of ``role``: the node-local weight copy (``node_copy``, an init
    container running the sync onto the pod's own node) or else a marker wait, the vLLM
    container, GPUs, EFA, ComputeDomain claim, /dev/shm, scheduling on the GPU nodes of
    ``placement`` (the platform handle's); secrets only through ``secretKeyRef``; the engine
    caches' restore and save (``engine_cache``, by role name: ``engine_cache.with_engine_cache``)."""
    volume, mount_path = serving_volume(spec, placement.nvme_host_path)
    target, instance = spec.target, spec.instance
    gpus = str(target.gpus_per_node)
    requests: dict[str, str] = {
        target.gpu_resource_name: gpus,
        "cpu": str(instance.vcpus // 2),
        "memory": f"{instance.memory_gib // 2}Gi",
    }
    # No CPU limit: one vLLM pod owns the node (pod_security.CHECKOV_ALLOWED says why). Memory is
    # limited below the node's, so a runaway host allocation ends vLLM, not the node's agents.
    limits: dict[str, str] = {target.gpu_resource_name: gpus, "memory": f"{vllm_memory_limit_gib(spec)}Gi"}
    efa_in_pod = spec.profile.efa_to_pods and spec.efa_enabled
    if efa_in_pod:
        efa = str(instance.efa_interfaces)
        requests["vpc.amazonaws.com/efa"] = efa
        limits["vpc.amazonaws.com/efa"] = efa
    resources: dict[str, Any] = {"requests": requests, "limits": limits}
    use_compute_domain = spans_nvlink_domain(spec)
    if use_compute_domain:
        resources["claims"] = [{"name": COMPUTE_DOMAIN_CLAIM}]
    env = plain_env(role.env) + [secret_env(name, key) for name, key in sorted(role.secret_env.items())]
    container: dict[str, Any] = {
        "name": "vllm",
        "image": command.image,
        "imagePullPolicy": "IfNotPresent",
        "command": k8s_argv(role.argv, role.references),
        "env": env,
        "resources": resources,
        "volumeMounts": [
            {"name": volume["name"], "mountPath": mount_path, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        # components/core/pod_security.py: no privilege escalation, every capability dropped (IPC_LOCK
        # back with EFA); root and a writable root file system are its written exceptions.
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": vllm_capabilities(efa_in_pod)},
    }
    volumes = [volume, {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}]
    if role.serves_http:
        container["volumeMounts"].append({"name": API_GUARD_VOLUME, "mountPath": API_GUARD_CONTAINER_DIR, "readOnly": True})
        guard_file = {"key": API_GUARD_FILENAME, "path": API_GUARD_FILENAME}
        volumes.append({"name": API_GUARD_VOLUME,
                        "configMap": {"name": api_guard_configmap_name(), "defaultMode": 0o444, "items": [guard_file]}})
        container["ports"] = [{"name": HTTP_PORT_NAME, "containerPort": command.port, "protocol": "TCP"}]
        container["startupProbe"] = startup_probe(command.port, sizing)
        container["readinessProbe"] = readiness_probe(command.port, command.served_model_names[0])
        container["livenessProbe"] = liveness_probe(command.port)
    if node_copy is not None:
        init = node_copy.container
        volumes += list(node_copy.volumes)
    else:
        # A claim another step fills (fsx: the S3 import; pvc: the node-copy Job): ready only when
        # every listed file is there, not when the marker is.
        init, extra = weights_ready_init(
            command.image, command.model_path, {"name": volume["name"], "mountPath": mount_path, "readOnly": True},
            marker_wait_seconds,
        )
        volumes += list(extra)
    pod: dict[str, Any] = {
        "serviceAccountName": node_copy.service_account if node_copy is not None else VLLM_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        # Service links would inject *_PORT variables; vLLM reads VLLM_PORT from the env.
        "enableServiceLinks": False,
        # The vLLM container's profile (RuntimeDefault; Unconfined on ROCm); the helper containers
        # set RuntimeDefault on their own.
        "securityContext": {"seccompProfile": {"type": vllm_seccomp_profile(spec)}},
        "terminationGracePeriodSeconds": 60,
        "nodeSelector": placement.node_selector_dict(),
        "tolerations": placement.tolerations_list(),
        "initContainers": [init],
        "containers": [container],
        "volumes": volumes,
    }
    if use_compute_domain:
        pod["resourceClaims"] = [{"name": COMPUTE_DOMAIN_CLAIM, "resourceClaimTemplateName": COMPUTE_DOMAIN_CLAIM_TEMPLATE}]
        pod["affinity"] = nvlink_clique_affinity()
    meta: dict[str, Any] = {"labels": labels(spec, role_component(role))}
    if scrape_annotations and role.serves_http:
        meta["annotations"] = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(command.port),
            "prometheus.io/path": "/metrics",
        }
    return with_engine_cache({"metadata": meta, "spec": pod}, (engine_cache or {}).get(role.name))


def nvlink_clique_affinity() -> dict[str, Any]:
    """Pod affinity that keeps every pod of a LeaderWorkerSet group in one NVLink clique: required,
    on ``nvidia.com/gpu.clique`` (``targets.NVLINK_CLIQUE_LABEL``, GPU Feature Discovery), towards
    the pods of this set (``leaderworkerset.sigs.k8s.io/name``) with the pod's own group key
    (``matchLabelKeys: [leaderworkerset.sigs.k8s.io/group-key]``: the API server merges the
    incoming pod's value into the selector, Kubernetes KEP-3633, GA in 1.33; the clusters here are
    1.34 or newer). Same terms in the leader and the worker template.

    What the scheduler does with it (kube-scheduler interpodaffinity ``satisfyPodAffinity``): a
    node without the clique label is never chosen; the group's first pod (no scheduled pod
    matches yet) goes to any labelled node, since it matches its own term; every later pod of the
    group only to a node whose clique equals that pod's. Groups share cliques (several copies per
    NVL72 rack).

    Why not LWS's ``leaderworkerset.sigs.k8s.io/exclusive-topology`` annotation (kubernetes-sigs/lws
    v0.9.0): its webhook gives the leader a required affinity to its group and a required
    anti-affinity to every other group on the topology key (pkg/webhooks/pod_webhook.go
    ``SetExclusiveAffinities``), and the pod controller pins the workers to the leader's value by a
    node selector once the leader is scheduled (pkg/controllers/pod_controller.go
    ``setNodeSelectorForWorkerPods``). That is one group per clique: an 18-node NVL72 rack would
    hold one 2-node copy and strand 16 nodes, and ``replicas`` above the number of cliques would
    never schedule. The subgroup variant (``subgroup-exclusive-topology``) is exclusive the same
    way.

    The ComputeDomain does not place pods: its channel claim is allocatable on every node the DRA
    kubelet plugin serves, the plugin reads the node's clique ID from NVML, and the IMEX daemons of
    one ComputeDomain form one IMEX domain per clique (NVIDIA/k8s-dra-driver-gpu v25.12.0,
    cmd/compute-domain-kubelet-plugin/device_state.go ``getCliqueID``; ComputeDomainClique objects
    named ``<domain uid>.<clique id>``). A group split over two cliques would get two IMEX domains
    and no NVLink between its halves; this affinity is what keeps it in one, and the stack's one
    ComputeDomain then holds one IMEX domain per clique its copies use.
    """
    term = {
        "labelSelector": {"matchExpressions": [{"key": LWS_SET_NAME_LABEL, "operator": "In", "values": [VLLM_NAME]}]},
        "matchLabelKeys": [LWS_GROUP_KEY_LABEL],
        "topologyKey": NVLINK_CLIQUE_LABEL,
    }
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


# ComputeDomain.spec.numNodes: deprecated, and with the DRA driver's default feature gate
# IMEXDaemonsWithDNSNames=true "recommended to be set to zero" (the CRD's own description,
# resource.nvidia.com_computedomains.yaml, driver 25.12): IMEX daemons start at once and the
# workload keeps its own count of peers (vLLM's torch.distributed rendezvous waits for every
# rank before NCCL shares GPU memory over MNNVL). A non-zero value would only drive Status.
COMPUTE_DOMAIN_NUM_NODES = 0
# The ComputeDomain API the pinned DRA driver serves (scripts/dev/crds.py).
COMPUTE_DOMAIN_API_VERSION = "resource.nvidia.com/v1beta1"


def compute_domain_spec(spec: DeploymentSpec) -> dict[str, Any]:
    """The ComputeDomain (NVIDIA DRA driver) every GB300 vLLM pod joins through its channel
    claim, with ``numNodes: 0`` (``COMPUTE_DOMAIN_NUM_NODES``)."""
    return {"numNodes": COMPUTE_DOMAIN_NUM_NODES, "channel": {"resourceClaimTemplate": {"name": COMPUTE_DOMAIN_CLAIM_TEMPLATE}}}


def deployment_spec(
    spec: DeploymentSpec, sizing: Sizing, command: VllmCommand, marker_wait_seconds: int, scrape: bool,
    placement: GpuPlacement, node_copy: NodeCopyInit | None = None,
    engine_cache: dict[str, EngineCachePods] | None = None,
) -> dict[str, Any]:
    """Deployment spec of a single-node copy: ``replicas`` copies, one at a time on update
    (``maxSurge: 0``: the GPU nodes are all in use, a surge pod could never schedule)."""
    role = command.role("server")
    return {
        "replicas": spec.replicas,
        "selector": {"matchLabels": selector_labels(spec, role_component(role))},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "progressDeadlineSeconds": per_pod_budget_seconds(spec, sizing),
        "revisionHistoryLimit": 3,
        "template": pod_template(
            spec, sizing, command, role, marker_wait_seconds, scrape, placement, node_copy, engine_cache
        ),
    }


def leaderworkerset_spec(
    spec: DeploymentSpec, sizing: Sizing, command: VllmCommand, marker_wait_seconds: int, scrape: bool,
    placement: GpuPlacement, node_copy: NodeCopyInit | None = None,
    engine_cache: dict[str, EngineCachePods] | None = None,
) -> dict[str, Any]:
    """LeaderWorkerSet spec of a copy spanning ``nodes_per_copy`` nodes: group size = nodes,
    leader and worker commands from the core builder, the whole group recreated when a pod restarts."""
    leader, worker = command.role("leader"), command.role("worker")
    return {
        "replicas": spec.replicas,
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
        "leaderWorkerTemplate": {
            "size": leader.nodes + worker.nodes,
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": pod_template(
                spec, sizing, command, leader, marker_wait_seconds, scrape, placement, node_copy, engine_cache
            ),
            "workerTemplate": pod_template(
                spec, sizing, command, worker, marker_wait_seconds, scrape, placement, node_copy, engine_cache
            ),
        },
    }


# Tags the controller puts on the load balancer it creates for a LoadBalancer Service (honoured
# by EKS's built-in AWS cloud provider service controller and by the AWS Load Balancer
# Controller; comma-separated key=value). The sweeper finds the NLB by them.
LB_ADDITIONAL_TAGS_ANNOTATION = "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags"


def load_balancer_tags(spec: DeploymentSpec) -> str:
    """The stack's tags (``DeploymentSpec.tags``) in the annotation's ``k1=v1,k2=v2`` form.

    Raises:
        ValueError: a tag key or value holds ``,`` or ``=`` (the annotation could not carry it).
    """
    pairs = []
    for key, value in spec.tags.items():
        if any(c in f"{key}{value}" for c in ",="):
            raise ValueError(f"tag {key}={value} cannot be written into {LB_ADDITIONAL_TAGS_ANNOTATION}")
        pairs.append(f"{key}={value}")
    return ",".join(pairs)


def client_service_selector(spec: DeploymentSpec, command: VllmCommand) -> dict[str, str]:
    """The client Service's selector: the pods that serve the API. A copy spanning nodes serves
    from its leader only (``VllmRole.serves_http``; the workers run ``--headless``), so the
    selector is the leader's component label plus the LeaderWorkerSet's own leader mark
    (``worker-index: "0"``, which its controller puts on every leader pod and on no worker:
    ``controller_objects.LWS_WORKER_INDEX_LABEL``)."""
    selector = selector_labels(spec, serving_components(command)[0])
    if len(command.roles) > 1:
        selector[LWS_WORKER_INDEX_LABEL] = LWS_LEADER_WORKER_INDEX
    return selector


def service_spec(spec: DeploymentSpec, command: VllmCommand) -> tuple[dict[str, Any], dict[str, str]]:
    """Service spec and extra annotations: ClusterIP, or an internal NLB (in-tree AWS cloud
    provider annotations) limited to the allowed CIDRs, client IPs preserved; it selects only
    the serving pods (``client_service_selector``)."""
    body: dict[str, Any] = {
        "selector": client_service_selector(spec, command),
        "ports": [{"name": HTTP_PORT_NAME, "port": command.port, "targetPort": HTTP_PORT_NAME, "protocol": "TCP"}],
    }
    notes: dict[str, str] = {}
    if spec.config.kubernetes.service_type == "internal-nlb":
        body["type"] = "LoadBalancer"
        body["externalTrafficPolicy"] = "Local"
        ranges = list(dict.fromkeys(spec.config.network.allowed_cidrs + spec.config.kubernetes.allowed_cidrs))
        if ranges:
            body["loadBalancerSourceRanges"] = ranges
        notes = {
            "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
            "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
            LB_ADDITIONAL_TAGS_ANNOTATION: load_balancer_tags(spec),
        }
    else:
        body["type"] = "ClusterIP"
    return body, notes


def _vllm_pods_selector(spec: DeploymentSpec, components: list[str]) -> dict[str, Any]:
    return {
        "matchLabels": {k: v for k, v in selector_labels(spec, "").items() if k != "app.kubernetes.io/component"},
        "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In", "values": components}],
    }


def pdb_spec(spec: DeploymentSpec, command: VllmCommand) -> dict[str, Any]:
    """At most one vLLM pod voluntarily evicted at a time; pods that are not ready (a copy that
    is still loading, or a LeaderWorkerSet group being recreated) may always be evicted.

    With several copies this keeps the others serving while one node is drained. With one copy
    it deliberately does not block: a single copy cannot stay available through a node
    replacement (the GPU node group has no spare node to move to), and ``maxUnavailable: 0``
    would block every drain forever, so managed node-group updates would fail with
    ``PodEvictionFailure``. Without ``AlwaysAllow``, the recreated pods of a multi-node group
    (running, not yet ready) would exhaust the budget and block the drain of the next node.
    """
    return {
        "maxUnavailable": 1,
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": _vllm_pods_selector(spec, [role_component(r) for r in command.roles]),
    }


def client_ip_blocks(client_cidrs: tuple[str, ...], cluster_cidrs: tuple[str, ...]) -> list[dict[str, Any]]:
    """NetworkPolicy ``ipBlock`` peers admitting ``client_cidrs`` but never an address of the
    cluster's own nodes and pods (``cluster_cidrs``).

    A NetworkPolicy ipBlock matches pod addresses too (on EKS pods take VPC addresses from the node
    subnets: vpc-cni), so a client block such as 10.0.0.0/8 would admit every pod of the cluster
    and make the namespace restriction meaningless. Each cluster range inside a client block becomes
    one of its ``except`` entries (the API requires them to lie within ``cidr``); a client block
    that lies wholly inside a cluster range is left out (it could only ever admit cluster pods,
    which the namespace and pod selectors govern). Ranges of another IP version do not interact.

    Raises:
        ValueError: a value is not a CIDR block (config validation rejects those first).
    """
    cluster = [ipaddress.ip_network(c, strict=False) for c in cluster_cidrs]
    blocks: list[dict[str, Any]] = []
    for cidr in client_cidrs:
        net = ipaddress.ip_network(cidr, strict=False)
        same_version = [c for c in cluster if c.version == net.version]
        if any(net.subnet_of(c) for c in same_version):  # type: ignore[arg-type]  # same IP version
            continue
        inside = sorted({c for c in same_version if c.subnet_of(net)})  # type: ignore[arg-type]  # same IP version
        blocks.append({"ipBlock": {"cidr": cidr, **({"except": [str(c) for c in inside]} if inside else {})}})
    return blocks


def network_policy_spec(
    spec: DeploymentSpec, command: VllmCommand, client_cidrs: tuple[str, ...], cluster_cidrs: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Ingress to vLLM pods: the API port from the configured namespaces and CIDRs only (the
    CIDRs minus the cluster's own ranges, ``client_ip_blocks``); all ports between the pods of a
    multi-node group (torch.distributed and NCCL); the scrape of ``/metrics`` from the Prometheus
    pods of ``observability.prometheusNamespace``.

    vLLM 0.33.0 and 0.34.0 serve ``/metrics`` on the API port (``entrypoints/serve/instrumentator/metrics.py``
    mounts it on the API app; the arg parser has no separate metrics port) and a NetworkPolicy
    cannot filter by path. The narrowest rule: the serving pods' API port only, only from pods
    labelled ``observability.prometheusPodLabels`` in that namespace (namespace AND pod selector
    in one peer). The API itself stays closed to them: every ``/v1`` route needs the API key
    (vLLM's AuthenticationMiddleware), which Prometheus does not have; ``/metrics`` and
    ``/health`` are the unauthenticated paths it can read. ``client_cidrs``: the platform
    handle's ``ServiceAccess.client_cidrs``; ``cluster_cidrs``: its ``cluster_cidrs`` (resolved)."""
    k8s_cfg = spec.config.kubernetes
    peers: list[dict[str, Any]] = []
    if k8s_cfg.allowed_namespaces:
        peers.append({"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(k8s_cfg.allowed_namespaces)}
        ]}})
    peers += client_ip_blocks(client_cidrs, cluster_cidrs)
    rules: list[dict[str, Any]] = []
    if peers:
        rules.append({"from": peers, "ports": [{"protocol": "TCP", "port": command.port}]})
    roles = [role_component(r) for r in command.roles]
    if len(command.roles) > 1:
        rules.append({"from": [{"podSelector": _vllm_pods_selector(spec, roles)}]})
    rules += metrics_scrape_rules(spec, command)
    return {
        "podSelector": _vllm_pods_selector(spec, roles),
        "policyTypes": ["Ingress"],
        "ingress": rules,
    }


def metrics_scrape_rules(spec: DeploymentSpec, command: VllmCommand) -> list[dict[str, Any]]:
    """The NetworkPolicy rule admitting Prometheus to the metrics (API) port and the weight sync's
    progress port (``metrics.SYNC_METRICS_PORT``, served by the ``weight-sync`` init container while
    it copies), or none when ``observability.prometheusNamespace`` is unset (see ``network_policy_spec``)."""
    obs = spec.config.observability
    if not obs.prometheus_namespace:
        return []
    peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": obs.prometheus_namespace}},
        "podSelector": {"matchLabels": dict(sorted(obs.prometheus_pod_labels.items()))},
    }
    ports = [{"protocol": "TCP", "port": command.port}, {"protocol": "TCP", "port": metrics.SYNC_METRICS_PORT}]
    return [{"from": [peer], "ports": ports}]


def pod_monitor_spec(spec: DeploymentSpec, command: VllmCommand) -> dict[str, Any]:
    """PodMonitor (Prometheus Operator) of the serving pods' ``/metrics`` and of the weight sync's
    progress (``metrics.SYNC_METRICS_PORT_NAME``: the ``weight-sync`` init container of every vLLM
    pod, workers included, and the sync Jobs' pods). An endpoint yields a target only where a
    container declares its port name, so the API port is scraped on the serving pods alone, and a
    sync's only while it runs (the stall alert reads it)."""
    steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    jobs = [f"weight-sync-{s.name}" for s in steps]
    return {
        "selector": _vllm_pods_selector(spec, [role_component(r) for r in command.roles] + jobs),
        "podMetricsEndpoints": [
            {"port": HTTP_PORT_NAME, "path": "/metrics", "interval": "30s"},
            {"port": metrics.SYNC_METRICS_PORT_NAME, "path": "/metrics", "interval": "30s"},
        ],
    }


def replicas_owned_by_scaler(spec: DeploymentSpec) -> list[str]:
    """``ignore_changes`` of the workload: ``spec.replicas`` when an autoscaler owns it (the
    manifest's count is only the first one), else nothing."""
    return ["spec.replicas"] if autoscaling_enabled(spec) else []


def service_timeouts(spec: DeploymentSpec, sizing: Sizing) -> tuple[int, int]:
    """``(create_seconds, update_seconds)`` of the Service: the workload's rollout timeouts, plus
    the load balancer provisioning budget for an internal NLB."""
    create_s, update_s = rollout_timeouts(spec, sizing)
    extra = LOAD_BALANCER_BUDGET_SECONDS if spec.config.kubernetes.service_type == "internal-nlb" else 0
    return create_s + extra, update_s + extra


def _network_policy(spec: DeploymentSpec, command: VllmCommand, access: ServiceAccess) -> Any:
    """``network_policy_spec`` for the handle's access: a plain manifest when the cluster ranges are
    known now (a new VPC, config), else an Output of it (an existing VPC's subnets, looked up)."""
    if all(isinstance(c, str) for c in access.cluster_cidrs):
        return network_policy_spec(spec, command, access.client_cidrs, tuple(str(c) for c in access.cluster_cidrs))
    return pulumi.Output.all(*access.cluster_cidrs).apply(
        lambda cidrs: network_policy_spec(spec, command, access.client_cidrs, tuple(cidrs))
    )


def declare_vllm(
    spec: DeploymentSpec,
    sizing: Sizing,
    command: VllmCommand,
    tags: dict[str, Any],
    marker_wait_seconds: int,
    provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
    lws_release: pulumi.Resource | None,
    dra_release: pulumi.Resource | None,
    placement: GpuPlacement,
    access: ServiceAccess,
    node_copy: NodeCopyInit | None = None,
    engine_cache: dict[str, EngineCachePods] | None = None,
) -> dict[str, pulumi.Resource]:
    """Declare the workload, ComputeDomain, Service, PDB, NetworkPolicy and scraping, on the GPU
    nodes of ``placement`` with the client CIDRs of ``access`` (the platform handle's).

    Returns logical role -> resource (``workload``, ``service``, ...).
    """
    def opts(*extra: pulumi.Resource | None, **kw: Any) -> pulumi.ResourceOptions:
        deps = [*depends_on, *(e for e in extra if e is not None)]
        return pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=deps, **kw)

    out: dict[str, pulumi.Resource] = {}
    # PodMonitor for a Prometheus Operator, annotations only for a Prometheus that reads them, else neither.
    scrape = scrape_path(spec)
    create_s, update_s = rollout_timeouts(spec, sizing)
    timeouts = pulumi.CustomTimeouts(create=f"{create_s}s", update=f"{update_s}s")
    multi_node = len(command.roles) > 1
    guard = api_guard_text()
    out["api_guard"] = k8s.core.v1.ConfigMap(
        "vllm-api-guard",
        metadata=metadata(spec, api_guard_configmap_name(guard), "api-guard"),
        data={API_GUARD_FILENAME: guard},
        immutable=True,
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on),
    )
    if spec.target.needs_compute_domain and multi_node:
        out["compute_domain"] = k8s.apiextensions.CustomResource(
            "vllm-compute-domain",
            api_version=COMPUTE_DOMAIN_API_VERSION,
            kind="ComputeDomain",
            metadata=metadata(spec, COMPUTE_DOMAIN_NAME, "compute-domain", tags),
            spec=compute_domain_spec(spec),
            # The spec is immutable (its CRD's rule `self == oldSelf`, components/core/crd_rules.py)
            # and pulumi-kubernetes patches a custom resource in place: replace_on_changes makes a
            # change a replacement, deleted first since the name stays.
            opts=opts(
                dra_release, delete_before_replace=True,
                replace_on_changes=crd_replace_on_changes(COMPUTE_DOMAIN_API_VERSION, "ComputeDomain"),
            ),
        )
    if multi_node:
        out["workload"] = k8s.apiextensions.CustomResource(
            "vllm-leaderworkerset",
            api_version="leaderworkerset.x-k8s.io/v1",
            kind="LeaderWorkerSet",
            metadata=metadata(spec, VLLM_NAME, "leader", tags, annotations={"pulumi.com/waitFor": "condition=Available"}),
            spec=leaderworkerset_spec(
                spec, sizing, command, marker_wait_seconds, scrape == ANNOTATIONS, placement, node_copy,
                engine_cache,
            ),
            opts=opts(
                lws_release, out.get("compute_domain"), out["api_guard"], custom_timeouts=timeouts,
                ignore_changes=replicas_owned_by_scaler(spec),
            ),
        )
    else:
        # deployment_spec, service_spec, pdb_spec and network_policy_spec build the API's camelCase
        # manifest, which pulumi's serializer passes through unchanged (pulumi/runtime/rpc.py:
        # `py_name_to_pulumi_name.get(k) or k`); the schema tests validate it.
        out["workload"] = k8s.apps.v1.Deployment(
            "vllm-deployment",
            metadata=metadata(spec, VLLM_NAME, "server", tags),
            spec=deployment_spec(
                spec, sizing, command, marker_wait_seconds, scrape == ANNOTATIONS, placement, node_copy,
                engine_cache,
            ),
            opts=opts(out["api_guard"], custom_timeouts=timeouts, ignore_changes=replicas_owned_by_scaler(spec)),
        )
    body, notes = service_spec(spec, command)
    # Pulumi's Service await waits until its endpoints are ready (and a LoadBalancer has an
    # ingress address), 10 minutes by default: far less than a 1.5 TB load. The Service depends
    # on the workload (created only after the workload's await saw ready pods) and gets the
    # workload's timeouts (plus the NLB provisioning budget), so its await still holds when the
    # pods are reloading (a replaced Service, a restarted copy). Not ``pulumi.com/skipAwait``:
    # that would report "ready" with no ready endpoint and no NLB hostname
    # (the ``loadBalancerHostname`` output reads the Service's status).
    svc_create_s, svc_update_s = service_timeouts(spec, sizing)
    out["service"] = k8s.core.v1.Service(
        "vllm-service",
        # Its own name: the LeaderWorkerSet controller creates a headless Service named VLLM_NAME.
        metadata=metadata(spec, VLLM_CLIENT_SERVICE, serving_components(command)[0], tags, annotations=notes),
        spec=body,
        opts=opts(out["workload"], custom_timeouts=pulumi.CustomTimeouts(create=f"{svc_create_s}s", update=f"{svc_update_s}s")),
    )
    out["pdb"] = k8s.policy.v1.PodDisruptionBudget(
        "vllm-pdb",
        metadata=metadata(spec, VLLM_NAME, "disruption-budget"),
        spec=pdb_spec(spec, command),
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on),
    )
    out["network_policy"] = k8s.networking.v1.NetworkPolicy(
        "vllm-network-policy",
        metadata=metadata(spec, VLLM_NAME, "network-policy"),
        spec=_network_policy(spec, command, access),
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on),
    )
    if scrape == POD_MONITOR:
        out["pod_monitor"] = k8s.apiextensions.CustomResource(
            "vllm-pod-monitor",
            api_version="monitoring.coreos.com/v1",
            kind="PodMonitor",
            metadata={
                **metadata(spec, VLLM_NAME, "metrics"),
                "labels": {**labels(spec, "metrics"), **spec.config.observability.monitor_labels},
            },
            spec=pod_monitor_spec(spec, command),
            opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on),
        )
    return out

"""Shared pieces of the Kubernetes edge: names, labels, scheduling, secret references.

Pure functions over the spec (no resources are created here), so every manifest builder and
the tests read the same names. Label values must be valid Kubernetes label values; the
deployment tags (whose keys contain ``:`` and whose ``expires-at`` may be an Output) go into
annotations instead.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from components.core.config import DeploymentSpec
from components.core.naming import GPU_NODE_LABEL, GPU_TAINT_KEY, TARGET_NODE_LABEL, VLLM_WORKLOAD_NAME
from components.core.versions import VLLM_VERSION
from components.core.vllm import LEADER_ADDRESS_ENV, WORKER_INDEX_ENV
from components.platform import GpuPlacement, ServiceAccess

if TYPE_CHECKING:  # typing only: this module creates no resources and imports no Pulumi at run time
    from pulumi_kubernetes.meta.v1 import ObjectMetaArgsDict

# app.kubernetes.io/name of every workload object, and the part-of value.
APP_NAME = "kimi-vllm"
PART_OF = "kimi-deploy"
# Object names (in the configured namespace). VLLM_NAME: the workload (Deployment or
# LeaderWorkerSet), its PDB, NetworkPolicy, scaler and monitors; the client Service has its own
# (naming.VLLM_CLIENT_SERVICE), since the LeaderWorkerSet controller takes VLLM_NAME for its Service.
VLLM_NAME = VLLM_WORKLOAD_NAME
API_KEY_SECRET = "kimi-vllm-api-key"
API_KEY_SECRET_KEY = "api-key"
HUB_TOKEN_SECRET = "kimi-hub-token"
HUB_TOKEN_SECRET_KEY = "token"
SYNC_PROGRAM_CONFIGMAP_PREFIX = "kimi-weight-sync"
COMPUTE_DOMAIN_NAME = "kimi-vllm-imex"
COMPUTE_DOMAIN_CLAIM_TEMPLATE = "kimi-vllm-imex-channel"
# Name of the pod-level resource claim (and the container's claim reference) on GB300.
COMPUTE_DOMAIN_CLAIM = "compute-domain-channel"
FSX_PV_NAME_PREFIX = "kimi-weights-fsx"
FSX_CLAIM_NAME = "kimi-weights-fsx"
# Value the AWS edge gives GPU_NODE_LABEL on GPU node groups.
GPU_NODE_LABEL_VALUE = "true"
# Port name of the OpenAI API on vLLM pods and the Service.
HTTP_PORT_NAME = "http"

# Secret config key -> (Secret name, key in the Secret).
SECRET_REFS: Mapping[str, tuple[str, str]] = {
    "apiKey": (API_KEY_SECRET, API_KEY_SECRET_KEY),
    "hfToken": (HUB_TOKEN_SECRET, HUB_TOKEN_SECRET_KEY),
    "modelscopeToken": (HUB_TOKEN_SECRET, HUB_TOKEN_SECRET_KEY),
}

# A Kubernetes document as the API spells it (camelCase keys). The SDK's ``*ArgsDict`` TypedDicts
# spell keys in snake_case, so a manifest cannot be typed as one: it is passed as Any.
Manifest = Any

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """``text`` as a valid label value: ``[A-Za-z0-9._-]``, at most 63 characters, starting and
    ending with an alphanumeric (``kimi-deploy:stack`` -> ``kimi-deploy-stack``)."""
    value = _LABEL_VALUE_BAD.sub("-", text)[:63]
    return value.strip("-._")


def dns_name(text: str, max_length: int = 63) -> str:
    """``text`` as a lowercase DNS-1123 label (object names): ``[a-z0-9-]``, alphanumeric ends."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower())[:max_length].strip("-")


def labels(spec: DeploymentSpec, component: str) -> dict[str, str]:
    """Recommended ``app.kubernetes.io/*`` labels plus target/environment/owner for ``component``."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": label_value(spec.stack),
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": "pulumi",
        "app.kubernetes.io/version": label_value(VLLM_VERSION),
        "kimi-deploy/target": label_value(spec.target.name),
        "kimi-deploy/environment": label_value(spec.environment),
        "kimi-deploy/owner": label_value(spec.owner),
    }


def selector_labels(spec: DeploymentSpec, component: str) -> dict[str, str]:
    """The stable subset of ``labels`` used in selectors (never changes on a version bump)."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": label_value(spec.stack),
        "app.kubernetes.io/component": component,
    }


def tag_annotations(tags: Mapping[str, Any]) -> dict[str, Any]:
    """Deployment tags as annotations: ``kimi-deploy:stack`` -> ``kimi-deploy/stack``; values
    (possibly Outputs, such as ``expires-at``) unchanged."""
    out: dict[str, Any] = {}
    for key, value in tags.items():
        prefix, sep, name = key.partition(":")
        out[f"{prefix}/{name}" if sep else f"kimi-deploy/{key}"] = value
    return out


def metadata(spec: DeploymentSpec, name: str, component: str, tags: Mapping[str, Any] | None = None,
             annotations: Mapping[str, Any] | None = None, namespaced: bool = True) -> ObjectMetaArgsDict:
    """Object metadata: name, namespace, labels and annotations (tags first, then ``annotations``).
    A plain dict typed as the SDK's ``ObjectMetaArgsDict`` (these four keys are spelled the same
    in the API and in Python)."""
    meta: ObjectMetaArgsDict = {"name": name, "labels": labels(spec, component)}
    if namespaced:
        meta["namespace"] = spec.config.kubernetes.namespace
    notes = {**tag_annotations(tags or {}), **(annotations or {})}
    if notes:
        meta["annotations"] = notes
    return meta


def nvme_host_path(spec: DeploymentSpec) -> str:
    """Host path of the GPU nodes' NVMe RAID0: the platform's own mount
    (``PlatformProfile.nvme_host_path``: nodeadm's on EKS), else ``kubernetes.nvmeHostPath``."""
    return spec.profile.nvme_host_path or spec.config.kubernetes.nvme_host_path


def gpu_node_selector(spec: DeploymentSpec) -> dict[str, str]:
    """Node selector of every pod that must run on the GPU nodes (vLLM, node-local weight sync).

    Where the stack labels its GPU node groups (``PlatformProfile.labels_gpu_nodes``: EKS) the
    labels the AWS edge puts on them; every platform: the CPU architecture (arm64 on Grace) and
    ``kubernetes.nodeSelector`` from config.
    """
    arch = "arm64" if spec.instance.cpu_architecture == "arm64" else "amd64"
    selector = {"kubernetes.io/arch": arch}
    if spec.profile.labels_gpu_nodes:
        selector[GPU_NODE_LABEL] = GPU_NODE_LABEL_VALUE
        selector[TARGET_NODE_LABEL] = spec.target.name
    selector.update(spec.config.kubernetes.node_selector)
    return selector


def gpu_tolerations(spec: DeploymentSpec) -> list[dict[str, Any]]:
    """Tolerations of pods on GPU nodes: our GPU taint and the vendor's resource taint where the
    stack taints its GPU node groups (``PlatformProfile.labels_gpu_nodes``: EKS), then
    ``kubernetes.tolerations`` from config (duplicates removed, order kept)."""
    out: list[dict[str, Any]] = []
    if spec.profile.labels_gpu_nodes:
        out.append({"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
        out.append({"key": spec.target.gpu_resource_name, "operator": "Exists", "effect": "NoSchedule"})
    for tol in spec.config.kubernetes.tolerations:
        if dict(tol) not in out:
            out.append(dict(tol))
    return out


def gpu_placement(spec: DeploymentSpec) -> GpuPlacement:
    """``gpu_node_selector``, ``gpu_tolerations`` and ``nvme_host_path`` of ``spec`` as the
    handle's ``GpuPlacement`` (each platform module builds its handle with it)."""
    return GpuPlacement(
        node_selector=MappingProxyType(gpu_node_selector(spec)),
        tolerations=tuple(MappingProxyType(t) for t in gpu_tolerations(spec)),
        nvme_host_path=nvme_host_path(spec),
    )


def spans_nvlink_domain(spec: DeploymentSpec) -> bool:
    """``DeploymentSpec.spans_nvlink_domain``: the copy's pods join a ComputeDomain, and its group
    must stay in one NVLink clique (``vllm_service.nvlink_clique_affinity``), which needs GPU
    Feature Discovery's clique labels (``addons.addon_values``, ``nvidia-device-plugin``)."""
    return spec.spans_nvlink_domain


def service_access(spec: DeploymentSpec, cluster_cidrs: tuple[Any, ...] | None = None) -> ServiceAccess:
    """``ServiceAccess`` of ``spec``: ``kubernetes.serviceType``, and the API's client CIDRs:
    ``kubernetes.allowedCidrs`` then, where the stack provisions the AWS network
    (``PlatformProfile.provisions_aws``), ``network.allowedCidrs`` (duplicates removed, order kept);
    the cluster's own address ranges: ``cluster_cidrs`` (the AWS edge's node subnets) or else
    ``kubernetes.clusterCidrs``."""
    k8s_cfg, net = spec.config.kubernetes, spec.config.network
    network_cidrs = net.allowed_cidrs if spec.profile.provisions_aws else ()
    return ServiceAccess(
        service_type=k8s_cfg.service_type,
        client_cidrs=tuple(dict.fromkeys(k8s_cfg.allowed_cidrs + network_cidrs)),
        cluster_cidrs=tuple(cluster_cidrs) if cluster_cidrs is not None else tuple(k8s_cfg.cluster_cidrs),
    )


def secret_env(name: str, config_key: str) -> dict[str, Any]:
    """An env var filled from the Secret holding ``config_key`` (only ever through secretKeyRef)."""
    secret_name, key = SECRET_REFS[config_key]
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": key}}}


# The only $(VAR) names the program references in a container (LeaderWorkerSet injects both into
# every pod of a group; components/core/vllm.py), and only where it put them: ``k8s_argv``'s
# ``references``, the engine cache's subPathExpr. Every "$" elsewhere is literal.
K8S_VAR_NAMES: tuple[str, ...] = (LEADER_ADDRESS_ENV, WORKER_INDEX_ENV)


def k8s_literal(text: str) -> str:
    """``text`` as the kubelet must receive it to run it unchanged: every ``$`` doubled.

    The kubelet expands ``$(VAR)`` in a container's command, args and env values (and an exec
    probe's command) from the container's env, and reduces ``$$`` to ``$`` (Kubernetes API
    reference, Container ``args``: "Variable references $(VAR_NAME) are expanded using the
    container's environment [...] Double $$ are reduced to a single $, which allows for escaping the
    $(VAR_NAME) syntax"; third_party/forked/golang/expansion/expand.go). Doubling every ``$`` is
    the exact inverse, so a literal ``$(VLLM_API_KEY)`` or ``$(LWS_LEADER_ADDRESS)`` in extraArgs
    or a chat template stays text. The program's own references are never text passed here: they
    are items a builder marked (``k8s_argv``'s ``references``).
    """
    return text.replace("$", "$$")


def k8s_argv(argv: Any, references: Collection[int] = ()) -> Any:
    """A container's or exec probe's ``command`` (a list of str, or a Pulumi Output of one) with
    every item through ``k8s_literal`` but the items at ``references`` (positions the builder
    wrote as a ``$(VAR)`` reference, ``VllmRole.references``), which go as they are: the one
    place an argv becomes a container spec.

    Raises:
        ValueError: an item at ``references`` is not a single ``$(NAME)`` of ``K8S_VAR_NAMES``.
    """
    def render(items: Any) -> list[str]:
        out = []
        for i, item in enumerate(items):
            text = str(item)
            if i in references:
                if text not in {f"$({n})" for n in K8S_VAR_NAMES}:
                    raise ValueError(f"argv item {i} ({text!r}) is not one of the program's references")
                out.append(text)
            else:
                out.append(k8s_literal(text))
        return out

    if isinstance(argv, (list, tuple)):
        return render(argv)
    return argv.apply(render)


def plain_env(env: Mapping[str, str]) -> list[dict[str, str]]:
    """Plain env vars in a stable order, each value through ``k8s_literal`` (the kubelet expands them too)."""
    return [{"name": k, "value": k8s_literal(str(v))} for k, v in sorted(env.items())]


def spec_hash(document: Any, length: int = 10) -> str:
    """Short sha256 of a JSON-serializable document (keys sorted): names that change with a spec."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def hardened_container_security() -> dict[str, Any]:
    """Security context for helper containers (weight sync, marker wait): no privilege
    escalation, no capabilities, read-only root file system, the runtime's seccomp profile.
    They run as root because they write the node's root-owned NVMe mount."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }

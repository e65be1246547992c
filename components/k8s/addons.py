"""Cluster add-ons as pinned Helm releases: only those the target needs and the cluster lacks.

The FSx CSI driver is the AWS edge's (EKS managed add-on), since FSx exists only on EKS.
Which add-ons a deployment needs is a pure function of the spec (``required_addons``); config's
``kubernetes.installedAddons`` removes those already on the cluster (an operator that provides
an add-on, e.g. the AMD GPU Operator, counts as installing it). Chart versions live in
``components/core/versions.py`` (``HELM_CHARTS``).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.core.config import DeploymentSpec
from components.core.naming import GPU_NODE_LABEL
from components.core.versions import ADDON_EQUIVALENTS, HELM_CHARTS
from components.platform import GpuPlacement

from .common import gpu_placement, spans_nvlink_domain


def required_addons(spec: DeploymentSpec) -> tuple[str, ...]:
    """Add-ons the deployment needs on its cluster, in install order (names of ``HELM_CHARTS``).

    - ``nvidia-device-plugin`` / ``amd-device-plugin``: the GPU resource of the target's vendor;
    - ``efa-device-plugin``: EFA on EKS GPU nodes;
    - ``nvidia-dra-driver``: a ComputeDomain for multi-node NVLink (GB300);
    - ``lws``: a model copy spans more than one node.
    """
    needed: list[str] = []
    needed.append("amd-device-plugin" if spec.target.gpu.vendor == "amd" else "nvidia-device-plugin")
    if spec.profile.efa_to_pods and spec.efa_enabled:
        needed.append("efa-device-plugin")
    if spans_nvlink_domain(spec):
        needed.append("nvidia-dra-driver")
    if spec.nodes_per_copy > 1:
        needed.append("lws")
    needed += scaling_addons(spec)
    return tuple(needed)


def scaling_addons(spec: DeploymentSpec) -> list[str]:
    """Add-ons of autoscaling and observability (``components/k8s/autoscaling.py``,
    ``observability.py``): ``keda`` for a KEDA-scaled stack; the GPU vendor's metrics exporter
    (``dcgm-exporter`` or ``amd-metrics-exporter``) when a Prometheus or Grafana namespace is
    configured and ``observability.gpuExporter`` is true."""
    from components.core.metrics import gpu_exporter_for

    out: list[str] = []
    asc, obs = spec.config.autoscaling, spec.config.observability
    if asc.enabled and asc.controller == "keda":
        out.append("keda")
    if asc.enabled and spec.profile.cluster_autoscaler:
        # GPU nodes follow the replicas (its Pod Identity role: components/aws/node_autoscaler.py).
        out.append("cluster-autoscaler")
    if obs.gpu_exporter and (obs.prometheus_namespace or obs.grafana_namespace):
        out.append(gpu_exporter_for(spec.target.gpu.vendor))
    return out


def installed_addons(spec: DeploymentSpec) -> frozenset[str]:
    """Add-ons config says are on the cluster, with those an installed operator provides."""
    installed = set(spec.config.kubernetes.installed_addons)
    for name in list(installed):
        installed.update(ADDON_EQUIVALENTS.get(name, ()))
    return frozenset(installed)


def addons_to_install(spec: DeploymentSpec) -> tuple[str, ...]:
    """``required_addons`` minus ``installed_addons``, in install order."""
    installed = installed_addons(spec)
    return tuple(name for name in required_addons(spec) if name not in installed)


def _gpu_node_affinity(placement: GpuPlacement) -> dict[str, Any]:
    """Required node affinity to the GPU nodes (charts merge maps but replace lists, so the
    chart's NFD-label terms are replaced, not extended)."""
    terms = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(placement.node_selector.items())]
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": terms}]}}
    }


def nvidia_device_plugin_values(spec: DeploymentSpec, placement: GpuPlacement) -> dict[str, Any]:
    """Values of the ``nvidia-device-plugin`` chart (NVIDIA/k8s-device-plugin 0.18.0,
    deployments/helm/nvidia-device-plugin/values.yaml): the device plugin on the GPU nodes of
    ``placement`` and, where a copy spans an NVLink domain (``common.spans_nvlink_domain``), GPU
    Feature Discovery with its Node Feature Discovery subchart, so the GPU nodes carry
    ``nvidia.com/gpu.clique`` (``targets.NVLINK_CLIQUE_LABEL``) for the group's placement.

    How the labels reach a node, at the pinned chart: GFD's DaemonSet (``gfd.enabled``, shares the
    device plugin's ``affinity`` and ``tolerations``) writes its labels to a file in the host's
    ``/etc/kubernetes/node-feature-discovery/features.d`` (templates/daemonset-gfd.yml); the NFD
    worker on the same node reads that directory and the NFD master applies the labels
    (node-feature-discovery chart 0.17.3, templates/worker.yaml; the device plugin chart sets the
    master's ``extraLabelNs: ["nvidia.com"]``). The subchart's condition is
    ``nfd.enabled,gfd.enabled`` (Chart.yaml; Helm takes the first path that is set), so
    ``nfd.enabled`` must follow ``gfd.enabled``: GFD without NFD labels nothing. The NFD worker's
    chart tolerations name a taint ``nvidia.com/gpu=present`` that our GPU nodes do not carry, so it
    gets the GPU nodes' own tolerations and node selector; the NFD master and its garbage collector
    run on the system nodes (chart default: no tolerations).
    """
    tolerations = placement.tolerations_list()
    labels = spans_nvlink_domain(spec)
    values: dict[str, Any] = {
        # The EKS NVIDIA AMI has no NFD labels: select the GPU nodes by our labels instead.
        "affinity": _gpu_node_affinity(placement),
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, *tolerations],
        "gfd": {"enabled": labels},
        "nfd": {"enabled": labels},
    }
    if labels:
        values["nfd"]["worker"] = {"tolerations": tolerations, "nodeSelector": placement.node_selector_dict()}
    return values


def addon_values(spec: DeploymentSpec, name: str, placement: GpuPlacement | None = None) -> dict[str, Any]:
    """Helm values of add-on ``name`` for ``spec``, its GPU pods placed by ``placement`` (the
    platform handle's; default ``common.gpu_placement(spec)``, the same value the platform
    modules put in their handles).

    Raises:
        KeyError: unknown add-on.
    """
    placement = placement if placement is not None else gpu_placement(spec)
    tolerations = placement.tolerations_list()
    if name == "nvidia-device-plugin":
        return nvidia_device_plugin_values(spec, placement)
    if name == "efa-device-plugin":
        return {
            # The chart's own instance list predates P6/P6e: name ours.
            "supportedInstanceLabels": {"keys": ["node.kubernetes.io/instance-type"], "values": [spec.instance.instance_type]},
            "tolerations": tolerations,
        }
    if name == "nvidia-dra-driver":
        return {
            "nvidiaDriverRoot": "/",  # host-installed driver on the EKS NVIDIA AMI
            # GPUs stay with the device plugin (nvidia.com/gpu); DRA provides ComputeDomains only.
            "resources": {"gpus": {"enabled": False}, "computeDomains": {"enabled": True}},
            # EKS shows no control-plane nodes: run the controller on the non-GPU nodes.
            "controller": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": GPU_NODE_LABEL, "operator": "DoesNotExist"}]}]
                        }
                    }
                }
            },
            "kubeletPlugin": {"affinity": _gpu_node_affinity(placement), "tolerations": tolerations},
        }
    if name == "amd-device-plugin":
        return {
            "nfd": {"enabled": False},
            "labeller": {"enabled": False},
            "node_selector_enabled": True,
            "node_selector": placement.node_selector_dict(),
            "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, *tolerations],
        }
    if name == "lws":
        return {}
    if name == "keda":
        return {}
    if name == "cluster-autoscaler":
        from components.aws.common import resource_prefix  # the EKS cluster's name (aws edge)
        from components.core.config import eks_version_of
        from components.core.naming import CLUSTER_AUTOSCALER_SERVICE_ACCOUNT
        from components.core.versions import cluster_autoscaler_image_tag

        return {
            "cloudProvider": "aws",
            "awsRegion": spec.region,
            "autoDiscovery": {"clusterName": resource_prefix(spec.project, spec.stack)},
            "image": {"tag": cluster_autoscaler_image_tag(eks_version_of(spec.config))},
            "rbac": {"serviceAccount": {"create": True, "name": CLUSTER_AUTOSCALER_SERVICE_ACCOUNT}},
            "extraArgs": {
                # GPU nodes hold their weight copy on local NVMe (hostPath): still removable when empty.
                "skip-nodes-with-local-storage": False,
                "balance-similar-node-groups": True,
                "expander": "least-waste",
            },
        }
    service_monitor = "prometheus-operator" in spec.config.kubernetes.installed_addons
    monitor_labels = spec.config.observability.monitor_labels
    if name == "dcgm-exporter":
        return {
            "affinity": _gpu_node_affinity(placement),
            "tolerations": tolerations,
            # honorLabels keeps the exporter's namespace/pod labels (the pod holding the GPU).
            "serviceMonitor": {"enabled": service_monitor, "honorLabels": True, "additionalLabels": dict(monitor_labels)},
        }
    if name == "amd-metrics-exporter":
        return {
            "nodeSelector": placement.node_selector_dict(),
            "tolerations": tolerations,
            "serviceMonitor": {"enabled": service_monitor, "honorLabels": True, "labels": dict(monitor_labels)},
        }
    raise KeyError(name)


def declare_addons(
    spec: DeploymentSpec, placement: GpuPlacement, provider: k8s.Provider, parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
) -> dict[str, k8s.helm.v3.Release]:
    """Declare a Helm release per add-on to install (GPU pods placed by ``placement``, the
    platform handle's); returns add-on name -> release."""
    releases: dict[str, k8s.helm.v3.Release] = {}
    for name in addons_to_install(spec):
        chart = HELM_CHARTS[name]
        repo = k8s.helm.v3.RepositoryOptsArgs(repo=chart.repository) if chart.repository else None
        releases[name] = k8s.helm.v3.Release(
            f"addon-{name}",
            name=name,
            chart=chart.chart,
            version=chart.version,
            repository_opts=repo,
            namespace=chart.namespace,
            create_namespace=True,
            values=addon_values(spec, name, placement),
            atomic=True,
            cleanup_on_fail=True,
            timeout=900,
            opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on),
        )
    return releases


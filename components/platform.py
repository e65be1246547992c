"""The platform seam: what a platform module hands the program and the Kubernetes edge.

Each platform's declare function (``components/program.py``, ``PLATFORM_DECLARERS``) returns a
``PlatformResult``: its stack outputs and, on a platform whose workloads run on Kubernetes
(``PlatformProfile.runs_kubernetes``), a ``KubernetesPlatformHandle``. The Kubernetes edge
(``components/k8s``, ``declare_workloads(ctx, handle)``) reads only the handle for what differs
by platform (provider, GPU placement, weight paths, mirror, FSx, service access, Pod Identity),
never the AWS edge's result or the platform's name:

- ``aws-eks``: ``components/aws/__init__.py`` ``declare_aws`` builds it from the EKS cluster it
  creates (its provider, its labelled and tainted GPU node groups, the S3 mirror, FSx, the
  Pod Identity roles);
- ``kubernetes``: ``components/k8s/existing_cluster.py`` builds it from ``kimi-deploy:kubeconfig``
  and ``kubernetes.*`` config;
- ``aws-ec2``: no handle (vLLM runs under systemd on the instance).

The pure facts behind these values are ``components/core/platforms.py`` (``PlatformProfile``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.core.platforms import PlatformProfile


@dataclass(frozen=True)
class FsxVolumeSource:
    """The FSx for Lustre file system a static PersistentVolume points at (from the AWS edge).

    Attributes:
        file_system_id: ``fs-...`` (the CSI ``volumeHandle``).
        dns_name: the file system's DNS name (the ``dnsname`` volume attribute).
        mount_name: the Lustre mount name (the ``mountname`` volume attribute).
        capacity_gib: the file system's capacity (the static volume's size), GiB.
    """

    file_system_id: pulumi.Input[str]
    dns_name: pulumi.Input[str]
    mount_name: pulumi.Input[str]
    capacity_gib: int


@dataclass(frozen=True)
class GpuPlacement:
    """Where pods that need the GPU nodes land, and where they find the node's NVMe RAID0.

    Attributes:
        node_selector: label -> value every GPU pod selects (vLLM, node-local sync, GPU add-ons).
        tolerations: tolerations of those pods, in order (Kubernetes toleration objects).
        nvme_host_path: host path of the GPU nodes' NVMe RAID0 (node-local weights).
    """

    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    nvme_host_path: str

    def node_selector_dict(self) -> dict[str, str]:
        """The selector as a fresh dict (for a manifest), order kept."""
        return dict(self.node_selector)

    def tolerations_list(self) -> list[dict[str, Any]]:
        """The tolerations as fresh dicts (for a manifest), order kept."""
        return [dict(t) for t in self.tolerations]


@dataclass(frozen=True)
class ServiceAccess:
    """How clients reach the vLLM Service on the cluster.

    Attributes:
        service_type: ``kubernetes.serviceType``: ``ClusterIP`` or ``internal-nlb``.
        client_cidrs: CIDRs the NetworkPolicy admits to the API port (``kubernetes.allowedCidrs``,
            then on AWS ``network.allowedCidrs``; duplicates removed, order kept).
        cluster_cidrs: the address ranges the cluster's nodes and pods take their addresses from
            (on ``aws-eks`` the node subnets' CIDR blocks, which vpc-cni gives pods too, possibly
            Outputs; on ``kubernetes`` ``kubernetes.clusterCidrs``): the NetworkPolicy excludes
            them from every client CIDR, so an address block never admits cluster pods.
    """

    service_type: str
    client_cidrs: tuple[str, ...]
    cluster_cidrs: tuple[pulumi.Input[str], ...] = ()


@dataclass(frozen=True)
class KubernetesPlatformHandle:
    """What the Kubernetes edge needs from the platform it runs on.

    Attributes:
        profile: the platform's pure facts (``components/core/platforms.py``).
        provider: the ``pulumi_kubernetes.Provider`` of the cluster (the EKS cluster's own on
            ``aws-eks``; never the ambient kubeconfig there).
        placement: GPU node selector, tolerations and the NVMe host path.
        service_access: Service type and the NetworkPolicy's client CIDRs.
        mirror_bucket: the S3 mirror bucket's name, or None without a mirror. Pass it to
            ``spec/weights.py sync_steps`` inside ``apply`` for the Jobs' argv.
        fsx: the FSx file system, or None (``storage.kind`` ``fsx`` / ``nvme-from-fsx`` need it).
        cluster_ready: resources the workloads depend on (node groups, managed add-ons, Pod
            Identity associations), so pods are not created before there are nodes to run them.
        pod_identity_roles: Kubernetes service account (in ``kubernetes.namespace``) -> IAM role
            ARN bound to it by EKS Pod Identity; the edge must create each of these accounts.
    """

    profile: PlatformProfile
    provider: k8s.Provider
    placement: GpuPlacement
    service_access: ServiceAccess
    mirror_bucket: pulumi.Output[str] | None = None
    fsx: FsxVolumeSource | None = None
    cluster_ready: tuple[pulumi.Resource, ...] = ()
    pod_identity_roles: Mapping[str, pulumi.Output[str]] = field(default_factory=dict)


@dataclass
class PlatformResult:
    """What a platform's declare function returns to the program.

    Attributes:
        outputs: stack outputs (camelCase keys), merged into the program's exports in order.
        kubernetes: the handle for the Kubernetes edge, or None when the platform runs no
            Kubernetes workloads (``PlatformProfile.runs_kubernetes`` false).
    """

    outputs: dict[str, Any] = field(default_factory=dict)
    kubernetes: KubernetesPlatformHandle | None = None


__all__ = ["FsxVolumeSource", "GpuPlacement", "KubernetesPlatformHandle", "PlatformResult", "ServiceAccess"]

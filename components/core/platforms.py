"""What differs by platform, as data: one ``PlatformProfile`` per value of ``kimi-deploy:platform``.

Code asks a profile field (``platform_profile(spec.platform).creates_cluster``) instead of comparing
platform names, so the components hold no ``platform == ...`` branches and a new platform is a new
entry here plus its declare function (``components/program.py``, ``PLATFORM_DECLARERS``). Pure
data: no Pulumi import (``components/core`` is the pure core).

Sources of the facts:
- ``nvme_host_path`` on ``aws-eks``: the GPU nodes' nodeadm user data mounts the instance-store
  RAID0 there (``components/aws/cluster.py``, ``naming.NVME_RAID0_HOST_PATH``); on an existing
  cluster the operator says where (``kubernetes.nvmeHostPath``).
- EFA devices reach pods only through the EFA Kubernetes device plugin, which advertises
  ``vpc.amazonaws.com/efa`` (https://docs.aws.amazon.com/eks/latest/userguide/node-efa.html); on
  ``aws-ec2`` the interfaces belong to the instance itself.
- FSx for Lustre reaches pods through the FSx CSI driver, an EKS managed add-on
  (https://docs.aws.amazon.com/eks/latest/userguide/fsx-csi.html).
- The cluster autoscaler's AWS provider scales EKS managed node groups' Auto Scaling groups
  (https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/cloudprovider/aws/README.md);
  an existing cluster's node pool is the operator's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from .naming import NVME_RAID0_HOST_PATH

# How clients reach the OpenAI API: the instance's private IP (SSM port forwarding), or a
# Kubernetes Service (ClusterIP, or an internal NLB where kubernetes.serviceType says so).
ServiceExposure = Literal["instance-private-endpoint", "kubernetes-service"]


@dataclass(frozen=True)
class PlatformProfile:
    """The facts that differ by platform.

    Attributes:
        name: the ``kimi-deploy:platform`` value.
        description: one line for messages and docs.
        provisions_aws: the stack declares AWS infrastructure (VPC, S3 mirror, FSx, IAM;
            ``components/aws``); capacity is bought (``compute.capacity``), and
            ``network.allowedCidrs`` describes the clients of the VPC.
        runs_kubernetes: the workloads are Kubernetes objects (``components/k8s``).
        needs_kubeconfig: the workloads go to a cluster the stack does not create, reached
            with the ``kimi-deploy:kubeconfig`` secret.
        creates_cluster: the stack creates the cluster and its GPU node groups (EKS): the
            Kubernetes provider comes from that cluster's kubeconfig, never the ambient one.
        labels_gpu_nodes: the stack's GPU node groups carry ``naming.GPU_NODE_LABEL`` /
            ``TARGET_NODE_LABEL`` and the ``GPU_TAINT_KEY`` taint, so GPU pods select and
            tolerate them (elsewhere only ``kubernetes.nodeSelector`` / ``tolerations``).
        nvme_host_path: host path of the GPU nodes' NVMe RAID0 that the platform's own node
            bootstrap mounts, or None when config says (``kubernetes.nvmeHostPath``) or there is
            no Kubernetes node.
        serves_under_systemd: vLLM runs on one instance under systemd from user data
            (``components/aws/compute.py``, ``userdata.py``): the user-data size limit applies,
            the sync's tools are uploaded to the mirror, and the engine caches are restored at boot.
        efa_to_pods: EFA interfaces reach pods through the EFA device plugin
            (``vpc.amazonaws.com/efa`` requests) when ``compute.efa`` is on.
        fsx_available: FSx for Lustre can hold the weights (``storage.kind`` ``fsx`` /
            ``nvme-from-fsx``): the FSx CSI driver runs on the stack's cluster.
        cluster_autoscaler: with ``autoscaling.enabled``, the stack installs the cluster
            autoscaler for its GPU node groups (and its IAM identity).
        service_exposure: how clients reach the API (``ServiceExposure``).
        restores_engine_cache: with a mirror, the engine's compile caches are restored before
            vLLM starts and saved after its first healthy start (``engine_cache.py``): aws-ec2
            through the ``kimi-engine-cache-*`` units, aws-eks through the vLLM pods' restore init
            container and save sidecar, whose service account may write ``<rev>/_engine-cache/``
            alone. Not on an existing cluster: the mirror's credentials are the operator's (the
            project binds no cloud identity there), so nothing could be granted the right to save.
        stages_on_system_nodes: in ``phase: stage`` the publish Job runs on the stack's system node
            group (``naming.SYSTEM_NODE_LABEL``), staging in an emptyDir, because no GPU node exists
            yet; elsewhere it runs where serve's does (an existing cluster's GPU nodes, their NVMe),
            requesting no GPU.
    """

    name: str
    description: str
    provisions_aws: bool
    runs_kubernetes: bool
    needs_kubeconfig: bool
    creates_cluster: bool
    labels_gpu_nodes: bool
    nvme_host_path: str | None
    serves_under_systemd: bool
    efa_to_pods: bool
    fsx_available: bool
    cluster_autoscaler: bool
    service_exposure: ServiceExposure
    restores_engine_cache: bool
    stages_on_system_nodes: bool = False


PLATFORM_PROFILES: Mapping[str, PlatformProfile] = MappingProxyType(
    {
        "aws-ec2": PlatformProfile(
            name="aws-ec2",
            description="one GPU instance in a new or existing VPC, vLLM under systemd",
            provisions_aws=True,
            runs_kubernetes=False,
            needs_kubeconfig=False,
            creates_cluster=False,
            labels_gpu_nodes=False,
            nvme_host_path=None,
            serves_under_systemd=True,
            efa_to_pods=False,
            fsx_available=False,
            cluster_autoscaler=False,
            service_exposure="instance-private-endpoint",
            restores_engine_cache=True,
        ),
        "aws-eks": PlatformProfile(
            name="aws-eks",
            description="an EKS cluster with GPU node groups, created by the stack",
            provisions_aws=True,
            runs_kubernetes=True,
            needs_kubeconfig=False,
            creates_cluster=True,
            labels_gpu_nodes=True,
            nvme_host_path=NVME_RAID0_HOST_PATH,
            serves_under_systemd=False,
            efa_to_pods=True,
            fsx_available=True,
            cluster_autoscaler=True,
            service_exposure="kubernetes-service",
            restores_engine_cache=True,
            stages_on_system_nodes=True,
        ),
        "kubernetes": PlatformProfile(
            name="kubernetes",
            description="an existing Kubernetes cluster (kimi-deploy:kubeconfig)",
            provisions_aws=False,
            runs_kubernetes=True,
            needs_kubeconfig=True,
            creates_cluster=False,
            labels_gpu_nodes=False,
            nvme_host_path=None,
            serves_under_systemd=False,
            efa_to_pods=False,
            fsx_available=False,
            cluster_autoscaler=False,
            service_exposure="kubernetes-service",
            restores_engine_cache=False,
        ),
    }
)


def platform_profile(name: str) -> PlatformProfile:
    """The ``PlatformProfile`` of platform ``name``.

    Raises:
        KeyError: an unknown platform (config validation rejects it first, naming the allowed
            values: ``targets.PLATFORMS``).
    """
    try:
        return PLATFORM_PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown platform {name!r} (known: {', '.join(PLATFORM_PROFILES)})") from None

"""Weight storage in the cluster: node-local NVMe (dedicated directories below the RAID0 mount),
the static FSx for Lustre PersistentVolume and claim (ReadWriteMany), or an existing claim.

``serving_volume`` says which pod volume vLLM reads the weights from; the weight-sync Jobs
(``scripts/node/weight_sync/``) use the same helpers, so both always agree on paths.

On the node's NVMe no pod mounts the array itself: it also holds the kubelet's, containerd's and
the pod logs' state on EKS (``components/core/node_storage.py``). Each volume is one directory
kimi-deploy owns below it (``node_storage.node_dirs``): the weights, the publish staging, the
engine caches.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.core.config import DeploymentSpec
from components.core.node_storage import node_dirs
from components.core.weights import FSX_MOUNT_PATH, WEIGHTS_MOUNT_PATH
from components.platform import FsxVolumeSource

from .common import FSX_CLAIM_NAME, FSX_PV_NAME_PREFIX, dns_name, metadata

# CSI driver name of FSx for Lustre (https://github.com/kubernetes-sigs/aws-fsx-csi-driver).
FSX_CSI_DRIVER = "fsx.csi.aws.com"
WEIGHTS_VOLUME = "weights"
FSX_VOLUME = "fsx"
STAGING_VOLUME = "staging"
ENGINE_CACHE_VOLUME = "engine-cache"
# kubelet creates a missing directory (0755, root) before the pod starts (hostPath
# DirectoryOrCreate). Where the RAID0 is not mounted that lands on the root disk, where the copy's
# free-space check stops the weight writer with "not enough free space" (a 1.5 TB copy never fits).
HOST_DIRECTORY_TYPE = "DirectoryOrCreate"


__all__ = [
    "FsxVolumeSource", "declare_fsx_volume", "nvme_engine_cache_volume", "nvme_staging_volume", "nvme_weights_volume",
    "serving_volume",
]


def nvme_weights_volume(nvme_root: str) -> dict[str, Any]:
    """The weights directory on the node's NVMe (``node_dirs(nvme_root).weights``; ``nvme_root``:
    ``GpuPlacement.nvme_host_path``) as a host-path volume."""
    return {"name": WEIGHTS_VOLUME, "hostPath": {"path": node_dirs(nvme_root).weights, "type": HOST_DIRECTORY_TYPE}}


def nvme_staging_volume(nvme_root: str) -> dict[str, Any]:
    """The publish staging directory on the node's NVMe (``node_dirs(nvme_root).staging``)."""
    return {"name": STAGING_VOLUME, "hostPath": {"path": node_dirs(nvme_root).staging, "type": HOST_DIRECTORY_TYPE}}


def nvme_engine_cache_volume(nvme_root: str) -> dict[str, Any]:
    """The engine-cache directory on the node's NVMe (``node_dirs(nvme_root).engine_cache``)."""
    return {
        "name": ENGINE_CACHE_VOLUME,
        "hostPath": {"path": node_dirs(nvme_root).engine_cache, "type": HOST_DIRECTORY_TYPE},
    }


def fsx_volume(read_only: bool) -> dict[str, Any]:
    """The FSx claim as a pod volume."""
    return {"name": FSX_VOLUME, "persistentVolumeClaim": {"claimName": FSX_CLAIM_NAME, "readOnly": read_only}}


def existing_claim_volume(spec: DeploymentSpec, read_only: bool) -> dict[str, Any]:
    """``storage.existingClaim`` as a pod volume."""
    claim = spec.config.storage.existing_claim
    return {"name": WEIGHTS_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}


def serving_volume(spec: DeploymentSpec, nvme_host_path: str) -> tuple[dict[str, Any], str]:
    """The pod volume vLLM reads the weights from (read-only) and its mount path.

    ``fsx``: the FSx claim at ``/fsx``; ``pvc``: the existing claim at ``/models``; ``nvme`` and
    ``nvme-from-fsx``: the weights directory on the node's NVMe (``nvme_weights_volume`` below
    ``nvme_host_path``) at ``/models``.
    """
    kind = spec.config.storage.kind
    if kind == "fsx":
        return fsx_volume(read_only=True), FSX_MOUNT_PATH
    if kind == "pvc":
        return existing_claim_volume(spec, read_only=True), WEIGHTS_MOUNT_PATH
    return nvme_weights_volume(nvme_host_path), WEIGHTS_MOUNT_PATH


def fsx_pv_name(spec: DeploymentSpec) -> str:
    """Cluster-unique name of the static FSx PersistentVolume (PVs are cluster-scoped)."""
    return dns_name(f"{FSX_PV_NAME_PREFIX}-{spec.config.kubernetes.namespace}-{spec.stack}")


def declare_fsx_volume(
    spec: DeploymentSpec, fsx: FsxVolumeSource, provider: k8s.Provider, parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
) -> tuple[k8s.core.v1.PersistentVolume, k8s.core.v1.PersistentVolumeClaim]:
    """The static FSx PersistentVolume (Retain: deleting the stack's claim never touches the
    file system) and the claim bound to it by name."""
    capacity = f"{fsx.capacity_gib}Gi"
    pv_name = fsx_pv_name(spec)
    namespace = spec.config.kubernetes.namespace
    opts = pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on)
    pv = k8s.core.v1.PersistentVolume(
        "weights-fsx-pv",
        metadata=metadata(spec, pv_name, "weights-storage", namespaced=False),
        # The SDK's typed dicts (PersistentVolumeSpecArgsDict): Python names, sent as the API's camelCase.
        spec={
            "capacity": {"storage": capacity},
            "volume_mode": "Filesystem",
            "access_modes": ["ReadWriteMany"],
            "persistent_volume_reclaim_policy": "Retain",
            "storage_class_name": "",
            "mount_options": ["flock"],
            "claim_ref": {"namespace": namespace, "name": FSX_CLAIM_NAME},
            "csi": {
                "driver": FSX_CSI_DRIVER,
                "volume_handle": fsx.file_system_id,
                "volume_attributes": {"dnsname": fsx.dns_name, "mountname": fsx.mount_name},
            },
        },
        opts=opts,
    )
    pvc = k8s.core.v1.PersistentVolumeClaim(
        "weights-fsx-pvc",
        metadata=metadata(spec, FSX_CLAIM_NAME, "weights-storage"),
        spec={
            "access_modes": ["ReadWriteMany"],
            "storage_class_name": "",
            "volume_name": pv_name,
            "resources": {"requests": {"storage": capacity}},
        },
        # A claim bound to a static volume stays Pending until the volume exists.
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=[pv, *depends_on]),
    )
    return pv, pvc

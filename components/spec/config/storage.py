"""``storage``: the kind (NVMe, FSx, PVC) and whether the weights fit, FSx settings, the S3 mirror."""

from __future__ import annotations

from .. import fsx
from ..targets import InstanceFacts
from .errors import ConfigError, check_choice
from .patterns import BUCKET_RE
from .raw import RawConfig


def check_storage(raw: RawConfig, instance: InstanceFacts, instance_type: str, needed: int) -> None:
    """``storage.kind`` for the platform and the node's NVMe (``needed`` bytes of weights),
    ``storage.existingClaim``, ``storage.fsx.*`` and ``storage.mirror.*``.

    Raises:
        ConfigError: the first invalid value, one line.
    """
    is_aws = raw.platform.startswith("aws-")
    st = raw.storage
    if st.kind in ("fsx", "nvme-from-fsx") and not is_aws:
        raise ConfigError("storage.kind", st.kind, "needs an AWS platform (allowed on kubernetes: nvme, pvc)")
    if st.kind == "pvc":
        if not raw.platform == "kubernetes" and raw.platform != "aws-eks":
            raise ConfigError("storage.kind", st.kind, "needs a Kubernetes platform (aws-eks, kubernetes)")
        if not st.existing_claim:
            raise ConfigError("storage.existingClaim", None, "is required when storage.kind is pvc")
        from ..limits import dns1123_subdomain_problem

        if why := dns1123_subdomain_problem(st.existing_claim):
            raise ConfigError("storage.existingClaim", st.existing_claim, f"{why} (a PersistentVolumeClaim name)")
    if st.kind == "nvme" and instance.nvme_total_bytes < needed * 1.05:
        raise ConfigError(
            "storage.kind",
            st.kind,
            f"does not fit: {instance_type} has {instance.nvme_total_bytes / 1e12:.1f} TB of NVMe for {needed / 1e12:.2f} TB of "
            "weights (use fsx)",
        )
    fc = st.fsx
    check_choice("storage.fsx.deploymentType", fc.deployment_type, fsx.DEPLOYMENT_TYPES)
    tiers = fsx.THROUGHPUT_PER_TIB_MBPS[fc.deployment_type]
    if fc.throughput_per_tib not in tiers and fc.deployment_type != "SCRATCH_2":
        raise ConfigError(
            "storage.fsx.throughputPerTib",
            fc.throughput_per_tib,
            f"is not valid for {fc.deployment_type} ({', '.join(map(str, tiers))})",
        )
    if fc.capacity_gib is not None:
        if not fsx.is_valid_capacity_gib(fc.capacity_gib):
            raise ConfigError(
                "storage.fsx.capacityGib",
                fc.capacity_gib,
                "is not a valid FSx for Lustre size (1200, 2400, then multiples of 2400)",
            )
        if fc.capacity_gib * 2**30 < needed:
            raise ConfigError(
                "storage.fsx.capacityGib", fc.capacity_gib, f"cannot hold {needed / 2**30:,.0f} GiB of weights"
            )
    if fc.efa and fc.deployment_type != "PERSISTENT_2":
        raise ConfigError("storage.fsx.efa", True, f"needs deploymentType PERSISTENT_2 (got {fc.deployment_type})")
    if fc.metadata_iops is not None:
        if fc.deployment_type != "PERSISTENT_2":
            raise ConfigError("storage.fsx.metadataIops", fc.metadata_iops, "is only for PERSISTENT_2")
        if not fsx.is_valid_metadata_iops(fc.metadata_iops):
            raise ConfigError(
                "storage.fsx.metadataIops",
                fc.metadata_iops,
                "is not valid (1500, 3000, 6000, 12000, then multiples of 12000 up to 192000)",
            )
    mirror = st.mirror
    if mirror.bucket_name is not None and not BUCKET_RE.match(mirror.bucket_name):
        raise ConfigError(
            "storage.mirror.bucketName",
            mirror.bucket_name,
            "is not a valid S3 bucket name (3-63 lowercase letters, digits, dots, hyphens)",
        )
    if not mirror.create and mirror.enabled and not mirror.bucket_name:
        raise ConfigError(
            "storage.mirror.bucketName", None, "is required when storage.mirror.create is false (name the existing mirror)"
        )
    if raw.platform == "aws-ec2" and not mirror.enabled:
        raise ConfigError(
            "storage.mirror.enabled",
            False,
            "must be true on aws-ec2 (the instance boots from the mirror's _tools/ prefix and weights)",
        )
    if st.kind in ("fsx", "nvme-from-fsx") and not mirror.enabled:
        raise ConfigError(
            "storage.mirror.enabled", False, f"must be true for storage.kind {st.kind} (FSx imports the weights from the mirror)"
        )
    if not mirror.prefix or mirror.prefix.startswith("/") or ".." in mirror.prefix.split("/"):
        raise ConfigError("storage.mirror.prefix", mirror.prefix, "must be a relative S3 key prefix without '..'")

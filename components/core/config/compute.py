"""``compute`` and ``aws:region``: the instance type, where it runs (region, AZ, Local Zone),
the capacity it comes from (on-demand, ODCR, capacity block, UltraServer blocks), EFA and AMI."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from ..errors import ConfigError
from ..platforms import PlatformProfile
from ..targets import AWS_REGIONS, InstanceFacts, TargetProfile
from .patterns import AZ_RE, REGION_RE, RESERVATION_RE
from .raw import RawConfig
from .spec import format_utc


def resolve_instance(raw: RawConfig, target: TargetProfile) -> tuple[str, InstanceFacts]:
    """The instance type (``compute.instanceType`` or the target's for the platform) and its facts.

    However the hardware is named, it must be the target's (``targets.hardware_mismatch``: GPU
    model, GPUs per node, memory per GPU), or the sizing, the vLLM command and the price would be
    the target's while the nodes are something else.

    Raises:
        ConfigError: no profile for the type, or another GPU model, count or memory than the target's.
    """
    from ..targets import INSTANCES, hardware_mismatch, instance_types_of  # local: keep the module namespace small

    instance_type = raw.compute.instance_type or target.platforms[raw.platform]
    instance = INSTANCES.get(instance_type)
    fitting = ", ".join(instance_types_of(target))
    if instance is None:
        raise ConfigError(
            "compute.instanceType", instance_type,
            f"has no profile: nothing says it is a {target.name} node (instance types of {target.name}: {fitting})",
        )
    mismatch = hardware_mismatch(instance, target)
    if mismatch:
        raise ConfigError(
            "compute.instanceType", instance_type, f"{mismatch} (instance types of {target.name}: {fitting})"
        )
    return instance_type, instance


def check_replicas(raw: RawConfig, platform: PlatformProfile) -> None:
    """``compute.replicas`` is 1 on aws-ec2 (one instance serves one copy).

    Raises:
        ConfigError: more than one replica on aws-ec2.
    """
    if platform.serves_under_systemd and raw.compute.replicas != 1:
        raise ConfigError(
            "compute.replicas",
            raw.compute.replicas,
            "must be 1 on aws-ec2 (one instance serves one copy; use aws-eks for more copies)",
        )


def check_region(raw: RawConfig, platform: PlatformProfile, instance: InstanceFacts, instance_type: str) -> str | None:
    """``aws:region``: a region name when given, required on AWS platforms, where the instance
    type must be an AWS one.

    Returns:
        The region (None when unset).

    Raises:
        ConfigError: a malformed or missing region, or a non-AWS instance type on AWS.
    """
    provisions_aws = platform.provisions_aws
    region = raw.region
    if region is not None and not REGION_RE.match(region):
        # Checked on every platform and target, with or without offering facts (preflight asks AWS).
        raise ConfigError("aws:region", region, "is not an AWS region name (e.g. us-east-1)")
    if region is not None and region not in AWS_REGIONS:
        # Before any zone is compared with it: a region that does not exist is the region's error.
        from ..errors import did_you_mean

        raise ConfigError(
            "aws:region", region,
            f"is not an AWS region (botocore's list of {len(AWS_REGIONS)}, targets.AWS_REGIONS)"
            + (did_you_mean(region, AWS_REGIONS) or "; e.g. us-east-1"),
        )
    if provisions_aws and not region:
        raise ConfigError("aws:region", None, "is required for AWS platforms (pulumi config set aws:region us-east-1)")
    if provisions_aws and instance.cloud != "aws":
        raise ConfigError("compute.instanceType", instance_type, "is not an AWS instance type")
    return region


def check_placement_and_capacity(
    raw: RawConfig, platform: PlatformProfile, target: TargetProfile, instance: InstanceFacts, instance_type: str,
    region: str | None, warnings: list[str],
) -> None:
    """AZs (format, region, offering facts), capacity type and reservation, UltraServer blocks,
    Local Zones, EFA, the AZ needed without offering facts, and the AMI.

    Raises:
        ConfigError: the first invalid value, one line.
    """
    provisions_aws = platform.provisions_aws
    cap = raw.compute.capacity
    az = raw.compute.availability_zone
    if az is not None and not AZ_RE.match(az):
        raise ConfigError("compute.availabilityZone", az, "is not an availability zone name (e.g. us-east-1a)")
    if provisions_aws and instance.offered_azs and region and region not in instance.offered_azs:
        # The region first: a zone of another region is a symptom when the region itself offers none.
        regions = ", ".join(sorted(instance.offered_azs))
        raise ConfigError("aws:region", region, f"does not offer {instance_type} (offered in: {regions})")
    if provisions_aws and az and region and not az.startswith(region):
        raise ConfigError("compute.availabilityZone", az, f"is not in region {region}")
    if provisions_aws and instance.offered_azs:
        offered = instance.offered_azs.get(region or "", ())
        if not offered:
            regions = ", ".join(sorted(instance.offered_azs))
            raise ConfigError("aws:region", region, f"does not offer {instance_type} (offered in: {regions})")
        if az and az not in offered:
            raise ConfigError(
                "compute.availabilityZone", az, f"does not offer {instance_type} (allowed: {', '.join(offered)})"
            )
    if cap.availability_zone is not None and not AZ_RE.match(cap.availability_zone):
        raise ConfigError(
            "compute.capacity.availabilityZone", cap.availability_zone, "is not an availability zone name (e.g. us-east-1a)"
        )
    if provisions_aws and cap.availability_zone and region and not cap.availability_zone.startswith(region):
        raise ConfigError("compute.capacity.availabilityZone", cap.availability_zone, f"is not in region {region}")
    if cap.type in ("odcr", "capacity-block"):  # off AWS refused by config/platform_keys.py
        if not cap.reservation_id:
            raise ConfigError("compute.capacity.reservationId", None, f"is required for {cap.type} (format cr-0123456789abcdef0)")
        if not RESERVATION_RE.match(cap.reservation_id):
            raise ConfigError(
                "compute.capacity.reservationId",
                cap.reservation_id,
                "is not a capacity reservation id (cr- and 8 to 17 hex digits)",
            )
        if not cap.availability_zone:
            raise ConfigError(
                "compute.capacity.availabilityZone",
                None,
                f"is required for {cap.type}: subnets are pinned to the reservation's AZ",
            )
        if az and az != cap.availability_zone:
            raise ConfigError(
                "compute.availabilityZone",
                az,
                f"differs from the capacity reservation's AZ {cap.availability_zone} (nodes must launch in the reservation's AZ)",
            )
        if instance.offered_azs and cap.availability_zone not in instance.offered_azs.get(region or "", ()):
            raise ConfigError(
                "compute.capacity.availabilityZone",
                cap.availability_zone,
                f"does not offer {instance_type} (allowed: {', '.join(instance.offered_azs.get(region or '', ()))})",
            )
    elif cap.reservation_id:
        raise ConfigError(
            "compute.capacity.reservationId",
            cap.reservation_id,
            "is set but compute.capacity.type is on-demand (set odcr or capacity-block)",
        )
    if provisions_aws and target.aws_capacity_types is not None and cap.type not in target.aws_capacity_types:
        raise ConfigError(
            "compute.capacity.type",
            cap.type,
            f"is not available for {target.name}: {target.aws_capacity_reason} (allowed: {', '.join(target.aws_capacity_types)})",
        )
    check_ultraserver_block(raw, instance, target.nodes_per_copy * raw.compute.replicas, warnings)
    check_local_zone(raw, warnings)
    if raw.compute.efa and instance.efa_interfaces == 0:
        raise ConfigError("compute.efa", True, f"is not supported by {instance_type} (it has no EFA interfaces)")
    if raw.compute.efa:
        from ..versions import VLLM_IMAGES

        image_repo = (raw.vllm.image or "").split("@")[0].rpartition(":")[0] or (raw.vllm.image or "").split("@")[0]
        if not raw.vllm.image or image_repo in VLLM_IMAGES.values():
            raise ConfigError(
                "compute.efa", True,
                "needs vllm.image set to a build with libfabric's EFA provider and aws-ofi-nccl (the stock "
                f"{', '.join(VLLM_IMAGES.values())} images have neither, so NCCL would fall back to sockets)",
            )
    if provisions_aws and not instance.offered_azs and not (cap.availability_zone or az):
        raise ConfigError(
            "compute.availabilityZone",
            None,
            f"is required: there are no offering facts for {instance_type} (name an AZ that offers it; preflight checks it)",
        )
    if raw.compute.ami_id is not None:
        if not re.match(r"^ami-[0-9a-f]{8,17}$", raw.compute.ami_id):
            raise ConfigError("compute.amiId", raw.compute.ami_id, "is not an AMI id (ami-0123456789abcdef0)")
        if not raw.compute.ami_architecture:
            raise ConfigError(
                "compute.amiArchitecture",
                None,
                f"is required with compute.amiId (the AMI's architecture; {instance_type} needs {instance.cpu_architecture})",
            )
    if raw.compute.ami_architecture and raw.compute.ami_architecture != instance.cpu_architecture:
        raise ConfigError(
            "compute.amiArchitecture",
            raw.compute.ami_architecture,
            f"does not match {instance_type} ({instance.cpu_architecture})",
        )



def check_capacity_block_end(raw: RawConfig, now: datetime, expires_at: datetime | None, warnings: list[str]) -> None:
    """A capacity block's ``compute.capacity.endsAt`` leaves usable time; a warning when the
    block stops running instances before the stack expires.

    A block's instances are terminated ``capacity.CAPACITY_BLOCK_TERMINATION_SECONDS`` (30 min)
    before its end (``capacity.usable_until``; AWS EC2 user guide, capacity-blocks-monitor), so
    that moment, not ``endsAt``, is compared with now and with the expiry.

    Raises:
        ConfigError: the block has ended, or its instances are already being terminated.
    """
    from ..capacity import CAPACITY_BLOCK_TERMINATION_SECONDS, usable_until

    cap = raw.compute.capacity
    if cap.type == "capacity-block" and cap.ends_at is not None:
        ends = cap.ends_at if cap.ends_at.tzinfo else cap.ends_at.replace(tzinfo=UTC)
        usable = usable_until(ends)
        window = f"{CAPACITY_BLOCK_TERMINATION_SECONDS // 60} min before its end"
        if ends <= now:
            raise ConfigError(
                "compute.capacity.endsAt",
                format_utc(ends),
                f"is in the past (now {format_utc(now)}): the capacity block has ended",
            )
        if usable <= now:
            raise ConfigError(
                "compute.capacity.endsAt",
                format_utc(ends),
                f"leaves no usable time (now {format_utc(now)}): AWS terminates the block's instances from "
                f"{format_utc(usable)}, {window}",
            )
        if expires_at is not None and usable < expires_at:
            warnings.append(
                f"the capacity block's instances are terminated from {format_utc(usable)} ({window} {format_utc(ends)}), "
                f"before the stack expires at {format_utc(expires_at)}"
            )
        elif expires_at is None and raw.environment == "trial" and usable < now + timedelta(hours=raw.trial_ttl_hours):
            # A trial without expiresAt expires trialTtlHours after its first `pulumi up` (now, for a first deploy).
            warnings.append(
                f"the capacity block's instances are terminated from {format_utc(usable)} ({window} {format_utc(ends)}), "
                f"before the trial expires (trialTtlHours {raw.trial_ttl_hours} h after a `pulumi up` now: "
                f"{format_utc(now + timedelta(hours=raw.trial_ttl_hours))})"
            )


def check_local_zone(raw: RawConfig, warnings: list[str]) -> None:
    """A GPU zone in a Local Zone: warn where the stack puts something there that Local Zones may
    not offer (FSx for Lustre is not among the resources the EKS user guide lists for Local
    Zones: managed node groups, self-managed nodes, EBS volumes, ALBs)."""
    from ..targets import is_local_zone

    zone = raw.compute.capacity.availability_zone or raw.compute.availability_zone
    if is_local_zone(zone) and raw.storage.kind in ("fsx", "nvme-from-fsx"):
        warnings.append(
            f"the GPU zone {zone} is a Local Zone and storage.kind {raw.storage.kind} creates FSx for Lustre in it: "
            "check that the zone offers FSx (AWS Local Zones features), or use storage.kind nvme"
        )


def block_instances(raw: RawConfig, instance: InstanceFacts, nodes: int) -> int | None:
    """Instances paid for in an UltraServer capacity block: ``compute.capacity.blockInstances``,
    else the smallest whole number of the type's smallest UltraServer holding ``nodes``; None
    for capacity sold per instance (or not a capacity block)."""
    cap = raw.compute.capacity
    if cap.type != "capacity-block" or not instance.ultraserver_instances:
        return None
    if cap.block_instances is not None:
        return cap.block_instances
    fitting = [n for n in instance.ultraserver_instances if n >= nodes]
    if fitting:
        return fitting[0]
    largest = instance.ultraserver_instances[-1]
    return -(-nodes // largest) * largest


def check_ultraserver_block(raw: RawConfig, instance: InstanceFacts, nodes: int, warnings: list[str]) -> None:
    """An UltraServer capacity block is bought whole: warn when the node group uses a fraction of
    it (the price covers every tray), refuse a block smaller than the node group.

    Raises:
        ConfigError: ``compute.capacity.blockInstances`` is below the GPU nodes or not a whole
            number of the type's UltraServers.
    """
    billed = block_instances(raw, instance, nodes)
    if billed is None:
        if raw.compute.capacity.block_instances is not None:
            raise ConfigError(
                "compute.capacity.blockInstances", raw.compute.capacity.block_instances,
                f"is only for UltraServer capacity blocks (capacity-block of {instance.instance_type} is sold per instance)",
            )
        return
    sizes = instance.ultraserver_instances
    if billed < nodes:
        raise ConfigError("compute.capacity.blockInstances", billed, f"is smaller than the {nodes} GPU nodes the stack runs")
    if not any(billed % n == 0 for n in sizes):
        raise ConfigError(
            "compute.capacity.blockInstances",
            billed,
            f"is not a whole number of UltraServers ({' or '.join(str(n) for n in sizes)} {instance.instance_type} each)",
        )
    if nodes < billed:
        warnings.append(
            f"the capacity block holds {billed} {instance.instance_type} (whole UltraServers) and is paid in full, "
            f"but the node group uses {nodes}: {billed - nodes} trays sit idle (raise compute.replicas to use them)"
        )

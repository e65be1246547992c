"""``storage``: the kind (NVMe, FSx, PVC) and whether the weights fit, FSx settings, the S3 mirror."""

from __future__ import annotations

from .. import fsx
from ..errors import ConfigError, check_choice
from ..naming import TOOLS_PREFIX
from ..platforms import PlatformProfile
from ..targets import InstanceFacts
from .patterns import S3_KEY_PREFIX_RE, bucket_name_problem, path_segments_problem
from .raw import RawConfig


def check_storage(raw: RawConfig, platform: PlatformProfile, instance: InstanceFacts, instance_type: str, needed: int,
                  warnings: list[str] | None = None) -> None:
    """``storage.kind`` for the platform and the node's NVMe (``needed`` bytes of weights),
    ``storage.existingClaim``, ``storage.fsx.*``, ``storage.mirror.*``, then ``check_read_gbps``.
    Appends to ``warnings`` an FSx capacity far above what the weights need (``fsx_oversize_warning``).

    Raises:
        ConfigError: the first invalid value, one line.
    """
    st = raw.storage
    # storage.kind fsx / nvme-from-fsx / pvc off the platforms that mount them: config/platform_keys.py.
    if st.kind == "pvc":
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
        if warnings is not None and st.kind in ("fsx", "nvme-from-fsx") and (
                oversize := fsx_oversize_warning(raw, needed)) is not None:
            warnings.append(oversize)
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
    bucket_problem = None if mirror.bucket_name is None else bucket_name_problem(mirror.bucket_name)
    if bucket_problem:
        raise ConfigError("storage.mirror.bucketName", mirror.bucket_name, bucket_problem)
    if not mirror.create and mirror.enabled and not mirror.bucket_name:
        raise ConfigError(
            "storage.mirror.bucketName", None, "is required when storage.mirror.create is false (name the existing mirror)"
        )
    if not platform.provisions_aws and mirror.enabled and mirror.model_fields_set & {"enabled", "bucket_name"}:
        # A platform that creates no AWS resource reads a mirror only as an existing bucket
        # (components/k8s/existing_cluster.py existing_mirror_bucket); anything else was ignored.
        if not mirror.bucket_name:
            raise ConfigError(
                "storage.mirror.enabled", True,
                f"needs an existing bucket on {raw.platform} (the stack creates no AWS resource there): set "
                "storage.mirror.bucketName and storage.mirror.create: false, or enabled: false to sync from the hub",
            )
        if mirror.create:
            raise ConfigError(
                "storage.mirror.bucketName", mirror.bucket_name,
                f"is a bucket {raw.platform} cannot create: set storage.mirror.create: false to read it as an existing "
                "mirror",
            )
    if platform.serves_under_systemd and not mirror.enabled:
        raise ConfigError(
            "storage.mirror.enabled",
            False,
            "must be true on aws-ec2 (the instance boots from the mirror's _tools/ prefix and weights)",
        )
    if st.kind in ("fsx", "nvme-from-fsx") and not mirror.enabled:
        raise ConfigError(
            "storage.mirror.enabled", False, f"must be true for storage.kind {st.kind} (FSx imports the weights from the mirror)"
        )
    if not S3_KEY_PREFIX_RE.match(mirror.prefix or "") or ".." in mirror.prefix.split("/"):
        # The prefix reaches the node's shell scripts and URIs: S3-safe characters only, no quoting needed anywhere.
        raise ConfigError("storage.mirror.prefix", mirror.prefix,
                          "must be a relative S3 key prefix: segments of letters, digits, '.', '_' and '-' joined by "
                          "'/' (no leading, trailing or doubled '/', no '..')")
    if (problem := path_segments_problem(mirror.prefix, absolute=False)) is not None:
        # A '.' segment: S3 keeps it literally, a file system (the FSx import, the node copy) resolves it.
        raise ConfigError("storage.mirror.prefix", mirror.prefix, f"{problem}: the prefix becomes a directory too")
    if mirror.prefix.split("/")[0] == TOOLS_PREFIX:
        # The weights' writers (the stager, the publish job) may write under the prefix: there they could
        # replace the programs every node fetches and runs.
        raise ConfigError("storage.mirror.prefix", mirror.prefix,
                          f"is under {TOOLS_PREFIX}/, where the nodes fetch the toolkit's programs (weight sync, API guard, "
                          "engine cache): choose another first segment (e.g. models)")
    if mirror.endpoint_url is not None:
        check_endpoint_url(mirror.endpoint_url)
    check_read_gbps(raw, instance, instance_type, needed)


def check_endpoint_url(url: str) -> None:
    """``storage.mirror.endpointUrl``: an ``http(s)://host[:port][/path]`` URL, as botocore takes
    ``AWS_ENDPOINT_URL_S3`` (AWS SDKs and tools reference guide, "Service-specific endpoints"),
    without credentials: the URL is a plain environment variable of the sync and engine-cache pods
    (components/k8s/weight_sync.py), readable by anyone who can read the pod spec.

    Raises:
        ConfigError: not such a URL, or ``user:password@`` in it (the message says where
            credentials go instead, and never echoes them).
    """
    check_http_url(
        "storage.mirror.endpointUrl", url, "http://minio.storage.svc:9000",
        where="the pods' environment (AWS_ENDPOINT_URL_S3)",
        instead="the sync pods reach the bucket through their service accounts (kimi-weight-sync, kimi-mirror-publish) "
        "and the cluster's workload identity, never through config",
    )
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    if parts.scheme == "http" and not _inside_the_cluster_or_private(parts.hostname or ""):
        # Plain HTTP across networks: the weights' bytes and the signed requests (replayable for SigV4's
        # 15 minutes) in the clear on every hop between the cluster and that host.
        raise ConfigError("storage.mirror.endpointUrl", url,
                          "is plain http:// to a host outside the cluster and private networks: use https://, or "
                          "http:// only to a cluster-local name (a single label, *.svc, *.svc.cluster.local) or a "
                          "private address")


def _inside_the_cluster_or_private(host: str) -> bool:
    """``host`` is a cluster-local DNS name (one label, ``*.svc``, ``*.svc.cluster.local``, ``*.local``)
    or a private, loopback or link-local address (RFC 1918 / RFC 4193 / RFC 3927)."""
    import ipaddress
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        name = host.rstrip(".").lower()
        return "." not in name or name.endswith((".svc", ".local"))  # *.svc.cluster.local ends in .local
    return address.is_private or address.is_loopback or address.is_link_local


def check_http_url(key: str, url: str, example: str, *, where: str, instead: str) -> None:
    """``url`` is ``http(s)://host[:port][/path]`` with no credentials, query or fragment.

    Raises:
        ConfigError: naming ``key``; a URL with ``user[:password]@`` is shown as
            ``[URL with credentials]`` and the message says they would reach ``where`` in plain
            text, and ``instead``.
    """
    from urllib.parse import urlsplit

    authority = url.split("://", 1)[-1].split("/", 1)[0]
    if "@" in authority:
        raise ConfigError(
            key, "[URL with credentials]",
            f"holds credentials (user:password@), which would reach {where} in plain text: write the URL without them; "
            f"{instead}",
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ConfigError(key, url, f"is not a URL (http(s)://host[:port][/path], e.g. {example})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise ConfigError(key, url, f"is not an http(s) URL with a host (e.g. {example})")
    if parts.query or parts.fragment or port == 0:
        raise ConfigError(key, url, "must be http(s)://host[:port][/path], without a query, fragment or port 0")
    if _link_local(parts.hostname):
        # 169.254.169.254 (and fd00:ec2::254) is the instance metadata service (Amazon EC2 user guide, "Access
        # instance metadata"); the rest of 169.254.0.0/16 (RFC 3927) is node-local: no service of the stack's there.
        raise ConfigError(key, url, "names a link-local host (169.254.0.0/16, fe80::/10, or the instance metadata "
                                    f"service fd00:ec2::254): node-local endpoints, not a service (e.g. {example})")


def _link_local(host: str) -> bool:
    """``host`` is a link-local address or the EC2 metadata service's IPv6 address."""
    import ipaddress
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return address.is_link_local or address == ipaddress.ip_address("fd00:ec2::254")


# The fastest an NVMe device can deliver: its PCIe 5.0 x4 link, 32 GT/s per lane with 128b/130b
# encoding = 4 x 32e9 x 128/130 / 8 = 15.75 GB/s (PCI-SIG, PCI Express Base Specification 5.0).
# No instance-store NVMe of these nodes has a wider or faster link (Nitro SSDs are PCIe Gen4/Gen5 x4).
NVME_DEVICE_MAX_READ_BYTES_PER_SECOND = 4 * 32e9 * 128 / 130 / 8


def read_gbps_ceiling(raw: RawConfig, instance: InstanceFacts, needed: int) -> tuple[float, str]:
    """The most ``storage.readGBps`` can be for the stack's storage on one node, GB/s, and why.

    - ``nvme`` and ``nvme-from-fsx`` (served from local NVMe): the node's devices x
      ``NVME_DEVICE_MAX_READ_BYTES_PER_SECOND`` (PCIe 5.0 x4 each).
    - ``fsx``: the whole file system's throughput (capacity x MB/s per TiB,
      ``fsx.fsx_read_bytes_per_second``; FSx for Lustre user guide, "Performance"): one
      client cannot read faster than the file system serves.
    - ``pvc``: local NVMe or the node's network (``InstanceFacts.network_gbps`` / 8), whichever is more.
    """
    nvme_gbps = instance.nvme_devices * NVME_DEVICE_MAX_READ_BYTES_PER_SECOND / 1e9
    nvme_why = f"{instance.nvme_devices} NVMe devices x {NVME_DEVICE_MAX_READ_BYTES_PER_SECOND / 1e9:.2f} GB/s (PCIe 5.0 x4 each)"
    kind = raw.storage.kind
    if kind == "fsx":
        fc = raw.storage.fsx
        capacity = fc.capacity_gib or fsx.fsx_capacity_gib(needed, fc.headroom_fraction)
        fsx_gbps = fsx.fsx_read_bytes_per_second(capacity, fc.throughput_per_tib) / 1e9
        return fsx_gbps, f"the FSx file system serves {capacity:,} GiB x {fc.throughput_per_tib} MB/s per TiB"
    if kind == "pvc" and instance.network_gbps is not None and instance.network_gbps / 8 > nvme_gbps:
        return instance.network_gbps / 8, f"the node's {instance.network_gbps:g} Gbit/s network"
    return nvme_gbps, nvme_why


def check_read_gbps(raw: RawConfig, instance: InstanceFacts, instance_type: str, needed: int) -> None:
    """``storage.readGBps`` (a measured read bandwidth, GB/s) is at most ``read_gbps_ceiling``:
    a larger figure is a unit slip (Gbit/s or MB/s) and would make every load time in the plan
    too short.

    Raises:
        ConfigError: above the ceiling; the message names the ceiling and where it comes from.
    """
    gbps = raw.storage.read_gbps
    if gbps is None:
        return
    ceiling, why = read_gbps_ceiling(raw, instance, needed)
    if gbps > ceiling:
        raise ConfigError(
            "storage.readGBps", gbps,
            f"is more than storage.kind {raw.storage.kind} can deliver to one {instance_type}: {why} = {ceiling:.2f} GB/s "
            f"(allowed: more than 0 and at most {ceiling:.2f}; GB/s, not Gbit/s or MB/s)",
        )


def fsx_oversize_warning(raw: RawConfig, needed: int) -> str | None:
    """A warning when ``storage.fsx.capacityGib`` is above ``fsx.FSX_OVERSIZE_FACTOR`` x the size the
    ``needed`` bytes of weights take (``fsx.fsx_capacity_gib`` with the headroom), naming both sizes and
    the USD per hour of the surplus (the price table's entry for the deployment type and tier,
    ``prices.FSX_PRICE_KEYS``); None otherwise."""
    from .. import prices  # the one price table

    fc = raw.storage.fsx
    if fc.capacity_gib is None:
        return None
    derived = fsx.fsx_capacity_gib(needed, fc.headroom_fraction)
    if fc.capacity_gib <= fsx.FSX_OVERSIZE_FACTOR * derived:
        return None
    key = prices.FSX_PRICE_KEYS.get((fc.deployment_type, fc.throughput_per_tib if fc.deployment_type != "SCRATCH_2" else None))
    price = prices.price_table(raw.prices)[key] if key is not None else None
    cost = (f"the surplus adds USD {(fc.capacity_gib - derived) * price.usd / prices.HOURS_PER_MONTH:,.0f}/h "
            f"(USD {price.usd:g} per {price.unit}, {price.region})" if price is not None else "the surplus is unpriced")
    return (f"storage.fsx.capacityGib {fc.capacity_gib:,} is {fc.capacity_gib / derived:,.0f}x the {derived:,} GiB the weights "
            f"need (more than {fsx.FSX_OVERSIZE_FACTOR}x; unset, the plan derives {derived:,}): {cost}. A larger file system "
            "also reads faster (capacity x throughputPerTib): unset it unless that is the aim")

"""``network``: client and API-server CIDRs, the VPC range, an existing VPC's subnets."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..platforms import platform_profile
from .errors import ConfigError
from .patterns import SECURITY_GROUP_ID_RE, SUBNET_ID_RE, VPC_ID_RE
from .raw import RawConfig

# Client CIDRs broader than this are "the internet" for practical purposes.
MIN_CLIENT_PREFIX_LENGTH = 8
# Private IPv4 ranges (RFC 1918), the VPC CIDR blocks the Amazon VPC user guide recommends.
_RFC1918 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def check_network(raw: RawConfig, warnings: list[str]) -> None:
    """CIDR blocks (valid, no broader than ``MIN_CLIENT_PREFIX_LENGTH``), the VPC CIDR (a private
    /16 to /22), the EKS endpoint settings (warnings), and ``vpcId`` with ``privateSubnetIds``.

    Raises:
        ConfigError: the first invalid value, one line.
    """
    provisions_aws = platform_profile(raw.platform).provisions_aws
    for i, cidr in enumerate(raw.network.allowed_cidrs + raw.kubernetes.allowed_cidrs):
        key = "network.allowedCidrs" if i < len(raw.network.allowed_cidrs) else "kubernetes.allowedCidrs"
        try:
            net = ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            raise ConfigError(key, cidr, "is not a CIDR block (e.g. 10.0.0.0/8)") from None
        if net.prefixlen < MIN_CLIENT_PREFIX_LENGTH:
            raise ConfigError(
                key,
                cidr,
                f"is broader than /{MIN_CLIENT_PREFIX_LENGTH}: it opens the API port to most of the internet (name the client "
                "networks)",
            )
    for cidr in raw.network.api_server_public_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            raise ConfigError("network.apiServerPublicCidrs", cidr, "is not a CIDR block (e.g. 203.0.113.0/24)") from None
        if ipaddress.ip_network(cidr).prefixlen < MIN_CLIENT_PREFIX_LENGTH:
            raise ConfigError(
                "network.apiServerPublicCidrs",
                cidr,
                f"is broader than /{MIN_CLIENT_PREFIX_LENGTH}: name your egress CIDR, not the internet",
            )
    try:
        ipaddress.ip_network(raw.network.vpc_cidr, strict=True)
    except ValueError:
        raise ConfigError("network.vpcCidr", raw.network.vpc_cidr, "is not a CIDR block (e.g. 10.42.0.0/16)") from None
    if not 16 <= ipaddress.ip_network(raw.network.vpc_cidr).prefixlen <= 22:
        # Subnets are /prefix+4 (an EKS node with 17 ENIs and pod IPs needs room).
        raise ConfigError("network.vpcCidr", raw.network.vpc_cidr, "must be a /16 to /22 block (subnets are a sixteenth of it)")
    vpc = ipaddress.ip_network(raw.network.vpc_cidr)
    if vpc.version != 4 or not any(vpc.subnet_of(n) for n in _RFC1918):  # type: ignore[arg-type]  # v4 checked first
        # A public range inside the VPC shadows those addresses on the internet for everything in it.
        raise ConfigError(
            "network.vpcCidr", raw.network.vpc_cidr,
            "is not a private range: use 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16 "
            "(RFC 1918, as the Amazon VPC user guide recommends)",
        )
    if raw.network.api_server_private_only and raw.network.api_server_public_cidrs:
        raise ConfigError(
            "network.apiServerPrivateOnly",
            True,
            "turns the public EKS endpoint off, but network.apiServerPublicCidrs is set (set one)",
        )
    if raw.network.api_server_private_only is False and not raw.network.api_server_public_cidrs:
        raise ConfigError(
            "network.apiServerPrivateOnly",
            False,
            "would open the public EKS endpoint to any address: set network.apiServerPublicCidrs to your egress "
            "CIDR (the public endpoint is only ever opened to those)",
        )
    if platform_profile(raw.platform).creates_cluster and not api_server_access(raw).public:
        warnings.append(
            "the EKS API endpoint is private: run `pulumi up` from inside the VPC (VPN, bastion, SSM port "
            "forwarding), or set network.apiServerPublicCidrs to your egress CIDR to reach it from there"
        )
    check_cluster_cidrs(raw)
    if provisions_aws and not raw.network.allowed_cidrs and not raw.network.allowed_security_group_ids:
        warnings.append(
            "network.allowedCidrs and network.allowedSecurityGroupIds are empty: no client outside the "
            "deployment can reach the API port"
        )
    check_resource_ids(raw)
    if raw.network.vpc_id and not raw.network.private_subnet_ids:
        raise ConfigError("network.privateSubnetIds", [], "is required with network.vpcId (the private subnets to use)")
    if raw.network.private_subnet_ids and not raw.network.vpc_id:
        raise ConfigError("network.privateSubnetIds", list(raw.network.private_subnet_ids), "needs network.vpcId")


# (key, attribute of NetworkConfig, format, what it is): the ids network.* names.
_RESOURCE_IDS = (
    ("network.vpcId", "vpc_id", VPC_ID_RE, "a VPC id (vpc- and 8 or 17 hex digits, e.g. vpc-0123456789abcdef0)"),
    ("network.privateSubnetIds", "private_subnet_ids", SUBNET_ID_RE, "a subnet id (subnet- and 8 or 17 hex digits)"),
    ("network.allowedSecurityGroupIds", "allowed_security_group_ids", SECURITY_GROUP_ID_RE,
     "a security group id (sg- and 8 or 17 hex digits; client address ranges go in network.allowedCidrs)"),
)


def check_resource_ids(raw: RawConfig) -> None:
    """``network.vpcId``, ``privateSubnetIds`` and ``allowedSecurityGroupIds`` are ids of their kind
    (``patterns.VPC_ID_RE``, ...), each named once: a CIDR or a name where an id goes would reach
    the EC2 API only at `pulumi up`.

    Raises:
        ConfigError: the first value that is not an id of its kind, or an id given twice.
    """
    for key, attribute, pattern, what in _RESOURCE_IDS:
        value = getattr(raw.network, attribute)
        items = [value] if isinstance(value, str) else list(value or ())
        for item in items:
            if not pattern.match(item):
                raise ConfigError(key, item, f"is not {what}")
        if len(set(items)) != len(items):
            raise ConfigError(key, items, "names an id twice")


@dataclass(frozen=True)
class ApiServerAccess:
    """Who reaches the EKS API endpoint (``aws-eks``).

    Attributes:
        public: whether the public endpoint is on (IAM-authenticated, from ``public_cidrs`` only).
        public_cidrs: the sources the public endpoint admits (empty when private).
        summary: one line for the plan: ``private (VPC only)`` or ``private + public from ...``.
    """

    public: bool
    public_cidrs: tuple[str, ...]
    summary: str


def api_server_access(raw: RawConfig) -> ApiServerAccess:
    """The EKS API endpoint ``network`` asks for: always the private endpoint; the public one only
    when ``network.apiServerPublicCidrs`` names sources, and then from those only (EKS's own
    default, public from 0.0.0.0/0, is never used: ``check_network`` refuses
    ``apiServerPrivateOnly: false`` without CIDRs). Source: EKS user guide, "Control network access
    to cluster API server endpoint" (endpointPublicAccess, endpointPrivateAccess, publicAccessCidrs)."""
    cidrs = tuple(raw.network.api_server_public_cidrs)
    if raw.network.api_server_private_only or not cidrs:
        return ApiServerAccess(False, (), "private (reachable from inside the VPC only)")
    return ApiServerAccess(True, cidrs, f"private + public (IAM-authenticated) from {', '.join(cidrs)} only")


def check_cluster_cidrs(raw: RawConfig) -> None:
    """``kubernetes.clusterCidrs``: valid CIDR blocks, only on the ``kubernetes`` platform, and
    required there with ``kubernetes.allowedCidrs`` (the NetworkPolicy excludes them from those
    blocks; on aws-eks the stack knows its node subnets and the key is refused).

    Raises:
        ConfigError: the first invalid value, one line.
    """
    k8s_cfg = raw.kubernetes
    for cidr in k8s_cfg.cluster_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            raise ConfigError("kubernetes.clusterCidrs", cidr, "is not a CIDR block (e.g. 10.244.0.0/16)") from None
    profile = platform_profile(raw.platform)  # clusterCidrs off an existing cluster: config/platform_keys.py
    if profile.runs_kubernetes and not profile.provisions_aws and k8s_cfg.allowed_cidrs and not k8s_cfg.cluster_cidrs:
        raise ConfigError(
            "kubernetes.clusterCidrs", [],
            "is required with kubernetes.allowedCidrs: name the cluster's pod and node address ranges, which the "
            "NetworkPolicy excludes from those blocks (an ipBlock admits every pod whose address it covers)",
        )

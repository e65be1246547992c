"""``network``: client and API-server CIDRs, the VPC range, an existing VPC's subnets."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..platforms import PlatformProfile
from .patterns import SECURITY_GROUP_ID_RE, SUBNET_ID_RE, VPC_ID_RE
from .raw import RawConfig

# Client CIDRs broader than this are "the internet" for practical purposes.
MIN_CLIENT_PREFIX_LENGTH = 8
# A public (globally routed) client block broader than this is refused: a /16 is 65,536 addresses, a
# large organisation's whole allocation; wider (a /8 is 16,777,216) admits hosts of many owners. Private
# ranges (RFC 1918, shared 100.64.0.0/10) stay allowed up to MIN_CLIENT_PREFIX_LENGTH (10.0.0.0/8 is one
# network). IPv6: a /32 is a whole provider's (RIR minimum) allocation. A policy choice, not a limit of AWS.
MIN_PUBLIC_CLIENT_PREFIX_LENGTH = {4: 16, 6: 32}
# Private IPv4 ranges (RFC 1918), the VPC CIDR blocks the Amazon VPC user guide recommends.
# Security group rules: "Inbound or outbound rules per security group" is 60 by default and, times the
# security groups per network interface, at most 1,000 (Amazon VPC user guide, "Amazon VPC quotas",
# security groups). Each allowedCidrs block is one rule (and one NetworkPolicy peer on Kubernetes).
SECURITY_GROUP_RULES_DEFAULT_QUOTA = 60
SECURITY_GROUP_RULES_MAX = 1_000
_RFC1918 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
# IPv6 prefixes whose addresses stand for IPv4 ones (the IPv4 address in the low 32 bits, or bits 16-47
# for 6to4): IPv4-mapped (RFC 4291 2.5.5.2), the NAT64 well-known prefix (RFC 6052 2.1), 6to4 (RFC 3056).
# A client block there is an IPv4 block in disguise: ::ffff:0:0/96 is every IPv4 address, and the breadth
# rules above would measure it as a narrow IPv6 /96.
_IPV4_IN_IPV6 = {"IPv4-mapped": ipaddress.ip_network("::ffff:0:0/96"), "NAT64": ipaddress.ip_network("64:ff9b::/96"),
                 "6to4": ipaddress.ip_network("2002::/16")}


def check_network(raw: RawConfig, platform: PlatformProfile, warnings: list[str]) -> None:
    """CIDR blocks (valid, no broader than ``MIN_CLIENT_PREFIX_LENGTH``), the VPC CIDR (a private
    /16 to /22), how the deployer reaches the EKS API server (``check_api_server_access``), and
    ``vpcId`` with ``privateSubnetIds``.

    Raises:
        ConfigError: the first invalid value, one line.
    """
    provisions_aws = platform.provisions_aws
    seen: set[tuple[str, str]] = set()
    for i, cidr in enumerate(raw.network.allowed_cidrs + raw.kubernetes.allowed_cidrs):
        key = "network.allowedCidrs" if i < len(raw.network.allowed_cidrs) else "kubernetes.allowedCidrs"
        check_block_notation(key, cidr)
        if (key, cidr) in seen:  # one ingress rule per block: a second is a duplicate resource name
            raise ConfigError(key, cidr, "is listed twice (each block once)")
        seen.add((key, cidr))
        try:
            net = ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            try:  # host bits set (1.0.0.0/1): name the block the address belongs to
                block = ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ConfigError(key, cidr, "is not a CIDR block (e.g. 10.0.0.0/8)") from None
            raise ConfigError(key, cidr, f"has host bits set, so it is not a CIDR block: the block of that address "
                                         f"is {block}") from None
        if net.is_loopback or net.is_link_local or net.is_multicast or net.is_unspecified:
            kind = ("loopback" if net.is_loopback else "link-local" if net.is_link_local
                    else "multicast" if net.is_multicast else "unspecified")
            raise ConfigError(key, cidr, f"is a {kind} block: no client reaches the API port from there (name the "
                                         "client networks)")
        if net.prefixlen < MIN_CLIENT_PREFIX_LENGTH:
            raise ConfigError(
                key,
                cidr,
                f"is broader than /{MIN_CLIENT_PREFIX_LENGTH}: it opens the API port to most of the internet (name the client "
                "networks)",
            )
        for kind, prefix in _IPV4_IN_IPV6.items():
            if net.version == 6 and (net.subnet_of(prefix) or net.supernet_of(prefix)):  # type: ignore[arg-type]
                raise ConfigError(key, cidr, f"is in the {kind} range {prefix}, IPv6 addresses that stand for IPv4 ones: "
                                             "write the IPv4 client block itself (the breadth rules apply to it)")
        widest = MIN_PUBLIC_CLIENT_PREFIX_LENGTH[net.version]
        if net.is_global and net.prefixlen < widest:
            raise ConfigError(
                key, cidr,
                f"is a public block of {net.num_addresses:,} addresses, broader than /{widest}: it opens the API port to "
                f"hosts of many owners (allowed: public blocks of /{widest} or narrower, private ranges up to "
                f"/{MIN_CLIENT_PREFIX_LENGTH}; name the client networks)",
            )
    for key, blocks in (("network.allowedCidrs", raw.network.allowed_cidrs),
                        ("kubernetes.allowedCidrs", raw.kubernetes.allowed_cidrs)):
        if len(blocks) > SECURITY_GROUP_RULES_MAX:
            raise ConfigError(key, f"{len(blocks)} blocks",
                              f"is more than {SECURITY_GROUP_RULES_MAX:,}, the most rules a security group may hold (Amazon "
                              "VPC quotas); one rule per block: name broader client networks")
    if provisions_aws and len(raw.network.allowed_cidrs) > SECURITY_GROUP_RULES_DEFAULT_QUOTA:
        warnings.append(
            f"network.allowedCidrs holds {len(raw.network.allowed_cidrs)} blocks, one security group rule each: above the "
            f"default quota of {SECURITY_GROUP_RULES_DEFAULT_QUOTA} inbound rules per security group `pulumi up` fails "
            "unless the quota was raised (Amazon VPC quotas)")
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
    check_api_server_access(raw, platform)
    check_cluster_cidrs(raw, platform)
    if provisions_aws and not raw.network.allowed_cidrs and not raw.network.allowed_security_group_ids:
        warnings.append(
            "network.allowedCidrs and network.allowedSecurityGroupIds are empty: no client outside the "
            "deployment can reach the API port"
        )
    check_resource_ids(raw)
    if provisions_aws and not raw.network.vpc_id and not raw.network.s3_gateway_endpoint:
        # The VPC is the stack's own, so no other gateway endpoint routes S3: every mirror read goes through the NAT.
        from ..model import KIMI_K3_1_PRO
        from ..prices import PRICES
        usd = PRICES["natGatewayGb"].usd * KIMI_K3_1_PRO.weights_bytes / 1e9
        warnings.append(f"network.s3GatewayEndpoint is false in the VPC this stack creates: each copy of the weights "
                        f"from the mirror goes through the NAT gateway (about USD {usd:,.0f} per node copy at "
                        f"USD {PRICES['natGatewayGb'].usd}/GB processed); false is for an existing VPC that routes S3 "
                        "through an endpoint of its own")
    if raw.network.vpc_id and not raw.network.private_subnet_ids:
        raise ConfigError("network.privateSubnetIds", [], "is required with network.vpcId (the private subnets to use)")
    if raw.network.private_subnet_ids and not raw.network.vpc_id:
        raise ConfigError("network.privateSubnetIds", list(raw.network.private_subnet_ids), "needs network.vpcId")


# ---------------------------------------------------------------------------------------------
# How the deploying machine reaches the EKS API server (aws-eks)
# ---------------------------------------------------------------------------------------------

# network.apiServerAccess: the public endpoint from named CIDRs, or the private endpoint only.
API_SERVER_ACCESS_MODES = ("public-cidrs", "private")
DEFAULT_API_SERVER_ACCESS = "public-cidrs"
# Where this machine's public address can be looked up (the address AWS sees; it answers one line).
EGRESS_LOOKUP_HINT = "curl https://checkip.amazonaws.com, then <address>/32"
# RFC 5737 documentation ranges: example addresses by definition (the shipped stacks hold one as a
# placeholder), never a deployer's egress. EKS refuses reserved ranges in publicAccessCidrs ("The block
# cannot include reserved addresses": EKS user guide, config-cluster-endpoint).
DOCUMENTATION_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24"))


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
    """How the machine that runs `pulumi up` (and preview, destroy, the sweeper) reaches the EKS API
    server (``aws-eks``), from ``network.apiServerAccess`` and its keys.

    The private endpoint is always on (nodes reach the API inside the VPC). Sources: EKS user guide,
    "Cluster API server endpoint" (endpointPublicAccess, endpointPrivateAccess, publicAccessCidrs;
    "Accessing a private only API server": a connected network needs the cluster security group to
    allow ingress on 443 from it).

    Attributes:
        mode: ``public-cidrs`` (public endpoint from ``public_cidrs`` only) or ``private`` (no
            public endpoint).
        public_cidrs: sources of the public endpoint (empty when private).
        private_cidrs: sources admitted on port 443 of the cluster security group.
        private_security_group_ids: security groups admitted on port 443 of the cluster security group.
        vpc_id: the existing VPC (``network.vpcId``), or None when the stack creates one.
    """

    mode: str
    public_cidrs: tuple[str, ...]
    private_cidrs: tuple[str, ...]
    private_security_group_ids: tuple[str, ...]
    vpc_id: str | None

    @property
    def public(self) -> bool:
        """Whether the public endpoint is on (``endpointPublicAccess``)."""
        return self.mode == "public-cidrs"

    @property
    def private_sources(self) -> tuple[str, ...]:
        """Every source admitted on port 443 of the cluster security group: CIDRs, then groups."""
        return self.private_cidrs + self.private_security_group_ids

    @property
    def summary(self) -> str:
        """One line for the plan: ``public endpoint, allowed from 198.51.100.7/32 (network.apiServerPublicCidrs)``."""
        private = ""
        if self.private_sources:
            private = f"; private endpoint from {', '.join(self.private_sources)} on 443 ({self._private_keys()})"
        if self.public:
            return f"public endpoint, allowed from {', '.join(self.public_cidrs)} (network.apiServerPublicCidrs){private}"
        return (f"private endpoint only, from {', '.join(self.private_sources)} on 443 of the cluster security group "
                f"({self._private_keys()}), in {self.vpc_id or 'the new VPC'}")

    def _private_keys(self) -> str:
        keys = [k for k, v in (("network.apiServerPrivateCidrs", self.private_cidrs),
                               ("network.apiServerPrivateSecurityGroupIds", self.private_security_group_ids)) if v]
        return ", ".join(keys)

    @property
    def path(self) -> tuple[str, ...]:
        """The full account (plan ``--details`` and JSON): the endpoints, the rules, who can run
        `pulumi up`, preview, destroy and the sweeper."""
        kubeconfig = "the provider's kubeconfig authenticates with `aws eks get-token` (IAM; EKS access entries)"
        rules = ""
        if self.private_sources:
            rules = (f"cluster security group: port 443 from {', '.join(self.private_sources)} ({self._private_keys()}), "
                     "created with the cluster, before any Kubernetes object")
        if self.public:
            lines = [
                f"endpoints: public (IAM-authenticated) from {', '.join(self.public_cidrs)} only; private inside the VPC "
                "(nodes reach the API there); " + kubeconfig,
                "`pulumi up`, `pulumi preview`, `pulumi destroy` and the sweeper run from an address in "
                "network.apiServerPublicCidrs (a laptop's or runner's egress); a machine inside the VPC resolves the "
                "endpoint to its private addresses and needs network.apiServerPrivateCidrs",
            ]
        else:
            lines = [
                f"endpoints: private only (no public endpoint) in {self.vpc_id or 'the VPC'}; public DNS resolves the name "
                "to the VPC's addresses; " + kubeconfig,
                f"`pulumi up`, `pulumi preview`, `pulumi destroy` and the sweeper run inside {self.vpc_id or 'the VPC'} or "
                "a network connected to it (VPN, peering, transit gateway) whose address the rule below admits",
            ]
        return tuple(lines + ([rules] if rules else []))

    def document(self) -> dict[str, Any]:
        """The JSON form (plan ``kubernetes_api``)."""
        return {
            "mode": self.mode,
            "summary": self.summary,
            "endpoint_public_access": self.public,
            "endpoint_private_access": True,
            "public_access_cidrs": list(self.public_cidrs),
            "cluster_security_group_443_from": list(self.private_sources),
            "vpc_id": self.vpc_id,
            "path": list(self.path),
        }


def api_server_access(raw: RawConfig) -> ApiServerAccess:
    """The EKS API access ``network`` asks for (``network.apiServerAccess``, default
    ``DEFAULT_API_SERVER_ACCESS``). EKS's own default, a public endpoint open to 0.0.0.0/0, is never
    used: ``check_api_server_access`` requires named sources for either mode."""
    net = raw.network
    mode = net.api_server_access or DEFAULT_API_SERVER_ACCESS
    return ApiServerAccess(
        mode=mode,
        public_cidrs=tuple(net.api_server_public_cidrs) if mode == "public-cidrs" else (),
        private_cidrs=tuple(net.api_server_private_cidrs),
        private_security_group_ids=tuple(net.api_server_private_security_group_ids),
        vpc_id=net.vpc_id,
    )


def _ipv4_block(key: str, cidr: str) -> ipaddress.IPv4Network:
    """``cidr`` as an IPv4 block no broader than ``MIN_CLIENT_PREFIX_LENGTH``.

    Raises:
        ConfigError: not a CIDR block, IPv6 (the cluster and the VPC are IPv4; EKS accepts only
            IPv4 blocks in an IPv4 cluster's publicAccessCidrs), or broader than /8.
    """
    check_block_notation(key, cidr)
    try:
        net = ipaddress.ip_network(cidr, strict=True)
    except ValueError:
        raise ConfigError(key, cidr, "is not a CIDR block (e.g. 198.51.100.7/32)") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise ConfigError(key, cidr, "is an IPv6 block: the cluster and its VPC are IPv4 (EKS accepts only IPv4 blocks here)")
    if net.prefixlen < MIN_CLIENT_PREFIX_LENGTH:
        raise ConfigError(
            key, cidr,
            f"is broader than /{MIN_CLIENT_PREFIX_LENGTH}: name your egress CIDR, not the internet (the API server would "
            "face every scanner; a runner without a fixed address: docs/aws.md, \"How pulumi reaches the cluster\")",
        )
    return net


def check_api_server_access(raw: RawConfig, platform: PlatformProfile) -> None:
    """The EKS API server is reachable from the deploying machine before any Kubernetes object is
    created, or the config says which keys make it so.

    Formats are checked on every platform (CIDR blocks, IPv4, no broader than /8; security group
    ids); the rules below only where the stack creates the cluster (``creates_cluster``):
    - ``public-cidrs`` (the default) needs ``network.apiServerPublicCidrs``: at most
      ``limits.EKS_PUBLIC_ACCESS_CIDRS_MAX`` public blocks (no private, loopback, shared or other
      reserved range: EKS refuses them, and the public endpoint never sees such a source);
      documentation ranges are blockers instead (``api_server_blockers``).
    - ``private`` needs an existing VPC (``network.vpcId``: a VPC the stack creates has no VPN,
      peering or runner in it before the Kubernetes objects are created) and a source admitted
      on 443 (``network.apiServerPrivateCidrs`` or ``apiServerPrivateSecurityGroupIds``), and no
      public CIDRs.

    Raises:
        ConfigError: the first problem, one line naming the key that fixes it.
    """
    from ..limits import EKS_PUBLIC_ACCESS_CIDRS_MAX
    from .patterns import SECURITY_GROUP_RE

    net = raw.network
    public = [_ipv4_block("network.apiServerPublicCidrs", c) for c in net.api_server_public_cidrs]
    private = [_ipv4_block("network.apiServerPrivateCidrs", c) for c in net.api_server_private_cidrs]
    for key, texts, blocks in (("network.apiServerPublicCidrs", net.api_server_public_cidrs, public),
                               ("network.apiServerPrivateCidrs", net.api_server_private_cidrs, private)):
        twice = next((t for i, t in enumerate(texts) if blocks[i] in blocks[:i]), None)
        if twice is not None:  # EKS keeps one copy; a second changes nothing
            raise ConfigError(key, twice, "is listed twice (each block once)")
    for group in net.api_server_private_security_group_ids:
        if not SECURITY_GROUP_RE.match(group):
            raise ConfigError(
                "network.apiServerPrivateSecurityGroupIds", group, "is not a security group id (sg-0123456789abcdef0)"
            )
    if not platform.creates_cluster:
        return
    access = api_server_access(raw)
    for block, text in zip(public, net.api_server_public_cidrs, strict=True):
        if not block.is_global and not any(block.subnet_of(d) for d in DOCUMENTATION_RANGES):
            raise ConfigError(
                "network.apiServerPublicCidrs", text,
                "is not a public address range (private, loopback, link-local, shared or reserved): the public endpoint "
                "only sees public sources and EKS refuses reserved ranges; a network inside the VPC or connected to it "
                "belongs in network.apiServerPrivateCidrs",
            )
    if len(public) > EKS_PUBLIC_ACCESS_CIDRS_MAX:
        raise ConfigError(
            "network.apiServerPublicCidrs", f"{len(public)} blocks",
            f"is more than EKS allows: at most {EKS_PUBLIC_ACCESS_CIDRS_MAX} public access CIDR blocks per cluster "
            "(service quota L-93A74D60, not adjustable)",
        )
    if access.public:
        if not public:
            raise ConfigError(
                "network.apiServerPublicCidrs", [],
                "is required with network.apiServerAccess public-cidrs (the default on aws-eks): name the egress address "
                f"of the machine that runs `pulumi up` ({EGRESS_LOOKUP_HINT}), or set network.apiServerAccess: private "
                "with network.vpcId and network.apiServerPrivateCidrs; otherwise `pulumi up` creates the cluster and "
                "its GPU nodes and then cannot reach it",
            )
        return
    if public:
        raise ConfigError(
            "network.apiServerPublicCidrs", list(net.api_server_public_cidrs),
            "is set, but network.apiServerAccess is private (no public endpoint): remove it, or use public-cidrs",
        )
    if not net.vpc_id:
        raise ConfigError(
            "network.apiServerAccess", "private",
            "has no path from the deploying machine: the stack creates the VPC in the same run, so no VPN, peering or "
            "runner is in it before the Kubernetes objects are created; set network.vpcId (and privateSubnetIds) to a "
            "VPC this machine reaches, with network.apiServerPrivateCidrs, or use public-cidrs with "
            "network.apiServerPublicCidrs",
        )
    if not access.private_sources:
        raise ConfigError(
            "network.apiServerPrivateCidrs", [],
            "is required with network.apiServerAccess private (or network.apiServerPrivateSecurityGroupIds): the "
            "cluster security group admits port 443 from the cluster alone, so name the network `pulumi up` runs from "
            "(a VPN, a peered or transit-gateway network, a runner's subnet)",
        )


def api_server_blockers(raw: RawConfig, platform: PlatformProfile) -> list[ConfigError]:
    """What stops `pulumi up` (in every phase) but lets the plan render: a documentation range
    (RFC 5737) in ``network.apiServerPublicCidrs``, such as the example the shipped stacks carry.
    No machine has such an address and EKS refuses it at cluster creation, after the VPC, the
    NAT gateway and the retained mirror bucket exist.

    Returns:
        One ``ConfigError`` per documentation block (empty off ``aws-eks`` or in ``private`` mode).
    """
    from ..examples import SHIPPED_EXAMPLE_VALUES

    if not platform.creates_cluster:
        return []
    shipped = SHIPPED_EXAMPLE_VALUES.get("network.apiServerPublicCidrs", {})
    out = []
    for cidr in api_server_access(raw).public_cidrs:
        block = ipaddress.IPv4Network(cidr)  # check_api_server_access ran first: an IPv4 block
        if not any(block.subnet_of(d) for d in DOCUMENTATION_RANGES):
            continue
        what = "the example value shipped in stacks/, a documentation range" if cidr in shipped else "a documentation range"
        out.append(ConfigError(
            "network.apiServerPublicCidrs", cidr,
            f"is {what} (RFC 5737): no machine has that address and EKS refuses reserved ranges; replace it with "
            f"{shipped.get(cidr) or 'the egress address of the machine that runs `pulumi up`'} ({EGRESS_LOOKUP_HINT})",
        ))
    return out

def check_cluster_cidrs(raw: RawConfig, platform: PlatformProfile) -> None:
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
    # clusterCidrs off an existing cluster: config/platform_keys.py
    if platform.runs_kubernetes and not platform.provisions_aws and k8s_cfg.allowed_cidrs and not k8s_cfg.cluster_cidrs:
        raise ConfigError(
            "kubernetes.clusterCidrs", [],
            "is required with kubernetes.allowedCidrs: name the cluster's pod and node address ranges, which the "
            "NetworkPolicy excludes from those blocks (an ipBlock admits every pod whose address it covers)",
        )


def check_block_notation(key: str, cidr: str) -> None:
    """``cidr`` is written as a block, address and prefix length: Python reads a bare address as
    its /32, AWS refuses it (``cidrIpv4`` and EKS's ``publicAccessCidrs`` take CIDR notation).

    Raises:
        ConfigError: ``cidr`` is a bare IP address (anything else is the caller's to refuse).
    """
    if not isinstance(cidr, str) or "/" in cidr:
        return
    try:
        address = ipaddress.ip_address(cidr)
    except ValueError:
        return  # not an address either: the caller's "is not a CIDR block" says so
    raise ConfigError(key, cidr, f"is an address, not a CIDR block: write its prefix length (e.g. {cidr}/"
                                 f"{address.max_prefixlen})")

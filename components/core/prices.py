"""The one price table: every billable resource the stacks declare, priced per unit with its source.

Pure (no Pulumi import). Each ``Price`` names its region, unit, USD, public source (the AWS pricing
page) and the date it was read; ``estimate=True`` marks a figure not re-read from its page here
(check the page named). Any entry can be replaced from the stack config: ``kimi-deploy:prices``
maps an entry's key to USD per its unit (``prices: {natGatewayHour: 0.048}``), the way
``compute.usdPerHour`` replaces the GPU list price (``sizing.gpu_usd_per_hour``).

``RESOURCE_PRICING`` maps every Pulumi resource type the program can declare to the entries that
price it, or to ``Free`` with the source that says so; ``stack_bill`` turns the resources a plan
records (type, name, inputs) into hourly, monthly, per-use and one-time lines, and says what keeps
billing after a trial's GPUs stop (issue 34: the mirror, NAT, EKS).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

# 365 days x 24 h / 12 months: the "month" of AWS price lists (also cost.HOURS_PER_MONTH).
HOURS_PER_MONTH = 730.0
GB = 1_000_000_000
# A configured price below this fraction of the list price is warned as a likely typo. These stacks
# run on demand, on a Savings Plan or on a capacity block, never on Spot (a reclaimed GPU node loses a
# 1.56 TB load), and the deepest published non-Spot discount is the Savings Plans' "up to 72 %"
# (28 % of list; https://aws.amazon.com/savingsplans/compute-pricing/, read 2026-12); capacity blocks
# are priced near the on-demand rate (https://aws.amazon.com/ec2/capacityblocks/pricing/). A price
# below a quarter of the list price is therefore no discount AWS publishes for these stacks.
FAR_BELOW_LIST_FRACTION = 0.25
# A configured node price that, times the node's GPUs, lands within this factor of the list price
# reads as a per-GPU price (compute.usdPerHour is per node): 17.80 x 8 = 142.40 for a 142.42 list.
PER_GPU_PRICE_TOLERANCE = 1.5

# EC2 Capacity Blocks for ML have no list price: a block's price is quoted per offering (supply and
# demand) and paid in full up front at purchase; `aws ec2 describe-capacity-block-offerings` gives
# each offering's UpfrontFee for its instances and hours. Source (read 2026-12):
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-pricing-billing.html
CAPACITY_BLOCK_PRICING = ("a capacity block is priced per block at purchase (its upfront fee: "
                          "aws ec2 describe-capacity-block-offerings)")
CAPACITY_BLOCK_PRICING_SOURCE = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-pricing-billing.html"

_KARPENTER = ("https://github.com/aws/karpenter-provider-aws/blob/main/pkg/providers/pricing/"
              "zz_generated.pricing_aws.go (the AWS price list, us-east-1 on demand)")


@dataclass(frozen=True)
class Price:
    """One entry of the price table.

    Attributes:
        key: the entry's id, also its override key under ``kimi-deploy:prices``.
        item: what is billed, in AWS's words.
        unit: what one USD figure buys: ``hour``, ``GB-month``, ``GB processed``, ``LCU-hour``,
            ``key-month``, ``GB ingested``.
        usd: USD per ``unit`` in ``region``.
        region: the region the figure is for (other regions may differ).
        source: the public page the figure comes from.
        date: when the figure was read (YYYY-MM).
        estimate: True when the figure was not re-read from ``source`` here: check that page.
    """

    key: str
    item: str
    unit: str
    usd: float
    region: str
    source: str
    date: str
    estimate: bool = False


def _p(key: str, item: str, unit: str, usd: float, source: str, date: str, *, estimate: bool = False) -> Price:
    return Price(key, item, unit, usd, "us-east-1", source, date, estimate)


_VPC = "https://aws.amazon.com/vpc/pricing/"
_FSX = "https://aws.amazon.com/fsx/lustre/pricing/"
PRICES: Mapping[str, Price] = MappingProxyType({p.key: p for p in (
    # EC2 instances on demand, from the AWS price list as Karpenter generates it (us-east-1).
    _p("p6-b300.48xlarge", "p6-b300.48xlarge instance, on demand (an ODCR bills the same rate, used or not)", "hour",
       142.416, _KARPENTER, "2026-07"),
    _p("m6idn.4xlarge", "m6idn.4xlarge instance (the stager), on demand", "hour", 1.27296, _KARPENTER, "2026-01"),
    _p("m7i.xlarge", "m7i.xlarge instance (EKS system nodes), on demand", "hour", 0.2016, _KARPENTER, "2026-01"),
    _p("ebsGp3GbMonth", "EBS gp3 volume storage (3,000 IOPS and 125 MB/s included)", "GB-month", 0.08,
       "https://aws.amazon.com/ebs/pricing/", "2026-07", estimate=True),
    _p("eksClusterHour", "EKS cluster, Kubernetes version in standard support", "hour", 0.10,
       "https://aws.amazon.com/eks/pricing/", "2026-07", estimate=True),
    _p("natGatewayHour", "NAT gateway, per gateway", "hour", 0.045, _VPC, "2026-02"),
    _p("natGatewayGb", "NAT gateway data processed (both directions)", "GB processed", 0.045, _VPC, "2026-02"),
    _p("publicIpv4Hour", "public IPv4 address (in use or idle)", "hour", 0.005, _VPC, "2026-02"),
    _p("interfaceEndpointHour", "VPC interface endpoint, per endpoint per AZ", "hour", 0.01,
       "https://aws.amazon.com/privatelink/pricing/", "2026-03"),
    _p("interfaceEndpointGb", "VPC interface endpoint data processed", "GB processed", 0.01,
       "https://aws.amazon.com/privatelink/pricing/", "2026-03"),
    _p("s3StandardGbMonth", "S3 Standard storage, first 50 TB", "GB-month", 0.023, "https://aws.amazon.com/s3/pricing/",
       "2026-07", estimate=True),
    _p("nlbHour", "Network Load Balancer", "hour", 0.0225, "https://aws.amazon.com/elasticloadbalancing/pricing/",
       "2026-07", estimate=True),
    _p("nlbLcuHour", "Network Load Balancer capacity unit (NLCU)", "LCU-hour", 0.006,
       "https://aws.amazon.com/elasticloadbalancing/pricing/", "2026-07", estimate=True),
    _p("fsxPersistent2Ssd125GbMonth", "FSx for Lustre PERSISTENT_2 SSD, 125 MB/s/TiB", "GB-month", 0.145, _FSX,
       "2026-07", estimate=True),
    _p("fsxPersistent2Ssd250GbMonth", "FSx for Lustre PERSISTENT_2 SSD, 250 MB/s/TiB", "GB-month", 0.210, _FSX,
       "2026-07", estimate=True),
    _p("fsxPersistent2Ssd500GbMonth", "FSx for Lustre PERSISTENT_2 SSD, 500 MB/s/TiB", "GB-month", 0.340, _FSX,
       "2026-07", estimate=True),
    _p("fsxPersistent2Ssd1000GbMonth", "FSx for Lustre PERSISTENT_2 SSD, 1,000 MB/s/TiB", "GB-month", 0.600, _FSX,
       "2026-07", estimate=True),
    _p("fsxPersistent1Ssd50GbMonth", "FSx for Lustre PERSISTENT_1 SSD, 50 MB/s/TiB", "GB-month", 0.140, _FSX,
       "2026-07", estimate=True),
    _p("fsxPersistent1Ssd100GbMonth", "FSx for Lustre PERSISTENT_1 SSD, 100 MB/s/TiB", "GB-month", 0.190, _FSX,
       "2026-07", estimate=True),
    _p("fsxPersistent1Ssd200GbMonth", "FSx for Lustre PERSISTENT_1 SSD, 200 MB/s/TiB", "GB-month", 0.290, _FSX,
       "2026-07", estimate=True),
    _p("fsxScratch2GbMonth", "FSx for Lustre SCRATCH_2", "GB-month", 0.140, _FSX, "2026-07", estimate=True),
    _p("kmsKeyMonth", "KMS customer managed key (rotation included for the first two rotations)", "key-month", 1.0,
       "https://aws.amazon.com/kms/pricing/", "2026-07", estimate=True),
    _p("cloudwatchLogsIngestedGb", "CloudWatch Logs ingestion, standard class", "GB ingested", 0.50,
       "https://aws.amazon.com/cloudwatch/pricing/", "2026-07", estimate=True),
    _p("cloudwatchLogsStoredGbMonth", "CloudWatch Logs archived storage", "GB-month", 0.03,
       "https://aws.amazon.com/cloudwatch/pricing/", "2026-07", estimate=True),
    _p("cloudwatchAlarmMonth", "CloudWatch standard-resolution metric alarm", "alarm-month", 0.10,
       "https://aws.amazon.com/cloudwatch/pricing/", "2026-07", estimate=True),
)})

# FSx for Lustre entries by (deployment type, MB/s per TiB); SCRATCH_* have no throughput tier.
FSX_PRICE_KEYS: Mapping[tuple[str, int | None], str] = MappingProxyType({
    ("PERSISTENT_2", 125): "fsxPersistent2Ssd125GbMonth",
    ("PERSISTENT_2", 250): "fsxPersistent2Ssd250GbMonth",
    ("PERSISTENT_2", 500): "fsxPersistent2Ssd500GbMonth",
    ("PERSISTENT_2", 1000): "fsxPersistent2Ssd1000GbMonth",
    ("PERSISTENT_1", 50): "fsxPersistent1Ssd50GbMonth",
    ("PERSISTENT_1", 100): "fsxPersistent1Ssd100GbMonth",
    ("PERSISTENT_1", 200): "fsxPersistent1Ssd200GbMonth",
    ("SCRATCH_2", None): "fsxScratch2GbMonth",
})


@dataclass(frozen=True)
class Free:
    """A resource type that bills nothing by itself, and the source that says so."""

    source: str


@dataclass(frozen=True)
class Billed:
    """A resource type priced by ``keys`` (``instance type`` stands for the instance's own entry)."""

    keys: tuple[str, ...]


_FREE_VPC = Free(f"{_VPC}: no charge for the VPC, subnets, route tables, internet gateways or security groups")
_FREE_IAM = Free("https://aws.amazon.com/iam/faqs/: IAM is offered at no additional charge")
_FREE_S3_CONFIG = Free("https://aws.amazon.com/s3/pricing/: bucket settings bill nothing; storage is billed on the "
                       "bucket line, requests per use")
_FREE_LOGICAL = Free("no cloud resource: a Pulumi component, provider or random value")
_FREE_IN_CLUSTER = Free("a Kubernetes object: runs on the nodes priced on their own lines, creates no cloud resource")
_FREE_EKS_ADDON = Free("https://aws.amazon.com/eks/pricing/: add-ons and Pod Identity bill nothing beyond the nodes "
                       "they run on")
INSTANCE_TYPE = "instance type"

# Every resource type the program may declare -> its pricing. A type missing here is refused by
# ``pricing_of`` (tests/test_cost.py runs the four stacks under the mock engine).
RESOURCE_PRICING: Mapping[str, Free | Billed] = MappingProxyType({
    "aws:ec2/instance:Instance": Billed((INSTANCE_TYPE, "ebsGp3GbMonth")),
    "aws:eks/nodeGroup:NodeGroup": Billed((INSTANCE_TYPE, "ebsGp3GbMonth")),
    "aws:ec2/capacityReservation:CapacityReservation": Billed((INSTANCE_TYPE,)),
    "aws:eks/cluster:Cluster": Billed(("eksClusterHour",)),
    "aws:ec2/natGateway:NatGateway": Billed(("natGatewayHour", "natGatewayGb")),
    "aws:ec2/eip:Eip": Billed(("publicIpv4Hour",)),
    "aws:ec2/vpcEndpoint:VpcEndpoint": Billed(("interfaceEndpointHour", "interfaceEndpointGb")),
    "aws:s3/bucket:Bucket": Billed(("s3StandardGbMonth",)),
    "aws:fsx/lustreFileSystem:LustreFileSystem": Billed(tuple(FSX_PRICE_KEYS.values())),
    "aws:kms/key:Key": Billed(("kmsKeyMonth",)),
    "aws:cloudwatch/logGroup:LogGroup": Billed(("cloudwatchLogsIngestedGb", "cloudwatchLogsStoredGbMonth")),
    "aws:cloudwatch/metricAlarm:MetricAlarm": Billed(("cloudwatchAlarmMonth",)),
    "kubernetes:core/v1:Service": Billed(("nlbHour", "nlbLcuHour")),
    "aws:ec2/launchTemplate:LaunchTemplate": Free("https://aws.amazon.com/ec2/pricing/: a launch template bills nothing; "
                                                  "its instances' volumes are billed on the instance lines"),
    "aws:ec2/vpc:Vpc": _FREE_VPC,
    "aws:ec2/subnet:Subnet": _FREE_VPC,
    "aws:ec2/routeTable:RouteTable": _FREE_VPC,
    "aws:ec2/route:Route": _FREE_VPC,
    "aws:ec2/routeTableAssociation:RouteTableAssociation": _FREE_VPC,
    "aws:ec2/internetGateway:InternetGateway": _FREE_VPC,
    "aws:ec2/securityGroup:SecurityGroup": _FREE_VPC,
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": _FREE_VPC,
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": _FREE_VPC,
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": _FREE_VPC,
    "aws:iam/role:Role": _FREE_IAM,
    "aws:iam/rolePolicy:RolePolicy": _FREE_IAM,
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": _FREE_IAM,
    "aws:iam/instanceProfile:InstanceProfile": _FREE_IAM,
    "aws:iam/policy:Policy": _FREE_IAM,
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": _FREE_S3_CONFIG,
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": _FREE_S3_CONFIG,
    "aws:s3/bucketPolicy:BucketPolicy": _FREE_S3_CONFIG,
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": _FREE_S3_CONFIG,
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": _FREE_S3_CONFIG,
    "aws:s3/bucketObjectv2:BucketObjectv2": Free("https://aws.amazon.com/s3/pricing/: a few KB of scripts, well "
                                                 "under a cent a month"),
    "aws:ssm/parameter:Parameter": Free("https://aws.amazon.com/systems-manager/pricing/: standard parameters "
                                        "(SecureString included) bill nothing; the aws/ssm key is AWS managed"),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": Free(
        f"{_FSX}: the association bills nothing; the file system and the S3 requests of its import bill"),
    "aws:eks/addon:Addon": _FREE_EKS_ADDON,
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": _FREE_EKS_ADDON,
    "aws:scheduler/schedule:Schedule": Free("https://aws.amazon.com/eventbridge/pricing/: EventBridge Scheduler's "
                                            "free tier is 14 million invocations a month (a trial's stop is one)"),
    "aws:scheduler/scheduleGroup:ScheduleGroup": Free("https://aws.amazon.com/eventbridge/pricing/: groups bill nothing"),
    "random:index/randomId:RandomId": _FREE_LOGICAL,
    "random:index/randomPassword:RandomPassword": _FREE_LOGICAL,
    "pulumi:providers:kubernetes": _FREE_LOGICAL,
    "kubernetes:apps/v1:Deployment": _FREE_IN_CLUSTER,
    "kubernetes:batch/v1:Job": _FREE_IN_CLUSTER,
    "kubernetes:core/v1:ConfigMap": _FREE_IN_CLUSTER,
    "kubernetes:core/v1:Namespace": _FREE_IN_CLUSTER,
    "kubernetes:core/v1:Secret": _FREE_IN_CLUSTER,
    "kubernetes:core/v1:ServiceAccount": _FREE_IN_CLUSTER,
    "kubernetes:core/v1:PersistentVolume": Free("a static volume of the FSx file system: billed on the FSx line"),
    "kubernetes:core/v1:PersistentVolumeClaim": Free("bound to the static FSx volume (billed on the FSx line); on an "
                                                     "existing cluster its storage class bills the cluster's owner"),
    "kubernetes:helm.sh/v3:Release": Free("controllers that run on the system nodes priced on their own line; no chart "
                                          "the program installs declares a load balancer or a volume"),
    "kubernetes:networking.k8s.io/v1:NetworkPolicy": _FREE_IN_CLUSTER,
    "kubernetes:policy/v1:PodDisruptionBudget": _FREE_IN_CLUSTER,
    "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet": _FREE_IN_CLUSTER,
    "kubernetes:resource.nvidia.com/v1beta1:ComputeDomain": _FREE_IN_CLUSTER,
    "kubernetes:keda.sh/v1alpha1:ScaledObject": _FREE_IN_CLUSTER,
    "kubernetes:monitoring.coreos.com/v1:PodMonitor": _FREE_IN_CLUSTER,
    "kubernetes:monitoring.coreos.com/v1:PrometheusRule": _FREE_IN_CLUSTER,
})
_LOGICAL_PREFIXES = ("kimi-deploy:",)  # the program's own component resources


class UnpricedResourceType(ValueError):
    """A declared resource type with no entry in ``RESOURCE_PRICING`` (neither priced nor free)."""


def pricing_of(resource_type: str) -> Free | Billed:
    """How ``resource_type`` (a Pulumi type token) is priced.

    Raises:
        UnpricedResourceType: the type is in neither the price map nor the free list.
    """
    if resource_type.startswith(_LOGICAL_PREFIXES):
        return _FREE_LOGICAL
    try:
        return RESOURCE_PRICING[resource_type]
    except KeyError:
        raise UnpricedResourceType(
            f"{resource_type}: no price entry and not listed free (components/core/prices.py RESOURCE_PRICING)"
        ) from None


def price_table(overrides: Mapping[str, float] | None = None) -> dict[str, Price]:
    """``PRICES`` with the stack's ``kimi-deploy:prices`` overrides applied (source ``prices.<key> (config)``).

    Raises:
        ConfigError: an override names no entry of the table, or is not a positive number.
    """
    table = dict(PRICES)
    for key, usd in (overrides or {}).items():
        if key not in table:
            from .errors import did_you_mean

            raise ConfigError(f"prices.{key}", usd, "is not an entry of the price table" + did_you_mean(key, list(table)))
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not usd > 0:
            raise ConfigError(f"prices.{key}", usd, f"must be a positive number of USD per {table[key].unit}")
        base = table[key]
        table[key] = Price(key, base.item, base.unit, float(usd), base.region, f"prices.{key} (config)", "config")
    return table


def list_price_usd_per_hour(instance_type: str) -> float | None:
    """The on-demand list price of ``instance_type`` in ``PRICES`` (USD per hour, us-east-1), or None."""
    entry = PRICES.get(instance_type)
    return entry.usd if entry is not None and entry.unit == "hour" else None


def far_below_list(configured: float, list_price: float | None) -> bool:
    """True when ``configured`` is under ``FAR_BELOW_LIST_FRACTION`` of ``list_price`` (a likely typo)."""
    return list_price is not None and configured < list_price * FAR_BELOW_LIST_FRACTION


def looks_per_gpu(configured: float, list_price: float | None, gpus_per_node: int) -> bool:
    """True when ``configured`` (a node price, USD/h) times ``gpus_per_node`` is within
    ``PER_GPU_PRICE_TOLERANCE`` of ``list_price`` either way while ``configured`` itself is far below it:
    the figure reads as a per-GPU price."""
    if list_price is None or gpus_per_node <= 1 or not far_below_list(configured, list_price):
        return False
    ratio = configured * gpus_per_node / list_price
    return 1 / PER_GPU_PRICE_TOLERANCE <= ratio <= PER_GPU_PRICE_TOLERANCE


def node_price_warning(key: str, configured: float, instance_type: str, gpus_per_node: int) -> str | None:
    """The warning for a node price ``configured`` (USD per node-hour, set by ``key``) far below the
    on-demand list price of ``instance_type``, with both figures and the share; it says "looks like a
    per-GPU price" when ``configured`` x ``gpus_per_node`` is near the list price. None when no warning."""
    listed = list_price_usd_per_hour(instance_type)
    if listed is None or not far_below_list(configured, listed):
        return None
    share = configured / listed
    hint = (f"looks like a per-GPU price ({configured:g} x {gpus_per_node} GPUs = USD {configured * gpus_per_node:,.2f}/h); "
            f"{key} is per node" if looks_per_gpu(configured, listed, gpus_per_node) else "check for a typo")
    return (f"{key} {configured:g} is {share:.1%} of the on-demand list price of {instance_type} "
            f"(USD {listed:,.2f}/h, {PRICES[instance_type].region}; under {FAR_BELOW_LIST_FRACTION:.0%} of it, below any "
            f"published non-Spot discount): {hint}")


def override_warnings(gpu_usd_per_node_hour: float | None, instance_type: str,
                      overrides: Mapping[str, float] | None, gpus_per_node: int = 1) -> list[str]:
    """Warnings for configured prices far below the list price, each with both figures.

    Args:
        gpu_usd_per_node_hour: ``compute.usdPerHour`` (per node-hour), or None when unset.
        instance_type: the GPU instance type.
        overrides: the ``kimi-deploy:prices`` map.
        gpus_per_node: GPUs of one ``instance_type`` (names a per-GPU price as such).
    """
    out = []
    if gpu_usd_per_node_hour is not None:
        node = node_price_warning("compute.usdPerHour", gpu_usd_per_node_hour, instance_type, gpus_per_node)
        if node is not None:
            out.append(f"{node}; the plan's and cost's figures rest on it")
    for key, usd in (overrides or {}).items():
        base = PRICES.get(key)
        if base is not None and isinstance(usd, (int, float)) and far_below_list(float(usd), base.usd):
            out.append(f"prices.{key} {usd:g} is far below the list price (USD {base.usd:g} per {base.unit}, "
                       f"{base.region}): a typo? The plan's and cost's figures rest on it")
    return out


@dataclass(frozen=True)
class BillLine:
    """One line of a stack's bill.

    Attributes:
        item: what is billed (``NAT gateway``).
        resource_type: the Pulumi type it prices (``aws:ec2/natGateway:NatGateway``).
        quantity: units billed (2 nodes, 2,400 GB, 1 gateway).
        unit: the price's unit; usd_per_unit: its USD.
        usd_per_hour: what the line adds per hour (monthly units / 730 h); None for per-use lines.
        source: the price's source (page, or the config key that replaced it); estimate: see ``Price``.
        keeps_billing: True when the line bills on after the GPU nodes stop (a trial's expiry).
        one_time_usd: a one-time charge (the hub download through the NAT gateway), else None.
        note: how the quantity was derived.
    """

    item: str
    resource_type: str
    quantity: float
    unit: str
    usd_per_unit: float | None
    usd_per_hour: float | None
    source: str
    estimate: bool
    keeps_billing: bool
    one_time_usd: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Bill:
    """A stack's priced resources.

    Attributes:
        lines: every billed line (per-use lines have ``usd_per_hour`` None).
        free: ``{resource type: source}`` of the declared types that bill nothing.
        gpu_price_known: False when the GPU line has no price (its hourly total is then a floor).
        unpriced: declared types or instance types the table does not know (the totals then
            leave them out; tests/test_cost.py keeps this empty for every stack).
        hub_download_nodes: GPU nodes that each download the weights through the NAT gateway on
            every deploy (``one_time_usd`` is then per deploy, and each replaced node adds its
            share), or 0 when the download passes once (into the mirror).
    """

    lines: tuple[BillLine, ...]
    free: Mapping[str, str] = field(default_factory=dict)
    gpu_price_known: bool = True
    unpriced: tuple[str, ...] = ()
    hub_download_nodes: int = 0

    @property
    def usd_per_hour(self) -> float:
        """Every hourly line, USD per hour."""
        return sum(line.usd_per_hour or 0.0 for line in self.lines)

    @property
    def usd_per_month(self) -> float:
        """``usd_per_hour`` x 730 h."""
        return self.usd_per_hour * HOURS_PER_MONTH

    @property
    def after_gpu_stop_usd_per_hour(self) -> float:
        """What keeps billing once the GPU nodes stop (mirror, NAT, EKS, FSx...), USD per hour."""
        return sum(line.usd_per_hour or 0.0 for line in self.lines if line.keeps_billing)

    @property
    def one_time_usd(self) -> float:
        """One-time charges (the first hub download through NAT), USD."""
        return sum(line.one_time_usd or 0.0 for line in self.lines)

    def trial_usd(self, hours: float) -> float:
        """The expected bill of a trial that runs ``hours`` to its expiry: hourly x hours + one-time."""
        return self.usd_per_hour * hours + self.one_time_usd


@dataclass(frozen=True)
class GpuPrice:
    """The GPU nodes' price as the sizing resolves it (``sizing.gpu_usd_per_hour``).

    Attributes:
        instance_type: the GPU instance type; usd_per_hour: all billed GPU nodes, or None when unknown;
        source: where the price comes from; nodes: the billed node count.
        reserved: True for an ODCR or a capacity block, which bill for their term whether the
            nodes run or not (so they keep billing after the GPU nodes stop).
    """

    instance_type: str
    usd_per_hour: float | None
    source: str
    nodes: int
    reserved: bool = False


def _by_name(resources: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {r["name"]: r for r in resources}


def _template_of(resource: Mapping[str, Any], named: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The inputs of the launch template ``resource`` references (``{"id": "<name>-id"}`` under the mock engine)."""
    ref = (resource["inputs"].get("launchTemplate") or {}).get("id") or ""
    template = named.get(ref.removesuffix("-id")) if isinstance(ref, str) else None
    return template["inputs"] if template else {}


def _root_gib(inputs: Mapping[str, Any], template: Mapping[str, Any]) -> int:
    """The root volume in GiB: ``rootBlockDevice.volumeSize`` or the template's first EBS mapping."""
    root = inputs.get("rootBlockDevice") or {}
    if root.get("volumeSize"):
        return int(root["volumeSize"])
    for mapping in template.get("blockDeviceMappings") or inputs.get("blockDeviceMappings") or []:
        size = (mapping.get("ebs") or {}).get("volumeSize")
        if size:
            return int(size)
    return 0


def _line(table: Mapping[str, Price], key: str, resource_type: str, quantity: float, *, hourly_units: bool,
          keeps_billing: bool, note: str = "", item: str | None = None) -> BillLine:
    """A line of ``quantity`` units of ``table[key]``: hourly when the unit is an hour, per month
    (/730 h) for ``-month`` units, per use (no hourly figure) otherwise unless ``hourly_units``."""
    price = table[key]
    if price.unit == "hour" or hourly_units:
        per_hour: float | None = quantity * price.usd
    elif price.unit.endswith("-month"):
        per_hour = quantity * price.usd / HOURS_PER_MONTH
    else:
        per_hour = None
    return BillLine(item or price.item, resource_type, quantity, price.unit, price.usd, per_hour, price.source,
                    price.estimate, keeps_billing, note=note)


def stack_bill(
    resources: Sequence[Mapping[str, Any]],
    gpu: GpuPrice,
    *,
    weights_bytes: int,
    gpu_volume_survives_stop: bool,
    gpu_nodes_declared: bool = True,
    overrides: Mapping[str, float] | None = None,
    hub_download_via_nat: bool = True,
    hub_download_nodes: int = 0,
) -> Bill:
    """Price every resource a plan declares.

    Args:
        resources: the recorded resources, each ``{"type", "name", "inputs"}`` (the plan document's
            ``resources``; components/plan_engine.py).
        gpu: the GPU price (config override, capacity block or list price) and billed node count.
        weights_bytes: the checkpoint's size: the S3 mirror holds it, and the first hub download
            passes the NAT gateway once (``hub_download_via_nat``).
        gpu_volume_survives_stop: the GPU nodes' root volumes keep billing when the GPUs stop (an
            EC2 instance under systemd, stopped at expiry, keeps its volume; a node group scaled to
            zero deletes its nodes' volumes): the platform profile's ``serves_under_systemd``.
        gpu_nodes_declared: the stack declares its GPU nodes; False on an existing cluster, whose GPU
            nodes bill (to the cluster's owner) without a resource here (``provisions_aws``).
            A reserved ``gpu`` (ODCR, capacity block) with no GPU node declared (``phase: stage``)
            is a GPU line all the same: the reservation bills its term, running or not.
        overrides: the stack's ``kimi-deploy:prices``.
        hub_download_nodes: GPU nodes that each copy the weights from the hub themselves (no
            mirror, a per-node copy: ``weights.per_node_copy_step``): the NAT gateway then passes
            the weights once per node on every deploy and again for every replaced node, not
            once; 0 (the default) when one download fills the mirror.

    Returns:
        The ``Bill``. A GPU instance or node group is the GPU line (``gpu``), whatever its type. A
        type or instance type without a price is named in ``Bill.unpriced`` (the plan shows it),
        not raised: a plan still renders.

    Raises:
        ConfigError: a bad override (``price_table``).
    """
    table = price_table(overrides)
    named = _by_name(resources)
    lines: list[BillLine] = []
    free: dict[str, str] = {}
    weights_gb = weights_bytes / GB
    unpriced: list[str] = []
    for res in resources:
        kind, inputs = res["type"], res["inputs"]
        try:
            pricing = pricing_of(kind)
        except UnpricedResourceType:
            unpriced.append(kind)
            continue
        if isinstance(pricing, Free):
            free[kind] = pricing.source
            continue
        if kind in ("aws:ec2/instance:Instance", "aws:eks/nodeGroup:NodeGroup",
                    "aws:ec2/capacityReservation:CapacityReservation"):
            template = _template_of(res, named)
            types = inputs.get("instanceTypes") or [inputs.get("instanceType") or template.get("instanceType")]
            itype = types[0]
            count = int((inputs.get("scalingConfig") or {}).get("desiredSize") or inputs.get("instanceCount") or 1)
            is_gpu = itype == gpu.instance_type
            if is_gpu:
                lines.append(BillLine(f"GPU nodes ({itype})", kind, gpu.nodes, "hour",
                                      gpu.usd_per_hour / gpu.nodes if gpu.usd_per_hour is not None else None,
                                      gpu.usd_per_hour, gpu.source, gpu.source.startswith("estimate"), gpu.reserved,
                                      note="reserved capacity bills its term, running or not" if gpu.reserved else ""))
            elif itype in table:
                lines.append(_line(table, itype, kind, count, hourly_units=True, keeps_billing=True,
                                   note=f"{count} x {itype}"))
            else:
                unpriced.append(f"{kind} {res['name']} ({itype})")
            root = _root_gib(inputs, template)
            if root and kind != "aws:ec2/capacityReservation:CapacityReservation":
                n = count  # volumes of the nodes that run (a capacity block's unused trays have none)
                # A stopped EC2 instance keeps its volume; a node group scaled to zero deletes its nodes'.
                keeps = not is_gpu or gpu_volume_survives_stop
                lines.append(_line(table, "ebsGp3GbMonth", kind, n * root, hourly_units=False, keeps_billing=keeps,
                                   note=f"{n} x {root} GiB root", item=f"EBS gp3 root volumes ({res['name']})"))
        elif kind == "aws:eks/cluster:Cluster":
            lines.append(_line(table, "eksClusterHour", kind, 1, hourly_units=True, keeps_billing=True))
        elif kind == "aws:ec2/natGateway:NatGateway":
            lines.append(_line(table, "natGatewayHour", kind, 1, hourly_units=True, keeps_billing=True))
            passes = max(1, hub_download_nodes)
            note = (f"each of {hub_download_nodes} GPU nodes downloads the weights from the hub through it on every "
                    "deploy and every node replacement" if hub_download_nodes
                    else "the first hub download of the weights passes it once")
            gb_line = _line(table, "natGatewayGb", kind, weights_gb * passes if hub_download_via_nat else 0,
                            hourly_units=False, keeps_billing=True, note=note if hub_download_via_nat else "per GB")
            if hub_download_via_nat:
                gb_line = BillLine(**{**gb_line.__dict__,
                                      "one_time_usd": weights_gb * passes * table["natGatewayGb"].usd})
            lines.append(gb_line)
        elif kind == "aws:ec2/eip:Eip":
            lines.append(_line(table, "publicIpv4Hour", kind, 1, hourly_units=True, keeps_billing=True))
        elif kind == "aws:ec2/vpcEndpoint:VpcEndpoint":
            if (inputs.get("vpcEndpointType") or "Gateway") == "Gateway":
                free[kind] = "https://aws.amazon.com/privatelink/pricing/: gateway endpoints (S3, DynamoDB) bill nothing"
                continue
            azs = len(inputs.get("subnetIds") or []) or 1
            lines.append(_line(table, "interfaceEndpointHour", kind, azs, hourly_units=True, keeps_billing=True,
                               note=f"{inputs.get('serviceName')} in {azs} AZ(s)"))
            lines.append(_line(table, "interfaceEndpointGb", kind, 0, hourly_units=False, keeps_billing=True))
        elif kind == "aws:s3/bucket:Bucket":
            lines.append(_line(table, "s3StandardGbMonth", kind, weights_gb, hourly_units=False, keeps_billing=True,
                               note="the mirrored weights"))
        elif kind == "aws:fsx/lustreFileSystem:LustreFileSystem":
            deployment = inputs.get("deploymentType") or "SCRATCH_2"
            tier = inputs.get("perUnitStorageThroughput")
            key = FSX_PRICE_KEYS.get((deployment, int(tier) if tier else None))
            if key is None:
                unpriced.append(f"{kind} {res['name']} ({deployment} at {tier} MB/s/TiB)")
                continue
            gib = int(inputs.get("storageCapacity") or 0)
            lines.append(_line(table, key, kind, gib, hourly_units=False, keeps_billing=True,
                               note=f"{gib:,} GiB provisioned (billed as GB-months of capacity)"))
            # USER_PROVISIONED metadata IOPS bill on their own (FSx for Lustre pricing page, "Metadata IOPS"); the
            # table holds no figure for them yet, so the bill names them unpriced rather than leave them out.
            meta = inputs.get("metadataConfiguration") or {}
            if meta.get("mode") == "USER_PROVISIONED" and meta.get("iops"):
                unpriced.append(f"{kind} {res['name']} ({int(meta['iops']):,} provisioned metadata IOPS, USER_PROVISIONED)")
        elif kind == "aws:kms/key:Key":
            lines.append(_line(table, "kmsKeyMonth", kind, 1, hourly_units=False, keeps_billing=True))
        elif kind == "aws:cloudwatch/logGroup:LogGroup":
            lines.append(_line(table, "cloudwatchLogsIngestedGb", kind, 0, hourly_units=False, keeps_billing=True,
                               note="per GB of control-plane logs"))
        elif kind == "aws:cloudwatch/metricAlarm:MetricAlarm":
            lines.append(_line(table, "cloudwatchAlarmMonth", kind, 1, hourly_units=False, keeps_billing=True))
        elif kind == "kubernetes:core/v1:Service":
            spec = inputs.get("spec") or {}
            if spec.get("type") != "LoadBalancer":
                free[kind] = "a ClusterIP or NodePort Service creates no cloud resource"
                continue
            lines.append(_line(table, "nlbHour", kind, 1, hourly_units=True, keeps_billing=True,
                               note=str((inputs.get("metadata") or {}).get("name"))))
            lines.append(_line(table, "nlbLcuHour", kind, 0, hourly_units=False, keeps_billing=True,
                               note="per LCU-hour of traffic"))
    if not gpu_nodes_declared and not any(line.item.startswith("GPU nodes") for line in lines):
        # An existing cluster: its GPU nodes are not declared here, but they bill (to the cluster's owner).
        lines.append(BillLine(f"GPU nodes ({gpu.instance_type}, existing cluster)", "existing cluster", gpu.nodes, "hour",
                              gpu.usd_per_hour / gpu.nodes if gpu.usd_per_hour is not None else None,
                              gpu.usd_per_hour, gpu.source, gpu.source.startswith("estimate"), gpu.reserved))
    if gpu.reserved and gpu_nodes_declared and not any(line.item.startswith("GPU nodes") for line in lines):
        # No GPU node declared (phase: stage), but an ODCR or a capacity block bills its term all the same.
        lines.append(BillLine(f"GPU nodes ({gpu.instance_type}, reserved: none running in this phase)",
                              "reserved capacity", gpu.nodes, "hour",
                              gpu.usd_per_hour / gpu.nodes if gpu.usd_per_hour is not None else None,
                              gpu.usd_per_hour, gpu.source, gpu.source.startswith("estimate"), True,
                              note="reserved capacity bills its term, running or not"))
    # The GPU line first, then by hourly USD (per-use lines last).
    lines.sort(key=lambda line: (not line.item.startswith("GPU nodes"), -(line.usd_per_hour or -1.0)))
    return Bill(tuple(lines), free, gpu.usd_per_hour is not None, tuple(sorted(set(unpriced))),
                hub_download_nodes if hub_download_via_nat and any(line.one_time_usd for line in lines) else 0)

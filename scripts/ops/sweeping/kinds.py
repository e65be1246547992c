"""The AWS resource kinds the sweeper knows: how each is discovered, deleted and confirmed gone,
and which kinds must be gone before it (``REGISTRY``; the delete order is built from it).

Dependencies (``after``) are what AWS enforces or what would undo a deletion:

- an EKS cluster cannot be deleted while it has node groups (``ResourceInUseException``);
- a load balancer goes after its cluster: while the cluster runs, the service controller
  would create a deleted one again;
- an FSx file system after the instances and node groups that mount it;
- network interfaces after what attaches them (instances, load balancers, the cluster's VPC
  CNI, FSx); security groups after everything that can sit in them (``DependencyViolation``);
- EBS volumes after the instances they are attached to (``VolumeInUse``).

What Kubernetes created in AWS for one of our clusters but did not tag with the stack (load
balancers, their interfaces and groups, CNI interfaces) is found by ``cluster_leftovers``, run
after every kind's own discovery; it yields resources of the kinds above.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from components.core.config import format_utc as _utc
from components.core.naming import TAG_EXPIRES_AT as TAG_EXPIRES
from components.core.naming import TAG_RETAIN, TAG_STACK
from scripts.ops.sweeping.found import OURS_FILTER, Found, classify, error_code, paginate, tags_of
from scripts.ops.sweeping.registry import Kind, Registry

Client = Callable[[str], Any]  # service name -> boto3 client of one region

# What Kubernetes creates in AWS for a cluster, and how it marks it (the stack's own tags come
# from the Service annotation service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags,
# but older objects, or ones made by hand in the cluster, may carry only these):
# - load balancers and their security groups: ``kubernetes.io/cluster/<name>`` (the legacy AWS
#   cloud provider's service controller) or ``elbv2.k8s.aws/cluster: <name>`` (AWS Load
#   Balancer Controller);
# - network interfaces: ``cluster.k8s.amazonaws.com/name: <name>`` (Amazon VPC CNI) or
#   ``kubernetes.io/cluster/<name>``; a load balancer's own interfaces are described
#   ``ELB net/<lb name>/<id>`` (``app/`` for ALBs) and carry no tag at all.
CLUSTER_TAG_PREFIX = "kubernetes.io/cluster/"
LBC_CLUSTER_TAG = "elbv2.k8s.aws/cluster"
CNI_CLUSTER_TAG = "cluster.k8s.amazonaws.com/name"

CAPACITY_STATES_PAID = ("active", "scheduled", "payment-pending", "pending", "assessing")


@dataclass
class DiscoveryContext:
    """What a kind's ``discover`` gets for one region.

    Attributes:
        client: ``service -> boto3 client`` of ``region``.
        region, now: the region and the clock (aware UTC).
        found: what the kinds before this one found (in registration order).
        shared: memo between kinds of one region (EKS cluster descriptions, untagged load balancers).
    """

    client: Client
    region: str
    now: datetime
    found: list[Found] = field(default_factory=list)
    shared: dict[str, Any] = field(default_factory=dict)

    def classify(self, kind: str, rid: str, tags: Mapping[str, str], detail: dict | None = None) -> Found | None:
        """``classify`` in this region at this clock."""
        return classify(kind, rid, self.region, tags, self.now, detail)


# -- discovery ------------------------------------------------------------------------------------


def _discover_instances(ctx: DiscoveryContext) -> list[Found]:
    states = {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}
    out = []
    for res in paginate(ctx.client("ec2"), "describe_instances", "Reservations", Filters=[*OURS_FILTER, states]):
        for inst in res.get("Instances", []):
            detail = {"instance_type": inst.get("InstanceType"), "state": inst.get("State", {}).get("Name")}
            f = ctx.classify("ec2-instance", inst["InstanceId"], tags_of(inst.get("Tags")), detail)
            if f:
                out.append(f)
    return out


def _discover_volumes(ctx: DiscoveryContext) -> list[Found]:
    out = []
    for vol in paginate(ctx.client("ec2"), "describe_volumes", "Volumes", Filters=OURS_FILTER):
        detail = {"state": vol.get("State"), "size_gib": vol.get("Size")}
        f = ctx.classify("ebs-volume", vol["VolumeId"], tags_of(vol.get("Tags")), detail)
        if f:
            out.append(f)
    return out


def _discover_security_groups(ctx: DiscoveryContext) -> list[Found]:
    out = []
    for sg in paginate(ctx.client("ec2"), "describe_security_groups", "SecurityGroups", Filters=OURS_FILTER):
        detail = {"name": sg.get("GroupName"), "vpc_id": sg.get("VpcId")}
        f = ctx.classify("security-group", sg["GroupId"], tags_of(sg.get("Tags")), detail)
        if f:
            out.append(f)
    return out


def _discover_network_interfaces(ctx: DiscoveryContext) -> list[Found]:
    out = []
    for eni in paginate(ctx.client("ec2"), "describe_network_interfaces", "NetworkInterfaces", Filters=OURS_FILTER):
        detail = {"status": eni.get("Status"), "description": eni.get("Description", "")}
        f = ctx.classify("network-interface", eni["NetworkInterfaceId"], tags_of(eni.get("TagSet")), detail)
        if f:
            out.append(f)
    return out


def _discover_capacity(ctx: DiscoveryContext) -> list[Found]:
    out = []
    for cr in paginate(ctx.client("ec2"), "describe_capacity_reservations", "CapacityReservations", Filters=OURS_FILTER):
        state = cr.get("State")
        end = cr.get("EndDate")
        detail = {
            "state": state,
            "reservation_type": cr.get("ReservationType", "default"),
            "instance_type": cr.get("InstanceType"),
            "instance_count": cr.get("TotalInstanceCount"),
            "availability_zone": cr.get("AvailabilityZone"),
            "end_date": _utc(end) if isinstance(end, datetime) else end,
        }
        f = ctx.classify("capacity-reservation", cr["CapacityReservationId"], tags_of(cr.get("Tags")), detail)
        if f and state in CAPACITY_STATES_PAID:
            out.append(f)
    return out


def _clusters(ctx: DiscoveryContext) -> list[dict[str, Any]]:
    """The region's EKS cluster descriptions, listed once per region (node groups need them too)."""
    if "eks_clusters" not in ctx.shared:
        eks = ctx.client("eks")
        ctx.shared["eks_clusters"] = [eks.describe_cluster(name=n)["cluster"] for n in paginate(eks, "list_clusters", "clusters")]
    clusters: list[dict[str, Any]] = ctx.shared["eks_clusters"]
    return clusters


def _discover_node_groups(ctx: DiscoveryContext) -> list[Found]:
    """Node groups; one without its own ``expires-at`` inherits its cluster's (and its stack tags)."""
    eks = ctx.client("eks")
    out = []
    for cluster in _clusters(ctx):
        name = cluster["name"]
        ctags = tags_of(cluster.get("tags"))
        cluster_expiry = ctags.get(TAG_EXPIRES) if TAG_STACK in ctags else None
        for ng_name in paginate(eks, "list_nodegroups", "nodegroups", clusterName=name):
            ng = eks.describe_nodegroup(clusterName=name, nodegroupName=ng_name)["nodegroup"]
            ntags = tags_of(ng.get("tags"))
            if TAG_EXPIRES not in ntags and cluster_expiry:
                ntags = {**ctags, **ntags, TAG_EXPIRES: cluster_expiry}  # inherits the cluster's expiry
            elif TAG_STACK not in ntags and TAG_STACK in ctags:
                ntags = {**ctags, **ntags}
            detail = {"instance_types": ng.get("instanceTypes"), "status": ng.get("status")}
            f = ctx.classify("eks-nodegroup", f"{name}/{ng_name}", ntags, detail)
            if f:
                out.append(f)
    return out


def _discover_clusters(ctx: DiscoveryContext) -> list[Found]:
    out = []
    for cluster in _clusters(ctx):
        vpc = cluster.get("resourcesVpcConfig") or {}
        detail = {
            "status": cluster.get("status"),
            # How its Kubernetes API is reached: the sweeper's `pulumi destroy` needs it (sweep.py).
            "endpoint": cluster.get("endpoint"),
            "endpoint_public_access": vpc.get("endpointPublicAccess"),
            "public_access_cidrs": vpc.get("publicAccessCidrs"),
        }
        f = ctx.classify("eks-cluster", cluster["name"], tags_of(cluster.get("tags")), detail)
        if f:
            out.append(f)
    return out


def _discover_load_balancers(ctx: DiscoveryContext) -> list[Found]:
    """Load balancers with our stack tag; the others are kept in ``ctx.shared["untagged_lbs"]``
    for ``cluster_leftovers`` (Kubernetes may have created them for one of our clusters)."""
    client = ctx.client("elbv2")
    untagged: list[tuple[dict, dict[str, str]]] = ctx.shared.setdefault("untagged_lbs", [])
    out = []
    balancers = paginate(client, "describe_load_balancers", "LoadBalancers")
    for i in range(0, len(balancers), 20):  # DescribeTags takes at most 20 ARNs
        chunk = balancers[i : i + 20]
        descs = client.describe_tags(ResourceArns=[b["LoadBalancerArn"] for b in chunk])["TagDescriptions"]
        by_arn = {d["ResourceArn"]: tags_of(d.get("Tags")) for d in descs}
        for b in chunk:
            tags = by_arn.get(b["LoadBalancerArn"], {})
            if TAG_STACK not in tags:
                untagged.append((b, tags))
            detail = {"name": b.get("LoadBalancerName"), "type": b.get("Type")}
            f = ctx.classify("load-balancer", b["LoadBalancerArn"], tags, detail)
            if f:
                out.append(f)
    return out


def _discover_file_systems(ctx: DiscoveryContext) -> list[Found]:
    out = []
    for fs in paginate(ctx.client("fsx"), "describe_file_systems", "FileSystems"):
        if fs.get("Lifecycle") in ("DELETING",):
            continue
        detail = {"type": fs.get("FileSystemType"), "capacity_gib": fs.get("StorageCapacity")}
        f = ctx.classify("fsx-file-system", fs["FileSystemId"], tags_of(fs.get("Tags")), detail)
        if f:
            out.append(f)
    return out


def _discover_buckets(ctx: DiscoveryContext) -> list[Found]:
    client = ctx.client("s3")
    out = []
    for b in client.list_buckets().get("Buckets", []):
        try:
            loc = client.get_bucket_location(Bucket=b["Name"]).get("LocationConstraint") or "us-east-1"
            if loc != ctx.region:
                continue
            tags = tags_of(client.get_bucket_tagging(Bucket=b["Name"]).get("TagSet"))
        except Exception as err:  # noqa: BLE001 - untagged or foreign buckets
            if "NoSuchTagSet" in str(err) or "AccessDenied" in str(err) or "NoSuchBucket" in str(err):
                continue
            raise
        f = ctx.classify("s3-bucket", b["Name"], tags)
        if f:
            out.append(f)
    return out


def for_cluster(tags: Mapping[str, str], cluster: str) -> bool:
    """Whether AWS tags mark a resource as created by Kubernetes for EKS cluster ``cluster``."""
    return (
        f"{CLUSTER_TAG_PREFIX}{cluster}" in tags
        or tags.get(LBC_CLUSTER_TAG) == cluster
        or tags.get(CNI_CLUSTER_TAG) == cluster
    )


def cluster_leftovers(
    ec2: Any, region: str, now: datetime, found: list[Found], untagged_lbs: list[tuple[dict, dict[str, str]]]
) -> list[Found]:
    """Load balancers, their interfaces and security groups, and CNI interfaces that Kubernetes
    created for one of our EKS clusters but that carry no ``kimi-deploy:stack`` tag.

    Each becomes the cluster's stack's, with the cluster's tags (stack, owner, ``expires-at``,
    retain), so it is swept with the cluster: otherwise an NLB of a ``LoadBalancer`` Service
    outlives the cluster, its interfaces keep the subnets (and the VPC) from being deleted,
    and nothing reports it. Resources already found by their own tags are not repeated.
    """
    known = {f.id for f in found}
    out: list[Found] = []
    clusters = [f for f in found if f.kind == "eks-cluster"]

    def inherit(cf: Found, own: Mapping[str, str]) -> dict[str, str]:
        return {**own, **{k: v for k, v in cf.tags.items() if k != "Name"}}

    for cf in clusters:
        note = {"created_by": f"Kubernetes for EKS cluster {cf.id}"}
        lb_descriptions: list[str] = []
        for lb, ltags in untagged_lbs:
            arn = lb["LoadBalancerArn"]
            if arn in known or not for_cluster(ltags, cf.id):
                continue
            detail = {"name": lb.get("LoadBalancerName"), "type": lb.get("Type"), **note}
            f = classify("load-balancer", arn, region, inherit(cf, ltags), now, detail)
            if f:
                out.append(f)
                known.add(arn)
                kind = "net" if lb.get("Type") == "network" else "app"
                lb_descriptions.append(f"ELB {kind}/{lb.get('LoadBalancerName')}/*")
        eni_filters = [
            [{"Name": f"tag:{CNI_CLUSTER_TAG}", "Values": [cf.id]}],
            [{"Name": "tag-key", "Values": [f"{CLUSTER_TAG_PREFIX}{cf.id}"]}],
        ]
        if lb_descriptions:
            eni_filters.append([{"Name": "description", "Values": lb_descriptions}])
        for filters in eni_filters:
            for eni in paginate(ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=filters):
                eid = eni["NetworkInterfaceId"]
                if eid in known:
                    continue
                detail = {"status": eni.get("Status"), "description": eni.get("Description", ""), **note}
                f = classify("network-interface", eid, region, inherit(cf, tags_of(eni.get("TagSet"))), now, detail)
                if f:
                    out.append(f)
                    known.add(eid)
        for filters in (
            [{"Name": "tag-key", "Values": [f"{CLUSTER_TAG_PREFIX}{cf.id}"]}],
            [{"Name": f"tag:{LBC_CLUSTER_TAG}", "Values": [cf.id]}],
        ):
            for sg in paginate(ec2, "describe_security_groups", "SecurityGroups", Filters=filters):
                if sg["GroupId"] in known:
                    continue
                detail = {"name": sg.get("GroupName"), "vpc_id": sg.get("VpcId"), **note}
                f = classify("security-group", sg["GroupId"], region, inherit(cf, tags_of(sg.get("Tags"))), now, detail)
                if f:
                    out.append(f)
                    known.add(sg["GroupId"])
    return out


def discover_cluster_leftovers(ctx: DiscoveryContext) -> list[Found]:
    """``cluster_leftovers`` of a region after every kind's own discovery."""
    return cluster_leftovers(ctx.client("ec2"), ctx.region, ctx.now, ctx.found, ctx.shared.get("untagged_lbs", []))


# -- deletion: ``delete`` starts it, ``gone`` confirms it (or takes the step that had to wait) -----


def _delete_node_group(client: Client, f: Found) -> None:
    cluster, ng = f.id.split("/", 1)
    client("eks").delete_nodegroup(clusterName=cluster, nodegroupName=ng)


def _node_group_gone(client: Client, f: Found) -> bool:
    cluster, ng = f.id.split("/", 1)
    client("eks").describe_nodegroup(clusterName=cluster, nodegroupName=ng)  # ResourceNotFoundException once gone
    return False


def _delete_cluster(client: Client, f: Found) -> None:
    client("eks").delete_cluster(name=f.id)


def _cluster_gone(client: Client, f: Found) -> bool:
    client("eks").describe_cluster(name=f.id)  # ResourceNotFoundException once gone
    return False


def _terminate_instance(client: Client, f: Found) -> None:
    client("ec2").terminate_instances(InstanceIds=[f.id])


def _instance_gone(client: Client, f: Found) -> bool:
    inst = client("ec2").describe_instances(InstanceIds=[f.id])["Reservations"][0]["Instances"][0]
    return bool(inst["State"]["Name"] == "terminated")


def _delete_load_balancer(client: Client, f: Found) -> None:
    client("elbv2").delete_load_balancer(LoadBalancerArn=f.id)


def _load_balancer_gone(client: Client, f: Found) -> bool:
    client("elbv2").describe_load_balancers(LoadBalancerArns=[f.id])  # LoadBalancerNotFound once gone
    return False


def _delete_file_system(client: Client, f: Found) -> None:
    # No final backup: a trial's file system only holds an import of the mirror.
    client("fsx").delete_file_system(FileSystemId=f.id, LustreConfiguration={"SkipFinalBackup": True})


def _file_system_gone(client: Client, f: Found) -> bool:
    return not client("fsx").describe_file_systems(FileSystemIds=[f.id]).get("FileSystems", [])


def _detach_network_interface(client: Client, f: Found) -> None:
    from botocore.exceptions import ClientError

    ec2 = client("ec2")
    try:
        eni = ec2.describe_network_interfaces(NetworkInterfaceIds=[f.id])["NetworkInterfaces"][0]
    except ClientError as err:
        if error_code(err) == "InvalidNetworkInterfaceID.NotFound":
            return  # a load balancer's interface went with it
        raise
    attachment = eni.get("Attachment")
    if attachment and attachment.get("AttachmentId") and attachment.get("DeviceIndex", 1) != 0:
        ec2.detach_network_interface(AttachmentId=attachment["AttachmentId"], Force=True)


def _network_interface_gone(client: Client, f: Found) -> bool:
    client("ec2").delete_network_interface(NetworkInterfaceId=f.id)  # InvalidNetworkInterface.InUse until detached
    return True


def _only_group(perm: Mapping[str, Any], group_id: str) -> dict[str, Any]:
    keep = {k: perm[k] for k in ("IpProtocol", "FromPort", "ToPort") if k in perm}
    keep["UserIdGroupPairs"] = [
        {"GroupId": g["GroupId"]} for g in perm.get("UserIdGroupPairs", []) if g.get("GroupId") == group_id
    ]
    return keep


def _revoke_references(client: Client, f: Found) -> None:
    """Rules in other groups that reference this one block its deletion: revoke them first."""
    ec2 = client("ec2")
    for direction, key, revoke in (
        ("ip-permission.group-id", "IpPermissions", ec2.revoke_security_group_ingress),
        ("egress.ip-permission.group-id", "IpPermissionsEgress", ec2.revoke_security_group_egress),
    ):
        for other in paginate(ec2, "describe_security_groups", "SecurityGroups", Filters=[{"Name": direction, "Values": [f.id]}]):
            perms = [p for p in other.get(key, []) if any(g.get("GroupId") == f.id for g in p.get("UserIdGroupPairs", []))]
            if perms:
                revoke(GroupId=other["GroupId"], IpPermissions=[_only_group(p, f.id) for p in perms])


def _security_group_gone(client: Client, f: Found) -> bool:
    ec2 = client("ec2")
    # Detached interfaces left in the group (load balancer or CNI leftovers) block it.
    for eni in paginate(
        ec2,
        "describe_network_interfaces",
        "NetworkInterfaces",
        Filters=[{"Name": "group-id", "Values": [f.id]}, {"Name": "status", "Values": ["available"]}],
    ):
        if tags_of(eni.get("TagSet")).get(TAG_RETAIN, "").lower() != "true":
            ec2.delete_network_interface(NetworkInterfaceId=eni["NetworkInterfaceId"])
    ec2.delete_security_group(GroupId=f.id)  # DependencyViolation while something is still in it
    return True


def _volume_waits_for_detach(client: Client, f: Found) -> None:
    """Nothing to start: the volume is deleted by ``gone`` once its instance has terminated."""


def _volume_gone(client: Client, f: Found) -> bool:
    client("ec2").delete_volume(VolumeId=f.id)  # VolumeInUse until detached
    return True


def build_registry() -> Registry:
    """The kinds, in discovery order (which also breaks ties in the delete order)."""
    reg = Registry()
    reg.register(Kind("ec2-instance", "instances", _discover_instances, _terminate_instance, _instance_gone))
    reg.register(
        Kind("ebs-volume", "volumes", _discover_volumes, _volume_waits_for_detach, _volume_gone, after=("ec2-instance",))
    )
    reg.register(
        Kind(
            "security-group",
            "security groups",
            _discover_security_groups,
            _revoke_references,
            _security_group_gone,
            after=("ec2-instance", "eks-nodegroup", "eks-cluster", "load-balancer", "fsx-file-system", "network-interface"),
        )
    )
    reg.register(
        Kind(
            "network-interface",
            "network interfaces",
            _discover_network_interfaces,
            _detach_network_interface,
            _network_interface_gone,
            after=("ec2-instance", "eks-cluster", "load-balancer", "fsx-file-system"),
        )
    )
    reg.register(Kind("capacity-reservation", "capacity reservations", _discover_capacity, report_only=True,
                      calls=("ec2:DescribeCapacityReservations",)))
    reg.register(Kind("eks-nodegroup", "EKS node groups", _discover_node_groups, _delete_node_group, _node_group_gone))
    reg.register(
        Kind("eks-cluster", "EKS clusters", _discover_clusters, _delete_cluster, _cluster_gone, after=("eks-nodegroup",))
    )
    reg.register(
        Kind(
            "load-balancer",
            "load balancers",
            _discover_load_balancers,
            _delete_load_balancer,
            _load_balancer_gone,
            after=("eks-cluster",),
        )
    )
    reg.register(
        Kind(
            "fsx-file-system",
            "FSx file systems",
            _discover_file_systems,
            _delete_file_system,
            _file_system_gone,
            after=("ec2-instance", "eks-nodegroup"),
        )
    )
    reg.register(Kind("s3-bucket", "S3 buckets", _discover_buckets, report_only=True,
                      calls=("s3:ListBuckets", "s3:GetBucketLocation", "s3:GetBucketTagging")))
    return reg


REGISTRY = build_registry()

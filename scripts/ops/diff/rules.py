"""Which input changes replace a resource, and which disrupt it in place: the plan diff's rules as data.

Each row is a ``FieldRule`` of one resource type token with the ``source`` of the fact:

- AWS (pulumi-aws 7 bridges terraform-provider-aws): an attribute marked ``ForceNew`` in the
  Terraform resource's schema (or set by its ``CustomizeDiff``) is a replacement in Pulumi
  (the bridge turns it into ``replaces`` in the provider's diff). Rows name the Terraform
  resource and attribute (``aws_instance`` ``ami``); the Pulumi input name is the camelCase
  of the attribute, and a Terraform block (``network_interface``) is a plural list in Pulumi
  (``networkInterfaces``). Checked against the provider source (internal/service/...) and the
  pulumi-aws SDK (``pulumi_aws`` in the venv: every pattern is an input of the type, see
  tests/test_plan_diff.py).
- Kubernetes: pulumi-kubernetes ``provider/pkg/provider/forcenew.go`` (``metadata.name`` and
  ``metadata.namespace`` of every kind; Job ``spec.template``/``spec.selector``; StatefulSet;
  Service ``spec.clusterIP``/``spec.type``; PVC ``spec``; ConfigMap and Secret data unless the
  provider sets ``enableConfigMapMutable``/``enableSecretMutable``, which this project does not),
  and the Kubernetes API's own immutable fields (the update is rejected, ``field is immutable``:
  the object has to be recreated); for custom resources, their CRDs' transition rules
  (``x-kubernetes-validations`` reading ``oldSelf``, ``components/core/crd_rules.py``), evaluated
  with CEL where a rule is more than ``self == oldSelf``.
- A resource's own ``replace_on_changes`` (recorded in the plan document) replaces on a change of
  those paths, as Pulumi does (``scripts/ops/diff/engine.py``).

``IN_PLACE`` lists, per type, inputs that are known to update in place (tags everywhere, plus
neighbours of the forcing ones, e.g. ``rootBlockDevice.volumeSize`` beside
``rootBlockDevice.encrypted``): the tests change each forcing row's nearest in-place neighbour
and require that it is not reported as a replacement.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

Predicate = Callable[[Any, Any, Mapping[str, Any], Mapping[str, Any]], bool]


@dataclass(frozen=True)
class FieldRule:
    """One input path (fnmatch pattern over dotted paths, list indices written ``[*]``).

    Attributes:
        pattern: e.g. ``ami``, ``vpcConfig.subnetIds``, ``spec.template``. A pattern also
            matches every path below it (``spec.template.spec.containers[0].image``).
        note: why, shown next to the change.
        when: optional ``(old, new, old_inputs, new_inputs) -> bool``; the rule applies only
            when it returns True (e.g. FSx capacity replaces only when it shrinks).
        source: where the fact comes from (provider schema attribute, API reference).
    """

    pattern: str
    note: str = ""
    when: Predicate | None = None
    source: str = ""

    def matches(self, path: str, old: Any, new: Any, old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any]) -> bool:
        """Whether this rule covers a change of ``path`` from ``old`` to ``new`` (inputs for ``when``)."""
        norm = re.sub(r"\[\d+\]", "[*]", path)
        hit = (
            fnmatch.fnmatchcase(norm, self.pattern) or norm.startswith(self.pattern + ".") or norm.startswith(self.pattern + "[")
        )
        return hit and (self.when is None or bool(self.when(old, new, old_inputs, new_inputs)))


def _user_data_replaces(old: Any, new: Any, old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any]) -> bool:
    return bool(new_inputs.get("userDataReplaceOnChange") or old_inputs.get("userDataReplaceOnChange"))


def _fsx_capacity_replaces(old: Any, new: Any, old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any]) -> bool:
    """terraform-provider-aws aws_fsx_lustre_file_system ``CustomizeDiff``: ``storage_capacity``
    forces a new file system when it shrinks, or on a ``SCRATCH_1`` deployment (which cannot grow)."""
    if new_inputs.get("deploymentType") == "SCRATCH_1":
        return True
    try:
        return new is not None and old is not None and float(new) < float(old)
    except (TypeError, ValueError):
        return False


def _snake(pattern: str) -> str:
    """Terraform's attribute name of a Pulumi input path: ``vpcConfig.subnetIds`` -> ``vpc_config.subnet_ids``."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", pattern).lower()


def _tf(resource: str, *rows: FieldRule | str) -> tuple[FieldRule, ...]:
    """Rows of one terraform-provider-aws resource (``aws_instance``): a row without its own
    source gets ``terraform-provider-aws <resource> schema: <attribute> ForceNew``."""
    out = []
    for row in rows:
        rule = FieldRule(row) if isinstance(row, str) else row
        if not rule.source:
            rule = replace(rule, source=f"terraform-provider-aws {resource} schema: {_snake(rule.pattern)} ForceNew")
        out.append(rule)
    return tuple(out)


_FORCENEW_GO = "pulumi-kubernetes provider/pkg/provider/forcenew.go"
_IMMUTABLE = "Kubernetes API validation rejects the update (field is immutable): the object must be recreated"


def _k8s(kind: str, *rows: FieldRule | str, source: str = _FORCENEW_GO) -> tuple[FieldRule, ...]:
    """Rows of a Kubernetes kind: ``metadata.name``/``metadata.namespace`` (every kind, forcenew.go
    ``metadataForceNewProperties``) and ``rows`` (default source: forcenew.go's list of ``kind``)."""
    meta = f"{_FORCENEW_GO}: metadataForceNewProperties"
    out = [
        FieldRule("metadata.name", "Kubernetes objects are identified by name", source=meta),
        FieldRule("metadata.namespace", "namespace is part of the identity", source=meta),
    ]
    for row in rows:
        rule = FieldRule(row) if isinstance(row, str) else row
        out.append(rule if rule.source else replace(rule, source=f"{source} ({kind}: .{rule.pattern})"))
    return tuple(out)


def crd_rows(rules: tuple[Any, ...] | None = None) -> dict[str, tuple[FieldRule, ...]]:
    """Replace rows of the custom resources, from their CRDs' transition rules
    (``components.core.crd_rules.TRANSITION_RULES``, or ``rules``), per type token
    ``kubernetes:<group>/<version>:<Kind>``: a rule that refuses every change (``self == oldSelf``)
    replaces on any change under its path; any other rule replaces when, evaluated with CEL on the
    resource's old and new inputs (``crd_rules.update_refused``), it is false. Rules on list items
    or map values (``[*]``, ``{*}``) are evaluated only where both sides hold the node."""
    from components.core import crd_rules

    out: dict[str, list[FieldRule]] = {}
    for rule in crd_rules.TRANSITION_RULES if rules is None else rules:
        source = f"{rule.source}: x-kubernetes-validations on .{rule.path}: {rule.rule}"
        note = f"the API server refuses the update ({rule.message}): the object must be recreated"
        when = None if rule.immutable else _refused_by(rule)
        out.setdefault(f"kubernetes:{rule.api_version}:{rule.kind}", []).append(
            FieldRule(rule.path.replace("{*}", ".*"), note, when, source)
        )
    return {rtype: _k8s(rtype.rsplit(":", 1)[1], *rows) for rtype, rows in out.items()}


def _refused_by(rule: Any) -> Predicate:
    from components.core import crd_rules

    def refused(old: Any, new: Any, old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any]) -> bool:
        return crd_rules.update_refused(rule, old_inputs, new_inputs)

    return refused


INSTANCE = "aws:ec2/instance:Instance"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LUSTRE = "aws:fsx/lustreFileSystem:LustreFileSystem"

# Replace-on-change inputs per type token.
REPLACE_ON_CHANGE: Mapping[str, tuple[FieldRule, ...]] = {
    INSTANCE: _tf(
        "aws_instance",
        FieldRule("ami", "a new AMI means a new instance"),
        "availabilityZone",
        "subnetId",
        "placementGroup",
        "keyName",
        "privateIp",
        FieldRule("networkInterfaces", source="terraform-provider-aws aws_instance schema: network_interface ForceNew"),
        FieldRule("ebsBlockDevices", source="terraform-provider-aws aws_instance schema: ebs_block_device ForceNew"),
        FieldRule("ephemeralBlockDevices", source="terraform-provider-aws aws_instance schema: ephemeral_block_device ForceNew"),
        "hostId",
        "tenancy",
        FieldRule(
            "userData",
            "userDataReplaceOnChange is set",
            _user_data_replaces,
            "pulumi_aws.ec2.InstanceArgs user_data: with user_data_replace_on_change, a change destroys and recreates",
        ),
        FieldRule(
            "userDataBase64",
            "userDataReplaceOnChange is set",
            _user_data_replaces,
            "pulumi_aws.ec2.InstanceArgs user_data_base64: with user_data_replace_on_change, a change destroys and recreates",
        ),
        "rootBlockDevice.encrypted",
        "rootBlockDevice.kmsKeyId",
        FieldRule("launchTemplate.id", "launched from another launch template"),
        FieldRule("launchTemplate.name", "launched from another launch template"),
        FieldRule(
            "launchTemplate.version",
            "a new launch-template version: the instance is recreated",
            source="terraform-provider-aws aws_instance CustomizeDiff: a changed launch_template version forces a new instance",
        ),
    ),
    LAUNCH_TEMPLATE: _tf("aws_launch_template", "name", "namePrefix"),
    "aws:ec2/securityGroup:SecurityGroup": _tf("aws_security_group", "name", "namePrefix", "vpcId", "description"),
    # aws_security_group_rule: every argument but `description` is ForceNew (its Update only
    # changes descriptions: UpdateSecurityGroupRuleDescriptionsIngress/Egress).
    "aws:ec2/securityGroupRule:SecurityGroupRule": _tf(
        "aws_security_group_rule",
        FieldRule("type", "security group rules cannot be modified in place"),
        FieldRule("fromPort", "security group rules cannot be modified in place"),
        FieldRule("toPort", "security group rules cannot be modified in place"),
        FieldRule("protocol", "security group rules cannot be modified in place"),
        FieldRule("cidrBlocks", "security group rules cannot be modified in place"),
        FieldRule("ipv6CidrBlocks", "security group rules cannot be modified in place"),
        FieldRule("prefixListIds", "security group rules cannot be modified in place"),
        FieldRule("securityGroupId", "security group rules cannot be modified in place"),
        FieldRule("sourceSecurityGroupId", "security group rules cannot be modified in place"),
        FieldRule("self", "security group rules cannot be modified in place"),
    ),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (
        FieldRule(
            "securityGroupId",
            source="terraform-provider-aws aws_vpc_security_group_ingress_rule schema: security_group_id RequiresReplace",
        ),
    ),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": (
        FieldRule(
            "securityGroupId",
            source="terraform-provider-aws aws_vpc_security_group_egress_rule schema: security_group_id RequiresReplace",
        ),
    ),
    "aws:ec2/subnet:Subnet": _tf("aws_subnet", "cidrBlock", "vpcId", "availabilityZone", "availabilityZoneId"),
    "aws:ec2/vpc:Vpc": _tf("aws_vpc", "cidrBlock", "instanceTenancy"),
    "aws:ebs/volume:Volume": _tf("aws_ebs_volume", "availabilityZone", "encrypted", "kmsKeyId", "snapshotId", "outpostArn"),
    LUSTRE: _tf(
        "aws_fsx_lustre_file_system",
        FieldRule("deploymentType", "the file system is recreated: its imported weights are lost"),
        "storageType",
        "subnetIds",
        "securityGroupIds",
        "kmsKeyId",
        "efaEnabled",
        "driveCacheType",
        "importPath",
        "exportPath",
        "importedFileChunkSize",
        "fileSystemTypeVersion",
        "backupId",
        "copyTagsToBackups",
        FieldRule(
            "storageCapacity",
            "FSx capacity can only grow in place (and not at all on SCRATCH_1)",
            _fsx_capacity_replaces,
            "terraform-provider-aws aws_fsx_lustre_file_system CustomizeDiff: storage_capacity ForceNew when it shrinks "
            "or the deployment type is SCRATCH_1",
        ),
    ),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": _tf(
        "aws_fsx_data_repository_association",
        "fileSystemId",
        "fileSystemPath",
        "dataRepositoryPath",
        "batchImportMetaDataOnCreate",
    ),
    "aws:eks/cluster:Cluster": _tf(
        "aws_eks_cluster",
        "name",
        "roleArn",
        FieldRule("vpcConfig.subnetIds", "cluster subnets are fixed at creation"),
        "vpcConfig.securityGroupIds",
        "kubernetesNetworkConfig",
        "encryptionConfig",
        "bootstrapSelfManagedAddons",
        "outpostConfig",
    ),
    NODE_GROUP: _tf(
        "aws_eks_node_group",
        "clusterName",
        "nodeGroupName",
        "nodeGroupNamePrefix",
        "nodeRoleArn",
        "subnetIds",
        "amiType",
        "capacityType",
        "diskSize",
        "instanceTypes",
        "remoteAccess",
        FieldRule("launchTemplate.id", "another launch template (a new version updates in place)"),
        FieldRule("launchTemplate.name", "another launch template (a new version updates in place)"),
    ),
    "aws:eks/addon:Addon": _tf("aws_eks_addon", "clusterName", "addonName"),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": (
        FieldRule(
            "clusterName",
            source="terraform-provider-aws aws_eks_pod_identity_association schema: cluster_name RequiresReplace",
        ),
        FieldRule(
            "namespace", source="terraform-provider-aws aws_eks_pod_identity_association schema: namespace RequiresReplace"
        ),
        FieldRule(
            "serviceAccount",
            source="terraform-provider-aws aws_eks_pod_identity_association schema: service_account RequiresReplace",
        ),
    ),
    "aws:s3/bucket:Bucket": _tf(
        "aws_s3_bucket",
        FieldRule("bucket", "a new bucket: the mirrored weights stay in the old one"),
        "bucketPrefix",
        "objectLockEnabled",
    ),
    "aws:s3/bucketV2:BucketV2": _tf("aws_s3_bucket", "bucket", "bucketPrefix", "objectLockEnabled"),
    "aws:lb/loadBalancer:LoadBalancer": _tf("aws_lb", "name", "namePrefix", "internal", "loadBalancerType"),
    "aws:lb/targetGroup:TargetGroup": _tf("aws_lb_target_group", "name", "port", "protocol", "vpcId", "targetType"),
    "aws:iam/role:Role": _tf("aws_iam_role", "name", "namePrefix", "path"),
    "aws:iam/instanceProfile:InstanceProfile": _tf("aws_iam_instance_profile", "name", "path"),
    "aws:ssm/parameter:Parameter": _tf("aws_ssm_parameter", "name"),
    "aws:ec2/capacityReservation:CapacityReservation": _tf(
        "aws_ec2_capacity_reservation", "instanceType", "availabilityZone", "instancePlatform", "tenancy"
    ),
    "kubernetes:batch/v1:Job": _k8s(
        "Job",
        FieldRule("spec.template", "a Job's pod template is immutable: the Job is recreated"),
        "spec.selector",
    ),
    "kubernetes:apps/v1:StatefulSet": _k8s(
        "StatefulSet",
        "spec.selector",
        "spec.serviceName",
        "spec.volumeClaimTemplates",
        "spec.podManagementPolicy",
        "spec.revisionHistoryLimit",
    ),
    "kubernetes:apps/v1:Deployment": _k8s("Deployment", "spec.selector"),
    "kubernetes:apps/v1:DaemonSet": _k8s(
        "DaemonSet", FieldRule("spec.selector", source=f"{_IMMUTABLE} (apps/v1 DaemonSet spec.selector)")
    ),
    "kubernetes:core/v1:Service": _k8s(
        "Service",
        "spec.clusterIP",
        "spec.type",
        FieldRule("spec.clusterIPs", source=f"{_IMMUTABLE} (core/v1 Service spec.clusterIPs: the primary address)"),
    ),
    # forcenew.go lists PersistentVolumeClaim `.spec` as a whole: any change recreates the claim.
    "kubernetes:core/v1:PersistentVolumeClaim": _k8s(
        "PersistentVolumeClaim", FieldRule("spec", "a claim is recreated on any spec change: the volume is bound anew")
    ),
    "kubernetes:core/v1:PersistentVolume": _k8s(
        "PersistentVolume",
        FieldRule("spec.csi", source=f"{_IMMUTABLE} (core/v1 PersistentVolume spec.persistentVolumeSource)"),
        FieldRule("spec.hostPath", source=f"{_IMMUTABLE} (core/v1 PersistentVolume spec.persistentVolumeSource)"),
        FieldRule("spec.local", source=f"{_IMMUTABLE} (core/v1 PersistentVolume spec.persistentVolumeSource)"),
    ),
    # Replaced on a data change unless the provider sets enableConfigMapMutable/enableSecretMutable
    # (pulumi:providers:kubernetes in the plan sets neither): pods that mount them see a new object.
    "kubernetes:core/v1:ConfigMap": _k8s("ConfigMap", "data", "binaryData"),
    "kubernetes:core/v1:Secret": _k8s("Secret", "type", "stringData", "data"),
    # The custom resources' CRD transition rules (ComputeDomain spec: self == oldSelf).
    **crd_rows(),
}

# In-place changes that still interrupt serving (shown with ⚠, not counted as replacements).
_NODE_ROLL = "EKS UpdateNodegroupVersion: a rolling update replaces every node"
_EC2_STOP_START = "pulumi_aws.ec2.InstanceArgs: changes of instance_type and user_data are applied with a stop/start"
DISRUPTIVE_ON_CHANGE: Mapping[str, tuple[FieldRule, ...]] = {
    INSTANCE: (
        FieldRule(
            "instanceType",
            "stop/start: instance-store NVMe is wiped, weights are synced and loaded again",
            source=_EC2_STOP_START,
        ),
        FieldRule("userData", "applied by a stop/start; NVMe is wiped", source=_EC2_STOP_START),
        FieldRule("userDataBase64", "applied by a stop/start; NVMe is wiped", source=_EC2_STOP_START),
        FieldRule(
            "capacityReservationSpecification",
            "stop/start to move the instance",
            source="EC2 ModifyInstanceCapacityReservationAttributes: the instance must be stopped",
        ),
    ),
    LAUNCH_TEMPLATE: tuple(
        FieldRule(
            f,
            "a new template version: instances and node groups launched from it are recreated or recycled on the next up",
            source="terraform-provider-aws aws_launch_template: an update creates a new version (CreateLaunchTemplateVersion)",
        )
        for f in (
            "userData",
            "imageId",
            "instanceType",
            "blockDeviceMappings",
            "metadataOptions",
            "networkInterfaces",
            "instanceMarketOptions",
            "capacityReservationSpecification",
            "placement",
            "tagSpecifications",
        )
    ),
    NODE_GROUP: (
        FieldRule(
            "launchTemplate.version",
            "every node is recycled: pods drain, weights load again",
            source=_NODE_ROLL,
        ),
        FieldRule("releaseVersion", "every node is recycled", source=_NODE_ROLL),
        FieldRule("version", "every node is recycled", source=_NODE_ROLL),
    ),
    LUSTRE: (
        FieldRule(
            "perUnitStorageThroughput",
            "in place; the file system optimizes for hours",
            source="FSx UpdateFileSystem (Lustre PerUnitStorageThroughput): storage optimization runs afterwards",
        ),
        FieldRule(
            "storageCapacity",
            "in place; the file system optimizes for hours",
            source="FSx UpdateFileSystem (StorageCapacity): storage optimization runs afterwards",
        ),
    ),
    "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet": (
        FieldRule(
            "spec",
            "the group's pods are recreated: weights load again",
            source="LeaderWorkerSet controller: a changed template rolls every group (leader and workers recreated)",
        ),
    ),
    "kubernetes:apps/v1:Deployment": (
        FieldRule("spec.template", "rolling restart", source="apps/v1 Deployment: a changed pod template rolls out new pods"),
    ),
    "kubernetes:apps/v1:StatefulSet": (
        FieldRule("spec.template", "pods are recreated", source="apps/v1 StatefulSet: a changed pod template recreates the pods"),
    ),
}

_TAGS = "tags are updated in place (TagResource/CreateTags); terraform-provider-aws tftags.TagsSchema has no ForceNew"
_LABELS = "metadata.labels and annotations are patched in place (not in forcenew.go)"

# Inputs known to update in place, per type: the neighbours the tests change beside each forcing row.
IN_PLACE: Mapping[str, tuple[FieldRule, ...]] = {
    **{t: (FieldRule("tags", source=_TAGS),) for t in REPLACE_ON_CHANGE if t.startswith("aws:")},
    **{t: (FieldRule("metadata.labels", source=_LABELS),) for t in REPLACE_ON_CHANGE if t.startswith("kubernetes:")},
    INSTANCE: (
        FieldRule("tags", source=_TAGS),
        FieldRule("rootBlockDevice.volumeSize", source="terraform-provider-aws aws_instance: root_block_device.volume_size "
                  "is changed with ModifyVolume"),
        FieldRule("instanceType", source=_EC2_STOP_START),
    ),
    "aws:ec2/securityGroupRule:SecurityGroupRule": (
        FieldRule("description", source="terraform-provider-aws aws_security_group_rule: description is updated "
                  "(UpdateSecurityGroupRuleDescriptionsIngress)"),
    ),
    "aws:eks/cluster:Cluster": (
        FieldRule("tags", source=_TAGS),
        FieldRule("vpcConfig.endpointPublicAccess", source="EKS UpdateClusterConfig: resourcesVpcConfig endpoint access"),
        # network.apiServerPublicCidrs: a deployer's new address is an update of the cluster, not a new cluster.
        FieldRule("vpcConfig.publicAccessCidrs", source="EKS UpdateClusterConfig: resourcesVpcConfig publicAccessCidrs; "
                  "terraform-provider-aws aws_eks_cluster vpc_config.public_access_cidrs has no ForceNew"),
        FieldRule("version", source="EKS UpdateClusterVersion"),
    ),
    NODE_GROUP: (
        FieldRule("tags", source=_TAGS),
        FieldRule("launchTemplate.version", source="EKS UpdateNodegroupVersion (disruptive, not a replacement)"),
        FieldRule("scalingConfig", source="EKS UpdateNodegroupConfig: scalingConfig"),
    ),
    LUSTRE: (
        FieldRule("tags", source=_TAGS),
        FieldRule("perUnitStorageThroughput", source="FSx UpdateFileSystem: PerUnitStorageThroughput"),
    ),
    "kubernetes:batch/v1:Job": (
        FieldRule("metadata.labels", source=_LABELS),
        FieldRule("spec.parallelism", source="batch/v1 Job: spec.parallelism is mutable (not in forcenew.go)"),
    ),
    "kubernetes:apps/v1:Deployment": (
        FieldRule("metadata.labels", source=_LABELS),
        FieldRule("spec.replicas", source="apps/v1 Deployment: spec.replicas is mutable (not in forcenew.go)"),
    ),
    "kubernetes:apps/v1:StatefulSet": (
        FieldRule("metadata.labels", source=_LABELS),
        FieldRule("spec.replicas", source="apps/v1 StatefulSet: spec.replicas is mutable (not in forcenew.go)"),
    ),
    "kubernetes:apps/v1:DaemonSet": (
        FieldRule("metadata.labels", source=_LABELS),
        FieldRule("spec.template", source="apps/v1 DaemonSet: a new pod template rolls out (not in forcenew.go)"),
    ),
    "kubernetes:core/v1:Service": (
        FieldRule("metadata.labels", source=_LABELS),
        FieldRule("spec.ports", source="core/v1 Service: spec.ports is mutable (not in forcenew.go)"),
    ),
    "kubernetes:core/v1:PersistentVolume": (
        FieldRule("metadata.labels", source=_LABELS),
        FieldRule("spec.capacity", source="core/v1 PersistentVolume: spec.capacity may change (only the source is immutable)"),
    ),
}


def replace_rows() -> Iterator[tuple[str, FieldRule]]:
    """Every ``(type token, rule)`` of ``REPLACE_ON_CHANGE``, in table order."""
    for rtype, rules in REPLACE_ON_CHANGE.items():
        for rule in rules:
            yield rtype, rule


def disrupt_rows() -> Iterator[tuple[str, FieldRule]]:
    """Every ``(type token, rule)`` of ``DISRUPTIVE_ON_CHANGE``, in table order."""
    for rtype, rules in DISRUPTIVE_ON_CHANGE.items():
        for rule in rules:
            yield rtype, rule


# Launch-template inputs that do NOT make a new template version (terraform-provider-aws
# aws_launch_template: tags are set with CreateTags; the default-version settings and the
# name are the template's, not a version's). Every other input is part of the version.
LAUNCH_TEMPLATE_UNVERSIONED: tuple[str, ...] = ("tags", "tagsAll", "defaultVersion", "updateDefaultVersion", "name", "namePrefix")
# What follows a template's latest version, and what a new version does to it: an
# ``aws_instance`` is replaced (the provider forces a new instance when the launch template's
# version changes); a managed node group rolls (recycles) every node.
TEMPLATE_FOLLOWERS: Mapping[str, tuple[str, str]] = {
    INSTANCE: ("replace", "a new launch-template version: the instance is recreated (NVMe copy lost)"),
    NODE_GROUP: ("disrupt", "a new launch-template version: every node is recycled, weights load again"),
}


# Types whose disruptive in-place update replaces every node (EKS UpdateNodegroupVersion rolls the
# group): the diff's summary counts them as recycled.
RECYCLED_ON_UPDATE: tuple[str, ...] = (NODE_GROUP,)


def template_versioned_change(fields: list[dict[str, Any]]) -> bool:
    """Whether a launch template's changed ``fields`` (``[{path, ...}]``) make a new template version."""
    return any(f["path"].split(".")[0].split("[")[0] not in LAUNCH_TEMPLATE_UNVERSIONED for f in fields)


def first_rule(
    rules: tuple[FieldRule, ...], path: str, old: Any, new: Any, old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any]
) -> FieldRule | None:
    """The first of ``rules`` that covers the change of ``path`` (None: no rule does)."""
    for rule in rules:
        if rule.matches(path, old, new, old_inputs, new_inputs):
            return rule
    return None

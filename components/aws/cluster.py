"""EKS (``aws-eks``): the cluster, a small system node group, GPU node groups from launch
templates, add-ons, Pod Identity roles for the weight jobs, and a Kubernetes provider.

GPU node groups: the EKS AL2023 NVIDIA AMI of the instance's architecture (``amiType``
``AL2023_x86_64_NVIDIA`` or ``AL2023_ARM_64_NVIDIA``; EKS keeps it matched to the cluster
version), or ``compute.amiId`` (``CUSTOM``, with the cluster details in the NodeConfig); a
nodeadm ``NodeConfig`` with ``localStorage: RAID0``; EFA interfaces for multi-node copies, and
a cluster placement group for on-demand ones only (capacity blocks and ODCRs are already placed:
a new placement group the reservation was not made in fails with InsufficientInstanceCapacity);
capacity type ``CAPACITY_BLOCK`` (market type ``capacity-block`` in the template) or ODCR
targeting; subnets pinned to the GPU (reservation's) AZ. The desired size is set at creation
only (``ignore_changes``): the operator or an autoscaler owns it after.

API endpoint (``config.api_server_access``, ``network.apiServerAccess``): the private endpoint
always (nodes reach the API inside the VPC); the public endpoint (IAM-authenticated) in
``public-cidrs`` mode, from ``network.apiServerPublicCidrs`` only (never EKS's own default,
0.0.0.0/0). ``network.apiServerPrivateCidrs`` / ``apiServerPrivateSecurityGroupIds`` become
ingress rules on port 443 of the EKS cluster security group (EKS user guide, "Accessing a private
only API server": a connected network or a host in the VPC needs them), created with the cluster
and before the Kubernetes provider, so every Kubernetes object of the same run goes through a
path that already exists. Config refuses a stack with no such path (``check_api_server_access``);
the plan's "Kubernetes API" row says which path it is.

Access: authentication mode ``API`` (EKS access entries). The identity that creates the cluster
is admin; ``kubernetes.adminRoleArns`` (IAM role or user ARNs) adds an access entry with
``AmazonEKSClusterAdminPolicy`` at cluster scope for each, e.g.::

    kimi-deploy:kubernetes:
      adminRoleArns:
        - arn:aws:iam::123456789012:role/platform-admins

Network policy: the ``vpc-cni`` add-on runs with ``enableNetworkPolicy`` so the Kubernetes
edge's NetworkPolicies are enforced.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pulumi
import pulumi_aws as aws

from components.core.config import DeploymentSpec, api_server_access, eks_version_of
from components.core.naming import (
    GPU_NODE_LABEL,
    GPU_TAINT_KEY,
    MIRROR_PUBLISH_SERVICE_ACCOUNT,
    SYSTEM_NODE_LABEL,
    SYSTEM_NODE_ROLE,
    TARGET_NODE_LABEL,
    WEIGHT_SYNC_SERVICE_ACCOUNT,
)
from components.core.scaling import gpu_node_group_size
from components.core.versions import EKS_API_SERVER_PORT
from components.core.weights import mirror_key_prefix

from . import iam
from .common import child, tags
from .compute import capacity_options, efa_network_interfaces, launched_tag_specifications, metadata_options, root_volume
from .expiry import (
    SCALE_NODEGROUP_ACTION,
    SCALE_NODEGROUP_TARGET,
    SUSPEND_LAUNCH_ACTION,
    SUSPEND_LAUNCH_TARGET,
    asg_arn_pattern,
    declare_expiry_stop,
    expiry_key,
    scale_to_zero_input,
    suspend_launch_input,
)
from .node_autoscaler import declare_node_autoscaler_identity
from .userdata import ClusterDetails, eks_node_user_data

# EKS managed AMI types of the AL2023 NVIDIA AMIs, per CPU architecture.
NVIDIA_AMI_TYPES = {"x86_64": "AL2023_x86_64_NVIDIA", "arm64": "AL2023_ARM_64_NVIDIA"}
# The system node group: CoreDNS, the FSx CSI controller and other cluster add-ons.
SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
SYSTEM_INSTANCE_TYPE = "m7i.xlarge"
SYSTEM_NODES = {"min_size": 2, "desired_size": 2, "max_size": 3}
SYSTEM_ROOT_VOLUME_GIB = 100
# IMDSv2 response hop limit of every node: 1. The node itself and host-network pods (vpc-cni,
# kube-proxy, the Pod Identity agent) still reach the instance metadata service; a pod in its own
# network namespace is one hop further and gets no answer, so it cannot take the node role (EKS
# user guide, "Amazon EKS security best practices", "Restricting access to the IMDS and Amazon EC2
# instance profile credentials": block IMDSv2 "for all containers that don't use host networking"
# when no pod needs IMDS, e.g. for its Region). None of ours does. The FSx CSI driver's pods, the
# controller on the system nodes and the node plugin on the GPU nodes that mount FSx, are not
# host-network (the chart dropped hostNetwork from the node DaemonSet in v1.6.1): when IMDS does
# not answer they take the instance's id, type and zone from the Kubernetes API (their node object;
# kubernetes-sigs/aws-fsx-csi-driver pkg/cloud/metadata.go NewMetadataService, metadata_k8s.go), and
# mounting a static volume makes no AWS call (pkg/driver/controller.go, node.go), so hop limit 1
# holds on the FSx stacks too. System nodes: the cluster autoscaler gets credentials from EKS Pod
# Identity and its region from its values; CoreDNS, KEDA, the LWS and DRA controllers never read
# IMDS; the in-tree load-balancer controller runs in the EKS control plane. GPU nodes: the weight
# and engine-cache pods use Pod Identity, the device plugins and exporters call no AWS API.
SYSTEM_IMDS_HOP_LIMIT = 1
GPU_IMDS_HOP_LIMIT = 1
# Service CIDR, set explicitly so a custom-AMI NodeConfig can name it.
SERVICE_IPV4_CIDR = "172.20.0.0/16"
CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator")
LOG_RETENTION_DAYS = 30
# Add-ons installed before the node groups (DaemonSets; ACTIVE without nodes) and after them
# (Deployments that need a node to become ACTIVE).
ADDONS_BEFORE_NODES = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
ADDONS_AFTER_NODES = ("coredns",)
FSX_CSI_ADDON = "aws-fsx-csi-driver"
# Changes of desired size made by the operator or an autoscaler are kept.
DESIRED_SIZE_IGNORED = ["scalingConfig.desiredSize"]
# Add-on configuration values (JSON, the add-on's schema). vpc-cni: enforce NetworkPolicy (EKS
# user guide, "Restrict Pod network traffic with Kubernetes network policies").
ADDON_CONFIGURATION = {"vpc-cni": json.dumps({"enableNetworkPolicy": "true"})}
# Granted to each of kubernetes.adminRoleArns (EKS access policy, cluster scope).
CLUSTER_ADMIN_ACCESS_POLICY = "AmazonEKSClusterAdminPolicy"


def gpu_node_labels(spec: DeploymentSpec) -> dict[str, str]:
    """Labels of GPU nodes (names in ``spec/naming.py``)."""
    return {GPU_NODE_LABEL: "true", TARGET_NODE_LABEL: spec.target.name}


def gpu_capacity_type(spec: DeploymentSpec) -> str:
    """Node group capacity type: ``CAPACITY_BLOCK`` for capacity blocks, else ``ON_DEMAND``
    (an ODCR is on-demand capacity targeted by the launch template)."""
    return "CAPACITY_BLOCK" if spec.config.compute.capacity.type == "capacity-block" else "ON_DEMAND"


# GPU node root volume when the instance store holds the container runtime: nodeadm's
# ``localStorage: RAID0`` bind-mounts /var/lib/containerd, /var/lib/kubelet and /var/log/pods onto
# the array (amazon-eks-ami nodeadm internal/system/local_disk.go), so the root holds only the OS
# and the AMI's NVIDIA stack. 100 GiB is compute.rootVolumeGib's minimum.
EKS_RAID0_ROOT_VOLUME_GIB = 100


def gpu_root_volume_gib(spec: DeploymentSpec) -> int:
    """Root volume of EKS GPU nodes, GiB: ``compute.rootVolumeGib`` when set in the stack, else
    ``EKS_RAID0_ROOT_VOLUME_GIB`` on instances with NVMe (images and pod data on the RAID0),
    else the config default."""
    compute = spec.config.compute
    if "root_volume_gib" in compute.model_fields_set or spec.instance.nvme_devices == 0:
        return compute.root_volume_gib
    return EKS_RAID0_ROOT_VOLUME_GIB


def reserved_capacity(spec: DeploymentSpec) -> bool:
    """Whether the GPU nodes run on a reservation (ODCR or capacity block) that holds exactly the
    instances paid for: no room for a replacement node before the old one is gone."""
    return spec.config.compute.capacity.type in ("odcr", "capacity-block")


def gpu_update_config(spec: DeploymentSpec) -> aws.eks.NodeGroupUpdateConfigArgs:
    """The GPU node group's update strategy (EKS user guide, "Update a managed node group",
    ``updateConfig.updateStrategy``): ``DEFAULT`` launches new nodes before it drains the old
    ones, which a fully used reservation has no room for, so the update fails; ``MINIMAL``
    terminates first. Reserved capacity (ODCR, capacity block) gets ``MINIMAL`` with one node
    unavailable at a time; on-demand keeps ``DEFAULT``.

    Capacity blocks also need the node group scaled to 0 before a version or AMI upgrade (EKS
    user guide, "Capacity Blocks for ML"; docs/aws.md "Upgrading GPU nodes on reserved capacity")."""
    if reserved_capacity(spec):
        return aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1, update_strategy="MINIMAL")
    return aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1, update_strategy="DEFAULT")


def uses_placement_group(spec: DeploymentSpec) -> bool:
    """A new cluster placement group for the GPU nodes: on-demand capacity with EFA or
    multi-node copies only. Capacity blocks and ODCRs are placed already; launching them into a
    placement group the reservation was not created in can fail (InsufficientInstanceCapacity)."""
    return spec.config.compute.capacity.type == "on-demand" and (spec.efa_enabled or spec.nodes_per_copy > 1)


def access_entry_suffix(principal_arn: str) -> str:
    """A stable logical-name suffix for an admin principal: its name and a short digest (the
    list may be reordered without replacing entries)."""
    import hashlib

    tail = re.sub(r"[^A-Za-z0-9-]+", "-", principal_arn.rsplit("/", 1)[-1]).strip("-").lower()[:32]
    return f"{tail}-{hashlib.sha256(principal_arn.encode()).hexdigest()[:8]}"


def kubeconfig_json(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig for the cluster using ``aws eks get-token`` (no static credentials)."""
    user = f"{cluster_name}-aws"
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
            "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": user}}],
            "current-context": cluster_name,
            "users": [
                {
                    "name": user,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "aws",
                            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region, "--output", "json"],
                            "interactiveMode": "Never",
                        }
                    },
                }
            ],
        },
        sort_keys=True,
    )


def engine_cache_grant(spec: DeploymentSpec, partition: pulumi.Input[str], bucket: pulumi.Input[str]) -> tuple[str, Any]:
    """``(service account, policy document Output or None)``: the engine-cache rights of the
    vLLM pods' account (``engine_cache.vllm_pods_service_account``), read and write under
    ``engine_cache.cache_key_prefix`` only; None where the pods do not restore the caches."""
    from components.core import engine_cache as ec

    account = ec.vllm_pods_service_account(spec)
    if not spec.profile.creates_cluster or not ec.restored_at_start(spec):
        return account, None
    cache_prefix = ec.cache_key_prefix(spec)
    return account, pulumi.Output.all(partition, bucket).apply(lambda v: iam.engine_cache_policy(v[0], v[1], cache_prefix))


def role_description(spec: DeploymentSpec, account: str, write: bool, policies: list[str]) -> str:
    """The IAM description of a Pod Identity role: what it may do in the mirror."""
    rights = []
    if "weight-mirror" in policies:
        rights.append(f"{'write' if write else 'read'} {spec.config.storage.mirror.prefix}/ in the mirror")
    if "engine-cache" in policies:
        rights.append("read and write the engine caches of its revision")
    return f"kimi-deploy {spec.stack}: {spec.config.kubernetes.namespace}/{account} ({'; '.join(rights)})"


@dataclass
class EksClusterArgs:
    """Inputs of ``EksCluster``.

    Attributes:
        spec: the deployment spec.
        tags: the stack's tags.
        region, partition: where it runs.
        cluster_name: the cluster's name (plain string).
        private_subnet_ids: every private subnet (control plane, system nodes).
        gpu_subnet_ids: private subnets in the GPU AZ.
        gpu_security_group_id, efa_security_group_id: groups of GPU nodes (EFA may be None).
        mirror_bucket: the mirror bucket's name, or None (no Pod Identity roles then).
        install_fsx_csi: install the FSx CSI driver add-on.
        expires_at: the stack's expiry (RFC 3339, an Output when fixed at the first `pulumi up`),
            or None; with one, a schedule scales the GPU node group to zero then (``expiry.py``).
        now: the run's clock (a `pulumi up` past the expiry is refused).
    """

    spec: DeploymentSpec
    tags: dict[str, Any]
    region: str
    partition: pulumi.Input[str]
    cluster_name: str
    private_subnet_ids: pulumi.Input[list[str]]
    gpu_subnet_ids: pulumi.Input[list[str]]
    gpu_security_group_id: pulumi.Input[str]
    efa_security_group_id: pulumi.Input[str] | None
    mirror_bucket: pulumi.Input[str] | None
    install_fsx_csi: bool = False
    expires_at: pulumi.Input[str] | None = None
    now: datetime | None = None


class EksCluster(pulumi.ComponentResource):
    """The EKS cluster and its nodes.

    Attributes:
        cluster_name, endpoint: the cluster.
        cluster_security_group_id: the EKS-created cluster security group (on every node).
        kubeconfig: secret Output (JSON kubeconfig, exec auth).
        provider: ``pulumi_kubernetes.Provider`` for the cluster.
        gpu_node_group_names: names of the GPU node groups.
        service_account_roles: service account name -> role ARN (Pod Identity).
        ready: resources workloads should depend on.
    """

    cluster_name: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]

    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("kimi-deploy:aws:EksCluster", name, None, opts)
        self._args = args
        self._name = name
        cluster = self._create_cluster()
        self.cluster_name = cluster.name
        self.endpoint = cluster.endpoint
        self.cluster_security_group_id = cluster.vpc_config.cluster_security_group_id
        node_role = iam.role(
            f"{name}-node-role",
            parent=self,
            ctx_tags=args.tags,
            service="ec2.amazonaws.com",
            partition=args.partition,
            managed=iam.NODE_MANAGED_POLICIES,
            inline={"session-manager": iam.session_manager_policy()},
            description=f"kimi-deploy {args.spec.stack}: EKS nodes",
        )
        early: list[pulumi.Resource] = [self._addon(cluster, addon) for addon in ADDONS_BEFORE_NODES]
        system = self._create_system_node_group(cluster, node_role, early)
        # phase: stage declares no GPU node group (config/phase.py): serve adds it to this cluster.
        gpu = None if args.spec.staging else self._create_gpu_node_group(cluster, node_role, early)
        late = [self._addon(cluster, addon, depends_on=[system]) for addon in ADDONS_AFTER_NODES]
        if args.install_fsx_csi:
            late.append(self._addon(cluster, FSX_CSI_ADDON, depends_on=[system]))
        associations = self._create_pod_identities(cluster, early)
        associations += declare_node_autoscaler_identity(self, name, args.spec, cluster, args.partition, args.tags, early)
        self.admin_access = self._create_admin_access(cluster)
        self.gpu_node_group_names = pulumi.Output.all(*([gpu.node_group_name] if gpu is not None else []))
        self.expiry_schedule = None
        self.expiry_launch_schedule: aws.scheduler.Schedule | None = None
        if gpu is not None and args.expires_at is not None:
            request = pulumi.Output.all(cluster.name, gpu.node_group_name).apply(lambda v: scale_to_zero_input(v[0], v[1]))
            self.expiry_schedule = declare_expiry_stop(
                self, name, ctx_tags=args.tags, partition=args.partition, expires_at=args.expires_at,
                expiry_key=expiry_key(args.spec), now=args.now or datetime.now(UTC), target=SCALE_NODEGROUP_TARGET,
                action=SCALE_NODEGROUP_ACTION, resource_arn=gpu.arn, request=request,
                what=f"scale the GPU node group of {args.spec.stack} to zero",
            )
            # maxSize stays >= 1 (EKS), so a cluster autoscaler could scale the group up again:
            # its Auto Scaling group stops launching at the same time (expiry.py).
            asg = gpu.resources.apply(lambda r: r[0].autoscaling_groups[0].name)

            self.expiry_launch_schedule = declare_expiry_stop(
                self, f"{name}-launch", ctx_tags=args.tags, partition=args.partition, expires_at=args.expires_at,
                expiry_key=expiry_key(args.spec), now=args.now or datetime.now(UTC), target=SUSPEND_LAUNCH_TARGET,
                action=SUSPEND_LAUNCH_ACTION,
                resource_arn=pulumi.Output.all(args.partition, asg).apply(lambda v: asg_arn_pattern(v[0], args.region, v[1])),
                request=asg.apply(suspend_launch_input),
                what=f"stop the GPU node group of {args.spec.stack} launching instances",
            )
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority.data).apply(
                lambda v: kubeconfig_json(v[0], v[1], v[2], args.region)
            )
        )
        self.api_access_rules = self._create_api_access_rules(cluster)
        import pulumi_kubernetes as k8s

        # Every Kubernetes object waits for the deployer's path to the API server (the rules above).
        self.provider = k8s.Provider(
            f"{name}-k8s", kubeconfig=self.kubeconfig, opts=child(self, depends_on=[cluster, *self.api_access_rules])
        )
        self.ready: list[pulumi.Resource] = [system, *([gpu] if gpu is not None else []), *early, *late, *associations]
        self.register_outputs(
            {
                "clusterName": cluster.name,
                "endpoint": cluster.endpoint,
                "clusterSecurityGroupId": self.cluster_security_group_id,
                "gpuNodeGroupNames": self.gpu_node_group_names,
                "serviceAccountRoles": self.service_account_roles,
            }
        )

    # -- control plane --------------------------------------------------------------------
    def _create_cluster(self) -> aws.eks.Cluster:
        a, name = self._args, self._name
        spec = a.spec
        key = aws.kms.Key(
            f"{name}-secrets-key",
            description=f"kimi-deploy {spec.stack}: EKS secrets envelope encryption",
            enable_key_rotation=True,
            deletion_window_in_days=7,
            tags=tags(a.tags, f"{spec.stack}-eks-secrets"),
            opts=child(self),
        )
        # Created here (not by EKS on first log line) so it carries tags, a retention, and
        # goes away with the stack.
        logs = aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs",
            name=f"/aws/eks/{a.cluster_name}/cluster",
            retention_in_days=LOG_RETENTION_DAYS,
            tags=tags(a.tags),
            opts=child(self),
        )
        cluster_role = iam.role(
            f"{name}-cluster-role",
            parent=self,
            ctx_tags=a.tags,
            service="eks.amazonaws.com",
            partition=a.partition,
            managed=iam.CLUSTER_MANAGED_POLICIES,
            description=f"kimi-deploy {spec.stack}: EKS control plane",
        )
        access = api_server_access(spec.config)
        vpc_config: dict[str, Any] = dict(
            subnet_ids=a.private_subnet_ids, endpoint_private_access=True, endpoint_public_access=access.public
        )
        if access.public:
            vpc_config["public_access_cidrs"] = list(access.public_cidrs)
        return aws.eks.Cluster(
            f"{name}-cluster",
            name=a.cluster_name,
            version=eks_version_of(spec.config),
            role_arn=cluster_role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(**vpc_config),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API", bootstrap_cluster_creator_admin_permissions=True
            ),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=key.arn), resources=["secrets"]
            ),
            kubernetes_network_config=aws.eks.ClusterKubernetesNetworkConfigArgs(service_ipv4_cidr=SERVICE_IPV4_CIDR),
            enabled_cluster_log_types=list(CONTROL_PLANE_LOG_TYPES),
            bootstrap_self_managed_addons=False,
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=spec.config.kubernetes.eks_support_type),
            tags=tags(a.tags, a.cluster_name),
            opts=child(self, depends_on=[logs]),
        )

    def _addon(self, cluster: aws.eks.Cluster, addon: str, depends_on: list[pulumi.Resource] | None = None) -> aws.eks.Addon:
        return aws.eks.Addon(
            f"{self._name}-addon-{addon}",
            cluster_name=cluster.name,
            addon_name=addon,
            configuration_values=ADDON_CONFIGURATION.get(addon),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            tags=tags(self._args.tags),
            opts=child(self, depends_on=depends_on or []),
        )

    # -- nodes ----------------------------------------------------------------------------
    def _create_system_node_group(
        self, cluster: aws.eks.Cluster, node_role: aws.iam.Role, after: list[pulumi.Resource]
    ) -> aws.eks.NodeGroup:
        a, name = self._args, self._name
        template = aws.ec2.LaunchTemplate(
            f"{name}-system-lt",
            description=f"kimi-deploy {a.spec.stack}: EKS system nodes",
            # Hop limit 1 (``SYSTEM_IMDS_HOP_LIMIT``): a pod that reaches IMDS gets the node role.
            metadata_options=metadata_options(hop_limit=SYSTEM_IMDS_HOP_LIMIT),
            block_device_mappings=root_volume(SYSTEM_ROOT_VOLUME_GIB),
            vpc_security_group_ids=[cluster.vpc_config.cluster_security_group_id],
            tag_specifications=launched_tag_specifications(a.tags, f"{a.spec.stack}-system"),
            update_default_version=True,
            tags=tags(a.tags, f"{a.spec.stack}-system"),
            opts=child(self),
        )
        return aws.eks.NodeGroup(
            f"{name}-system",
            cluster_name=cluster.name,
            node_role_arn=node_role.arn,
            subnet_ids=a.private_subnet_ids,
            ami_type=SYSTEM_AMI_TYPE,
            capacity_type="ON_DEMAND",
            instance_types=[SYSTEM_INSTANCE_TYPE],
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=template.id, version=template.latest_version.apply(str)),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(**SYSTEM_NODES),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            labels={SYSTEM_NODE_LABEL: SYSTEM_NODE_ROLE},
            tags=tags(a.tags, f"{a.spec.stack}-system"),
            opts=child(self, depends_on=after, ignore_changes=DESIRED_SIZE_IGNORED),
        )

    def _gpu_user_data(self, cluster: aws.eks.Cluster) -> pulumi.Output[str]:
        import base64

        if not self._args.spec.config.compute.ami_id:
            return pulumi.Output.from_input(base64.b64encode(eks_node_user_data().encode()).decode())
        return pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority.data).apply(
            lambda v: base64.b64encode(eks_node_user_data(ClusterDetails(v[0], v[1], v[2], SERVICE_IPV4_CIDR)).encode()).decode()
        )

    def _create_gpu_node_group(
        self, cluster: aws.eks.Cluster, node_role: aws.iam.Role, after: list[pulumi.Resource]
    ) -> aws.eks.NodeGroup:
        a, name = self._args, self._name
        spec = a.spec
        groups: list[pulumi.Input[str]] = [cluster.vpc_config.cluster_security_group_id, a.gpu_security_group_id]
        extra: dict[str, Any] = {}
        if spec.efa_enabled and a.efa_security_group_id is not None:
            groups.append(a.efa_security_group_id)
            extra["network_interfaces"] = efa_network_interfaces(spec.instance, groups)
        else:
            extra["vpc_security_group_ids"] = groups
        if uses_placement_group(spec):
            placement = aws.ec2.PlacementGroup(
                f"{name}-gpu-placement", strategy="cluster", tags=tags(a.tags, f"{spec.stack}-gpu"), opts=child(self)
            )
            extra["placement"] = aws.ec2.LaunchTemplatePlacementArgs(group_name=placement.name)
        if spec.config.compute.ami_id:
            extra["image_id"] = spec.config.compute.ami_id
        template = aws.ec2.LaunchTemplate(
            f"{name}-gpu-lt",
            description=f"kimi-deploy {spec.stack}: {spec.instance.instance_type} GPU nodes",
            # Capacity blocks need the instance type in the template (EKS user guide).
            instance_type=spec.instance.instance_type,
            metadata_options=metadata_options(hop_limit=GPU_IMDS_HOP_LIMIT),
            block_device_mappings=root_volume(gpu_root_volume_gib(spec)),
            user_data=self._gpu_user_data(cluster),
            tag_specifications=launched_tag_specifications(a.tags, f"{spec.stack}-gpu"),
            update_default_version=True,
            tags=tags(a.tags, f"{spec.stack}-gpu"),
            opts=child(self),
            **extra,
            **capacity_options(spec),
        )
        return aws.eks.NodeGroup(
            f"{name}-gpu",
            cluster_name=cluster.name,
            node_role_arn=node_role.arn,
            subnet_ids=a.gpu_subnet_ids,
            ami_type="CUSTOM" if spec.config.compute.ami_id else NVIDIA_AMI_TYPES[spec.instance.cpu_architecture],
            capacity_type=gpu_capacity_type(spec),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=template.id, version=template.latest_version.apply(str)),
            # min 0: a capacity block ends, or the operator scales to zero between sessions.
            # autoscaled stacks: min/max follow autoscaling.minReplicas/maxReplicas (spec/scaling.py).
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(**gpu_node_group_size(spec)),
            update_config=gpu_update_config(spec),
            node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(enabled=True),
            labels=gpu_node_labels(spec),
            taints=[aws.eks.NodeGroupTaintArgs(key=GPU_TAINT_KEY, value="true", effect="NO_SCHEDULE")],
            tags=tags(a.tags, f"{spec.stack}-gpu"),
            # On a reservation the old node group must release its instances before a
            # replacement (new AMI type, capacity type or subnets) can launch into it.
            opts=child(
                self, depends_on=after, ignore_changes=DESIRED_SIZE_IGNORED, delete_before_replace=reserved_capacity(spec)
            ),
        )

    # -- access ------------------------------------------------------------------------------
    def _create_api_access_rules(self, cluster: aws.eks.Cluster) -> list[aws.vpc.SecurityGroupIngressRule]:
        """Port 443 (``EKS_API_SERVER_PORT``) of the EKS cluster security group (the private endpoint's network interfaces
        carry it) from each of ``network.apiServerPrivateCidrs`` and
        ``apiServerPrivateSecurityGroupIds``: the deployer's path to the private endpoint. Rules
        on the EKS-created group, not an extra group in ``vpcConfig.securityGroupIds``: that
        input replaces the cluster (terraform-provider-aws ForceNew; scripts/ops/diff/rules.py),
        a rule is added and removed in place. Named after the source, so reordering the list
        replaces nothing."""
        a, name = self._args, self._name
        access = api_server_access(a.spec.config)
        group = cluster.vpc_config.cluster_security_group_id
        # One ingress rule per named source of the private path: a CIDR block or a security group.
        sources = [(f"cidr-{cidr.replace('/', '_')}", {"cidr_ipv4": cidr}, cidr, "network.apiServerPrivateCidrs")
                   for cidr in access.private_cidrs]
        sources += [(f"sg-{sg}", {"referenced_security_group_id": sg}, sg, "network.apiServerPrivateSecurityGroupIds")
                    for sg in access.private_security_group_ids]
        rules = []
        for suffix, peer, shown, key in sources:
            rules.append(aws.vpc.SecurityGroupIngressRule(
                f"{name}-api-{suffix}",
                security_group_id=group,
                ip_protocol="tcp",
                from_port=EKS_API_SERVER_PORT,
                to_port=EKS_API_SERVER_PORT,
                description=f"Kubernetes API from {shown} ({key})",
                tags=tags(a.tags),
                opts=child(self),
                **peer,
            ))
        return rules

    def _create_admin_access(self, cluster: aws.eks.Cluster) -> list[aws.eks.AccessPolicyAssociation]:
        """An access entry plus ``AmazonEKSClusterAdminPolicy`` (cluster scope) for each of
        ``kubernetes.adminRoleArns`` (the cluster's authentication mode is ``API``)."""
        a, name = self._args, self._name
        out = []
        for arn in a.spec.config.kubernetes.admin_role_arns:
            suffix = access_entry_suffix(arn)
            entry = aws.eks.AccessEntry(
                f"{name}-admin-{suffix}",
                cluster_name=cluster.name,
                principal_arn=arn,
                type="STANDARD",
                tags=tags(a.tags),
                opts=child(self),
            )
            out.append(
                aws.eks.AccessPolicyAssociation(
                    f"{name}-admin-policy-{suffix}",
                    cluster_name=cluster.name,
                    principal_arn=entry.principal_arn,
                    policy_arn=pulumi.Output.concat(
                        "arn:", a.partition, ":eks::aws:cluster-access-policy/", CLUSTER_ADMIN_ACCESS_POLICY
                    ),
                    access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                    opts=child(self, depends_on=[entry]),
                )
            )
        return out

    # -- Pod Identity -----------------------------------------------------------------------
    def _create_pod_identities(
        self, cluster: aws.eks.Cluster, after: list[pulumi.Resource]
    ) -> list[aws.eks.PodIdentityAssociation]:
        a, name = self._args, self._name
        spec = a.spec
        self.service_account_roles: dict[str, pulumi.Output[str]] = {}
        if a.mirror_bucket is None:
            return []
        prefix = spec.config.storage.mirror.prefix
        # The publisher writes only this stack's revision (iam.py module docstring).
        revision_prefix = mirror_key_prefix(spec)
        namespace = spec.config.kubernetes.namespace
        out = []
        inline: dict[str, dict[str, Any]] = {}
        for account, write in ((WEIGHT_SYNC_SERVICE_ACCOUNT, False), (MIRROR_PUBLISH_SERVICE_ACCOUNT, True)):
            # `write` rides in the Output (a plain value: no dependency) so the lambda needs no default argument.
            inline[account] = {"weight-mirror": pulumi.Output.all(a.partition, a.mirror_bucket, write).apply(
                lambda v: iam.mirror_policy(v[0], v[1], prefix, write=v[2], write_prefix=revision_prefix)
            )}
        # The vLLM pods' account restores and saves the engine caches (components/k8s/engine_cache.py).
        cache_account, cache_doc = engine_cache_grant(spec, a.partition, a.mirror_bucket)
        if cache_doc is not None:
            inline.setdefault(cache_account, {})["engine-cache"] = cache_doc
        for account, policies in inline.items():
            write = account == MIRROR_PUBLISH_SERVICE_ACCOUNT
            role = iam.role(
                f"{name}-{account}",
                parent=self,
                ctx_tags=a.tags,
                service="pods.eks.amazonaws.com",
                tag_session=True,
                partition=a.partition,
                inline=policies,
                description=role_description(spec, account, write, sorted(policies)),
            )
            out.append(
                aws.eks.PodIdentityAssociation(
                    f"{name}-{account}",
                    cluster_name=cluster.name,
                    namespace=namespace,
                    service_account=account,
                    role_arn=role.arn,
                    tags=tags(a.tags),
                    opts=child(self, depends_on=after),
                )
            )
            self.service_account_roles[account] = role.arn
        return out

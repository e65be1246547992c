"""AWS infrastructure for the ``aws-ec2`` and ``aws-eks`` platforms.

``declare_aws(ctx)`` declares, in order: the network (``network.py``), the S3 weight mirror
(``storage.py``), the optional FSx for Lustre file system, then either one GPU instance
(``compute.py``, ``aws-ec2``) or an EKS cluster with GPU node groups (``cluster.py``,
``aws-eks``). It returns an ``AwsResult``: the stack outputs and, on ``aws-eks``, the
``KubernetesPlatformHandle`` (``components/platform.py``) the Kubernetes edge consumes.
``declare_aws_platform`` is the program's entry point (``components/program.py``).
Which branch runs is a field of the platform's profile (``components/core/platforms.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from components.core import naming
from components.core.weights import mirror_uri
from components.platform import FsxVolumeSource, KubernetesPlatformHandle, PlatformResult

from .common import resource_prefix
from .network import Network, NetworkArgs
from .storage import LustreArgs, LustreStorage, WeightMirror, WeightMirrorArgs

if TYPE_CHECKING:
    from components.context import DeploymentContext


@dataclass
class FsxInfo:
    """An FSx for Lustre file system as a Lustre client (or the FSx CSI driver) mounts it.

    Attributes:
        file_system_id: ``fs-...`` (the CSI ``volumeHandle``).
        dns_name: the ``dnsname`` volume attribute.
        mount_name: the ``mountname`` volume attribute.
        file_system_path: where the data repository association maps the mirror prefix
            (``/<storage.mirror.prefix>``), so weights appear at ``/fsx/<prefix>/<org>/<repo>/<rev>``.
        capacity_gib: the file system's capacity (for a static PersistentVolume).
    """

    file_system_id: pulumi.Output[str]
    dns_name: pulumi.Output[str]
    mount_name: pulumi.Output[str]
    file_system_path: str
    capacity_gib: int


@dataclass
class AwsResult:
    """What ``declare_aws`` made, for the stack outputs and the Kubernetes edge.

    Attributes:
        outputs: stack outputs (camelCase keys) merged into the program's exports.
        region: the AWS region.
        availability_zone: the AZ GPU nodes (and FSx) are pinned to.
        vpc_id: the VPC.
        mirror_bucket: the mirror bucket's name, or None when the mirror is disabled. Pass it
            to ``spec/weights.py sync_steps`` (inside ``apply``) for the Jobs' argv.
        fsx: the file system, or None.
        cluster_name: the EKS cluster's name (``aws-eks``), else None.
        kubeconfig: the cluster's kubeconfig (secret Output; ``aws eks get-token`` exec auth), else None.
        kubernetes: the handle for the Kubernetes edge (``aws-eks``: the cluster's provider, GPU
            placement, mirror, FSx, readiness and Pod Identity roles), else None.
        instance_id: the GPU instance (``aws-ec2``), else None.
        private_endpoint: the OpenAI-compatible base URL inside the VPC (``aws-ec2``; on EKS
            the Kubernetes edge exports the Service's), else None.
    """

    outputs: dict[str, Any] = field(default_factory=dict)
    region: str | None = None
    availability_zone: str | None = None
    vpc_id: pulumi.Output[str] | None = None
    mirror_bucket: pulumi.Output[str] | None = None
    fsx: FsxInfo | None = None
    cluster_name: pulumi.Output[str] | None = None
    kubeconfig: pulumi.Output[str] | None = None
    kubernetes: KubernetesPlatformHandle | None = None
    instance_id: pulumi.Output[str] | None = None
    private_endpoint: pulumi.Output[str] | None = None


class AwsDeployment(pulumi.ComponentResource):
    """The parent of every AWS resource of the stack (one node in the resource tree)."""

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("kimi-deploy:aws:Deployment", name, None, opts)


def declare_aws(ctx: DeploymentContext) -> AwsResult:
    """Declare the AWS infrastructure of ``ctx.spec`` (platform ``aws-ec2`` or ``aws-eks``).

    Args:
        ctx: the ``DeploymentContext`` (spec, sizing, vLLM command, tags, secrets).

    Returns:
        The ``AwsResult``.

    Raises:
        ConfigError: a configured existing subnet set has no subnet in the GPU AZ (checked
            with a synchronous look-up before any resource is declared). Pure checks
            (aws-ec2 needs the mirror, vpcId needs subnets) are parse_spec's.
    """
    spec, sizing = ctx.spec, ctx.sizing
    profile = spec.profile
    region = spec.region
    if region is None:  # parse_spec requires aws:region on every AWS platform
        raise ValueError(f"{spec.platform}: the spec has no AWS region")
    result = AwsResult(region=region)
    partition = aws.get_partition_output().partition
    cluster_name = naming.eks_cluster_name(spec.project, spec.stack) if profile.creates_cluster else None
    root = AwsDeployment(resource_prefix(spec.project, spec.stack))

    network = Network(
        "net",
        NetworkArgs(spec=spec, tags=ctx.tags, region=region, cluster_name=cluster_name),
        pulumi.ResourceOptions(parent=root),
    )
    result.vpc_id = network.vpc_id
    result.availability_zone = network.gpu_availability_zone
    gpu_subnet = network.gpu_subnet_ids.apply(lambda ids: ids[0])

    mirror = None
    if spec.config.storage.mirror.enabled:
        mirror = WeightMirror(
            "mirror",
            WeightMirrorArgs(spec=spec, tags=ctx.tags, partition=partition, upload_tools=profile.serves_under_systemd),
            pulumi.ResourceOptions(parent=root),
        )
        result.mirror_bucket = mirror.bucket_name

    client_groups: list[pulumi.Input[str]] = [network.gpu_security_group_id]
    cluster = None
    if cluster_name is not None:
        from .cluster import EksCluster, EksClusterArgs

        cluster = EksCluster(
            "eks",
            EksClusterArgs(
                spec=spec,
                tags=ctx.tags,
                region=region,
                partition=partition,
                cluster_name=cluster_name,
                private_subnet_ids=network.private_subnet_ids,
                gpu_subnet_ids=network.gpu_subnet_ids,
                gpu_security_group_id=network.gpu_security_group_id,
                efa_security_group_id=network.efa_security_group_id,
                mirror_bucket=result.mirror_bucket,
                install_fsx_csi=sizing.storage.fsx_capacity_gib is not None,
                expires_at=ctx.expires_at,
                now=ctx.now,
            ),
            pulumi.ResourceOptions(parent=root),
        )
        client_groups.append(cluster.cluster_security_group_id)
        result.cluster_name = cluster.cluster_name
        result.kubeconfig = cluster.kubeconfig
        result.outputs.update(
            {
                "clusterName": cluster.cluster_name,
                "clusterEndpoint": cluster.endpoint,
                "kubeconfig": cluster.kubeconfig,
                "gpuNodeGroups": cluster.gpu_node_group_names,
            }
        )

    if sizing.storage.fsx_capacity_gib is not None:
        if result.mirror_bucket is None:  # parse_spec requires the mirror for FSx kinds
            raise ValueError(f"storage.kind {spec.config.storage.kind}: FSx needs the S3 mirror, which is disabled")
        lustre_group, fsx_rules = network.lustre_security_group("net", client_groups)
        fsx_groups: list[pulumi.Input[str]] = [lustre_group]
        if spec.config.storage.fsx.efa and network.efa_security_group_id is not None:
            fsx_groups.append(network.efa_security_group_id)
            fsx_rules = [*fsx_rules, *network.efa_security_group_rules]
        lustre = LustreStorage(
            "fsx",
            LustreArgs(
                spec=spec,
                sizing=sizing,
                tags=ctx.tags,
                subnet_id=gpu_subnet,
                security_group_ids=fsx_groups,
                security_group_rules=fsx_rules,
                mirror_bucket=result.mirror_bucket,
            ),
            pulumi.ResourceOptions(parent=root),
        )
        result.fsx = FsxInfo(
            file_system_id=lustre.file_system_id,
            dns_name=lustre.dns_name,
            mount_name=lustre.mount_name,
            file_system_path=lustre.file_system_path,
            capacity_gib=sizing.storage.fsx_capacity_gib,
        )
        result.outputs.update(
            {"fsxFileSystemId": lustre.file_system_id, "fsxDnsName": lustre.dns_name, "fsxMountName": lustre.mount_name}
        )

    if cluster is not None:
        from components.k8s.common import gpu_placement, service_access

        fsx = result.fsx
        result.kubernetes = KubernetesPlatformHandle(
            profile=profile,
            provider=cluster.provider,
            placement=gpu_placement(spec),
            service_access=service_access(spec, cluster_cidrs=network.node_subnet_cidrs),
            mirror_bucket=result.mirror_bucket,
            fsx=FsxVolumeSource(fsx.file_system_id, fsx.dns_name, fsx.mount_name, fsx.capacity_gib) if fsx else None,
            cluster_ready=tuple(cluster.ready),
            pod_identity_roles=dict(cluster.service_account_roles),
        )

    if profile.serves_under_systemd and spec.staging:
        from .stager import Ec2Stager, Ec2StagerArgs

        # phase: stage (config/phase.py): a CPU instance publishes the mirror and terminates; no GPU.
        if mirror is None or result.mirror_bucket is None or mirror.weight_sync_sha256 is None:
            raise ValueError(f"{spec.platform}: the stager runs the publish from the S3 mirror's tools, which are missing")
        stager = Ec2Stager(
            "stage",
            Ec2StagerArgs(
                spec=spec, sizing=sizing, vllm=ctx.vllm, tags=ctx.tags, region=region, partition=partition,
                vpc_id=network.vpc_id, subnet_id=gpu_subnet, mirror_bucket=result.mirror_bucket,
                tools_sha256=mirror.weight_sync_sha256, hub_token=ctx.hub_token,
            ),
            pulumi.ResourceOptions(parent=root, depends_on=[mirror]),
        )
        result.outputs.update({"stageInstanceId": stager.instance_id, "stageInstanceType": stager_instance_type()})
    elif profile.serves_under_systemd:
        from .compute import Ec2GpuServer, Ec2GpuServerArgs

        # parse_spec requires the mirror on aws-ec2; the mirror uploads the tools there.
        if mirror is None or result.mirror_bucket is None or mirror.tools_object_key is None or mirror.weight_sync_sha256 is None:
            raise ValueError(f"{spec.platform}: the instance boots from the S3 mirror and its tools, which are missing")

        groups: list[pulumi.Input[str]] = [network.gpu_security_group_id]
        if spec.efa_enabled and network.efa_security_group_id is not None:
            groups.append(network.efa_security_group_id)
        server = Ec2GpuServer(
            "gpu",
            Ec2GpuServerArgs(
                spec=spec,
                sizing=sizing,
                vllm=ctx.vllm,
                tags=ctx.tags,
                region=region,
                partition=partition,
                subnet_id=gpu_subnet,
                security_group_ids=groups,
                mirror_bucket=result.mirror_bucket,
                tools_object_key=mirror.tools_object_key,
                tools_sha256=mirror.weight_sync_sha256,
                api_key=ctx.api_key,
                hub_token=ctx.hub_token,
                expires_at=ctx.expires_at,
                now=ctx.now,
            ),
            pulumi.ResourceOptions(parent=root, depends_on=[mirror]),
        )
        result.instance_id = server.instance_id
        result.private_endpoint = pulumi.Output.concat("http://", server.private_ip, ":", str(ctx.vllm.port), "/v1")
        result.outputs.update(
            {
                "privateEndpoint": result.private_endpoint,
                "instanceId": server.instance_id,
                "ssmSessionCommand": pulumi.Output.concat(
                    "aws ssm start-session --region ", region, " --target ", server.instance_id,
                    " --document-name AWS-StartPortForwardingSession --parameters portNumber=",
                    str(ctx.vllm.port), ",localPortNumber=", str(ctx.vllm.port),
                ),
                "apiKeyParameter": server.api_key_parameter,
            }
        )

    cap = spec.config.compute.capacity
    result.outputs.update(
        {
            "region": region,
            "availabilityZone": network.gpu_availability_zone,
            "vpcId": network.vpc_id,
            "instanceType": spec.instance.instance_type,
            "gpuNodes": 0 if spec.staging else spec.gpu_nodes,
            "capacityType": cap.type,
            "gpuPriceSource": sizing.price_source,
        }
    )
    if cap.reservation_id:
        result.outputs["capacityReservationId"] = cap.reservation_id
    if result.mirror_bucket is not None:
        result.outputs["mirrorBucket"] = result.mirror_bucket
        result.outputs["mirrorUri"] = result.mirror_bucket.apply(lambda b: mirror_uri(spec, b))
    root.register_outputs({k: v for k, v in result.outputs.items() if k != "kubeconfig"})
    return result


def stager_instance_type() -> str:
    """The stager's EC2 type (``targets.STAGING_INSTANCE``)."""
    from components.core.targets import STAGING_INSTANCE

    return STAGING_INSTANCE.instance_type


def declare_aws_platform(ctx: DeploymentContext) -> PlatformResult:
    """The ``aws-ec2`` / ``aws-eks`` platform: ``declare_aws`` as a ``PlatformResult`` (its
    outputs, and on ``aws-eks`` the Kubernetes handle)."""
    result = declare_aws(ctx)
    return PlatformResult(outputs=result.outputs, kubernetes=result.kubernetes)

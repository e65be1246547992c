"""The stager of ``phase: stage`` on ``aws-ec2``: one CPU instance that publishes the mirror (hub ->
S3, verified), then terminates itself.

It runs exactly the ``publish-mirror`` step of ``components/core/weights.py sync_steps`` (the same
argv, program and image as the GPU instance's weights unit: ``userdata.stage_cloud_config_text``)
on ``targets.STAGING_INSTANCE`` (an m6idn.4xlarge: baseline network that carries the measured hub
download in and the upload out, an
instance store for the staging files), from the standard Amazon Linux 2023 AMI, with its own AMI
contract (``ami_contract.CONTRACTS["stage"]``: no GPU item; docker and mdadm installed at boot by
its check, inside the retried chain).
``kimi-stage.service`` powers the instance off when the mirror is complete, and the instance is
launched with ``instance_initiated_shutdown_behavior="terminate"``: the power-off ends its billing.
A later ``pulumi up --refresh`` of the stage sees it gone and starts another, which finds the
mirror complete in seconds and terminates again; switching to ``phase: serve`` deletes it.

Its names are its own (``stage-*``, SSM parameter ``/<project>/<stack>/stage-hub-token``), so the
switch to serve adds the GPU instance beside what the stage made and removes only this component.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from components.core.config import DeploymentSpec
from components.core.sizing import Sizing, sync_budget_seconds
from components.core.targets import STAGING_INSTANCE
from components.core.vllm import VllmCommand
from components.core.weights import HUB_TOKEN_ENV, mirror_key_prefix, sync_steps

from . import iam
from .common import TOOLS_PREFIX, child, tags
from .compute import secret_parameter_name
from .userdata import Ec2BootConfig, stage_cloud_config_text

# Amazon Linux 2023 (standard, not the GPU DLAMI) through its public SSM parameter (AL2023 user
# guide, "Amazon Linux 2023 AMI IDs from SSM": /aws/service/ami-amazon-linux-latest/...).
AL2023_SSM_PARAMETER = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-{arch}"
# Root: OS + docker's copy of the vLLM image (~28.6 GB unpacked, time_inputs.VLLM_IMAGE_UNPACKED_BYTES).
STAGER_ROOT_VOLUME_GIB = 100
STAGER_ARCH_SUFFIX = {"x86_64": "x86_64", "arm64": "arm64"}


def stager_ami_parameter(cpu_architecture: str) -> str:
    """The public SSM parameter of the AL2023 AMI for ``x86_64`` or ``arm64``.

    Raises:
        KeyError: another architecture.
    """
    return AL2023_SSM_PARAMETER.format(arch=STAGER_ARCH_SUFFIX[cpu_architecture])


def stage_boot_config(
    spec: DeploymentSpec, sizing: Sizing, vllm: VllmCommand, *, bucket: str, tools_sha256: str, hub_token_set: bool,
    region: str | None = None,
) -> Ec2BootConfig:
    """The stager's boot config for mirror ``bucket``: only the ``publish-mirror`` step, its budget
    as the unit's timeout, the hub token from the stager's own SSM parameter."""
    from .storage import WEIGHT_SYNC_KEY

    steps = tuple(s for s in sync_steps(spec, bucket) if s.name == "publish-mirror")
    return Ec2BootConfig(
        region=region or spec.region or "",
        image=vllm.image,
        vllm_argv=(),
        vllm_env={},
        port=vllm.port,
        sync_steps=steps,
        tools_uri=f"s3://{bucket}/{WEIGHT_SYNC_KEY}",
        tools_sha256=tools_sha256,
        api_key_parameter="",
        hub_token_parameter=secret_parameter_name(spec.project, spec.stack, "stage-hub-token") if hub_token_set else None,
        hub_token_env=HUB_TOKEN_ENV[spec.model_source],
        nvme_devices=1 if STAGING_INSTANCE.nvme_bytes else 0,
        weights_timeout_seconds=sum(sync_budget_seconds(spec, sizing, step) for step in steps),
    )


@dataclass
class Ec2StagerArgs:
    """Inputs of ``Ec2Stager``.

    Attributes:
        spec, sizing, vllm: the deployment spec, its sizing and the serving command (its image runs the sync).
        tags: the stack's tags.
        region, partition: where it runs.
        vpc_id, subnet_id: a private subnet (NAT for the hub, the S3 gateway endpoint for the mirror).
        mirror_bucket: the mirror bucket's name.
        tools_sha256: sha256 of the weight-sync program in the mirror's ``_tools/``.
        hub_token: the hub token (secret Output) or None.
    """

    spec: DeploymentSpec
    sizing: Sizing
    vllm: VllmCommand
    tags: dict[str, Any]
    region: str
    partition: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    mirror_bucket: pulumi.Input[str]
    tools_sha256: str
    hub_token: pulumi.Input[str] | None


class Ec2Stager(pulumi.ComponentResource):
    """The stage's CPU instance: publishes the mirror, then terminates (module docstring).

    Attributes:
        instance_id: the instance.
        hub_token_parameter: the SSM parameter of the hub token, or None.
    """

    instance_id: pulumi.Output[str]

    def __init__(self, name: str, args: Ec2StagerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("kimi-deploy:aws:Ec2Stager", name, None, opts)
        self._args = args
        spec = args.spec
        self.hub_token_parameter = (
            secret_parameter_name(spec.project, spec.stack, "stage-hub-token") if args.hub_token is not None else None
        )
        params = self._create_hub_token_parameter(name)
        profile = self._create_instance_profile(name, params)
        group = self._create_security_group(name)
        instance = aws.ec2.Instance(
            f"{name}-instance",
            ami=aws.ssm.get_parameter_output(name=stager_ami_parameter(STAGING_INSTANCE.cpu_architecture)).value,
            instance_type=STAGING_INSTANCE.instance_type,
            subnet_id=args.subnet_id,
            vpc_security_group_ids=[group.id],
            iam_instance_profile=profile.name,
            # A power-off terminates: kimi-stage.service powers off once the mirror is complete.
            instance_initiated_shutdown_behavior="terminate",
            metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
            ),
            root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                volume_size=STAGER_ROOT_VOLUME_GIB, volume_type="gp3", encrypted=True, delete_on_termination=True
            ),
            user_data_base64=self._user_data(),
            # A new boot script means a new stager (user data is read at first boot only).
            user_data_replace_on_change=True,
            monitoring=True,
            tags=tags(args.tags, f"{spec.stack}-stage"),
            volume_tags=tags(args.tags, f"{spec.stack}-stage"),
            opts=child(self, depends_on=params, ignore_changes=["ami"]),
        )
        self.instance_id = instance.id
        self.register_outputs({"instanceId": instance.id, "instanceType": STAGING_INSTANCE.instance_type})

    def _create_hub_token_parameter(self, name: str) -> list[aws.ssm.Parameter]:
        a = self._args
        if self.hub_token_parameter is None:
            return []
        return [
            aws.ssm.Parameter(
                f"{name}-hub-token",
                name=self.hub_token_parameter,
                type="SecureString",
                value=a.hub_token,
                description="Model hub token (read by the stager's publish at boot)",
                tags=tags(a.tags),
                opts=child(self),
            )
        ]

    def _create_instance_profile(self, name: str, params: list[aws.ssm.Parameter]) -> aws.iam.InstanceProfile:
        a = self._args
        spec = a.spec
        prefix = spec.config.storage.mirror.prefix
        revision_prefix = mirror_key_prefix(spec)
        mirror_doc = pulumi.Output.all(a.partition, a.mirror_bucket).apply(
            lambda v: iam.mirror_policy(
                v[0], v[1], prefix, write=True, extra_read_prefixes=[TOOLS_PREFIX], write_prefix=revision_prefix
            )
        )
        inline: dict[str, pulumi.Input[str]] = {"weight-mirror": mirror_doc, "session-manager": iam.session_manager_policy()}
        if params:
            inline["boot-secrets"] = pulumi.Output.all(*[p.arn for p in params]).apply(
                lambda arns: iam.ssm_parameters_policy(list(arns))
            )
        role = iam.role(
            f"{name}-role",
            parent=self,
            ctx_tags=a.tags,
            service="ec2.amazonaws.com",
            partition=a.partition,
            managed=iam.EC2_INSTANCE_MANAGED_POLICIES,
            inline=inline,
            description=f"kimi-deploy {spec.stack}: stager (publishes the weight mirror under {revision_prefix})",
        )
        return aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=tags(a.tags), opts=child(self))

    def _create_security_group(self, name: str) -> aws.ec2.SecurityGroup:
        a = self._args
        group = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=a.vpc_id,
            description=f"kimi-deploy {a.spec.stack}: stager; no inbound, outbound to the hub, S3 and AWS APIs",
            tags=tags(a.tags, f"{a.spec.stack}-stage"),
            opts=child(self),
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-egress",
            security_group_id=group.id,
            ip_protocol="-1",
            cidr_ipv4="0.0.0.0/0",
            description="Outbound: hub and image registry (NAT), S3 (gateway endpoint), SSM",
            tags=tags(a.tags),
            opts=child(self),
        )
        return group

    def _user_data(self) -> pulumi.Output[str]:
        a = self._args
        hub_token_set = self.hub_token_parameter is not None

        def render(bucket: str) -> str:
            cfg = stage_boot_config(a.spec, a.sizing, a.vllm, bucket=bucket, tools_sha256=a.tools_sha256,
                                    hub_token_set=hub_token_set, region=a.region)
            return base64.b64encode(stage_cloud_config_text(cfg).encode()).decode()

        return pulumi.Output.from_input(a.mirror_bucket).apply(render)


__all__ = ["AL2023_SSM_PARAMETER", "Ec2Stager", "Ec2StagerArgs", "stage_boot_config", "stager_ami_parameter"]

"""GPU compute on EC2 (``aws-ec2``): one GPU instance from a launch template, plus the launch
template pieces the EKS GPU node groups share.

The instance: NVIDIA AMI of the instance's CPU architecture (the AWS Deep Learning Base OSS
NVIDIA Driver GPU AMI for Amazon Linux 2023, found through its public SSM parameter, or
``compute.amiId``), IMDSv2 required, an encrypted gp3 root volume, capacity targeting
(on-demand, an ODCR, or a capacity block), the ``#cloud-config`` of ``userdata.py``, and an
instance profile with Session Manager (no SSH key, no inbound SSH rule).

AMI pinning: the DLAMI parameter moves to each new release, and a new launch-template version
replaces the instance (losing the NVMe copy of the weights). So the DLAMI is resolved once, at
creation: the template ignores later changes of ``imageId``; every other change of the template
still makes a new version. To move to another AMI deliberately, set ``compute.amiId`` (an
explicit AMI is never ignored).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any

import pulumi
import pulumi_aws as aws

from components.core import naming
from components.core.config import DeploymentSpec
from components.core.naming import NVME_RAID0_HOST_PATH
from components.core.sizing import Sizing, sync_budget_seconds
from components.core.targets import InstanceFacts
from components.core.vllm import VllmCommand
from components.core.weights import HUB_TOKEN_ENV, WEIGHTS_MOUNT_PATH, mirror_key_prefix, sync_steps

from . import iam
from .common import TOOLS_PREFIX, child, tags
from .expiry import STOP_INSTANCES_ACTION, STOP_INSTANCES_TARGET, declare_expiry_stop, expiry_key, stop_instance_input
from .userdata import USER_DATA_LIMIT_BYTES, Ec2BootConfig, EngineCacheBoot, user_data_bytes

# AWS Deep Learning Base OSS NVIDIA Driver GPU AMI (Amazon Linux 2023): NVIDIA driver, CUDA,
# NVIDIA container toolkit, Docker, EFA, SSM agent, AWS CLI (DLAMI release notes; the public
# parameter format is /aws/service/deeplearning/ami/<arch>/<ami type>/latest/ami-id).
DLAMI_SSM_PARAMETER = "/aws/service/deeplearning/ami/{arch}/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
# Root device of Amazon Linux 2023 AMIs (DLAMI and EKS AL2023 alike).
ROOT_DEVICE_NAME = "/dev/xvda"
# The DLAMI found through SSM is pinned at creation (see the module docstring).
DLAMI_PINNED_IGNORE_CHANGES = ["imageId"]
# Tagged on instances, volumes and interfaces launched from a template.
LAUNCHED_RESOURCE_TYPES: tuple[str, ...] = ("instance", "volume", "network-interface")


def dlami_parameter(cpu_architecture: str) -> str:
    """The public SSM parameter of the DLAMI for ``x86_64`` or ``arm64``.

    Raises:
        ValueError: another architecture.
    """
    if cpu_architecture not in ("x86_64", "arm64"):
        raise ValueError(f"no NVIDIA AMI for CPU architecture {cpu_architecture!r}")
    return DLAMI_SSM_PARAMETER.format(arch=cpu_architecture)


def capacity_options(spec: DeploymentSpec) -> dict[str, Any]:
    """Launch-template arguments that target the configured capacity.

    on-demand: none (open reservations may still be used, as EC2 does by default).
    odcr: ``capacity_reservation_specification`` targeting the reservation.
    capacity-block: the same plus ``instance_market_options.market_type = "capacity-block"``.
    """
    cap = spec.config.compute.capacity
    if cap.type == "on-demand":
        return {}
    out: dict[str, Any] = {
        "capacity_reservation_specification": aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
            capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                capacity_reservation_id=cap.reservation_id
            )
        )
    }
    if cap.type == "capacity-block":
        out["instance_market_options"] = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
    return out


def metadata_options(hop_limit: int = 1) -> aws.ec2.LaunchTemplateMetadataOptionsArgs:
    """IMDSv2 only. A hop limit of 1 keeps bridged containers and pods away from the node's
    credentials (they use Pod Identity or host networking)."""
    return aws.ec2.LaunchTemplateMetadataOptionsArgs(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=hop_limit, instance_metadata_tags="disabled"
    )


def root_volume(size_gib: int) -> list[aws.ec2.LaunchTemplateBlockDeviceMappingArgs]:
    """An encrypted gp3 root volume of ``size_gib`` (OS plus the ~25 GB vLLM image and layers)."""
    return [
        aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
            device_name=ROOT_DEVICE_NAME,
            ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                volume_size=size_gib, volume_type="gp3", encrypted="true", delete_on_termination="true"
            ),
        )
    ]


def efa_network_interfaces(
    instance: InstanceFacts, security_group_ids: list[pulumi.Input[str]], subnet_id: pulumi.Input[str] | None = None
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]:
    """Network interfaces for EFA (EC2 user guide, "Maximize network bandwidth ... multiple
    network cards"): an ENA primary on card 0 device 0; one EFA-only interface on each card of
    the instance's published EFA layout (``InstanceFacts.efa_cards``, e.g. the odd cards 1-15 on
    P6e), at device 0 (card 0 device 1 when the layout includes card 0). Without a recorded
    layout: every EFA-capable card (the last ``efa_interfaces`` cards)."""

    def nic(card: int, device: int, interface_type: str) -> aws.ec2.LaunchTemplateNetworkInterfaceArgs:
        # subnet_id None is left unset by the Args class (the launch template's subnet applies).
        return aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            network_card_index=card, device_index=device, interface_type=interface_type,
            security_groups=security_group_ids, delete_on_termination="true", subnet_id=subnet_id,
        )

    nics = [nic(0, 0, "interface")]
    cards = instance.efa_cards or tuple(range(max(instance.network_cards - instance.efa_interfaces, 0), instance.network_cards))
    for card in cards:
        nics.append(nic(card, 1 if card == 0 else 0, "efa-only"))
    return nics


# Tags that change during a stack's life (extending a trial moves ``expires-at``): never in a
# launch template, whose ``tagSpecifications`` are part of its version.
CHANGING_TAG_KEYS: tuple[str, ...] = (naming.TAG_EXPIRES_AT,)


def launched_tag_specifications(ctx_tags: dict[str, Any], name: str) -> list[aws.ec2.LaunchTemplateTagSpecificationArgs]:
    """Tags for what a launch template launches (instances, volumes, interfaces): the stack's
    tags without ``CHANGING_TAG_KEYS``.

    A launch template's ``tagSpecifications`` are part of its version, and the instance and node
    groups follow the template's latest version: a changing ``expires-at`` there would make a
    new version on every extension of a trial, which recreates the EC2 instance
    (terraform-provider-aws forces a new ``aws_instance`` on a launch-template version change)
    and recycles every EKS node. The expiry is tagged on the instance and node group resources
    themselves (an in-place tag update); the sweeper gives nodes their node group's or
    cluster's expiry.
    """
    stable = {k: v for k, v in tags(ctx_tags, name).items() if k not in CHANGING_TAG_KEYS}
    return [aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=t, tags=stable) for t in LAUNCHED_RESOURCE_TYPES]


def secret_parameter_name(project: str, stack: str, what: str) -> str:
    """SSM parameter name of a boot-time secret (or of the expiry): ``/<project>/<stack>/<what>``."""
    return f"/{project}/{stack}/{what}"


def stack_expires(spec: DeploymentSpec) -> bool:
    """Whether ``spec``'s stack expires: an explicit ``expiresAt``, or a trial (``trialTtlHours``
    after its first `pulumi up`; ``program._expiry``)."""
    return spec.expires_at is not None or spec.environment == "trial"


def render_ec2_user_data(
    spec: DeploymentSpec, vllm: VllmCommand, sizing: Sizing, *, bucket: str, tools_sha256: str, hub_token_set: bool,
    region: str | None = None, expires: bool = False,
) -> str:
    """The ``#cloud-config`` text of the GPU instance for mirror ``bucket``, without the size check:
    the one rendering used by ``Ec2GpuServer._user_data`` (``pulumi up``) and by
    ``check_ec2_user_data`` (config time). ``region`` defaults to ``spec.region``; the weights
    unit's attempt timeout is the sum of the sync steps' budgets (``sizing.sync_budget_seconds``);
    ``expires``: the instance powers itself off at the expiry it reads from its SSM parameter
    (``expiry_parameter_name``); the watchdog restarts a hung engine once
    ``sizing.startup_budget_seconds`` have passed (``userdata.watch_units``)."""
    from components.core.vllm import API_GUARD_SOURCE

    from .storage import API_GUARD_KEY, WEIGHT_SYNC_KEY, tool_sha256
    from .userdata import ApiGuardBoot, cloud_config_text

    server = vllm.role("server")
    steps = sync_steps(spec, bucket)
    engine_cache = _engine_cache_boot(spec, vllm, bucket) if spec.config.storage.mirror.enabled and bucket else None
    cfg = Ec2BootConfig(
        region=region or spec.region or "",
        image=vllm.image,
        vllm_argv=server.argv,
        vllm_env=server.env,
        port=vllm.port,
        sync_steps=steps,
        tools_uri=f"s3://{bucket}/{WEIGHT_SYNC_KEY}",
        tools_sha256=tools_sha256,
        api_key_parameter=secret_parameter_name(spec.project, spec.stack, "vllm-api-key"),
        hub_token_parameter=secret_parameter_name(spec.project, spec.stack, "hub-token") if hub_token_set else None,
        hub_token_env=HUB_TOKEN_ENV[spec.model_source],
        nvme_devices=spec.instance.nvme_devices,
        efa=spec.efa_enabled,
        weights_timeout_seconds=sum(sync_budget_seconds(spec, sizing, step) for step in steps),
        engine_cache=engine_cache,
        api_guard=ApiGuardBoot(uri=f"s3://{bucket}/{API_GUARD_KEY}", sha256=tool_sha256(API_GUARD_SOURCE)),
        weights_attempts=spec.config.compute.weights_retry.attempts,
        weights_retry_seconds=spec.config.compute.weights_retry.delay_seconds,
        expiry_parameter=secret_parameter_name(spec.project, spec.stack, "expires-at") if expires else None,
        startup_budget_seconds=sizing.startup_budget_seconds,
    )
    return cloud_config_text(cfg)


def _engine_cache_boot(spec: DeploymentSpec, vllm: VllmCommand, bucket: str) -> EngineCacheBoot:
    """The engine-cache restore/save of this node: the archive beside the weights in the mirror,
    keyed by ``engine_cache.engine_cache_key`` (engine build, revision, layout, serve argv/env, GPU)."""
    from components.core import engine_cache as ec

    from .storage import ENGINE_CACHE_KEY, ENGINE_CACHE_SOURCE, tool_sha256

    key = ec.engine_cache_key(spec, vllm)
    restore, save = ec.cache_steps(spec, bucket, key, f"http://127.0.0.1:{vllm.port}/health")
    relative = PurePosixPath(ec.cache_dir(key)).relative_to(WEIGHTS_MOUNT_PATH)
    return EngineCacheBoot(
        tools_uri=f"s3://{bucket}/{ENGINE_CACHE_KEY}",
        tools_sha256=tool_sha256(ENGINE_CACHE_SOURCE),
        restore_argv=restore.argv,
        save_argv=save.argv,
        host_dir=f"{NVME_RAID0_HOST_PATH}/{relative}",
        env=ec.vllm_cache_env(),
    )


# The longest S3 bucket name (S3 naming rules: 3-63 characters): the mirror's name is known only
# after `pulumi up`, so the config-time size check assumes the longest one.
_LONGEST_BUCKET_NAME = "b" * 63


def check_ec2_user_data(spec: DeploymentSpec, vllm: VllmCommand, sizing: Sizing, *, hub_token_set: bool) -> int:
    """Render the ``aws-ec2`` user data as ``pulumi up`` will (longest possible bucket name) and
    check EC2's limit before any resource is declared.

    Returns:
        The worst-case raw size in bytes.

    Raises:
        ConfigError: over ``USER_DATA_LIMIT_BYTES`` (16 KB raw, before base64; "User data is
            limited to 16 KB, in raw form, before it is base64-encoded", EC2 User Guide, "Run
            commands when you launch an EC2 instance with user data input"). Names
            the longest config value the user data carries (``_largest_user_data_input``).
    """
    from components.core.errors import ConfigError

    text = render_ec2_user_data(
        spec, vllm, sizing, bucket=_LONGEST_BUCKET_NAME, tools_sha256="0" * 64, hub_token_set=hub_token_set,
        expires=stack_expires(spec),
    )
    total = len(user_data_bytes(text))  # gzip when the text is over the limit (cloud-init reads both)
    if total <= USER_DATA_LIMIT_BYTES:
        return total
    key, value = _largest_user_data_input(spec, text)
    raise ConfigError(
        key,
        value,
        f"makes the EC2 user data {total:,} bytes gzip-compressed, over EC2's limit of {USER_DATA_LIMIT_BYTES:,} bytes (16 KB "
        "raw, before base64); "
        "shorten it or use aws-eks",
    )


def _largest_user_data_input(spec: DeploymentSpec, text: str = "") -> tuple[str, Any]:
    """The config key (and value) that takes the most of the user data ``text``: its length times
    the times it appears there (a ``storage.mirror.prefix`` is in every mirror path), among
    ``vllm.extraArgs``, ``vllm.image``, ``model.servedModelName`` and ``storage.mirror.prefix``;
    ``vllm`` when none is set."""
    cfg = spec.config

    def share(value: str) -> int:
        return len(value) * max(1, text.count(value)) if value else 0

    candidates = [
        ("vllm.extraArgs", list(cfg.vllm.extra_args), sum(share(a) for a in cfg.vllm.extra_args)),
        ("vllm.image", cfg.vllm.image, share(cfg.vllm.image or "")),
        ("model.servedModelName", cfg.model.served_model_name, share(cfg.model.served_model_name or "")),
        ("storage.mirror.prefix", cfg.storage.mirror.prefix, share(cfg.storage.mirror.prefix or "")),
    ]
    key, value, size = max(candidates, key=lambda c: c[2])
    return (key, value) if size else ("vllm", "(the serving command)")


@dataclass
class Ec2GpuServerArgs:
    """Inputs of ``Ec2GpuServer``.

    Attributes:
        spec, sizing, vllm: the deployment spec, its sizing and the serving command.
        tags: the stack's tags.
        region, partition: where it runs.
        subnet_id: a private subnet in the GPU AZ.
        security_group_ids: the GPU group (and the EFA group when EFA is on).
        mirror_bucket: the mirror bucket's name.
        tools_object_key, tools_sha256: the weight-sync program in the mirror and its digest.
        api_key, hub_token: secret Outputs (stored as SSM SecureString parameters).
        expires_at: the stack's expiry (RFC 3339, an Output when fixed at the first `pulumi up`),
            or None when it does not expire; with one, a schedule stops the instance then and its
            own timer powers it off (``expiry.py``).
        now: the run's clock (a `pulumi up` past the expiry is refused).
    """

    spec: DeploymentSpec
    sizing: Sizing
    vllm: VllmCommand
    tags: dict[str, Any]
    region: str
    partition: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    security_group_ids: list[pulumi.Input[str]]
    mirror_bucket: pulumi.Input[str]
    tools_object_key: str
    tools_sha256: str
    api_key: pulumi.Input[str]
    hub_token: pulumi.Input[str] | None
    expires_at: pulumi.Input[str] | None = None
    now: datetime | None = None


class Ec2GpuServer(pulumi.ComponentResource):
    """One GPU instance serving vLLM under systemd.

    Attributes:
        instance_id, private_ip: the instance.
        launch_template_id: its launch template.
        role_name: the instance role (Session Manager, mirror, boot secrets).
        api_key_parameter, hub_token_parameter: SSM parameter names (plain strings; None when unset).
    """

    instance_id: pulumi.Output[str]
    private_ip: pulumi.Output[str]

    def __init__(self, name: str, args: Ec2GpuServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("kimi-deploy:aws:Ec2GpuServer", name, None, opts)
        spec = args.spec
        self._args = args
        self.api_key_parameter = secret_parameter_name(spec.project, spec.stack, "vllm-api-key")
        self.hub_token_parameter = (
            secret_parameter_name(spec.project, spec.stack, "hub-token") if args.hub_token is not None else None
        )
        params = self._create_secret_parameters(name)
        profile = self._create_instance_profile(name, params)
        ami = self._ami_id()
        template = self._create_launch_template(name, ami, profile)
        instance = aws.ec2.Instance(
            f"{name}-instance",
            launch_template=aws.ec2.InstanceLaunchTemplateArgs(id=template.id, version=template.latest_version.apply(str)),
            subnet_id=None if spec.efa_enabled else args.subnet_id,
            tags=tags(args.tags, f"{spec.stack}-gpu"),
            # A capacity block or ODCR holds exactly the instances paid for: the old instance
            # must go before its replacement can launch.
            opts=child(self, delete_before_replace=True, depends_on=params),
        )
        self.expiry_schedule = None
        if args.expires_at is not None:
            self.expiry_schedule = declare_expiry_stop(
                self, name, ctx_tags=args.tags, partition=args.partition, expires_at=args.expires_at,
                expiry_key=expiry_key(spec), now=args.now or datetime.now(UTC), target=STOP_INSTANCES_TARGET,
                action=STOP_INSTANCES_ACTION, resource_arn=instance.arn, request=instance.id.apply(stop_instance_input),
                what=f"stop the GPU instance of {spec.stack}",
            )
        self.instance_id = instance.id
        self.private_ip = instance.private_ip
        self.availability_zone = instance.availability_zone
        self.launch_template_id = template.id
        self.register_outputs(
            {
                "instanceId": instance.id,
                "privateIp": instance.private_ip,
                "launchTemplateId": template.id,
                "roleName": self.role_name,
            }
        )

    def _create_secret_parameters(self, name: str) -> list[aws.ssm.Parameter]:
        """The boot secrets (SecureString) and, on a stack that expires, its expiry (String,
        updated in place when a trial is extended): the parameters the instance may read."""
        a = self._args
        out = [
            aws.ssm.Parameter(
                f"{name}-api-key",
                name=self.api_key_parameter,
                type="SecureString",
                value=a.api_key,
                description="vLLM API key (read by the instance at boot)",
                tags=tags(a.tags),
                opts=child(self),
            )
        ]
        if self.hub_token_parameter is not None:
            out.append(
                aws.ssm.Parameter(
                    f"{name}-hub-token",
                    name=self.hub_token_parameter,
                    type="SecureString",
                    value=a.hub_token,
                    description="Model hub token (read by the weight sync at boot)",
                    tags=tags(a.tags),
                    opts=child(self),
                )
            )
        if a.expires_at is not None:
            out.append(
                aws.ssm.Parameter(
                    f"{name}-expires-at",
                    name=secret_parameter_name(a.spec.project, a.spec.stack, "expires-at"),
                    type="String",
                    insecure_value=a.expires_at,  # not a secret: shown in the plan and the state as it is
                    description="The stack's expiry (RFC 3339, UTC): the instance powers itself off then (kimi-watch)",
                    tags=tags(a.tags),
                    opts=child(self),
                )
            )
        return out

    def _create_instance_profile(self, name: str, params: list[aws.ssm.Parameter]) -> aws.iam.InstanceProfile:
        a = self._args
        spec = a.spec
        prefix = spec.config.storage.mirror.prefix
        # The instance publishes the mirror when it is incomplete, then copies from it.
        # Write only under this stack's revision prefix (iam.py module docstring).
        revision_prefix = mirror_key_prefix(spec)
        mirror_doc = pulumi.Output.all(a.partition, a.mirror_bucket).apply(
            lambda v: iam.mirror_policy(
                v[0], v[1], prefix, write=True, extra_read_prefixes=[TOOLS_PREFIX], write_prefix=revision_prefix
            )
        )
        ssm_doc = pulumi.Output.all(*[p.arn for p in params]).apply(lambda arns: iam.ssm_parameters_policy(list(arns)))
        role = iam.role(
            f"{name}-role",
            parent=self,
            ctx_tags=a.tags,
            service="ec2.amazonaws.com",
            partition=a.partition,
            managed=iam.EC2_INSTANCE_MANAGED_POLICIES,
            inline={"weight-mirror": mirror_doc, "boot-secrets": ssm_doc, "session-manager": iam.session_manager_policy()},
            description=f"kimi-deploy {spec.stack}: GPU instance (Session Manager, weight mirror {prefix}/, boot secrets)",
        )
        self.role_name = role.name
        return aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=tags(a.tags), opts=child(self))

    def _ami_id(self) -> pulumi.Input[str]:
        spec = self._args.spec
        if spec.config.compute.ami_id:
            return spec.config.compute.ami_id
        return aws.ssm.get_parameter_output(name=dlami_parameter(spec.instance.cpu_architecture)).value

    def _user_data(self) -> pulumi.Output[str]:
        a = self._args
        hub_token_set = self.hub_token_parameter is not None

        def render(bucket: str) -> str:
            text = render_ec2_user_data(
                a.spec, a.vllm, a.sizing, bucket=bucket, tools_sha256=a.tools_sha256, hub_token_set=hub_token_set,
                region=a.region, expires=a.expires_at is not None,
            )
            # check_ec2_user_data refused an oversized rendering at config time; this is the last fence.
            data = user_data_bytes(text)
            if len(data) > USER_DATA_LIMIT_BYTES:
                raise ValueError(f"EC2 user data is {len(data)} bytes (gzip); the limit is {USER_DATA_LIMIT_BYTES}")
            return base64.b64encode(data).decode()

        return pulumi.Output.from_input(a.mirror_bucket).apply(render)

    def _create_launch_template(
        self, name: str, ami: pulumi.Input[str], profile: aws.iam.InstanceProfile
    ) -> aws.ec2.LaunchTemplate:
        a = self._args
        spec = a.spec
        network: dict[str, Any]
        if spec.efa_enabled:
            network = {"network_interfaces": efa_network_interfaces(spec.instance, a.security_group_ids, a.subnet_id)}
        else:
            network = {"vpc_security_group_ids": a.security_group_ids}
        return aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"kimi-deploy {spec.stack}: {spec.instance.instance_type} serving {spec.model.display_name}",
            image_id=ami,
            instance_type=spec.instance.instance_type,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            metadata_options=metadata_options(hop_limit=1),
            block_device_mappings=root_volume(spec.config.compute.root_volume_gib),
            ebs_optimized="true",
            monitoring=aws.ec2.LaunchTemplateMonitoringArgs(enabled=True),
            user_data=self._user_data(),
            update_default_version=True,
            tag_specifications=launched_tag_specifications(a.tags, f"{spec.stack}-gpu"),
            tags=tags(a.tags, f"{spec.stack}-gpu"),
            # The SSM-resolved DLAMI changes with every release: keep the one the template was
            # created with. An explicit compute.amiId is followed.
            opts=child(self, ignore_changes=[] if spec.config.compute.ami_id else list(DLAMI_PINNED_IGNORE_CHANGES)),
            **network,
            **capacity_options(spec),
        )


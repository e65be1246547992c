"""The typed deployment spec: parsed and validated from a stack's ``kimi-deploy:*`` config.

``parse_spec`` turns the plain config mapping (as in ``stacks/Pulumi.<stack>.yaml``) into a
frozen ``DeploymentSpec``, or raises ``ConfigError`` with one line naming the key, the value and
what is allowed. Nothing is declared before the whole spec is valid. No Pulumi import here:
``__main__.py`` reads the config through Pulumi and hands it in; scripts read the stack file.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from . import fsx, naming
from .credentials import find_credential
from .model import MODELS, ModelProfile
from .targets import PLATFORMS, TARGETS, InstanceFacts, TargetProfile
from .versions import VLLM_PORT

NAMESPACE = "kimi-deploy"
REPO_ROOT = Path(__file__).resolve().parents[2]
STACKS_DIR = REPO_ROOT / "stacks"

# Config keys that hold secrets. They never enter the spec: only whether they are set.
SECRET_KEYS: tuple[str, ...] = ("hfToken", "modelscopeToken", "apiKey", "kubeconfig")

ENVIRONMENTS: tuple[str, ...] = ("trial", "staging", "prod")
DEFAULT_TRIAL_TTL_HOURS = 72
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_RESERVATION_RE = re.compile(r"^cr-[0-9a-f]{8,17}$")
# AWS region names: us-east-1, ap-southeast-2, us-gov-west-1, cn-north-1, eusc-de-east-1.
_REGION_RE = re.compile(r"^[a-z]{2,4}(-[a-z]+)+-\d{1,2}$")
# An IAM role or user (EKS access entry principal): arn:<partition>:iam::<account>:role|user/[path/]name.
_IAM_PRINCIPAL_ARN_RE = re.compile(r"^arn:aws(-cn|-us-gov)?:iam::\d{12}:(role|user)/([\w+=,.@-]+/)*[\w+=,.@-]{1,128}$")
# An AZ (us-east-1a) or a Local Zone (us-east-1-dfw-2a: the parent region, the zone group, a letter).
_AZ_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d([a-z]|-[a-z]+-\d[a-z])$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Kubernetes label values (also valid AWS tag values): the owner is both.
_LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Docker tag grammar; an image reference is name[:tag][@sha256:digest].
_IMAGE_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_IMAGE_RE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
# Trials are short by design; anything longer is a staging stack.
MAX_TRIAL_HOURS = 24 * 30
# Client CIDRs broader than this are "the internet" for practical purposes.
MIN_CLIENT_PREFIX_LENGTH = 8
# Private IPv4 ranges (RFC 1918), the VPC CIDR blocks the Amazon VPC user guide recommends.
_RFC1918 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


class ConfigError(ValueError):
    """A stack config value is invalid. ``str(err)`` is one line: key, value, what is allowed.

    Attributes:
        key: full config key, e.g. ``kimi-deploy:storage.fsx.throughputPerTib``.
        value: the value received (never a secret's value).
    """

    def __init__(self, key: str, value: Any, allowed: str):
        # Stack config keys get the namespace; command-line flags (--stack) and env vars stay as given.
        bare = key.startswith(NAMESPACE + ":") or ":" in key or key.startswith("-") or key.isupper()
        self.key = key if bare else f"{NAMESPACE}:{key}"
        self.value = value
        # Booleans as YAML writes them (true/false), not Python's True/False.
        shown = "(unset)" if value is None else ("true" if value else "false") if isinstance(value, bool) else repr(value)
        if len(shown) > MAX_SHOWN_VALUE_CHARS:  # a 20 KB extraArgs must not become a 20 KB error line
            shown = f"{shown[:MAX_SHOWN_VALUE_CHARS]}... ({len(shown):,} characters)"
        super().__init__(f"{self.key}: {shown} {allowed}")


# The longest value a config error echoes before cutting it (the message stays one readable line).
MAX_SHOWN_VALUE_CHARS = 120


# ---------------------------------------------------------------------------------------------
# Raw config: the shape of the YAML, camelCase as users write it. Unknown keys are rejected.
# ---------------------------------------------------------------------------------------------


class _Raw(BaseModel):
    # No coercion of numbers to strings: `revision: 1234` is an error, not "1234" (the engine hands
    # top-level values as strings already; config_reader decodes them by type).
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ModelConfig(_Raw):
    """``kimi-deploy:model``: which checkpoint, from where, at which revision."""

    profile: str = "kimi-k3.1-pro"
    source: Literal["huggingface", "modelscope"] = "huggingface"
    revision: str = "main"
    license_acknowledged: StrictBool | None = Field(None, alias="licenseAcknowledged")
    served_model_name: str | None = Field(None, alias="servedModelName")


class CapacityConfig(_Raw):
    """``kimi-deploy:compute.capacity``: where the GPU capacity comes from."""

    type: Literal["on-demand", "odcr", "capacity-block"] = "on-demand"
    reservation_id: str | None = Field(None, alias="reservationId")
    availability_zone: str | None = Field(None, alias="availabilityZone")
    ends_at: datetime | None = Field(None, alias="endsAt")
    usd_per_hour: float | None = Field(None, alias="usdPerHour", gt=0)
    # Instances (trays) in the capacity block as bought, for UltraServer blocks (default: the
    # smallest UltraServer of the type, targets.InstanceFacts.ultraserver_instances).
    block_instances: StrictInt | None = Field(None, alias="blockInstances", ge=1)


class ComputeConfig(_Raw):
    """``kimi-deploy:compute``: GPU nodes."""

    instance_type: str | None = Field(None, alias="instanceType")
    availability_zone: str | None = Field(None, alias="availabilityZone")
    replicas: StrictInt = Field(1, ge=1, le=64)
    efa: StrictBool | None = None
    capacity: CapacityConfig = CapacityConfig()
    root_volume_gib: StrictInt = Field(500, alias="rootVolumeGib", ge=100, le=16_384)
    ami_id: str | None = Field(None, alias="amiId")
    ami_architecture: Literal["x86_64", "arm64"] | None = Field(None, alias="amiArchitecture")
    usd_per_hour: float | None = Field(None, alias="usdPerHour", gt=0)


class NetworkConfig(_Raw):
    """``kimi-deploy:network``: VPC, subnets and who may reach the API port."""

    vpc_id: str | None = Field(None, alias="vpcId")
    private_subnet_ids: tuple[str, ...] = Field((), alias="privateSubnetIds")
    vpc_cidr: str = Field("10.42.0.0/16", alias="vpcCidr")
    allowed_cidrs: tuple[str, ...] = Field((), alias="allowedCidrs")
    allowed_security_group_ids: tuple[str, ...] = Field((), alias="allowedSecurityGroupIds")
    # An existing VPC may already route S3 through a gateway endpoint (a second one on the same
    # route tables fails); set false there.
    s3_gateway_endpoint: bool = Field(True, alias="s3GatewayEndpoint")
    # EKS API server (as EKS and eksctl default): private endpoint always, plus the public one
    # (IAM-authenticated), from these CIDRs only when set (none = any address). apiServerPrivateOnly
    # turns the public endpoint off (then `pulumi up` must run from inside the VPC).
    api_server_public_cidrs: tuple[str, ...] = Field((), alias="apiServerPublicCidrs")
    api_server_private_only: StrictBool = Field(False, alias="apiServerPrivateOnly")


class MirrorConfig(_Raw):
    """``kimi-deploy:storage.mirror``: the in-region S3 mirror of the checkpoint."""

    enabled: bool = True
    bucket_name: str | None = Field(None, alias="bucketName")
    create: bool = True
    prefix: str = "models"
    endpoint_url: str | None = Field(None, alias="endpointUrl")


class FsxConfig(_Raw):
    """``kimi-deploy:storage.fsx``: FSx for Lustre settings (used when storage.kind needs FSx)."""

    deployment_type: str = Field("PERSISTENT_2", alias="deploymentType")
    throughput_per_tib: StrictInt = Field(1000, alias="throughputPerTib")
    capacity_gib: StrictInt | None = Field(None, alias="capacityGib")
    headroom_fraction: float = Field(0.10, alias="headroomFraction", ge=0, le=2)
    efa: bool = False
    metadata_iops: StrictInt | None = Field(None, alias="metadataIops")


class StorageConfig(_Raw):
    """``kimi-deploy:storage``: where the weights live while being served."""

    kind: Literal["nvme", "fsx", "nvme-from-fsx", "pvc"] = "nvme"
    read_gbps: float | None = Field(None, alias="readGBps", gt=0)
    existing_claim: str | None = Field(None, alias="existingClaim")
    mirror: MirrorConfig = MirrorConfig()
    fsx: FsxConfig = FsxConfig()


class VllmConfig(_Raw):
    """``kimi-deploy:vllm``: serving options layered on the recipe."""

    image_tag: str | None = Field(None, alias="imageTag")
    image: str | None = None
    port: StrictInt = Field(VLLM_PORT, ge=1024, le=65535)
    decode_context_parallel_size: StrictInt = Field(1, alias="decodeContextParallelSize", ge=1)
    max_model_len: int | None = Field(None, alias="maxModelLen", ge=1024)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"] | None = Field(
        None, alias="kvCacheDtype"
    )
    gpu_memory_utilization: float = Field(0.95, alias="gpuMemoryUtilization", gt=0.5, le=0.99)
    enable_prefix_caching: bool = Field(True, alias="enablePrefixCaching")
    extra_args: tuple[str, ...] = Field((), alias="extraArgs")


class KubernetesConfig(_Raw):
    """``kimi-deploy:kubernetes``: the workload side (EKS or an existing cluster)."""

    namespace: str = "kimi"
    installed_addons: tuple[str, ...] = Field((), alias="installedAddons")
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: tuple[dict[str, Any], ...] = ()
    service_type: Literal["ClusterIP", "internal-nlb"] = Field("ClusterIP", alias="serviceType")
    allowed_namespaces: tuple[str, ...] = Field((), alias="allowedNamespaces")
    allowed_cidrs: tuple[str, ...] = Field((), alias="allowedCidrs")
    nvme_host_path: str = Field("/mnt/k8s-disks/0", alias="nvmeHostPath")
    context: str | None = None
    # aws-eks: IAM roles/users granted cluster admin (EKS access entries), besides the creator.
    admin_role_arns: tuple[str, ...] = Field((), alias="adminRoleArns")
    # aws-eks: the EKS (Kubernetes minor) version, default versions.EKS_VERSION, and the
    # cluster's upgrade policy: STANDARD (auto-upgraded at the end of standard support) or
    # EXTENDED (stays, billed at the extended-support rate once past it). See _check_eks_version.
    eks_version: str | None = Field(None, alias="eksVersion")
    eks_support_type: Literal["STANDARD", "EXTENDED"] = Field("STANDARD", alias="eksSupportType")


class ScheduleWindowConfig(_Raw):
    """``kimi-deploy:autoscaling.schedule[i]``: a serving window as two cron expressions (KEDA's
    cron scaler: ``start``/``end`` in ``timezone``). Outside every window the stack may scale to
    zero (``autoscaling.minReplicas: 0``)."""

    start: str
    end: str
    timezone: str = "UTC"


class AutoscalingConfig(_Raw):
    """``kimi-deploy:autoscaling``: replicas that follow vLLM's queue and KV-cache usage."""

    enabled: StrictBool = False
    min_replicas: StrictInt = Field(1, alias="minReplicas", ge=0, le=64)
    max_replicas: StrictInt | None = Field(None, alias="maxReplicas", ge=1, le=64)
    # keda: a ScaledObject (KEDA installed here unless listed in installedAddons);
    # hpa: an autoscaling/v2 HPA on external metrics served by an installed prometheus-adapter.
    controller: Literal["keda", "hpa"] = "keda"
    schedule: tuple[ScheduleWindowConfig, ...] = ()
    queue_per_replica: float = Field(4.0, alias="queuePerReplica", gt=0, le=10_000)
    kv_cache_usage_target: float = Field(0.8, alias="kvCacheUsageTarget", gt=0, le=1)
    scale_down_delay_seconds: StrictInt | None = Field(None, alias="scaleDownDelaySeconds", ge=60, le=86_400)


class ObservabilityConfig(_Raw):
    """``kimi-deploy:observability``: where Prometheus and Grafana run, dashboards and alerts."""

    prometheus_namespace: str | None = Field(None, alias="prometheusNamespace")
    prometheus_url: str | None = Field(None, alias="prometheusUrl")
    grafana_namespace: str | None = Field(None, alias="grafanaNamespace")
    alerts: StrictBool = True
    gpu_exporter: StrictBool = Field(True, alias="gpuExporter")
    # Labels of the Prometheus pods the NetworkPolicy admits to the metrics port (the Prometheus
    # Operator labels its pods app.kubernetes.io/name=prometheus).
    prometheus_pod_labels: dict[str, str] = Field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}, alias="prometheusPodLabels"
    )
    # Labels the Prometheus selects PodMonitors, ServiceMonitors and PrometheusRules by
    # (kube-prometheus-stack by default: release=<its Helm release name>).
    monitor_labels: dict[str, str] = Field(default_factory=dict, alias="monitorLabels")
    queue_alert_minutes: StrictInt = Field(10, alias="queueAlertMinutes", ge=1, le=1440)
    kv_cache_alert_fraction: float = Field(0.95, alias="kvCacheAlertFraction", gt=0, le=1)


class TimeToReadyConfig(_Raw):
    """``kimi-deploy:timeToReady``: measured figures that replace the estimates of
    ``spec/time_to_ready.py`` (each optional; seconds or GB/s, all > 0)."""

    infrastructure_seconds: float | None = Field(None, alias="infrastructureSeconds", gt=0)
    instance_boot_seconds: float | None = Field(None, alias="instanceBootSeconds", gt=0)
    image_pull_seconds: float | None = Field(None, alias="imagePullSeconds", gt=0)
    copy_gbps: float | None = Field(None, alias="copyGBps", gt=0)
    engine_init_seconds: float | None = Field(None, alias="engineInitSeconds", gt=0)
    engine_init_cached_seconds: float | None = Field(None, alias="engineInitCachedSeconds", gt=0)


class RawConfig(_Raw):
    """The whole ``kimi-deploy:*`` namespace of a stack (secrets excluded)."""

    target: str
    platform: str
    environment: str
    owner: str
    region: str | None = None
    expires_at: datetime | None = Field(None, alias="expiresAt")
    trial_ttl_hours: StrictInt = Field(DEFAULT_TRIAL_TTL_HOURS, alias="trialTtlHours", ge=1, le=24 * 30)
    protect: bool | None = None
    model: ModelConfig = ModelConfig()
    compute: ComputeConfig = ComputeConfig()
    network: NetworkConfig = NetworkConfig()
    storage: StorageConfig = StorageConfig()
    vllm: VllmConfig = VllmConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    autoscaling: AutoscalingConfig = AutoscalingConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    time_to_ready: TimeToReadyConfig = Field(TimeToReadyConfig(), alias="timeToReady")


# ---------------------------------------------------------------------------------------------
# The validated spec
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeploymentSpec:
    """Everything that is deployed, validated: the single input of sizing, the vLLM command,
    the Pulumi components and the scripts.

    Attributes:
        project, stack: Pulumi project and stack names.
        target: the target profile (``TARGETS``).
        platform: ``aws-ec2``, ``aws-eks`` or ``kubernetes``.
        environment: ``trial``, ``staging`` or ``prod``.
        owner: team or person tagged as owner.
        region: AWS region (None for the kubernetes platform).
        expires_at: explicit expiry (UTC) or None. A trial without one expires
            ``trial_ttl_hours`` after its first ``pulumi up`` (fixed at creation).
        trial_ttl_hours: default time to live of a trial, hours.
        protect: resources holding data (mirror, file system) are protected from deletion.
        model: the model profile; ``revision``/``model_source`` say which commit from where.
        instance: instance facts of one node.
        config: the raw, validated config (for settings that need no derivation).
        secrets_set: names of the secret keys that have a value in the stack's config.
        warnings: things the plan must show (for example a trial following a branch).
        blockers: ``ConfigError``s that stop `pulumi up` but let the offline plan render (an
            engine build known not to serve the model, ``engine.engine_blocker``).
    """

    project: str
    stack: str
    target: TargetProfile
    platform: str
    environment: str
    owner: str
    region: str | None
    expires_at: datetime | None
    trial_ttl_hours: int
    protect: bool
    model: ModelProfile
    revision: str
    model_source: str
    instance: InstanceFacts
    config: RawConfig
    secrets_set: frozenset[str]
    warnings: tuple[str, ...]
    # Config errors that stop `pulumi up` but not the offline plan (an engine known not to serve the
    # model): ``program.build_context`` raises the first; the plan lists them at its top.
    blockers: tuple[Exception, ...] = ()

    @property
    def revision_is_commit(self) -> bool:
        """Whether the model revision is pinned to a 40-hex commit."""
        return bool(_COMMIT_RE.match(self.revision))

    @property
    def is_aws(self) -> bool:
        """Whether AWS resources are declared (``aws-ec2`` or ``aws-eks``)."""
        return self.platform.startswith("aws-")

    @property
    def uses_kubernetes(self) -> bool:
        """Whether the workloads run on Kubernetes (``aws-eks`` or ``kubernetes``)."""
        return self.platform in ("aws-eks", "kubernetes")

    @property
    def nodes_per_copy(self) -> int:
        """Nodes in one model copy (tensor-parallel group)."""
        return self.target.nodes_per_copy

    @property
    def replicas(self) -> int:
        """Model copies (independent vLLM servers or LeaderWorkerSet groups)."""
        return self.config.compute.replicas

    @property
    def gpu_nodes(self) -> int:
        """GPU nodes in all: replicas x nodes per copy."""
        return self.replicas * self.nodes_per_copy

    @property
    def availability_zone(self) -> str | None:
        """The AZ GPU nodes are pinned to (capacity reservation's AZ wins), or None."""
        return self.config.compute.capacity.availability_zone or self.config.compute.availability_zone

    @property
    def efa_enabled(self) -> bool:
        """EFA on GPU nodes and in the vLLM pods: only when ``compute.efa`` is true.

        Off by default: the stock vLLM image has neither libfabric's EFA provider nor
        aws-ofi-nccl, so NCCL could not use the devices (it would fall back to sockets);
        GB300 TP8 runs over multi-node NVLink inside one NVL72 domain (ComputeDomain) anyway.
        """
        return bool(self.config.compute.efa)

    @property
    def served_model_name(self) -> str:
        """The name clients send as ``model``."""
        return self.config.model.served_model_name or self.model.name

    @property
    def hub_repo(self) -> str:
        """Repository id at the configured hub."""
        return self.model.hf_repo if self.model_source == "huggingface" else self.model.modelscope_repo

    @property
    def hub_uri(self) -> str:
        """Source URI of the weight sync: ``hf://ORG/REPO@REV`` or ``modelscope://ORG/REPO@REV``."""
        scheme = "hf" if self.model_source == "huggingface" else "modelscope"
        return f"{scheme}://{self.hub_repo}@{self.revision}"

    @property
    def hub_token_key(self) -> str:
        """Config key of the hub token secret for the configured source."""
        return "hfToken" if self.model_source == "huggingface" else "modelscopeToken"

    @property
    def tags(self) -> dict[str, str]:
        """Tags every taggable resource carries (``expires-at`` is added where it is known)."""
        tags = {
            naming.TAG_STACK: self.stack,
            naming.TAG_ENVIRONMENT: self.environment,
            naming.TAG_TARGET: self.target.name,
            naming.TAG_OWNER: self.owner,
            naming.TAG_PROJECT: self.project,
        }
        if self.expires_at is not None:
            tags[naming.TAG_EXPIRES_AT] = format_utc(self.expires_at)
        return tags


def format_utc(moment: datetime) -> str:
    """``moment`` as an RFC 3339 UTC string with seconds, e.g. ``2026-12-01T00:00:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str, key: str) -> datetime:
    """An ISO 8601 / RFC 3339 time (``Z`` allowed; no zone means UTC) as an aware UTC datetime.

    Args:
        text: the time as given.
        key: the flag, env var or config key it came from (named in the error).

    Raises:
        ConfigError: not a time.
    """
    try:
        moment = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(key, text, "is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _pydantic_error(err: ValidationError, raw: Mapping[str, Any]) -> ConfigError:
    """The first pydantic error as a one-line ConfigError naming the full key."""
    first = err.errors()[0]
    loc = tuple(first["loc"])
    key = _fmt_loc(loc)
    value: Any = raw
    for part in loc:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and isinstance(part, int) and part < len(value):
            value = value[part]
        else:
            value = first.get("input")
            break
    kind = first["type"]
    if kind == "extra_forbidden":
        from .config_reader import did_you_mean

        siblings = _model_keys_at(loc[:-1])
        hint = did_you_mean(str(loc[-1]), siblings) or (f" (keys: {', '.join(siblings)})" if siblings else "")
        return ConfigError(key, value, "is not a known key" + hint)
    if kind in ("model_type", "dict_type"):
        keys = _model_keys_at(loc)
        return ConfigError(key, value, "is not a map" + (f" (keys: {', '.join(keys)})" if keys else " (write its keys under it)"))
    if kind == "string_type" and isinstance(value, (int, float)):
        what = "a boolean" if isinstance(value, bool) else "a number"
        return ConfigError(key, value, f"is {what}, not a string: quote it in the stack file ('{value}')")
    if kind == "missing":
        return ConfigError(key, None, "is required")
    if kind == "literal_error":
        expected = first.get("ctx", {}).get("expected", "")
        return ConfigError(key, value, f"is not allowed (allowed: {expected})")
    return ConfigError(key, value, f"is not valid: {first['msg'].lower()}")


def _model_keys_at(loc: tuple[Any, ...]) -> list[str]:
    """Config keys (aliases) of the model at pydantic location ``loc`` in ``RawConfig``, sorted."""
    model: Any = RawConfig
    for part in loc:
        info = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None) if isinstance(part, str) else None
        if info is None:
            if isinstance(part, int):
                continue
            return []
        candidates = [info.annotation, *getattr(info.annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return sorted(f.alias or n for n, f in model.model_fields.items() if n != "region" or model is not RawConfig)


def _check_choice(key: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ConfigError(key, value, f"is not allowed (allowed: {', '.join(allowed)})")


def _supported_targets(model: ModelProfile | None) -> list[str]:
    """Targets that can serve ``model``: no ``unsupported_reason`` and more GPU memory per copy
    than its weights (all targets without a reason when the model is unknown). A target
    rejected for memory is never listed as supported in the same message."""
    return [
        name
        for name, profile in TARGETS.items()
        if profile.unsupported_reason is None and (model is None or profile.gpu_memory_per_copy_bytes > model.weights_bytes)
    ]


def parse_spec(
    config: Mapping[str, Any],
    *,
    stack: str,
    project: str = NAMESPACE,
    now: datetime | None = None,
    secrets_set: frozenset[str] | set[str] = frozenset(),
) -> DeploymentSpec:
    """Validate a stack's config and build the deployment spec.

    Args:
        config: the ``kimi-deploy`` namespace without its prefix, e.g. ``{"target": "b300",
            "model": {...}}``; ``aws:region`` may be passed as ``region``. Secret keys
            (``SECRET_KEYS``) are ignored here: pass their names in ``secrets_set``.
        stack: Pulumi stack name.
        project: Pulumi project name.
        now: the current time (UTC) for expiry checks; defaults to the clock.
        secrets_set: names of the secret keys that have a value.

    Returns:
        The frozen ``DeploymentSpec``.

    Raises:
        ConfigError: the first invalid value, as one line naming key, value and what is allowed.
    """
    now = now or datetime.now(UTC)
    plain = {k: v for k, v in config.items() if k not in SECRET_KEYS}
    try:
        raw = RawConfig.model_validate(plain)
    except ValidationError as err:
        raise _pydantic_error(err, plain) from None

    warnings: list[str] = []
    for path, text in _walk_strings(plain):
        shape = find_credential(text)  # values shaped like credentials belong in secret keys
        if shape is not None:
            secret_key = shape.secret_key or "apiKey"
            raise ConfigError(
                path,
                "[looks like a credential]",
                f"must not hold credentials in plain config: use `pulumi config set --secret kimi-deploy:{secret_key}`",
            )

    # Target, platform, environment -------------------------------------------------------
    supported_targets = _supported_targets(MODELS.get(raw.model.profile))
    if raw.target not in TARGETS:
        _check_choice("target", raw.target, supported_targets)
    _check_choice("platform", raw.platform, PLATFORMS)
    _check_choice("environment", raw.environment, ENVIRONMENTS)
    if not _LABEL_VALUE_RE.match(raw.owner):
        raise ConfigError(
            "owner",
            raw.owner,
            "must name the owning team or person: 1-63 letters, digits, '-', '_' or '.' (it becomes an AWS tag and a Kubernetes "
            "label)",
        )
    target = TARGETS[raw.target]
    model = MODELS.get(raw.model.profile)
    if model is None:
        raise ConfigError("model.profile", raw.model.profile, f"is not a known model (allowed: {', '.join(MODELS)})")

    needed = model.weights_bytes
    if target.gpu_memory_per_copy_bytes <= needed or target.unsupported_reason:
        total_gb = target.gpu_memory_per_copy_bytes / 1e9
        why = (
            f"cannot hold {model.display_name}: {target.gpus_per_copy}x {target.gpu.name} = "
            f"{total_gb:,.0f} GB of GPU memory"
        )
        if target.gpu_memory_per_copy_bytes <= needed:
            why += f" < {needed / 1e12:.2f} TB of weights"
        else:
            why += f" leaves no room for KV cache after {needed / 1e12:.2f} TB of weights"
        if target.unsupported_reason:
            why += f"; {target.unsupported_reason}"
        raise ConfigError("target", raw.target, f"{why} (supported: {', '.join(supported_targets)})")

    if raw.platform not in target.platforms:
        raise ConfigError(
            "platform",
            raw.platform,
            f"is not available for target {target.name} (allowed: {', '.join(target.platforms) or 'none'})",
        )
    instance_type = raw.compute.instance_type or target.platforms[raw.platform]
    from .targets import INSTANCES  # local: keep the module namespace small

    instance = INSTANCES.get(instance_type)
    if instance is None:
        raise ConfigError(
            "compute.instanceType", instance_type, f"has no profile (known: {', '.join(INSTANCES)})"
        )
    if instance.gpus != target.gpus_per_node:
        raise ConfigError(
            "compute.instanceType",
            instance_type,
            f"has {instance.gpus} GPUs but target {target.name} needs {target.gpus_per_node} per node",
        )

    is_aws = raw.platform.startswith("aws-")
    if raw.platform == "aws-ec2" and raw.compute.replicas != 1:
        raise ConfigError(
            "compute.replicas",
            raw.compute.replicas,
            "must be 1 on aws-ec2 (one instance serves one copy; use aws-eks for more copies)",
        )
    region = raw.region
    if region is not None and not _REGION_RE.match(region):
        # Checked on every platform and target, with or without offering facts (preflight asks AWS).
        raise ConfigError("aws:region", region, "is not an AWS region name (e.g. us-east-1)")
    if is_aws and not region:
        raise ConfigError("aws:region", None, "is required for AWS platforms (pulumi config set aws:region us-east-1)")
    if is_aws and instance.cloud != "aws":
        raise ConfigError("compute.instanceType", instance_type, "is not an AWS instance type")

    # Availability zones and capacity ------------------------------------------------------
    cap = raw.compute.capacity
    az = raw.compute.availability_zone
    if az is not None and not _AZ_RE.match(az):
        raise ConfigError("compute.availabilityZone", az, "is not an availability zone name (e.g. us-east-1a)")
    if is_aws and az and region and not az.startswith(region):
        raise ConfigError("compute.availabilityZone", az, f"is not in region {region}")
    if is_aws and instance.offered_azs:
        offered = instance.offered_azs.get(region or "", ())
        if not offered:
            regions = ", ".join(sorted(instance.offered_azs))
            raise ConfigError("aws:region", region, f"does not offer {instance_type} (offered in: {regions})")
        if az and az not in offered:
            raise ConfigError(
                "compute.availabilityZone", az, f"does not offer {instance_type} (allowed: {', '.join(offered)})"
            )
    if cap.availability_zone is not None and not _AZ_RE.match(cap.availability_zone):
        raise ConfigError(
            "compute.capacity.availabilityZone", cap.availability_zone, "is not an availability zone name (e.g. us-east-1a)"
        )
    if is_aws and cap.availability_zone and region and not cap.availability_zone.startswith(region):
        raise ConfigError("compute.capacity.availabilityZone", cap.availability_zone, f"is not in region {region}")
    if cap.type in ("odcr", "capacity-block"):
        if not is_aws:
            raise ConfigError("compute.capacity.type", cap.type, "needs an AWS platform (aws-ec2, aws-eks)")
        if not cap.reservation_id:
            raise ConfigError("compute.capacity.reservationId", None, f"is required for {cap.type} (format cr-0123456789abcdef0)")
        if not _RESERVATION_RE.match(cap.reservation_id):
            raise ConfigError(
                "compute.capacity.reservationId",
                cap.reservation_id,
                "is not a capacity reservation id (cr- and 8 to 17 hex digits)",
            )
        if not cap.availability_zone:
            raise ConfigError(
                "compute.capacity.availabilityZone",
                None,
                f"is required for {cap.type}: subnets are pinned to the reservation's AZ",
            )
        if az and az != cap.availability_zone:
            raise ConfigError(
                "compute.availabilityZone",
                az,
                f"differs from the capacity reservation's AZ {cap.availability_zone} (nodes must launch in the reservation's AZ)",
            )
        if instance.offered_azs and cap.availability_zone not in instance.offered_azs.get(region or "", ()):
            raise ConfigError(
                "compute.capacity.availabilityZone",
                cap.availability_zone,
                f"does not offer {instance_type} (allowed: {', '.join(instance.offered_azs.get(region or '', ()))})",
            )
    elif cap.reservation_id:
        raise ConfigError(
            "compute.capacity.reservationId",
            cap.reservation_id,
            "is set but compute.capacity.type is on-demand (set odcr or capacity-block)",
        )
    if is_aws and target.aws_capacity_types is not None and cap.type not in target.aws_capacity_types:
        raise ConfigError(
            "compute.capacity.type",
            cap.type,
            f"is not available for {target.name}: {target.aws_capacity_reason} (allowed: {', '.join(target.aws_capacity_types)})",
        )
    _check_ultraserver_block(raw, instance, target.nodes_per_copy * raw.compute.replicas, warnings)
    _check_local_zone(raw, warnings)
    if raw.compute.efa and instance.efa_interfaces == 0:
        raise ConfigError("compute.efa", True, f"is not supported by {instance_type} (it has no EFA interfaces)")
    if raw.compute.efa:
        from .versions import VLLM_IMAGES

        image_repo = (raw.vllm.image or "").split("@")[0].rpartition(":")[0] or (raw.vllm.image or "").split("@")[0]
        if not raw.vllm.image or image_repo in VLLM_IMAGES.values():
            raise ConfigError(
                "compute.efa", True,
                "needs vllm.image set to a build with libfabric's EFA provider and aws-ofi-nccl (the stock "
                f"{', '.join(VLLM_IMAGES.values())} images have neither, so NCCL would fall back to sockets)",
            )
    if is_aws and not instance.offered_azs and not (cap.availability_zone or az):
        raise ConfigError(
            "compute.availabilityZone",
            None,
            f"is required: there are no offering facts for {instance_type} (name an AZ that offers it; preflight checks it)",
        )
    if raw.compute.ami_id is not None:
        if not re.match(r"^ami-[0-9a-f]{8,17}$", raw.compute.ami_id):
            raise ConfigError("compute.amiId", raw.compute.ami_id, "is not an AMI id (ami-0123456789abcdef0)")
        if not raw.compute.ami_architecture:
            raise ConfigError(
                "compute.amiArchitecture",
                None,
                f"is required with compute.amiId (the AMI's architecture; {instance_type} needs {instance.cpu_architecture})",
            )
    if raw.compute.ami_architecture and raw.compute.ami_architecture != instance.cpu_architecture:
        raise ConfigError(
            "compute.amiArchitecture",
            raw.compute.ami_architecture,
            f"does not match {instance_type} ({instance.cpu_architecture})",
        )

    # Network --------------------------------------------------------------------------------
    import ipaddress

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
    if raw.platform == "aws-eks" and raw.network.api_server_private_only:
        warnings.append(
            "the EKS API endpoint is private: run `pulumi up` from inside the VPC (VPN, bastion, SSM port "
            "forwarding), or unset network.apiServerPrivateOnly and set network.apiServerPublicCidrs to your egress CIDR"
        )
    elif raw.platform == "aws-eks" and not raw.network.api_server_public_cidrs:
        warnings.append(
            "the EKS API endpoint is public (IAM-authenticated) from any address; restrict it with network.apiServerPublicCidrs"
        )
    if is_aws and not raw.network.allowed_cidrs and not raw.network.allowed_security_group_ids:
        warnings.append(
            "network.allowedCidrs and network.allowedSecurityGroupIds are empty: no client outside the "
            "deployment can reach the API port"
        )
    if raw.network.vpc_id and not raw.network.private_subnet_ids:
        raise ConfigError("network.privateSubnetIds", [], "is required with network.vpcId (the private subnets to use)")
    if raw.network.private_subnet_ids and not raw.network.vpc_id:
        raise ConfigError("network.privateSubnetIds", list(raw.network.private_subnet_ids), "needs network.vpcId")

    # Storage --------------------------------------------------------------------------------
    st = raw.storage
    if st.kind in ("fsx", "nvme-from-fsx") and not is_aws:
        raise ConfigError("storage.kind", st.kind, "needs an AWS platform (allowed on kubernetes: nvme, pvc)")
    if st.kind == "pvc":
        if not raw.platform == "kubernetes" and raw.platform != "aws-eks":
            raise ConfigError("storage.kind", st.kind, "needs a Kubernetes platform (aws-eks, kubernetes)")
        if not st.existing_claim:
            raise ConfigError("storage.existingClaim", None, "is required when storage.kind is pvc")
        from .limits import dns1123_subdomain_problem

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
    _check_choice("storage.fsx.deploymentType", fc.deployment_type, fsx.DEPLOYMENT_TYPES)
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
    if mirror.bucket_name is not None and not _BUCKET_RE.match(mirror.bucket_name):
        raise ConfigError(
            "storage.mirror.bucketName",
            mirror.bucket_name,
            "is not a valid S3 bucket name (3-63 lowercase letters, digits, dots, hyphens)",
        )
    if not mirror.create and mirror.enabled and not mirror.bucket_name:
        raise ConfigError(
            "storage.mirror.bucketName", None, "is required when storage.mirror.create is false (name the existing mirror)"
        )
    if raw.platform == "aws-ec2" and not mirror.enabled:
        raise ConfigError(
            "storage.mirror.enabled",
            False,
            "must be true on aws-ec2 (the instance boots from the mirror's _tools/ prefix and weights)",
        )
    if st.kind in ("fsx", "nvme-from-fsx") and not mirror.enabled:
        raise ConfigError(
            "storage.mirror.enabled", False, f"must be true for storage.kind {st.kind} (FSx imports the weights from the mirror)"
        )
    if not mirror.prefix or mirror.prefix.startswith("/") or ".." in mirror.prefix.split("/"):
        raise ConfigError("storage.mirror.prefix", mirror.prefix, "must be a relative S3 key prefix without '..'")

    # vLLM -----------------------------------------------------------------------------------
    tp = target.gpus_per_copy
    dcp = raw.vllm.decode_context_parallel_size
    if tp % dcp != 0:
        divisors = [str(d) for d in range(1, tp + 1) if tp % d == 0]
        raise ConfigError(
            "vllm.decodeContextParallelSize", dcp, f"must divide the tensor-parallel size {tp} (allowed: {', '.join(divisors)})"
        )
    recipe_dcp_env = model.recipes[target.image_family].dcp_env if target.image_family in model.recipes else {}
    if dcp > 1 and "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE" in recipe_dcp_env:
        # The DCP workspace is allocated by the attention backend, beside vLLM's memory pool: the
        # share of GPU memory gpuMemoryUtilization leaves out must hold it twice over.
        workspace = int(recipe_dcp_env["VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"])
        outside = (1 - raw.vllm.gpu_memory_utilization) * target.gpu.memory_bytes
        if outside < 2 * workspace:
            most = 1 - 2 * workspace / target.gpu.memory_bytes
            raise ConfigError(
                "vllm.gpuMemoryUtilization", raw.vllm.gpu_memory_utilization,
                f"leaves {outside / 1024**3:.1f} GiB per GPU outside vLLM's pool; DCP {dcp} needs room for a "
                f"{workspace / 1024**3:.0f} GiB FlashInfer workspace twice over (at most {most:.3f})",
            )
        warnings.append(
            f"DCP {dcp}: about {dcp * model.dcp_kv_efficiency:.1f}x the KV tokens of plain TP (long sessions, "
            f"bigger prefix cache) for decode steps about 7-25% slower, a {workspace / 1024**3:.0f} GiB "
            "FlashInfer workspace per GPU (default 394 MiB; vllm#50781) and the recipe's DCP backends "
            "(--dcp-comm-backend a2a, TOKENSPEED_MLA decode, TRTLLM_RAGGED prefill)"
        )
    if raw.vllm.max_model_len is not None and raw.vllm.max_model_len > model.max_context_tokens:
        raise ConfigError(
            "vllm.maxModelLen", raw.vllm.max_model_len, f"exceeds the model's context of {model.max_context_tokens:,} tokens"
        )
    if target.image_family == "rocm" and raw.vllm.kv_cache_dtype not in (None, "auto", "bfloat16"):
        # The ROCm recipe serves the KV cache in the model dtype; FP8 MLA KV is a CUDA path.
        raise ConfigError(
            "vllm.kvCacheDtype", raw.vllm.kv_cache_dtype, "is not part of the MI355X recipe (allowed: auto, bfloat16)"
        )
    reserved = {"--api-key", "--hf-token", "--tensor-parallel-size", "--port", "--host", "--served-model-name", "--model"}
    for arg in raw.vllm.extra_args:
        if arg.split("=", 1)[0] in reserved:
            raise ConfigError(
                "vllm.extraArgs",
                arg,
                f"sets a flag the toolkit owns ({', '.join(sorted(reserved))}); use the matching config key",
            )
    if raw.vllm.image_tag is not None and not _IMAGE_TAG_RE.match(raw.vllm.image_tag):
        raise ConfigError(
            "vllm.imageTag", raw.vllm.image_tag, "is not a valid image tag (letters, digits, '_', '.', '-'; at most 128)"
        )
    if raw.vllm.image is not None and not _IMAGE_RE.match(raw.vllm.image):
        raise ConfigError(
            "vllm.image", raw.vllm.image, "is not a valid image reference (registry/name:tag or name@sha256:digest)"
        )
    if raw.vllm.image and raw.vllm.image_tag:
        raise ConfigError("vllm.image", raw.vllm.image, "and vllm.imageTag are both set (set one)")

    # Kubernetes -----------------------------------------------------------------------------
    host_path = raw.kubernetes.nvme_host_path
    if not host_path.startswith("/") or host_path.rstrip("/") == "" or ".." in host_path.split("/"):
        raise ConfigError(
            "kubernetes.nvmeHostPath",
            host_path,
            "must be an absolute path below / without '..' (where the node's NVMe is mounted)",
        )
    from .limits import check_kubernetes_fields_and_limits

    check_kubernetes_fields_and_limits(raw, stack, project)
    for ns in raw.kubernetes.allowed_namespaces:
        if not _DNS_LABEL_RE.match(ns):
            raise ConfigError("kubernetes.allowedNamespaces", ns, "is not a valid namespace name (lowercase DNS label)")
    if not _DNS_LABEL_RE.match(raw.kubernetes.namespace):
        raise ConfigError("kubernetes.namespace", raw.kubernetes.namespace, "is not a valid namespace name (lowercase DNS label)")
    for arn in raw.kubernetes.admin_role_arns:
        if not _IAM_PRINCIPAL_ARN_RE.match(arn):
            raise ConfigError(
                "kubernetes.adminRoleArns",
                arn,
                "is not an IAM role or user ARN (arn:aws:iam::123456789012:role/NAME; not an sts assumed-role ARN)",
            )
    if len(set(raw.kubernetes.admin_role_arns)) != len(raw.kubernetes.admin_role_arns):
        raise ConfigError("kubernetes.adminRoleArns", list(raw.kubernetes.admin_role_arns), "names an ARN twice")
    if raw.kubernetes.admin_role_arns and raw.platform != "aws-eks":
        raise ConfigError(
            "kubernetes.adminRoleArns",
            list(raw.kubernetes.admin_role_arns),
            f"is only for aws-eks (EKS access entries), not {raw.platform}",
        )
    _check_eks_version(raw, now, warnings)
    from .versions import KNOWN_ADDONS

    for addon in raw.kubernetes.installed_addons:
        if addon not in KNOWN_ADDONS:
            raise ConfigError("kubernetes.installedAddons", addon, f"is not a known add-on (allowed: {', '.join(KNOWN_ADDONS)})")
    if raw.platform == "kubernetes" and "kubeconfig" not in secrets_set:
        warnings.append(
            "kimi-deploy:kubeconfig is not set: `pulumi up` will use the ambient kubeconfig; "
            "set it with `pulumi config set --secret kimi-deploy:kubeconfig < ~/.kube/config`"
        )
    _check_autoscaling_and_observability(raw, warnings)
    # Model revision, license ------------------------------------------------------------
    rev = raw.model.revision
    if not _REVISION_RE.match(rev):
        raise ConfigError("model.revision", rev, "is not a revision (a 40-hex commit, or in a trial a branch or tag name)")
    if re.fullmatch(r"[0-9a-fA-F]{40}", rev) and not _COMMIT_RE.match(rev):
        raise ConfigError("model.revision", rev, "is a commit in upper case: write it in lower case as the hub does")
    if not _COMMIT_RE.match(rev):
        if raw.environment != "trial":
            raise ConfigError(
                "model.revision",
                rev,
                f"must be a 40-hex commit in {raw.environment} (branches move; pin the commit the trial resolved)",
            )
        warnings.append(
            f"model.revision '{rev}' is a branch, not a commit: the weight sync resolves and records the "
            "commit; pin it before staging or prod"
        )
    if raw.model.license_acknowledged is not True:
        raise ConfigError(
            "model.licenseAcknowledged",
            raw.model.license_acknowledged,
            f"must be true: {model.display_name} license is {model.license_summary}",
        )
    from .examples import example_value_warnings

    warnings.extend(
        example_value_warnings({"model.revision": rev, "compute.capacity.reservationId": cap.reservation_id})
    )

    # Expiry and protection ----------------------------------------------------------------
    expires_at = raw.expires_at
    if expires_at is not None:
        if expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        if expires_at <= now:
            raise ConfigError(
                "expiresAt",
                format_utc(expires_at),
                f"is already in the past (now {format_utc(now)}); extend it or remove it to use trialTtlHours",
            )
    if raw.environment == "trial" and expires_at is not None and expires_at - now > timedelta(hours=MAX_TRIAL_HOURS):
        raise ConfigError(
            "expiresAt",
            format_utc(expires_at),
            f"is more than {MAX_TRIAL_HOURS} h away: a trial is short by design (use a staging stack)",
        )
    if raw.environment == "prod" and expires_at is not None:
        raise ConfigError(
            "expiresAt", format_utc(expires_at), "is set on a prod stack (prod does not expire; use a trial or staging stack)"
        )
    if cap.type == "capacity-block" and cap.ends_at is not None:
        ends = cap.ends_at if cap.ends_at.tzinfo else cap.ends_at.replace(tzinfo=UTC)
        if ends <= now:
            raise ConfigError(
                "compute.capacity.endsAt",
                format_utc(ends),
                f"is in the past (now {format_utc(now)}): the capacity block has ended",
            )
        if expires_at is not None and ends < expires_at:
            warnings.append(
                f"the capacity block ends at {format_utc(ends)}, before the stack expires at {format_utc(expires_at)}: "
                "the instances stop when the block ends"
            )
    protect = raw.protect if raw.protect is not None else raw.environment == "prod"

    from .engine import engine_blocker
    from .versions import vllm_image

    # Engine support: a build known not to serve the model stops `pulumi up` (exit 2, before any
    # resource); the offline plan shows it as a blocker at the top of an otherwise complete plan.
    engine_key = "vllm.imageTag" if raw.vllm.image_tag else "vllm.image"
    engine, blocker = engine_blocker(
        raw.vllm.image or vllm_image(target.image_family, raw.vllm.image_tag), engine_key, target.image_family, model
    )
    if not engine.is_release:
        warnings.append(f"engine: {engine.describe()}; the model card asks for vLLM >= {model.min_vllm_version}")
    if raw.environment == "prod" and protect is False:
        warnings.append("protect is false on a prod stack: `pulumi destroy` can delete the weight mirror and file system")

    return DeploymentSpec(
        project=project,
        stack=stack,
        target=target,
        platform=raw.platform,
        environment=raw.environment,
        owner=raw.owner,
        region=region if is_aws else None,
        expires_at=expires_at,
        trial_ttl_hours=raw.trial_ttl_hours,
        protect=protect,
        model=model,
        revision=rev,
        model_source=raw.model.source,
        instance=instance,
        config=raw,
        secrets_set=frozenset(secrets_set),
        warnings=tuple(warnings),
        blockers=(blocker,) if blocker is not None else (),
    )


_CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*/,?-]+$")
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")


def _check_autoscaling_and_observability(raw: RawConfig, warnings: list[str]) -> None:
    """Validate ``autoscaling`` and ``observability`` (components/spec/scaling.py reads them).

    Raises:
        ConfigError: the first invalid value, one line.
    """
    import zoneinfo

    asc, obs, k8s_cfg = raw.autoscaling, raw.observability, raw.kubernetes
    on_k8s = raw.platform in ("aws-eks", "kubernetes")
    for key, ns in (
        ("observability.prometheusNamespace", obs.prometheus_namespace),
        ("observability.grafanaNamespace", obs.grafana_namespace),
    ):
        if ns is None:
            continue
        if not on_k8s:
            raise ConfigError(key, ns, f"is only for the aws-eks and kubernetes platforms, not {raw.platform}")
        if not _DNS_LABEL_RE.match(ns):
            raise ConfigError(key, ns, "is not a valid namespace name (lowercase DNS label)")
    for label_key, label_value in {**obs.monitor_labels, **obs.prometheus_pod_labels}.items():
        if not re.match(
            r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", label_key
        ) or not _LABEL_VALUE_RE.match(label_value):
            which = "observability.monitorLabels" if label_key in obs.monitor_labels else "observability.prometheusPodLabels"
            raise ConfigError(
                which,
                {label_key: label_value},
                "is not a valid Kubernetes label (key [prefix/]name, value 1-63 of letters, digits, '-', '_', '.')",
            )
    if obs.prometheus_url is not None and not _URL_RE.match(obs.prometheus_url):
        raise ConfigError("observability.prometheusUrl", obs.prometheus_url, "is not an http(s) URL without credentials (e.g. http://prometheus-operated.monitoring.svc:9090)")
    scrapers = "prometheus-operator" in k8s_cfg.installed_addons or obs.prometheus_url is not None
    if on_k8s and scrapers and obs.prometheus_namespace is None:
        warnings.append(
            "a Prometheus is configured (prometheus-operator in kubernetes.installedAddons or observability.prometheusUrl) but "
            "observability.prometheusNamespace is not: the NetworkPolicy blocks its scrape of vLLM's /metrics; name its namespace"
        )
    if not asc.enabled:
        return
    if not on_k8s:
        raise ConfigError(
            "autoscaling.enabled",
            True,
            f"is only for the aws-eks and kubernetes platforms (allowed there), not {raw.platform}: one EC2 instance serves one "
            "copy",
        )
    max_replicas = asc.max_replicas if asc.max_replicas is not None else raw.compute.replicas
    if max_replicas < max(asc.min_replicas, 1):
        raise ConfigError(
            "autoscaling.maxReplicas", max_replicas, f"is below autoscaling.minReplicas {asc.min_replicas} (and at least 1)"
        )
    replicas = raw.compute.replicas
    if not max(asc.min_replicas, 1) <= replicas <= max_replicas:
        raise ConfigError(
            "compute.replicas",
            replicas,
            "is the initial replica count and must lie within autoscaling.minReplicas..maxReplicas "
            f"({max(asc.min_replicas, 1)}..{max_replicas})",
        )
    if asc.min_replicas == 0 and not asc.schedule:
        raise ConfigError(
            "autoscaling.minReplicas",
            0,
            "needs autoscaling.schedule: with no replica there is no queue metric to scale up from (name the serving windows)",
        )
    if asc.schedule and asc.controller != "keda":
        raise ConfigError(
            "autoscaling.schedule",
            [w.start for w in asc.schedule],
            f"needs autoscaling.controller keda (a cron trigger); {asc.controller} has none",
        )
    for i, window in enumerate(asc.schedule):
        for name in ("start", "end"):
            expr = getattr(window, name)
            fields = expr.split()
            if len(fields) != 5 or not all(_CRON_FIELD_RE.match(f) for f in fields):
                raise ConfigError(
                    f"autoscaling.schedule.{i}.{name}",
                    expr,
                    "is not a 5-field cron expression (minute hour day-of-month month day-of-week, e.g. '0 8 * * 1-5')",
                )
        try:
            zoneinfo.ZoneInfo(window.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigError(
                f"autoscaling.schedule.{i}.timezone",
                window.timezone,
                "is not an IANA time zone (e.g. UTC, Europe/Berlin, Asia/Shanghai)",
            ) from None
    if asc.controller == "hpa" and "prometheus-adapter" not in k8s_cfg.installed_addons:
        raise ConfigError(
            "autoscaling.controller",
            "hpa",
            "needs an external metrics adapter on the cluster: list prometheus-adapter in kubernetes.installedAddons (or use "
            "keda)",
        )
    if obs.prometheus_namespace is None and obs.prometheus_url is None:
        raise ConfigError(
            "autoscaling.enabled",
            True,
            "needs observability.prometheusNamespace or observability.prometheusUrl (the Prometheus that scrapes vLLM and "
            "answers the scaler's queries)",
        )


def _check_local_zone(raw: RawConfig, warnings: list[str]) -> None:
    """A GPU zone in a Local Zone: warn where the stack puts something there that Local Zones may
    not offer (FSx for Lustre is not among the resources the EKS user guide lists for Local
    Zones: managed node groups, self-managed nodes, EBS volumes, ALBs)."""
    from .targets import is_local_zone

    zone = raw.compute.capacity.availability_zone or raw.compute.availability_zone
    if is_local_zone(zone) and raw.storage.kind in ("fsx", "nvme-from-fsx"):
        warnings.append(
            f"the GPU zone {zone} is a Local Zone and storage.kind {raw.storage.kind} creates FSx for Lustre in it: "
            "check that the zone offers FSx (AWS Local Zones features), or use storage.kind nvme"
        )


def block_instances(raw: RawConfig, instance: InstanceFacts, nodes: int) -> int | None:
    """Instances paid for in an UltraServer capacity block: ``compute.capacity.blockInstances``,
    else the smallest whole number of the type's smallest UltraServer holding ``nodes``; None
    for capacity sold per instance (or not a capacity block)."""
    cap = raw.compute.capacity
    if cap.type != "capacity-block" or not instance.ultraserver_instances:
        return None
    if cap.block_instances is not None:
        return cap.block_instances
    fitting = [n for n in instance.ultraserver_instances if n >= nodes]
    if fitting:
        return fitting[0]
    largest = instance.ultraserver_instances[-1]
    return -(-nodes // largest) * largest


def _check_ultraserver_block(raw: RawConfig, instance: InstanceFacts, nodes: int, warnings: list[str]) -> None:
    """An UltraServer capacity block is bought whole: warn when the node group uses a fraction of
    it (the price covers every tray), refuse a block smaller than the node group.

    Raises:
        ConfigError: ``compute.capacity.blockInstances`` is below the GPU nodes or not a whole
            number of the type's UltraServers.
    """
    billed = block_instances(raw, instance, nodes)
    if billed is None:
        if raw.compute.capacity.block_instances is not None:
            raise ConfigError(
                "compute.capacity.blockInstances", raw.compute.capacity.block_instances,
                f"is only for UltraServer capacity blocks (capacity-block of {instance.instance_type} is sold per instance)",
            )
        return
    sizes = instance.ultraserver_instances
    if billed < nodes:
        raise ConfigError("compute.capacity.blockInstances", billed, f"is smaller than the {nodes} GPU nodes the stack runs")
    if not any(billed % n == 0 for n in sizes):
        raise ConfigError(
            "compute.capacity.blockInstances",
            billed,
            f"is not a whole number of UltraServers ({' or '.join(str(n) for n in sizes)} {instance.instance_type} each)",
        )
    if nodes < billed:
        warnings.append(
            f"the capacity block holds {billed} {instance.instance_type} (whole UltraServers) and is paid in full, "
            f"but the node group uses {nodes}: {billed - nodes} trays sit idle (raise compute.replicas to use them)"
        )


def eks_version_of(raw: RawConfig) -> str:
    """The EKS version a stack creates: ``kubernetes.eksVersion`` or ``versions.EKS_VERSION``."""
    from .versions import EKS_VERSION

    return raw.kubernetes.eks_version or EKS_VERSION


def _check_eks_version(raw: RawConfig, now: datetime, warnings: list[str]) -> None:
    """``kubernetes.eksVersion`` / ``eksSupportType`` against the EKS support calendar at ``now``.

    EKS accepts ``upgradePolicy.supportType: STANDARD`` only for a version still in standard
    support (EKS user guide, "Manage EKS extended support"); past it the cluster runs in
    extended support, billed per cluster-hour at ``EKS_EXTENDED_USD_PER_CLUSTER_HOUR`` instead of
    ``EKS_STANDARD_USD_PER_CLUSTER_HOUR``. So an out-of-standard version needs EXTENDED chosen
    explicitly (then a warning states the price), and a version past extended support or not in
    ``versions.EKS_VERSIONS`` is refused.

    Raises:
        ConfigError: ``kubernetes.eksVersion`` or ``kubernetes.eksSupportType`` is not allowed.
    """
    from .versions import EKS_EXTENDED_USD_PER_CLUSTER_HOUR, EKS_STANDARD_USD_PER_CLUSTER_HOUR, EKS_VERSIONS, eks_support_status

    k8s = raw.kubernetes
    if raw.platform != "aws-eks":
        if k8s.eks_version is not None:
            raise ConfigError("kubernetes.eksVersion", k8s.eks_version, f"is only for aws-eks, not {raw.platform}")
        return
    version = eks_version_of(raw)
    if version not in EKS_VERSIONS:
        raise ConfigError("kubernetes.eksVersion", version, f"is not a known EKS version (allowed: {', '.join(EKS_VERSIONS)})")
    facts = EKS_VERSIONS[version]
    status = eks_support_status(version, now)
    newest = [v for v in EKS_VERSIONS if eks_support_status(v, now) == "standard"]
    instead = f"use {' or '.join(newest)}" if newest else "add the newer EKS versions to versions.EKS_VERSIONS"
    if status == "unsupported":
        raise ConfigError(
            "kubernetes.eksVersion", version, f"left extended support on {facts.end_of_extended_support.isoformat()} ({instead})",
        )
    if status == "extended" and k8s.eks_support_type != "EXTENDED":
        raise ConfigError(
            "kubernetes.eksVersion", version,
            f"left standard support on {facts.end_of_standard_support.isoformat()}: EKS refuses supportType STANDARD for it "
            f"({instead}, or set kubernetes.eksSupportType: EXTENDED at "
            f"USD {EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f} per cluster-hour instead of {EKS_STANDARD_USD_PER_CLUSTER_HOUR:.2f})",
        )
    from .versions import CLUSTER_AUTOSCALER_IMAGE_TAGS

    if raw.autoscaling.enabled and version not in CLUSTER_AUTOSCALER_IMAGE_TAGS:
        raise ConfigError(
            "kubernetes.eksVersion", version,
            f"has no cluster autoscaler release recorded for autoscaling (allowed: {', '.join(CLUSTER_AUTOSCALER_IMAGE_TAGS)})",
        )
    if _version_tuple(version) < (1, 34):
        raise ConfigError(
            "kubernetes.eksVersion", version, "is too old: ComputeDomains and DRA need resource.k8s.io/v1 (GA from 1.34)"
        )
    if status == "extended":
        warnings.append(
            f"EKS {version} is in extended support (standard support ended {facts.end_of_standard_support.isoformat()}): "
            f"the control plane bills USD {EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f} per cluster-hour instead of "
            f"{EKS_STANDARD_USD_PER_CLUSTER_HOUR:.2f}; {instead}"
        )
    elif (
        raw.expires_at is not None
        and raw.expires_at.replace(tzinfo=raw.expires_at.tzinfo or UTC).date() >= facts.end_of_standard_support
    ):
        warnings.append(
            f"EKS {version} leaves standard support on {facts.end_of_standard_support.isoformat()}, before the stack expires: "
            + ("EKS upgrades the cluster then (supportType STANDARD)" if k8s.eks_support_type == "STANDARD"
               else f"it then bills USD {EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f} per cluster-hour (supportType EXTENDED)")
        )


def _walk_strings(value: Any, path: str = ""):
    """``(dotted key, text)`` for every string inside a config value."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk_strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk_strings(v, path)
    elif isinstance(value, str):
        yield path, value


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


# ---------------------------------------------------------------------------------------------
# Stack files
# ---------------------------------------------------------------------------------------------


# Top-level keys of a Pulumi stack settings file (pulumi/pulumi sdk/go/common/workspace/project.go,
# ProjectStack: secretsprovider, encryptedkey, encryptionsalt, config, environment).
STACK_FILE_KEYS: tuple[str, ...] = ("config", "encryptedkey", "encryptionsalt", "environment", "secretsprovider")


class StackFileError(ConfigError):
    """A stack file is missing or not a Pulumi stack config file."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one map (YAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def stack_names(stacks_dir: Path = STACKS_DIR) -> list[str]:
    """Names of the stacks with a file ``stacks/Pulumi.<name>.yaml``, sorted."""
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in stacks_dir.glob("Pulumi.*.yaml"))


def read_stack_config(stack: str, stacks_dir: Path = STACKS_DIR) -> dict[str, Any]:
    """The ``config:`` map of ``stacks/Pulumi.<stack>.yaml`` with full keys (``kimi-deploy:target``).

    Secure values (``{secure: ...}``) are kept as they are: only their presence matters offline.

    Raises:
        StackFileError: no such stack file, or it is not valid YAML with a ``config`` map.
    """
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise StackFileError(
            "--stack",
            stack,
            f"has no file {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path} (stacks: "
            f"{', '.join(stack_names(stacks_dir)) or 'none'})",
        )
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    text = path.read_text()
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise StackFileError("--stack", stack, f"file {shown} is not valid YAML: {_yaml_error_text(err)}") from None
    if data is None:
        raise StackFileError("--stack", stack, f"file {shown} is empty (it needs a 'config:' map; see stacks/Pulumi.b300.yaml)")
    if isinstance(data, dict):
        from .config_reader import did_you_mean

        for top in data:
            if top not in STACK_FILE_KEYS:
                raise StackFileError(
                    "--stack", stack,
                    f"file {shown} has a top-level key {top!r} that Pulumi does not read (allowed: {', '.join(STACK_FILE_KEYS)})"
                    + did_you_mean(str(top), STACK_FILE_KEYS),
                )
        raw_config = data.get("config")
        for key in raw_config if isinstance(raw_config, dict) else ():
            if not isinstance(key, str):
                raise StackFileError(
                    "--stack", stack, f"file {shown} has a config key {key!r} that is not a string (write namespace:key)"
                )
    config = data.get("config", {}) if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise StackFileError("--stack", stack, "file has no 'config:' map")
    return _overlay(config, stack)


# Offline runs only (scripts/plan.py, preflight, tests; `pulumi up` reads config through Pulumi):
# JSON config merged over every stack file, one level deep into maps, as `pulumi config set`
# would add it: e.g. {"kimi-deploy:vllm": {"image": "vllm/vllm-openai:nightly-<commit>"}}.
CONFIG_OVERLAY_ENV = "KIMI_DEPLOY_CONFIG_OVERLAY"


def _overlay(config: dict[str, Any], stack: str) -> dict[str, Any]:
    import json
    import os

    text = os.environ.get(CONFIG_OVERLAY_ENV, "").strip()
    if not text:
        return config
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as err:
        raise StackFileError(CONFIG_OVERLAY_ENV, text[:40], f"is not valid JSON ({err.msg})") from None
    if not isinstance(extra, dict):
        raise StackFileError(CONFIG_OVERLAY_ENV, text[:40], "must be a JSON object of full config keys")
    merged = dict(config)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def _yaml_error_text(err: yaml.YAMLError) -> str:
    """A PyYAML error as ``line L, column C: reason`` (1-based, as editors count)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    reason = getattr(err, "problem", None) or str(err).splitlines()[0]
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and context not in reason:
        where = (
            f" started at line {context_mark.line + 1}, column {context_mark.column + 1}"
            if context_mark is not None and context_mark is not mark
            else ""
        )
        reason = f"{reason} ({context}{where})"
    return f"line {mark.line + 1}, column {mark.column + 1}: {reason}" if mark is not None else reason


def namespace_config(full_config: Mapping[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """The ``kimi-deploy`` namespace map (prefix removed, plus ``region`` from ``aws:region``) and
    the set of secret keys that have a value, read from a stack file's ``config:`` map exactly as
    ``pulumi up`` reads it: converted to the strings the CLI hands the program
    (``config_reader.cli_config_strings``), then decoded by the program's reader
    (``config_reader.read_config_strings``).

    Raises:
        ConfigError: an unknown namespace or key, or a value not of its key's type.
    """
    from .config_reader import cli_config_strings, read_config_strings

    secure = {k for k, v in full_config.items() if isinstance(v, dict) and set(v) == {"secure"}}
    return read_config_strings(cli_config_strings(full_config), secure)


def load_stack(
    stack: str, *, stacks_dir: Path = STACKS_DIR, now: datetime | None = None, project: str = NAMESPACE
) -> DeploymentSpec:
    """Parse and validate ``stacks/Pulumi.<stack>.yaml`` into a ``DeploymentSpec``.

    Raises:
        ConfigError: the stack file is missing or a value is invalid (one line).
    """
    full = read_stack_config(stack, stacks_dir)
    for key, value in full.items():
        name = key.partition(":")[2]
        is_secure = isinstance(value, dict) and set(value) == {"secure"}
        if key.startswith(NAMESPACE + ":") and name in SECRET_KEYS and not is_secure:
            raise ConfigError(
                key, "[plaintext]", "is a secret and must be set with `pulumi config set --secret` (never in plain text)"
            )
        if key.startswith(NAMESPACE + ":") and name not in SECRET_KEYS and is_secure:
            raise ConfigError(
                key, "[secure value]", f"is not a secret key (secret keys: {', '.join(SECRET_KEYS)}); set it without --secret"
            )
    ns, secrets = namespace_config(full)
    return parse_spec(ns, stack=stack, project=project, now=now, secrets_set=secrets)

"""Raw config: the shape of the YAML, camelCase as users write it (pydantic models; unknown keys
are rejected), and ``validate_raw``, which turns pydantic's first error into one ``ConfigError``
line naming the full key."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from ..versions import VLLM_PORT
from .errors import ConfigError

# Config keys that hold secrets. They never enter the spec: only whether they are set.
SECRET_KEYS: tuple[str, ...] = ("hfToken", "modelscopeToken", "apiKey", "kubeconfig")

DEFAULT_TRIAL_TTL_HOURS = 72


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


class WeightsRetryConfig(_Raw):
    """``kimi-deploy:compute.weightsRetry`` (``aws-ec2``): the boot's weights unit is tried
    ``attempts`` times (systemd ``StartLimitBurst``), ``delaySeconds`` apart (``RestartSec``),
    then stays failed until ``systemctl reset-failed`` (README "When the EC2 boot fails")."""

    attempts: StrictInt = Field(3, ge=1, le=20)
    delay_seconds: StrictInt = Field(120, alias="delaySeconds", ge=1, le=3600)


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
    weights_retry: WeightsRetryConfig = Field(WeightsRetryConfig(), alias="weightsRetry")


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
    # EXTENDED (stays, billed at the extended-support rate once past it). See check_eks_version.
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


def validate_raw(config: Mapping[str, Any]) -> tuple[RawConfig, dict[str, Any]]:
    """The raw model of a ``kimi-deploy`` namespace map, and the map without secret keys.

    Raises:
        ConfigError: pydantic's first error, as one line naming the full key.
    """
    plain = {k: v for k, v in config.items() if k not in SECRET_KEYS}
    try:
        raw = RawConfig.model_validate(plain)
    except ValidationError as err:
        raise _pydantic_error(err, plain) from None
    return raw, plain


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
        from ..config_reader import did_you_mean

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
    if kind in _TYPE_WORDS:
        return ConfigError(key, value, _TYPE_WORDS[kind])
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return ConfigError(key, value, f"is out of range (allowed: {_range_text(_field_at(loc), first.get('ctx', {}))})")
    return ConfigError(key, value, f"is not valid: {first['msg'].lower()}")


# pydantic error types -> the project's wording (one line: what the value is not, what to write).
_ISO_TIME = "is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z)"
_TYPE_WORDS: dict[str, str] = {
    "tuple_type": "is not a list (write one item per line, each starting with '- ')",
    "list_type": "is not a list (write one item per line, each starting with '- ')",
    "string_type": "is not a string",
    "int_type": "is not a whole number",
    "int_parsing": "is not a whole number",
    "int_from_float": "is not a whole number",
    "float_type": "is not a number",
    "float_parsing": "is not a number",
    "bool_type": "is not a boolean (allowed: true, false)",
    "bool_parsing": "is not a boolean (allowed: true, false)",
    "datetime_type": _ISO_TIME,
    "datetime_parsing": _ISO_TIME,
    "datetime_from_date_parsing": _ISO_TIME,
}


def _field_at(loc: tuple[Any, ...]) -> Any:
    """The pydantic ``FieldInfo`` at location ``loc`` in ``RawConfig`` (list indexes skipped), or None."""
    model: Any = RawConfig
    info = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        info = next((f for n, f in model.model_fields.items() if part in (n, f.alias)), None)
        if info is None:
            return None
        candidates = [info.annotation, *getattr(info.annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return info


def _range_text(info: Any, ctx: Mapping[str, Any]) -> str:
    """A field's bounds as words: ``1 to 720``, ``more than 0 and at most 2``; from its
    ``Field(ge=..., le=...)`` metadata (else from the one bound pydantic reported)."""
    bounds: dict[str, Any] = {}
    for meta in getattr(info, "metadata", ()) or ():
        for name in ("gt", "ge", "lt", "le"):
            if getattr(meta, name, None) is not None:
                bounds[name] = getattr(meta, name)
    if not bounds:
        bounds = {name: ctx[name] for name in ("gt", "ge", "lt", "le") if name in ctx}
    if "ge" in bounds and "le" in bounds:
        return f"{bounds['ge']} to {bounds['le']}"
    words = {"gt": "more than", "ge": "at least", "lt": "less than", "le": "at most"}
    return " and ".join(f"{words[name]} {bounds[name]}" for name in ("gt", "ge", "lt", "le") if name in bounds)


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

"""The Pulumi program's body: read config, validate it into a spec, declare the components.

``__main__.py`` calls ``main()``. The same function runs under ``pulumi up`` and under Pulumi's
mock engine (tests and ``scripts/ops/plan.py``), so the offline plan shows exactly what would be
declared. Config errors stop the program before any resource is declared, as one line.

What every component receives, ``DeploymentContext``, is defined in ``components/context.py``:
the edges (``components/aws``, ``components/k8s``) import it from there, and this module imports
the edges (deferred, per platform), so no import runs back from an edge to the program.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import pulumi
import pulumi_random as random

from components.context import DeploymentContext
from components.core import naming
from components.core.config import DeploymentSpec, format_utc, parse_utc
from components.core.config.reader import read_config_strings
from components.core.errors import NAMESPACE, ConfigError
from components.core.load import parse_spec
from components.core.sizing import compute_sizing
from components.core.vllm import build_vllm_command
from components.platform import PlatformResult

# Reproducible clock for offline plans and plan diffs (ISO 8601); `pulumi up` uses the real clock.
NOW_ENV = "KIMI_DEPLOY_NOW"


def current_time() -> datetime:
    """The run's clock: ``KIMI_DEPLOY_NOW`` when set (offline plans), else now, in UTC.

    Raises:
        ConfigError: ``KIMI_DEPLOY_NOW`` is not an ISO 8601 time.
    """
    raw = os.environ.get(NOW_ENV)
    return parse_utc(raw, NOW_ENV) if raw else datetime.now(UTC)


def read_namespace_config() -> tuple[dict[str, Any], frozenset[str]]:
    """All ``kimi-deploy:*`` config of the running stack (secrets excluded), decoded by type, and
    the set of secret keys that are set.

    Reads every config key the engine handed the program (full key -> string) and decodes it with
    ``config.reader.read_config_strings``: the same function the offline plan and the scripts use
    on a stack file (after converting it as the CLI does), so both accept and reject the same files.

    Raises:
        ConfigError: an unknown namespace or key, or a value not of its key's type.
    """
    from pulumi.runtime import config as runtime_config

    keys: set[str] = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    strings = {key: runtime_config.get_config(key) for key in sorted(keys)}
    strings = {k: v for k, v in strings.items() if v is not None}
    secret_keys = {k for k in strings if runtime_config.is_config_secret(k)}
    return read_config_strings(strings, secret_keys)


def _expiry(spec: DeploymentSpec, now: datetime) -> pulumi.Output[str] | None:
    """The stack's expiry as an Output: explicit, or for a trial ``trialTtlHours`` after creation.

    The TTL expiry is captured in a ``random.RandomId``'s keepers with ``ignore_changes``: the
    value computed at the first ``pulumi up`` stays in state, so later updates do not move it.
    """
    if spec.expires_at is not None:
        return pulumi.Output.from_input(format_utc(spec.expires_at))
    if spec.environment != "trial":
        return None
    first_value = format_utc(now + timedelta(hours=spec.trial_ttl_hours))
    marker = random.RandomId(
        "trial-expiry",
        byte_length=4,
        keepers={"expiresAt": first_value, "ttlHours": str(spec.trial_ttl_hours)},
        opts=pulumi.ResourceOptions(ignore_changes=["keepers"]),
    )
    return marker.keepers.apply(lambda k: (k or {}).get("expiresAt", first_value))


def _api_key(cfg: pulumi.Config) -> pulumi.Output[str]:
    """The configured API key, or one generated once (``random.RandomPassword``, kept in state)."""
    configured = cfg.get_secret("apiKey")
    if configured is not None:
        return configured
    generated = random.RandomPassword("vllm-api-key", length=48, special=False)
    return pulumi.Output.secret(generated.result)


def build_context(now: datetime | None = None, *, allow_blockers: bool = False) -> DeploymentContext:
    """Read and validate config, derive sizing and the vLLM command, gather secrets.

    Args:
        now: the run's clock (default ``current_time()``).
        allow_blockers: True only for the offline plan (``plan_engine.run_program(...,
            allow_blockers=True)``): ``spec.blockers`` are then shown, not raised. ``pulumi up``
            and ``pulumi preview`` never set it.

    Raises:
        ConfigError: any invalid config value, or the first of ``spec.up_blockers`` (before any
            resource is declared): every blocker in the ``serve`` phase; a ``stage`` declares no
            engine, so a build that cannot serve does not block it, but an EKS API no one can
            reach does.
    """
    now = now or current_time()
    values, secrets_set = read_namespace_config()
    spec = parse_spec(values, stack=pulumi.get_stack(), project=pulumi.get_project(), now=now, secrets_set=secrets_set)
    if spec.up_blockers and not allow_blockers:
        raise spec.up_blockers[0]
    sizing = compute_sizing(spec)
    command = build_vllm_command(spec, sizing)
    if spec.profile.serves_under_systemd:
        # Hard limits before any resource (the trial-expiry marker below is one) is declared.
        from components.aws.compute import check_ec2_user_data

        check_ec2_user_data(spec, command, sizing, hub_token_set=spec.hub_token_key in secrets_set)
    cfg = pulumi.Config(NAMESPACE)
    expires_at = _expiry(spec, now)
    tags: dict[str, Any] = dict(spec.tags)
    if expires_at is not None:
        tags[naming.TAG_EXPIRES_AT] = expires_at
    return DeploymentContext(
        spec=spec,
        sizing=sizing,
        vllm=command,
        tags=tags,
        expires_at=expires_at,
        hub_token=cfg.get_secret(spec.hub_token_key),
        api_key=_api_key(cfg),
        kubeconfig=cfg.get_secret("kubeconfig"),
        now=now,
    )


def _declare_aws(ctx: DeploymentContext) -> PlatformResult:
    from components.aws import declare_aws_platform

    return declare_aws_platform(ctx)


def _declare_existing_cluster(ctx: DeploymentContext) -> PlatformResult:
    from components.k8s.existing_cluster import declare_existing_cluster

    return declare_existing_cluster(ctx)


# Platform name -> its declare function: what the platform provisions, its stack outputs and, when
# its workloads run on Kubernetes, the handle the Kubernetes edge consumes (components/platform.py).
# Imports are deferred so a stack loads only its own platform's modules.
PLATFORM_DECLARERS: Mapping[str, Callable[[DeploymentContext], PlatformResult]] = MappingProxyType(
    {"aws-ec2": _declare_aws, "aws-eks": _declare_aws, "kubernetes": _declare_existing_cluster}
)


def declare(ctx: DeploymentContext) -> dict[str, Any]:
    """Declare every component for ``ctx`` and return the stack outputs.

    The platform first (``PLATFORM_DECLARERS``: on AWS the network, compute or EKS, storage,
    IAM; on an existing cluster its provider), then, when the platform hands over a
    ``KubernetesPlatformHandle``, the Kubernetes workloads on it.

    Raises:
        ValueError: a platform whose profile runs Kubernetes workloads returned no handle, or
            the reverse (a programming error in its declare function).
    """
    spec, sizing = ctx.spec, ctx.sizing
    outputs: dict[str, Any] = {
        "target": spec.target.name,
        "platform": spec.platform,
        "environment": spec.environment,
        "phase": spec.config.phase,
        "servedModelNames": list(ctx.vllm.served_model_names),
        "vllmImage": ctx.vllm.image,
        "startupBudgetSeconds": sizing.startup_budget_seconds,
        "kvCacheTokens": sizing.kv_cache_tokens,
        "gpuUsdPerHour": sizing.usd_per_hour,
        "apiKey": ctx.api_key,
    }
    if ctx.expires_at is not None:
        outputs["expiresAt"] = ctx.expires_at
    platform = PLATFORM_DECLARERS[spec.platform](ctx)
    outputs.update(platform.outputs)
    if spec.staging:
        outputs.update(_stage_outputs(spec, outputs.get("mirrorBucket") or spec.config.storage.mirror.bucket_name))
    if (platform.kubernetes is not None) != spec.profile.runs_kubernetes:
        raise ValueError(f"platform {spec.platform}: its declare function's Kubernetes handle does not match its profile")
    if platform.kubernetes is not None:
        from components.k8s import declare_workloads

        k8s_result = declare_workloads(ctx, platform.kubernetes)
        outputs.update(k8s_result.outputs)
    return outputs


def _stage_outputs(spec: DeploymentSpec, bucket: Any) -> dict[str, Any]:
    """``mirrorCompleteMarker``: the object whose existence says the stage is done (the publish
    writes it last); ``switchToServe``: what to run then (``config.phase.SWITCH_TO_SERVE``)."""
    from components.core.config.phase import SWITCH_TO_SERVE
    from components.core.weights import MARKER_NAME, mirror_uri

    marker = pulumi.Output.from_input(bucket).apply(lambda b: f"{mirror_uri(spec, b)}/{MARKER_NAME}")
    return {
        "mirrorCompleteMarker": marker,
        "switchToServe": f"once mirrorCompleteMarker exists (kimi-deploy preflight --stack {spec.stack}: mirror "
        f"pass): {SWITCH_TO_SERVE}",
    }


def main() -> dict[str, Any]:
    """Entry point used by ``__main__.py``: build, declare and export.

    Raises:
        pulumi.RunError: a config error, reported by Pulumi as one line without a traceback.
    """
    try:
        ctx = build_context()
        outputs = declare(ctx)
    except ConfigError as err:
        raise pulumi.RunError(str(err)) from None
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs

"""The entry at the top of the core: ``parse_spec`` (a stack's config -> ``DeploymentSpec``) and
``load_stack`` (a stack file -> ``DeploymentSpec``).

``parse_spec`` validates the raw config (``config.raw``), runs each section's checks of the typed
config (``config.*``: each key alone, and the rules between keys that need only the facts), builds
the spec, and runs the checks that need the domain (``checks``) in one fixed order. The order is
the order in which errors are reported: for a file with several bad values the first one met here
is the one named (tests/fixtures/config_errors.json records every message).

Layers (each imports only those below it; tests/test_layout.py holds the order):
``errors`` and the facts, then ``config`` (the typed config and its checks), then the domain
(sizing, engine, weights, ...), then ``checks``, then this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import checks, prices
from .config import (
    compute,
    kubernetes,
    lifecycle,
    model,
    network,
    phase,
    plain_secrets,
    platform_keys,
    scaling,
    storage,
    tags,
    target,
    vllm,
)
from .config.raw import SECRET_KEYS, validate_raw
from .config.reader import cli_config_strings, provider_warnings
from .config.spec import DeploymentSpec
from .config.stack_file import STACKS_DIR, namespace_config, read_stack_config
from .errors import NAMESPACE, ConfigError
from .examples import example_value_blockers
from .model import MODELS
from .platforms import platform_profile


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
    raw, plain = validate_raw(config)
    warnings: list[str] = []
    plain_secrets.check_no_credentials(plain)

    # Target, platform, environment, owner, model profile; the target must hold the model.
    supported = target.supported_targets(MODELS.get(raw.model.profile))
    target.check_names(raw, supported)
    lifecycle.check_environment(raw)
    tags.check_owner(raw)
    target_profile = target.target_of(raw)
    model_profile = model.check_profile(raw)
    model.check_served_model_name(raw, model_profile)
    target.check_holds_model(raw, target_profile, model_profile, supported)
    target.check_platform(raw, target_profile)
    # The platform's profile, looked up once (its name is valid from here on) and passed to every
    # check that asks what the platform does.
    platform = platform_profile(raw.platform)
    # One rule for every key: a key the platform never reads is an error (config/platform_keys.py).
    platform_keys.check_platform_keys(raw, platform)
    platform_keys.check_ignored_beside(raw, warnings)

    # Compute: instance, replicas, region, zones and capacity, EFA, AMI.
    instance_type, instance = compute.resolve_instance(raw, target_profile)
    compute.check_replicas(raw, platform)
    region = compute.check_region(raw, platform, instance, instance_type)
    compute.check_placement_and_capacity(raw, platform, target_profile, instance, instance_type, region, warnings)
    # Prices: overrides name entries of the one price table; one far below the list price is warned.
    prices.price_table(raw.prices)
    warnings.extend(prices.override_warnings(raw.compute.usd_per_hour, instance_type, raw.prices, instance.gpus))

    network.check_network(raw, platform, warnings)
    storage.check_storage(raw, platform, instance, instance_type, model_profile.weights_bytes, warnings)
    phase.check_phase(raw, platform)
    vllm.check_vllm(raw, target_profile, model_profile, warnings)
    kubernetes.check_kubernetes(raw, platform, stack, project, now, secrets_set, warnings)
    kubernetes.check_mirror_access(raw, platform)
    kubernetes.check_node_selector_hardware(raw, target_profile)
    scaling.check_autoscaling_and_observability(raw, platform, warnings)
    revision = model.check_revision_and_license(raw, model_profile, warnings)

    # Lifecycle: expiry, the capacity block's end, protection; then the engine build.
    expires_at = lifecycle.check_expiry(raw, now)
    compute.check_capacity_block_end(raw, now, expires_at, warnings)
    protect = lifecycle.protect_of(raw)
    blocker = checks.engine_blocker_of(raw, target_profile, model_profile, warnings)
    # A placeholder as the EKS API's only source stops every phase (a stage creates the cluster too),
    # and so does every other example value still in place (the plan renders and says so).
    api_blockers = tuple(network.api_server_blockers(raw, platform)) + tuple(example_value_blockers(
        {"model.revision": revision, "compute.capacity.reservationId": raw.compute.capacity.reservation_id}
    ))
    lifecycle.warn_unprotected_prod(raw, protect, warnings)
    from .versions import vllm_image

    image = raw.vllm.image or vllm_image(target_profile.image_family, raw.vllm.image_tag)
    mutable = lifecycle.prod_image_blocker(raw, image, stack)

    spec = DeploymentSpec(
        project=project,
        stack=stack,
        target=target_profile,
        platform=raw.platform,
        environment=raw.environment,
        owner=raw.owner,
        region=region if platform.provisions_aws else None,
        expires_at=expires_at,
        trial_ttl_hours=raw.trial_ttl_hours,
        protect=protect,
        model=model_profile,
        revision=revision,
        model_source=raw.model.source,
        instance=instance,
        config=raw,
        secrets_set=frozenset(secrets_set),
        warnings=tuple(warnings),
        blockers=api_blockers + ((blocker,) if blocker is not None else ()) + ((mutable,) if mutable is not None else ()),
        every_phase_blockers=api_blockers,
    )
    # A window (trialTtlHours, expiresAt, a capacity block's end) that closes before the modelled
    # first deploy is ready blocks serve (time_to_ready.window_blockers: one rule for all windows);
    # waits far beyond it (startup budget, weights retry, a scaling window shorter than a scale-up)
    # are warned with both figures. The model reads the sizing, which reads this spec.
    from .time_to_ready import long_wait_warnings, schedule_window_warnings, stack_time_to_ready, window_blockers

    try:
        ttr = stack_time_to_ready(spec)
    except ConfigError:
        ttr = None  # a sizing the plan refuses (its own message, raised there); window_blockers raises it with a window
    windows = tuple(window_blockers(spec, now, ttr))
    waits = tuple(long_wait_warnings(spec, ttr) + schedule_window_warnings(spec, ttr)) if ttr is not None else ()
    return replace(spec, blockers=spec.blockers + windows, warnings=spec.warnings + waits)


def load_stack(
    stack: str, *, stacks_dir: Path = STACKS_DIR, now: datetime | None = None, project: str = NAMESPACE
) -> DeploymentSpec:
    """Parse and validate ``stacks/Pulumi.<stack>.yaml`` into a ``DeploymentSpec``; its warnings
    include the provider settings the plan should show (``config.reader.provider_warnings``).

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
    spec = parse_spec(ns, stack=stack, project=project, now=now, secrets_set=secrets)
    # Provider settings that send the AWS calls elsewhere or unverified (config/reader.py).
    shown = provider_warnings(cli_config_strings(full))
    return replace(spec, warnings=spec.warnings + shown) if shown else spec

"""``parse_spec``: validate the raw config, run each section's checks in a fixed order, build the spec.

The order is the order in which errors are reported: for a file with several bad values the
first one met here is the one named (tests/test_config_parts.py holds the recorded messages).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..model import MODELS
from ..platforms import platform_profile
from . import (
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
from .errors import NAMESPACE
from .raw import validate_raw
from .spec import DeploymentSpec


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
    profile = target.target_of(raw)
    model_profile = model.check_profile(raw)
    model.check_served_model_name(raw, model_profile)
    target.check_holds_model(raw, profile, model_profile, supported)
    target.check_platform(raw, profile)
    # One rule for every key: a key the platform never reads is an error (config/platform_keys.py).
    platform_keys.check_platform_keys(raw)

    # Compute: instance, replicas, region, zones and capacity, EFA, AMI.
    instance_type, instance = compute.resolve_instance(raw, profile)
    compute.check_replicas(raw)
    region = compute.check_region(raw, instance, instance_type)
    compute.check_placement_and_capacity(raw, profile, instance, instance_type, region, warnings)

    network.check_network(raw, warnings)
    storage.check_storage(raw, instance, instance_type, model_profile.weights_bytes)
    phase.check_phase(raw)
    vllm.check_vllm(raw, profile, model_profile, warnings)
    kubernetes.check_kubernetes(raw, stack, project, now, secrets_set, warnings)
    kubernetes.check_mirror_access(raw)
    kubernetes.check_node_selector_hardware(raw, profile)
    scaling.check_autoscaling_and_observability(raw, warnings)
    revision = model.check_revision_and_license(raw, model_profile, warnings)

    # Lifecycle: expiry, the capacity block's end, protection; then the engine build.
    expires_at = lifecycle.check_expiry(raw, now)
    compute.check_capacity_block_end(raw, now, expires_at, warnings)
    protect = lifecycle.protect_of(raw)
    blocker = vllm.engine_blocker_of(raw, profile, model_profile, warnings)
    # A placeholder as the EKS API's only source stops every phase (a stage creates the cluster too).
    api_blockers = tuple(network.api_server_blockers(raw))
    lifecycle.warn_unprotected_prod(raw, protect, warnings)

    return DeploymentSpec(
        project=project,
        stack=stack,
        target=profile,
        platform=raw.platform,
        environment=raw.environment,
        owner=raw.owner,
        region=region if platform_profile(raw.platform).provisions_aws else None,
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
        blockers=api_blockers + ((blocker,) if blocker is not None else ()),
        every_phase_blockers=api_blockers,
    )

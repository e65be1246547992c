"""``target`` and ``platform``: a known target that can hold the model, on a platform it offers."""

from __future__ import annotations

from ..errors import ConfigError, check_choice
from ..model import ModelProfile
from ..targets import PLATFORMS, TARGETS, TargetProfile
from .raw import RawConfig


def supported_targets(model: ModelProfile | None) -> list[str]:
    """Targets that can serve ``model``: no ``unsupported_reason`` and more GPU memory per copy
    than its weights (all targets without a reason when the model is unknown). A target
    rejected for memory is never listed as supported in the same message."""
    return [
        name
        for name, profile in TARGETS.items()
        if profile.unsupported_reason is None and (model is None or profile.gpu_memory_per_copy_bytes > model.weights_bytes)
    ]


def check_names(raw: RawConfig, supported: list[str]) -> None:
    """``target`` is a known target (else the message lists the ``supported`` ones) and
    ``platform`` one of ``targets.PLATFORMS``.

    Raises:
        ConfigError: an unknown target or platform.
    """
    if raw.target not in TARGETS:
        check_choice("target", raw.target, supported)
    check_choice("platform", raw.platform, PLATFORMS)


def target_of(raw: RawConfig) -> TargetProfile:
    """The profile of ``raw.target`` (checked by ``check_names``)."""
    return TARGETS[raw.target]


def check_holds_model(raw: RawConfig, target: TargetProfile, model: ModelProfile, supported: list[str]) -> None:
    """The target's GPU memory per copy holds the model's weights with room left for KV cache,
    and the target has no ``unsupported_reason``.

    Raises:
        ConfigError: ``target`` cannot serve the model (the message lists the ``supported`` targets).
    """
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
        raise ConfigError("target", raw.target, f"{why} (supported: {', '.join(supported)})")


def check_platform(raw: RawConfig, target: TargetProfile) -> None:
    """``platform`` is one the target's profile lists.

    Raises:
        ConfigError: the platform is not available for the target.
    """
    if raw.platform not in target.platforms:
        raise ConfigError(
            "platform",
            raw.platform,
            f"is not available for target {target.name} (allowed: {', '.join(target.platforms) or 'none'})",
        )

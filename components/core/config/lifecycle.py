"""``environment``, ``expiresAt``, ``trialTtlHours`` and ``protect``: how long a stack lives and
what guards its data; and what prod refuses of the engine image (a tag, which can be pushed again)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from ..errors import ConfigError, check_choice
from .raw import RawConfig
from .spec import format_utc

ENVIRONMENTS: tuple[str, ...] = ("trial", "staging", "prod")
# An image pinned by content: ``...@sha256:<64 hex>`` (OCI image spec, "Digests"; what a registry
# answers for a manifest). A tag, a release ``:vX.Y.Z`` or ``:nightly-<commit>`` alike, is a name that can be
# pushed again, and the nodes pull it with IfNotPresent: two nodes may run two builds.
IMAGE_DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}\Z")
# Trials are short by design; anything longer is a staging stack.
MAX_TRIAL_HOURS = 24 * 30


def check_environment(raw: RawConfig) -> None:
    """``environment`` is one of ``ENVIRONMENTS``.

    Raises:
        ConfigError: another value.
    """
    check_choice("environment", raw.environment, ENVIRONMENTS)


def check_expiry(raw: RawConfig, now: datetime) -> datetime | None:
    """``expiresAt`` (no zone means UTC) is in the future, at most ``MAX_TRIAL_HOURS`` away in a
    trial, and unset in prod.

    Returns:
        The expiry as an aware datetime, or None.

    Raises:
        ConfigError: the expiry is past, too far for a trial, or set on prod.
    """
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
    return expires_at


def protect_of(raw: RawConfig) -> bool:
    """``protect`` as set, else true exactly in prod."""
    return raw.protect if raw.protect is not None else raw.environment == "prod"


def warn_unprotected_prod(raw: RawConfig, protect: bool, warnings: list[str]) -> None:
    """A prod stack with ``protect: false`` gets a warning (``pulumi destroy`` can delete data)."""
    if raw.environment == "prod" and protect is False:
        warnings.append("protect is false on a prod stack: `pulumi destroy` can delete the weight mirror and file system")


def prod_image_blocker(raw: RawConfig, image: str, stack: str) -> ConfigError | None:
    """A prod stack's engine image must be pinned by digest (``IMAGE_DIGEST_RE``); a tag blocks
    `pulumi up` (the plan still renders and says so).

    Args:
        raw: the stack's config (``environment``).
        image: the image the stack would run (``vllm.image``, else the family's image at
            ``vllm.imageTag`` or the pinned release).
        stack: the stack's name (in the command to run).

    Returns:
        The ConfigError to block with (key ``vllm.image``), or None (not prod, or pinned).
    """
    if raw.environment != "prod" or IMAGE_DIGEST_RE.search(image):
        return None
    return ConfigError(
        "vllm.image", image,
        "is a tag, which can be pushed again, on a prod stack: pin the image by digest (repo@sha256:<64 hex>); "
        f"`kimi-deploy engine verify --image {image} --stack {stack}` proves it and prints the line to paste",
    )

"""``environment``, ``expiresAt``, ``trialTtlHours`` and ``protect``: how long a stack lives and
what guards its data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ..errors import ConfigError, check_choice
from .raw import RawConfig
from .spec import format_utc

ENVIRONMENTS: tuple[str, ...] = ("trial", "staging", "prod")
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

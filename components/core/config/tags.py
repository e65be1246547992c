"""``owner``: it becomes an AWS tag value and a Kubernetes label value."""

from __future__ import annotations

from ..errors import ConfigError
from .patterns import LABEL_VALUE_RE
from .raw import RawConfig


def check_owner(raw: RawConfig) -> None:
    """``owner`` is a valid AWS tag value and Kubernetes label value.

    Raises:
        ConfigError: not 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric.
    """
    if not LABEL_VALUE_RE.match(raw.owner):
        raise ConfigError(
            "owner",
            raw.owner,
            "must name the owning team or person: 1-63 letters, digits, '-', '_' or '.' (it becomes an AWS tag and a Kubernetes "
            "label)",
        )

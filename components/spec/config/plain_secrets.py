"""Values shaped like credentials (``credentials.find_credential``) never sit in plain config."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..credentials import find_credential
from .errors import ConfigError


def check_no_credentials(plain: Mapping[str, Any]) -> None:
    """Every string in the plain (non-secret) config, checked against the credential shapes.

    Raises:
        ConfigError: a value looks like a credential; the message names the secret key to use.
    """
    for path, text in _walk_strings(plain):
        shape = find_credential(text)  # values shaped like credentials belong in secret keys
        if shape is not None:
            secret_key = shape.secret_key or "apiKey"
            raise ConfigError(
                path,
                "[looks like a credential]",
                f"must not hold credentials in plain config: use `pulumi config set --secret kimi-deploy:{secret_key}`",
            )


def _walk_strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, text)`` for every string inside a config value."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk_strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _walk_strings(v, path)
    elif isinstance(value, str):
        yield path, value

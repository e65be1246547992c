"""Values shaped like credentials (``credentials.find_credential``) never sit in plain config."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..credentials import find_credential
from ..errors import ConfigError

# Credential kinds with no secret key here (``CredentialShape.secret_key == ""``), in words.
_KIND_WORDS: dict[str, str] = {"aws-access-key-id": "an AWS access key id", "github-token": "a GitHub token"}
# Where such a credential belongs instead (Pulumi AWS provider: environment variables, a shared
# profile or an instance/web-identity role; pulumi-aws ``config/vars.py`` accessKey/profile).
_WHERE_INSTEAD: dict[str, str] = {
    "aws-access-key-id": " (the AWS provider reads credentials from AWS_PROFILE, the environment or a role, never the stack)",
}


def check_no_credentials(plain: Mapping[str, Any]) -> None:
    """Every string in the plain (non-secret) config, checked against the credential shapes.

    Raises:
        ConfigError: a value looks like a credential; the message names the secret key to use, or
            says that no key of this project holds that kind (an AWS access key, a GitHub token).
    """
    for path, text in _walk_strings(plain):
        shape = find_credential(text)  # values shaped like credentials belong in secret keys
        if shape is not None and shape.secret_key:
            raise ConfigError(
                path,
                "[looks like a credential]",
                f"must not hold credentials in plain config: use `pulumi config set --secret kimi-deploy:{shape.secret_key}`",
            )
        if shape is not None:
            # A kind of credential no key of this project holds (an AWS access key, a GitHub
            # token): naming a secret key would send it to the wrong place.
            raise ConfigError(
                path,
                "[looks like a credential]",
                f"must not hold credentials in plain config: it looks like {_KIND_WORDS.get(shape.name, 'a ' + shape.name)}, "
                "which no kimi-deploy key holds; remove it" + _WHERE_INSTEAD.get(shape.name, ""),
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

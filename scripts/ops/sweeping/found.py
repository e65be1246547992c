"""What the sweeper finds (``Found``), how tags make a resource ours and expired (``classify``),
and the small boto3 helpers every kind uses. Imports boto3/botocore only inside functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from components.core.config import parse_utc
from components.core.naming import (  # one place for tag keys
    ROLE_WEIGHTS_MIRROR,
    TAG_ENVIRONMENT,
    TAG_OWNER,
    TAG_PROJECT,
    TAG_RETAIN,
    TAG_ROLE,
    TAG_STACK,
)
from components.core.naming import TAG_EXPIRES_AT as TAG_EXPIRES

# EC2 filter: resources carrying the stack tag (what kimi-deploy tags; DeploymentSpec.tags).
OURS_FILTER = [{"Name": "tag-key", "Values": [TAG_STACK]}]


def parse_time(text: str) -> datetime:
    """An ISO 8601 / RFC 3339 time as an aware UTC datetime.

    Raises:
        ValueError: not a time.
    """
    return parse_utc(text, TAG_EXPIRES)


# Values of the retain tag read as "not retained" (compared stripped, case-insensitively). Any other
# value keeps the resource: `yes`, `1`, `on`, `keep` mean retain to whoever wrote them, and a resource
# the sweeper keeps by mistake costs money, one it deletes by mistake is gone.
RETAIN_OFF_VALUES: frozenset[str] = frozenset({"", "false", "no", "n", "0", "off"})


def retained_by(tags: Mapping[str, str]) -> str | None:
    """Why a resource with ``tags`` is never deleted, or None: the retain tag with any value but
    one of ``RETAIN_OFF_VALUES`` (``kimi-deploy:retain=yes`` as ``=true``), or the weight mirror's
    role. The one reading of the retain tag for the sweep, the dry run and the state check."""
    value = tags.get(TAG_RETAIN)
    if value is not None and value.strip().lower() not in RETAIN_OFF_VALUES:
        return f"retained: tagged {TAG_RETAIN}={value.strip()}"
    if tags.get(TAG_ROLE) == ROLE_WEIGHTS_MIRROR:
        return "retained: the weight mirror is never deleted"
    return None


def tags_of(pairs: Iterable[Mapping[str, str]] | Mapping[str, str] | None) -> dict[str, str]:
    """AWS tags as a dict, from ``[{"Key", "Value"}]`` (EC2, ELB, FSx, S3) or a mapping (EKS)."""
    if not pairs:
        return {}
    if isinstance(pairs, Mapping):
        return dict(pairs)
    return {p["Key"]: p.get("Value", "") for p in pairs}


@dataclass
class Found:
    """One resource of ours.

    Attributes:
        kind: a registered kind's name (``scripts/ops/sweeping/kinds.py``).
        id: the AWS id (instance id, ARN for load balancers, ``cluster/nodegroup`` for node groups).
        region: AWS region.
        stack, project, owner, environment: from the tags.
        expires_at: the ``expires-at`` tag as found (None when absent).
        expired: ``expires-at`` is at or before now.
        retained: tagged ``kimi-deploy:retain`` (any value but false/no/0/off: ``retained_by``) or
            the weight mirror: never deleted.
        status: what was done: ``active`` (not expired), ``would-delete`` (dry run),
            ``deleted``, ``kept`` (retained or never deleted), ``failed``, ``still-paid``.
        reason: why (would-delete, kept, failed, invalid expiry), one line.
        detail: kind-specific facts (instance type, state, end date of a capacity block).
    """

    kind: str
    id: str
    region: str
    stack: str
    project: str = ""
    owner: str = ""
    environment: str = ""
    expires_at: str | None = None
    expired: bool = False
    retained: bool = False
    status: str = "active"
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict, repr=False)


def classify(
    kind: str, rid: str, region: str, tags: Mapping[str, str], now: datetime, detail: dict | None = None
) -> Found | None:
    """A ``Found`` for a resource with ``tags``, or None when it is not ours (no stack tag)."""
    if TAG_STACK not in tags:
        return None
    item = Found(
        kind=kind,
        id=rid,
        region=region,
        stack=tags[TAG_STACK],
        project=tags.get(TAG_PROJECT, ""),
        owner=tags.get(TAG_OWNER, ""),
        environment=tags.get(TAG_ENVIRONMENT, ""),
        expires_at=tags.get(TAG_EXPIRES),
        detail=dict(detail or {}),
        tags=dict(tags),
    )
    item.retained = retained_by(tags) is not None
    if item.expires_at and item.environment == "prod":
        # Config rejects expiresAt on prod stacks; a prod resource carrying the tag anyway (set by
        # hand, or by an old release) is reported, never ended by the sweeper.
        item.reason = "environment prod: expires-at ignored, never swept"
    elif item.expires_at:
        try:
            item.expired = parse_time(item.expires_at) <= now
        except ValueError:
            item.reason = f"expires-at {item.expires_at!r} is not an RFC 3339 time: not swept (fix the tag)"
    return item


def public(f: Found) -> dict[str, Any]:
    """``f`` as report JSON (without its raw tags)."""
    d = asdict(f)
    d.pop("tags", None)
    return d


def paginate(client: Any, op: str, key: str, **kwargs: Any) -> list[dict]:
    """Every item under ``key`` of boto3 operation ``op`` (all pages when it paginates)."""
    out: list[dict] = []
    if client.can_paginate(op):
        for page in client.get_paginator(op).paginate(**kwargs):
            out.extend(page.get(key, []))
    else:
        out.extend(getattr(client, op)(**kwargs).get(key, []))
    return out


def is_connection_error(err: Exception) -> bool:
    """Whether botocore could not reach the endpoint (refused, DNS, timeout)."""
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return False
    return isinstance(err, BotoConnectionError)


def is_credentials_error(err: Exception) -> bool:
    """Whether ``err`` means there are no usable AWS credentials (or no region)."""
    name = type(err).__name__
    return (
        name in ("NoCredentialsError", "PartialCredentialsError", "NoRegionError")
        or "UnrecognizedClientException" in str(err)
        or "InvalidClientTokenId" in str(err)
    )


def one_line(err: Exception) -> str:
    """The first line of ``err`` (its type name when it has no text)."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def is_unparsable_response(err: Exception) -> bool:
    """Whether botocore could not parse the endpoint's answer as an AWS API response (an emulator
    such as moto answers a call it does not implement with an HTML error page)."""
    return type(err).__name__ == "ResponseParserError"


def error_code(err: Exception) -> str:
    """The AWS error code of a botocore ``ClientError`` (``""`` for anything else)."""
    response = getattr(err, "response", None)
    return response.get("Error", {}).get("Code", "") if isinstance(response, Mapping) else ""

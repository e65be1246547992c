"""Helpers shared by the AWS components: tags, names, child options, ARNs.

Every taggable AWS resource gets ``tags(ctx, name)``: the stack's tags from the context
(stack, environment, target, owner, project, and ``expires-at`` on stacks that expire; that
one may be an Output) plus a ``Name``. ``tags_all`` is left to the provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi

from components.core import naming

# The S3 key prefix of the toolkit files in the mirror bucket (one place: components/core/naming.py).
TOOLS_PREFIX = naming.TOOLS_PREFIX
# Where EC2 nodes keep toolkit files and env files on the host.
HOST_TOOLS_DIR = "/opt/kimi-deploy"


def tags(ctx_tags: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """The tags of one resource: the stack's tags plus ``Name`` when given.

    Args:
        ctx_tags: ``DeploymentContext.tags`` (values are strings or Outputs).
        name: a human name shown in the EC2 console (plain string).
    """
    out = dict(ctx_tags)
    if name:
        out["Name"] = name
    return out


def resource_prefix(project: str, stack: str) -> str:
    """A short, DNS-safe prefix for physical names: ``<project>-<stack>``, lowercase, <= 40 chars
    (``naming.resource_prefix``)."""
    return naming.resource_prefix(project, stack)


def child(parent: pulumi.Resource, **kwargs: Any) -> pulumi.ResourceOptions:
    """``ResourceOptions(parent=parent, **kwargs)``: every child of a component goes through here."""
    return pulumi.ResourceOptions(parent=parent, **kwargs)


def bucket_arn(partition: str, bucket: str) -> str:
    """``arn:<partition>:s3:::<bucket>``."""
    return f"arn:{partition}:s3:::{bucket}"


def managed_policy_arn(partition: str, name: str) -> str:
    """ARN of the AWS managed policy ``name`` in ``partition``."""
    return f"arn:{partition}:iam::aws:policy/{name}"

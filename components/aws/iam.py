"""IAM, least privilege: policy documents (pure functions) and the roles the stack uses.

Who may do what with the weight mirror:
- readers (EC2 node copy, the Kubernetes weight-sync Job) may list and get objects under the
  mirror prefix only (and, on EC2, the toolkit files under ``_tools/``);
- the publisher (the mirror-publishing Job, or the EC2 instance that publishes on first boot)
  may additionally put, delete and manage multipart uploads under the stack's REVISION prefix
  only (``<prefix>/<org>/<repo>/<revision>/``, ``weights.mirror_key_prefix``): other revisions
  and other stacks' checkpoints in the same bucket stay read-only to it. On EKS the publisher is
  a separate role bound to the publish Job's service account alone, so serving pods and nodes
  never hold write rights. On EC2 one instance profile serves and publishes (the first boot
  publishes when the mirror is incomplete, and any later boot may find it so), so the instance
  keeps write on its one revision prefix for its life: the narrowest right that still lets a
  boot publish, and nothing it writes can reach another revision or stack.

Secrets: no role may read any SSM parameter or secret but its own. ``AmazonSSMManagedInstanceCore``
is not attached anywhere: it allows ``ssm:GetParameter(s)`` on ``*``, so the instance (and on
EKS every node, hence every hostNetwork pod) could read every SecureString of the account under
the ``aws/ssm`` key, other stacks' API keys and hub tokens included. Instead every instance and
node role gets ``session_manager_policy`` (Session Manager and Run Command channels only, the
actions of AWS's "minimal instance permissions" for Session Manager), and the EC2 instance an
``ssm:GetParameter`` on exactly its own parameters (``ssm_parameters_policy``).
- nodes get only the AWS managed policies their role needs (``NODE_MANAGED_POLICIES``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from typing import Any

import pulumi
import pulumi_aws as aws

from .common import bucket_arn, child, managed_policy_arn, tags

# AWS managed policies per kind of role (names; the partition is added at run time).
# EC2 instance: none (Session Manager comes from session_manager_policy, no SSH keys).
EC2_INSTANCE_MANAGED_POLICIES: tuple[str, ...] = ()
# EKS nodes: join the cluster, run the VPC CNI, pull images from ECR (EKS add-on images). None
# of them grants ssm:GetParameter* or secretsmanager:GetSecretValue (AWS managed policy reference).
NODE_MANAGED_POLICIES: tuple[str, ...] = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
)
# Session Manager and Run Command on an instance, without AmazonSSMManagedInstanceCore's
# ssm:GetParameter(s) on "*" (AWS Systems Manager user guide, "Step 2: Verify or add instance
# permissions for Session Manager", custom instance profile policy; ec2messages for Run Command).
# These actions take no resource-level scope: the resource is "*".
SESSION_MANAGER_ACTIONS: tuple[str, ...] = (
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    "ec2messages:AcknowledgeMessage",
    "ec2messages:DeleteMessage",
    "ec2messages:FailMessage",
    "ec2messages:GetEndpoint",
    "ec2messages:GetMessages",
    "ec2messages:SendReply",
)
CLUSTER_MANAGED_POLICIES: tuple[str, ...] = ("AmazonEKSClusterPolicy",)

READ_ACTIONS: tuple[str, ...] = ("s3:GetObject",)
WRITE_ACTIONS: tuple[str, ...] = (
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)


def assume_role_policy(service: str, *, tag_session: bool = False) -> str:
    """Trust policy letting the AWS service principal ``service`` assume a role (JSON).

    ``tag_session`` adds ``sts:TagSession`` (required by EKS Pod Identity).
    """
    actions = ["sts:AssumeRole", "sts:TagSession"] if tag_session else "sts:AssumeRole"
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": actions}],
        },
        sort_keys=True,
    )


def _prefix_patterns(prefixes: Iterable[str]) -> list[str]:
    out: list[str] = []
    for prefix in prefixes:
        clean = prefix.strip("/")
        out += [clean, f"{clean}/*"]
    return out


def session_manager_policy() -> str:
    """Session Manager and Run Command for an instance or node role (JSON): ``SESSION_MANAGER_ACTIONS``
    on ``*`` and nothing that reads parameters or secrets."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "SessionManagerChannels", "Effect": "Allow", "Action": list(SESSION_MANAGER_ACTIONS), "Resource": "*"}
            ],
        },
        sort_keys=True,
    )


def mirror_policy(
    partition: str,
    bucket: str,
    prefix: str,
    *,
    write: bool,
    extra_read_prefixes: Iterable[str] = (),
    write_prefix: str | None = None,
) -> str:
    """The S3 policy document (JSON) of a mirror reader (``write=False``) or publisher.

    Args:
        partition: AWS partition (``aws``).
        bucket: the mirror bucket's name.
        prefix: the mirror prefix (``storage.mirror.prefix``); every right is limited to it.
        write: publisher rights (put, delete, multipart), on ``write_prefix`` only.
        extra_read_prefixes: more prefixes readable (e.g. ``_tools``), never writable.
        write_prefix: the one key prefix a publisher may write (the revision prefix,
            ``weights.mirror_key_prefix``); must lie under ``prefix``. Default ``prefix``.

    Raises:
        ValueError: ``write_prefix`` is not under ``prefix``.
    """
    arn = bucket_arn(partition, bucket)
    clean = prefix.strip("/")
    target = (write_prefix or clean).strip("/")
    if target != clean and not target.startswith(clean + "/"):
        raise ValueError(f"write prefix {target!r} is not under the mirror prefix {clean!r}")
    statements: list[dict[str, Any]] = [
        {
            "Sid": "ListMirrorPrefix",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": arn,
            "Condition": {"StringLike": {"s3:prefix": _prefix_patterns([clean, *extra_read_prefixes])}},
        },
        {"Sid": "ReadMirrorPrefix", "Effect": "Allow", "Action": list(READ_ACTIONS), "Resource": f"{arn}/{clean}/*"},
    ]
    if write:
        statements.append(
            {"Sid": "WriteRevisionPrefix", "Effect": "Allow", "Action": list(WRITE_ACTIONS), "Resource": f"{arn}/{target}/*"}
        )
    extra = [p.strip("/") for p in extra_read_prefixes]
    if extra:
        statements.append(
            {"Sid": "ReadTools", "Effect": "Allow", "Action": list(READ_ACTIONS), "Resource": [f"{arn}/{p}/*" for p in extra]}
        )
    if write:
        statements.append(
            {"Sid": "ListUploads", "Effect": "Allow", "Action": "s3:ListBucketMultipartUploads", "Resource": arn}
        )
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


# What the engine-cache save needs beyond reading the mirror (scripts/node/engine_cache.py: boto3
# upload_file, multipart above 8 MB): put, and abort/list the parts of its own multipart uploads.
# No s3:DeleteObject: a save never removes or replaces an archive.
ENGINE_CACHE_WRITE_ACTIONS: tuple[str, ...] = (
    "s3:PutObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)


def engine_cache_policy(partition: str, bucket: str, cache_prefix: str) -> str:
    """The S3 policy document (JSON) of a pod that restores and saves the engine caches: list,
    read and write under ``cache_prefix`` only (``engine_cache.cache_key_prefix``:
    ``<prefix>/<repo>/<revision>/_engine-cache``); the weights beside it stay out of reach.

    The list right (conditioned on the prefix) makes S3 answer a HEAD of a missing archive with
    404 instead of 403 (S3 API reference, HeadObject permissions; S3 evaluates ``s3:prefix`` as
    the object's key there, ceph/ceph#68577 matching AWS), which the save's existence check needs.

    Raises:
        ValueError: ``cache_prefix`` is empty or not a relative key prefix.
    """
    clean = cache_prefix.strip("/")
    if not clean or ".." in clean.split("/"):
        raise ValueError(f"engine cache prefix {cache_prefix!r} is not a relative S3 key prefix")
    arn = bucket_arn(partition, bucket)
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ListEngineCache",
                    "Effect": "Allow",
                    "Action": "s3:ListBucket",
                    "Resource": arn,
                    "Condition": {"StringLike": {"s3:prefix": _prefix_patterns([clean])}},
                },
                {"Sid": "ReadEngineCache", "Effect": "Allow", "Action": list(READ_ACTIONS), "Resource": f"{arn}/{clean}/*"},
                {
                    "Sid": "WriteEngineCache",
                    "Effect": "Allow",
                    "Action": list(ENGINE_CACHE_WRITE_ACTIONS),
                    "Resource": f"{arn}/{clean}/*",
                },
            ],
        },
        sort_keys=True,
    )


def ssm_parameters_policy(parameter_arns: list[str]) -> str:
    """Read (and decrypt through SSM with the AWS managed key) exactly these parameters (JSON)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "ReadBootSecrets", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": parameter_arns}
            ],
        },
        sort_keys=True,
    )


def tls_only_bucket_policy(partition: str, bucket: str) -> str:
    """Bucket policy (JSON) denying every request that does not use TLS."""
    arn = bucket_arn(partition, bucket)
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [arn, f"{arn}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        },
        sort_keys=True,
    )


def role(
    name: str,
    *,
    parent: pulumi.Resource,
    ctx_tags: dict[str, Any],
    service: str,
    partition: pulumi.Input[str],
    managed: tuple[str, ...] = (),
    inline: dict[str, pulumi.Input[str]] | None = None,
    tag_session: bool = False,
    description: str,
) -> aws.iam.Role:
    """An IAM role trusted by ``service`` with the named managed policies attached and inline
    policies (name -> JSON document Input)."""
    r = aws.iam.Role(
        name,
        assume_role_policy=assume_role_policy(service, tag_session=tag_session),
        description=description,
        tags=tags(ctx_tags),
        opts=child(parent),
    )
    for policy in managed:
        aws.iam.RolePolicyAttachment(
            f"{name}-{policy.lower().replace('_', '-')}",
            role=r.name,
            policy_arn=pulumi.Output.from_input(partition).apply(functools.partial(managed_policy_arn, name=policy)),
            opts=child(parent),
        )
    for policy_name, document in (inline or {}).items():
        aws.iam.RolePolicy(f"{name}-{policy_name}", role=r.name, name=policy_name, policy=document, opts=child(parent))
    return r

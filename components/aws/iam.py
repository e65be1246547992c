"""IAM, least privilege: policy documents (pure functions) and the roles the stack uses.

Who may do what with the weight mirror:
- readers (EC2 node copy, the Kubernetes weight-sync Job) may list and get objects under the
  mirror prefix only (and, on EC2, the toolkit files under ``_tools/``);
- the publisher (the mirror-publishing Job, or the EC2 instance that publishes on first boot)
  may additionally put, delete and manage multipart uploads under the mirror prefix only;
- nodes get only the AWS managed policies their role needs (``NODE_MANAGED_POLICIES``).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import pulumi
import pulumi_aws as aws

from .common import bucket_arn, child, managed_policy_arn, tags

# AWS managed policies per kind of role (names; the partition is added at run time).
# EC2 instance: Session Manager only (no SSH keys).
EC2_INSTANCE_MANAGED_POLICIES: tuple[str, ...] = ("AmazonSSMManagedInstanceCore",)
# EKS nodes: join the cluster, run the VPC CNI, pull images from ECR (EKS add-on images), SSM.
NODE_MANAGED_POLICIES: tuple[str, ...] = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonSSMManagedInstanceCore",
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


def mirror_policy(partition: str, bucket: str, prefix: str, *, write: bool, extra_read_prefixes: Iterable[str] = ()) -> str:
    """The S3 policy document (JSON) of a mirror reader (``write=False``) or publisher.

    Args:
        partition: AWS partition (``aws``).
        bucket: the mirror bucket's name.
        prefix: the mirror prefix (``storage.mirror.prefix``); every right is limited to it.
        write: publisher rights (put, delete, multipart) on the prefix.
        extra_read_prefixes: more prefixes readable (e.g. ``_tools``), never writable.
    """
    arn = bucket_arn(partition, bucket)
    clean = prefix.strip("/")
    statements: list[dict[str, Any]] = [
        {
            "Sid": "ListMirrorPrefix",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": arn,
            "Condition": {"StringLike": {"s3:prefix": _prefix_patterns([clean, *extra_read_prefixes])}},
        },
        {
            "Sid": "WriteMirrorPrefix" if write else "ReadMirrorPrefix",
            "Effect": "Allow",
            "Action": list(WRITE_ACTIONS if write else READ_ACTIONS),
            "Resource": f"{arn}/{clean}/*",
        },
    ]
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


def ssm_parameters_policy(parameter_arns: list[str]) -> str:
    """Read (and decrypt through SSM with the AWS managed key) exactly these parameters (JSON)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Sid": "ReadBootSecrets", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": parameter_arns}],
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
            policy_arn=pulumi.Output.from_input(partition).apply(lambda p, n=policy: managed_policy_arn(p, n)),
            opts=child(parent),
        )
    for policy_name, document in (inline or {}).items():
        aws.iam.RolePolicy(f"{name}-{policy_name}", role=r.name, name=policy_name, policy=document, opts=child(parent))
    return r

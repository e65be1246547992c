#!/usr/bin/env python3
"""The IAM policy the identity running `pulumi up` / `pulumi destroy` needs, derived from the
resource types a stack declares.

    python scripts/ops/deploy_policy.py --stack b300 > deploy-policy.json     # or: make iam-policy
    aws iam create-policy --policy-name kimi-deploy-b300 --policy-document file://deploy-policy.json

The program runs under the offline mock engine (as ``scripts/ops/plan.py`` does); every declared
resource type and every data source it reads is looked up in ``ACTIONS`` / ``INVOKE_ACTIONS``
(the API calls the Pulumi AWS provider makes to create, read, update, tag and delete that type),
and the union is printed as one policy document, one statement per AWS service. Roles are
passed only to the services named in ``iam:PassedToService``. A type missing from the tables is
an error, never a silently smaller policy (the tests run every stack).

Sources: the AWS Service Authorization Reference (actions per service,
https://docs.aws.amazon.com/service-authorization/latest/reference/reference_policies_actions-resources-contextkeys.html),
the Amazon EKS cluster and node group IAM docs
(https://docs.aws.amazon.com/eks/latest/userguide/create-cluster.html), the FSx for Lustre data
repository permissions (https://docs.aws.amazon.com/fsx/latest/LustreGuide/setting-up.html) and
the Pulumi AWS provider's resource docs (https://www.pulumi.com/registry/packages/aws/api-docs/).
Scope: ``Resource: "*"`` per service (the names are only known after `pulumi up`); narrow them
with your account's naming or tag conditions if your organisation requires it.
Exit codes: 0 ok, 2 usage or config error, or a declared type has no entry in the table.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.core.config import read_stack_config, stack_names
from components.core.errors import ConfigError
from scripts.ops._cli import CliParser, UsageError, print_json, print_overlay_notice, prog_name, run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]

# IAM managed policy size quota (characters, whitespace not counted):
# https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html
MANAGED_POLICY_MAX_CHARS = 6144

_TAGS_EC2 = ("ec2:CreateTags", "ec2:DeleteTags", "ec2:DescribeTags")
_SG_RULES = ("ec2:DescribeSecurityGroups", "ec2:DescribeSecurityGroupRules", "ec2:AuthorizeSecurityGroupIngress",
             "ec2:AuthorizeSecurityGroupEgress", "ec2:RevokeSecurityGroupIngress", "ec2:RevokeSecurityGroupEgress",
             "ec2:ModifySecurityGroupRules", "ec2:UpdateSecurityGroupRuleDescriptionsIngress",
             "ec2:UpdateSecurityGroupRuleDescriptionsEgress")
_IAM_PASS = "iam:PassRole"

# Pulumi type token -> IAM actions for create, read (refresh/preview), update, tag and delete.
# ``iam:PassRole`` entries are gathered into one statement limited by PASSED_TO below.
ACTIONS: dict[str, tuple[str, ...]] = {
    "aws:ec2/vpc:Vpc": ("ec2:CreateVpc", "ec2:DeleteVpc", "ec2:DescribeVpcs", "ec2:DescribeVpcAttribute",
                        "ec2:ModifyVpcAttribute", "ec2:AssociateVpcCidrBlock", "ec2:DisassociateVpcCidrBlock",
                        "ec2:DescribeRouteTables", "ec2:DescribeNetworkAcls", "ec2:DescribeSecurityGroups",
                        *_TAGS_EC2),
    "aws:ec2/subnet:Subnet": ("ec2:CreateSubnet", "ec2:DeleteSubnet", "ec2:DescribeSubnets",
                              "ec2:ModifySubnetAttribute", "ec2:AssociateSubnetCidrBlock",
                              "ec2:DisassociateSubnetCidrBlock", "ec2:DescribeNetworkInterfaces", *_TAGS_EC2),
    "aws:ec2/internetGateway:InternetGateway": ("ec2:CreateInternetGateway", "ec2:DeleteInternetGateway",
                                                "ec2:AttachInternetGateway", "ec2:DetachInternetGateway",
                                                "ec2:DescribeInternetGateways", *_TAGS_EC2),
    "aws:ec2/eip:Eip": ("ec2:AllocateAddress", "ec2:ReleaseAddress", "ec2:DescribeAddresses",
                        "ec2:DescribeAddressesAttribute", "ec2:DisassociateAddress", *_TAGS_EC2),
    "aws:ec2/natGateway:NatGateway": ("ec2:CreateNatGateway", "ec2:DeleteNatGateway", "ec2:DescribeNatGateways",
                                      *_TAGS_EC2),
    "aws:ec2/routeTable:RouteTable": ("ec2:CreateRouteTable", "ec2:DeleteRouteTable", "ec2:DescribeRouteTables",
                                      "ec2:CreateRoute", "ec2:DeleteRoute", "ec2:ReplaceRoute", *_TAGS_EC2),
    "aws:ec2/route:Route": ("ec2:CreateRoute", "ec2:DeleteRoute", "ec2:ReplaceRoute", "ec2:DescribeRouteTables"),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": (
        "ec2:AssociateRouteTable", "ec2:DisassociateRouteTable", "ec2:ReplaceRouteTableAssociation",
        "ec2:DescribeRouteTables"),
    "aws:ec2/securityGroup:SecurityGroup": ("ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup",
                                            "ec2:DescribeNetworkInterfaces", *_SG_RULES, *_TAGS_EC2),
    "aws:ec2/defaultSecurityGroup:DefaultSecurityGroup": (*_SG_RULES, *_TAGS_EC2),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (*_SG_RULES, *_TAGS_EC2),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": (*_SG_RULES, *_TAGS_EC2),
    "aws:ec2/vpcEndpoint:VpcEndpoint": ("ec2:CreateVpcEndpoint", "ec2:DeleteVpcEndpoints",
                                        "ec2:DescribeVpcEndpoints", "ec2:ModifyVpcEndpoint",
                                        "ec2:DescribeVpcEndpointServices", "ec2:DescribePrefixLists",
                                        "ec2:DescribeRouteTables", *_TAGS_EC2),
    "aws:ec2/launchTemplate:LaunchTemplate": ("ec2:CreateLaunchTemplate", "ec2:CreateLaunchTemplateVersion",
                                              "ec2:DeleteLaunchTemplate", "ec2:DescribeLaunchTemplates",
                                              "ec2:DescribeLaunchTemplateVersions", "ec2:ModifyLaunchTemplate",
                                              *_TAGS_EC2),
    "aws:ec2/instance:Instance": ("ec2:RunInstances", "ec2:TerminateInstances", "ec2:StartInstances",
                                  "ec2:StopInstances", "ec2:DescribeInstances", "ec2:DescribeInstanceAttribute",
                                  "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTypes",
                                  "ec2:DescribeInstanceCreditSpecifications", "ec2:ModifyInstanceAttribute",
                                  "ec2:ModifyInstanceMetadataOptions", "ec2:DescribeVolumes", "ec2:DescribeImages",
                                  "ec2:DescribeNetworkInterfaces", "ec2:DescribeCapacityReservations",
                                  "ec2:DescribeLaunchTemplateVersions", *_TAGS_EC2, _IAM_PASS),
    "aws:iam/role:Role": ("iam:CreateRole", "iam:DeleteRole", "iam:GetRole", "iam:UpdateRole",
                          "iam:UpdateAssumeRolePolicy", "iam:TagRole", "iam:UntagRole", "iam:ListRoleTags",
                          "iam:ListRolePolicies", "iam:ListAttachedRolePolicies", "iam:ListInstanceProfilesForRole"),
    "aws:iam/rolePolicy:RolePolicy": ("iam:PutRolePolicy", "iam:GetRolePolicy", "iam:DeleteRolePolicy"),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ("iam:AttachRolePolicy", "iam:DetachRolePolicy",
                                                          "iam:ListAttachedRolePolicies"),
    "aws:iam/instanceProfile:InstanceProfile": ("iam:CreateInstanceProfile", "iam:DeleteInstanceProfile",
                                                "iam:GetInstanceProfile", "iam:AddRoleToInstanceProfile",
                                                "iam:RemoveRoleFromInstanceProfile", "iam:TagInstanceProfile",
                                                "iam:UntagInstanceProfile", _IAM_PASS),
    "aws:s3/bucket:Bucket": ("s3:CreateBucket", "s3:DeleteBucket", "s3:ListBucket", "s3:ListBucketVersions",
                             "s3:GetBucketLocation", "s3:GetBucketAcl", "s3:GetBucketCORS", "s3:GetBucketWebsite",
                             "s3:GetBucketVersioning", "s3:GetAccelerateConfiguration", "s3:GetBucketRequestPayment",
                             "s3:GetBucketLogging", "s3:GetLifecycleConfiguration", "s3:GetReplicationConfiguration",
                             "s3:GetEncryptionConfiguration", "s3:GetBucketObjectLockConfiguration",
                             "s3:GetBucketTagging", "s3:PutBucketTagging", "s3:GetBucketPolicy",
                             "s3:GetBucketOwnershipControls", "s3:GetBucketPublicAccessBlock"),
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration": ("s3:PutLifecycleConfiguration",
                                                                         "s3:GetLifecycleConfiguration"),
    "aws:s3/bucketObjectv2:BucketObjectv2": ("s3:PutObject", "s3:GetObject", "s3:GetObjectTagging",
                                             "s3:PutObjectTagging", "s3:DeleteObject", "s3:DeleteObjectVersion",
                                             "s3:ListBucket"),
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls": ("s3:PutBucketOwnershipControls",
                                                               "s3:GetBucketOwnershipControls"),
    "aws:s3/bucketPolicy:BucketPolicy": ("s3:PutBucketPolicy", "s3:GetBucketPolicy", "s3:DeleteBucketPolicy"),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": ("s3:PutBucketPublicAccessBlock",
                                                               "s3:GetBucketPublicAccessBlock"),
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": (
        "s3:PutEncryptionConfiguration", "s3:GetEncryptionConfiguration"),
    "aws:ssm/parameter:Parameter": ("ssm:PutParameter", "ssm:GetParameter", "ssm:GetParameters",
                                    "ssm:DescribeParameters", "ssm:DeleteParameter", "ssm:AddTagsToResource",
                                    "ssm:RemoveTagsFromResource", "ssm:ListTagsForResource"),
    "aws:kms/key:Key": ("kms:CreateKey", "kms:DescribeKey", "kms:GetKeyPolicy", "kms:PutKeyPolicy",
                        "kms:GetKeyRotationStatus", "kms:EnableKeyRotation", "kms:DisableKeyRotation",
                        "kms:UpdateKeyDescription", "kms:ListResourceTags", "kms:TagResource", "kms:UntagResource",
                        "kms:ScheduleKeyDeletion", "kms:EnableKey", "kms:DisableKey"),
    "aws:cloudwatch/logGroup:LogGroup": ("logs:CreateLogGroup", "logs:DeleteLogGroup", "logs:DescribeLogGroups",
                                         "logs:PutRetentionPolicy", "logs:DeleteRetentionPolicy",
                                         "logs:ListTagsForResource", "logs:TagResource", "logs:UntagResource",
                                         "logs:AssociateKmsKey", "logs:DisassociateKmsKey"),
    # EKS: the caller passes the cluster role, validates the VPC and grants the KMS key for
    # secrets encryption; the first cluster in an account creates EKS's service-linked role.
    "aws:eks/cluster:Cluster": ("eks:CreateCluster", "eks:DescribeCluster", "eks:DeleteCluster",
                                "eks:UpdateClusterConfig", "eks:UpdateClusterVersion", "eks:DescribeUpdate",
                                "eks:TagResource", "eks:UntagResource", "eks:ListTagsForResource",
                                "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups", "ec2:DescribeVpcs",
                                "kms:DescribeKey", "kms:CreateGrant", "iam:CreateServiceLinkedRole", _IAM_PASS),
    "aws:eks/nodeGroup:NodeGroup": ("eks:CreateNodegroup", "eks:DescribeNodegroup", "eks:DeleteNodegroup",
                                    "eks:UpdateNodegroupConfig", "eks:UpdateNodegroupVersion", "eks:DescribeUpdate",
                                    "eks:TagResource", "eks:UntagResource", "ec2:DescribeSubnets",
                                    "ec2:DescribeLaunchTemplateVersions", "iam:GetRole",
                                    "iam:CreateServiceLinkedRole", _IAM_PASS,
                                    # resuming an expired trial: its Auto Scaling group's Launch was
                                    # suspended by the expiry schedule (components/aws/expiry.py)
                                    "autoscaling:DescribeAutoScalingGroups", "autoscaling:ResumeProcesses"),
    "aws:eks/addon:Addon": ("eks:CreateAddon", "eks:DescribeAddon", "eks:DeleteAddon", "eks:UpdateAddon",
                            "eks:DescribeAddonVersions", "eks:DescribeAddonConfiguration", "eks:DescribeUpdate",
                            "eks:TagResource", "eks:UntagResource", _IAM_PASS),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": (
        "eks:CreatePodIdentityAssociation", "eks:DescribePodIdentityAssociation",
        "eks:UpdatePodIdentityAssociation", "eks:DeletePodIdentityAssociation", "eks:TagResource",
        "eks:UntagResource", "iam:GetRole", _IAM_PASS),
    # FSx for Lustre: ENIs in the subnet, the service-linked role, and (for a data repository
    # association) the S3 reads FSx's own setup guide lists for the caller.
    "aws:fsx/lustreFileSystem:LustreFileSystem": ("fsx:CreateFileSystem", "fsx:DescribeFileSystems",
                                                  "fsx:UpdateFileSystem", "fsx:DeleteFileSystem", "fsx:TagResource",
                                                  "fsx:UntagResource", "fsx:ListTagsForResource",
                                                  "ec2:CreateNetworkInterface", "ec2:DescribeNetworkInterfaces",
                                                  "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
                                                  "ec2:DescribeVpcs", "kms:DescribeKey", "kms:CreateGrant",
                                                  "iam:CreateServiceLinkedRole"),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": (
        "fsx:CreateDataRepositoryAssociation", "fsx:DescribeDataRepositoryAssociations",
        "fsx:UpdateDataRepositoryAssociation", "fsx:DeleteDataRepositoryAssociation", "fsx:TagResource",
        "fsx:UntagResource", "fsx:ListTagsForResource", "iam:CreateServiceLinkedRole", "iam:AttachRolePolicy",
        "iam:PutRolePolicy", "s3:ListBucket", "s3:GetBucketLocation", "s3:GetBucketPolicy", "s3:PutBucketPolicy"),
    # The expiry stop (components/aws/expiry.py): a one-shot schedule whose role the scheduler
    # assumes (schedules carry no tags; their groups would). EventBridge Scheduler API reference.
    "aws:scheduler/schedule:Schedule": ("scheduler:CreateSchedule", "scheduler:GetSchedule", "scheduler:UpdateSchedule",
                                        "scheduler:DeleteSchedule", _IAM_PASS),
}

# Data sources (invoke tokens) the program reads, and what each calls.
INVOKE_ACTIONS: dict[str, tuple[str, ...]] = {
    "aws:index/getPartition:getPartition": (),  # answered from the provider's region, no API call
    "aws:index/getAvailabilityZones:getAvailabilityZones": ("ec2:DescribeAvailabilityZones",),
    "aws:ssm/getParameter:getParameter": ("ssm:GetParameter",),  # the DLAMI id (public parameter)
    "aws:ec2/getSubnets:getSubnets": ("ec2:DescribeSubnets",),
    "aws:ec2/getRouteTables:getRouteTables": ("ec2:DescribeRouteTables",),
    "aws:index/getCallerIdentity:getCallerIdentity": ("sts:GetCallerIdentity",),
}

# The provider itself checks its credentials (sts:GetCallerIdentity) unless
# skipCredentialsValidation is set: https://www.pulumi.com/registry/packages/aws/installation-configuration/
PROVIDER_ACTIONS: tuple[str, ...] = ("sts:GetCallerIdentity",)

# Services a declared type passes a role to (iam:PassedToService), per type.
PASSED_TO: dict[str, tuple[str, ...]] = {
    "aws:ec2/instance:Instance": ("ec2.amazonaws.com",),
    "aws:iam/instanceProfile:InstanceProfile": ("ec2.amazonaws.com",),
    "aws:eks/cluster:Cluster": ("eks.amazonaws.com",),
    "aws:eks/nodeGroup:NodeGroup": ("ec2.amazonaws.com", "eks.amazonaws.com"),
    "aws:eks/addon:Addon": ("eks.amazonaws.com", "pods.eks.amazonaws.com"),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": ("pods.eks.amazonaws.com",),
    "aws:scheduler/schedule:Schedule": ("scheduler.amazonaws.com",),
}

# Types that make no AWS API call: Pulumi components (package ``kimi-deploy``), providers,
# the random provider (local) and Kubernetes objects (the cluster's API, authorised by the
# EKS access entry the cluster creator gets: bootstrapClusterCreatorAdminPermissions).
NO_AWS_PREFIXES: tuple[str, ...] = ("kimi-deploy:", "pulumi:providers:", "random:", "kubernetes:")

_SERVICE_SIDS = {"ec2": "Ec2", "iam": "Iam", "s3": "S3", "ssm": "Ssm", "kms": "Kms", "logs": "Logs", "eks": "Eks",
                 "fsx": "Fsx", "sts": "Sts", "scheduler": "Scheduler"}


class UncoveredTypes(Exception):
    """Declared types or data sources that have no entry in the tables (one line)."""


def declared(stack: str, now: datetime | None = None) -> tuple[list[str], list[str]]:
    """``(resource type tokens, invoke tokens)`` the program declares and reads for ``stack``,
    sorted, from one run of the offline mock engine.

    Raises:
        ConfigError: the stack file is invalid.
    """
    from components import plan_engine

    # The permissions do not depend on the engine build: a stack still blocked on one (no
    # capable vLLM pinned yet) gets its policy, so it can be prepared before the engine is chosen.
    # The mock engine answers data sources and records which were read (PlanRun.calls).
    run = plan_engine.run_program(read_stack_config(stack), stack=stack, allow_blockers=True,
                                  now=now or datetime.now(UTC).replace(microsecond=0))
    return sorted({r.type for r in run.resources}), sorted(set(run.calls))


def uncovered(types: Iterable[str], invokes: Iterable[str]) -> list[str]:
    """Tokens with no entry in ``ACTIONS`` / ``INVOKE_ACTIONS`` (and not a no-AWS type)."""
    missing = [t for t in types if t not in ACTIONS and not t.startswith(NO_AWS_PREFIXES)]
    missing += [t for t in invokes if t not in INVOKE_ACTIONS and t.startswith("aws:")]
    return missing


def policy_document(types: Iterable[str], invokes: Iterable[str] = ()) -> dict[str, Any]:
    """The IAM policy document (``Version`` 2012-10-17) for the declared types and data sources:
    one ``Allow`` statement per service (sorted actions, ``Resource: "*"``) and one
    ``iam:PassRole`` statement limited to the services roles are passed to. A stack without
    any AWS type or data source gets no statement (``Statement: []``).

    Raises:
        UncoveredTypes: a type or data source has no entry in the tables.
    """
    types, invokes = list(types), list(invokes)
    missing = uncovered(types, invokes)
    if missing:
        raise UncoveredTypes(f"no IAM actions recorded for {', '.join(missing)}: add them to ACTIONS / "
                             "INVOKE_ACTIONS in scripts/ops/deploy_policy.py (see the AWS Service Authorization Reference)")
    uses_aws = any(t.startswith("aws:") for t in types + invokes)
    actions: set[str] = set(PROVIDER_ACTIONS) if uses_aws else set()
    passed: set[str] = set()
    for token in types:
        for action in ACTIONS.get(token, ()):
            (passed.update(PASSED_TO.get(token, ())) if action == _IAM_PASS else actions.add(action))
    for token in invokes:
        actions.update(INVOKE_ACTIONS.get(token, ()))
    by_service: dict[str, list[str]] = {}
    for action in sorted(actions):
        by_service.setdefault(action.split(":", 1)[0], []).append(action)
    statements: list[dict[str, Any]] = [
        {"Sid": f"KimiDeploy{_SERVICE_SIDS.get(service, service.title())}", "Effect": "Allow",
         "Action": names, "Resource": "*"}
        for service, names in sorted(by_service.items())
    ]
    if passed:
        statements.append({"Sid": "KimiDeployPassRole", "Effect": "Allow", "Action": [_IAM_PASS], "Resource": "*",
                           "Condition": {"StringEquals": {"iam:PassedToService": sorted(passed)}}})
    return {"Version": "2012-10-17", "Statement": statements}


def compact_size(document: dict[str, Any]) -> int:
    """Characters IAM counts against the managed-policy quota (JSON without whitespace)."""
    return len(json.dumps(document, separators=(",", ":")))


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog=prog_name("scripts/ops/deploy_policy.py"),
        description="Print the IAM policy document the identity running `pulumi up` and `pulumi destroy` "
        "needs for a stack, derived from the resource types the program declares (offline mock run).",
        epilog="Exit codes: 0 ok, 2 usage or config error, or a declared type has no IAM actions in the table. "
        "Apply it: aws iam create-policy --policy-name kimi-deploy-STACK --policy-document file://policy.json",
    )
    parser.add_argument("--stack", required=True, help=f"stack name: stacks/Pulumi.<stack>.yaml ({', '.join(stack_names())})")
    parser.add_argument(
        "--types", action="store_true", help="list the declared types and data sources with their actions instead"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.stack not in stack_names():
        raise ConfigError("--stack", args.stack, f"is not a stack (allowed: {', '.join(stack_names())})")
    print_overlay_notice(stack=args.stack)  # stderr: stdout is the policy alone
    types, invokes = declared(args.stack)
    try:
        document = policy_document(types, invokes)
    except UncoveredTypes as err:
        raise UsageError(str(err)) from None
    if args.types:
        for token in types + invokes:
            actions = ACTIONS.get(token, INVOKE_ACTIONS.get(token, ()))
            print(f"{token}: {', '.join(actions) if actions else '(no AWS API call)'}")
        return 0
    print_json(document)
    if not document["Statement"]:
        print(f"note: stack {args.stack} declares no AWS resource: the deploying identity needs no AWS permissions "
              "(only access to its Kubernetes cluster)", file=sys.stderr)
    size = compact_size(document)
    if size > MANAGED_POLICY_MAX_CHARS:
        print(f"note: {size} characters is above the {MANAGED_POLICY_MAX_CHARS}-character managed-policy quota: "
              "split the statements over two policies", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))

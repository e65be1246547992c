"""The identity of the cluster autoscaler on EKS (``aws-eks`` stacks with ``autoscaling.enabled``):
an IAM role for EKS Pod Identity, bound to the ``kube-system/cluster-autoscaler`` service
account the Kubernetes edge's Helm release creates (``components/k8s/addons.py``).

Why: KEDA adds replicas; a replica whose node does not exist stays Pending until a node
autoscaler raises the GPU node group's desired size (within the min/max that follow the replicas,
``components/core/scaling.py``). EKS tags a managed node group's Auto Scaling group for
cluster-autoscaler auto-discovery (``k8s.io/cluster-autoscaler/enabled`` and
``k8s.io/cluster-autoscaler/<cluster>``: ``owned``), so the write actions are limited to groups
carrying this cluster's tag.

Policy: the cluster autoscaler's AWS cloud-provider README ("Full Cluster Autoscaler Features
Policy"), narrowed: describe calls on ``*`` (those actions take no resource), ``DescribeNodegroup``
on this cluster's node groups, ``SetDesiredCapacity`` and ``TerminateInstanceInAutoScalingGroup``
only on EKS node-group Auto Scaling groups tagged for this cluster.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

from components.core.config import DeploymentSpec
from components.core.naming import CLUSTER_AUTOSCALER_NAMESPACE, CLUSTER_AUTOSCALER_SERVICE_ACCOUNT
from components.core.scaling import autoscaling_enabled

from . import iam
from .common import child, tags

DESCRIBE_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeTags",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
    "eks:DescribeNodegroup",
)
WRITE_ACTIONS = ("autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup")


def needs_node_autoscaler(spec: DeploymentSpec) -> bool:
    """Whether the stack runs the cluster autoscaler: ``aws-eks`` with ``autoscaling.enabled``."""
    return spec.profile.cluster_autoscaler and autoscaling_enabled(spec)


def cluster_autoscaler_policy(cluster_name: str) -> str:
    """The IAM policy document (JSON) of the cluster autoscaler of ``cluster_name``."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": "Describe", "Effect": "Allow", "Action": list(DESCRIBE_ACTIONS[:-1]), "Resource": "*"},
                {"Sid": "DescribeOwnNodeGroups", "Effect": "Allow", "Action": [DESCRIBE_ACTIONS[-1]],
                 "Resource": f"arn:*:eks:*:*:nodegroup/{cluster_name}/*/*"},
                {
                    "Sid": "ScaleOwnNodeGroups",
                    "Effect": "Allow",
                    "Action": list(WRITE_ACTIONS),
                    # EKS names a managed node group's Auto Scaling group eks-<node group>-<uuid>.
                    "Resource": "arn:*:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/eks-*",
                    "Condition": {"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}},
                },
            ],
        },
        sort_keys=True,
    )


def declare_node_autoscaler_identity(
    parent: pulumi.Resource, name: str, spec: DeploymentSpec, cluster: aws.eks.Cluster, partition: pulumi.Input[str],
    ctx_tags: dict[str, Any], after: list[pulumi.Resource],
) -> list[aws.eks.PodIdentityAssociation]:
    """The role and Pod Identity association of the cluster autoscaler (none when not needed)."""
    if not needs_node_autoscaler(spec):
        return []
    role = iam.role(
        f"{name}-cluster-autoscaler",
        parent=parent,
        ctx_tags=ctx_tags,
        service="pods.eks.amazonaws.com",
        tag_session=True,
        partition=partition,
        inline={"cluster-autoscaler": cluster.name.apply(cluster_autoscaler_policy)},
        description=f"kimi-deploy {spec.stack}: {CLUSTER_AUTOSCALER_NAMESPACE}/{CLUSTER_AUTOSCALER_SERVICE_ACCOUNT} (GPU node "
                    "group size)",
    )
    return [
        aws.eks.PodIdentityAssociation(
            f"{name}-cluster-autoscaler",
            cluster_name=cluster.name,
            namespace=CLUSTER_AUTOSCALER_NAMESPACE,
            service_account=CLUSTER_AUTOSCALER_SERVICE_ACCOUNT,
            role_arn=role.arn,
            tags=tags(ctx_tags),
            opts=child(parent, depends_on=after),
        )
    ]

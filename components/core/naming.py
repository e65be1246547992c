"""Names and host paths shared by the AWS and Kubernetes edges (one place for each)."""

from __future__ import annotations

import re

# Kubernetes service accounts. The AWS edge binds IAM roles to them (EKS Pod Identity) by
# name before the Kubernetes edge creates them, so both read the names from here.
WEIGHT_SYNC_SERVICE_ACCOUNT = "kimi-weight-sync"
MIRROR_PUBLISH_SERVICE_ACCOUNT = "kimi-mirror-publish"
VLLM_SERVICE_ACCOUNT = "kimi-vllm"
# The Service clients reach the OpenAI API through (Kubernetes platforms). Not the workload's own
# name: the LeaderWorkerSet controller creates a headless Service named after the set
# (components/core/controller_objects.py), so a client Service may never take that name.
VLLM_CLIENT_SERVICE = "kimi-vllm-api"
# Name of the vLLM workload (Deployment or LeaderWorkerSet) and of the objects that follow it
# (Service, ScaledObject, PodMonitor); the scaling queries and the plan's notes name it too.
VLLM_WORKLOAD_NAME = "kimi-vllm"
# The cluster autoscaler's service account (aws-eks with autoscaling): the Helm release creates it,
# the AWS edge binds its Pod Identity role to it.
CLUSTER_AUTOSCALER_NAMESPACE = "kube-system"
CLUSTER_AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"

# The S3 key prefix (inside the mirror bucket) where toolkit files the nodes fetch live, e.g. the
# weight-sync program. Readers of the weights may read it too; nothing else. No storage.mirror.prefix
# may start with it (config/storage.py): the weights' writers would write where the tools are.
TOOLS_PREFIX = "_tools"

# Host path of the instance-store RAID0: EKS AL2023 nodeadm `localStorage: RAID0` mounts it
# at /mnt/k8s-disks/0 (https://awslabs.github.io/amazon-eks-ami/nodeadm/); the EC2 user data uses the same path.
NVME_RAID0_HOST_PATH = "/mnt/k8s-disks/0"

# Node labels the GPU node groups carry and the workloads select.
GPU_NODE_LABEL = "kimi-deploy/gpu-node"
TARGET_NODE_LABEL = "kimi-deploy/target"
# Taint on GPU nodes so only GPU workloads land there.
GPU_TAINT_KEY = "kimi-deploy/gpu"

# Tag keys every tool relies on (AWS tags; Kubernetes labels/annotations use the same words).
# The sweeper finds expired trials by them; the policy pack checks them.
TAG_STACK = "kimi-deploy:stack"
TAG_ENVIRONMENT = "kimi-deploy:environment"
TAG_TARGET = "kimi-deploy:target"
TAG_OWNER = "kimi-deploy:owner"
TAG_PROJECT = "kimi-deploy:project"
TAG_EXPIRES_AT = "expires-at"
# "true": never deleted by the sweeper (the weight mirror carries it).
TAG_RETAIN = "kimi-deploy:retain"
TAG_ROLE = "kimi-deploy:role"
ROLE_WEIGHTS_MIRROR = "weights-mirror"
# The tag keys the toolkit owns, each with what sets it. The sweeper decides by them what is ours,
# expired or retained, so a provider-wide `aws:defaultTags` may not set them: on a prod stack
# (which has no expires-at of its own) a default expires-at in the past would mark every resource
# expired, and a default retain tag would keep every expired trial's resources forever.
TOOLKIT_TAG_KEYS: dict[str, str] = {
    TAG_STACK: "the Pulumi stack name",
    TAG_ENVIRONMENT: "kimi-deploy:environment",
    TAG_TARGET: "kimi-deploy:target",
    TAG_OWNER: "kimi-deploy:owner",
    TAG_PROJECT: "the Pulumi project name",
    TAG_EXPIRES_AT: "kimi-deploy:expiresAt / kimi-deploy:trialTtlHours (trials only; prod never expires)",
    TAG_RETAIN: "the toolkit on the weight mirror only (to keep a stack, set kimi-deploy:protect)",
    TAG_ROLE: "the toolkit on the weight mirror only",
}

# Files the weight sync (scripts/node/weight_sync/) writes at the root of a complete copy: the
# per-file sha256 manifest and the completion marker (written last). The sync, the preflight
# mirror check, the user data and the Jobs read these names from here.
MANIFEST_NAME = "manifest.json"
MARKER_NAME = ".weights-complete.json"
# Ranged parts of one S3 object the sync keeps in flight (each its own connection); the
# time-to-ready model multiplies it by the files in flight (weights.SYNC_WORKERS).
S3_PART_CONCURRENCY = 8

# The label of the EKS system node group (components/aws/cluster.py); a stage's publish Job selects it.
SYSTEM_NODE_LABEL = "kimi-deploy/role"
SYSTEM_NODE_ROLE = "system"


def resource_prefix(project: str, stack: str) -> str:
    """A short, DNS-safe prefix for physical names: ``<project>-<stack>``, lowercase, <= 40 chars."""
    raw = re.sub(r"[^a-z0-9-]+", "-", f"{project}-{stack}".lower()).strip("-")
    return raw[:40].rstrip("-")


def eks_cluster_name(project: str, stack: str) -> str:
    """The EKS cluster an ``aws-eks`` stack creates (``components/aws``); preflight and the
    sweeper look it up by this name."""
    return resource_prefix(project, stack)

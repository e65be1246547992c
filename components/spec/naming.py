"""Names and host paths shared by the AWS and Kubernetes edges (one place for each)."""

from __future__ import annotations

# Kubernetes service accounts. The AWS edge binds IAM roles to them (EKS Pod Identity) by
# name before the Kubernetes edge creates them, so both read the names from here.
WEIGHT_SYNC_SERVICE_ACCOUNT = "kimi-weight-sync"
MIRROR_PUBLISH_SERVICE_ACCOUNT = "kimi-mirror-publish"
VLLM_SERVICE_ACCOUNT = "kimi-vllm"

# Host path of the instance-store RAID0: EKS AL2023 nodeadm `localStorage: RAID0` mounts it
# at /mnt/k8s-disks/0 (DESIGN.md section 5); the EC2 user data uses the same path.
NVME_RAID0_HOST_PATH = "/mnt/k8s-disks/0"

# Node labels the GPU node groups carry and the workloads select.
GPU_NODE_LABEL = "kimi-deploy/gpu-node"
TARGET_NODE_LABEL = "kimi-deploy/target"
# Taint on GPU nodes so only GPU workloads land there.
GPU_TAINT_KEY = "kimi-deploy/gpu"

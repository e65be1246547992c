"""The ``kubernetes`` platform: an existing cluster, reached with ``kimi-deploy:kubeconfig``.

``declare_existing_cluster(ctx)`` declares only the cluster's Kubernetes provider and returns a
``PlatformResult`` whose handle (``components/platform.py``) the Kubernetes edge consumes: GPU
placement from ``kubernetes.nodeSelector`` / ``tolerations`` / ``nvmeHostPath``, the mirror only
when config names an existing bucket, no FSx, no Pod Identity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi
import pulumi_kubernetes as k8s

from components.core.config import DeploymentSpec
from components.platform import KubernetesPlatformHandle, PlatformResult

from .common import gpu_placement, service_access

if TYPE_CHECKING:
    from components.context import DeploymentContext

# The provider used to be declared inside the ``kimi-deploy:k8s:Workloads`` component named
# ``workloads`` (``components/k8s/__init__.py``): this alias keeps its URN's history, so a stack
# created before the platform seam keeps its provider (and every object under it) on `pulumi up`
# (https://www.pulumi.com/docs/iac/operations/stack-management/refactoring-with-aliases/).
PROVIDER_NAME = "k8s"
PREVIOUS_PARENT = ("workloads", "kimi-deploy:k8s:Workloads")


def existing_mirror_bucket(spec: DeploymentSpec) -> str | None:
    """The mirror bucket an existing-cluster stack reads: ``storage.mirror.bucketName`` when the
    mirror is enabled and not created by the stack, else None."""
    mirror = spec.config.storage.mirror
    if mirror.enabled and mirror.bucket_name and not mirror.create:
        return mirror.bucket_name
    return None


def declare_existing_cluster(ctx: DeploymentContext) -> PlatformResult:
    """Declare the provider of the existing cluster and return its handle (no stack outputs).

    The provider reads the kubeconfig secret (``ctx.kubeconfig``; config requires it on this
    platform), ``kubernetes.context`` and defaults to ``kubernetes.namespace``.
    """
    spec = ctx.spec
    provider = k8s.Provider(
        PROVIDER_NAME,
        kubeconfig=ctx.kubeconfig,
        context=spec.config.kubernetes.context,
        namespace=spec.config.kubernetes.namespace,
        opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(parent=pulumi.create_urn(*PREVIOUS_PARENT))]),
    )
    bucket = existing_mirror_bucket(spec)
    handle = KubernetesPlatformHandle(
        profile=spec.profile,
        provider=provider,
        placement=gpu_placement(spec),
        service_access=service_access(spec),
        mirror_bucket=pulumi.Output.from_input(bucket) if bucket is not None else None,
    )
    return PlatformResult(outputs={}, kubernetes=handle)

"""Kubernetes workloads (aws-eks and kubernetes platforms): add-ons, namespace, secrets, service
accounts, weight storage, the weight-sync Jobs and the vLLM service.

``declare_workloads(ctx, aws_result)`` is the entry point ``components/program.py`` calls. On
EKS, ``aws_result`` carries the cluster's ``k8s_provider``, the ``mirror_bucket`` name and the
``fsx`` file system; on an existing cluster a provider is built from ``kimi-deploy:kubeconfig``
(or the ambient kubeconfig) and ``kubernetes.context``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.spec.naming import MIRROR_PUBLISH_SERVICE_ACCOUNT, VLLM_SERVICE_ACCOUNT, WEIGHT_SYNC_SERVICE_ACCOUNT
from components.spec.sizing import sync_budget_seconds
from components.spec.weights import sync_steps

from .addons import addons_to_install, declare_addons
from .common import API_KEY_SECRET, API_KEY_SECRET_KEY, HUB_TOKEN_SECRET, HUB_TOKEN_SECRET_KEY, VLLM_NAME, metadata
from .engine_cache import declare_engine_cache_program, engine_cache_pods
from .scaling_edge import declare_scaling_and_observability
from .storage import FsxVolumeSource, declare_fsx_volume
from .vllm_service import MIN_MARKER_WAIT_SECONDS, declare_vllm
from .weight_sync import declare_weight_sync, node_copy_init

TYPE_TOKEN = "kimi-deploy:k8s:Workloads"


@dataclass
class K8sResult:
    """What the Kubernetes edge hands back.

    Attributes:
        outputs: stack outputs (namespace, in-cluster URL, add-ons, Job names, ...).
        component: the ``KimiWorkloads`` component (None only before it is declared).
    """

    outputs: dict[str, Any] = field(default_factory=dict)
    component: KimiWorkloads | None = None


def _fsx_source(fsx: Any) -> FsxVolumeSource | None:
    """The AWS edge's FSx description (object with attributes, or a mapping) as a source."""
    if fsx is None:
        return None
    get = (lambda k: fsx[k]) if isinstance(fsx, dict) else (lambda k: getattr(fsx, k))
    return FsxVolumeSource(get("file_system_id"), get("dns_name"), get("mount_name"), int(get("capacity_gib")))


class KimiWorkloads(pulumi.ComponentResource):
    """Every Kubernetes object of one deployment, under one component.

    Args:
        name: logical name of the component.
        ctx: the ``DeploymentContext`` (spec, sizing, vLLM command, tags, secrets).
        aws_result: the AWS edge's result on ``aws-eks`` (provider, mirror bucket, FSx), else None.
        opts: caller options (merged).
    """

    namespace: pulumi.Output[str]
    service_name: pulumi.Output[str]

    def __init__(self, name: str, ctx: Any, aws_result: Any = None, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TYPE_TOKEN, name, None, opts)
        spec = ctx.spec
        self._ctx = ctx
        self.provider = self._create_provider(ctx, aws_result)
        # Nothing is applied before the cluster has nodes and its managed add-ons (EKS).
        cluster_ready = list(getattr(aws_result, "cluster_ready", None) or [])
        bucket, fsx = self._aws_inputs(ctx, aws_result)
        self.addons = declare_addons(spec, self.provider, self, cluster_ready)
        self.namespace_resource = self._create_namespace(cluster_ready)
        steps = self._sync_steps(bucket, fsx)
        self.secrets = self._create_secrets(needs_hub_token=any(step.needs_hub_token for step in steps))
        self.service_accounts = self._create_service_accounts(publish=bucket is not None)
        prereqs: list[pulumi.Resource] = [self.namespace_resource, *self.secrets.values(), *self.service_accounts.values()]
        self.fsx_volume = None
        if fsx is not None:
            self.fsx_volume = declare_fsx_volume(spec, fsx, self.provider, self, [self.namespace_resource, *cluster_ready])
            prereqs += list(self.fsx_volume)
        program: list[pulumi.Resource] = []
        self.jobs = declare_weight_sync(
            spec, ctx.sizing, ctx.vllm.image, bucket, ctx.hub_token is not None, ctx.tags, self.provider, self, prereqs,
            program_out=program,
        )
        marker_wait = max(MIN_MARKER_WAIT_SECONDS, sum(sync_budget_seconds(spec, ctx.sizing, s) for s in steps))
        # The node-local copy runs in every vLLM pod, on its own node (weights follow the node).
        node_copy = node_copy_init(spec, ctx.sizing, ctx.vllm.image, bucket, ctx.hub_token is not None)
        # The engine caches: restored before vLLM starts, saved after its first healthy start.
        self.engine_cache_program = declare_engine_cache_program(spec, self.provider, self, prereqs)
        if self.engine_cache_program is not None:
            program.append(self.engine_cache_program)
        caches = {r.name: engine_cache_pods(spec, ctx.vllm, r, bucket) for r in ctx.vllm.roles}
        self.vllm = declare_vllm(
            spec, ctx.sizing, ctx.vllm, ctx.tags, marker_wait, self.provider, self,
            [*prereqs, *program, *self.jobs, *self.addons.values()],
            lws_release=self.addons.get("lws"),
            dra_release=self.addons.get("nvidia-dra-driver"),
            node_copy=node_copy,
            engine_cache={name: c for name, c in caches.items() if c is not None},
        )
        self.scaling = declare_scaling_and_observability(ctx, self.vllm, self.addons, self.provider, self, prereqs)
        self.namespace = pulumi.Output.from_input(spec.config.kubernetes.namespace)
        self.service_name = pulumi.Output.from_input(VLLM_NAME)
        self.register_outputs({"namespace": self.namespace, "service_name": self.service_name})

    # -- helpers -------------------------------------------------------------------------------

    def _create_provider(self, ctx: Any, aws_result: Any) -> k8s.Provider:
        provider = getattr(aws_result, "k8s_provider", None)
        if provider is not None:
            return provider
        spec = ctx.spec
        if spec.platform == "aws-eks":
            # Never fall back to the ambient kubeconfig on EKS: it may name another cluster.
            raise ValueError("aws-eks: the AWS edge's result has no k8s_provider for the EKS cluster")
        return k8s.Provider(
            "k8s",
            kubeconfig=ctx.kubeconfig,
            context=spec.config.kubernetes.context,
            namespace=spec.config.kubernetes.namespace,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _aws_inputs(self, ctx: Any, aws_result: Any) -> tuple[Any, FsxVolumeSource | None]:
        """The mirror bucket name (Output or str, None without a mirror) and the FSx source."""
        spec = ctx.spec
        mirror = spec.config.storage.mirror
        bucket = getattr(aws_result, "mirror_bucket", None) if mirror.enabled else None
        if bucket is None and mirror.enabled and mirror.bucket_name and not mirror.create:
            bucket = mirror.bucket_name  # an existing mirror named in config
        if bucket is None and mirror.enabled and spec.is_aws:
            raise ValueError("the mirror is enabled but the AWS edge's result has no mirror_bucket")
        fsx = _fsx_source(getattr(aws_result, "fsx", None))
        if fsx is None and spec.config.storage.kind in ("fsx", "nvme-from-fsx"):
            raise ValueError(f"storage.kind {spec.config.storage.kind}: the AWS edge's result has no fsx file system")
        return bucket, fsx

    def _sync_steps(self, bucket: Any, fsx: FsxVolumeSource | None) -> tuple:
        """The sync runs (``spec/weights.py``), computed with a stand-in bucket name: which runs
        happen depends only on whether there is a mirror (the Jobs recompute argv with the name)."""
        return sync_steps(self._ctx.spec, "mirror-bucket" if bucket is not None else None)

    def _opts(self, *depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self.provider, depends_on=list(depends_on))

    def _create_namespace(self, cluster_ready: list[pulumi.Resource]) -> k8s.core.v1.Namespace:
        spec = self._ctx.spec
        meta = metadata(spec, spec.config.kubernetes.namespace, "namespace", self._ctx.tags, namespaced=False)
        return k8s.core.v1.Namespace("namespace", metadata=meta, opts=self._opts(*cluster_ready))

    def _create_secrets(self, needs_hub_token: bool) -> dict[str, k8s.core.v1.Secret]:
        """The API key and (when a sync reads the hub and a token is set) the hub token, as
        Secrets from Pulumi secrets; workloads read them only through secretKeyRef."""
        spec, ctx = self._ctx.spec, self._ctx
        out = {
            "api_key": k8s.core.v1.Secret(
                "vllm-api-key",
                metadata=metadata(spec, API_KEY_SECRET, "credentials"),
                type="Opaque",
                string_data={API_KEY_SECRET_KEY: pulumi.Output.secret(ctx.api_key)},
                opts=self._opts(self.namespace_resource),
            )
        }
        if needs_hub_token and ctx.hub_token is not None:
            out["hub_token"] = k8s.core.v1.Secret(
                "hub-token",
                metadata=metadata(spec, HUB_TOKEN_SECRET, "credentials"),
                type="Opaque",
                string_data={HUB_TOKEN_SECRET_KEY: pulumi.Output.secret(ctx.hub_token)},
                opts=self._opts(self.namespace_resource),
            )
        return out

    def _create_service_accounts(self, publish: bool) -> dict[str, k8s.core.v1.ServiceAccount]:
        """Service accounts named in ``spec/naming.py`` (the AWS edge binds Pod Identity roles to
        them by name); no API token is mounted, the pods never call the Kubernetes API."""
        spec = self._ctx.spec
        names = {"vllm": VLLM_SERVICE_ACCOUNT, "weight_sync": WEIGHT_SYNC_SERVICE_ACCOUNT}
        if publish:
            names["mirror_publish"] = MIRROR_PUBLISH_SERVICE_ACCOUNT
        return {
            key: k8s.core.v1.ServiceAccount(
                f"sa-{name}",
                metadata=metadata(spec, name, "service-account"),
                automount_service_account_token=False,
                opts=self._opts(self.namespace_resource),
            )
            for key, name in names.items()
        }


def declare_workloads(ctx: Any, aws_result: Any) -> K8sResult:
    """Declare the Kubernetes side of a deployment and return its stack outputs.

    Outputs: ``kubernetesNamespace``, ``serviceUrl`` (in-cluster), ``vllmWorkload`` (kind),
    ``kubernetesAddons`` (installed here), ``weightSyncJobs`` (Job names), and for an internal
    NLB ``loadBalancerHostname``.
    """
    spec = ctx.spec
    component = KimiWorkloads("workloads", ctx, aws_result)
    namespace = spec.config.kubernetes.namespace
    outputs: dict[str, Any] = {
        "kubernetesNamespace": namespace,
        "serviceUrl": f"http://{VLLM_NAME}.{namespace}.svc.cluster.local:{ctx.vllm.port}/v1",
        "vllmWorkload": "LeaderWorkerSet" if len(ctx.vllm.roles) > 1 else "Deployment",
        "kubernetesAddons": list(addons_to_install(spec)),
        "weightSyncJobs": [job.metadata.apply(lambda m: m.name if m else None) for job in component.jobs],
    }
    if spec.config.kubernetes.service_type == "internal-nlb":
        service = component.vllm["service"]
        outputs["loadBalancerHostname"] = service.status.apply(
            lambda s: (
                (s.load_balancer.ingress or [None])[0].hostname if s and s.load_balancer and s.load_balancer.ingress else None
            )
        )
    return K8sResult(outputs=outputs, component=component)


__all__ = ["K8sResult", "KimiWorkloads", "declare_workloads"]

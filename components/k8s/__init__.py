"""Kubernetes workloads (aws-eks and kubernetes platforms): add-ons, namespace, secrets, service
accounts, weight storage, the weight-sync Jobs and the vLLM service.

``declare_workloads(ctx, handle)`` is the entry point ``components/program.py`` calls. Everything
that differs by platform comes from the ``KubernetesPlatformHandle`` (``components/platform.py``):
the provider, GPU placement, the mirror bucket's name, the FSx file system, the Service's client
CIDRs and the Pod Identity roles. On ``aws-eks`` the AWS edge builds it (``components/aws``); on
an existing cluster ``existing_cluster.py`` builds it from ``kimi-deploy:kubeconfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_kubernetes as k8s

from components.core.naming import (
    MIRROR_PUBLISH_SERVICE_ACCOUNT,
    SYSTEM_NODE_LABEL,
    SYSTEM_NODE_ROLE,
    VLLM_CLIENT_SERVICE,
    VLLM_SERVICE_ACCOUNT,
    WEIGHT_SYNC_SERVICE_ACCOUNT,
)
from components.core.sizing import sync_budget_seconds
from components.core.weights import SHAPE_BUCKET, SyncStep, sync_steps
from components.platform import GpuPlacement, KubernetesPlatformHandle

from .addons import addons_to_install, declare_addons
from .common import API_KEY_SECRET, API_KEY_SECRET_KEY, HUB_TOKEN_SECRET, HUB_TOKEN_SECRET_KEY, metadata
from .engine_cache import declare_engine_cache_program, engine_cache_pods
from .scaling_edge import declare_scaling_and_observability
from .storage import declare_fsx_volume
from .vllm_service import MIN_MARKER_WAIT_SECONDS, declare_vllm
from .weight_sync import declare_weight_sync, node_copy_init

if TYPE_CHECKING:
    from components.context import DeploymentContext

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


def check_handle(ctx: DeploymentContext, handle: KubernetesPlatformHandle) -> None:
    """The handle holds what the spec needs: a mirror bucket when the mirror is enabled on a
    platform that provisions it, an FSx file system for ``storage.kind`` ``fsx`` /
    ``nvme-from-fsx``, and the profile of the spec's platform.

    Raises:
        ValueError: a platform module handed the edge an incomplete handle (a programming error).
    """
    spec = ctx.spec
    if handle.profile.name != spec.platform:
        raise ValueError(f"the Kubernetes handle is for platform {handle.profile.name}, the spec's is {spec.platform}")
    if handle.mirror_bucket is None and spec.config.storage.mirror.enabled and handle.profile.provisions_aws:
        raise ValueError("the mirror is enabled but the platform handle has no mirror_bucket")
    if handle.fsx is None and spec.config.storage.kind in ("fsx", "nvme-from-fsx"):
        raise ValueError(f"storage.kind {spec.config.storage.kind}: the platform handle has no fsx file system")


class KimiWorkloads(pulumi.ComponentResource):
    """Every Kubernetes object of one deployment, under one component.

    Args:
        name: logical name of the component.
        ctx: the ``DeploymentContext`` (spec, sizing, vLLM command, tags, secrets).
        handle: the platform's ``KubernetesPlatformHandle`` (provider, placement, mirror, FSx, ...).
        opts: caller options (merged).

    Raises:
        ValueError: an incomplete handle (``check_handle``), or a Pod Identity role bound to a
            service account this component does not create.
    """

    namespace: pulumi.Output[str]
    service_name: pulumi.Output[str]

    def __init__(
        self, name: str, ctx: DeploymentContext, handle: KubernetesPlatformHandle, opts: pulumi.ResourceOptions | None = None
    ):
        check_handle(ctx, handle)
        super().__init__(TYPE_TOKEN, name, None, opts)
        spec = ctx.spec
        self._ctx = ctx
        self.provider = handle.provider
        # Nothing is applied before the cluster has nodes and its managed add-ons (EKS).
        cluster_ready = list(handle.cluster_ready)
        bucket, fsx, placement = handle.mirror_bucket, handle.fsx, handle.placement
        # phase: stage (config/phase.py): no add-on (device plugins, DRA, LWS, KEDA serve GPUs), no vLLM.
        self.addons = {} if spec.staging else declare_addons(spec, placement, self.provider, self, cluster_ready)
        self.namespace_resource = self._create_namespace(cluster_ready)
        steps = self._sync_steps(bucket)
        self.secrets = self._create_secrets(needs_hub_token=any(step.needs_hub_token for step in steps))
        self.service_accounts = self._create_service_accounts(publish=bucket is not None)
        unbound = sorted(set(handle.pod_identity_roles) - set(self._service_account_names(bucket is not None).values()))
        if unbound:
            raise ValueError(f"Pod Identity roles are bound to service accounts the workloads do not create: {unbound}")
        prereqs: list[pulumi.Resource] = [self.namespace_resource, *self.secrets.values(), *self.service_accounts.values()]
        self.fsx_volume = None
        if fsx is not None:
            self.fsx_volume = declare_fsx_volume(spec, fsx, self.provider, self, [self.namespace_resource, *cluster_ready])
            prereqs += list(self.fsx_volume)
        program: list[pulumi.Resource] = []
        stage_on_system_nodes = handle.profile.stages_on_system_nodes if spec.staging else None
        if stage_on_system_nodes:
            placement = GpuPlacement({SYSTEM_NODE_LABEL: SYSTEM_NODE_ROLE}, (), placement.nvme_host_path)
        self.jobs = declare_weight_sync(
            spec, ctx.sizing, ctx.vllm.image, bucket, ctx.hub_token is not None, ctx.tags, self.provider, self, prereqs,
            placement, program_out=program, stage_on_system_nodes=stage_on_system_nodes,
        )
        if spec.staging:
            self.engine_cache_program = None
            self.vllm = {}
            self.scaling = None
            self.namespace = pulumi.Output.from_input(spec.config.kubernetes.namespace)
            self.service_name = pulumi.Output.from_input(VLLM_CLIENT_SERVICE)
            self.register_outputs({"namespace": self.namespace})
            return
        marker_wait = max(MIN_MARKER_WAIT_SECONDS, sum(sync_budget_seconds(spec, ctx.sizing, s) for s in steps))
        # The node-local copy runs in every vLLM pod, on its own node (weights follow the node).
        node_copy = node_copy_init(spec, ctx.sizing, ctx.vllm.image, bucket, ctx.hub_token is not None, placement.nvme_host_path)
        # The engine caches: restored before vLLM starts, saved after its first healthy start.
        self.engine_cache_program = declare_engine_cache_program(spec, self.provider, self, prereqs)
        if self.engine_cache_program is not None:
            program.append(self.engine_cache_program)
        caches = {r.name: engine_cache_pods(spec, ctx.vllm, r, bucket, placement.nvme_host_path) for r in ctx.vllm.roles}
        self.vllm = declare_vllm(
            spec, ctx.sizing, ctx.vllm, ctx.tags, marker_wait, self.provider, self,
            [*prereqs, *program, *self.jobs, *self.addons.values()],
            lws_release=self.addons.get("lws"),
            dra_release=self.addons.get("nvidia-dra-driver"),
            placement=placement,
            access=handle.service_access,
            node_copy=node_copy,
            engine_cache={name: c for name, c in caches.items() if c is not None},
        )
        self.scaling = declare_scaling_and_observability(
            spec, ctx.sizing, ctx.vllm, self.vllm, self.addons, self.provider, self, prereqs
        )
        self.namespace = pulumi.Output.from_input(spec.config.kubernetes.namespace)
        self.service_name = pulumi.Output.from_input(VLLM_CLIENT_SERVICE)
        self.register_outputs({"namespace": self.namespace, "service_name": self.service_name})

    # -- helpers -------------------------------------------------------------------------------

    def _sync_steps(self, bucket: pulumi.Output[str] | None) -> tuple[SyncStep, ...]:
        """The sync runs (``spec/weights.py``), computed with a stand-in bucket name: which runs
        happen depends only on whether there is a mirror (the Jobs recompute argv with the name)."""
        return sync_steps(self._ctx.spec, SHAPE_BUCKET if bucket is not None else None)

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
        api_key: pulumi.Output[str] = pulumi.Output.secret(ctx.api_key)
        out = {
            "api_key": k8s.core.v1.Secret(
                "vllm-api-key",
                metadata=metadata(spec, API_KEY_SECRET, "credentials"),
                type="Opaque",
                string_data={API_KEY_SECRET_KEY: api_key},
                opts=self._opts(self.namespace_resource),
            )
        }
        if needs_hub_token and ctx.hub_token is not None:
            hub_token: pulumi.Output[str] = pulumi.Output.secret(ctx.hub_token)
            out["hub_token"] = k8s.core.v1.Secret(
                "hub-token",
                metadata=metadata(spec, HUB_TOKEN_SECRET, "credentials"),
                type="Opaque",
                string_data={HUB_TOKEN_SECRET_KEY: hub_token},
                opts=self._opts(self.namespace_resource),
            )
        return out

    @staticmethod
    def _service_account_names(publish: bool) -> dict[str, str]:
        """Role -> service account name (``spec/naming.py``): vLLM, weight sync, and the mirror
        publisher when there is a mirror."""
        names = {"vllm": VLLM_SERVICE_ACCOUNT, "weight_sync": WEIGHT_SYNC_SERVICE_ACCOUNT}
        if publish:
            names["mirror_publish"] = MIRROR_PUBLISH_SERVICE_ACCOUNT
        return names

    def _create_service_accounts(self, publish: bool) -> dict[str, k8s.core.v1.ServiceAccount]:
        """Service accounts named in ``spec/naming.py`` (the AWS edge binds Pod Identity roles to
        them by name); no API token is mounted, the pods never call the Kubernetes API."""
        spec = self._ctx.spec
        names = self._service_account_names(publish)
        # kubernetes.mirrorCredentials.serviceAccountAnnotations: the cluster's workload identity
        # (e.g. IRSA's role ARN) on the accounts whose pods publish to or read the mirror.
        creds = spec.config.kubernetes.mirror_credentials
        identity = dict(creds.service_account_annotations) if creds is not None else {}
        return {
            key: k8s.core.v1.ServiceAccount(
                f"sa-{name}",
                metadata=metadata(spec, name, "service-account",
                                  annotations=identity if identity and key in ("weight_sync", "mirror_publish") else None),
                automount_service_account_token=False,
                opts=self._opts(self.namespace_resource),
            )
            for key, name in names.items()
        }


def _load_balancer_hostname(status: k8s.core.v1.outputs.ServiceStatus | None) -> str | None:
    """The first ingress hostname of a LoadBalancer Service's status, or None (not provisioned)."""
    ingress = status.load_balancer.ingress if status and status.load_balancer else None
    return ingress[0].hostname if ingress else None


def declare_workloads(ctx: DeploymentContext, handle: KubernetesPlatformHandle) -> K8sResult:
    """Declare the Kubernetes side of a deployment on the platform of ``handle`` and return its
    stack outputs.

    Outputs: ``kubernetesNamespace``, ``serviceUrl`` (in-cluster, through the client Service
    ``naming.VLLM_CLIENT_SERVICE``), ``vllmWorkload`` (kind),
    ``kubernetesAddons`` (installed here), ``weightSyncJobs`` (Job names), and for an internal
    NLB ``loadBalancerHostname``.

    Raises:
        ValueError: an incomplete handle (``check_handle``).
    """
    spec = ctx.spec
    component = KimiWorkloads("workloads", ctx, handle)
    namespace = spec.config.kubernetes.namespace
    jobs = [job.metadata.apply(lambda m: m.name if m else None) for job in component.jobs]
    if spec.staging:  # the publish Job only (config/phase.py)
        return K8sResult(outputs={"kubernetesNamespace": namespace, "kubernetesAddons": [], "weightSyncJobs": jobs},
                         component=component)
    outputs: dict[str, Any] = {
        "kubernetesNamespace": namespace,
        "serviceUrl": f"http://{VLLM_CLIENT_SERVICE}.{namespace}.svc.cluster.local:{ctx.vllm.port}/v1",
        "vllmWorkload": "LeaderWorkerSet" if len(ctx.vllm.roles) > 1 else "Deployment",
        "kubernetesAddons": list(addons_to_install(spec)),
        "weightSyncJobs": jobs,
    }
    if handle.service_access.service_type == "internal-nlb":
        service = component.vllm["service"]
        if not isinstance(service, k8s.core.v1.Service):
            raise TypeError(f"the vLLM service is a {type(service).__name__}, not a Service")
        outputs["loadBalancerHostname"] = service.status.apply(_load_balancer_hostname)
    return K8sResult(outputs=outputs, component=component)


__all__ = ["K8sResult", "KimiWorkloads", "check_handle", "declare_workloads"]

"""Objects the controllers of a deployment create on their own, and the check that nothing the
stack declares takes one of their names.

A controller that reconciles an object we declare creates more objects beside it, named after
it. If the stack declares an object of the same kind and name in the same namespace, one of the
two creates fails with AlreadyExists: ``pulumi up`` fails once the controller got there first (the
LeaderWorkerSet controller creates its headless Service as soon as the set exists, so a client
Service declared after the set with the set's name fails hours into a first deploy), or the
controller fails or adopts an object that was never its own.

``CREATED_OBJECTS`` is the table: per row, the kind of the declared object that triggers it, what
is created, where, the name as a full-match regular expression over the owner (its name and spec),
and the source the row was read from. ``created_by`` expands the rows for one declared object,
``collisions`` checks a stack's declared objects against everything they make controllers create.

Objects a controller creates in a namespace it owns (an add-on chart's release namespace) are a
wildcard row: the chart's templates render into that namespace, so the stack must declare nothing
there. Controllers the stack relies on but does not install (the Prometheus Operator: rule-file
ConfigMaps and the ``prometheus-operated`` Service in its Prometheus's namespace; the AMD GPU
Operator) create nothing in the workload namespace and have no row.

Pure (no Pulumi): the tests read declared objects from the recorded plan and call ``collisions``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .versions import HELM_CHARTS

# kubernetes-sigs/lws v0.9.0, api/leaderworkerset/v1/leaderworkerset_types.go: labels the
# LeaderWorkerSet controller and its pod webhook put on every pod of a group.
LWS_SET_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# One value per group, the same on the leader and every worker: the pod webhook gives the leader
# sha1("<namespace>/<leader pod name>") (pkg/webhooks/pod_webhook.go genGroupUniqueKey), and the worker
# StatefulSet's template copies the leader's (pkg/controllers/pod_controller.go
# constructWorkerStatefulSetApplyConfiguration, labelMap). The webhook runs before the API server
# merges ``matchLabelKeys`` into a pod's affinity (mutating admission precedes PrepareForCreate).
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
# The leader's worker index: the leader StatefulSet's pod template carries worker-index "0"
# (pkg/controllers/leaderworkerset_controller.go constructLeaderStatefulSetApplyConfiguration);
# the pod webhook gives each worker its StatefulSet ordinal, from 1 (pkg/webhooks/pod_webhook.go
# Default; the worker StatefulSet's ordinals start at 1); pkg/utils/pod/pod_utils.go LeaderPod
# tests exactly this label, and the controller's own HPA selector uses it ("select leaders").
LWS_LEADER_WORKER_INDEX = "0"

# Helm's release record: a Secret named sh.helm.release.v1.<release>.v<revision> in the release
# namespace (helm/helm pkg/storage/storage.go HelmStorageType and makeKey, the Secrets driver by default).
HELM_RELEASE_SECRET_PREFIX = "sh.helm.release.v1."
# A kind a declared Helm release is given here (pulumi-kubernetes helm.v3.Release is no
# Kubernetes object): ``{"kind": HELM_RELEASE_KIND, "metadata": {"name", "namespace"},
# "spec": {"createNamespace": bool}}``.
HELM_RELEASE_KIND = "HelmRelease"
# Any kind (a wildcard row).
ANY_KIND = "*"

# Name alphabets, as regular expressions.
# k8s.io/apimachinery/pkg/util/rand SafeEncodeString: the pod-template-hash of a ReplicaSet
# (pkg/controller/controller_utils.go ComputeHash) and the suffix of generated names.
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]+"
_ORDINAL = "[0-9]+"
_HASH = "[0-9a-z]+"
_UID = "[0-9a-f-]{36}"


@dataclass(frozen=True)
class ObjectRef:
    """A Kubernetes object's identity.

    Attributes:
        kind: ``Service``, ``ReplicaSet``, ... (``ANY_KIND`` in a wildcard pattern).
        namespace: its namespace, or None when cluster-scoped.
        name: its name.
    """

    kind: str
    namespace: str | None
    name: str


@dataclass(frozen=True)
class CreatedObjects:
    """One row of ``CREATED_OBJECTS``: what a controller creates for one kind of declared object.

    Attributes:
        controller: who creates it (controller and version).
        owner_kind: the declared kind that triggers it.
        kind: the kind created (``ANY_KIND``: every kind).
        scope: where: ``owner`` (the owner's namespace), ``cluster`` (cluster-scoped), or a fixed
            namespace name.
        names: the owner's manifest -> full-match regular expressions of the created names
            (empty: this owner's spec makes the controller create none).
        source: the file and function the row was read from, at a tag.
    """

    controller: str
    owner_kind: str
    kind: str
    scope: str
    names: Callable[[Mapping[str, Any]], tuple[str, ...]]
    source: str


@dataclass(frozen=True)
class CreatedPattern:
    """Objects one declared owner makes a controller create.

    Attributes:
        row: the table row.
        owner: the declared object.
        kind: the kind created (``ANY_KIND``: every kind).
        namespace: the namespace, or None when cluster-scoped.
        name_regex: full-match regular expression of the names.
    """

    row: CreatedObjects
    owner: ObjectRef
    kind: str
    namespace: str | None
    name_regex: str

    def matches(self, ref: ObjectRef) -> bool:
        """Whether ``ref`` (a declared object) is one of these objects: same kind, namespace and a
        matching name."""
        return (
            self.kind in (ANY_KIND, ref.kind)
            and self.namespace == ref.namespace
            and re.fullmatch(self.name_regex, ref.name) is not None
        )


def _name(manifest: Mapping[str, Any]) -> str:
    return str((manifest.get("metadata") or {}).get("name") or "")


def _spec(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    return manifest.get("spec") or {}


def _lws_subdomain_policy(manifest: Mapping[str, Any]) -> str:
    """``spec.networkConfig.subdomainPolicy`` of a LeaderWorkerSet; ``Shared`` when unset (the
    CRD's default, and the controller's reading of a nil networkConfig)."""
    return str((_spec(manifest).get("networkConfig") or {}).get("subdomainPolicy") or "Shared")


def _lws_services(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    name = re.escape(_name(manifest))
    if _lws_subdomain_policy(manifest) == "Shared":
        return (name,)
    return (f"{name}-{_ORDINAL}",)  # UniquePerReplica: one per leader pod, named after it


def _keda_hpa(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    advanced = _spec(manifest).get("advanced") or {}
    custom = (advanced.get("horizontalPodAutoscalerConfig") or {}).get("name")
    return (re.escape(str(custom)),) if custom else (f"keda-hpa-{re.escape(_name(manifest))}",)


def _compute_domain_channel_template(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    template = ((_spec(manifest).get("channel") or {}).get("resourceClaimTemplate") or {}).get("name")
    return (re.escape(str(template)),) if template else ()


def _release_namespace(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    if not _spec(manifest).get("createNamespace"):
        return ()
    return (re.escape(str((manifest.get("metadata") or {}).get("namespace") or "")),)


_LWS = "LeaderWorkerSet controller (kubernetes-sigs/lws v0.9.0)"
_KCM = "kube-controller-manager (kubernetes)"
_LWS_SRC = "https://github.com/kubernetes-sigs/lws/blob/v0.9.0/"
_K8S_SRC = "https://github.com/kubernetes/kubernetes/blob/master/"
_DRA = "ComputeDomain controller (NVIDIA/k8s-dra-driver-gpu v25.12.0)"
_DRA_SRC = "https://github.com/NVIDIA/k8s-dra-driver-gpu/blob/v25.12.0/cmd/compute-domain-controller/"
# The DRA driver's release namespace: where its controller creates the per-domain IMEX daemons.
_DRA_NAMESPACE = HELM_CHARTS["nvidia-dra-driver"].namespace


def _exact(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    return (re.escape(_name(manifest)),)


def _suffixed(pattern: str) -> Callable[[Mapping[str, Any]], tuple[str, ...]]:
    return lambda manifest: (f"{re.escape(_name(manifest))}-{pattern}",)


def _fixed(*patterns: str) -> Callable[[Mapping[str, Any]], tuple[str, ...]]:
    return lambda manifest: patterns


CREATED_OBJECTS: tuple[CreatedObjects, ...] = (
    # -- LeaderWorkerSet (kubernetes-sigs/lws v0.9.0) ------------------------------------------
    CreatedObjects(
        _LWS, "LeaderWorkerSet", "Service", "owner", _lws_services,
        # Headless (clusterIP None, publishNotReadyAddresses) with selector {name label: <lws>}: every
        # pod of every group. $(LWS_LEADER_ADDRESS) (<lws>-<group>.<service>.<ns>) resolves through it.
        _LWS_SRC + "pkg/controllers/leaderworkerset_controller.go (reconcileHeadlessServices); "
        "pkg/utils/controller/controller_utils.go (CreateHeadlessServiceIfNotExists); "
        "pkg/controllers/pod_controller.go (UniquePerReplica: one per leader pod)",
    ),
    CreatedObjects(
        _LWS, "LeaderWorkerSet", "StatefulSet", "owner", _exact,
        _LWS_SRC + "pkg/controllers/leaderworkerset_controller.go (constructLeaderStatefulSetApplyConfiguration: "
        "StatefulSet(lws.Name, lws.Namespace))",
    ),
    CreatedObjects(
        _LWS, "LeaderWorkerSet", "StatefulSet", "owner", _suffixed(_ORDINAL),
        _LWS_SRC + "pkg/controllers/pod_controller.go (constructWorkerStatefulSetApplyConfiguration: one per "
        "group, named after its leader pod <lws>-<group>)",
    ),
    CreatedObjects(
        _LWS, "LeaderWorkerSet", "ControllerRevision", "owner", _suffixed(f"{_HASH}-{_ORDINAL}"),
        _LWS_SRC + "pkg/utils/revision/revision_utils.go (NewRevision, revisionName: <lws>-<hash>-<revision>)",
    ),
    CreatedObjects(
        "StatefulSet controller (kubernetes), under the LeaderWorkerSet's StatefulSets", "LeaderWorkerSet", "Pod",
        "owner", _suffixed(f"{_ORDINAL}(-{_ORDINAL})?"),
        # Leaders <lws>-<group>, workers <lws>-<group>-<index>.
        _K8S_SRC + "pkg/controller/statefulset/stateful_set_utils.go (getPodName: <set>-<ordinal>)",
    ),
    # -- Deployment, Job, Service, Namespace (kube-controller-manager) ------------------------------
    CreatedObjects(
        _KCM, "Deployment", "ReplicaSet", "owner", _suffixed(_SAFE),
        _K8S_SRC + "pkg/controller/deployment/sync.go (getNewReplicaSet: d.Name + \"-\" + podTemplateSpecHash)",
    ),
    CreatedObjects(
        _KCM, "Deployment", "Pod", "owner", _suffixed(f"{_SAFE}-{_SAFE}"),
        _K8S_SRC + "pkg/controller/replicaset/replica_set.go (pods of the ReplicaSet: generateName <rs>-)",
    ),
    CreatedObjects(
        _KCM, "Job", "Pod", "owner", _suffixed(f"({_ORDINAL}-)?{_SAFE}"),
        _K8S_SRC + "pkg/controller/job/job_controller.go (generateName <job>-, <job>-<index>- when Indexed)",
    ),
    CreatedObjects(
        _KCM, "Service", "Endpoints", "owner", _exact,
        _K8S_SRC + "pkg/controller/endpoint/endpoints_controller.go (syncService: Endpoints named after the Service)",
    ),
    CreatedObjects(
        _KCM, "Service", "EndpointSlice", "owner", _suffixed(_SAFE),
        "https://github.com/kubernetes/endpointslice/blob/master/utils.go (newEndpointSlice: generateName <service>-)",
    ),
    CreatedObjects(
        _KCM, "Namespace", "ServiceAccount", "owner-is-namespace", _fixed("default"),
        _K8S_SRC + "pkg/controller/serviceaccount/serviceaccounts_controller.go (DefaultServiceAccountsControllerOptions)",
    ),
    CreatedObjects(
        _KCM, "Namespace", "ConfigMap", "owner-is-namespace", _fixed(re.escape("kube-root-ca.crt")),
        _K8S_SRC + "pkg/controller/certificates/rootcacertpublisher/publisher.go (RootCACertConfigMapName)",
    ),
    # -- KEDA ------------------------------------------------------------------------------------
    CreatedObjects(
        "KEDA operator (kedacore/keda v2.20.2)", "ScaledObject", "HorizontalPodAutoscaler", "owner", _keda_hpa,
        "https://github.com/kedacore/keda/blob/v2.20.2/controllers/keda/hpa.go (getHPAName: "
        "spec.advanced.horizontalPodAutoscalerConfig.name, else keda-hpa-<scaledobject>)",
    ),
    # -- NVIDIA DRA driver ---------------------------------------------------------------------------
    CreatedObjects(
        _DRA, "ComputeDomain", "ResourceClaimTemplate", "owner", _compute_domain_channel_template,
        _DRA_SRC + "computedomain.go (resourceClaimTemplateManager.Create(cd.Namespace, "
        "cd.Spec.Channel.ResourceClaimTemplate.Name))",
    ),
    CreatedObjects(
        _DRA, "ComputeDomain", "DaemonSet", _DRA_NAMESPACE, _fixed(f"computedomain-daemon-{_UID}"),
        _DRA_SRC + "daemonset.go (computedomain-daemon-<cd uid> in the driver namespace)",
    ),
    CreatedObjects(
        _DRA, "ComputeDomain", "ResourceClaimTemplate", _DRA_NAMESPACE, _fixed(f"computedomain-daemon-{_UID}"),
        _DRA_SRC + "resourceclaimtemplate.go (DaemonSetResourceClaimTemplateManager.Create)",
    ),
    # -- Helm releases of the add-ons (components/k8s/addons.py) -------------------------------------
    CreatedObjects(
        "Helm (pulumi-kubernetes helm.v3.Release)", HELM_RELEASE_KIND, "Namespace", "cluster", _release_namespace,
        "https://www.pulumi.com/registry/packages/kubernetes/api-docs/helm/v3/release/ (createNamespace: "
        "helm install --create-namespace)",
    ),
    CreatedObjects(
        "Helm (pulumi-kubernetes helm.v3.Release)", HELM_RELEASE_KIND, "Secret", "owner",
        lambda m: (re.escape(HELM_RELEASE_SECRET_PREFIX + _name(m)) + r"\.v[0-9]+",),
        "https://github.com/helm/helm/blob/main/pkg/storage/storage.go (HelmStorageType, makeKey: "
        "sh.helm.release.v1.<release>.v<n>; the same since Helm v3.0.0)",
    ),
    CreatedObjects(
        "the add-on chart's templates", HELM_RELEASE_KIND, ANY_KIND, "owner", _fixed(".*"),
        # A chart renders every namespaced object into the release namespace (helm install -n).
        "https://helm.sh/docs/helm/helm_install/ (--namespace: the release namespace)",
    ),
)


def _ref(manifest: Mapping[str, Any]) -> ObjectRef:
    meta = manifest.get("metadata") or {}
    namespace = meta.get("namespace")
    return ObjectRef(str(manifest.get("kind") or ""), str(namespace) if namespace else None, str(meta.get("name") or ""))


def created_by(manifest: Mapping[str, Any]) -> list[CreatedPattern]:
    """Everything the table says controllers create for one declared object.

    Args:
        manifest: the declared object as the API spells it (``kind``, ``metadata.name``,
            ``metadata.namespace``, ``spec``); a Helm release as ``HELM_RELEASE_KIND``.

    Returns:
        One ``CreatedPattern`` per created name pattern (empty for kinds no controller acts on).
    """
    owner = _ref(manifest)
    out: list[CreatedPattern] = []
    for row in CREATED_OBJECTS:
        if row.owner_kind != owner.kind:
            continue
        namespace: str | None
        if row.scope == "owner":
            namespace = owner.namespace
        elif row.scope == "owner-is-namespace":
            namespace = owner.name
        elif row.scope == "cluster":
            namespace = None
        else:
            namespace = row.scope
        out += [CreatedPattern(row, owner, row.kind, namespace, regex) for regex in row.names(manifest)]
    return out


def collisions(declared: Iterable[Mapping[str, Any]]) -> list[tuple[ObjectRef, CreatedPattern]]:
    """Declared objects whose kind, namespace and name are those of an object a controller creates
    for another declared object (``created_by`` of each).

    Args:
        declared: every object the stack declares (manifests, Helm releases as ``HELM_RELEASE_KIND``).

    Returns:
        ``(declared object, what creates the same object)`` pairs; empty when nothing collides.
    """
    manifests = list(declared)
    created = [pattern for m in manifests for pattern in created_by(m)]
    found: list[tuple[ObjectRef, CreatedPattern]] = []
    for manifest in manifests:
        ref = _ref(manifest)
        if ref.kind == HELM_RELEASE_KIND:
            continue
        found += [(ref, pattern) for pattern in created if pattern.owner != ref and pattern.matches(ref)]
    return found


def lws_pod_labels(
    lws_name: str, template_labels: Mapping[str, str], group_index: int, worker_index: int
) -> dict[str, str]:
    """The labels a pod of a LeaderWorkerSet group carries: its template's labels plus those the
    controller and its pod webhook add (kubernetes-sigs/lws v0.9.0: the leader StatefulSet's
    template labels, ``constructLeaderStatefulSetApplyConfiguration``; the worker StatefulSet's,
    ``constructWorkerStatefulSetApplyConfiguration``; the webhook's group and worker indexes,
    ``pkg/webhooks/pod_webhook.go Default``). Group keys and revision hashes are left out (values
    no selector of ours can know).

    Args:
        lws_name: the LeaderWorkerSet's name.
        template_labels: the labels of the leader template (``worker_index`` 0) or worker template.
        group_index: the group (replica) index, from 0.
        worker_index: 0 for the leader, 1.. for the workers.
    """
    labels = dict(template_labels)
    labels[LWS_SET_NAME_LABEL] = lws_name
    labels[LWS_GROUP_INDEX_LABEL] = str(group_index)
    labels[LWS_WORKER_INDEX_LABEL] = LWS_LEADER_WORKER_INDEX if worker_index == 0 else str(worker_index)
    return labels


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a Service's equality selector (``spec.selector``) selects a pod with ``labels``
    (every pair present; an empty selector selects nothing for a Service: no Endpoints are managed)."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


__all__ = [
    "ANY_KIND", "CREATED_OBJECTS", "HELM_RELEASE_KIND", "HELM_RELEASE_SECRET_PREFIX", "LWS_GROUP_INDEX_LABEL",
    "LWS_GROUP_KEY_LABEL",
    "LWS_LEADER_WORKER_INDEX", "LWS_SET_NAME_LABEL", "LWS_WORKER_INDEX_LABEL", "CreatedObjects", "CreatedPattern",
    "ObjectRef", "collisions", "created_by", "lws_pod_labels", "selector_matches",
]

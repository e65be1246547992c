"""``kubernetes``: host path, field schemas and limits, namespaces, EKS admins, the EKS version and
its support calendar, add-ons, the kubeconfig."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from .. import k8s_schema, limits, naming
from ..errors import ConfigError
from ..platforms import PlatformProfile
from ..targets import TargetProfile
from .patterns import DNS_LABEL_RE, IAM_PRINCIPAL_ARN_RE, path_segments_problem
from .raw import RawConfig

# Namespaces every cluster creates for itself (Kubernetes docs, "Namespaces": initial namespaces).
SYSTEM_NAMESPACES: tuple[str, ...] = ("default", "kube-node-lease", "kube-public", "kube-system")


def check_kubernetes(
    raw: RawConfig, platform: PlatformProfile, stack: str, project: str, now: datetime,
    secrets_set: frozenset[str] | set[str], warnings: list[str],
) -> None:
    """``kubernetes.*`` (``check_kubernetes_fields_and_limits`` for the schema-checked
    fields and name lengths; ``namespace`` refused on aws-ec2, which never reads it, and refused
    when it is a cluster's own (``SYSTEM_NAMESPACES``) or ``observability.prometheusNamespace`` /
    ``grafanaNamespace``: the stack declares its namespace and deletes it on destroy), then
    ``check_eks_version``; a warning when the kubernetes platform
    has no ``kubeconfig`` secret.

    Raises:
        ConfigError: the first invalid value, one line.
    """
    check_nvme_host_path(raw.kubernetes.nvme_host_path)
    check_kubernetes_fields_and_limits(raw, stack, project)
    for ns in raw.kubernetes.allowed_namespaces:
        if not DNS_LABEL_RE.match(ns):
            raise ConfigError("kubernetes.allowedNamespaces", ns, "is not a valid namespace name (lowercase DNS label)")
    if not DNS_LABEL_RE.match(raw.kubernetes.namespace):
        raise ConfigError("kubernetes.namespace", raw.kubernetes.namespace, "is not a valid namespace name (lowercase DNS label)")
    if raw.kubernetes.namespace in SYSTEM_NAMESPACES:
        # The stack creates its namespace and deletes it on destroy: never one the cluster owns.
        raise ConfigError("kubernetes.namespace", raw.kubernetes.namespace,
                          f"is one the cluster owns ({', '.join(SYSTEM_NAMESPACES)}): the stack creates its namespace "
                          "and deletes it on `pulumi destroy`; name one of its own")
    obs = raw.observability
    for key, observed in (("observability.prometheusNamespace", obs.prometheus_namespace),
                          ("observability.grafanaNamespace", obs.grafana_namespace)):
        if platform.runs_kubernetes and observed is not None and raw.kubernetes.namespace == observed:
            # The same rule as for the cluster's own: destroying the stack would delete the monitoring stack.
            raise ConfigError("kubernetes.namespace", raw.kubernetes.namespace,
                              f"is {key}, the observability stack's namespace: the stack creates its namespace "
                              "and deletes it on `pulumi destroy`; name one of its own")
    for arn in raw.kubernetes.admin_role_arns:
        if not IAM_PRINCIPAL_ARN_RE.match(arn):
            raise ConfigError(
                "kubernetes.adminRoleArns",
                arn,
                "is not an IAM role or user ARN (arn:aws:iam::123456789012:role/NAME; not an sts assumed-role ARN)",
            )
    if len(set(raw.kubernetes.admin_role_arns)) != len(raw.kubernetes.admin_role_arns):
        raise ConfigError("kubernetes.adminRoleArns", list(raw.kubernetes.admin_role_arns), "names an ARN twice")
    check_eks_version(raw, platform, now, warnings)
    from ..versions import KNOWN_ADDONS

    for addon in raw.kubernetes.installed_addons:
        if addon not in KNOWN_ADDONS:
            raise ConfigError("kubernetes.installedAddons", addon, f"is not a known add-on (allowed: {', '.join(KNOWN_ADDONS)})")
    if platform.needs_kubeconfig and "kubeconfig" not in secrets_set:
        warnings.append(
            "kimi-deploy:kubeconfig is not set: `pulumi up` will use the ambient kubeconfig; "
            "set it with `pulumi config set --secret kimi-deploy:kubeconfig < ~/.kube/config`"
        )


def eks_version_of(raw: RawConfig) -> str:
    """The EKS version a stack creates: ``kubernetes.eksVersion`` or ``versions.EKS_VERSION``."""
    from ..versions import EKS_VERSION

    return raw.kubernetes.eks_version or EKS_VERSION


def check_eks_version(raw: RawConfig, platform: PlatformProfile, now: datetime, warnings: list[str]) -> None:
    """``kubernetes.eksVersion`` / ``eksSupportType`` against the EKS support calendar at ``now``.

    EKS accepts ``upgradePolicy.supportType: STANDARD`` only for a version still in standard
    support (EKS user guide, "Manage EKS extended support"); past it the cluster runs in
    extended support, billed per cluster-hour at ``EKS_EXTENDED_USD_PER_CLUSTER_HOUR`` instead of
    ``EKS_STANDARD_USD_PER_CLUSTER_HOUR``. So an out-of-standard version needs EXTENDED chosen
    explicitly (then a warning states the price), and a version past extended support or not in
    ``versions.EKS_VERSIONS`` is refused.

    Raises:
        ConfigError: ``kubernetes.eksVersion`` or ``kubernetes.eksSupportType`` is not allowed.
    """
    from ..versions import EKS_EXTENDED_USD_PER_CLUSTER_HOUR, EKS_STANDARD_USD_PER_CLUSTER_HOUR, EKS_VERSIONS, eks_support_status

    k8s = raw.kubernetes
    if not platform.creates_cluster:  # eksVersion elsewhere: config/platform_keys.py
        return
    version = eks_version_of(raw)
    if version not in EKS_VERSIONS:
        raise ConfigError("kubernetes.eksVersion", version, f"is not a known EKS version (allowed: {', '.join(EKS_VERSIONS)})")
    facts = EKS_VERSIONS[version]
    status = eks_support_status(version, now)
    newest = [v for v in EKS_VERSIONS if eks_support_status(v, now) == "standard"]
    instead = f"use {' or '.join(newest)}" if newest else "add the newer EKS versions to versions.EKS_VERSIONS"
    if status == "unsupported":
        raise ConfigError(
            "kubernetes.eksVersion", version, f"left extended support on {facts.end_of_extended_support.isoformat()} ({instead})",
        )
    if status == "extended" and k8s.eks_support_type != "EXTENDED":
        raise ConfigError(
            "kubernetes.eksVersion", version,
            f"left standard support on {facts.end_of_standard_support.isoformat()}: EKS refuses supportType STANDARD for it "
            f"({instead}, or set kubernetes.eksSupportType: EXTENDED at "
            f"USD {EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f} per cluster-hour instead of {EKS_STANDARD_USD_PER_CLUSTER_HOUR:.2f})",
        )
    from ..versions import CLUSTER_AUTOSCALER_IMAGE_TAGS

    if raw.autoscaling.enabled and version not in CLUSTER_AUTOSCALER_IMAGE_TAGS:
        raise ConfigError(
            "kubernetes.eksVersion", version,
            f"has no cluster autoscaler release recorded for autoscaling (allowed: {', '.join(CLUSTER_AUTOSCALER_IMAGE_TAGS)})",
        )
    if _version_tuple(version) < (1, 34):
        raise ConfigError(
            "kubernetes.eksVersion", version, "is too old: ComputeDomains and DRA need resource.k8s.io/v1 (GA from 1.34)"
        )
    if status == "extended":
        warnings.append(
            f"EKS {version} is in extended support (standard support ended {facts.end_of_standard_support.isoformat()}): "
            f"the control plane bills USD {EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f} per cluster-hour instead of "
            f"{EKS_STANDARD_USD_PER_CLUSTER_HOUR:.2f}; {instead}"
        )
    elif (
        raw.expires_at is not None
        and raw.expires_at.replace(tzinfo=raw.expires_at.tzinfo or UTC).date() >= facts.end_of_standard_support
    ):
        warnings.append(
            f"EKS {version} leaves standard support on {facts.end_of_standard_support.isoformat()}, before the stack expires: "
            + ("EKS upgrades the cluster then (supportType STANDARD)" if k8s.eks_support_type == "STANDARD"
               else f"it then bills USD {EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f} per cluster-hour (supportType EXTENDED)")
        )


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def check_node_selector_hardware(raw: RawConfig, target: TargetProfile) -> None:
    """A ``kubernetes.nodeSelector`` label that names hardware (``targets.HARDWARE_LABELS``: an
    instance type, a GPU model, count or memory, the CPU architecture) must name the target's: a
    selector for other GPUs would plan and price the target while the pods land on (or wait for)
    something else. Likewise ``kubernetes.installedAddons`` of the other GPU vendor.

    Raises:
        ConfigError: the first such label that does not match the target.
    """
    from ..targets import hardware_label_mismatch

    for key, value in raw.kubernetes.node_selector.items():
        why = hardware_label_mismatch(key, value, target)
        if why:
            raise ConfigError(f"kubernetes.nodeSelector.{key}", value, why)
    # GPU software of the other vendor said to be installed (an AMD operator on an NVIDIA target)
    # would be taken as the device plugin the pods need, and none would serve the GPUs.
    for addon in raw.kubernetes.installed_addons:
        vendor = addon.split("-", 1)[0]
        if vendor in ("nvidia", "amd") and vendor != target.gpu.vendor:
            raise ConfigError("kubernetes.installedAddons", addon,
                              f"is {vendor.upper() if vendor == 'amd' else 'NVIDIA'} GPU software; target {target.name} "
                              f"has {target.gpu.vendor.upper() if target.gpu.vendor == 'amd' else 'NVIDIA'} GPUs")


# IRSA (EKS's IAM roles for service accounts) reads the role from this service account annotation.
IRSA_ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]{1,253}\Z")  # a Secret's data key (Kubernetes API validation)
_AWS_REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+\Z")
_IAM_ROLE_ARN_RE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}\Z")
MIRROR_CREDENTIAL_KINDS = ("secret", "serviceAccountAnnotations", "serviceAccountName")


def uses_existing_mirror(raw: RawConfig) -> bool:
    """Whether the stack publishes to or reads an existing S3 mirror bucket it does not create
    (``storage.mirror.enabled`` with ``bucketName`` and ``create: false``)."""
    mirror = raw.storage.mirror
    return mirror.enabled and bool(mirror.bucket_name) and not mirror.create


def check_mirror_access(raw: RawConfig, platform: PlatformProfile) -> None:
    """``kubernetes.mirrorCredentials`` and ``storage.mirror.region``: on the kubernetes platform
    the pods that publish to or read an existing mirror (the publish Job, the node-local copy)
    need AWS credentials and a region from config: a Secret read through secretKeyRef, or the
    cluster's workload identity (annotations on the stack's service accounts, or a service
    account of the namespace). A mirror with neither is refused; on the AWS platforms (EKS Pod
    Identity, the instance role; ``aws:region``) both keys are refused.

    Raises:
        ConfigError: the first invalid value, one line.
    """
    creds, region = raw.kubernetes.mirror_credentials, raw.storage.mirror.region
    # On the AWS platforms both keys are refused by the one platform rule (config/platform_keys.py).
    if platform.provisions_aws:
        return
    if not uses_existing_mirror(raw):
        if creds is not None:
            raise ConfigError("kubernetes.mirrorCredentials", creds.model_dump(by_alias=True, exclude_defaults=True),
                              "names credentials for a mirror the stack does not use (storage.mirror.enabled with bucketName "
                              "and create: false): remove it")
        if region is not None:
            raise ConfigError("storage.mirror.region", region, "is only read with an existing mirror "
                              "(storage.mirror.enabled with bucketName and create: false): remove it")
        return
    bucket = f"s3://{raw.storage.mirror.bucket_name}"
    if creds is None:
        raise ConfigError(
            "kubernetes.mirrorCredentials", None,
            f"is required on the kubernetes platform to publish to or read {bucket}: secret: {{name: <Secret with "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY>}, or the cluster's workload identity "
            f"(serviceAccountAnnotations: {{{IRSA_ROLE_ANNOTATION}: <role ARN>}}, or serviceAccountName)",
        )
    chosen = [k for k, v in zip(MIRROR_CREDENTIAL_KINDS, (creds.secret, creds.service_account_annotations,
                                                           creds.service_account_name), strict=True) if v]
    if len(chosen) != 1:
        raise ConfigError("kubernetes.mirrorCredentials", chosen, f"must set exactly one of {', '.join(MIRROR_CREDENTIAL_KINDS)}")
    from ..limits import dns1123_subdomain_problem

    if creds.secret is not None:
        if why := dns1123_subdomain_problem(creds.secret.name):
            raise ConfigError("kubernetes.mirrorCredentials.secret.name", creds.secret.name, f"{why} (a Secret name)")
        keys = {"accessKeyIdKey": creds.secret.access_key_id_key, "secretAccessKeyKey": creds.secret.secret_access_key_key,
                "sessionTokenKey": creds.secret.session_token_key}
        for field, key in keys.items():
            if key is not None and not _SECRET_KEY_RE.match(key):
                raise ConfigError(f"kubernetes.mirrorCredentials.secret.{field}", key,
                                  "is not a Secret key (letters, digits, '-', '_', '.')")
    if creds.service_account_name is not None and (why := dns1123_subdomain_problem(creds.service_account_name)):
        raise ConfigError("kubernetes.mirrorCredentials.serviceAccountName", creds.service_account_name,
                          f"{why} (a ServiceAccount name)")
    role = creds.service_account_annotations.get(IRSA_ROLE_ANNOTATION)
    if role is not None and not _IAM_ROLE_ARN_RE.match(role):
        raise ConfigError(f"kubernetes.mirrorCredentials.serviceAccountAnnotations.{IRSA_ROLE_ANNOTATION}", role,
                          "is not an IAM role ARN (arn:aws:iam::123456789012:role/NAME)")
    if region is None:
        raise ConfigError("storage.mirror.region", None,
                          f"is required on the kubernetes platform with the mirror {bucket} (its AWS region, e.g. us-east-1)")
    if not _AWS_REGION_RE.match(region):
        raise ConfigError("storage.mirror.region", region, "is not an AWS region name (e.g. us-east-1)")
    from ..errors import did_you_mean
    from ..targets import AWS_REGIONS

    if raw.storage.mirror.endpoint_url is None and region not in AWS_REGIONS:
        # Amazon S3 itself (no storage.mirror.endpointUrl): a region AWS does not have is never reached.
        raise ConfigError("storage.mirror.region", region,
                          f"is not an AWS region (botocore's list of {len(AWS_REGIONS)}, targets.AWS_REGIONS)"
                          + (did_you_mean(region, AWS_REGIONS) or "; e.g. us-east-1")
                          + " (an S3-compatible store names its endpoint in storage.mirror.endpointUrl)")


def check_nvme_host_path(host_path: str, key: str = "kubernetes.nvmeHostPath") -> None:
    """``kubernetes.nvmeHostPath``: where the GPU nodes' NVMe array is mounted, checked in the one
    spelling the node resolves (``node_storage.normal_host_path``: ``//var/lib/kubelet``,
    ``/var/run`` = ``/run``, ``.`` parts); never ``/``, a system directory (``SYSTEM_DIRS``), the
    node's own state (``NODE_STATE_PATHS``) or a directory holding that state (``/var``, ``/var/lib``).

    Raises:
        ConfigError: one line naming ``key``, the value, and its normal spelling when that differs.
    """
    from ..node_storage import NODE_STATE_PATHS, HostPathError, normal_host_path, state_containing, system_dir_containing

    try:
        path = normal_host_path(host_path)
    except HostPathError as err:
        raise ConfigError(key, host_path, f"{err}: must be an absolute path below / (where the node's NVMe is mounted)") from None
    seen = "" if path == (host_path.rstrip("/") or "/") else f" (read as {path})"
    if path == "/":
        raise ConfigError(key, host_path, f"is the root directory{seen}: must be an absolute path below / (where the "
                                          "node's NVMe array is mounted, e.g. /mnt/nvme, /local, /data)")
    if (system := system_dir_containing(path)) is not None and state_containing(path) is None:
        raise ConfigError(
            key, host_path,
            f"lies in the host's system directory {system}{seen}: name where the node's NVMe array is mounted (e.g. "
            "/mnt/nvme, /local, /data)",
        )
    if (state := state_containing(path)) is not None:
        raise ConfigError(
            key, host_path,
            f"lies in the node's own state at {state}{seen} (kubelet, container runtime or logs): name where the NVMe "
            "is mounted (pods mount only <nvmeHostPath>/kimi-deploy/weights, /staging and /engine-cache)",
        )
    held = next((state for state in NODE_STATE_PATHS if state.startswith(path + "/")), None)
    if held is not None:
        raise ConfigError(
            key, host_path,
            f"holds the node's own state at {held}{seen} (kubelet, container runtime or logs): name where the NVMe "
            "is mounted (e.g. /mnt/nvme, /local, /data)",
        )
    if (problem := path_segments_problem(host_path.rstrip("/"), absolute=True)):
        raise ConfigError(key, host_path, f"{problem}: name the directory where the node's NVMe is mounted")


def check_kubernetes_fields_and_limits(raw: RawConfig, stack: str, project: str) -> None:
    """Free-form Kubernetes fields against the Kubernetes schema (``k8s_schema``) and the hard
    limits of ``limits`` for what the stack's names and tags become (called by ``check_kubernetes``).

    Args:
        raw: the validated ``config.RawConfig``.
        stack, project: the Pulumi stack and project names.

    Raises:
        ConfigError: naming the key (``kubernetes.tolerations[0].effect``), the value and the rule.
    """
    found = k8s_schema.tolerations_problem(raw.kubernetes.tolerations)
    if found:
        raise ConfigError(f"kubernetes.tolerations{found[0]}", found[1], found[2])
    for i, tol in enumerate(raw.kubernetes.tolerations):
        if not tol.get("key") and tol.get("operator") == "Exists":
            # Valid to the API server, but it tolerates every taint: the control plane's, not-ready and
            # unreachable (the pods would never be evicted from a lost node), and other teams' dedicated nodes.
            raise ConfigError(f"kubernetes.tolerations[{i}].key", tol.get("key"),
                              "is empty with operator Exists, which tolerates every taint (control plane, not-ready, "
                              "unreachable, other teams' nodes): name the GPU nodes' taint key (e.g. amd.com/gpu)")
    found = k8s_schema.node_selector_problem(raw.kubernetes.node_selector)
    if found:
        raise ConfigError(f"kubernetes.nodeSelector{found[0]}", found[1], found[2])
    # The stack name becomes the app.kubernetes.io/instance label and a tag value on everything.
    if why := limits.label_value_problem(stack):
        raise ConfigError(
            "--stack", stack, f"{why} (the stack name is the app.kubernetes.io/instance label); use a shorter stack name"
        )
    tags = {naming.TAG_STACK: stack, naming.TAG_ENVIRONMENT: raw.environment, naming.TAG_TARGET: raw.target,
            naming.TAG_OWNER: raw.owner, naming.TAG_PROJECT: project, naming.TAG_EXPIRES_AT: "2026-12-01T00:00:00Z"}
    broken = limits.tags_problem(tags, reserved=1)  # + Name
    if broken:
        key = {naming.TAG_OWNER: "owner", naming.TAG_STACK: "--stack", naming.TAG_PROJECT: "--project"}.get(broken[0], "owner")
        raise ConfigError(key, broken[1], broken[2])

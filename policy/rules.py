"""kimi-deploy guardrails as plain functions: one rule set for CrossGuard and for the tests.

Each resource rule is ``(resource_type, props, name, ctx) -> [message]``; a message names the
resource. ``policy/__main__.py`` wraps them in ``pulumi_policy`` policies (``pulumi preview
--policy-pack policy``); ``tests/test_policy.py`` runs them over every stack's offline plan, so
they hold without the CLI. Props are camelCase inputs as the provider receives them.

The two worlds differ in one way, carried by ``RuleContext.secrets_masked``: in the offline plan
secret values are masked as ``"[secret]"`` (so "is this value secret?" can be answered); under
CrossGuard the analyzer receives secrets unwrapped, so the rules fall back to what a value looks
like (credential patterns, sensitive names).

Tag keys relied on (set by ``components/program.py`` and the AWS edge): ``kimi-deploy:environment``,
``expires-at``, ``kimi-deploy:role`` (``weights-mirror``), ``kimi-deploy:retain`` (``true``).
Facts come from ``components/core`` (instance GPUs from ``targets.INSTANCES``, the API port from
``versions.VLLM_PORT``, GPU node label/taint from ``naming``): stdlib-only modules.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from components.core.credentials import CREDENTIAL_RE
from components.core.naming import (  # one place for tag keys
    GPU_NODE_LABEL,
    GPU_TAINT_KEY,
    ROLE_WEIGHTS_MIRROR,
    TAG_ENVIRONMENT,
    TAG_RETAIN,
    TAG_ROLE,
)
from components.core.naming import TAG_EXPIRES_AT as TAG_EXPIRES
from components.core.targets import INSTANCES
from components.core.versions import VLLM_PORT

SECRET_MASK = "[secret]"  # components.plan_engine.SECRET_MASK
RESOLVED_LT = "__launchTemplate"  # props key added by resolve_launch_templates (not an input)
# Pulumi's marker for a value unknown during preview (sdk/go/common/resource/plugin/rpc.go).
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"

GPU_INSTANCE_TYPES = frozenset(t for t, facts in INSTANCES.items() if facts.gpus > 0)

# Env var / key names that hold credentials.
SENSITIVE_NAME = re.compile(
    r"(^|[_.-])(TOKEN|API_?KEY|KEY|PASSWORD|PASSWD|SECRET|CREDENTIALS?|KUBECONFIG)($|[_.-])", re.IGNORECASE
)
# Keys of structured values (Helm values, ConfigMap data) that hold credentials. Stricter than
# SENSITIVE_NAME: a bare "key" (tolerations, match expressions) or "existingSecret" is no credential.
SENSITIVE_KEY = re.compile(
    r"(token|password|passwd|api[_-]?key|secret[_-]?key|access[_-]?key|private[_-]?key|credentials?|kubeconfig)$|^secret$",
    re.IGNORECASE,
)
# Values shaped like credentials (checked where secretness cannot be seen): one list, in
# components/core/credentials.py, shared with the config check and the plan diff.
CREDENTIAL_VALUE = CREDENTIAL_RE

WORKLOAD_TYPES = (
    "kubernetes:apps/v1:Deployment",
    "kubernetes:apps/v1:StatefulSet",
    "kubernetes:apps/v1:DaemonSet",
    "kubernetes:batch/v1:Job",
    "kubernetes:batch/v1:CronJob",
    "kubernetes:core/v1:Pod",
    "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet",
)
BUCKET_TYPES = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_SSE_TYPES = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)


@dataclass(frozen=True)
class RuleContext:
    """How to read props.

    Attributes:
        secrets_masked: True for offline plans (secret values are ``"[secret]"``), False under
            CrossGuard (secrets arrive unwrapped).
        api_port: the vLLM API port (``kimi-deploy:vllm.port``; default ``VLLM_PORT``).
    """

    secrets_masked: bool = False
    api_port: int = VLLM_PORT


def _label(rtype: str, name: str) -> str:
    return f"{rtype} '{name}'"


def _tags(props: Mapping[str, Any]) -> Mapping[str, Any]:
    tags = props.get("tags") or props.get("tagsAll") or {}
    return tags if isinstance(tags, Mapping) else {}


def _known(value: Any) -> bool:
    return value is not None and value != UNKNOWN


# ---------------------------------------------------------------------------------------------
# 1. GPU capacity outside prod expires
# ---------------------------------------------------------------------------------------------


def is_gpu_resource(rtype: str, props: Mapping[str, Any]) -> bool:
    """GPU instance or node group: its instance type (its own or its launch template's) has GPUs
    (``targets.INSTANCES``), or the node group carries the GPU node label or taint."""
    lt = props.get(RESOLVED_LT) or {}
    if rtype == "aws:ec2/instance:Instance":
        return (props.get("instanceType") or lt.get("instanceType")) in GPU_INSTANCE_TYPES
    if rtype == "aws:eks/nodeGroup:NodeGroup":
        types = props.get("instanceTypes") or ([lt["instanceType"]] if lt.get("instanceType") else [])
        if any(t in GPU_INSTANCE_TYPES for t in types):
            return True
        if GPU_NODE_LABEL in (props.get("labels") or {}):
            return True
        return any((t or {}).get("key") == GPU_TAINT_KEY for t in props.get("taints") or [])
    return False


def gpu_expiry(rtype: str, props: Mapping[str, Any], name: str, ctx: RuleContext) -> list[str]:
    """GPU instances and node groups outside prod carry a valid ``expires-at`` tag."""
    if not is_gpu_resource(rtype, props):
        return []
    tags = _tags(props)
    env = tags.get(TAG_ENVIRONMENT)
    if env == "prod":
        return []
    expires = tags.get(TAG_EXPIRES)
    where = f"environment {env!r}" if env else f"no {TAG_ENVIRONMENT} tag"
    if not expires:
        return [
            f"{_label(rtype, name)}: GPU capacity outside prod ({where}) must carry the '{TAG_EXPIRES}' tag (the sweeper ends "
            "it); set kimi-deploy:expiresAt or trialTtlHours"
        ]
    if _known(expires) and expires != SECRET_MASK:
        try:
            datetime.fromisoformat(str(expires).replace("Z", "+00:00"))
        except ValueError:
            return [
                f"{_label(rtype, name)}: tag '{TAG_EXPIRES}' {expires!r} is not an RFC 3339 time (e.g. 2026-12-01T00:00:00Z): "
                "the sweeper would never end it"
            ]
    return []


# ---------------------------------------------------------------------------------------------
# 2. No ingress from anywhere to the API port
# ---------------------------------------------------------------------------------------------


def _is_anywhere(cidr: Any) -> bool:
    try:
        return ipaddress.ip_network(str(cidr), strict=False).prefixlen == 0
    except ValueError:
        return False


def _covers(port: int, protocol: Any, from_port: Any, to_port: Any) -> bool:
    proto = str(protocol).lower() if protocol is not None else "tcp"
    if proto in ("-1", "all"):
        return True
    if proto not in ("tcp", "6"):
        return False
    try:
        lo, hi = int(from_port), int(to_port)
    except (TypeError, ValueError):
        return True  # unknown range: assume the worst
    return lo <= port <= hi or (lo == 0 and hi in (0, 65535)) or (lo == -1 and hi == -1)


def public_api_ingress(rtype: str, props: Mapping[str, Any], name: str, ctx: RuleContext) -> list[str]:
    """No 0.0.0.0/0 or ::/0 ingress that reaches the API port (security groups, rules, Services)."""
    port = ctx.api_port
    msgs: list[str] = []
    bad = f"allows ingress from anywhere to the API port {port}; list the callers in kimi-deploy:network.allowedCidrs"
    if rtype == "aws:ec2/securityGroup:SecurityGroup":
        for i, rule in enumerate(props.get("ingress") or []):
            cidrs = [*(rule.get("cidrBlocks") or []), *(rule.get("ipv6CidrBlocks") or [])]
            if any(_is_anywhere(c) for c in cidrs) and _covers(
                port, rule.get("protocol"), rule.get("fromPort"), rule.get("toPort")
            ):
                msgs.append(f"{_label(rtype, name)}: ingress[{i}] {bad}")
    elif rtype == "aws:ec2/securityGroupRule:SecurityGroupRule":
        cidrs = [*(props.get("cidrBlocks") or []), *(props.get("ipv6CidrBlocks") or [])]
        if (
            props.get("type") == "ingress"
            and any(_is_anywhere(c) for c in cidrs)
            and _covers(port, props.get("protocol"), props.get("fromPort"), props.get("toPort"))
        ):
            msgs.append(f"{_label(rtype, name)}: {bad}")
    elif rtype == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        if (_is_anywhere(props.get("cidrIpv4")) or _is_anywhere(props.get("cidrIpv6"))) and _covers(
            port, props.get("ipProtocol"), props.get("fromPort"), props.get("toPort")
        ):
            msgs.append(f"{_label(rtype, name)}: {bad}")
    elif rtype == "kubernetes:core/v1:Service":
        spec = props.get("spec") or {}
        if spec.get("type") == "LoadBalancer":
            ann = ((props.get("metadata") or {}).get("annotations")) or {}
            internal = (
                ann.get("service.beta.kubernetes.io/aws-load-balancer-scheme") == "internal"
                or str(ann.get("service.beta.kubernetes.io/aws-load-balancer-internal", "")).lower() == "true"
            )
            ranges = spec.get("loadBalancerSourceRanges") or []
            exposes = any(p.get("port") == port or p.get("targetPort") == port for p in spec.get("ports") or [])
            if exposes and not internal and (not ranges or any(_is_anywhere(r) for r in ranges)):
                msgs.append(
                    f"{_label(rtype, name)}: an internet-facing load balancer {bad} (make it internal or set "
                    "loadBalancerSourceRanges)"
                )
            elif exposes and any(_is_anywhere(r) for r in ranges):
                msgs.append(f"{_label(rtype, name)}: loadBalancerSourceRanges {bad}")
    return msgs


# ---------------------------------------------------------------------------------------------
# 3. Encryption at rest (EBS, FSx; S3 is checked across resources: bucket_encryption)
# ---------------------------------------------------------------------------------------------


def _true(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def encryption_at_rest(rtype: str, props: Mapping[str, Any], name: str, ctx: RuleContext) -> list[str]:
    """EBS volumes, instance and launch-template block devices encrypted; FSx key well formed."""
    label = _label(rtype, name)
    msgs: list[str] = []
    if rtype == "aws:ebs/volume:Volume" and not _true(props.get("encrypted")):
        msgs.append(f"{label}: EBS volume must set encrypted: true")
    elif rtype == "aws:ec2/instance:Instance":
        root = props.get("rootBlockDevice")
        lt = props.get(RESOLVED_LT)
        if isinstance(root, Mapping):
            if not _true(root.get("encrypted")):
                msgs.append(f"{label}: rootBlockDevice.encrypted must be true (the root volume holds the vLLM image and logs)")
        elif lt is not None:
            if not lt.get("blockDeviceMappings"):
                msgs.append(
                    f"{label}: neither rootBlockDevice nor its launch template's blockDeviceMappings encrypt the root volume"
                )
            # else: the launch template's mappings are checked on the launch template itself
        elif not props.get("launchTemplate"):
            msgs.append(f"{label}: rootBlockDevice.encrypted must be true (the root volume holds the vLLM image and logs)")
        for i, dev in enumerate(props.get("ebsBlockDevices") or []):
            if not _true(dev.get("encrypted")):
                msgs.append(f"{label}: ebsBlockDevices[{i}].encrypted must be true")
    elif rtype == "aws:ec2/launchTemplate:LaunchTemplate":
        for i, bdm in enumerate(props.get("blockDeviceMappings") or []):
            ebs = bdm.get("ebs")
            if isinstance(ebs, Mapping) and not _true(ebs.get("encrypted")):
                msgs.append(f"{label}: blockDeviceMappings[{i}].ebs.encrypted must be \"true\"")
    elif rtype == "aws:fsx/lustreFileSystem:LustreFileSystem":
        # FSx for Lustre always encrypts at rest (AWS-managed key, or kmsKeyId for persistent
        # types; FSx Lustre guide, "Encrypting data at rest"). A configured key must be a KMS ARN.
        key = props.get("kmsKeyId")
        if key is not None and _known(key) and not str(key).startswith("arn:"):
            msgs.append(f"{label}: kmsKeyId {key!r} must be a KMS key ARN")
        if key is not None and str(props.get("deploymentType", "")).startswith("SCRATCH"):
            msgs.append(f"{label}: kmsKeyId is only honoured by PERSISTENT deployment types (scratch uses FSx-managed keys)")
    elif rtype in BUCKET_TYPES:
        sse = props.get("serverSideEncryptionConfiguration")
        if isinstance(sse, Mapping) and not _sse_algorithm(sse):
            msgs.append(f"{label}: serverSideEncryptionConfiguration sets no sseAlgorithm")
    return msgs


def _sse_algorithm(config: Mapping[str, Any]) -> str | None:
    rules = config.get("rules") or config.get("rule") or []
    if isinstance(rules, Mapping):
        rules = [rules]
    for rule in rules:
        default = (rule or {}).get("applyServerSideEncryptionByDefault") or {}
        if default.get("sseAlgorithm") in ("AES256", "aws:kms", "aws:kms:dsse"):
            return default["sseAlgorithm"]
    return None


@dataclass(frozen=True)
class Res:
    """A resource for cross-resource rules: type, logical name, props, and the URNs it depends on."""

    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    dependencies: tuple[str, ...] = ()
    physical_name: str | None = None  # the bucket's name when known (plan: mock output)
    ids: tuple[str, ...] = ()  # other identifiers other resources may reference it by (ids, ARNs)


LAUNCH_TEMPLATE_TYPE = "aws:ec2/launchTemplate:LaunchTemplate"
_LT_FIELDS = ("instanceType", "metadataOptions", "blockDeviceMappings")


def resolve_launch_templates(resources: Iterable[Res]) -> list[Res]:
    """Instances and node groups with their launch template's instance type, metadata options
    and block devices attached under ``RESOLVED_LT`` (the template found by id, name or
    dependency), so rules judge what is launched, not only what the resource spells out."""
    res = list(resources)
    lts = [r for r in res if r.type == LAUNCH_TEMPLATE_TYPE]

    def find(ref: Mapping[str, Any], owner: Res) -> Res | None:
        for lt in lts:
            names = {n for n in (lt.props.get("id"), lt.props.get("name"), lt.physical_name, *lt.ids) if _known(n)}
            if ref.get("id") in names or ref.get("name") in names:
                return lt
        deps = [lt for lt in lts if lt.urn and lt.urn in owner.dependencies]
        return deps[0] if len(deps) == 1 else None

    out = []
    for r in res:
        ref = r.props.get("launchTemplate")
        if r.type in ("aws:ec2/instance:Instance", "aws:eks/nodeGroup:NodeGroup") and isinstance(ref, Mapping):
            lt = find(ref, r)
            if lt is not None:
                merged = {**r.props, RESOLVED_LT: {k: lt.props[k] for k in _LT_FIELDS if k in lt.props}}
                r = Res(r.type, r.name, merged, r.urn, r.dependencies, r.physical_name, r.ids)
        out.append(r)
    return out


def bucket_encryption(resources: Iterable[Res]) -> list[str]:
    """Every S3 bucket has default encryption: inline, or a server-side encryption
    configuration resource whose ``bucket`` is that bucket (by name or by dependency)."""
    res = list(resources)
    configs = [r for r in res if r.type in BUCKET_SSE_TYPES and _sse_algorithm(r.props)]
    msgs = []
    for b in (r for r in res if r.type in BUCKET_TYPES):
        inline = b.props.get("serverSideEncryptionConfiguration")
        if isinstance(inline, Mapping) and _sse_algorithm(inline):
            continue
        names = {n for n in (b.physical_name, b.props.get("bucket"), b.props.get("id"), *b.ids) if _known(n)}
        if any(c.props.get("bucket") in names or (b.urn and b.urn in c.dependencies) for c in configs):
            continue
        msgs.append(
            f"{_label(b.type, b.name)}: no default encryption (declare a BucketServerSideEncryptionConfiguration for it with "
            "sseAlgorithm aws:kms or AES256)"
        )
    return msgs


# ---------------------------------------------------------------------------------------------
# 4. IMDSv2
# ---------------------------------------------------------------------------------------------


def imdsv2_required(rtype: str, props: Mapping[str, Any], name: str, ctx: RuleContext) -> list[str]:
    """Instances and launch templates require IMDSv2; node groups use a launch template."""
    label = _label(rtype, name)
    if rtype == "aws:ec2/instance:Instance" and "metadataOptions" not in props and props.get("launchTemplate"):
        lt = props.get(RESOLVED_LT)
        if lt is None:
            return []  # an unresolved launch template is checked on its own
        props = {"metadataOptions": lt.get("metadataOptions")}
    if rtype in ("aws:ec2/instance:Instance", "aws:ec2/launchTemplate:LaunchTemplate"):
        tokens = (props.get("metadataOptions") or {}).get("httpTokens")
        if tokens != "required":
            return [f"{label}: metadataOptions.httpTokens must be \"required\" (IMDSv2), got {tokens!r}"]
    if rtype == "aws:eks/nodeGroup:NodeGroup" and not props.get("launchTemplate"):
        return [f"{label}: node group has no launchTemplate, so IMDSv2 (metadataOptions.httpTokens=required) cannot be enforced"]
    return []


# ---------------------------------------------------------------------------------------------
# 5. The weight mirror is retained
# ---------------------------------------------------------------------------------------------


def mirror_retained(rtype: str, props: Mapping[str, Any], name: str, ctx: RuleContext) -> list[str]:
    """The weight-mirror bucket carries ``kimi-deploy:retain=true`` and no ``forceDestroy``.

    Resource options (``retain_on_delete``) are not inputs and CrossGuard does not expose them,
    so the tag is what is checked; the sweeper honours the same tag.
    """
    if rtype not in BUCKET_TYPES or _tags(props).get(TAG_ROLE) != ROLE_WEIGHTS_MIRROR:
        return []
    msgs = []
    if str(_tags(props).get(TAG_RETAIN, "")).lower() != "true":
        msgs.append(
            f"{_label(rtype, name)}: the weight mirror must carry the tag {TAG_RETAIN}=true (and retain_on_delete) so teardown "
            "never deletes 1.56 TB of weights"
        )
    if _true(props.get("forceDestroy")):
        msgs.append(
            f"{_label(rtype, name)}: the weight mirror must not set forceDestroy (it would delete the weights with the bucket)"
        )
    return msgs


# ---------------------------------------------------------------------------------------------
# 6. No secret in a plain input
# ---------------------------------------------------------------------------------------------


def _containers(rtype: str, props: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    spec = props.get("spec") or {}
    pod_specs: list[tuple[str, Any]] = []
    if rtype == "kubernetes:core/v1:Pod":
        pod_specs.append(("spec", spec))
    elif rtype == "kubernetes:batch/v1:CronJob":
        pod_specs.append(
            (
                "spec.jobTemplate.spec.template.spec",
                (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get("spec"),
            )
        )
    elif rtype == "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        for key in ("leaderTemplate", "workerTemplate"):
            pod_specs.append((f"spec.leaderWorkerTemplate.{key}.spec", (lwt.get(key) or {}).get("spec")))
    else:
        pod_specs.append(("spec.template.spec", (spec.get("template") or {}).get("spec")))
    for base, pod in pod_specs:
        if not isinstance(pod, Mapping):
            continue
        for field in ("initContainers", "containers"):
            for i, c in enumerate(pod.get(field) or []):
                if isinstance(c, Mapping):
                    yield f"{base}.{field}[{i}]", c


def _walk(value: Any, path: str = ""):
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, value


def _secret_shaped(value: Any, ctx: RuleContext) -> bool:
    if not isinstance(value, str):
        return False
    if ctx.secrets_masked and SECRET_MASK in value:
        return True
    return bool(CREDENTIAL_VALUE.search(value))


# Inputs that are stored and shown in plain text: a secret must never be there.
_PLAIN_PLACES = (
    "tags",
    "userData",
    "userDataBase64",
    "metadata.labels",
    "metadata.annotations",
    "metadata.name",
    "name",
    "description",
)


def no_plain_secrets(rtype: str, props: Mapping[str, Any], name: str, ctx: RuleContext) -> list[str]:
    """Secrets reach workloads only through Kubernetes Secrets (``secretKeyRef``) or SSM
    SecureString parameters: never in env literals, argv, tags, labels, names or user data."""
    label = _label(rtype, name)
    msgs: list[str] = []
    for place in _PLAIN_PLACES:
        value: Any = props
        for part in place.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        for path, leaf in _walk(value, place):
            if _secret_shaped(leaf, ctx):
                msgs.append(
                    f"{label}: {path} holds a secret in plain text (use a Kubernetes Secret via secretKeyRef or an SSM "
                    "SecureString read at boot)"
                )
    if rtype in WORKLOAD_TYPES:
        for base, c in _containers(rtype, props):
            for j, env in enumerate(c.get("env") or []):
                if not isinstance(env, Mapping) or "value" not in env:
                    continue
                if SENSITIVE_NAME.search(str(env.get("name", ""))) and env.get("value") not in (None, ""):
                    msgs.append(
                        f"{label}: {base}.env[{j}] {env.get('name')} is a literal value; credentials come from "
                        "valueFrom.secretKeyRef"
                    )
                elif _secret_shaped(env.get("value"), ctx):
                    msgs.append(
                        f"{label}: {base}.env[{j}] {env.get('name')} holds a secret as a literal value; use "
                        "valueFrom.secretKeyRef"
                    )
            for field in ("command", "args"):
                for k, arg in enumerate(c.get(field) or []):
                    if _secret_shaped(arg, ctx):
                        msgs.append(
                            f"{label}: {base}.{field}[{k}] holds a secret on the command line (visible in the pod spec and ps)"
                        )
    if rtype == "kubernetes:core/v1:Secret" and ctx.secrets_masked:
        for field in ("stringData", "data"):
            content = props.get(field)
            if not isinstance(content, Mapping):
                if content not in (None, SECRET_MASK):
                    msgs.append(f"{label}: {field} is built from a plain (non-secret) value")
                continue
            for key, value in content.items():
                if value != SECRET_MASK:
                    msgs.append(
                        f"{label}: {field}.{key} is built from a plain (non-secret) value; pass a secret Output so state keeps "
                        "it encrypted"
                    )
    if rtype == "kubernetes:core/v1:ConfigMap" and isinstance(props.get("data"), Mapping):
        for key, value in props["data"].items():
            if SENSITIVE_KEY.search(str(key)) or _secret_shaped(value, ctx):
                msgs.append(f"{label}: data.{key} looks like a credential in a ConfigMap; use a Secret")
    if rtype == "aws:ssm/parameter:Parameter":
        pname = str(props.get("name") or name)
        if (SENSITIVE_NAME.search(pname.replace("/", "_")) or _secret_shaped(props.get("value"), ctx)) and props.get(
            "type"
        ) != "SecureString":
            msgs.append(
                f"{label}: parameter {pname!r} holds a credential and must be type SecureString, got {props.get('type')!r}"
            )
    if rtype == "kubernetes:helm.sh/v3:Release":
        for path, leaf in _walk(props.get("values") or {}, "values"):
            last = re.sub(r"\[\d+\]$", "", path.rsplit(".", 1)[-1])
            if (
                isinstance(leaf, str)
                and leaf
                and SENSITIVE_KEY.search(last)
                and not (ctx.secrets_masked and leaf == SECRET_MASK)
                and not leaf.startswith("$")
            ):
                msgs.append(
                    f"{label}: {path} sets a credential as a plain Helm value (it is stored in the release); reference an "
                    "existing Secret"
                )
            elif _secret_shaped(leaf, ctx) and leaf != SECRET_MASK:
                msgs.append(f"{label}: {path} holds a secret in plain text")
    return msgs


# ---------------------------------------------------------------------------------------------
# The rule set
# ---------------------------------------------------------------------------------------------

ResourceRule = Callable[[str, Mapping[str, Any], str, RuleContext], list[str]]


@dataclass(frozen=True)
class Rule:
    """A named resource rule (policy name, description for ``pulumi preview``, function)."""

    name: str
    description: str
    check: ResourceRule


RESOURCE_RULES: tuple[Rule, ...] = (
    Rule("gpu-capacity-expires", "GPU instances and node groups outside prod carry an expires-at tag.", gpu_expiry),
    Rule("no-public-api-ingress", "No ingress from 0.0.0.0/0 or ::/0 to the vLLM API port.", public_api_ingress),
    Rule("encryption-at-rest", "EBS volumes and block devices are encrypted; FSx keys are KMS ARNs.", encryption_at_rest),
    Rule("imdsv2-required", "Instances and launch templates require IMDSv2; node groups use a launch template.", imdsv2_required),
    Rule(
        "weight-mirror-retained",
        "The weight-mirror bucket is tagged kimi-deploy:retain=true and has no forceDestroy.",
        mirror_retained,
    ),
    Rule(
        "no-plain-secrets",
        "No secret in a plain input: env literals, argv, tags, labels, user data, Helm values, SSM String.",
        no_plain_secrets,
    ),
)
STACK_RULE_S3 = Rule("s3-encryption-at-rest", "Every S3 bucket has default server-side encryption.", lambda *a: [])


def check_resource(rtype: str, props: Mapping[str, Any], name: str, ctx: RuleContext) -> list[tuple[str, str]]:
    """Every resource rule over one resource: ``[(rule name, message)]``."""
    return [(rule.name, msg) for rule in RESOURCE_RULES for msg in rule.check(rtype, props, name, ctx)]


def check_resources(resources: Iterable[Res], ctx: RuleContext) -> list[tuple[str, str]]:
    """Every rule (resource rules and the cross-resource S3 rule) over a stack."""
    res = resolve_launch_templates(resources)
    out = [v for r in res for v in check_resource(r.type, r.props, r.name, ctx)]
    out += [(STACK_RULE_S3.name, msg) for msg in bucket_encryption(res)]
    return out

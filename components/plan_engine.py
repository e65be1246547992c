"""Run the real Pulumi program under Pulumi's mock engine and record what it declares.

Used by ``scripts/ops/plan.py`` (the offline plan) and by the tests. No CLI, no provider plugins,
no cloud: ``pulumi.runtime.set_mocks`` stands in for the engine, and each resource's recorded
inputs are exactly what ``pulumi up`` would send to the provider. Inputs that are Pulumi secrets
are recorded as ``"[secret]"``; a secret's value found in a plain input is reported as a leak.

Values only the provider knows (ids, IPs, generated names, ARNs with the account id) get mock
values so the program runs; every one is a stable function of its inputs (never the salted
``hash()``), and ``PlanRun.computed_values`` lists them so that the plan shows
``KNOWN_AFTER_UP`` in their place (``PlanRun.mark_computed``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi.runtime
from pulumi.runtime import rpc
from pulumi.runtime.sync_await import _sync_await

from components.core.config import SECRET_KEYS
from components.core.config.reader import cli_config_strings
from components.core.errors import NAMESPACE

SECRET_MASK = "[secret]"
# What the plan shows instead of a value the provider computes at `pulumi up` (ids, addresses,
# generated names): the mock engine needs some value to run the program, the plan must not
# present it as real.
KNOWN_AFTER_UP = "<known after pulumi up>"
# Mock values shorter than this are replaced only where they are the whole string (a short id
# such as ``fs-id`` could be part of unrelated text).
_MIN_SUBSTRING_MARK_CHARS = 8
# Value given to secrets a stack does not set, so the plan renders; obviously not a real one.
PLACEHOLDER_PREFIX = "PLAN-PLACEHOLDER-NOT-A-REAL-"
MOCK_ACCOUNT_ID = "123456789012"


@dataclass(frozen=True)
class RecordedResource:
    """One declared resource.

    Attributes:
        type: Pulumi type token, e.g. ``aws:ec2/instance:Instance``.
        name: logical name.
        inputs: inputs as sent to the provider, secrets masked, integral floats as ints.
        custom: False for component resources.
        resource_id: the mock physical id.
        ignore_changes: input paths the resource's ``ResourceOptions.ignore_changes`` names
            (``scalingConfig.desiredSize``): ``pulumi up`` keeps their value from the state, so a
            change there is not applied (pulumi ``ResourceOptions.ignore_changes``).
        replace_on_changes: input paths the resource's ``ResourceOptions.replace_on_changes``
            names (``spec``): a change there replaces the resource.
    """

    type: str
    name: str
    inputs: Mapping[str, Any]
    custom: bool
    resource_id: str
    ignore_changes: tuple[str, ...] = ()
    replace_on_changes: tuple[str, ...] = ()


@dataclass
class PlanRun:
    """The result of one mock run.

    Attributes:
        resources: declared resources in registration order.
        outputs: stack outputs, secrets masked.
        secret_leaks: ``(secret key, resource name, input path)`` where a secret's value sits in
            a plain input (must be empty; tests and the plan fail on any).
        context: the ``DeploymentContext`` of the run (spec, sizing, vLLM command).
        computed_values: mock value -> where it came from (``net-vpc.id``,
            ``gpu-instance.privateIp``, ``getCallerIdentity.accountId``): values that exist only
            after ``pulumi up``.
        calls: tokens of the provider functions (data sources) the program called, in call
            order (``aws:ec2/getSubnets:getSubnets``); the deploy policy lists them.
    """

    resources: list[RecordedResource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    secret_leaks: list[tuple[str, str, str]] = field(default_factory=list)
    context: Any = None
    computed_values: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def mark_computed(self, value: Any) -> Any:
        """``value`` (a JSON-like document) with every provider-computed mock value replaced by
        ``KNOWN_AFTER_UP``: whole strings always, substrings when the mock value has at least
        ``_MIN_SUBSTRING_MARK_CHARS`` characters (an ARN or URL around it stays readable).
        Longest values first, so the result does not depend on dict order."""
        exact = set(self.computed_values)
        parts = sorted((v for v in exact if len(v) >= _MIN_SUBSTRING_MARK_CHARS), key=lambda v: (-len(v), v))

        def mark(item: Any) -> Any:
            if isinstance(item, dict):
                return {k: mark(v) for k, v in item.items()}
            if isinstance(item, list):
                return [mark(v) for v in item]
            if isinstance(item, str):
                if item in exact:
                    return KNOWN_AFTER_UP
                for part in parts:
                    if part in item:
                        item = item.replace(part, KNOWN_AFTER_UP)
                return item
            return item

        return mark(value)

    def references(self, value: Any) -> dict[str, str]:
        """``{input path: origin}`` for every string in ``value`` (a resource's inputs) that is a
        whole provider-computed mock value: ``{"launchTemplate.id": "gpu-lt.id"}``. What
        ``mark_computed`` hides as ``KNOWN_AFTER_UP``, named: the plan diff follows it from a
        resource to the one it launches from. Paths are dotted, list items ``[i]``."""
        return {path: self.computed_values[text] for path, text in _walk_strings(value) if text in self.computed_values}

    def of_type(self, type_token: str) -> list[RecordedResource]:
        """Resources whose type token equals ``type_token``."""
        return [r for r in self.resources if r.type == type_token]

    def named(self, name: str) -> RecordedResource:
        """The resource with logical name ``name``.

        Raises:
            KeyError: none declared with that name.
        """
        for res in self.resources:
            if res.name == name:
                return res
        raise KeyError(name)


def _clean(value: Any) -> Any:
    """Mask wrapped secrets, turn integral floats back into ints, and stringify odd leaves."""
    if rpc.is_rpc_secret(value):
        return SECRET_MASK
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _unwrap(value: Any) -> Any:
    """Inputs with secrets unwrapped (the state a provider would see)."""
    if rpc.is_rpc_secret(value):
        return _unwrap(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_unwrap(v) for v in value]
    return value


def _walk_strings(value: Any, path: str = ""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk_strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_strings(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


# Outputs the providers compute, for resources whose outputs feed other resources.
OutputFn = Callable[[str, dict[str, Any]], dict[str, Any]]


def stable_digits(text: str, digits: int = 8) -> str:
    """``digits`` decimal digits derived from ``text`` by sha256: the same on every run.

    Python's ``hash()`` of a string is salted per process (``PYTHONHASHSEED``), so a mock value
    built from it changed between two plans of the same stack and every plan diff showed a false
    change (a replaced FSx PersistentVolume). Mock values use this instead.
    """
    return str(int(hashlib.sha256(text.encode()).hexdigest(), 16) % 10**digits).zfill(digits)


def _arn(service: str, kind: str) -> OutputFn:
    return lambda name, inputs: {"arn": f"arn:aws:{service}::{MOCK_ACCOUNT_ID}:{kind}/{name}"}


RESOURCE_OUTPUTS: dict[str, OutputFn] = {
    "aws:s3/bucket:Bucket": lambda name, i: {
        "bucket": i.get("bucket") or f"{name}-a1b2c3d",
        "arn": f"arn:aws:s3:::{i.get('bucket') or name + '-a1b2c3d'}",
    },
    "aws:s3/bucketV2:BucketV2": lambda name, i: {
        "bucket": i.get("bucket") or f"{name}-a1b2c3d",
        "arn": f"arn:aws:s3:::{i.get('bucket') or name + '-a1b2c3d'}",
    },
    "aws:eks/cluster:Cluster": lambda name, i: {
        "endpoint": f"https://{name}.gr7.us-east-1.eks.amazonaws.com",
        "certificateAuthority": {"data": "TU9DSy1DQQ=="},
        "arn": f"arn:aws:eks:us-east-1:{MOCK_ACCOUNT_ID}:cluster/{i.get('name', name)}",
        "name": i.get("name", name),
        "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.us-east-1.amazonaws.com/id/{name.upper()}"}]}],
        "vpcConfig": {**(i.get("vpcConfig") or {}), "clusterSecurityGroupId": f"sg-{name}-cluster"},
    },
    "aws:fsx/lustreFileSystem:LustreFileSystem": lambda name, i: {
        "dnsName": f"fs-{stable_digits(name)}.fsx.us-east-1.amazonaws.com",
        "mountName": "abcdefgh",
        "arn": f"arn:aws:fsx:us-east-1:{MOCK_ACCOUNT_ID}:file-system/fs-{name}",
    },
    "aws:ec2/instance:Instance": lambda name, i: {
        "privateIp": "10.42.1.10",
        "privateDns": "ip-10-42-1-10.ec2.internal",
        "arn": f"arn:aws:ec2:us-east-1:{MOCK_ACCOUNT_ID}:instance/i-{name}",
    },
    "aws:iam/role:Role": _arn("iam", "role"),
    "aws:iam/policy:Policy": _arn("iam", "policy"),
    "aws:iam/instanceProfile:InstanceProfile": _arn("iam", "instance-profile"),
    "aws:lb/loadBalancer:LoadBalancer": lambda name, i: {
        "dnsName": f"{name}-0123456789.elb.us-east-1.amazonaws.com",
        "arn": f"arn:aws:elasticloadbalancing:us-east-1:{MOCK_ACCOUNT_ID}:loadbalancer/net/{name}/0123456789",
    },
    "aws:ec2/launchTemplate:LaunchTemplate": lambda name, i: {"latestVersion": 1},
    # AWS edge (components/aws): provider-assigned names and ids that other inputs reference.
    "aws:eks/nodeGroup:NodeGroup": lambda name, i: {
        "nodeGroupName": i.get("nodeGroupName") or f"{name}-20261130",
        # arn:aws:eks:<region>:<account>:nodegroup/<cluster>/<node group>/<uuid> (EKS API reference, Nodegroup)
        "arn": f"arn:aws:eks:us-east-1:{MOCK_ACCOUNT_ID}:nodegroup/{i.get('clusterName')}/"
               f"{i.get('nodeGroupName') or name + '-20261130'}/0123abcd-0123-4567-89ab-0123456789ab",
        # the group's Auto Scaling group, named by EKS eks-<node group>-<uuid> (Nodegroup.resources)
        "resources": [{"autoscalingGroups": [
            {"name": f"eks-{i.get('nodeGroupName') or name + '-20261130'}-0123abcd-0123-4567-89ab-0123456789ab"}]}],
    },
    "aws:ec2/placementGroup:PlacementGroup": lambda name, i: {"name": i.get("name") or f"{name}-a1b2c3d"},
    "aws:ssm/parameter:Parameter": lambda name, i: {"arn": f"arn:aws:ssm:us-east-1:{MOCK_ACCOUNT_ID}:parameter{i.get('name')}"},
    "aws:kms/key:Key": lambda name, i: {"arn": f"arn:aws:kms:us-east-1:{MOCK_ACCOUNT_ID}:key/{name}"},
    # The AWS Load Balancer Controller writes the NLB's name into the Service's status.
    "kubernetes:core/v1:Service": lambda name, i: (
        {
            "status": {
                "loadBalancer": {"ingress": [{"hostname": f"k8s-{name}-{stable_digits(name, 10)}.elb.us-east-1.amazonaws.com"}]}
            }
        }
        if (i.get("spec") or {}).get("type") == "LoadBalancer"
        else {}
    ),
}

CallFn = Callable[[dict[str, Any]], dict[str, Any]]

# Result fields of data-source calls that only AWS knows (the rest echo the arguments or the region).
CALL_COMPUTED_FIELDS: dict[str, tuple[str, ...]] = {
    "aws:index/getCallerIdentity:getCallerIdentity": ("accountId", "arn", "userId"),
    "aws:ssm/getParameter:getParameter": ("value",),
    "aws:ec2/getAmi:getAmi": ("id",),
    "aws:ec2/getRouteTables:getRouteTables": ("ids",),
    "aws:ec2/getSubnet:getSubnet": ("cidrBlock",),
}

CALL_RESULTS: dict[str, CallFn] = {
    "aws:index/getCallerIdentity:getCallerIdentity": lambda a: {
        "accountId": MOCK_ACCOUNT_ID,
        "arn": f"arn:aws:iam::{MOCK_ACCOUNT_ID}:user/plan",
        "userId": "AIDAPLAN",
    },
    "aws:index/getRegion:getRegion": lambda a: {"name": a.get("name") or "us-east-1", "region": a.get("region") or "us-east-1"},
    "aws:index/getPartition:getPartition": lambda a: {"partition": "aws", "dnsSuffix": "amazonaws.com"},
    "aws:ssm/getParameter:getParameter": lambda a: {"value": "ami-0mockfromssm0000", "name": a.get("name"), "type": "String"},
    "aws:ec2/getAmi:getAmi": lambda a: {"id": "ami-0mockami000000000", "architecture": "x86_64"},
    # AWS edge (components/aws): AZ names of the region, subnets and route tables of an existing VPC.
    "aws:index/getAvailabilityZones:getAvailabilityZones": lambda a: {
        "names": [f"{a.get('region') or 'us-east-1'}{z}" for z in "abcd"],
        "zoneIds": [f"use1-az{i}" for i in range(1, 5)],
        "id": a.get("region") or "us-east-1",
    },
    "aws:ec2/getSubnets:getSubnets": lambda a: {
        "ids": next((f["values"] for f in a.get("filters") or [] if f.get("name") == "subnet-id"), []),
        "id": "mock-subnets",
    },
    "aws:ec2/getRouteTables:getRouteTables": lambda a: {"ids": ["rtb-0mockprivate00001"], "id": "mock-route-tables"},
    # An existing subnet's CIDR block (a /24 of 10.0.0.0/16 derived from its id: the same on every run).
    "aws:ec2/getSubnet:getSubnet": lambda a: {
        "id": a.get("id"), "cidrBlock": f"10.0.{int(stable_digits(str(a.get('id')), 3)) % 256}.0/24",
    },
}


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that record every resource and answer with plausible provider outputs.

    Args:
        secret_values: secret config key -> value, to detect values leaking into plain inputs.
    """

    def __init__(self, secret_values: Mapping[str, str]):
        self.run = PlanRun()
        self._secret_values = {k: v for k, v in secret_values.items() if v and len(v) >= 8}
        self._ignore_changes: dict[tuple[str, str], tuple[str, ...]] = {}
        self._replace_on_changes: dict[tuple[str, str], tuple[str, ...]] = {}

    def record_options(self, args: pulumi.ResourceTransformationArgs) -> None:
        """A stack transformation that changes nothing: it notes each resource's
        ``ignore_changes`` and ``replace_on_changes`` (mocks are not shown the resource options)."""
        ignored = getattr(args.opts, "ignore_changes", None) if args.opts is not None else None
        if ignored:
            self._ignore_changes[(args.type_, args.name)] = tuple(ignored)
        replaced = getattr(args.opts, "replace_on_changes", None) if args.opts is not None else None
        if replaced:
            self._replace_on_changes[(args.type_, args.name)] = tuple(replaced)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        cleaned = _clean(args.inputs)
        resource_id = f"{args.name}-id"
        ignored = self._ignore_changes.get((args.typ, args.name), ())
        replaced = self._replace_on_changes.get((args.typ, args.name), ())
        self.run.resources.append(
            RecordedResource(args.typ, args.name, cleaned, bool(args.custom), resource_id, ignored, replaced)
        )
        for path, text in _walk_strings(cleaned):
            for key, secret in self._secret_values.items():
                if secret in text:
                    self.run.secret_leaks.append((key, args.name, path))
        state = dict(_unwrap(args.inputs))
        self.run.computed_values[resource_id] = f"{args.name}.id"
        extra = RESOURCE_OUTPUTS.get(args.typ)
        if extra is not None:
            computed = extra(args.name, state)
            given = {text for _, text in _walk_strings(state)}
            for path, text in _walk_strings(computed):
                if text not in given and text:
                    self.run.computed_values.setdefault(text, f"{args.name}.{path}")
            state.update(computed)
        return resource_id, state

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.run.calls.append(args.token)
        fn = CALL_RESULTS.get(args.token)
        result = fn(dict(_unwrap(args.args))) if fn else {}
        for key in CALL_COMPUTED_FIELDS.get(args.token, ()):
            for path, text in _walk_strings(result.get(key)):
                self.run.computed_values.setdefault(text, f"{args.token.rsplit(':', 1)[-1]}.{key}{path}")
        # (result, failures): the mock monitor iterates the failures, so an empty list, never None.
        return result, []


def pulumi_config_strings(stack_config: Mapping[str, Any]) -> dict[str, str]:
    """Stack-file config values as the strings the Pulumi CLI hands a program
    (``config.reader.cli_config_strings``: top-level scalars as text, objects as JSON)."""
    return cli_config_strings(stack_config)


def run_program(
    stack_config: Mapping[str, Any],
    *,
    stack: str,
    project: str = NAMESPACE,
    secrets: Mapping[str, str] | None = None,
    now: _dt.datetime | None = None,
    allow_blockers: bool = False,
) -> PlanRun:
    """Run the program (``components.program``) under mocks for one stack's config.

    Args:
        stack_config: the stack file's ``config:`` map (full keys). ``{secure: ...}`` values
            are replaced by ``secrets`` or placeholders.
        stack, project: names the program sees.
        secrets: secret key (without namespace) -> value, for tests; missing secrets that the
            stack declares get ``PLAN-PLACEHOLDER-NOT-A-REAL-<KEY>``.
        now: the clock the program uses (``KIMI_DEPLOY_NOW``).
        allow_blockers: render a stack whose ``spec.blockers`` would stop `pulumi up` (the
            offline plan shows them at its top); False runs the program exactly as `pulumi up`.

    Returns:
        The recorded ``PlanRun``.

    Raises:
        ConfigError: the program rejected the config (raised before any resource exists).
    """
    from components import program

    secrets = dict(secrets or {})
    plain: dict[str, Any] = {}
    secret_full_keys: list[str] = []
    for key, value in stack_config.items():
        ns, _, name = key.partition(":")
        if ns == NAMESPACE and name in SECRET_KEYS:
            if name not in secrets:
                secrets[name] = PLACEHOLDER_PREFIX + name.upper()
            continue
        plain[key] = value
    config = pulumi_config_strings(plain)
    for name, value in secrets.items():
        config[f"{NAMESPACE}:{name}"] = value
        secret_full_keys.append(f"{NAMESPACE}:{name}")

    mocks = RecordingMocks(secrets)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False)
    pulumi.runtime.set_all_config(config, secret_full_keys)
    previous_now = os.environ.get(program.NOW_ENV)
    if now is not None:
        os.environ[program.NOW_ENV] = now.astimezone(_dt.UTC).isoformat()
    holder: dict[str, Any] = {}

    def body():
        pulumi.runtime.register_stack_transformation(mocks.record_options)
        ctx = program.build_context(allow_blockers=allow_blockers)
        holder["ctx"] = ctx
        holder["outputs"] = program.declare(ctx)
        return pulumi.Output.from_input(True)

    try:
        pulumi.runtime.test(body)()
        mocks.run.context = holder.get("ctx")
        mocks.run.outputs = _sync_await(_resolve_outputs(holder.get("outputs", {})))
    finally:
        if now is not None:
            if previous_now is None:
                os.environ.pop(program.NOW_ENV, None)
            else:
                os.environ[program.NOW_ENV] = previous_now
    return mocks.run


async def _resolve_outputs(outputs: Mapping[str, Any]) -> dict[str, Any]:
    resolved: dict[str, Any] = {}
    for key, value in outputs.items():
        out = pulumi.Output.from_input(value)
        is_secret = await out.is_secret()
        val = await out.future(with_unknowns=True)
        resolved[key] = SECRET_MASK if is_secret else _clean(val)
    return resolved

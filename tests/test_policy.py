"""Guardrails (policy/rules.py): every stack's plan passes; each bad pattern is rejected by name.

The same functions back the CrossGuard pack (policy/__main__.py); the last tests drive the pack's
own pulumi_policy objects with the SDK's argument types, so the CLI path is exercised too.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from unittest import mock

import pytest
import yaml

from policy import rules
from tests.conftest import STACKS, plan_for

REPO_ROOT = Path(__file__).resolve().parents[1]

PLAN_CTX = rules.RuleContext(secrets_masked=True)
CLI_CTX = rules.RuleContext(secrets_masked=False)
GPU = "p6-b300.48xlarge"
TRIAL_TAGS = {"kimi-deploy:stack": "b300", "kimi-deploy:environment": "trial", "expires-at": "2026-12-03T12:00:00Z"}


def plan_resources(run) -> list[rules.Res]:
    """A plan's resources for the rules; buckets get the physical name the mock engine gives them."""
    from components.plan_engine import RESOURCE_OUTPUTS

    out = []
    for r in run.resources:
        physical = None
        if r.type in rules.BUCKET_TYPES:
            physical = RESOURCE_OUTPUTS[r.type](r.name, dict(r.inputs))["bucket"]
        out.append(rules.Res(type=r.type, name=r.name, props=r.inputs, physical_name=physical, ids=(r.resource_id,)))
    return out


def test_every_stack_plan_passes_every_rule(plan, stack):
    ctx = rules.RuleContext(secrets_masked=True, api_port=plan.context.spec.config.vllm.port)
    violations = rules.check_resources(plan_resources(plan), ctx)
    assert violations == [], "\n".join(f"{r}: {m}" for r, m in violations)
    assert plan.secret_leaks == []


@pytest.mark.parametrize("stack_name", STACKS)
def test_gpu_resources_in_plans_carry_expiry_outside_prod(stack_name):
    """Meaningful as GPU resources appear: every GPU resource outside prod has a parseable expiry."""
    run = plan_for(stack_name)
    for r in rules.resolve_launch_templates(plan_resources(run)):
        if rules.is_gpu_resource(r.type, r.props) and run.context.spec.environment != "prod":
            assert r.props.get("tags", {}).get("expires-at"), r.name


# Each case: (rule, resource type, bad props, good props). The bad one must fail naming the
# resource; the good one (the same resource, fixed) must pass that rule.
CASES = [
    (
        "gpu-capacity-expires",
        "aws:ec2/instance:Instance",
        {"instanceType": GPU, "tags": {"kimi-deploy:environment": "trial"}},
        {"instanceType": GPU, "tags": TRIAL_TAGS},
    ),
    (
        "gpu-capacity-expires",
        "aws:eks/nodeGroup:NodeGroup",
        {"instanceTypes": [GPU], "tags": {"kimi-deploy:environment": "staging", "expires-at": "soon"}},
        {"instanceTypes": [GPU], "tags": {"kimi-deploy:environment": "prod"}},
    ),
    (
        "gpu-capacity-expires",
        "aws:eks/nodeGroup:NodeGroup",
        {"labels": {"kimi-deploy/gpu-node": "true"}, "tags": {}},
        {"labels": {"kimi-deploy/gpu-node": "true"}, "tags": TRIAL_TAGS},
    ),
    (
        "no-public-api-ingress",
        "aws:ec2/securityGroup:SecurityGroup",
        {"ingress": [{"protocol": "tcp", "fromPort": 8000, "toPort": 8000, "cidrBlocks": ["0.0.0.0/0"]}]},
        {
            "ingress": [
                {"protocol": "tcp", "fromPort": 8000, "toPort": 8000, "cidrBlocks": ["10.0.0.0/8"]},
                {"protocol": "tcp", "fromPort": 443, "toPort": 443, "cidrBlocks": ["0.0.0.0/0"]},
            ]
        },
    ),
    (
        "no-public-api-ingress",
        "aws:ec2/securityGroupRule:SecurityGroupRule",
        {"type": "ingress", "protocol": "-1", "fromPort": 0, "toPort": 0, "ipv6CidrBlocks": ["::/0"]},
        {"type": "egress", "protocol": "-1", "fromPort": 0, "toPort": 0, "cidrBlocks": ["0.0.0.0/0"]},
    ),
    (
        "no-public-api-ingress",
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        {"ipProtocol": "tcp", "fromPort": 7000, "toPort": 9000, "cidrIpv4": "0.0.0.0/0"},
        {"ipProtocol": "tcp", "fromPort": 8000, "toPort": 8000, "referencedSecurityGroupId": "sg-123"},
    ),
    (
        "no-public-api-ingress",
        "kubernetes:core/v1:Service",
        {"metadata": {"name": "vllm"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 8000}]}},
        {
            "metadata": {"name": "vllm", "annotations": {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 8000}], "loadBalancerSourceRanges": ["10.0.0.0/8"]},
        },
    ),
    (
        "encryption-at-rest",
        "aws:ebs/volume:Volume",
        {"availabilityZone": "us-east-1a", "size": 100},
        {"availabilityZone": "us-east-1a", "size": 100, "encrypted": True},
    ),
    (
        "encryption-at-rest",
        "aws:ec2/instance:Instance",
        {"instanceType": "t3.micro", "rootBlockDevice": {"volumeSize": 500}},
        {"instanceType": "t3.micro", "rootBlockDevice": {"volumeSize": 500, "encrypted": True}},
    ),
    (
        "encryption-at-rest",
        "aws:ec2/launchTemplate:LaunchTemplate",
        {"blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": 500}}]},
        {"blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": 500, "encrypted": "true"}}]},
    ),
    (
        "encryption-at-rest",
        "aws:fsx/lustreFileSystem:LustreFileSystem",
        {"deploymentType": "PERSISTENT_2", "kmsKeyId": "alias/my-key"},
        {
            "deploymentType": "PERSISTENT_2",
            "kmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        },
    ),
    (
        "imdsv2-required",
        "aws:ec2/instance:Instance",
        {"instanceType": "t3.micro", "metadataOptions": {"httpTokens": "optional"}},
        {"instanceType": "t3.micro", "metadataOptions": {"httpTokens": "required"}},
    ),
    (
        "imdsv2-required",
        "aws:ec2/launchTemplate:LaunchTemplate",
        {"instanceType": GPU},
        {"instanceType": GPU, "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2}},
    ),
    (
        "imdsv2-required",
        "aws:eks/nodeGroup:NodeGroup",
        {"instanceTypes": ["m7i.xlarge"]},
        {"instanceTypes": ["m7i.xlarge"], "launchTemplate": {"id": "lt-0123", "version": "1"}},
    ),
    (
        "weight-mirror-retained",
        "aws:s3/bucket:Bucket",
        {"tags": {"kimi-deploy:role": "weights-mirror"}},
        {"tags": {"kimi-deploy:role": "weights-mirror", "kimi-deploy:retain": "true"}},
    ),
    (
        "weight-mirror-retained",
        "aws:s3/bucket:Bucket",
        {"forceDestroy": True, "tags": {"kimi-deploy:role": "weights-mirror", "kimi-deploy:retain": "true"}},
        {"forceDestroy": False, "tags": {"kimi-deploy:role": "weights-mirror", "kimi-deploy:retain": "true"}},
    ),
    (
        "no-plain-secrets",
        "kubernetes:apps/v1:Deployment",
        {"spec": {"template": {"spec": {"containers": [{"name": "vllm", "env": [{"name": "HF_TOKEN", "value": "[secret]"}]}]}}}},
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "vllm",
                                "env": [
                                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
                                    {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
                                ],
                            }
                        ]
                    }
                }
            }
        },
    ),
    (
        "no-plain-secrets",
        "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet",
        {
            "spec": {
                "leaderWorkerTemplate": {
                    "workerTemplate": {"spec": {"containers": [{"name": "vllm", "args": ["serve", "--api-key", "[secret]"]}]}}
                }
            }
        },
        {
            "spec": {
                "leaderWorkerTemplate": {
                    "workerTemplate": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "vllm",
                                    "args": ["serve"],
                                    "env": [
                                        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}}
                                    ],
                                }
                            ]
                        }
                    }
                }
            }
        },
    ),
    (
        "no-plain-secrets",
        "kubernetes:core/v1:Secret",
        {"metadata": {"name": "hub-token"}, "stringData": {"token": "hf_plaintextvalue"}},
        {"metadata": {"name": "hub-token"}, "stringData": {"token": "[secret]"}},
    ),
    (
        "no-plain-secrets",
        "aws:ec2/instance:Instance",
        {"instanceType": "t3.micro", "userData": "[secret]"},
        {
            "instanceType": "t3.micro",
            "userData": "#!/bin/bash\naws ssm get-parameter --with-decryption --name /kimi/b300/hf-token\n",
        },
    ),
    (
        "no-plain-secrets",
        "aws:ssm/parameter:Parameter",
        {"name": "/kimi/b300/hf-token", "type": "String", "value": "[secret]"},
        {"name": "/kimi/b300/hf-token", "type": "SecureString", "value": "[secret]"},
    ),
    (
        "no-plain-secrets",
        "kubernetes:helm.sh/v3:Release",
        {"chart": "x", "values": {"auth": {"apiKey": "literal-key-value"}}},
        {"chart": "x", "values": {"auth": {"existingSecret": "vllm-api"}}},
    ),
]


def _case_id(case) -> str:
    return f"{case[0]}-{case[1].rsplit(':', 1)[-1]}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) + f"-{i}" for i, c in enumerate(CASES)])
def test_each_rule_rejects_its_bad_pattern_naming_the_resource(case):
    rule_name, rtype, bad, good = case
    rule = next(r for r in rules.RESOURCE_RULES if r.name == rule_name)
    messages = rule.check(rtype, bad, "bad-thing", PLAN_CTX)
    assert messages, f"{rule_name} accepted {bad}"
    assert all(f"{rtype} 'bad-thing'" in m for m in messages)
    assert rule.check(rtype, good, "good-thing", PLAN_CTX) == []


def test_every_rule_has_a_bad_case():
    assert {c[0] for c in CASES} == {r.name for r in rules.RESOURCE_RULES}


def test_plain_secret_rules_without_masking_judge_by_shape():
    """Under CrossGuard secrets arrive unwrapped: credential-shaped values still bite."""
    leaked = {"instanceType": "t3.micro", "tags": {"note": "hf_" + "A" * 30}}
    assert rules.no_plain_secrets("aws:ec2/instance:Instance", leaked, "gpu", CLI_CTX)
    k8s_secret = {"stringData": {"token": "anything"}}
    assert rules.no_plain_secrets("kubernetes:core/v1:Secret", k8s_secret, "hub", CLI_CTX) == []  # cannot tell; not flagged


def test_api_port_follows_the_stack():
    sg = {"ingress": [{"protocol": "tcp", "fromPort": 9000, "toPort": 9000, "cidrBlocks": ["0.0.0.0/0"]}]}
    assert rules.public_api_ingress("aws:ec2/securityGroup:SecurityGroup", sg, "api", rules.RuleContext(api_port=8000)) == []
    assert rules.public_api_ingress("aws:ec2/securityGroup:SecurityGroup", sg, "api", rules.RuleContext(api_port=9000))


def test_s3_buckets_need_default_encryption():
    bucket = rules.Res("aws:s3/bucket:Bucket", "mirror", {"tags": {}}, urn="urn:b", physical_name="mirror-a1b2c3d")
    sse = {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}]}
    [message] = rules.bucket_encryption([bucket])
    assert "aws:s3/bucket:Bucket 'mirror'" in message
    by_name = rules.Res(rules.BUCKET_SSE_TYPES[0], "mirror-sse", {"bucket": "mirror-a1b2c3d", **sse})
    assert rules.bucket_encryption([bucket, by_name]) == []
    by_dependency = rules.Res(rules.BUCKET_SSE_TYPES[0], "mirror-sse", {"bucket": rules.UNKNOWN, **sse}, dependencies=("urn:b",))
    assert rules.bucket_encryption([bucket, by_dependency]) == []
    no_algorithm = rules.Res(rules.BUCKET_SSE_TYPES[0], "mirror-sse", {"bucket": "mirror-a1b2c3d", "rules": [{}]})
    assert rules.bucket_encryption([bucket, no_algorithm])


def test_instances_are_judged_through_their_launch_template():
    lt = rules.Res(
        rules.LAUNCH_TEMPLATE_TYPE,
        "gpu-lt",
        {"instanceType": GPU, "metadataOptions": {"httpTokens": "optional"}},
        ids=("gpu-lt-id",),
    )
    inst = rules.Res(
        "aws:ec2/instance:Instance",
        "gpu-instance",
        {"launchTemplate": {"id": "gpu-lt-id", "version": "1"}, "tags": {"kimi-deploy:environment": "trial"}},
    )
    found = rules.check_resources([lt, inst], PLAN_CTX)
    about_instance = sorted(rule for rule, msg in found if "'gpu-instance'" in msg)
    assert about_instance == ["encryption-at-rest", "gpu-capacity-expires", "imdsv2-required"]
    by_dependency = rules.Res(rules.LAUNCH_TEMPLATE_TYPE, "gpu-lt", {"instanceType": GPU}, urn="urn:lt")
    inst2 = rules.Res(
        "aws:eks/nodeGroup:NodeGroup", "gpu-ng", {"launchTemplate": {"id": rules.UNKNOWN}}, dependencies=("urn:lt",)
    )
    [resolved] = [r for r in rules.resolve_launch_templates([by_dependency, inst2]) if r.name == "gpu-ng"]
    assert rules.is_gpu_resource(resolved.type, resolved.props)


def test_a_bad_resource_in_a_real_plan_is_caught():
    """Run the rules over a stack's plan with one bad resource added (what CI would see)."""
    run = plan_for(STACKS[0])
    bad = rules.Res(
        "aws:ec2/instance:Instance",
        "forgotten-gpu",
        {
            "instanceType": GPU,
            "metadataOptions": {"httpTokens": "required"},
            "rootBlockDevice": {"encrypted": True},
            "tags": {"kimi-deploy:environment": "trial"},
        },
    )
    violations = rules.check_resources([*plan_resources(run), bad], PLAN_CTX)
    assert [r for r, _ in violations] == ["gpu-capacity-expires"]
    assert "forgotten-gpu" in violations[0][1]


# --- the CrossGuard pack itself ------------------------------------------------------------


@pytest.fixture(scope="module")
def pack():
    captured = {}

    class CapturePack:
        def __init__(self, name, policies, enforcement_level=None, **kwargs):
            captured.update(name=name, policies=list(policies), enforcement_level=enforcement_level)

    with mock.patch("pulumi_policy.PolicyPack", CapturePack):
        # As Pulumi runs a pack: run_path(<pack dir>) puts the directory first on sys.path.
        runpy.run_path(str(REPO_ROOT / "policy"), run_name="__main__")
    return captured


def test_pack_declares_every_rule_mandatory(pack):
    from pulumi_policy import EnforcementLevel

    assert pack["name"] == "kimi-deploy-guardrails"
    names = [p.name for p in pack["policies"]]
    assert names == [r.name for r in rules.RESOURCE_RULES] + ["s3-encryption-at-rest"]
    assert pack["enforcement_level"] == EnforcementLevel.MANDATORY


def _policy_resource_options():
    from pulumi_policy.policy import PolicyCustomTimeouts, PolicyResourceOptions

    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def test_pack_reports_a_violation_with_the_urn(pack):
    from pulumi_policy import StackValidationArgs
    from pulumi_policy.policy import PolicyResource

    policy = next(p for p in pack["policies"] if p.name == "no-public-api-ingress")
    urn = "urn:pulumi:b300::kimi-deploy::aws:ec2/securityGroup:SecurityGroup::api"
    sg = PolicyResource(
        "aws:ec2/securityGroup:SecurityGroup",
        {"ingress": [{"protocol": "tcp", "fromPort": 9000, "toPort": 9000, "cidrBlocks": ["0.0.0.0/0"]}]},
        urn, "api", _policy_resource_options(), None, None, [], {},
    )
    reports = []
    policy.validate(StackValidationArgs([sg], config={"apiPort": 8000}), lambda message, urn=None: reports.append((message, urn)))
    assert reports == []  # 9000 is not the API port here
    policy.validate(StackValidationArgs([sg], config={"apiPort": 9000}), lambda message, urn=None: reports.append((message, urn)))
    assert len(reports) == 1 and "'api'" in reports[0][0] and reports[0][1] == urn


def test_pack_stack_policy_checks_bucket_encryption(pack):
    from pulumi_policy import StackValidationArgs
    from pulumi_policy.policy import PolicyResource

    policy = next(p for p in pack["policies"] if p.name == "s3-encryption-at-rest")
    bucket = PolicyResource(
        "aws:s3/bucket:Bucket", {"bucket": "kimi-mirror"}, "urn:b", "mirror", _policy_resource_options(), None, None, [], {}
    )
    reports = []
    policy.validate(StackValidationArgs([bucket]), lambda message, urn=None: reports.append(message))
    assert reports and "'mirror'" in reports[0]
    sse = PolicyResource(
        rules.BUCKET_SSE_TYPES[0],
        {"bucket": "kimi-mirror", "rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "aws:kms"}}]},
        "urn:s",
        "mirror-sse",
        _policy_resource_options(),
        None,
        None,
        [bucket],
        {},
    )
    reports.clear()
    policy.validate(StackValidationArgs([bucket, sse]), lambda message, urn=None: reports.append(message))
    assert reports == []


def test_pack_files_are_consistent():
    meta = yaml.safe_load((REPO_ROOT / "policy" / "PulumiPolicy.yaml").read_text())
    assert meta["runtime"]["name"] == "python" and meta["description"]
    pins = dict(
        line.split("==")
        for line in (REPO_ROOT / "policy" / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    dev = (REPO_ROOT / "requirements-dev.txt").read_text() + (REPO_ROOT / "requirements.txt").read_text()
    for pkg, version in pins.items():
        assert f"{pkg}=={version}" in dev, f"policy pins {pkg}=={version}, the project does not"


@pytest.mark.parametrize("stack_name", ["b300", "gb300", "b300-prod"])
def test_the_mirror_rule_has_a_mirror_to_check(stack_name):
    """The AWS edge marks the mirror bucket, so the mirror rule is not vacuous on AWS stacks."""
    from tests.conftest import plan_for

    buckets = [r for r in plan_for(stack_name).of_type("aws:s3/bucket:Bucket")
               if (r.inputs.get("tags") or {}).get(rules.TAG_ROLE) == rules.ROLE_WEIGHTS_MIRROR]
    assert len(buckets) == 1
    assert buckets[0].inputs["tags"][rules.TAG_RETAIN] == "true"

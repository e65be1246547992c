"""The AWS resources each stack declares, checked on their recorded inputs (issue 3)."""

from __future__ import annotations

import base64
import importlib
import inspect
import json

import pytest
import yaml

from components.core.config import read_stack_config
from components.core.errors import ConfigError
from components.core.naming import (
    GPU_NODE_LABEL,
    GPU_TAINT_KEY,
    MIRROR_PUBLISH_SERVICE_ACCOUNT,
    TARGET_NODE_LABEL,
    WEIGHT_SYNC_SERVICE_ACCOUNT,
)
from components.core.versions import EKS_VERSION
from components.core.weights import mirror_key_prefix
from tests.conftest import B300_PROD_FSX, STACKS, TEST_DEPLOYER_CIDR, TEST_REVISION, plan_for

AWS_STACKS = [s for s in STACKS if read_stack_config(s).get("kimi-deploy:platform", "").startswith("aws-")]
STACK_TAG_KEYS = ("kimi-deploy:stack", "kimi-deploy:environment", "kimi-deploy:target", "kimi-deploy:owner")


def _statements(doc: str) -> list[dict]:
    return json.loads(doc)["Statement"]


def _taggable(type_token: str) -> bool:
    """Whether the pulumi-aws resource behind ``type_token`` has a ``tags`` input."""
    if not type_token.startswith("aws:"):
        return False
    module, cls = type_token.split(":")[1].split("/")[0], type_token.split(":")[2]
    resource = getattr(importlib.import_module(f"pulumi_aws.{module}"), cls)
    return "tags" in inspect.signature(resource._internal_init).parameters


def test_aws_stacks_are_the_expected_ones():
    assert {"b300", "gb300", "b300-prod"} <= set(AWS_STACKS)


# -- tags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_taggable_aws_resource_carries_the_stack_tags(stack):
    run = plan_for(stack)
    spec = run.context.spec
    checked = 0
    for res in run.resources:
        if not _taggable(res.type):
            continue
        checked += 1
        got = res.inputs.get("tags") or {}
        for key in STACK_TAG_KEYS:
            assert key in got, f"{res.type} {res.name} lacks tag {key}"
        assert got["kimi-deploy:stack"] == stack and got["kimi-deploy:owner"] == spec.owner
        if got.get("kimi-deploy:role") == "weights-mirror":
            # The mirror outlives the trial: retained, never swept, no expiry.
            assert got["kimi-deploy:retain"] == "true" and "expires-at" not in got
        elif spec.environment == "trial":
            assert got.get("expires-at", "").endswith("Z"), f"{res.name}: trial without expires-at"
        else:
            assert "expires-at" not in got
    assert checked >= 20
    # What launch templates launch is tagged too.
    for lt in run.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        kinds = {spec_["resourceType"]: spec_["tags"] for spec_ in lt.inputs["tagSpecifications"]}
        assert set(kinds) == {"instance", "volume", "network-interface"}
        assert all(t["kimi-deploy:stack"] == stack for t in kinds.values())


# -- network --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_network_is_private_with_an_s3_gateway_endpoint(stack):
    run = plan_for(stack)
    spec = run.context.spec
    vpc = run.named("net-vpc")
    assert vpc.inputs["cidrBlock"] == spec.config.network.vpc_cidr
    subnets = {s.name: s.inputs for s in run.of_type("aws:ec2/subnet:Subnet")}
    assert subnets["net-private-gpu"]["availabilityZone"] == spec.availability_zone
    assert subnets["net-private-second"]["availabilityZone"] != spec.availability_zone
    assert all(s.get("mapPublicIpOnLaunch") is False for s in subnets.values())
    endpoint = run.named("net-s3")
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert endpoint.inputs["serviceName"] == f"com.amazonaws.{spec.region}.s3"
    assert endpoint.inputs["routeTableIds"] == ["net-private-rt-id"]
    # The default security group is emptied.
    default = run.named("net-default-sg").inputs
    assert not default.get("ingress") and not default.get("egress")


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_no_ingress_from_the_internet_and_api_port_only_from_allowed_sources(stack):
    run = plan_for(stack)
    spec = run.context.spec
    port = spec.config.vllm.port
    ingress = run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert ingress
    for rule in ingress:
        assert rule.inputs.get("cidrIpv4") != "0.0.0.0/0", rule.name
        assert "cidrIpv6" not in rule.inputs
    for sg in run.of_type("aws:ec2/securityGroup:SecurityGroup"):
        assert not sg.inputs.get("ingress"), f"{sg.name} has inline ingress"
    api = [r.inputs for r in ingress if r.name.startswith("net-gpu-api-")]
    assert sorted(r["cidrIpv4"] for r in api if "cidrIpv4" in r) == sorted(spec.config.network.allowed_cidrs)
    assert all(r["fromPort"] == port == r["toPort"] and r["ipProtocol"] == "tcp" for r in api)
    assert all(r["securityGroupId"] == "net-gpu-sg-id" for r in api)


def test_allowed_security_groups_reach_the_api_port():
    run = plan_for(
        "b300",
        overrides={"kimi-deploy:network": {"allowedSecurityGroupIds": ["sg-0123456789abcdef1"], "vpcCidr": "10.42.0.0/16"}},
    )
    rules = [r.inputs for r in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")]
    assert rules == [
        {**rules[0], "referencedSecurityGroupId": "sg-0123456789abcdef1", "fromPort": 8000, "toPort": 8000, "ipProtocol": "tcp"}
    ]
    assert "cidrIpv4" not in rules[0]


# EFA is opt-in (compute.efa) and needs an image with aws-ofi-nccl (test data: not a real image).
EFA_OVERRIDES = {
    "kimi-deploy:compute": {**read_stack_config("gb300")["kimi-deploy:compute"], "efa": True},
    "kimi-deploy:vllm": {
        **{k: v for k, v in read_stack_config("gb300")["kimi-deploy:vllm"].items() if k != "imageTag"},
        "image": "registry.example.com/vllm-efa@sha256:" + "e" * 64,
    },
}


def test_efa_security_group_is_all_traffic_to_and_from_itself():
    run = plan_for("gb300", overrides=EFA_OVERRIDES)
    assert run.context.spec.efa_enabled
    sg = "net-efa-sg-id"
    ingress = run.named("net-efa-in-self").inputs
    egress = run.named("net-efa-out-self").inputs
    assert ingress["securityGroupId"] == sg and ingress["referencedSecurityGroupId"] == sg and ingress["ipProtocol"] == "-1"
    assert egress["securityGroupId"] == sg and egress["referencedSecurityGroupId"] == sg and egress["ipProtocol"] == "-1"
    # Absent where EFA is off.
    assert not plan_for("b300").of_type("aws:ec2/placementGroup:PlacementGroup")
    assert all(r.name != "net-efa-sg" for r in plan_for("b300").resources)


# -- storage --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_mirror_bucket_is_encrypted_private_and_tls_only(stack):
    run = plan_for(stack)
    bucket = run.named("mirror-bucket").inputs
    assert bucket["forceDestroy"] is False
    sse = run.named("mirror-encryption").inputs["rules"][0]
    assert sse["applyServerSideEncryptionByDefault"]["sseAlgorithm"] in ("AES256", "aws:kms")
    pab = run.named("mirror-public-access-block").inputs
    assert all(pab[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    assert run.named("mirror-ownership").inputs["rule"]["objectOwnership"] == "BucketOwnerEnforced"
    (deny,) = _statements(run.named("mirror-tls-only").inputs["policy"])
    assert deny["Effect"] == "Deny" and deny["Principal"] == "*" and deny["Action"] == "s3:*"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"] == ["arn:aws:s3:::mirror-bucket-a1b2c3d", "arn:aws:s3:::mirror-bucket-a1b2c3d/*"]


def test_b300_prod_copies_from_the_mirror_and_creates_no_file_system():
    run = plan_for("b300-prod")
    assert run.context.spec.config.storage.kind == "nvme" and run.context.sizing.storage.fsx_capacity_gib is None
    assert not run.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")


def test_fsx_is_sized_by_the_core_and_imports_the_served_revision_only():
    run = plan_for("b300-prod", overrides=B300_PROD_FSX)
    plan = run.context.sizing.storage
    fs = run.named("fsx-fs").inputs
    assert fs["deploymentType"] == "PERSISTENT_2"
    assert fs["storageCapacity"] == plan.fsx_capacity_gib == 2400
    assert fs["perUnitStorageThroughput"] == plan.fsx_throughput_per_tib_mbps == 1000
    # AUTOMATIC unless storage.fsx.metadataIops is set: paid IOPS buy nothing for ~112 files.
    assert fs["metadataConfiguration"] == {"mode": "AUTOMATIC"}
    provisioned = plan_for(
        "b300-prod",
        overrides={"kimi-deploy:storage": {**B300_PROD_FSX["kimi-deploy:storage"], "fsx": {"metadataIops": 12000}}},
    )
    assert provisioned.named("fsx-fs").inputs["metadataConfiguration"] == {"mode": "USER_PROVISIONED", "iops": 12000}
    assert fs["subnetIds"] == "net-private-gpu-id"  # a single string in pulumi-aws 7
    assert fs["fileSystemTypeVersion"] == "2.15"
    assert "efaEnabled" not in fs
    dra = run.named("fsx-mirror-dra").inputs
    assert dra["fileSystemId"] == "fsx-fs-id"
    # The served revision's prefix only: other revisions and the engine-cache tarballs stay out.
    revision = f"models/moonshotai/Kimi-K3.1-Pro/{TEST_REVISION}"  # the tests' stand-in commit (conftest.py)
    assert dra["fileSystemPath"] == f"/{revision}"
    assert dra["dataRepositoryPath"] == f"s3://mirror-bucket-a1b2c3d/{revision}/"
    assert dra["s3"]["autoImportPolicy"]["events"] == ["NEW", "CHANGED", "DELETED"]
    assert dra["batchImportMetaDataOnCreate"] is True and dra["deleteDataInFilesystem"] is False
    # Lustre ports only, from the GPU nodes, the cluster security group and itself.
    rules = [
        r.inputs
        for r in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
        if r.name.startswith("net-fsx-")
    ]
    assert {(r["fromPort"], r["toPort"]) for r in rules} == {(988, 988), (1018, 1023)}
    assert {r["referencedSecurityGroupId"] for r in rules} == {"net-fsx-sg-id", "net-gpu-sg-id", "sg-eks-cluster-cluster"}
    assert fs["securityGroupIds"] == ["net-fsx-sg-id"]
    assert run.outputs["fsxDnsName"].endswith(".fsx.us-east-1.amazonaws.com") and run.outputs["fsxMountName"] == "abcdefgh"


def test_fsx_with_efa_is_persistent_2_with_metadata_and_the_efa_group():
    fsx_cfg = {"deploymentType": "PERSISTENT_2", "throughputPerTib": 500, "efa": True}
    run = plan_for("b300-prod", overrides={"kimi-deploy:storage": {"kind": "fsx", "fsx": fsx_cfg}, "kimi-deploy:compute": {
        "replicas": 1, "availabilityZone": "us-east-1c", "efa": True,
        "capacity": {"type": "odcr", "reservationId": "cr-0fedcba9876543210", "availabilityZone": "us-east-1c"}},
        "kimi-deploy:vllm": {"decodeContextParallelSize": 8, "image": "registry.example.com/vllm-efa@sha256:" + "e" * 64}})
    fs = run.named("fsx-fs").inputs
    assert fs["efaEnabled"] is True
    assert fs["metadataConfiguration"] == {"mode": "AUTOMATIC"}
    assert fs["perUnitStorageThroughput"] == 500
    assert fs["securityGroupIds"] == ["net-fsx-sg-id", "net-efa-sg-id"]


def test_no_fsx_where_storage_is_nvme():
    for stack in ("b300", "gb300"):
        assert not plan_for(stack).of_type("aws:fsx/lustreFileSystem:LustreFileSystem")


# -- IAM ------------------------------------------------------------------------------------------


def _mirror_rights(doc: str) -> tuple[set[str], set[str], list[str]]:
    actions, resources, list_prefixes = set(), set(), []
    for st in _statements(doc):
        assert st["Effect"] == "Allow"
        acts = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        actions.update(acts)
        resources.update(res)
        if "s3:ListBucket" in acts:
            list_prefixes += st["Condition"]["StringLike"]["s3:prefix"]
    return actions, resources, list_prefixes


def test_eks_weight_readers_may_only_read_the_mirror_prefix_and_the_publisher_only_write_there():
    run = plan_for("gb300")
    policies = {r.name: r.inputs["policy"] for r in run.of_type("aws:iam/rolePolicy:RolePolicy")}
    reader = policies[f"eks-{WEIGHT_SYNC_SERVICE_ACCOUNT}-weight-mirror"]
    writer = policies[f"eks-{MIRROR_PUBLISH_SERVICE_ACCOUNT}-weight-mirror"]
    actions, resources, prefixes = _mirror_rights(reader)
    assert actions == {"s3:ListBucket", "s3:GetObject"}
    assert resources == {"arn:aws:s3:::mirror-bucket-a1b2c3d", "arn:aws:s3:::mirror-bucket-a1b2c3d/models/*"}
    assert prefixes == ["models", "models/*"]
    actions, resources, prefixes = _mirror_rights(writer)
    assert {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"} <= actions
    assert not any(a in actions for a in ("s3:*", "s3:PutBucketPolicy", "s3:DeleteBucket"))
    revision = mirror_key_prefix(run.context.spec)
    assert resources == {
        "arn:aws:s3:::mirror-bucket-a1b2c3d",
        "arn:aws:s3:::mirror-bucket-a1b2c3d/models/*",
        f"arn:aws:s3:::mirror-bucket-a1b2c3d/{revision}/*",
    }
    (write,) = [st for st in _statements(writer) if "s3:PutObject" in st["Action"]]
    assert write["Resource"] == f"arn:aws:s3:::mirror-bucket-a1b2c3d/{revision}/*"
    assert prefixes == ["models", "models/*"]
    # Bound to the service accounts by Pod Identity, in the workloads' namespace.
    assoc = {r.inputs["serviceAccount"]: r.inputs for r in run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")}
    assert set(assoc) == {WEIGHT_SYNC_SERVICE_ACCOUNT, MIRROR_PUBLISH_SERVICE_ACCOUNT}
    assert all(a["namespace"] == run.context.spec.config.kubernetes.namespace for a in assoc.values())
    trust = json.loads(run.named(f"eks-{WEIGHT_SYNC_SERVICE_ACCOUNT}").inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(trust["Action"]) == ["sts:AssumeRole", "sts:TagSession"]


def test_ec2_instance_role_is_scoped_to_the_mirror_prefix_tools_and_its_own_secrets():
    run = plan_for("b300")
    policies = {r.name: r.inputs["policy"] for r in run.of_type("aws:iam/rolePolicy:RolePolicy")}
    actions, resources, prefixes = _mirror_rights(policies["gpu-role-weight-mirror"])
    revision = mirror_key_prefix(run.context.spec)
    assert resources == {
        "arn:aws:s3:::mirror-bucket-a1b2c3d",
        "arn:aws:s3:::mirror-bucket-a1b2c3d/models/*",
        "arn:aws:s3:::mirror-bucket-a1b2c3d/_tools/*",
        f"arn:aws:s3:::mirror-bucket-a1b2c3d/{revision}/*",
    }
    (write,) = [st for st in _statements(policies["gpu-role-weight-mirror"]) if "s3:PutObject" in st["Action"]]
    assert write["Resource"] == f"arn:aws:s3:::mirror-bucket-a1b2c3d/{revision}/*"
    tools = [s for s in _statements(policies["gpu-role-weight-mirror"]) if s["Sid"] == "ReadTools"][0]
    assert tools["Action"] == ["s3:GetObject"]
    assert prefixes == ["models", "models/*", "_tools", "_tools/*"]
    (secrets,) = _statements(policies["gpu-role-boot-secrets"])
    assert secrets["Action"] == "ssm:GetParameter"
    assert sorted(secrets["Resource"]) == [
        "arn:aws:ssm:us-east-1:123456789012:parameter/kimi-deploy/b300/expires-at",  # the trial's expiry (kimi-watch)
        "arn:aws:ssm:us-east-1:123456789012:parameter/kimi-deploy/b300/hub-token",
        "arn:aws:ssm:us-east-1:123456789012:parameter/kimi-deploy/b300/vllm-api-key",
    ]
    managed = [r.inputs["policyArn"] for r in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")]
    assert managed == []


def test_eks_nodes_get_only_the_managed_policies_they_need():
    run = plan_for("gb300")
    attached = sorted(
        r.inputs["policyArn"].rsplit("/", 1)[1]
        for r in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.name.startswith("eks-node-role-")
    )
    # No AmazonSSMManagedInstanceCore (ssm:GetParameter on "*"): Session Manager comes inline.
    assert attached == sorted(["AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy", "AmazonEC2ContainerRegistryPullOnly"])
    assert not any(
        "FullAccess" in r.inputs["policyArn"] or "AdministratorAccess" in r.inputs["policyArn"]
        for r in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    )


# -- EC2 ------------------------------------------------------------------------------------------


def test_ec2_launch_template_imdsv2_encrypted_root_and_nvidia_ami():
    run = plan_for("b300")
    lt = run.named("gpu-lt").inputs
    assert lt["metadataOptions"]["httpTokens"] == "required"
    assert lt["metadataOptions"]["httpPutResponseHopLimit"] == 1
    (root,) = lt["blockDeviceMappings"]
    assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
    assert root["ebs"]["volumeSize"] == run.context.spec.config.compute.root_volume_gib
    assert lt["instanceType"] == "p6-b300.48xlarge"
    assert lt["imageId"] == "ami-0mockfromssm0000"
    assert "keyName" not in lt
    assert "capacityReservationSpecification" not in lt and "instanceMarketOptions" not in lt
    inst = run.named("gpu-instance").inputs
    assert inst["launchTemplate"] == {"id": "gpu-lt-id", "version": "1"}
    assert inst["subnetId"] == "net-private-gpu-id"
    assert "associatePublicIpAddress" not in inst
    assert run.outputs["privateEndpoint"] == "http://10.42.1.10:8000/v1"
    assert run.outputs["availabilityZone"] == "us-east-1a" and run.outputs["gpuUsdPerHour"] == 142.416


def test_ec2_ami_is_the_dlami_of_the_cpu_architecture(monkeypatch):
    from components.aws import compute
    from components.plan_engine import CALL_RESULTS

    seen = []
    monkeypatch.setitem(
        CALL_RESULTS,
        "aws:ssm/getParameter:getParameter",
        lambda a: seen.append(a["name"]) or {"value": "ami-0dlami", "name": a["name"]},
    )
    run = plan_for("b300", overrides={"kimi-deploy:storage": {"kind": "nvme"}})
    assert seen == ["/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"]
    assert run.named("gpu-lt").inputs["imageId"] == "ami-0dlami"
    assert compute.dlami_parameter("arm64").startswith("/aws/service/deeplearning/ami/arm64/")
    with pytest.raises(ValueError):
        compute.dlami_parameter("riscv64")


def test_ec2_ami_override():
    run = plan_for(
        "b300",
        overrides={
            "kimi-deploy:compute": {
                "availabilityZone": "us-east-1a",
                "amiId": "ami-0123456789abcdef0",
                "amiArchitecture": "x86_64",
            }
        },
    )
    assert run.named("gpu-lt").inputs["imageId"] == "ami-0123456789abcdef0"


@pytest.mark.parametrize("cap_type", ["odcr", "capacity-block"])
def test_ec2_capacity_targeting_and_az_pinning(cap_type):
    compute = {"capacity": {"type": cap_type, "reservationId": "cr-0fedcba9876543210", "availabilityZone": "us-east-1c"}}
    run = plan_for("b300", overrides={"kimi-deploy:compute": compute})
    lt = run.named("gpu-lt").inputs
    assert lt["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0fedcba9876543210"}
    }
    assert lt["instanceType"] == "p6-b300.48xlarge"
    if cap_type == "capacity-block":
        assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    else:
        assert "instanceMarketOptions" not in lt
    assert run.named("net-private-gpu").inputs["availabilityZone"] == "us-east-1c"
    assert run.named("gpu-instance").inputs["subnetId"] == "net-private-gpu-id"
    assert run.outputs["capacityReservationId"] == "cr-0fedcba9876543210"


def test_ec2_secrets_are_ssm_securestrings_never_user_data():
    run = plan_for("b300")
    params = {r.inputs["name"]: r.inputs for r in run.of_type("aws:ssm/parameter:Parameter")}
    # The trial's expiry is a plain String beside them (not a secret; tests/test_aws_expiry.py).
    expiry = params.pop("/kimi-deploy/b300/expires-at")
    assert expiry["type"] == "String" and expiry["insecureValue"] == run.outputs["expiresAt"]
    assert set(params) == {"/kimi-deploy/b300/vllm-api-key", "/kimi-deploy/b300/hub-token"}
    assert all(p["type"] == "SecureString" and p["value"] == "[secret]" for p in params.values())
    assert run.secret_leaks == []


# -- EKS ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stack", "ami_type", "arch_capacity"),
    [("gb300", "AL2023_ARM_64_NVIDIA", "CAPACITY_BLOCK"), ("b300-prod", "AL2023_x86_64_NVIDIA", "ON_DEMAND")],
)
def test_eks_gpu_node_group(stack, ami_type, arch_capacity):
    run = plan_for(stack)
    spec = run.context.spec
    cluster = run.named("eks-cluster").inputs
    assert tuple(int(x) for x in cluster["version"].split(".")) >= (1, 33) and cluster["version"] == EKS_VERSION
    assert cluster["encryptionConfig"]["resources"] == ["secrets"]
    # The private endpoint (nodes) plus the IAM-authenticated public one from the deployer's address only.
    assert cluster["vpcConfig"]["endpointPrivateAccess"] is True and cluster["vpcConfig"]["endpointPublicAccess"] is True
    assert cluster["vpcConfig"]["publicAccessCidrs"] == [TEST_DEPLOYER_CIDR]
    assert cluster["accessConfig"]["authenticationMode"] == "API"
    ng = run.named("eks-gpu").inputs
    assert ng["amiType"] == ami_type
    assert ng["capacityType"] == arch_capacity
    assert ng["subnetIds"] == ["net-private-gpu-id"]
    assert run.named("net-private-gpu").inputs["availabilityZone"] == spec.availability_zone
    assert ng["scalingConfig"] == {"minSize": 0, "desiredSize": spec.gpu_nodes, "maxSize": spec.gpu_nodes}
    assert ng["labels"] == {GPU_NODE_LABEL: "true", TARGET_NODE_LABEL: spec.target.name}
    assert ng["taints"] == [{"key": GPU_TAINT_KEY, "value": "true", "effect": "NO_SCHEDULE"}]
    assert "instanceTypes" not in ng
    lt = run.named("eks-gpu-lt").inputs
    assert lt["instanceType"] == spec.instance.instance_type
    assert lt["metadataOptions"]["httpTokens"] == "required"
    assert lt["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"
    assert "imageId" not in lt
    cap = spec.config.compute.capacity
    assert lt["capacityReservationSpecification"]["capacityReservationTarget"]["capacityReservationId"] == cap.reservation_id
    if cap.type == "capacity-block":
        assert lt["instanceMarketOptions"] == {"marketType": "capacity-block"}
    else:
        assert "instanceMarketOptions" not in lt


def test_eks_gpu_nodes_raid0_nodeconfig():
    lt = plan_for("gb300").named("eks-gpu-lt").inputs
    text = base64.b64decode(lt["userData"]).decode()
    assert "Content-Type: multipart/mixed" in text and "Content-Type: application/node.eks.aws" in text
    body = text.split("Content-Type: application/node.eks.aws", 1)[1].split("--==KIMI-DEPLOY-BOUNDARY==--")[0]
    config = yaml.safe_load(body)
    assert config["apiVersion"] == "node.eks.aws/v1alpha1" and config["kind"] == "NodeConfig"
    assert config["spec"]["instance"]["localStorage"] == {"strategy": "RAID0"}
    assert "cluster" not in config["spec"]


def test_eks_custom_ami_gets_cluster_details_in_nodeconfig():
    compute = {"amiId": "ami-0123456789abcdef0", "amiArchitecture": "arm64",
               "capacity": {"type": "capacity-block", "reservationId": "cr-0fedcba9876543210", "availabilityZone": "us-east-1a"}}
    run = plan_for("gb300", overrides={"kimi-deploy:compute": compute})
    assert run.named("eks-gpu").inputs["amiType"] == "CUSTOM"
    lt = run.named("eks-gpu-lt").inputs
    assert lt["imageId"] == "ami-0123456789abcdef0"
    text = base64.b64decode(lt["userData"]).decode()
    config = yaml.safe_load(text.split("application/node.eks.aws", 1)[1].split("--==KIMI")[0])
    assert config["spec"]["cluster"]["name"] == "kimi-deploy-gb300"
    assert config["spec"]["cluster"]["cidr"] == "172.20.0.0/16"


def test_eks_multi_node_efa_interfaces_and_no_placement_group_in_a_capacity_block():
    run = plan_for("gb300", overrides=EFA_OVERRIDES)
    spec = run.context.spec
    lt = run.named("eks-gpu-lt").inputs
    nics = lt["networkInterfaces"]
    assert nics[0] == {**nics[0], "networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}
    efa = [n for n in nics if n["interfaceType"] == "efa-only"]
    # P6e's published layout: EFA-only interfaces on the odd cards 1-15 (8, not 16).
    assert sorted(n["networkCardIndex"] for n in efa) == [1, 3, 5, 7, 9, 11, 13, 15] == list(spec.instance.efa_cards)
    assert all(n["deviceIndex"] == 0 for n in efa)
    assert all(n["securityGroups"] == ["sg-eks-cluster-cluster", "net-gpu-sg-id", "net-efa-sg-id"] for n in nics)
    assert "vpcSecurityGroupIds" not in lt
    # A capacity block is placed already: a new placement group could fail the launch.
    assert not run.of_type("aws:ec2/placementGroup:PlacementGroup") and "placement" not in lt
    # b300-prod: single-node copies, EFA off: no interfaces, no placement group.
    prod = plan_for("b300-prod").named("eks-gpu-lt").inputs
    assert "networkInterfaces" not in prod and "placement" not in prod
    assert prod["vpcSecurityGroupIds"] == ["sg-eks-cluster-cluster", "net-gpu-sg-id"]


def test_eks_addons_system_nodes_kubeconfig_and_provider():
    run = plan_for("b300-prod")
    addons = sorted(r.inputs["addonName"] for r in run.of_type("aws:eks/addon:Addon"))
    assert addons == sorted(["vpc-cni", "kube-proxy", "eks-pod-identity-agent", "coredns"])
    fsx_addons = {r.inputs["addonName"] for r in plan_for("b300-prod", overrides=B300_PROD_FSX).of_type("aws:eks/addon:Addon")}
    assert "aws-fsx-csi-driver" in fsx_addons
    assert "aws-fsx-csi-driver" not in {r.inputs["addonName"] for r in plan_for("gb300").of_type("aws:eks/addon:Addon")}
    system = run.named("eks-system").inputs
    assert system["amiType"] == "AL2023_x86_64_STANDARD" and system["capacityType"] == "ON_DEMAND"
    assert system["subnetIds"] == ["net-private-gpu-id", "net-private-second-id"]
    assert run.named("eks-system-lt").inputs["metadataOptions"]["httpTokens"] == "required"
    provider = run.of_type("pulumi:providers:kubernetes")[0]
    assert provider.inputs["kubeconfig"] == "[secret]"
    assert run.outputs["kubeconfig"] == "[secret]"
    assert run.outputs["clusterName"] == "kimi-deploy-b300-prod"
    logs = run.named("eks-control-plane-logs").inputs
    assert logs["name"] == "/aws/eks/kimi-deploy-b300-prod/cluster" and logs["retentionInDays"] == 30


def test_kubeconfig_uses_aws_eks_get_token():
    from components.aws.cluster import kubeconfig_json

    cfg = json.loads(kubeconfig_json("c1", "https://x", "Q0E=", "us-east-1"))
    exec_ = cfg["users"][0]["user"]["exec"]
    assert exec_["command"] == "aws" and exec_["args"][:4] == ["eks", "get-token", "--cluster-name", "c1"]
    assert "token" not in json.dumps(cfg["users"][0]["user"]).replace("get-token", "")


def test_api_server_public_endpoint_only_for_named_cidrs():
    net = {"vpcCidr": "10.44.0.0/16", "allowedCidrs": ["10.0.0.0/8"], "apiServerPublicCidrs": ["198.18.0.0/15", "1.2.3.4/32"]}
    with pytest.raises(ConfigError, match="'198.18.0.0/15' is not a public address range"):  # benchmarking, reserved
        plan_for("gb300", overrides={"kimi-deploy:network": net})
    net["apiServerPublicCidrs"] = ["81.2.69.0/24", "1.2.3.4/32"]
    run = plan_for("gb300", overrides={"kimi-deploy:network": net})
    vpc = run.named("eks-cluster").inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is True and vpc["publicAccessCidrs"] == ["81.2.69.0/24", "1.2.3.4/32"]
    assert not _api_rules(run)  # public-cidrs alone opens nothing on the cluster security group


def _b300_prod_compute(cap_type: str, efa: bool) -> dict:
    cap = {"type": cap_type}
    if cap_type != "on-demand":
        cap.update(reservationId="cr-0fedcba9876543210", availabilityZone="us-east-1c")
    out = {"kimi-deploy:compute": {"replicas": 2, "availabilityZone": "us-east-1c", "efa": efa, "capacity": cap}}
    if efa:  # EFA needs an image with aws-ofi-nccl (test data)
        out["kimi-deploy:vllm"] = {"decodeContextParallelSize": 8, "image": "registry.example.com/vllm-efa@sha256:" + "e" * 64}
    return out


@pytest.mark.parametrize(("cap_type", "placed"), [("on-demand", True), ("odcr", False)])
def test_eks_cluster_placement_group_only_for_on_demand_capacity(cap_type, placed):
    run = plan_for("b300-prod", overrides=_b300_prod_compute(cap_type, efa=True))
    lt = run.named("eks-gpu-lt").inputs
    assert any(n["interfaceType"] == "efa-only" for n in lt["networkInterfaces"])
    groups = run.of_type("aws:ec2/placementGroup:PlacementGroup")
    if placed:
        assert [g.inputs["strategy"] for g in groups] == ["cluster"]
        assert lt["placement"] == {"groupName": "eks-gpu-placement-a1b2c3d"}
    else:
        assert groups == [] and "placement" not in lt


def test_vpc_cni_enforces_network_policy():
    run = plan_for("gb300")
    addons = {r.inputs["addonName"]: r.inputs for r in run.of_type("aws:eks/addon:Addon")}
    assert json.loads(addons["vpc-cni"]["configurationValues"]) == {"enableNetworkPolicy": "true"}
    assert all("configurationValues" not in a for name, a in addons.items() if name != "vpc-cni")


def _api_rules(run) -> list:
    """Ingress rules on the EKS cluster security group (the deployer's path to the private endpoint)."""
    return [r for r in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
            if run.references(r.inputs).get("securityGroupId") == "eks-cluster.vpcConfig.clusterSecurityGroupId"]


@pytest.mark.parametrize("name", ["gb300", "b300-prod"])
def test_an_eks_stack_without_a_path_to_its_api_is_refused_before_anything_is_declared(name):
    net = {k: v for k, v in read_stack_config(name)["kimi-deploy:network"].items() if not k.startswith("apiServer")}
    with pytest.raises(ConfigError, match=r"network.apiServerPublicCidrs: \[\] is required with network.apiServerAccess "):
        plan_for(name, overrides={"kimi-deploy:network": net})


def test_api_server_is_never_public_to_any_address():
    net = {"vpcCidr": "10.44.0.0/16", "allowedCidrs": ["10.0.0.0/8"], "apiServerPublicCidrs": ["0.0.0.0/0"]}
    with pytest.raises(ConfigError, match=r"network.apiServerPublicCidrs: '0.0.0.0/0' is broader than /8"):
        plan_for("gb300", overrides={"kimi-deploy:network": net})


PRIVATE_NETWORK = {
    "vpcId": "vpc-0123456789abcdef0",
    "privateSubnetIds": ["subnet-0123456789abcdef0"],
    "allowedCidrs": ["10.0.0.0/8"],
    "apiServerAccess": "private",
    "apiServerPrivateCidrs": ["10.8.0.0/16"],
    "apiServerPrivateSecurityGroupIds": ["sg-0123456789abcdef0"],
}


def test_private_access_opens_443_of_the_cluster_security_group_to_the_named_sources_only():
    run = plan_for("gb300", overrides={"kimi-deploy:network": PRIVATE_NETWORK})
    vpc = run.named("eks-cluster").inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True and vpc["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in vpc
    rules = {r.name: r.inputs for r in _api_rules(run)}
    assert set(rules) == {"eks-api-cidr-10.8.0.0_16", "eks-api-sg-sg-0123456789abcdef0"}
    for rule in rules.values():
        assert (rule["ipProtocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 443, 443)
    assert rules["eks-api-cidr-10.8.0.0_16"]["cidrIpv4"] == "10.8.0.0/16"
    assert rules["eks-api-sg-sg-0123456789abcdef0"]["referencedSecurityGroupId"] == "sg-0123456789abcdef0"
    assert not run.context.spec.blockers


def test_the_kubernetes_provider_waits_for_the_path_to_the_api(monkeypatch):
    """The rules exist before any Kubernetes object: the provider every object uses depends on them."""
    import pulumi_kubernetes as k8s

    seen: dict[str, list[str]] = {}
    real = k8s.Provider.__init__

    def record(self, resource_name, *args, opts=None, **kwargs):
        seen[resource_name] = [getattr(d, "_name", "?") for d in (opts.depends_on or [])] if opts else []
        real(self, resource_name, *args, opts=opts, **kwargs)

    monkeypatch.setattr(k8s.Provider, "__init__", record)
    plan_for("gb300", overrides={"kimi-deploy:network": PRIVATE_NETWORK})
    assert seen["eks-k8s"] == ["eks-cluster", "eks-api-cidr-10.8.0.0_16", "eks-api-sg-sg-0123456789abcdef0"]


def test_admin_roles_get_cluster_admin_access_entries():
    from components.aws.cluster import access_entry_suffix

    arns = ["arn:aws:iam::123456789012:role/platform-admins", "arn:aws:iam::210987654321:user/ops/alice"]
    k8s = {**read_stack_config("b300-prod")["kimi-deploy:kubernetes"], "adminRoleArns": arns}
    run = plan_for("b300-prod", overrides={"kimi-deploy:kubernetes": k8s})
    assert run.named("eks-cluster").inputs["accessConfig"]["authenticationMode"] in ("API", "API_AND_CONFIG_MAP")
    entries = run.of_type("aws:eks/accessEntry:AccessEntry")
    assert sorted(e.inputs["principalArn"] for e in entries) == sorted(arns)
    assert all(e.inputs["clusterName"] == "kimi-deploy-b300-prod" and e.inputs["type"] == "STANDARD" for e in entries)
    policies = run.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert sorted(p.inputs["principalArn"] for p in policies) == sorted(arns)
    for p in policies:
        assert p.inputs["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
        assert p.inputs["accessScope"] == {"type": "cluster"}
        assert p.inputs["clusterName"] == "kimi-deploy-b300-prod"
    # Names follow the ARN, not its position (reordering replaces nothing).
    assert {e.name for e in entries} == {f"eks-admin-{access_entry_suffix(a)}" for a in arns}
    assert not plan_for("b300-prod").of_type("aws:eks/accessEntry:AccessEntry")


def test_api_rules_are_named_by_source_and_ipv6_uses_its_field():
    """Reordering allowedCidrs must not replace rules; an IPv6 client network goes to cidrIpv6."""
    run = plan_for("b300", overrides={"kimi-deploy:network": {"allowedCidrs": ["2001:db8::/32", "10.0.0.0/8"]}})
    rules = {r.name: r.inputs for r in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
             if "-gpu-api-cidr-" in r.name}
    assert rules["net-gpu-api-cidr-10.0.0.0_8"]["cidrIpv4"] == "10.0.0.0/8"
    v6 = rules["net-gpu-api-cidr-2001-db8--_32"]
    assert v6["cidrIpv6"] == "2001:db8::/32" and "cidrIpv4" not in v6

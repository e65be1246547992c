"""Bad AWS input is a one-line ConfigError before anything is declared (issue 3, "Bad input")."""

from __future__ import annotations

import copy

import pytest

from components.core.config import namespace_config, read_stack_config
from components.core.errors import ConfigError
from components.core.load import load_stack, parse_spec
from components.plan_engine import CALL_RESULTS
from tests.conftest import B300_PROD_FSX_STORAGE, FIXED_NOW, TEST_DEPLOYER_CIDR, plan_for


def _ns(stack: str) -> dict:
    values, _ = namespace_config(read_stack_config(stack))
    return copy.deepcopy(values)


def _parse(values: dict, stack: str = "t"):
    return parse_spec(values, stack=stack, project="kimi-deploy", now=FIXED_NOW)


def _set(values: dict, path: str, value) -> dict:
    node = values
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return values


@pytest.mark.parametrize("stack", ["b300", "gb300", "b300-prod"])
def test_shipped_aws_stacks_are_valid(stack):
    spec = load_stack(stack, now=FIXED_NOW)
    assert spec.profile.provisions_aws and spec.region == "us-east-1"


@pytest.mark.parametrize(
    ("stack", "path", "value", "key", "fragment"),
    [
        # An AZ that does not offer the instance type (offering facts in targets.py).
        (
            "b300",
            "compute.availabilityZone",
            "us-east-1b",
            "kimi-deploy:compute.availabilityZone",
            "does not offer p6-b300.48xlarge",
        ),
        # A region that does not offer it (the AZ moves with it).
        ("b300", "compute.availabilityZone", "eu-west-1a", "kimi-deploy:compute.availabilityZone", "is not in region us-east-1"),
        # A capacity reservation in another AZ than the nodes' AZ.
        (
            "b300-prod",
            "compute.capacity.availabilityZone",
            "us-east-1a",
            "kimi-deploy:compute.availabilityZone",
            "differs from the capacity reservation's AZ",
        ),
        # A capacity reservation in an AZ that does not offer the type.
        (
            "gb300",
            "compute.capacity.reservationId",
            "not-a-reservation",
            "kimi-deploy:compute.capacity.reservationId",
            "not a capacity reservation id",
        ),
        # An x86 AMI on arm64 (GB300) and the reverse.
        (
            "gb300",
            "compute.amiArchitecture",
            "x86_64",
            "kimi-deploy:compute.amiArchitecture",
            "does not match p6e-gb300.36xlarge (arm64)",
        ),
        (
            "b300",
            "compute.amiArchitecture",
            "arm64",
            "kimi-deploy:compute.amiArchitecture",
            "does not match p6-b300.48xlarge (x86_64)",
        ),
        # A custom AMI must say its architecture, so the check above can run.
        (
            "b300",
            "compute.amiId",
            "ami-0123456789abcdef0",
            "kimi-deploy:compute.amiArchitecture",
            "is required with compute.amiId",
        ),
        ("b300", "compute.amiId", "my-ami", "kimi-deploy:compute.amiId", "is not an AMI id"),
        # FSx with EFA but not PERSISTENT_2.
        (
            "b300-prod",
            "storage",
            {**B300_PROD_FSX_STORAGE, "fsx": {"deploymentType": "PERSISTENT_1", "throughputPerTib": 200, "efa": True}},
            "kimi-deploy:storage.fsx.efa",
            "needs deploymentType PERSISTENT_2",
        ),
        # The API endpoint CIDRs and the VPC size.
        (
            "gb300",
            "network.apiServerPublicCidrs",
            ["not-a-cidr"],
            "kimi-deploy:network.apiServerPublicCidrs",
            "is not a CIDR block",
        ),
        ("b300", "network.vpcCidr", "10.0.0.0/26", "kimi-deploy:network.vpcCidr", "must be a /16 to /22 block"),
        ("b300", "network.allowedCidrs", ["0.0.0.0/0"], "kimi-deploy:network.allowedCidrs", "most of the internet"),
    ],
)
def test_bad_aws_input_is_one_line_error(stack, path, value, key, fragment):
    values = _set(_ns(stack), path, value)
    with pytest.raises(ConfigError) as err:
        _parse(values, stack)
    assert err.value.key == key
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_region_without_the_instance_type_is_rejected():
    values = _ns("b300")
    values["region"] = "eu-west-1"
    values["compute"].pop("availabilityZone")
    with pytest.raises(ConfigError) as err:
        _parse(values, "b300")
    assert err.value.key == "aws:region"
    assert "does not offer p6-b300.48xlarge (offered in: " in str(err.value)


def test_efa_on_a_type_without_efa_is_rejected():
    values = _ns("mi355x")
    _set(values, "compute.efa", True)
    with pytest.raises(ConfigError, match="compute.efa: true is read only on aws-ec2, aws-eks"):
        _parse(values, "mi355x")


def test_gb300_needs_an_az_without_offering_facts():
    values = _ns("gb300")
    values["compute"]["capacity"].pop("availabilityZone")
    with pytest.raises(ConfigError) as err:
        _parse(values, "gb300")
    # The capacity block's AZ is required first (subnets are pinned to it).
    assert err.value.key == "kimi-deploy:compute.capacity.availabilityZone"


def test_matching_ami_architecture_is_accepted():
    values = _set(_ns("gb300"), "compute.amiId", "ami-0123456789abcdef0")
    _set(values, "compute.amiArchitecture", "arm64")
    assert _parse(values, "gb300").config.compute.ami_id == "ami-0123456789abcdef0"


def test_existing_subnets_outside_the_reservation_az_stop_the_program(monkeypatch):
    # The live look-up (aws.ec2.get_subnets filtered by AZ) finds none of the configured subnets
    # in the reservation's AZ: the program stops before declaring any AWS resource.
    monkeypatch.setitem(CALL_RESULTS, "aws:ec2/getSubnets:getSubnets", lambda a: {"ids": [], "id": "none"})
    overrides = {
        "kimi-deploy:network": {
            "vpcId": "vpc-0123456789abcdef0",
            "privateSubnetIds": ["subnet-0aaaaaaaaaaaaaaa0", "subnet-0bbbbbbbbbbbbbbb0"],
            "allowedCidrs": ["10.0.0.0/8"],
            "apiServerPublicCidrs": [TEST_DEPLOYER_CIDR],
        }
    }
    with pytest.raises(Exception) as err:
        plan_for("b300-prod", overrides=overrides)
    text = str(err.value)
    assert "kimi-deploy:network.privateSubnetIds" in text and "us-east-1c" in text


def test_existing_vpc_is_reused_with_subnets_in_the_gpu_az():
    overrides = {
        "kimi-deploy:network": {
            "vpcId": "vpc-0123456789abcdef0",
            "privateSubnetIds": ["subnet-0aaaaaaaaaaaaaaa0", "subnet-0bbbbbbbbbbbbbbb0"],
            "allowedCidrs": ["10.0.0.0/8"],
        }
    }
    run = plan_for("b300", overrides=overrides)
    types = {r.type for r in run.resources}
    assert "aws:ec2/vpc:Vpc" not in types and "aws:ec2/natGateway:NatGateway" not in types
    endpoint = run.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")[0]
    assert endpoint.inputs["vpcId"] == "vpc-0123456789abcdef0"
    assert endpoint.inputs["routeTableIds"] == ["rtb-0mockprivate00001"]
    assert run.named("gpu-instance").inputs["subnetId"] == "subnet-0aaaaaaaaaaaaaaa0"
    sg = run.named("net-gpu-sg")
    assert sg.inputs["vpcId"] == "vpc-0123456789abcdef0"
    # s3GatewayEndpoint: false leaves an existing VPC's routing alone.
    overrides["kimi-deploy:network"]["s3GatewayEndpoint"] = False
    assert not plan_for("b300", overrides=overrides).of_type("aws:ec2/vpcEndpoint:VpcEndpoint")


def test_ec2_without_the_mirror_stops_before_declaring():
    overrides = {"kimi-deploy:storage": {"kind": "nvme", "mirror": {"enabled": False}}}
    with pytest.raises(Exception) as err:
        plan_for("b300", overrides=overrides)
    assert "kimi-deploy:storage.mirror.enabled" in str(err.value)


# A capacity block's instances are terminated 30 min before its end (components/core/capacity.py:
# AWS EC2 user guide, capacity-blocks-monitor): compute.capacity.endsAt is judged by that moment.


def test_a_block_inside_its_termination_window_leaves_no_usable_time():
    values = _set(_ns("gb300"), "compute.capacity.endsAt", "2026-11-30T12:20:00Z")  # 20 min after FIXED_NOW
    with pytest.raises(ConfigError) as err:
        _parse(values)
    assert str(err.value) == (
        "kimi-deploy:compute.capacity.endsAt: '2026-11-30T12:20:00Z' leaves no usable time (now 2026-11-30T12:00:00Z): "
        "AWS terminates the block's instances from 2026-11-30T11:50:00Z, 30 min before its end"
    )


def test_a_block_ending_just_after_the_expiry_warns_by_its_usable_end():
    values = _set(_ns("gb300"), "expiresAt", "2026-12-01T12:00:00Z")
    values = _set(values, "compute.capacity.endsAt", "2026-12-01T12:20:00Z")
    warnings = [w for w in _parse(values).warnings if "terminated from" in w]
    assert warnings == [
        "the capacity block's instances are terminated from 2026-12-01T11:50:00Z (30 min before its end "
        "2026-12-01T12:20:00Z), before the stack expires at 2026-12-01T12:00:00Z"
    ]
    values = _set(values, "compute.capacity.endsAt", "2026-12-01T12:40:00Z")
    assert not [w for w in _parse(values).warnings if "terminated from" in w]

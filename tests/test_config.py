"""Config validation: every rejection names the key, the value and what is allowed."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest

from components.core.config import api_server_access, namespace_config, read_stack_config
from components.core.errors import ConfigError
from components.core.kv_layout import mxfp4_indexer_supported
from components.core.load import load_stack, parse_spec
from components.core.targets import GPUS
from tests.conftest import FIXED_NOW, STACKS


def base(stack: str = "b300") -> dict:
    ns, _ = namespace_config(read_stack_config(stack))
    return copy.deepcopy(ns)


def reject(config: dict, key: str, *fragments: str, stack: str = "test", secrets=frozenset()) -> str:
    with pytest.raises(ConfigError) as info:
        parse_spec(config, stack=stack, now=FIXED_NOW, secrets_set=secrets)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"kimi-deploy:{key}:") or message.startswith(f"{key}:"), message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize("name", STACKS)
def test_every_stack_file_is_valid(name):
    spec = load_stack(name, now=FIXED_NOW)
    assert spec.stack == name
    assert spec.model.weights_bytes == 1_560_000_000_000


def test_unknown_target():
    cfg = base()
    cfg["target"] = "a100"
    reject(cfg, "target", "'a100'", "b300", "gb300", "mi355x")


@pytest.mark.parametrize("target,total", [("h100", "640 GB"), ("h200", "1,128 GB")])
def test_hopper_cannot_hold_the_weights(target, total):
    cfg = base()
    cfg["target"] = target
    cfg["compute"] = {"availabilityZone": "us-east-1a"}
    msg = reject(cfg, "target", total, "1.56 TB", "no native FP4")
    assert "supported: b300, gb300, mi355x" in msg


def test_unknown_platform():
    cfg = base()
    cfg["platform"] = "gcp"
    reject(cfg, "platform", "'gcp'", "aws-ec2, aws-eks, kubernetes")


def test_mi355x_on_aws_does_not_exist():
    cfg = base()
    cfg["target"] = "mi355x"
    reject(cfg, "platform", "'aws-ec2'", "not available for target mi355x", "kubernetes")


def test_gb300_needs_eks():
    cfg = base("gb300")
    cfg["platform"] = "aws-ec2"
    reject(cfg, "platform", "aws-eks")


def test_unknown_environment():
    cfg = base()
    cfg["environment"] = "dev"
    reject(cfg, "environment", "trial, staging, prod")


def test_unknown_key_is_rejected_with_its_path():
    cfg = base()
    cfg["storage"] = {**cfg["storage"], "fsx": {"throughputPerTiB": 1000}}
    reject(cfg, "storage.fsx.throughputPerTiB", "not a known key")


def test_dcp_must_divide_tp():
    cfg = base()
    cfg["vllm"] = {"decodeContextParallelSize": 3}
    reject(cfg, "vllm.decodeContextParallelSize", "3", "tensor-parallel size 8", "1, 2, 4, 8")


@pytest.mark.parametrize("throughput", [200, 50])
def test_fsx_throughput_must_match_deployment_type(throughput):
    cfg = base("b300-prod")
    cfg["storage"] = {"kind": "fsx", "fsx": {"deploymentType": "PERSISTENT_2", "throughputPerTib": throughput}}
    reject(cfg, "storage.fsx.throughputPerTib", str(throughput), "PERSISTENT_2", "125, 250, 500, 1000")


def test_fsx_throughput_outside_the_apis_range_is_out_of_range():
    cfg = base("b300-prod")
    cfg["storage"] = {"kind": "fsx", "fsx": {"deploymentType": "PERSISTENT_2", "throughputPerTib": 2000}}
    reject(cfg, "storage.fsx.throughputPerTib", "2000 is out of range (allowed: 12 to 1000)")


def test_persistent_1_throughput_tiers():
    cfg = base("b300-prod")
    cfg["storage"] = {"kind": "fsx", "fsx": {"deploymentType": "PERSISTENT_1", "throughputPerTib": 1000}}
    reject(cfg, "storage.fsx.throughputPerTib", "PERSISTENT_1", "50, 100, 200")


@pytest.mark.parametrize("capacity", [1560, 3600, 1000])
def test_fsx_capacity_must_be_a_valid_size(capacity):
    cfg = base("b300-prod")
    cfg["storage"] = {"kind": "fsx", "fsx": {"capacityGib": capacity}}
    reject(cfg, "storage.fsx.capacityGib", str(capacity), "1200, 2400, then multiples of 2400")


def test_fsx_capacity_must_hold_the_weights():
    cfg = base("b300-prod")
    cfg["storage"] = {"kind": "fsx", "fsx": {"capacityGib": 1200}}
    reject(cfg, "storage.fsx.capacityGib", "1200", "cannot hold")


def test_fsx_efa_needs_persistent_2():
    cfg = base("b300-prod")
    cfg["storage"] = {"kind": "fsx", "fsx": {"deploymentType": "PERSISTENT_1", "throughputPerTib": 200, "efa": True}}
    reject(cfg, "storage.fsx.efa", "PERSISTENT_2")


def test_fsx_metadata_iops():
    cfg = base("b300-prod")
    cfg["storage"] = {"kind": "fsx", "fsx": {"metadataIops": 5000}}
    reject(cfg, "storage.fsx.metadataIops", "5000", "1500, 3000, 6000, 12000")


def test_explicit_expiry_in_the_past():
    cfg = base()
    cfg["expiresAt"] = (FIXED_NOW - timedelta(hours=1)).isoformat()
    reject(cfg, "expiresAt", "already in the past", "2026-11-30T11:00:00Z")


def test_trial_without_expiry_uses_ttl():
    spec = parse_spec(base(), stack="t", now=FIXED_NOW)
    assert spec.expires_at is None and spec.trial_ttl_hours == 72
    assert "expires-at" not in spec.tags  # added by the program from the creation-time marker


def test_explicit_future_expiry_is_tagged():
    cfg = base()
    cfg["expiresAt"] = "2026-12-02T00:00:00Z"
    spec = parse_spec(cfg, stack="t", now=FIXED_NOW)
    assert spec.tags["expires-at"] == "2026-12-02T00:00:00Z"


@pytest.mark.parametrize("environment", ["staging", "prod"])
def test_branch_revision_outside_trial(environment):
    cfg = base()
    cfg["environment"] = environment
    reject(cfg, "model.revision", "'main'", "40-hex commit", environment)


def test_branch_revision_in_trial_warns():
    spec = parse_spec(base(), stack="t", now=FIXED_NOW)
    assert not spec.revision_is_commit
    assert any("branch, not a commit" in w for w in spec.warnings)


def test_commit_revision_is_accepted_in_prod():
    cfg = base()
    cfg["environment"] = "prod"
    cfg["model"] = {**cfg["model"], "revision": "0123456789abcdef0123456789abcdef01234567"}
    spec = parse_spec(cfg, stack="t", now=FIXED_NOW)
    assert spec.revision_is_commit and spec.protect


def test_license_must_be_acknowledged():
    cfg = base()
    cfg["model"] = {**cfg["model"], "licenseAcknowledged": False}
    reject(cfg, "model.licenseAcknowledged", ": false must be true", "USD 20M", "Internal use is exempt")


def test_region_must_offer_the_instance():
    cfg = base()
    cfg["region"] = "eu-west-1"
    cfg["compute"] = {}
    reject(cfg, "aws:region", "eu-west-1", "p6-b300.48xlarge", "us-east-1")


def test_az_must_offer_the_instance():
    cfg = base()
    cfg["compute"] = {"availabilityZone": "us-east-1b"}
    reject(cfg, "compute.availabilityZone", "us-east-1b", "us-east-1a, us-east-1c")


def test_capacity_reservation_in_another_az():
    cfg = base()
    cfg["compute"] = {
        "availabilityZone": "us-east-1a",
        "capacity": {"type": "odcr", "reservationId": "cr-0123456789abcdef0", "availabilityZone": "us-east-1c"},
    }
    reject(cfg, "compute.availabilityZone", "us-east-1a", "reservation's AZ us-east-1c")


def test_capacity_block_needs_reservation_id():
    cfg = base()
    cfg["compute"] = {"capacity": {"type": "capacity-block", "availabilityZone": "us-east-1a"}}
    reject(cfg, "compute.capacity.reservationId", "required for capacity-block")


def test_gb300_is_capacity_block_only():
    cfg = base("gb300")
    cfg["compute"] = {"capacity": {"type": "on-demand"}}
    reject(cfg, "compute.capacity.type", "on-demand", "capacity blocks")


def test_efa_off_aws_is_a_key_the_platform_does_not_read():
    cfg = base("mi355x")
    cfg["compute"] = {"efa": True}
    reject(cfg, "compute.efa", "true is read only on aws-ec2, aws-eks", "not kubernetes")


def test_ami_architecture_must_match():
    cfg = base("gb300")
    cfg["compute"] = {**cfg["compute"], "amiArchitecture": "x86_64"}
    reject(cfg, "compute.amiArchitecture", "x86_64", "arm64")


def test_open_world_cidr_is_rejected():
    cfg = base()
    cfg["network"] = {"allowedCidrs": ["0.0.0.0/0"]}
    reject(cfg, "network.allowedCidrs", "0.0.0.0/0", "internet")


def test_bad_cidr():
    cfg = base()
    cfg["network"] = {"allowedCidrs": ["10.0.0.0/33"]}
    reject(cfg, "network.allowedCidrs", "10.0.0.0/33", "CIDR")


def test_fsx_on_kubernetes_platform():
    cfg = base("mi355x")
    cfg["storage"] = {"kind": "fsx"}
    reject(cfg, "storage.kind", "'fsx' needs aws-eks", "not kubernetes")


def test_extra_args_cannot_carry_the_api_key():
    cfg = base()
    cfg["vllm"] = {"extraArgs": ["--api-key=abc"]}
    reject(cfg, "vllm.extraArgs", "--api-key", "toolkit owns")


def test_max_model_len_beyond_the_model():
    cfg = base()
    cfg["vllm"] = {"maxModelLen": 2_000_000}
    reject(cfg, "vllm.maxModelLen", "2000000 is out of range (allowed: 1024 to 1048576)")


def test_rocm_kv_cache_dtype():
    cfg = base("mi355x")
    cfg["vllm"] = {"kvCacheDtype": "fp8"}
    reject(cfg, "vllm.kvCacheDtype", "fp8", "auto, bfloat16")


def test_wrong_type_is_one_line():
    cfg = base()
    cfg["compute"] = {"replicas": "two"}
    reject(cfg, "compute.replicas", "'two'", "is not a whole number")


def test_missing_required_key():
    cfg = base()
    del cfg["owner"]
    reject(cfg, "owner", "required")


def test_plaintext_secret_in_stack_file(tmp_path):
    (tmp_path / "Pulumi.leak.yaml").write_text(
        "config:\n  kimi-deploy:target: b300\n  kimi-deploy:hfToken: hf_plaintext_value\n"
    )
    with pytest.raises(ConfigError) as info:
        load_stack("leak", stacks_dir=tmp_path, now=FIXED_NOW)
    assert "kimi-deploy:hfToken" in str(info.value)
    assert "hf_plaintext_value" not in str(info.value)


def test_missing_stack_file_lists_stacks():
    with pytest.raises(ConfigError) as info:
        load_stack("does-not-exist", now=FIXED_NOW)
    assert "--stack" in str(info.value) and "b300" in str(info.value)


# -- found by a new-user trial: each was accepted before -----------------------------------------


def test_replicas_on_ec2_must_be_one():
    cfg = base()
    cfg["compute"] = {**cfg["compute"], "replicas": 3}
    reject(cfg, "compute.replicas", "3", "must be 1 on aws-ec2", "aws-eks")


@pytest.mark.parametrize("value", [True, "2", 1.5])
def test_replicas_must_be_an_integer(value):
    cfg = base("b300-prod")
    cfg["compute"] = {**cfg["compute"], "replicas": value}
    reject(cfg, "compute.replicas", "is not a whole number")


@pytest.mark.parametrize(
    "key,where",
    [
        ("owner", lambda c, v: c.__setitem__("owner", v)),
        ("vllm.extraArgs", lambda c, v: c.__setitem__("vllm", {"extraArgs": ["--hf-token", v]})),
        ("model.servedModelName", lambda c, v: c.__setitem__("model", {**c["model"], "servedModelName": v})),
        ("kubernetes.nodeSelector.token", lambda c, v: c.__setitem__("kubernetes", {"nodeSelector": {"token": v}})),
    ],
)
@pytest.mark.parametrize(
    "token",
    [
        "hf_abcdefghijklmnopqrstuvwxyz0123",
        "ghp_abcdefghijklmnopqrstuvwxyz0123",
        "sk-abcdefghijklmnopqrstu",
        "AKIAABCDEFGHIJKLMNOP",
    ],
)
def test_credentials_in_plain_config_are_rejected_without_echo(key, where, token):
    cfg = base()
    where(cfg, token)
    msg = reject(cfg, key, "credentials in plain config")
    assert token not in msg
    # A secret key is named only for kinds this project holds (not an AWS key or a GitHub token).
    assert ("--secret" in msg) == token.startswith(("hf_", "sk-"))


def test_hf_token_flag_is_reserved():
    cfg = base()
    cfg["vllm"] = {"extraArgs": ["--hf-token", "x"]}
    reject(cfg, "vllm.extraArgs", "--hf-token", "toolkit owns")


@pytest.mark.parametrize("owner", ["", "a" * 64, "team\u202eevil", "ml platform", "-lead"])
def test_owner_must_be_a_label_value(owner):
    cfg = base()
    cfg["owner"] = owner
    reject(cfg, "owner", "1-63 letters")


@pytest.mark.parametrize("tag", ["v0.33.0 bad tag", "-v1", "a" * 129, "v1;rm"])
def test_image_tag_is_validated(tag):
    cfg = base()
    cfg["vllm"] = {"imageTag": tag}
    reject(cfg, "vllm.imageTag", "valid image tag")


def test_image_reference_is_validated():
    cfg = base()
    cfg["vllm"] = {"image": "Not An Image"}
    reject(cfg, "vllm.image", "valid image reference")
    cfg["vllm"] = {"image": "registry.example.com:5000/vllm/vllm-openai@sha256:" + "a" * 64}
    parse_spec(cfg, stack="t", now=FIXED_NOW)


@pytest.mark.parametrize("path", ["mnt/nvme", "/", "/mnt/../etc"])
def test_nvme_host_path_must_be_absolute(path):
    cfg = base("mi355x")
    cfg["kubernetes"] = {**cfg["kubernetes"], "nvmeHostPath": path}
    reject(cfg, "kubernetes.nvmeHostPath", "absolute path")


def test_allowed_namespaces_are_dns_labels():
    cfg = base("mi355x")
    cfg["kubernetes"] = {**cfg["kubernetes"], "allowedNamespaces": ["A B"]}
    reject(cfg, "kubernetes.allowedNamespaces", "'A B'", "namespace name")


@pytest.mark.parametrize("cidrs", [["0.0.0.0/1", "128.0.0.0/1"], ["10.0.0.0/7"]])
def test_broad_client_cidrs_are_rejected(cidrs):
    cfg = base()
    cfg["network"] = {"allowedCidrs": cidrs}
    reject(cfg, "network.allowedCidrs", "broader than /8")


def test_public_api_server_cidr_must_be_narrow():
    cfg = base("gb300")
    cfg["network"] = {**cfg["network"], "apiServerPublicCidrs": ["0.0.0.0/0"]}
    reject(cfg, "network.apiServerPublicCidrs", "broader than /8")


def test_no_client_network_warns():
    cfg = base()
    cfg["network"] = {"allowedCidrs": []}
    spec = parse_spec(cfg, stack="t", now=FIXED_NOW)
    assert any("no client outside" in w for w in spec.warnings)


def test_trial_expiry_cannot_be_years_away():
    cfg = base()
    cfg["expiresAt"] = "2036-01-01T00:00:00Z"
    reject(cfg, "expiresAt", "2036-01-01T00:00:00Z", "720 h", "staging")


def test_uppercase_commit_gets_a_precise_message():
    cfg = base()
    cfg["model"] = {**cfg["model"], "revision": "ABCDEF0123456789ABCDEF0123456789ABCDEF01"}
    reject(cfg, "model.revision", "upper case")


@pytest.mark.parametrize("environment", ["trial", "staging"])
def test_a_commit_one_digit_short_is_called_so_not_a_branch(environment):
    """39 hex digits is a commit cut when copied: the trial's warning called it a branch, staging's
    error said "branches move"."""
    cfg = base()
    cfg["environment"] = environment
    cfg["model"] = {**cfg["model"], "revision": "4f1e2d3c5b6a79880716253443526170819a0b1"}
    message = reject(cfg, "model.revision", "has 39 hex digits, 1 hex digit short of a commit (40)")
    assert "branch" not in message, message


def test_malformed_reservation_id():
    cfg = base()
    cfg["compute"] = {"capacity": {"type": "odcr", "reservationId": "cr-xyz", "availabilityZone": "us-east-1a"}}
    reject(cfg, "compute.capacity.reservationId", "'cr-xyz'", "not a capacity reservation id")


def test_missing_license_says_unset():
    cfg = base()
    cfg["model"] = {k: v for k, v in cfg["model"].items() if k != "licenseAcknowledged"}
    msg = reject(cfg, "model.licenseAcknowledged", "(unset) must be true")
    assert "None" not in msg


def test_license_must_be_a_real_boolean():
    cfg = base()
    cfg["model"] = {**cfg["model"], "licenseAcknowledged": "yes"}
    reject(cfg, "model.licenseAcknowledged", "'yes'")


def test_duplicate_yaml_keys_are_rejected(tmp_path):
    (tmp_path / "Pulumi.dup.yaml").write_text("config:\n  kimi-deploy:target: b300\n  kimi-deploy:target: gb300\n")
    with pytest.raises(ConfigError) as info:
        load_stack("dup", stacks_dir=tmp_path, now=FIXED_NOW)
    assert "duplicate key 'kimi-deploy:target'" in str(info.value) and "\n" not in str(info.value)


def test_secure_value_on_a_plain_key_is_rejected_without_ciphertext(tmp_path):
    (tmp_path / "Pulumi.sec.yaml").write_text("config:\n  kimi-deploy:owner:\n    secure: v1:CIPHERTEXTabc\n")
    with pytest.raises(ConfigError) as info:
        load_stack("sec", stacks_dir=tmp_path, now=FIXED_NOW)
    assert "not a secret key" in str(info.value) and "CIPHERTEXT" not in str(info.value)


# -- how `pulumi up` reaches the EKS API server (network.apiServerAccess) ------------------------------


def _eks_network(stack: str = "gb300", **keys) -> dict:
    """``stack``'s config with its network's API keys replaced by ``keys`` (None removes one)."""
    cfg = base(stack)
    net = {k: v for k, v in cfg["network"].items() if not k.startswith("apiServer")}
    net.update({k: v for k, v in keys.items() if v is not None})
    cfg["network"] = net
    return cfg


@pytest.mark.parametrize("stack", ["gb300", "b300-prod"])
def test_an_eks_stack_with_no_path_to_its_api_server_is_a_config_error(stack):
    """The old default (a private endpoint in a VPC the same run creates) was a warning, and `pulumi
    up` failed "cluster unreachable" after the cluster and GPU nodes existed (pulumi-eks#1134)."""
    reject(_eks_network(stack), "network.apiServerPublicCidrs", "[] is required with network.apiServerAccess public-cidrs",
           "(the default on aws-eks)", "curl https://checkip.amazonaws.com", "network.apiServerAccess: private",
           "network.vpcId", "network.apiServerPrivateCidrs", "cannot reach it")
    reject(_eks_network(stack, apiServerAccess="public-cidrs"), "network.apiServerPublicCidrs", "is required")


def test_private_access_in_a_vpc_the_stack_creates_has_no_path():
    cfg = _eks_network(apiServerAccess="private", apiServerPrivateCidrs=["10.8.0.0/16"])
    reject(cfg, "network.apiServerAccess", "'private' has no path from the deploying machine",
           "the stack creates the VPC in the same run", "network.vpcId", "public-cidrs with network.apiServerPublicCidrs")


_EXISTING_VPC = {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-0123456789abcdef0"]}


def test_private_access_needs_a_source_admitted_on_443():
    cfg = _eks_network(apiServerAccess="private")
    cfg["network"].update(_EXISTING_VPC)
    reject(cfg, "network.apiServerPrivateCidrs", "[] is required with network.apiServerAccess private",
           "apiServerPrivateSecurityGroupIds", "port 443 from the cluster alone")


def test_private_access_with_public_cidrs_is_refused():
    cfg = _eks_network(apiServerAccess="private", apiServerPublicCidrs=["198.51.100.7/32"], apiServerPrivateCidrs=["10.8.0.0/16"])
    cfg["network"].update(_EXISTING_VPC)
    reject(cfg, "network.apiServerPublicCidrs", "is set, but network.apiServerAccess is private")


@pytest.mark.parametrize("sources", [{"apiServerPrivateCidrs": ["10.8.0.0/16"]},
                                     {"apiServerPrivateSecurityGroupIds": ["sg-0123456789abcdef0"]}])
def test_private_access_from_an_existing_vpc_with_a_source_is_accepted(sources):
    cfg = _eks_network(apiServerAccess="private", **sources)
    cfg["network"].update(_EXISTING_VPC)
    spec = parse_spec(cfg, stack="t", now=FIXED_NOW)
    access = api_server_access(spec.config)
    assert not access.public and access.public_cidrs == () and access.vpc_id == _EXISTING_VPC["vpcId"]
    assert access.private_sources == tuple(next(iter(sources.values())))
    assert not spec.blockers and not any("API" in w for w in spec.warnings)


@pytest.mark.parametrize(
    ("cidr", "fragments"),
    [
        ("10.0.0.0/8", ("not a public address range", "network.apiServerPrivateCidrs")),
        ("100.64.0.0/10", ("not a public address range",)),  # shared address space (carrier NAT)
        ("127.0.0.1/32", ("not a public address range",)),
        ("2001:db8::/32", ("is an IPv6 block",)),
        ("0.0.0.0/0", ("broader than /8",)),
        ("198.51.100.7/24", ("not a CIDR block",)),  # host bits set
    ],
)
def test_public_api_cidrs_are_public_ipv4_blocks(cidr, fragments):
    reject(_eks_network(apiServerPublicCidrs=[cidr]), "network.apiServerPublicCidrs", repr(cidr), *fragments)


def test_at_most_40_public_api_cidrs():
    cidrs = [f"1.2.3.{i}/32" for i in range(41)]
    reject(_eks_network(apiServerPublicCidrs=cidrs), "network.apiServerPublicCidrs", "41 blocks", "at most 40", "L-93A74D60")
    assert parse_spec(_eks_network(apiServerPublicCidrs=cidrs[:40]), stack="t", now=FIXED_NOW)


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("apiServerPrivateCidrs", ["10.0.0.0/7"], "broader than /8"),
    ("apiServerPrivateCidrs", ["fd00::/8"], "is an IPv6 block"),
    ("apiServerPrivateSecurityGroupIds", ["vpn-clients"], "is not a security group id"),
    ("apiServerAccess", "public", "is not allowed (allowed: 'public-cidrs' or 'private')"),
])
def test_private_api_sources_are_checked(key, value, fragment):
    reject(_eks_network(apiServerPublicCidrs=["1.2.3.4/32"], **{key: value}), f"network.{key}", fragment)


@pytest.mark.parametrize("phase", ["serve", "stage"])
def test_a_documentation_range_blocks_pulumi_up_in_every_phase(phase):
    cfg = _eks_network(apiServerPublicCidrs=["198.51.100.0/24", "1.2.3.4/32"])
    cfg["phase"] = phase
    spec = parse_spec(cfg, stack="t", now=FIXED_NOW)
    [blocker] = spec.every_phase_blockers
    assert str(blocker).startswith(
        "kimi-deploy:network.apiServerPublicCidrs: '198.51.100.0/24' is a documentation range (RFC 5737)"
    )
    assert blocker in spec.blockers and spec.up_blockers[0] is blocker  # a stage creates the cluster too


def test_the_shipped_eks_stacks_plan_but_pulumi_up_refuses_their_example_source(monkeypatch):
    from components.core.config.stack_file import CONFIG_OVERLAY_ENV

    monkeypatch.setenv(CONFIG_OVERLAY_ENV, '{"kimi-deploy:vllm": {"imageTag": "nightly-' + "0" * 40 + '"}}')
    for stack in ("gb300", "b300-prod"):
        spec = load_stack(stack, now=FIXED_NOW)
        assert api_server_access(spec.config).public_cidrs == ("203.0.113.0/24",)
        assert [str(b) for b in spec.up_blockers][0] == (
            "kimi-deploy:network.apiServerPublicCidrs: '203.0.113.0/24' is the example value shipped in stacks/, a "
            "documentation range (RFC 5737): no machine has that address and EKS refuses reserved ranges; replace it with "
            "the egress address of the machine that runs `pulumi up` and of your CI runner (curl "
            "https://checkip.amazonaws.com, then <address>/32)"
        )  # then the stack's other example values (tests/test_aws_protection.py)


def test_the_api_keys_are_refused_off_eks_naming_the_platform_that_reads_them():
    cfg = base("b300")  # aws-ec2: no cluster, nothing is required
    cfg["network"] = {k: v for k, v in cfg["network"].items() if not k.startswith("apiServer")}
    assert not parse_spec(cfg, stack="t", now=FIXED_NOW).blockers
    cfg["network"]["apiServerPublicCidrs"] = ["203.0.113.0/24"]
    reject(cfg, "network.apiServerPublicCidrs", "is read only on aws-eks")


def test_the_replaced_private_only_key_names_its_successor():
    cfg = _eks_network(apiServerPrivateOnly=True)
    reject(cfg, "network.apiServerPrivateOnly", "true was replaced by network.apiServerAccess: public-cidrs",
           "or private (with network.vpcId and network.apiServerPrivateCidrs)")


def test_admin_role_arns_are_accepted_on_eks():
    cfg = base("gb300")
    arns = ["arn:aws:iam::123456789012:role/platform-admins", "arn:aws:iam::123456789012:user/ops/alice"]
    cfg["kubernetes"] = {**cfg["kubernetes"], "adminRoleArns": arns}
    assert parse_spec(cfg, stack="t", now=FIXED_NOW).config.kubernetes.admin_role_arns == tuple(arns)


@pytest.mark.parametrize(
    "arn",
    [
        "platform-admins",
        "arn:aws:iam::12345:role/x",
        "arn:aws:sts::123456789012:assumed-role/Admin/session",
        "arn:aws:iam::123456789012:group/admins",
        "arn:aws:iam::123456789012:role/",
    ],
)
def test_admin_role_arns_must_be_iam_role_or_user_arns(arn):
    cfg = base("gb300")
    cfg["kubernetes"] = {**cfg["kubernetes"], "adminRoleArns": [arn]}
    reject(cfg, "kubernetes.adminRoleArns", "is not an IAM role or user ARN")


def test_admin_role_arns_only_on_eks():
    cfg = base("b300")
    cfg["kubernetes"] = {"adminRoleArns": ["arn:aws:iam::123456789012:role/platform-admins"]}
    reject(cfg, "kubernetes.adminRoleArns", "is read only on aws-eks", "not aws-ec2")


def test_admin_role_arns_without_duplicates():
    cfg = base("gb300")
    cfg["kubernetes"] = {**cfg["kubernetes"], "adminRoleArns": ["arn:aws:iam::123456789012:role/a"] * 2}
    reject(cfg, "kubernetes.adminRoleArns", "twice")


@pytest.mark.parametrize("cidr", ["8.8.0.0/16", "100.64.0.0/16", "172.32.0.0/16"])
def test_a_public_vpc_range_is_refused(cidr):
    """A public range in the VPC shadows those internet addresses for everything inside it."""
    cfg = base()
    cfg["network"] = {**cfg.get("network", {}), "vpcCidr": cidr}
    reject(cfg, "network.vpcCidr", repr(cidr), "RFC 1918")


@pytest.mark.parametrize("cidr", ["10.42.0.0/16", "172.16.0.0/16", "192.168.0.0/20"])
def test_private_vpc_ranges_pass(cidr):
    cfg = base()
    cfg["network"] = {**cfg.get("network", {}), "vpcCidr": cidr}
    parse_spec(cfg, stack="test", now=FIXED_NOW)


# --- every numeric setting has a range (each reaches a rendered file: user data, argv, env, API inputs)


def _numeric_fields() -> list[tuple[str, type, dict]]:
    """``(camelCase key, int|float, {gt, ge, lt, le})`` of every number in the typed config model."""
    import types
    import typing

    from pydantic import BaseModel

    from components.core.config import RawConfig

    def leaf(annotation):
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            return leaf(args[0]) if len(args) == 1 else None
        if typing.get_origin(annotation) is typing.Annotated:
            return leaf(typing.get_args(annotation)[0])
        return annotation

    out = []

    def walk(model, prefix):
        for name, info in model.model_fields.items():
            key, kind = prefix + (info.alias or name), leaf(info.annotation)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                walk(kind, key + ".")
            elif kind in (int, float):
                bounds = {b: getattr(m, b) for m in info.metadata for b in ("gt", "ge", "lt", "le")
                          if getattr(m, b, None) is not None}
                out.append((key, kind, bounds))
            else:
                # A container of numbers bounds each item (Annotated with ge/le), never a bare int or float.
                assert not any(a in (int, float) for a in typing.get_args(info.annotation) if a is not type(None)), key

    walk(RawConfig, "")
    return out


NUMERIC_FIELDS = _numeric_fields()


def test_price_overrides_are_bounded_per_entry():
    cfg = base("b300")
    cfg["prices"] = {"natGatewayHour": 1e9}
    reject(cfg, "prices.natGatewayHour", "at most 10000")
    cfg["prices"] = {"natGatewayHour": -1}
    reject(cfg, "prices.natGatewayHour", "at least 0")


def test_the_walk_sees_the_numeric_settings():
    keys = {key for key, _, _ in NUMERIC_FIELDS}
    assert {"trialTtlHours", "timeToReady.engineInitSeconds", "storage.fsx.capacityGib", "vllm.maxModelLen"} <= keys
    assert len(keys) >= 28


@pytest.mark.parametrize(("key", "kind", "bounds"), NUMERIC_FIELDS, ids=[k for k, _, _ in NUMERIC_FIELDS])
def test_every_numeric_setting_has_a_lower_and_an_upper_bound(key, kind, bounds):
    assert {"gt", "ge"} & set(bounds) and {"lt", "le"} & set(bounds), f"{key} ({kind.__name__}) has bounds {bounds}"


@pytest.mark.parametrize(("key", "kind", "bounds"), NUMERIC_FIELDS, ids=[k for k, _, _ in NUMERIC_FIELDS])
def test_a_value_above_the_range_is_a_one_line_error(key, kind, bounds):
    upper = bounds.get("le", bounds.get("lt"))
    cfg = base("b300")
    node = cfg
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = kind(upper * 10 + 1)
    message = reject(cfg, key, "is out of range (allowed:")
    assert f"at most {upper}" in message or f"{bounds.get('ge')} to {upper}" in message, message


def test_a_measured_engine_init_reaches_the_rendered_env_only_within_its_range():
    from components.core.config.raw import MAX_MEASURED_PHASE_SECONDS
    from components.core.sizing import compute_sizing
    from components.core.vllm import build_vllm_command

    cfg = base("b300")
    cfg["timeToReady"] = {"engineInitSeconds": 10**9}
    reject(cfg, "timeToReady.engineInitSeconds", "1000000000 is out of range", "at most 86400.0")
    cfg["timeToReady"] = {"engineInitSeconds": MAX_MEASURED_PHASE_SECONDS}
    spec = parse_spec(cfg, stack="test", now=FIXED_NOW)
    env = build_vllm_command(spec, compute_sizing(spec)).roles[0].env
    assert int(env["VLLM_ENGINE_READY_TIMEOUT_S"]) >= 2 * MAX_MEASURED_PHASE_SECONDS


# --- the KV cache keys (components/core/kv_layout.py; tests/test_kv_layout.py has their figures) ---


def _with_vllm(stack: str = "b300", **keys) -> dict:
    cfg = base(stack)
    cfg["vllm"] = {**cfg.get("vllm", {}), **keys}
    return cfg


def _spec_of(cfg: dict):
    return parse_spec(cfg, stack="test", now=FIXED_NOW, secrets_set=frozenset())


def test_measured_kv_tokens_range():
    reject(_with_vllm(kvCacheTokens=0), "vllm.kvCacheTokens", "0")
    reject(_with_vllm(kvCacheTokens="2000000"), "vllm.kvCacheTokens")


def test_mxfp4_indexer_is_refused_where_vllm_does_not_write_it():
    reject(_with_vllm("mi355x", indexerCacheDtype="mxfp4"), "vllm.indexerCacheDtype", "'mxfp4'", "SM10x", "MI355X",
           "(allowed: fp8)")
    reject(_with_vllm(indexerCacheDtype="nvfp4"), "vllm.indexerCacheDtype", "'nvfp4'")
    assert [name for name, gpu in GPUS.items() if mxfp4_indexer_supported(gpu)] == ["B300", "GB300", "B200", "GB200"]
    for stack in ("b300", "gb300"):
        assert _spec_of(_with_vllm(stack, indexerCacheDtype="mxfp4")).config.vllm.indexer_cache_dtype == "mxfp4"


def test_indexer_dtype_only_through_its_key():
    reject(_with_vllm(extraArgs=["--attention-config", '{"indexer_kv_dtype":"mxfp4"}']), "vllm.extraArgs",
           "indexer_kv_dtype", "vllm.indexerCacheDtype")
    reject(_with_vllm(indexerCacheDtype="mxfp4", extraArgs=["--attention-config", "fast"]), "vllm.extraArgs", "'fast'",
           "not a JSON object")


def test_a_kv_dtype_no_sparse_backend_stores_is_refused():
    msg = reject(_with_vllm(kvCacheDtype="fp8_e5m2"), "vllm.kvCacheDtype", "'fp8_e5m2'", "FLASHINFER_MLA_SPARSE: fp8, fp8_e4m3",
                 "FLASHMLA_SPARSE: fp8")
    assert "(allowed: auto, bfloat16, fp8, fp8_e4m3)" in msg
    _spec_of(_with_vllm(kvCacheDtype="fp8_e4m3"))

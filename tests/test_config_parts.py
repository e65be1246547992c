"""Config in parts: the recorded corpus of inputs keeps every message byte for byte
(tests/config_corpus.py builds tests/fixtures/config_errors.json), and each section's checks
can be called on their own."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path

import pytest

from components.core import checks
from components.core.config import (
    compute,
    kubernetes,
    lifecycle,
    model,
    network,
    plain_secrets,
    scaling,
    storage,
    tags,
    target,
    vllm,
)
from components.core.config.raw import RawConfig, validate_raw
from components.core.errors import ConfigError, check_choice
from components.core.model import MODELS
from components.core.platforms import platform_profile
from components.core.targets import INSTANCES, TARGETS
from tests.config_corpus import FIXTURE, OVERLAY_ENV, run_case
from tests.conftest import FIXED_NOW

CORPUS = json.loads(FIXTURE.read_text())


def test_corpus_is_large_and_mostly_errors():
    cases = CORPUS["cases"]
    errors = [c for c in cases if "error" in c["expected"]]
    assert len(cases) > 900 and len(errors) > 500
    assert {c["kind"] for c in cases} == {"parse", "stack", "file"}
    # Every section of the config has at least one recorded rejection.
    keys = {e["expected"]["error"].split(":", 2)[2 if e["expected"]["error"].startswith("ConfigError: kimi-deploy") else 1]
            .split(".")[0].split(":")[0].strip() for e in errors}
    for section in ("compute", "network", "storage", "model", "vllm", "kubernetes", "autoscaling", "observability",
                    "expiresAt", "trialTtlHours", "owner", "target", "platform", "environment", "timeToReady"):
        assert section in keys, section


def test_every_recorded_outcome_is_unchanged(monkeypatch):
    monkeypatch.delenv(OVERLAY_ENV, raising=False)
    changed = []
    for i, case in enumerate(CORPUS["cases"]):
        got = run_case(case, CORPUS["bases"])
        if got != case["expected"]:
            changed.append(f"case {i} ({case.get('key') or case['kind']}):\n  was {case['expected']}\n  now {got}")
    assert not changed, f"{len(changed)} of {len(CORPUS['cases'])} outcomes changed:\n" + "\n".join(changed[:20])


def test_the_replay_can_fail(monkeypatch):
    """A check whose message changes (here the owner's) is seen by the replay."""
    monkeypatch.delenv(OVERLAY_ENV, raising=False)
    case = next(c for c in CORPUS["cases"] if "must name the owning team" in c["expected"].get("error", ""))
    assert run_case(case, CORPUS["bases"]) == case["expected"]

    def reworded(raw):
        raise ConfigError("owner", raw.owner, "is not a valid owner")

    monkeypatch.setattr(tags, "check_owner", reworded)
    assert run_case(case, CORPUS["bases"]) != case["expected"]


@pytest.mark.parametrize("stack", sorted(CORPUS["bases"]))
def test_bases_are_stack_files_as_recorded(stack):
    """The bases are a snapshot: a stack file may change later without moving the corpus."""
    assert CORPUS["bases"][stack]["owner"]


# --- each section's checks, called alone -------------------------------------------------------


KIMI = MODELS["kimi-k3.1-pro"]
# The checks take the platform's profile, resolved once by parse_spec (the b300 base runs on aws-ec2).
EC2 = platform_profile("aws-ec2")


def raw_of(base: str = "b300", **sections) -> RawConfig:
    """The raw config of a recorded base with top-level keys replaced (``None`` removes one)."""
    from tests.config_corpus import decode

    config = decode(CORPUS["bases"][base])
    for key, value in sections.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return validate_raw(config)[0]


def raises(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_errors_one_line_and_choice():
    assert str(ConfigError("owner", True, "is bad")) == "kimi-deploy:owner: true is bad"
    assert raises(check_choice, "platform", "gcp", ("a", "b")) == "kimi-deploy:platform: 'gcp' is not allowed (allowed: a, b)"
    check_choice("platform", "a", ("a", "b"))


def test_raw_rejects_an_unknown_key_with_a_hint():
    msg = raises(validate_raw, {"target": "b300", "platform": "aws-ec2", "environment": "trial", "owner": "x", "ownr": 1})
    assert msg == "kimi-deploy:ownr: '[value not shown]' is not a known key; did you mean owner?"


def test_plain_secrets_alone():
    msg = raises(plain_secrets.check_no_credentials, {"storage": {"mirror": {"prefix": "hf_" + "a" * 34}}})
    assert msg.startswith("kimi-deploy:storage.mirror.prefix: '[looks like a credential]' must not hold credentials")
    plain_secrets.check_no_credentials({"storage": {"mirror": {"prefix": "models"}}})


def test_target_alone():
    raw = raw_of(target="h100")
    supported = target.supported_targets(KIMI)
    target.check_names(raw, supported)
    msg = raises(target.check_holds_model, raw, TARGETS["h100"], KIMI, supported)
    assert "< 1.56 TB of weights" in msg and "h100" not in msg.rsplit("(supported: ", 1)[1]
    assert "is not allowed" in raises(target.check_names, raw_of(platform="gcp"), supported)
    assert "is not available for target mi355x" in raises(target.check_platform, raw_of(target="mi355x"), TARGETS["mi355x"])


def test_tags_alone():
    tags.check_owner(raw_of())
    assert "must name the owning team" in raises(tags.check_owner, raw_of(owner="a b"))


def test_model_alone():
    raw = raw_of(model={"profile": "kimi-k9", "licenseAcknowledged": True})
    assert "is not a known model" in raises(model.check_profile, raw)
    staging = raw_of(environment="staging")
    assert "must be a 40-hex commit in staging" in raises(model.check_revision_and_license, staging, KIMI, [])
    warnings: list[str] = []
    assert model.check_revision_and_license(raw_of(), KIMI, warnings) == "main"
    assert any("is a branch, not a commit" in w for w in warnings)



def test_a_hub_pull_request_revision_is_named_as_one():
    """New-user trial t060: `refs/pr/1` was warned as "a branch"; it is a pull request anyone can open,
    and the nodes run its code with --trust-remote-code."""
    pr = raw_of(model={**raw_of().model.model_dump(by_alias=True), "revision": "refs/pr/1"})
    warnings: list[str] = []
    assert model.check_revision_and_license(pr, KIMI, warnings) == "refs/pr/1"
    assert KIMI.trust_remote_code
    assert warnings == [
        "model.revision 'refs/pr/1' is a Hub pull request, which anyone can open, not the publisher's release: the "
        "nodes load its weights and, with --trust-remote-code, its Python; review it and pin its commit, or use a "
        "commit of main"
    ]
    staging = raw_of(environment="staging", model={**pr.model.model_dump(by_alias=True)})
    assert "must be a 40-hex commit in staging" in raises(model.check_revision_and_license, staging, KIMI, [])


def test_compute_alone():
    raw = raw_of()
    instance_type, instance = compute.resolve_instance(raw, TARGETS["b300"])
    assert instance is INSTANCES[instance_type]
    assert compute.check_region(raw, EC2, instance, instance_type) == raw.region
    msg = raises(compute.check_region, raw_of(region="us-east"), EC2, instance, instance_type)
    assert msg == "aws:region: 'us-east' is not an AWS region name (e.g. us-east-1)"
    odcr = raw_of(compute={"capacity": {"type": "odcr"}})
    msg = raises(compute.check_placement_and_capacity, odcr, EC2, TARGETS["b300"], instance, instance_type, raw.region, [])
    assert msg.startswith("kimi-deploy:compute.capacity.reservationId: (unset) is required for odcr")
    assert "must be 1 on aws-ec2" in raises(compute.check_replicas, raw_of(compute={"replicas": 2}), EC2)


def test_network_alone():
    warnings: list[str] = []
    network.check_network(raw_of(), EC2, warnings)
    msg = raises(network.check_network, raw_of(network={"vpcCidr": "8.8.0.0/16"}), EC2, [])
    assert msg.startswith("kimi-deploy:network.vpcCidr: '8.8.0.0/16' is not a private range")


def test_storage_alone():
    raw = raw_of()
    instance_type, instance = compute.resolve_instance(raw, TARGETS["b300"])
    storage.check_storage(raw, EC2, instance, instance_type, KIMI.weights_bytes)
    msg = raises(storage.check_storage, raw, EC2, instance, instance_type, instance.nvme_total_bytes)
    assert msg.startswith("kimi-deploy:storage.kind: 'nvme' does not fit")


def test_vllm_alone():
    warnings: list[str] = []
    vllm.check_vllm(raw_of(), TARGETS["b300"], KIMI, warnings)
    msg = raises(vllm.check_vllm, raw_of(vllm={"decodeContextParallelSize": 3}), TARGETS["b300"], KIMI, [])
    assert msg.startswith("kimi-deploy:vllm.decodeContextParallelSize: 3 must divide the tensor-parallel size 8")


def test_the_engine_check_alone():
    assert checks.engine_blocker_of(raw_of(), TARGETS["b300"], KIMI, []) is None  # the pin serves CUDA
    blocker = checks.engine_blocker_of(raw_of(), TARGETS["mi355x"], KIMI, [])
    assert isinstance(blocker, ConfigError) and "cannot serve" in str(blocker)


def test_kubernetes_alone():
    raw = raw_of(kubernetes={"namespace": "Kimi"})
    msg = raises(kubernetes.check_kubernetes, raw, EC2, "t", "kimi-deploy", FIXED_NOW, frozenset(), [])
    assert msg == "kimi-deploy:kubernetes.namespace: 'Kimi' is not a valid namespace name (lowercase DNS label)"
    assert kubernetes.eks_version_of(raw_of("gb300"))


def test_scaling_alone():
    raw = raw_of("mi355x", observability={"prometheusNamespace": "Monitoring"})
    msg = raises(scaling.check_autoscaling_and_observability, raw, platform_profile("kubernetes"), [])
    assert msg == ("kimi-deploy:observability.prometheusNamespace: 'Monitoring' is not a valid namespace name "
                   "(lowercase DNS label)")


def test_the_checks_ask_the_profile_they_are_given_not_the_name():
    """A check reads what the platform does from the profile object parse_spec passes, never by
    looking the name up again: a profile that (hypothetically) runs aws-ec2 without systemd lets
    two replicas through, and one that creates a cluster asks for the EKS API's source."""
    two = raw_of(compute={"replicas": 2})
    assert "must be 1 on aws-ec2" in raises(compute.check_replicas, two, EC2)
    compute.check_replicas(two, dataclasses.replace(EC2, serves_under_systemd=False))
    assert network.api_server_blockers(raw_of(), EC2) == []
    assert network.api_server_blockers(raw_of("gb300"), EC2) == []  # the EKS stack, asked as if aws-ec2


def test_parse_spec_looks_the_platform_up_once(monkeypatch):
    """One lookup of the platform's profile per spec (load.parse_spec), none in the config checks."""
    import ast

    from components.core import load
    from tests.config_corpus import decode

    calls: list[str] = []

    def counting(name: str):
        calls.append(name)
        return platform_profile(name)

    monkeypatch.setattr(load, "platform_profile", counting)
    for base in ("b300", "gb300", "mi355x"):
        calls.clear()
        load.parse_spec(decode(CORPUS["bases"][base]), stack="t", now=FIXED_NOW)
        assert len(calls) == 1, (base, calls)
    config_dir = Path(load.__file__).parent / "config"
    by_name = [f"{path.name}:{node.lineno}" for path in sorted(config_dir.glob("*.py")) if path.name != "spec.py"
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "platform_profile"]
    assert by_name == []


def test_platform_keys_alone():
    from components.core.config import platform_keys

    raw = raw_of(autoscaling={"enabled": True})
    msg = raises(platform_keys.check_platform_keys, raw, EC2)
    assert msg.startswith("kimi-deploy:autoscaling.enabled: true is read only on aws-eks, kubernetes")
    platform_keys.check_platform_keys(raw_of("gb300"), platform_profile("aws-eks"))


def test_lifecycle_alone():
    assert lifecycle.check_expiry(raw_of(), FIXED_NOW) is None
    past = raw_of(expiresAt=(FIXED_NOW - timedelta(hours=1)).isoformat())
    assert "is already in the past" in raises(lifecycle.check_expiry, past, FIXED_NOW)
    prod = raw_of(environment="prod", expiresAt=(FIXED_NOW + timedelta(hours=1)).isoformat())
    assert "is set on a prod stack" in raises(lifecycle.check_expiry, prod, FIXED_NOW)
    assert lifecycle.protect_of(raw_of(environment="prod")) is True and lifecycle.protect_of(raw_of()) is False
    assert "is not allowed" in raises(lifecycle.check_environment, raw_of(environment="dev"))


# --- fixes from a fresh user's trial ------------------------------------------------------------


def parse_error(base: str = "b300", **sections) -> str:
    """The one-line error of ``parse_spec`` over a recorded base with top-level keys replaced."""
    from components.core.load import parse_spec
    from tests.config_corpus import decode

    config = decode(CORPUS["bases"][base])
    config.update(sections)
    with pytest.raises(ConfigError) as info:
        parse_spec(config, stack="t", now=FIXED_NOW)
    message = str(info.value)
    assert "\n" not in message and "input should" not in message
    return message


def test_read_gbps_has_a_ceiling_per_storage_kind():
    """readGBps above what the node's storage can deliver (a Gbit/s or MB/s slip) is refused;
    the NVMe ceiling is the PCIe 5.0 x4 link of each device, the FSx one the file system's."""
    assert storage.NVME_DEVICE_MAX_READ_BYTES_PER_SECOND == pytest.approx(15.754e9, rel=1e-4)
    msg = parse_error(storage={"readGBps": 500})
    assert msg == (
        "kimi-deploy:storage.readGBps: 500.0 is more than storage.kind nvme can deliver to one p6-b300.48xlarge: "
        "8 NVMe devices x 15.75 GB/s (PCIe 5.0 x4 each) = 126.03 GB/s "
        "(allowed: more than 0 and at most 126.03; GB/s, not Gbit/s or MB/s)"
    )
    # gb300 has 3 devices: 47.26 GB/s.
    gb300 = decode_base("gb300")
    assert "= 47.26 GB/s" in parse_error("gb300", storage={**gb300["storage"], "readGBps": 50})
    # FSx: 2,400 GiB x 1000 MB/s per TiB = 2.34 GB/s for the whole file system.
    prod = decode_base("b300-prod")
    fsx = {**prod["storage"], "kind": "fsx", "readGBps": 3}
    assert "the FSx file system serves 2,400 GiB x 1000 MB/s per TiB = 2.34 GB/s" in parse_error("b300-prod", storage=fsx)
    # Figures at or under the ceiling pass (a measured 100 GB/s on 8 devices).
    raw = raw_of(storage={**decode_base("b300")["storage"], "readGBps": 100})
    instance_type, instance = compute.resolve_instance(raw, TARGETS["b300"])
    storage.check_read_gbps(raw, instance, instance_type, KIMI.weights_bytes)


def decode_base(name: str) -> dict:
    from tests.config_corpus import decode

    return decode(CORPUS["bases"][name])


def test_kubernetes_namespace_on_aws_ec2_is_refused_like_other_platform_keys():
    msg = parse_error(kubernetes={"namespace": "team-a"})
    assert msg == (
        "kimi-deploy:kubernetes.namespace: 'team-a' is read only on aws-eks, kubernetes (the Kubernetes workloads; on "
        "aws-ec2 vLLM runs under systemd), not aws-ec2: remove it"
    )
    # The same key on EKS is read (the workload namespace), and other aws-ec2 keys stay untouched.
    raw = raw_of("gb300", kubernetes={**decode_base("gb300").get("kubernetes", {}), "namespace": "team-a"})
    kubernetes.check_kubernetes(raw, platform_profile("aws-eks"), "t", "kimi-deploy", FIXED_NOW, frozenset(), [])


@pytest.mark.parametrize("key, value, expected", [
    ("network", {"allowedCidrs": "10.0.0.0/8"},
     "kimi-deploy:network.allowedCidrs: '10.0.0.0/8' is not a list (write one item per line, each starting with '- ')"),
    ("expiresAt", "next friday",
     "kimi-deploy:expiresAt: 'next friday' is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z)"),
    ("trialTtlHours", 1000, "kimi-deploy:trialTtlHours: 1000 is out of range (allowed: 1 to 720)"),
    ("trialTtlHours", 0, "kimi-deploy:trialTtlHours: 0 is out of range (allowed: 1 to 720)"),
    ("vllm", {"gpuMemoryUtilization": 0.3},
     "kimi-deploy:vllm.gpuMemoryUtilization: 0.3 is out of range (allowed: more than 0.5 and at most 0.99)"),
    ("compute", {"replicas": "two"}, "kimi-deploy:compute.replicas: 'two' is not a whole number"),
    ("observability", {"alerts": "yes"}, "kimi-deploy:observability.alerts: 'yes' is not a boolean (allowed: true, false)"),
])
def test_pydantic_wording_is_the_projects_one_line_form(key, value, expected):
    assert parse_error(**{key: value}) == expected


@pytest.mark.parametrize("text, expected", [
    ("AKIA" + "ABCDEFGHIJKLMNOP", "it looks like an AWS access key id, which no kimi-deploy key holds; remove it (the AWS "
                                  "provider reads credentials from AWS_PROFILE, the environment or a role, never the stack)"),
    ("ghp_" + "a" * 30, "it looks like a GitHub token, which no kimi-deploy key holds; remove it"),
    ("sk-" + "a" * 20, "use `pulumi config set --secret kimi-deploy:apiKey`"),
    ("hf_" + "a" * 30, "use `pulumi config set --secret kimi-deploy:hfToken`"),
])
def test_a_pasted_credential_is_sent_to_the_right_secret_or_none(text, expected):
    base = decode_base("b300")
    msg = parse_error(storage={**base["storage"], "mirror": {**base["storage"]["mirror"], "prefix": text}})
    assert msg.startswith("kimi-deploy:storage.mirror.prefix: '[looks like a credential]' must not hold credentials")
    assert msg.endswith(expected)
    assert text not in msg
    if "AKIA" in text:
        assert "apiKey" not in msg

"""Config in parts: the recorded corpus of inputs keeps every message byte for byte
(tests/config_corpus.py builds tests/fixtures/config_errors.json), and each section's checks
can be called on their own."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from components.spec.config import (
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
from components.spec.config.errors import ConfigError, check_choice
from components.spec.config.raw import RawConfig, validate_raw
from components.spec.model import MODELS
from components.spec.targets import INSTANCES, TARGETS
from tests.config_corpus import FIXTURE, OVERLAY_ENV, run_case
from tests.conftest import FIXED_NOW

CORPUS = json.loads(FIXTURE.read_text())


def test_corpus_is_large_and_mostly_errors():
    cases = CORPUS["cases"]
    errors = [c for c in cases if "error" in c["expected"]]
    assert len(cases) > 900 and len(errors) > 500
    assert {c["kind"] for c in cases} == {"parse", "stack"}
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
    """A changed message is seen: the replay compares the whole line."""
    monkeypatch.delenv(OVERLAY_ENV, raising=False)
    case = next(c for c in CORPUS["cases"] if "error" in c["expected"] and c["kind"] == "parse")
    got = run_case(case, CORPUS["bases"])
    assert got == case["expected"]
    assert {"error": got["error"] + " "} != case["expected"]


@pytest.mark.parametrize("stack", sorted(CORPUS["bases"]))
def test_bases_are_stack_files_as_recorded(stack):
    """The bases are a snapshot: a stack file may change later without moving the corpus."""
    assert CORPUS["bases"][stack]["owner"]


# --- each section's checks, called alone -------------------------------------------------------


KIMI = MODELS["kimi-k3.1-pro"]


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
    assert msg == "kimi-deploy:ownr: 1 is not a known key; did you mean owner?"


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


def test_compute_alone():
    raw = raw_of()
    instance_type, instance = compute.resolve_instance(raw, TARGETS["b300"])
    assert instance is INSTANCES[instance_type]
    assert compute.check_region(raw, instance, instance_type) == raw.region
    msg = raises(compute.check_region, raw_of(region="us-east"), instance, instance_type)
    assert msg == "aws:region: 'us-east' is not an AWS region name (e.g. us-east-1)"
    odcr = raw_of(compute={"capacity": {"type": "odcr"}})
    msg = raises(compute.check_placement_and_capacity, odcr, TARGETS["b300"], instance, instance_type, raw.region, [])
    assert msg.startswith("kimi-deploy:compute.capacity.reservationId: (unset) is required for odcr")
    assert "must be 1 on aws-ec2" in raises(compute.check_replicas, raw_of(compute={"replicas": 2}))


def test_network_alone():
    warnings: list[str] = []
    network.check_network(raw_of(), warnings)
    msg = raises(network.check_network, raw_of(network={"vpcCidr": "8.8.0.0/16"}), [])
    assert msg.startswith("kimi-deploy:network.vpcCidr: '8.8.0.0/16' is not a private range")


def test_storage_alone():
    raw = raw_of()
    instance_type, instance = compute.resolve_instance(raw, TARGETS["b300"])
    storage.check_storage(raw, instance, instance_type, KIMI.weights_bytes)
    msg = raises(storage.check_storage, raw, instance, instance_type, instance.nvme_total_bytes)
    assert msg.startswith("kimi-deploy:storage.kind: 'nvme' does not fit")


def test_vllm_alone():
    warnings: list[str] = []
    vllm.check_vllm(raw_of(), TARGETS["b300"], KIMI, warnings)
    msg = raises(vllm.check_vllm, raw_of(vllm={"decodeContextParallelSize": 3}), TARGETS["b300"], KIMI, [])
    assert msg.startswith("kimi-deploy:vllm.decodeContextParallelSize: 3 must divide the tensor-parallel size 8")
    blocker = vllm.engine_blocker_of(raw_of(), TARGETS["b300"], KIMI, [])
    assert isinstance(blocker, ConfigError) and "cannot serve" in str(blocker)


def test_kubernetes_alone():
    raw = raw_of(kubernetes={"namespace": "Kimi"})
    msg = raises(kubernetes.check_kubernetes, raw, "t", "kimi-deploy", FIXED_NOW, frozenset(), [])
    assert msg == "kimi-deploy:kubernetes.namespace: 'Kimi' is not a valid namespace name (lowercase DNS label)"
    assert kubernetes.eks_version_of(raw_of("gb300"))


def test_scaling_alone():
    raw = raw_of(autoscaling={"enabled": True})
    msg = raises(scaling.check_autoscaling_and_observability, raw, [])
    assert msg.startswith("kimi-deploy:autoscaling.enabled: true is only for the aws-eks and kubernetes platforms")


def test_lifecycle_alone():
    assert lifecycle.check_expiry(raw_of(), FIXED_NOW) is None
    past = raw_of(expiresAt=(FIXED_NOW - timedelta(hours=1)).isoformat())
    assert "is already in the past" in raises(lifecycle.check_expiry, past, FIXED_NOW)
    prod = raw_of(environment="prod", expiresAt=(FIXED_NOW + timedelta(hours=1)).isoformat())
    assert "is set on a prod stack" in raises(lifecycle.check_expiry, prod, FIXED_NOW)
    assert lifecycle.protect_of(raw_of(environment="prod")) is True and lifecycle.protect_of(raw_of()) is False
    assert "is not allowed" in raises(lifecycle.check_environment, raw_of(environment="dev"))

"""Tests for rules whose mutants survived the suite (issue 13, item 9): each test fails when the
rule it names is removed or weakened."""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta
from types import MappingProxyType

import pytest

from components.core.config import target as config_module  # where parse_spec reads TARGETS
from components.core.load import parse_spec
from components.core.sizing import compute_sizing
from components.core.targets import TARGETS
from scripts.ops import sweep
from tests.conftest import FIXED_NOW
from tests.test_config import base, reject

# --- prod never expires ------------------------------------------------------------------------


def test_prod_stack_rejects_expires_at():
    cfg = base("b300-prod")
    cfg["expiresAt"] = (FIXED_NOW + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    reject(cfg, "expiresAt", "2026-12-02T12:00:00Z", "prod stack", "prod does not expire")


def test_staging_stack_accepts_the_same_expires_at():
    cfg = base("b300-prod")
    cfg["environment"] = "staging"
    cfg["expiresAt"] = (FIXED_NOW + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert parse_spec(cfg, stack="t", now=FIXED_NOW).expires_at == FIXED_NOW + timedelta(days=2)


def _tags(environment: str, expires: str) -> dict[str, str]:
    return {sweep.TAG_STACK: "s", sweep.TAG_ENVIRONMENT: environment, sweep.TAG_EXPIRES: expires}


def test_sweeper_never_ends_a_prod_resource_even_with_a_past_expiry():
    """Decision: config rejects expiresAt on prod, and the sweeper ignores the tag on anything
    tagged environment=prod (a hand-set or stale tag must not end prod)."""
    past = "2026-11-01T00:00:00Z"
    prod = sweep.classify("instance", "i-1", "us-east-1", _tags("prod", past), FIXED_NOW)
    assert prod is not None and prod.expired is False and "prod" in prod.reason
    trial = sweep.classify("instance", "i-2", "us-east-1", _tags("trial", past), FIXED_NOW)
    assert trial is not None and trial.expired is True and trial.reason == ""


# --- the capacity reservation's AZ must offer the instance type ---------------------------------


def test_capacity_reservation_az_must_offer_the_instance_type():
    cfg = base("b300-prod")
    compute = copy.deepcopy(cfg["compute"])
    compute.pop("availabilityZone", None)
    compute["capacity"]["availabilityZone"] = "us-east-1b"  # in the region, does not offer p6-b300
    cfg["compute"] = compute
    msg = reject(cfg, "compute.capacity.availabilityZone", "'us-east-1b'", "does not offer p6-b300.48xlarge")
    assert msg.endswith("(allowed: us-east-1a, us-east-1c)")


def test_capacity_reservation_in_an_offering_az_is_accepted():
    cfg = base("b300-prod")
    compute = copy.deepcopy(cfg["compute"])
    compute.pop("availabilityZone", None)
    compute["capacity"]["availabilityZone"] = "us-east-1a"
    cfg["compute"] = compute
    assert parse_spec(cfg, stack="t", now=FIXED_NOW).config.compute.capacity.availability_zone == "us-east-1a"


# --- FSx throughput is shared by every node that reads it ----------------------------------------


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_fsx_serving_bandwidth_is_shared_by_all_nodes(replicas):
    cfg = base("b300-prod")
    cfg["storage"] = {**cfg["storage"], "kind": "fsx"}
    cfg["compute"] = {**cfg["compute"], "replicas": replicas}
    sizing = compute_sizing(parse_spec(cfg, stack="t", now=FIXED_NOW))
    st = sizing.storage
    assert st.read_bytes_per_second == st.fsx_read_bytes_per_second // replicas
    assert f"shared by {replicas} node(s)" in st.read_source and "LustreGuide/managing-throughput-capacity.html" in st.read_source
    one = compute_sizing(parse_spec({**cfg, "compute": {**cfg["compute"], "replicas": 1}}, stack="t", now=FIXED_NOW))
    assert sizing.load_seconds == pytest.approx(one.load_seconds * replicas, rel=0.01)


# --- platforms -----------------------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["aws-ec2", "aws-eks"])
@pytest.mark.parametrize("instance_type", [None, "BM.GPU.MI355X.8", "p6-b300.48xlarge"])
def test_mi355x_on_aws_is_a_config_error_not_a_key_error(platform, instance_type):
    cfg = base("mi355x")
    cfg["platform"] = platform
    cfg["region"] = "us-east-1"
    if instance_type:
        cfg["compute"] = {**cfg.get("compute", {}), "instanceType": instance_type}
    msg = reject(cfg, "platform", f"'{platform}'", "is not available for target mi355x", "(allowed: kubernetes)")
    assert "KeyError" not in msg


def test_a_stack_without_a_platform_is_told_to_set_one():
    cfg = base("gb300")
    cfg.pop("platform")
    reject(cfg, "platform", "(unset)", "required")


def test_a_target_profile_with_no_platform_gives_its_error(monkeypatch):
    """A profile whose data lists no platform: a one-line ConfigError, not a KeyError."""
    orphan = dataclasses.replace(TARGETS["b300"], name="b300", platforms=MappingProxyType({}))
    monkeypatch.setattr(config_module, "TARGETS", MappingProxyType({**TARGETS, "b300": orphan}))
    cfg = base()
    reject(cfg, "platform", "'aws-ec2'", "is not available for target b300 (allowed: none)")


# --- the KV budget is a sum of named terms, not a fit ------------------------------------------


def test_plan_shows_the_kv_budget_as_named_terms_not_a_fitted_reserve():
    """No constant fitted to the recipe's 2.6M is left: every non-KV term carries a wheel source or is
    labelled an estimate with a range, and the recipe's figure is only shown beside."""
    from scripts.ops.plan import build_plan_document

    doc = build_plan_document("b300", now=FIXED_NOW)
    assert "kv_cache_model" not in doc["sizing"]
    terms = doc["sizing"]["kv_cache_layout"]["budget"]["terms"]
    assert all(t["source"].startswith(("vLLM 0.34.0", "estimate:", "the checkpoint")) for t in terms), terms
    assert all(t["low_bytes"] < t["high_bytes"] for t in terms if t["estimate"])

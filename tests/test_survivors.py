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


# --- the KV model is labelled as fitted ----------------------------------------------------------


def test_plan_shows_the_kv_figures_as_a_fitted_model():
    from components.core.load import load_stack
    from components.core.model import KIMI_K3_1_PRO
    from scripts.ops.plan import _kv_cache_model

    fit = _kv_cache_model(load_stack("b300", now=FIXED_NOW).model)
    assert fit is not None and fit["label"].startswith("estimate: KV memory fitted to the recipe's TP8 figure")
    assert len(fit["figures"]) == 1 and "2.6M" in fit["figures"][0] and "15,744 B/token" in fit["figures"][0]
    assert fit["fitted"] == {"runtime_reserved_bytes_per_gpu": KIMI_K3_1_PRO.runtime_reserved_bytes_per_gpu}
    # The recipe's DCP8 figure is the check the fit does not pass: said, not hidden.
    assert fit["independent_check"] is not None and "18.5M" in fit["independent_check"]


def test_the_fit_reproduces_its_memory_figure():
    """The fitted reserve gives back the memory the recipe's TP8 figure implies (2.6M x 15,744 B on
    8x B300, FP8, 0.95); the tokens then follow the engine's layout, so they differ from 2.6M."""
    from components.core.model import KIMI_K3_1_PRO
    from components.core.sizing import kv_budget_bytes_per_gpu, kv_cache_tokens
    from components.core.targets import GPUS

    budget = kv_budget_bytes_per_gpu(KIMI_K3_1_PRO, GPUS["B300"], 8, 0.95)
    assert abs(budget - 2.6e6 * 15_744) <= 0.002 * budget
    tp8 = kv_cache_tokens(KIMI_K3_1_PRO, GPUS["B300"], 8, 0.95, "fp8", 1)
    assert abs(tp8 - 2.6e6) > 0.05 * 2.6e6

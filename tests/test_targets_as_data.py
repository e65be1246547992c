"""A target is data (components/core/targets.py), not a code path: an 8x B200 target (rejected for
memory, and not listed as supported in the same message) and a GB200 target (four trays, the
gb300 shape) are entries of TARGETS/INSTANCES/GPUS only; no code compares a target's name."""

from __future__ import annotations

import ast
import dataclasses
from types import MappingProxyType

import pytest

from components.core.config import target as config_module  # where parse_spec reads TARGETS
from components.core.load import parse_spec
from components.core.model import KIMI_K3_1_PRO
from components.core.sizing import compute_sizing
from components.core.targets import TARGETS
from components.core.vllm import build_vllm_command
from tests.conftest import FIXED_NOW, REPO_ROOT, plan_for
from tests.test_config import base, reject


def test_b200_is_rejected_for_memory_and_not_listed_as_supported():
    cfg = base()
    cfg["target"] = "b200"
    msg = reject(cfg, "target", "'b200'", "8x B200 = 1,538 GB", "< 1.56 TB of weights")
    supported = msg.rsplit("(supported: ", 1)[1].rstrip(")").split(", ")
    assert "b200" not in supported
    assert supported == ["b300", "gb300", "mi355x", "gb200"]


def test_unknown_target_lists_only_targets_that_fit():
    cfg = base()
    cfg["target"] = "a100"
    msg = reject(cfg, "target", "'a100'")
    allowed = msg.rsplit("(allowed: ", 1)[1].rstrip(")").split(", ")
    assert allowed == ["b300", "gb300", "mi355x", "gb200"]


def test_every_supported_target_holds_the_weights_and_b200_does_not():
    fits = {name for name, t in TARGETS.items() if t.gpu_memory_per_copy_bytes > KIMI_K3_1_PRO.weights_bytes}
    assert {"b300", "gb300", "mi355x", "gb200"} <= fits
    assert "b200" not in fits and TARGETS["b200"].unsupported_reason is None  # rejected by the rule, not by a flag


def test_gb200_four_trays_plans_end_to_end():
    """The gb300 stack with `target: gb200`: 4 trays in one TP16 group (leader + 3 workers), a
    ComputeDomain, arm64 nodes of p6e-gb200.36xlarge; no code knows the name gb200."""
    cfg = base("gb300")
    cfg["target"] = "gb200"
    spec = parse_spec(cfg, stack="t", now=FIXED_NOW)
    assert spec.gpu_nodes == 4 and spec.instance.instance_type == "p6e-gb200.36xlarge"
    command = build_vllm_command(spec, compute_sizing(spec))
    assert [(r.name, r.nodes) for r in command.roles] == [("leader", 1), ("worker", 3)]
    for role in command.roles:
        assert role.argv[role.argv.index("--tensor-parallel-size") + 1] == "16"
    run = plan_for("gb300", overrides={"kimi-deploy:target": "gb200"})
    assert run.secret_leaks == []
    types = {r.type for r in run.resources}
    assert "kubernetes:resource.nvidia.com/v1beta1:ComputeDomain" in types
    nodegroups = [
        r
        for r in run.resources
        if r.type == "aws:eks/nodeGroup:NodeGroup" and r.inputs.get("labels", {}).get("kimi-deploy/gpu-node")
    ]
    assert nodegroups and all(
        ng.inputs["scalingConfig"]["minSize"] == 4 or ng.inputs["scalingConfig"]["desiredSize"] == 4 for ng in nodegroups
    )
    assert any(r.inputs.get("instanceType") == "p6e-gb200.36xlarge" or r.inputs.get("instanceTypes") == ["p6e-gb200.36xlarge"]
               for r in run.resources if r.type in ("aws:eks/nodeGroup:NodeGroup", "aws:ec2/launchTemplate:LaunchTemplate"))


def test_gb200_on_two_trays_is_rejected_for_memory(monkeypatch):
    """The same data with 2 trays (8 x 186 GB = 1,488 GB) cannot hold 1.56 TB."""
    two_trays = dataclasses.replace(TARGETS["gb200"], nodes_per_copy=2)
    monkeypatch.setattr(config_module, "TARGETS", MappingProxyType({**TARGETS, "gb200": two_trays}))
    cfg = base("gb300")
    cfg["target"] = "gb200"
    msg = reject(cfg, "target", "8x GB200 = 1,488 GB", "< 1.56 TB")
    assert "gb200" not in msg.rsplit("(supported: ", 1)[1]


@pytest.mark.parametrize("target, reason", [("gb300", "AWS sells GB300 only as UltraServer capacity blocks"),
                                            ("gb200", "AWS sells GB200 only as UltraServer capacity blocks")])
def test_capacity_rule_is_a_profile_field(target, reason):
    cfg = base("gb300")
    cfg["target"] = target
    cfg["compute"] = {**cfg["compute"], "capacity": {"type": "on-demand"}, "availabilityZone": "us-east-1a"}
    msg = reject(cfg, "compute.capacity.type", f"is not available for {target}: {reason} (allowed: capacity-block)")
    assert (
        msg == f"kimi-deploy:compute.capacity.type: 'on-demand' is not available for {target}: {reason} (allowed: capacity-block)"
    )


def _target_name_comparisons(path) -> list[str]:
    """``x == "gb300"`` / ``x in ("b300", ...)`` / ``match`` on a target name in the code at ``path``."""
    names = set(TARGETS)
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                consts = [side] if isinstance(side, ast.Constant) else list(getattr(side, "elts", []))
                if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                    found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    return found


def test_no_code_compares_target_names():
    offenders = []
    for folder in ("components", "scripts", "policy"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            offenders += _target_name_comparisons(path)
    assert offenders == []


def test_the_name_check_detector_can_fail(tmp_path):
    bad = REPO_ROOT / "components" / "_probe_for_test.py"
    try:
        bad.write_text('def f(t):\n    return t.name == "gb300" or t in ("b300", "x")\n')
        assert len(_target_name_comparisons(bad)) == 2
    finally:
        bad.unlink()

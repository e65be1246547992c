"""Multi-node transport is chosen and visible (gb300: TP8 over multi-node NVLink, EFA opt-in)."""

from __future__ import annotations

import json

import pytest

from components.core.config import namespace_config, read_stack_config
from components.core.errors import ConfigError
from components.core.load import load_stack, parse_spec
from components.core.vllm import build_vllm_command
from tests.conftest import FIXED_NOW, plan_for

EFA_IMAGE = "registry.example.com/vllm-efa@sha256:" + "e" * 64


def _spec(stack, compute=None, vllm=None):
    ns, secrets = namespace_config(read_stack_config(stack))
    ns["compute"] = {**ns.get("compute", {}), **(compute or {})}
    if vllm is not None:
        ns["vllm"] = {k: v for k, v in ns.get("vllm", {}).items() if k != "imageTag"} | vllm
    return parse_spec(ns, stack=stack, now=FIXED_NOW, secrets_set=secrets)


def _pod_containers(run):
    for res in run.resources:
        text = json.dumps(res.inputs)
        if res.type.startswith("kubernetes:") and '"containers"' in text:
            yield res, text


def test_gb300_requests_no_efa_and_logs_the_nccl_transport():
    run = plan_for("gb300")
    spec = run.context.spec
    assert not spec.efa_enabled
    for res, text in _pod_containers(run):
        assert "vpc.amazonaws.com/efa" not in text, res.name
    for role in run.context.vllm.roles:
        assert role.env["NCCL_DEBUG"] == "INFO" and "NET" in role.env["NCCL_DEBUG_SUBSYS"]
        assert role.env["NCCL_MNNVL_ENABLE"] == "1" and "FI_PROVIDER" not in role.env
    # No EFA interfaces on the nodes, no EFA device plugin.
    assert not [n for n in run.named("eks-gpu-lt").inputs.get("networkInterfaces", []) if n.get("interfaceType") == "efa-only"]
    assert all("efa" not in r.name for r in run.resources if r.type == "kubernetes:helm.sh/v3:Release")


def test_single_node_stacks_do_not_log_nccl_at_info():
    assert "NCCL_DEBUG" not in build_vllm_command(load_stack("b300", now=FIXED_NOW)).role("server").env


@pytest.mark.parametrize("vllm", [None, {"imageTag": "nightly-" + "1" * 40}, {"image": "vllm/vllm-openai@sha256:" + "a" * 64}])
def test_efa_needs_an_image_with_aws_ofi_nccl(vllm):
    with pytest.raises(ConfigError, match="compute.efa: true needs vllm.image .*aws-ofi-nccl"):
        _spec("gb300", {"efa": True}, vllm)


def test_efa_with_a_capable_image_requests_the_devices_and_pins_the_provider():
    spec = _spec("gb300", {"efa": True}, {"image": EFA_IMAGE})
    assert spec.efa_enabled
    for role in build_vllm_command(spec).roles:
        assert role.env["FI_PROVIDER"] == "efa" and role.env["NCCL_DEBUG"] == "INFO"
    overrides = {
        "kimi-deploy:compute": {**read_stack_config("gb300")["kimi-deploy:compute"], "efa": True},
        "kimi-deploy:vllm": {"image": EFA_IMAGE},
    }
    run = plan_for("gb300", overrides=overrides)
    assert any("vpc.amazonaws.com/efa" in text for _, text in _pod_containers(run))

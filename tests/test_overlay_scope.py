"""The overlay banner names only the stack's own keys: what KIMI_DEPLOY_CONFIG_OVERLAY sets for every
stack and what it scopes to this one, never a key scoped to another stack (the plan document, its
Markdown and table first line, and the notice commands print on standard error)."""

from __future__ import annotations

import json

import pytest

from scripts.ops import _cli
from tests.conftest import FIXED_NOW, TEST_ENGINE_TAG

OVERLAY = {
    "kimi-deploy:vllm": {"imageTag": TEST_ENGINE_TAG},
    "stacks": {
        "b300": {"kimi-deploy:owner": "b300-team"},
        "gb300": {"kimi-deploy:network": {"apiServerPublicCidrs": ["198.51.100.7/32"]}, "kimi-deploy:protect": False},
    },
}
OWN = ["kimi-deploy:vllm.imageTag", "kimi-deploy:owner"]
OTHERS = ("kimi-deploy:network.apiServerPublicCidrs", "kimi-deploy:protect", "gb300")


@pytest.fixture(autouse=True)
def overlay(monkeypatch):
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps(OVERLAY))


def test_the_plan_names_the_stacks_own_keys_only():
    from scripts.ops.plan import build_plan_document, overlay_line, render_markdown

    doc = build_plan_document("b300", now=FIXED_NOW)
    assert doc["config_overlay"] == OWN
    line = overlay_line(doc)
    assert line is not None and all(key in line for key in OWN)
    first = render_markdown(doc).splitlines()[0]
    for other in OTHERS:
        assert other not in line and other not in first, (other, first)


def test_the_notice_names_the_stacks_own_keys_and_every_key_without_a_stack():
    notice = _cli.overlay_notice("over stacks/Pulumi.b300.yaml", "b300")
    assert notice is not None and ", ".join(OWN) in notice
    assert not any(other in notice for other in OTHERS), notice
    everything = _cli.overlay_notice()
    assert everything is not None and "kimi-deploy:protect (stack gb300)" in everything
    assert "kimi-deploy:owner (stack b300)" in everything


def test_a_stack_the_overlay_does_not_touch_is_told_so(monkeypatch):
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps({"stacks": OVERLAY["stacks"]}))
    notice = _cli.overlay_notice("over stacks/Pulumi.mi355x.yaml", "mi355x")
    assert notice is not None and "nothing for this stack" in notice
    assert not any(other in notice for other in ("kimi-deploy:owner", *OTHERS)), notice

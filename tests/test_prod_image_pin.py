"""Prod refuses a mutable engine image (issue 34, Why 8: "prod accepts a mutable image tag").

A tag (``:v0.34.0``, ``:nightly-<commit>``) can be pushed again and the nodes pull with
``IfNotPresent``: two nodes of one prod stack may run two builds. A stack marked
``environment: prod`` is blocked from `pulumi up` until ``vllm.image`` is pinned by digest (the
plan still renders and names the command); ``kimi-deploy engine verify`` prints the line that pins it.
"""

from __future__ import annotations

import shlex

import pytest

from components.core.config import namespace_config, read_stack_config
from components.core.load import parse_spec
from scripts.ops import engine_verify
from tests.conftest import FIXED_NOW

DIGEST = "sha256:" + "0123456789abcdef" * 4
NIGHTLY = "vllm/vllm-openai:nightly-" + "a1b2c3d4e5" * 4


def _spec(stack: str, **vllm: str):
    """The stack's spec with ``vllm`` keys replacing its engine (the suite's overlay gives every
    stack a stand-in ``imageTag``; an ``image`` given here replaces it)."""
    full = dict(read_stack_config(stack))
    if vllm:
        kept = {k: v for k, v in full.get("kimi-deploy:vllm", {}).items() if k not in ("image", "imageTag")}
        full["kimi-deploy:vllm"] = {**kept, **vllm}
    ns, secrets = namespace_config(full)
    return parse_spec(ns, stack=stack, now=FIXED_NOW, secrets_set=secrets)


def _image_blockers(spec) -> list[str]:
    return [str(b) for b in spec.up_blockers if "vllm.image" in str(b)]


def test_b300_prod_as_shipped_is_blocked_by_its_mutable_tag_and_names_the_command(monkeypatch):
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY", raising=False)  # the stack file alone
    spec = _spec("b300-prod")
    assert spec.environment == "prod"
    (message,) = _image_blockers(spec)
    assert "'vllm/vllm-openai:v0.34.0' is a tag" in message
    assert "kimi-deploy engine verify --image vllm/vllm-openai:v0.34.0 --stack b300-prod" in message


@pytest.mark.parametrize("image", [NIGHTLY, "vllm/vllm-openai:v0.34.0"])
def test_every_tag_is_refused_on_prod(image):
    assert _image_blockers(_spec("b300-prod", image=image))


def test_a_tag_is_refused_through_image_tag_too():
    (message,) = _image_blockers(_spec("b300-prod", imageTag="v0.34.0"))
    assert "vllm/vllm-openai:v0.34.0" in message


def test_a_digest_pin_clears_it_and_a_trial_is_not_held_to_it():
    assert _image_blockers(_spec("b300-prod", image=NIGHTLY))  # the same stack, blocked by a tag
    assert not _image_blockers(_spec("b300-prod", image=f"vllm/vllm-openai@{DIGEST}"))
    assert not _image_blockers(_spec("b300-prod", image=f"{NIGHTLY}@{DIGEST}"))  # tag and digest: the digest wins
    assert _spec("b300").environment != "prod" and not _image_blockers(_spec("b300"))


def test_the_line_engine_verify_prints_is_the_pin_prod_accepts():
    """What `engine verify` prints for a proven build (its registry digest resolved) is a
    `pulumi config set` of vllm.image to repo@sha256:...; that value clears the block."""
    assert _image_blockers(_spec("b300-prod", image="vllm/vllm-openai:v0.34.0"))
    pinned = engine_verify.pick_digest("vllm/vllm-openai:v0.34.0", [f"docker.io/vllm/vllm-openai@{DIGEST}"])
    assert pinned is not None and pinned.endswith(f"@{DIGEST}")
    line = engine_verify.config_set_line("b300-prod", pinned)
    argv = shlex.split(line)
    assert argv[:6] == ["pulumi", "config", "set", "--stack", "b300-prod", "--path"]
    assert argv[6] == "kimi-deploy:vllm.image"
    assert not _image_blockers(_spec("b300-prod", image=argv[7]))

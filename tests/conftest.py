"""Shared fixtures: stack names and cached offline plans (the real program under mocks)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from components.spec.config import read_stack_config, stack_names

REPO_ROOT = Path(__file__).resolve().parents[1]
# Scripts the tests start as subprocesses (`python scripts/plan.py`, `python -c ...`) import the
# package the way an installed checkout does: through PYTHONPATH (this checkout first), not
# sys.path edits in the scripts. The test process itself gets the root from pytest's
# `pythonpath` option (pyproject.toml).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)

# A fixed clock for every test: stack files are checked against it, plans are reproducible.
FIXED_NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
# Secret values set in every plan run; tests assert none of them appears in any output.
TEST_SECRETS = {
    "hfToken": "hf_TESTSECRETtoken0123456789abcdef",
    "modelscopeToken": "ms-TESTSECRET-0123456789abcdef",
    "apiKey": "sk-TESTSECRET-apikey-0123456789abcdef",
    "kubeconfig": "apiVersion: v1\nkind: Config\nusers:\n- name: TESTSECRET-kubeconfig-user\n",
}

STACKS = stack_names()

# No vLLM release serves K3.1 Pro yet, so every shipped stack is refused until its owner sets
# kimi-deploy:vllm.image (components/spec/engine.py). Tests of everything else plan the stacks
# with this stand-in engine: an immutable nightly-by-commit tag (test data, not a real commit),
# given the way a user gives one (config), through the offline overlay. Tests of the refusal
# itself clear it (tests/test_engine.py).
TEST_ENGINE_TAG = "nightly-" + "0" * 40
TEST_ENGINE_OVERLAY = '{"kimi-deploy:vllm": {"imageTag": "' + TEST_ENGINE_TAG + '"}}'
os.environ.setdefault("KIMI_DEPLOY_CONFIG_OVERLAY", TEST_ENGINE_OVERLAY)
_PLAN_CACHE: dict[tuple, object] = {}


def plan_for(stack: str, *, with_secrets: bool = True, overrides: dict | None = None):
    """The recorded mock run of ``stack`` (cached), with ``TEST_SECRETS`` set.

    ``overrides`` replaces full config keys (``{"kimi-deploy:vllm": {...}}``) and disables caching.
    """
    from components.plan_engine import run_program

    key = (stack, with_secrets)
    if overrides is None and key in _PLAN_CACHE:
        return _PLAN_CACHE[key]
    config = dict(read_stack_config(stack))
    config.update(overrides or {})
    run = run_program(config, stack=stack, secrets=TEST_SECRETS if with_secrets else None, now=FIXED_NOW)
    if overrides is None:
        _PLAN_CACHE[key] = run
    return run


@pytest.fixture(params=STACKS)
def stack(request) -> str:
    """Every stack in stacks/."""
    return request.param


@pytest.fixture
def plan(stack):
    """The mock run of each stack."""
    return plan_for(stack)


def pytest_configure(config):
    os.environ.setdefault("KIMI_DEPLOY_NOW", FIXED_NOW.isoformat())

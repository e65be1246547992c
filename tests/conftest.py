"""Shared fixtures: stack names and cached offline plans (the real program under mocks)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from components.core.config import read_stack_config, stack_names
from components.core.versions import VLLM_RELEASE_GAPS

# make test's progress: each heavy tier's start and end with the elapsed time (tests/progress.py).
pytest_plugins = ["tests.progress"]

REPO_ROOT = Path(__file__).resolve().parents[1]
# Scripts the tests start as subprocesses (`python scripts/ops/plan.py`, `python -c ...`) import the
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

# The pinned release serves K3.1 Pro on NVIDIA but not on ROCm, so mi355x is refused until its
# owner sets kimi-deploy:vllm.image (components/core/engine.py). Tests of everything else plan the
# stacks with this stand-in engine: an immutable nightly-by-commit tag (test data, not a real
# commit), given the way a user gives one (config), through the offline overlay, so every stack
# plans the same way whatever the pin. Tests of the default pin clear it (tests/test_engine.py).
TEST_ENGINE_TAG = "nightly-" + "0" * 40
# Likewise the EKS stacks ship a documentation range as the only source of their public API endpoint
# (`pulumi up` refuses it: config/network.py api_server_blockers); the tests plan them with this
# stand-in egress address (a public address, test data), given the same way. The other platforms
# do not read the key.
TEST_DEPLOYER_CIDR = "1.2.3.4/32"
# Scoped to the stacks whose platform reads the key (a key a platform does not read is refused:
# components/core/config/platform_keys.py).
# The other shipped example values (components/core/examples.py: the reservation ids, the example
# commit) block `pulumi up` too; the tests plan with these stand-ins (test data, not real ids),
# given to the stacks that ship an example, so the mocked program runs as after a user's edit.
TEST_RESERVATION_ID = "cr-0fedcba9876543210"
TEST_REVISION = "0123456789abcdef0123456789abcdef01234567"
# A prod stack refuses an engine tag (config/lifecycle.py prod_image_blocker): the stand-in engine
# pinned by a digest there (test data, not a real digest), as `engine verify` prints the line.
TEST_ENGINE_DIGEST = "sha256:" + "0" * 64


def _stand_ins(stack: str) -> dict:
    """The overlay keys that replace ``stack``'s shipped example values with the stand-ins."""
    from components.core.examples import SHIPPED_EXAMPLE_VALUES

    config = read_stack_config(stack)
    out: dict = {}
    if config.get("kimi-deploy:platform") == "aws-eks":
        out["kimi-deploy:network"] = {"apiServerPublicCidrs": [TEST_DEPLOYER_CIDR]}
    capacity = (config.get("kimi-deploy:compute") or {}).get("capacity") or {}
    if capacity.get("reservationId") in SHIPPED_EXAMPLE_VALUES["compute.capacity.reservationId"]:
        out["kimi-deploy:compute"] = {"capacity": {"reservationId": TEST_RESERVATION_ID}}
    if (config.get("kimi-deploy:model") or {}).get("revision") in SHIPPED_EXAMPLE_VALUES["model.revision"]:
        out["kimi-deploy:model"] = {"revision": TEST_REVISION}
    return out


def _engine_stand_in(stack: str) -> dict:
    """The stand-in engine of ``stack`` beyond the general ``imageTag``: on a prod stack, pinned by digest."""
    config = read_stack_config(stack)
    if config.get("kimi-deploy:environment") != "prod":
        return {}
    from components.core.targets import TARGETS
    from components.core.versions import vllm_image

    family = TARGETS[config["kimi-deploy:target"]].image_family
    return {"kimi-deploy:vllm": {"imageTag": None, "image": f"{vllm_image(family, TEST_ENGINE_TAG)}@{TEST_ENGINE_DIGEST}"}}


_DEPLOYER_BY_STACK = {stack: keys for stack in STACKS if (keys := _stand_ins(stack))}
_ENGINE_BY_STACK = {stack: keys for stack in STACKS if (keys := {**_stand_ins(stack), **_engine_stand_in(stack)})}
TEST_ENGINE_OVERLAY = json.dumps({"kimi-deploy:vllm": {"imageTag": TEST_ENGINE_TAG}, "stacks": _ENGINE_BY_STACK})
os.environ.setdefault("KIMI_DEPLOY_CONFIG_OVERLAY", TEST_ENGINE_OVERLAY)
# The stand-in source alone: the shipped engine pin with a reachable EKS API.
DEPLOYER_ONLY_OVERLAY = json.dumps({"stacks": _DEPLOYER_BY_STACK})
# A release known not to serve the model on any vendor (versions.VLLM_RELEASE_GAPS), for tests of
# what a refused engine does (a stage is allowed, serve is not); the EKS API reachable.
REFUSED_RELEASE = next(v for v, gaps in VLLM_RELEASE_GAPS.items() if all(gaps.get(f) for f in ("cuda", "rocm")))
REFUSED_ENGINE_CONFIG = {"kimi-deploy:vllm": {"imageTag": f"v{REFUSED_RELEASE}"}}
REFUSED_ENGINE_OVERLAY = json.dumps({**REFUSED_ENGINE_CONFIG, "stacks": _DEPLOYER_BY_STACK})
# Preflight's egress look-up (kubernetes-api) never leaves this machine in a test: empty = do not
# look up; tests that exercise it pass a URL on 127.0.0.1.
os.environ.setdefault("KIMI_DEPLOY_CHECKIP_URL", "")
# The first line every config-reading command prints while that overlay is set (scripts/ops/_cli.py
# overlay_notice); tests of a command's own stderr look past it with ``without_overlay_notice``.
OVERLAY_NOTICE_PREFIX = "note: KIMI_DEPLOY_CONFIG_OVERLAY is active: "

# b300-prod with FSx for Lustre (an opt-in: b300-prod copies from the mirror straight onto NVMe), as
# the FSx tests plan it: the import from the mirror, then a copy onto each node's NVMe.
B300_PROD_FSX_STORAGE = {
    **read_stack_config("b300-prod")["kimi-deploy:storage"],
    "kind": "nvme-from-fsx",
    "fsx": {"deploymentType": "PERSISTENT_2", "throughputPerTib": 1000, "efa": False},
}
B300_PROD_FSX = {"kimi-deploy:storage": B300_PROD_FSX_STORAGE}


def without_overlay_notice(proc):
    """``proc`` (a CompletedProcess) with the overlay notice taken off the start of its stderr;
    the notice must be there while the overlay is set (and not otherwise)."""
    import subprocess

    first, _, rest = proc.stderr.partition("\n")
    if first.startswith(OVERLAY_NOTICE_PREFIX):
        return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, rest)
    return proc
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
    config.addinivalue_line(
        "markers",
        "real_engine: starts the real vLLM CPU engine (tests/real_vllm); skipped without its venv, failed under CI=true",
    )


def in_ci() -> bool:
    """``CI`` is set to something true (``.ci/run`` sets ``CI=true``): what may skip locally must fail."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_real_engine() -> None:
    """Skip (locally) or fail (``CI=true``) when the vLLM CPU engine venv is missing."""
    from tests.real_vllm import engine_missing_reason

    reason = engine_missing_reason()
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI=true and the real-engine tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def require_pinned_frontend() -> None:
    """Skip (locally) or fail (``CI=true``) when the pinned release's parser venv or the engine is missing."""
    from tests.real_vllm import frontend_missing_reason

    reason = frontend_missing_reason()
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI=true and the pinned-frontend tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def real_vllm_server():
    """The good real server: the b300 command our code renders, on the CPU engine, on 127.0.0.1.

    Yields a ``tests.real_vllm.RealVllmServer`` (``base_url``, ``api_key``, ``served_model_name``,
    ``metrics_url``, ``argv``, ``env``, ``startup_seconds``). Started once per session (minutes on
    2 cores), stopped at the end.
    """
    require_real_engine()
    from tests.real_vllm import RealVllmServer

    with RealVllmServer() as server:
        yield server


def pytest_terminal_summary(terminalreporter):
    """The VM tier's measured boot phases, when its scenarios ran (tests/test_vm_boot.py)."""
    import sys

    module = sys.modules.get("tests.test_vm_boot")
    for line in module.summary_lines() if module is not None else []:
        terminalreporter.write_line(line)


@pytest.fixture
def fake_aws_env(monkeypatch):
    """Test credentials and region for moto: no real profile or endpoint can leak in."""
    for var in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def moto_aws(fake_aws_env):
    """moto's in-process AWS (``mock_aws``) with ``fake_aws_env``."""
    from moto import mock_aws

    with mock_aws():
        yield


@pytest.fixture(scope="module")
def moto_server():
    """A moto server on 127.0.0.1 for subprocesses and s5cmd (one per test module)."""
    pytest.importorskip("moto.server")
    from tests.sync_fixtures import MotoServer

    with MotoServer() as server:
        yield server


@pytest.fixture
def sync_s3(moto_server, monkeypatch):
    """A boto3 client on ``moto_server``, with the environment weight_sync will see and fast retries."""
    import boto3

    from scripts.node.weight_sync import retry
    from tests.sync_fixtures import S3_ENV

    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setattr(retry, "RETRY_BASE_SECONDS", 0.01)
    return boto3.client("s3", endpoint_url=moto_server.endpoint)


@pytest.fixture(scope="session")
def pinned_frontend_server(real_vllm_server):
    """The pinned vLLM release's own frontend (its parsers, renderer and serving) over the good real
    server's engine: ``tests.real_vllm.PinnedFrontendServer``, started once per session."""
    require_pinned_frontend()
    from tests.real_vllm import PinnedFrontendServer

    with PinnedFrontendServer(real_vllm_server) as server:
        yield server

"""EC2 boot chain that survives a retry (components/aws/userdata.py systemd units).

systemd semantics held here (systemd.unit(5), systemd.service(5), systemd 252 as on AL2023):
a unit that ``Requires=`` a failing one-shot has its queued start failed for good, even when the
one-shot's ``Restart=`` later succeeds; so vLLM must be STARTED by the weights unit on success,
not pulled in by a dependency. The units are also checked by the real ``systemd-analyze verify``
(Debian's systemd 252, the same major version as AL2023). The chain itself is booted by the VM
tier (tests/test_vm_boot.py): these are the unit-level rules, cheap enough for every run.
"""

from __future__ import annotations

import base64
import shutil
import subprocess

import pytest
import yaml

from components.aws import userdata
from components.core.sizing import compute_sizing, sync_budget_seconds
from components.core.weights import sync_steps
from tests.conftest import plan_for


@pytest.fixture(scope="module")
def run():
    return plan_for("b300")


@pytest.fixture(scope="module")
def cloud_config(run):
    return yaml.safe_load(base64.b64decode(run.named("gpu-lt").inputs["userData"]).decode())


@pytest.fixture(scope="module")
def units(cloud_config):
    return {
        f["path"].rsplit("/", 1)[1]: f["content"]
        for f in cloud_config["write_files"]
        if f["path"].startswith("/etc/systemd/system/")
    }


def _parse(text: str) -> dict[str, dict[str, list[str]]]:
    """unit file -> section -> key -> values (repeated keys kept)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out[section] = {}
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key, []).append(value)
    return out


def test_vllm_does_not_require_the_weights_unit_and_is_not_enabled_on_its_own(units, cloud_config):
    vllm = _parse(units["kimi-vllm.service"])
    requires = " ".join(vllm["Unit"].get("Requires", []) + vllm["Unit"].get("BindsTo", []) + vllm["Unit"].get("Requisite", []))
    assert "kimi-weights.service" not in requires
    assert "kimi-weights.service" in " ".join(vllm["Unit"]["After"])  # ordering only
    assert "Install" not in vllm  # never started by a target without the weights
    enabled = [c for c in cloud_config["runcmd"] if c[:2] == ["systemctl", "enable"]]
    assert enabled and "kimi-vllm.service" not in enabled[0]
    started = [c for c in cloud_config["runcmd"] if c[:2] == ["systemctl", "start"]]
    assert started == [["systemctl", "start", "--no-block", "kimi-weights.service"]]


def test_weights_unit_starts_vllm_after_any_successful_attempt(units):
    weights = _parse(units["kimi-weights.service"])["Service"]
    # ExecStartPost runs only after ExecStart succeeded, on every attempt that succeeds.
    assert weights["ExecStartPost"] == ["/usr/bin/systemctl start --no-block kimi-vllm.service"]
    assert weights["Type"] == ["oneshot"] and weights["Restart"] == ["on-failure"]
    assert "RestartMode" not in weights  # systemd 254+, not on AL2023's 252


def test_weights_attempt_timeout_is_the_sync_budget_and_retries_are_bounded(run, units):
    spec = run.context.spec
    sizing = compute_sizing(spec)
    budget = sum(sync_budget_seconds(spec, sizing, s) for s in sync_steps(spec, "any-bucket"))
    unit = _parse(units["kimi-weights.service"])
    assert unit["Service"]["TimeoutStartSec"] == [str(budget)]
    assert 0 < budget < 48 * 3600
    burst = int(unit["Unit"]["StartLimitBurst"][0])
    interval = int(unit["Unit"]["StartLimitIntervalSec"][0])
    restart = int(unit["Service"]["RestartSec"][0])
    assert burst >= 2 and interval >= burst * (budget + restart)  # the window spans every attempt


def _simulate(attempt_results: list[bool], units: dict[str, str]) -> tuple[bool, str]:
    """A model of systemd's job semantics for these two units: the weights unit runs attempts
    until one succeeds or StartLimitBurst is used up; ExecStartPost queues vLLM after a success.
    A Requires= on the weights unit would fail vLLM's queued start at the first failure."""
    weights = _parse(units["kimi-weights.service"])
    vllm = _parse(units["kimi-vllm.service"])
    burst = int(weights["Unit"]["StartLimitBurst"][0])
    requires_weights = "kimi-weights.service" in " ".join(vllm["Unit"].get("Requires", []))
    vllm_job_failed = False
    for n, ok in enumerate(attempt_results[:burst], start=1):
        if not ok:
            if requires_weights:
                vllm_job_failed = True  # "dependency failed", never retried
            continue
        starts = any("start" in p and "kimi-vllm.service" in p for p in weights["Service"].get("ExecStartPost", []))
        return (starts and not vllm_job_failed), f"weights succeeded on attempt {n}"
    return False, "weights failed for good"


@pytest.mark.parametrize(
    ("attempts", "vllm_up"),
    [([True], True), ([False, True], True), ([False, False, True], True), ([False, False, False, True], False)],
)
def test_retry_then_success_brings_vllm_up_and_failing_for_good_does_not(units, attempts, vllm_up):
    assert _simulate(attempts, units)[0] is vllm_up


def test_the_old_requires_chain_would_have_failed_the_retry(units):
    broken = dict(units)
    broken["kimi-vllm.service"] = units["kimi-vllm.service"].replace(
        "Requires=docker.service", "Requires=docker.service kimi-weights.service"
    )
    assert _simulate([False, True], broken)[0] is False  # the model is not vacuous


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt: systemd)")
def test_units_pass_systemd_analyze_verify(units, tmp_path):
    from tests.unit_verify import verify_units

    root = tmp_path / "root"
    unit_dir = root / "etc/systemd/system"
    # Stand-ins for what the AMI provides, so verify checks our units and not the host; every unit we
    # write: the chain and the engine-cache restore/save it pulls in.
    proc, ours = verify_units(
        units, root,
        (userdata.AMI_CHECK_SCRIPT, userdata.RAID_SCRIPT, userdata.WEIGHTS_SCRIPT, "/bin/sh", userdata.VLLM_SCRIPT,
         userdata.WATCH_SCRIPT, "/usr/bin/docker", "/usr/bin/systemctl", "/usr/bin/true", "/usr/bin/touch"),
        {"docker.service": "[Service]\nExecStart=/usr/bin/true\n",
         "dlami-nvme.service": "[Service]\nType=oneshot\nExecStart=/usr/bin/true\n"},
    )
    assert proc.returncode == 0 and not ours, proc.stdout + proc.stderr
    # Not vacuous: a bad key in our unit is reported.
    (unit_dir / "kimi-weights.service").write_text(units["kimi-weights.service"].replace("TimeoutStartSec=", "TimeoutStartSex="))
    bad = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "/etc/systemd/system/kimi-weights.service"],
                         capture_output=True, text=True, timeout=120)
    assert "TimeoutStartSex" in bad.stdout + bad.stderr


def test_engine_caches_are_restored_before_vllm_and_saved_after(units, cloud_config):
    """aws-ec2 with a mirror: kimi-vllm pulls in the restore (ordered before it) and the save
    (Wants=, so a failed restore is a cold start, never no start); neither is enabled on its own;
    vLLM gets the key's directory read-write and the cache env; the program is fetched and
    verified like weight_sync.py."""
    from components.aws.storage import ENGINE_CACHE_SOURCE, tool_sha256
    from components.core import engine_cache as ec

    vllm = _parse(units["kimi-vllm.service"])["Unit"]
    assert set(" ".join(vllm["Wants"]).split()) == set(userdata.ENGINE_CACHE_UNITS)
    assert userdata.ENGINE_CACHE_UNITS[0] in " ".join(vllm["After"]).split()
    assert "kimi-engine" not in " ".join(vllm.get("Requires", []))
    restore = _parse(units[userdata.ENGINE_CACHE_UNITS[0]])
    save = _parse(units[userdata.ENGINE_CACHE_UNITS[1]])
    assert "kimi-weights.service" in " ".join(restore["Unit"]["After"])
    assert "kimi-vllm.service" in " ".join(save["Unit"]["After"])
    assert " restore " in restore["Service"]["ExecStart"][0] and " save " in save["Service"]["ExecStart"][0]
    assert "--wait-url http://127.0.0.1:8000/health" in save["Service"]["ExecStart"][0]
    enabled = next(c for c in cloud_config["runcmd"] if c[:2] == ["systemctl", "enable"])
    assert not set(enabled) & set(userdata.ENGINE_CACHE_UNITS)
    files = {f["path"]: f["content"] for f in cloud_config["write_files"]}
    env = files[userdata.VLLM_ENV_FILE]
    for k, v in ec.vllm_cache_env().items():
        assert f"{k}={v}\n" in env
    run_vllm = files[userdata.VLLM_SCRIPT]
    assert f":{ec.ENGINE_CACHE_CONTAINER_PATH} " in run_vllm and "/.kimi-engine-cache/" in run_vllm
    weights = files[userdata.WEIGHTS_SCRIPT]
    assert f"{tool_sha256(ENGINE_CACHE_SOURCE)} {ec.ENGINE_CACHE_SCRIPT_PATH}\n" in weights

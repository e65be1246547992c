"""The stager's boot chain (``phase: stage`` on ``aws-ec2``: components/aws/userdata.py
``stage_cloud_config_text``), unit-level rules cheap enough for every run: its user data writes
every program its units run (its own AMI contract included), and a failing RAID or sync attempt is
retried rather than failing the stage for good (systemd 252, as on AL2023: a start that
``Requires=`` a failing one-shot fails with "dependency" and is never retried: systemd.unit(5)).
The real tools check it too: ``systemd-analyze verify`` and ``shellcheck``. The chain itself is
booted in the VM tier (tests/test_vm_boot.py: the stager boots, fills the mirror and powers off).
"""

from __future__ import annotations

import base64
import shutil
import subprocess

import pytest
import yaml

from components.aws import ami_contract, userdata
from components.core.sizing import compute_sizing, sync_budget_seconds
from components.core.weights import sync_steps
from tests.conftest import plan_for
from tests.test_ec2_boot_chain import _parse

STAGE = {"kimi-deploy:phase": "stage"}


@pytest.fixture(scope="module")
def run():
    return plan_for("b300", overrides=STAGE)


def _cloud_config(text: str) -> dict:
    assert text.startswith("#cloud-config\n")
    return yaml.safe_load(text)


def _stager_cloud_config(run) -> dict:
    instance = next(r for r in run.resources if r.type == "aws:ec2/instance:Instance")
    return _cloud_config(base64.b64decode(instance.inputs["userDataBase64"]).decode())


@pytest.fixture(scope="module")
def cloud_config(run) -> dict:
    return _stager_cloud_config(run)


@pytest.fixture(scope="module")
def files(cloud_config) -> dict[str, str]:
    return {f["path"]: f["content"] for f in cloud_config["write_files"]}


@pytest.fixture(scope="module")
def units(files) -> dict[str, str]:
    return {p.rsplit("/", 1)[1]: t for p, t in files.items() if p.startswith("/etc/systemd/system/")}




def _programs(unit_text: str) -> set[str]:
    """The program of every Exec*= line (``-`` and ``@`` prefixes dropped)."""
    out = set()
    for values in _parse(unit_text).get("Service", {}).items():
        key, lines = values
        if key.startswith("Exec"):
            out |= {line.lstrip("-@+!").split()[0] for line in lines}
    return out


def _serving_files() -> dict[str, str]:
    doc = _cloud_config(base64.b64decode(plan_for("b300").named("gpu-lt").inputs["userData"]).decode())
    return {f["path"]: f["content"] for f in doc["write_files"]}


@pytest.mark.parametrize("role", ["stage", "serve"])
def test_every_program_a_unit_runs_is_written_by_the_same_user_data(role, files):
    """The stager's RAID unit ran /opt/kimi-deploy/ami-check.sh, which its user data never wrote:
    the unit failed at its first step on every stager."""
    written = files if role == "stage" else _serving_files()
    units = {p: t for p, t in written.items() if p.startswith("/etc/systemd/system/")}
    programs = set().union(*(_programs(t) for t in units.values()))
    assert userdata.AMI_CHECK_SCRIPT in programs and userdata.RAID_SCRIPT in programs
    # Ours live under the tools directory; the rest (systemctl, sh, docker) are the AMI contract's.
    from components.aws.common import HOST_TOOLS_DIR

    missing = sorted(p for p in programs if p.startswith(HOST_TOOLS_DIR + "/") and p not in written)
    assert not missing, f"{role}: units run programs its user data does not write: {missing}"


def test_the_stagers_raid_unit_checks_the_stagers_own_contract(files, units):
    raid = _parse(units["kimi-nvme-raid0.service"])
    assert raid["Service"]["ExecStartPre"] == [userdata.AMI_CHECK_SCRIPT]
    assert files[userdata.AMI_CHECK_SCRIPT] == ami_contract.check_script("stage")
    # its contract installs with dnf: after the network; before the stage unit
    assert "network-online.target" in " ".join(raid["Unit"]["After"]) and raid["Unit"]["Wants"] == ["network-online.target"]
    assert raid["Unit"]["Before"] == [userdata.STAGE_UNIT]


def test_no_package_is_left_to_cloud_init_which_would_not_retry_it(cloud_config):
    assert "packages" not in cloud_config and "package_update" not in cloud_config
    assert cloud_config["runcmd"] == [["systemctl", "daemon-reload"], ["systemctl", "enable", userdata.STAGE_UNIT],
                                      ["systemctl", "start", "--no-block", userdata.STAGE_UNIT]]


def test_the_stage_unit_requires_no_one_shot_and_runs_the_raid_unit_at_every_attempt(run, units):
    stage = _parse(units[userdata.STAGE_UNIT])
    requires = " ".join(stage["Unit"].get("Requires", []) + stage["Unit"].get("BindsTo", []) + stage["Unit"].get("Requisite", []))
    assert requires == "sysinit.target"  # neither the RAID unit nor docker (installed at boot)
    assert "kimi-nvme-raid0.service" in stage["Unit"]["Wants"][0] and "kimi-nvme-raid0.service" in stage["Unit"]["After"][0]
    assert stage["Service"]["ExecStartPre"] == ["-/usr/bin/systemctl start kimi-nvme-raid0.service",
                                               "-/usr/bin/systemctl start docker.service"]
    assert stage["Service"]["ExecStart"] == [userdata.WEIGHTS_SCRIPT]
    assert stage["Service"]["ExecStartPost"] == ["/usr/bin/systemctl poweroff"]
    assert stage["Service"]["Restart"] == ["on-failure"] and "RestartMode" not in stage["Service"]
    assert stage["Unit"]["DefaultDependencies"] == ["no"]  # multi-user.target does not wait for hours
    spec = run.context.spec
    budget = sum(sync_budget_seconds(spec, compute_sizing(spec), s) for s in sync_steps(spec, "b") if s.name == "publish-mirror")
    assert stage["Service"]["TimeoutStartSec"] == [str(budget)]
    assert stage["Unit"]["StartLimitBurst"] == [str(spec.config.compute.weights_retry.attempts)]
    failed = stage["Service"]["ExecStopPost"][0]
    assert "systemctl reset-failed kimi-stage.service && systemctl start kimi-stage.service" in failed


def _simulate(raid_results: list[bool], sync_results: list[bool], units: dict[str, str]) -> str:
    """systemd's job semantics for the stage unit and its RAID unit, per attempt (StartLimitBurst
    of them): the RAID unit runs when it is not active yet (Wants=/ExecStartPre=); with Requires=
    on it, a RAID failure fails the stage's queued start with "dependency" and ends the stage for
    good (no Restart=). Returns ``powered off`` or why the stager sits idle."""
    stage = _parse(units[userdata.STAGE_UNIT])
    burst = int(stage["Unit"]["StartLimitBurst"][0])
    requires_raid = "kimi-nvme-raid0.service" in " ".join(stage["Unit"].get("Requires", []))
    reruns_raid = "-/usr/bin/systemctl start kimi-nvme-raid0.service" in stage["Service"].get("ExecStartPre", [])
    raid_runs, raid_active = iter(raid_results), False
    for attempt in range(burst):
        if not raid_active and (attempt == 0 or reruns_raid):
            raid_active = next(raid_runs, True)
        if not raid_active:
            if requires_raid:
                return "idle: dependency failed, never retried"
            continue  # weights.sh: the array is not mounted; this attempt fails and is retried
        if sync_results[min(attempt, len(sync_results) - 1)]:
            return "powered off"
    return "idle: failed after every attempt"


@pytest.mark.parametrize(("raid", "sync", "outcome"), [
    ([True], [True], "powered off"),
    ([False, True], [True], "powered off"),  # a transient RAID failure (the contract's dnf install, the array)
    ([True], [False, True], "powered off"),  # a transient sync failure
    ([False, False, False], [True], "idle: failed after every attempt"),
])
def test_a_transient_raid_or_sync_failure_is_retried(units, raid, sync, outcome):
    assert _simulate(raid, sync, units) == outcome


def test_the_old_requires_chain_left_the_stager_idle(units):
    broken = dict(units)
    broken[userdata.STAGE_UNIT] = units[userdata.STAGE_UNIT].replace(
        "Requires=sysinit.target", "Requires=sysinit.target kimi-nvme-raid0.service")
    assert _simulate([False, True], [True], broken) == "idle: dependency failed, never retried"  # not vacuous


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed (apt: systemd)")
def test_the_stagers_units_pass_systemd_analyze_verify(units, tmp_path):
    from tests.unit_verify import verify_units

    proc, ours = verify_units(
        units, tmp_path / "root",
        (userdata.AMI_CHECK_SCRIPT, userdata.RAID_SCRIPT, userdata.WEIGHTS_SCRIPT, "/bin/sh", "/usr/bin/systemctl",
         "/usr/bin/true"),
        {"docker.service": "[Service]\nExecStart=/usr/bin/true\n"},
    )
    assert proc.returncode == 0 and not ours, proc.stdout + proc.stderr


def test_the_stagers_scripts_pass_shellcheck(files, tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (CI installs it from .ci/apt-packages.txt)")
    scripts = {p: t for p, t in files.items() if p.endswith(".sh")}
    assert set(scripts) == {userdata.AMI_CHECK_SCRIPT, userdata.RAID_SCRIPT, userdata.SECRET_ENV_SCRIPT,
                            userdata.WEIGHTS_SCRIPT}
    for path, text in scripts.items():
        f = tmp_path / path.rsplit("/", 1)[1]
        f.write_text(text)
        result = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(f)], capture_output=True, text=True)
        assert result.returncode == 0, f"{path}:\n{result.stdout}"

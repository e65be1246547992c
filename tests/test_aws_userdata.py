"""EC2 boot configuration: the recorded launch template's user data runs the exact weight-sync
and vLLM commands of the core, passes the real validators (cloud-init schema, shellcheck) and
keeps secrets out of its text."""

from __future__ import annotations

import base64
import shlex
import shutil
import subprocess

import pytest
import yaml

from components.aws import userdata
from components.core.naming import NVME_RAID0_HOST_PATH
from components.core.weights import SYNC_SCRIPT_PATH, WEIGHTS_MOUNT_PATH, sync_steps
from tests.conftest import TEST_SECRETS, plan_for


def _user_data(run) -> str:
    return base64.b64decode(run.named("gpu-lt").inputs["userData"]).decode()


def _files(text: str) -> dict[str, str]:
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    return {f["path"]: f["content"] for f in doc["write_files"]}


@pytest.fixture(scope="module")
def run():
    return plan_for("b300")


@pytest.fixture(scope="module")
def files(run):
    return _files(_user_data(run))


def _docker_runs(script: str) -> list[list[str]]:
    out = []
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] in (["exec"], ["out"]):  # out: the weights script's runner that keeps the output
            words = words[1:]
        if words[:2] == ["docker", "run"]:
            out.append(words)
    return out


def _after_image(cmd: list[str], image: str) -> list[str]:
    """The container's argv: ``--entrypoint`` value followed by everything after the image."""
    i = cmd.index(image)
    return [cmd[cmd.index("--entrypoint") + 1], *cmd[i + 1 :]]


def test_user_data_fits_the_ec2_limit_and_has_no_secret(run):
    text = _user_data(run)
    assert len(text.encode()) < userdata.USER_DATA_LIMIT_BYTES
    for value in TEST_SECRETS.values():
        assert value not in text
    assert "PLAN-PLACEHOLDER" not in text


def test_vllm_unit_runs_the_exact_core_command(run, files):
    ctx = run.context
    server = ctx.vllm.role("server")
    (cmd,) = _docker_runs(files[userdata.VLLM_SCRIPT])
    assert _after_image(cmd, ctx.vllm.image) == list(server.argv)
    assert cmd[cmd.index("--gpus") + 1] == "all"
    assert cmd[cmd.index("--ipc") + 1] == "host"
    assert f"{ctx.vllm.port}:{ctx.vllm.port}" == cmd[cmd.index("-p") + 1]
    assert f"{NVME_RAID0_HOST_PATH}:{WEIGHTS_MOUNT_PATH}:ro" in cmd
    env = dict(line.split("=", 1) for line in files[userdata.VLLM_ENV_FILE].splitlines())
    from components.core.engine_cache import GATE_ENV, GATE_FILE, vllm_cache_env

    # The core's env plus where the engine caches live and the gate the API guard waits for.
    assert env == {**server.env, **vllm_cache_env(), GATE_ENV: GATE_FILE}
    # The API key arrives from SSM at start, never as text.
    assert "VLLM_API_KEY=/kimi-deploy/b300/vllm-api-key" in files[userdata.VLLM_SCRIPT]
    assert userdata.API_ENV_FILE in cmd


def test_weights_unit_runs_the_exact_sync_steps_in_order(run, files):
    ctx = run.context
    steps = sync_steps(ctx.spec, "mirror-bucket-a1b2c3d")
    cmds = _docker_runs(files[userdata.WEIGHTS_SCRIPT])
    assert [s.name for s in steps] == ["publish-mirror", "node-copy"]
    assert [_after_image(c, ctx.vllm.image) for c in cmds] == [list(s.argv) for s in steps]
    for cmd, step in zip(cmds, steps, strict=False):
        assert f"{SYNC_SCRIPT_PATH}:{SYNC_SCRIPT_PATH}:ro" in cmd
        assert f"{NVME_RAID0_HOST_PATH}:{WEIGHTS_MOUNT_PATH}" in cmd
        assert ("--env-file" in cmd) == step.needs_hub_token
    script = files[userdata.WEIGHTS_SCRIPT]
    # The program is fetched from the mirror's _tools/ prefix and checked against its digest.
    obj = run.named("mirror-weight-sync-script").inputs
    assert obj["key"] == "_tools/weight_sync.pyz" and obj["bucket"] == "mirror-bucket-a1b2c3d"
    import base64
    import hashlib

    from components.sync_artifact import sync_artifact

    data = base64.b64decode(obj["contentBase64"])
    assert data == sync_artifact().data and "content" not in obj  # the zipapp's bytes, not text
    digest = hashlib.sha256(data).hexdigest()
    assert obj["metadata"] == {"sha256": digest, "size-bytes": str(len(data))}
    assert SYNC_SCRIPT_PATH.endswith(".pyz")
    assert f"tool s3://mirror-bucket-a1b2c3d/_tools/weight_sync.pyz {digest} {SYNC_SCRIPT_PATH}\n" in script
    assert "HF_TOKEN=/kimi-deploy/b300/hub-token" in script
    # Before any of them: the node-copy step with --check-local (a complete copy needs nothing outside).
    (check,) = [line for line in script.splitlines() if "--check-local" in line]
    assert check.startswith("if docker run ") and check.endswith("; then")
    words = shlex.split(check.removeprefix("if ").removesuffix("; then"))
    assert _after_image(words, ctx.vllm.image) == [*steps[-1].argv, "--check-local"]
    assert "--env-file" not in words  # no hub token for a local check
    assert script.index("--check-local") < script.index("HF_TOKEN=") < script.index("kimi-weight-sync-publish-mirror")


def test_systemd_units_order_and_restart(files):
    units = {p.rsplit("/", 1)[1]: t for p, t in files.items() if p.startswith("/etc/systemd/system/")}
    assert set(units) == set(userdata.UNITS) | set(userdata.ENGINE_CACHE_UNITS) | set(userdata.WATCH_UNITS)
    vllm = units["kimi-vllm.service"]
    assert "Requires=docker.service\n" in vllm and "Restart=on-failure" in vllm
    assert f"ExecStart={userdata.VLLM_SCRIPT}" in vllm
    weights = units["kimi-weights.service"]
    after = next(line for line in weights.splitlines() if line.startswith("After=")).split("=", 1)[1].split()
    assert {"docker.service", "kimi-nvme-raid0.service"} <= set(after) and "TimeoutStartSec=infinity" not in weights
    raid = units["kimi-nvme-raid0.service"]
    assert f"ExecStart={userdata.RAID_SCRIPT}" in raid
    assert raid.index(f"ExecStartPre={userdata.AMI_CHECK_SCRIPT}") < raid.index("ExecStart=")


def test_raid0_uses_instance_store_only_and_is_idempotent(files):
    script = files[userdata.RAID_SCRIPT]
    assert f"MOUNT={NVME_RAID0_HOST_PATH}" in script
    assert '*"Instance Storage"*' in script  # EBS reports "Amazon Elastic Block Store"
    assert 'mountpoint -q "$MOUNT"' in script and "mdadm --assemble" in script and "--level=0" in script
    assert script.index("mdadm --assemble") < script.index("mdadm --create")
    assert "EXPECTED=8" in script


def test_raid_unit_runs_after_the_dlami_nvme_unit(files):
    unit = files["/etc/systemd/system/kimi-nvme-raid0.service"]
    assert "After=local-fs.target dlami-nvme.service" in unit
    assert "Requires=dlami-nvme" not in unit  # other AMIs have no such unit
    assert "WantedBy=multi-user.target" in unit  # runs at every boot: the bind mount is redone


def _run_raid_script(files, tmp_path, mounted: set[str]) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the RAID script with ``mountpoint``, ``mount``, ``mkdir``, ``mdadm`` and ``dnf``
    stubbed (they log their argv); ``mounted`` are the paths ``mountpoint -q`` reports."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("mount", "mkdir", "mdadm", "dnf", "mkfs.xfs", "blkid"):
        (bin_dir / tool).write_text(f'#!/bin/bash\necho "{tool} $*" >> "{log}"\n')
    cases = " ".join(shlex.quote(m) for m in sorted(mounted)) or "''"
    (bin_dir / "mountpoint").write_text(
        f'#!/bin/bash\nfor m in {cases}; do [ "$2" = "$m" ] && exit 0; done\nexit 1\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "nvme-raid0.sh"
    script.write_text(files[userdata.RAID_SCRIPT])
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    calls = log.read_text().splitlines() if log.exists() else []
    return result, calls


def test_raid_on_the_dlami_bind_mounts_its_nvme_array(files, tmp_path):
    # The DLAMI's dlami-nvme.service already striped and mounted the instance store.
    result, calls = _run_raid_script(files, tmp_path, {userdata.DLAMI_NVME_PATH})
    assert result.returncode == 0, result.stderr
    assert f"mount --bind {userdata.DLAMI_NVME_PATH} {NVME_RAID0_HOST_PATH}" in calls
    assert not any(c.startswith(("mdadm", "mkfs", "dnf")) for c in calls), calls


def test_raid_is_a_no_op_when_already_mounted(files, tmp_path):
    result, calls = _run_raid_script(files, tmp_path, {userdata.DLAMI_NVME_PATH, NVME_RAID0_HOST_PATH})
    assert result.returncode == 0, result.stderr
    assert calls == []


def test_raid_without_the_dlami_array_builds_its_own(files):
    script = files[userdata.RAID_SCRIPT]
    dlami = script.index('mountpoint -q "$DLAMI_NVME"')
    assert f"DLAMI_NVME={userdata.DLAMI_NVME_PATH}" in script
    assert script.index('mountpoint -q "$MOUNT"') < dlami < script.index("mdadm --assemble")


def test_cloud_config_passes_cloud_init_schema(run, tmp_path):
    if shutil.which("cloud-init") is None:
        pytest.skip("cloud-init is not installed (CI installs it from .ci/apt-packages.txt)")
    path = tmp_path / "user-data.yaml"
    path.write_text(_user_data(run))
    result = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid" in result.stdout


def test_shell_scripts_pass_shellcheck(files, tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (CI installs it from .ci/apt-packages.txt)")
    scripts = {p: t for p, t in files.items() if p.endswith(".sh")}
    assert len(scripts) == 6
    for path, text in scripts.items():
        f = tmp_path / path.rsplit("/", 1)[1]
        f.write_text(text)
        result = subprocess.run(["shellcheck", "--shell=bash", "--severity=style", str(f)], capture_output=True, text=True)
        assert result.returncode == 0, f"{path}:\n{result.stdout}"


def test_user_data_over_the_limit_is_refused():
    import random
    noise = random.Random(3).randbytes(20_000).hex()  # incompressible: the limit is on the gzip of oversized text
    cfg = userdata.Ec2BootConfig(
        region="us-east-1", image="img", vllm_argv=["vllm", "serve", noise], vllm_env={}, port=8000,
        sync_steps=(), tools_uri="s3://b/_tools/w.py", tools_sha256="0" * 64, api_key_parameter="/p/a",
        hub_token_parameter=None, hub_token_env="HF_TOKEN", nvme_devices=1,
    )
    with pytest.raises(ValueError, match="16384"):
        userdata.ec2_cloud_config(cfg)


def test_env_file_refuses_newlines():
    with pytest.raises(ValueError):
        userdata.env_file({"A": "1\n2"})


def _units(files) -> dict[str, str]:
    return {p.rsplit("/", 1)[1]: t for p, t in files.items() if p.startswith("/etc/systemd/system/")}


def test_weights_unit_does_not_hold_up_multi_user_and_fails_visibly_without_the_array(files):
    """DefaultDependencies=no: multi-user.target is not ordered after the sync (systemd.target(5));
    the RAID unit only wanted: a failed array fails this unit with its own cause (systemd.unit(5))."""
    unit = files["/etc/systemd/system/kimi-weights.service"]
    head = unit.split("[Service]")[0]
    assert "DefaultDependencies=no" in head
    requires = next(line for line in head.splitlines() if line.startswith("Requires=")).split("=", 1)[1].split()
    assert "kimi-nvme-raid0.service" not in requires and "sysinit.target" in requires
    assert "kimi-nvme-raid0.service" in next(line for line in head.splitlines() if line.startswith("Wants="))
    assert "Conflicts=shutdown.target" in head and "Before=shutdown.target" in head
    script = files[userdata.WEIGHTS_SCRIPT]
    assert script.index(f"mountpoint -q {NVME_RAID0_HOST_PATH} ||") < script.index("tool ")


def test_every_failed_attempt_says_how_to_retry_after_the_last(files):
    unit = files["/etc/systemd/system/kimi-weights.service"]
    (post,) = [line for line in unit.splitlines() if line.startswith("ExecStopPost=")]
    assert '"$$SERVICE_RESULT" = success' in post  # systemd passes $SERVICE_RESULT through to sh
    assert f"$$(cat {userdata.WEIGHTS_FAILURE_FILE}" in post  # the failed step and its error, again
    assert "systemctl reset-failed kimi-weights.service && systemctl start kimi-weights.service" in post
    assert "3 attempts, 120 s apart" in post and "StartLimitBurst=3\n" in unit and "RestartSec=120\n" in unit


def test_weights_retry_is_set_by_config_as_a_user_would():
    run = plan_for("b300", overrides={"kimi-deploy:compute": {
        "availabilityZone": "us-east-1a", "capacity": {"type": "on-demand"}, "rootVolumeGib": 500,
        "weightsRetry": {"attempts": 5, "delaySeconds": 15}}})
    unit = _files(_user_data(run))["/etc/systemd/system/kimi-weights.service"]
    assert "StartLimitBurst=5\n" in unit and "RestartSec=15\n" in unit and "5 attempts, 15 s apart" in unit
    timeout = int(next(line for line in unit.splitlines() if line.startswith("TimeoutStartSec=")).split("=")[1])
    interval = int(next(line for line in unit.splitlines() if line.startswith("StartLimitIntervalSec=")).split("=")[1])
    assert interval >= 5 * (timeout + 15)  # the window spans every attempt


def _run_weights_script(files, tmp_path, *, mounted=True, tool_ok=True, image_cached=True, local_complete=True,
                        fail_step: str | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """weights.sh with its paths under tmp_path and every outside command stubbed (each logs its argv)."""
    from components.aws.common import HOST_TOOLS_DIR

    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir(parents=True)
    stubs = {
        "mountpoint": f"exit {0 if mounted else 1}",
        # A downloaded .new file always matches; the copy on disk matches when tool_ok.
        "sha256sum": f'case "$(cat)" in *.new) exit 0;; esac; exit {0 if tool_ok else 1}',
        "aws": "exit 0", "mv": "exit 0", "install": "exit 0", "mkdir": "exit 0",
        "docker": (f'case "$*" in *"image inspect"*) exit {0 if image_cached else 1};; '
                   f'*--check-local*) exit {0 if local_complete else 1};; '
                   f'*kimi-weight-sync-{fail_step or "none"}*) echo "weight_sync: error: injected" >&2; exit 1;; esac'),
        "secret-env.sh": "exit 0",
        "systemd-notify": "exit 0",
    }
    for tool, body in stubs.items():
        (bin_dir / tool).write_text(f'#!/bin/bash\necho "{tool} $*" >> "{log}"\n{body}\n')
        (bin_dir / tool).chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    text = (files[userdata.WEIGHTS_SCRIPT].replace(f"{HOST_TOOLS_DIR}/secret-env.sh", "secret-env.sh")
            .replace(userdata.RUN_SECRETS_DIR, str(run_dir)))
    script = tmp_path / "weights.sh"
    script.write_text(text)
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    return result, (log.read_text().splitlines() if log.exists() else [])


def test_a_reboot_with_a_complete_local_copy_asks_nothing_outside(files, tmp_path):
    result, calls = _run_weights_script(files, tmp_path)
    assert result.returncode == 0, result.stderr
    assert not [c for c in calls if c.startswith(("aws", "secret-env.sh"))]  # no S3, no SSM
    assert not [c for c in calls if c.startswith("docker pull") or "publish-mirror" in c or "node-copy " in c]
    assert "nothing fetched" in result.stdout


def test_a_first_boot_fetches_pulls_publishes_then_copies(files, tmp_path):
    result, calls = _run_weights_script(files, tmp_path, tool_ok=False, image_cached=False, local_complete=False)
    assert result.returncode == 0, result.stderr
    order = [next(i for i, c in enumerate(calls) if needle in c)
             for needle in ("aws s3 cp", "docker pull", "--check-local", "secret-env.sh", "kimi-weight-sync-publish-mirror",
                            "kimi-weight-sync-node-copy")]
    assert order == sorted(order)


def test_a_failed_step_is_named_with_its_error_in_the_last_line_and_kept_for_the_status(files, tmp_path):
    result, calls = _run_weights_script(files, tmp_path, local_complete=False, fail_step="publish-mirror")
    assert result.returncode == 1
    last = "kimi-weights: failed at: publish-mirror (exit 1): weight_sync: error: injected"
    assert result.stderr.strip().splitlines()[-1] == last
    assert (tmp_path / "run" / "weights-failure.txt").read_text() == last + "\n"  # what ExecStopPost= repeats
    # ... and the unit's Status: line (systemctl status shows it above the log, whatever systemd logs after)
    notified = [c.split("--status=", 1)[1] for c in calls if c.startswith("systemd-notify")]
    assert notified[-2:] == ["kimi-weights: publish-mirror", last]
    result, calls = _run_weights_script(files, tmp_path / "unmounted", mounted=False)
    assert result.returncode == 1 and calls[-2] == f"mountpoint -q {NVME_RAID0_HOST_PATH}"  # then the status line
    assert result.stderr.strip().splitlines()[-1] == (
        f"kimi-weights: failed at: setup (exit 1): {NVME_RAID0_HOST_PATH} is not mounted: systemctl status "
        "kimi-nvme-raid0.service")


def test_no_value_becomes_shell_syntax_in_the_weights_script(monkeypatch):
    """Every message line of the weights script is one quoted word, whatever a source or path holds:
    a step whose source carries a quote and a command substitution (values the config refuses today,
    tests/test_config_inputs.py) stays text; `bash -n` accepts the script and nothing runs."""
    import dataclasses

    captured: list[userdata.Ec2BootConfig] = []
    real = userdata.weights_script
    monkeypatch.setattr(userdata, "weights_script", lambda cfg: captured.append(cfg) or real(cfg))
    from components.core.config import read_stack_config
    from components.plan_engine import run_program
    from tests.conftest import FIXED_NOW

    run_program(read_stack_config("b300"), stack="b300", secrets=TEST_SECRETS, now=FIXED_NOW)
    cfg = captured[0]
    hostile = "s3://b/m';echo INJECTED-$(id -un);'"
    steps = [dataclasses.replace(s, source=hostile, dest=s.dest + "'$(id)") for s in cfg.sync_steps]
    script = real(dataclasses.replace(cfg, sync_steps=steps))
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0
    messages = [line for line in script.splitlines() if line.lstrip().startswith(("echo ", "st ")) and "kimi-weights:" in line]
    assert any(hostile in shlex.split(line)[1] for line in messages)
    for line in messages:
        words = shlex.split(line)
        assert len(words) == 2 and words[0] in ("echo", "st"), line  # one word: nothing is substituted or split

"""The ``b300`` stack boots for real: its EC2 user data, byte for byte, in a QEMU guest (Debian 12,
systemd 252 as on AL2023) with NVMe disks as instance store; instance metadata, S3 and SSM
(moto), the hub and the image registry stood in on the host's 127.0.0.1 (tests/vm/). Every
assertion reads the guest: unit states, journal lines, files, the server's answers.

Three machines, each a sequence of boots (a scenario's state is the previous one's end, as on a
real instance):

- A (`make test`): first the stager of ``phase: stage`` (its own user data and AMI contract, no
  instance store until its first attempt has failed: the RAID unit runs again at the next attempt)
  fills the mirror from the hub and powers itself off; the hub's ``main`` then moves. The serving
  instance's first boot serves the commit staged, from the mirror, asking the hub nothing; then an
  EC2 stop/start (blank instance store) with S3 unreachable at first: the array is rebuilt, the
  failed attempt is retried and the copy made again, vLLM started once. Then (`make test-vm`): a
  reboot serves without copying; a reboot with the hub and the registry down still serves; a
  weight file corrupted on the array is fetched again before vLLM starts; the stand-in server
  hangs and the watchdog (``kimi-watch.timer``) restarts it. Last (`make test`), the trial's
  expiry moves to a minute ahead and the instance's own timer powers it off.
- C (`make test-vm`): a first boot from an empty mirror publishes from the hub, copies and serves.
- B (`make test-vm`): S3 unreachable for good on a first boot: the weights unit fails after its
  attempts, vLLM never starts, the status says why and how to retry, and the documented retry
  works; then an instance with no instance store: the RAID unit fails and the weights unit fails
  visibly with that cause.

Time budgets are set for software emulation (TCG) on a loaded 2-core machine and divided by
``KVM_SPEEDUP`` when KVM works. Each boot's phase times are written to the cache's ``reports/``
and printed at the end of the session. ``CI=true`` turns a missing prerequisite into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator

import pytest

from tests.conftest import TEST_SECRETS
from tests.vm.guest import accelerator
from tests.vm.image import BuildError, build_all, cache_root, cached_guest, check_prerequisites

VM_ALL = os.environ.get("KIMI_VM_ALL") == "1"
vm_all = pytest.mark.skipif(not VM_ALL, reason="`make test-vm` runs every VM scenario (KIMI_VM_ALL=1)")
# Budgets under TCG (seconds); KVM is several times faster.
KVM_SPEEDUP = 4
FIRST_BOOT_AGENT_SECONDS = 1200
FIRST_BOOT_SERVING_SECONDS = 3600
BOOT_SERVING_SECONDS = 2400
REPORTS: list[dict] = []


def _missing() -> list[str]:
    missing = check_prerequisites()
    for tool in ("qemu-system-x86_64", "genisoimage"):
        if shutil.which(tool) is None:
            missing.append(tool)
    return missing


@pytest.fixture(scope="session")
def vm_image():
    """The guest image and the stand-in's base layer (built now when not cached; `make test`
    starts that build in the background at its start, and this waits for it)."""
    if missing := _missing():
        message = f"the VM tier needs {', '.join(missing)} (apt: .ci/apt-packages.txt)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from tests.progress import announce

    if cached_guest() is None:
        announce(f"VM tier: waiting for the guest images (built once, 10-25 min; log: {cache_root() / 'build.log'})")
    try:
        build_all()
    except BuildError as exc:
        pytest.fail(str(exc))
    image = cached_guest()
    assert image is not None
    return image


def budget(seconds: float, image) -> float:
    return seconds / KVM_SPEEDUP if accelerator(str(image.kernel)) == "kvm" else seconds


def report(machine, scenario: str, phases: dict | None = None, **extra) -> dict:
    """Record this boot's phase times (seconds from the guest kernel's start; ``machine.phases()``
    unless given) for the session's summary and for ``python -m tests.vm.record`` (what the plan
    cites)."""
    doc = {"scenario": scenario, "accel": machine.guest.accel, "phases": machine.phases() if phases is None else phases,
           "recorded_at": time.strftime("%Y-%m-%d"), **extra}
    REPORTS.append(doc)
    out = cache_root() / "reports"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{scenario}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def summary_lines() -> list[str]:
    """The boots' phase times for the end of the session (tests/conftest.py pytest_terminal_summary)."""
    if not REPORTS:
        return []
    lines = ["VM boots (seconds from the guest kernel's start; qemu_to_kernel: from QEMU's start or the reboot request):"]
    for doc in REPORTS:
        phases = " ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in doc["phases"].items())
        lines.append(f"  {doc['scenario']} [{doc['accel']}]: {phases}")
    return lines


def _machine(name: str, vm_image, down: tuple[str, ...] = ()) -> Iterator:
    """A scenario group's ``Machine``, its stand-ins in ``down`` unreachable from the first boot on."""
    from tests.vm.machine import Machine

    machine = Machine(name, vm_image)
    machine.services.front.down.update(down)
    try:
        yield machine
    finally:
        machine.close()


@pytest.fixture(scope="module")
def machine_a(vm_image) -> Iterator:
    yield from _machine("a", vm_image)


@pytest.fixture(scope="module")
def machine_b(vm_image) -> Iterator:
    yield from _machine("b", vm_image, down=("s3",))


@pytest.fixture(scope="module")
def machine_c(vm_image) -> Iterator:
    yield from _machine("c", vm_image)


def _journal_count(machine, unit: str, needle: str) -> int:
    return machine.journal(unit).count(needle)


# --- machine A -------------------------------------------------------------------------------------

STAGER_POWEROFF_SECONDS = 3600
STAGER_ATTEMPTS = 5  # compute.weightsRetry.attempts of the stage plan: the first fails, the hotplug may take two


def test_the_stager_boots_fills_the_mirror_from_the_hub_and_powers_off(machine_a, vm_image):
    """``phase: stage``: the stager's user data, byte for byte, with its own AMI contract (no GPU
    item), on an instance whose instance store is not there at first: the RAID unit fails, the
    stage attempt fails naming it, and the next attempt runs the RAID unit again once the disk is
    there (a transient RAID failure is retried, not fatal). Then the publish (hub -> mirror,
    verified), the marker, and the guest powers itself off (the stager's shutdown behaviour is
    terminate: this ends its billing)."""
    import hashlib

    from tests.vm.guest import GuestError
    from tests.vm.machine import STAGER_INSTANCE_ID, Stager
    from tests.vm.services import wait_for

    m = machine_a
    stager = Stager(m, nvme_disks=0, attempts=STAGER_ATTEMPTS, hotplug_slots=1)
    m.stager = stager
    try:
        stager.start(budget(FIRST_BOOT_AGENT_SECONDS, vm_image))

        def first_attempt_over() -> str | None:
            if "kimi-weights: attempt failed" in stager.journal("kimi-stage.service"):
                return "retried"
            # cloud-init's runcmd started it, yet it is not running, waiting, nor queued: it would idle
            # ("dependency failed" leaves it inactive; a failure with no restart left, failed).
            stage, final = stager.unit("kimi-stage.service"), stager.unit("cloud-final.service")
            queued = stager.sh("systemctl list-jobs --no-legend kimi-stage.service").strip()
            if final.active in ("active", "failed") and stage.active in ("inactive", "failed") and not queued:
                return f"idle ({stage.active}/{stage.sub})"
            return None

        outcome = wait_for(first_attempt_over, budget(1800, vm_image), poll_seconds=10)
        assert outcome == "retried", (f"{outcome}: " + "; ".join(
            f"{u.name} {u.active}/{u.sub} result={u.result}" for u in map(stager.unit, ("kimi-nvme-raid0.service",
                                                                                       "kimi-stage.service")))
            + "\n" + stager.journal("kimi-nvme-raid0.service")[-1500:] + stager.journal("kimi-stage.service")[-1500:])
        assert "kimi-nvme: no instance-store NVMe device found" in stager.journal("kimi-nvme-raid0.service")
        stager.guest.hotplug_nvme()  # the instance store appears: the next attempt must use it
        assert wait_for(lambda: stager.guest.exec("ls /sys/class/nvme/nvme0/model", 60).exit_code == 0,
                        budget(300, vm_image), poll_seconds=5)
        stager.sh("/usr/local/sbin/kimi-vm-env")  # its model string, as at boot (guest_env.DIFFERENCES)
        polls = {"at": 0.0}

        def failed_for_good() -> None:
            if time.monotonic() - polls["at"] < 60:
                return
            polls["at"] = time.monotonic()
            try:
                failed = stager.guest.exec("systemctl is-failed --quiet kimi-stage.service", 20).exit_code == 0
            except GuestError:  # shutting down: the agent is gone
                return
            assert not failed, stager.journal("kimi-stage.service")[-3000:]  # failed for good: it would idle

        waited = stager.guest.wait_exit(budget(STAGER_POWEROFF_SECONDS, vm_image), poll=failed_for_good)
        assert waited is not None, "the stager did not power off"
    finally:
        stager.guest.kill()
    console = (stager.guest.run_dir / "console.log").read_text(errors="replace")
    assert "reboot: Power down" in console  # it powered off (QEMU exits: -no-shutdown is not set)
    # What ran is the stage plan's rendering, byte for byte, and cloud-init reported no error.
    files = stager.guest.offline_files(["/var/lib/cloud/data/result.json",
                                        f"/var/lib/cloud/instances/{STAGER_INSTANCE_ID}/user-data.txt"])
    assert files[f"/var/lib/cloud/instances/{STAGER_INSTANCE_ID}/user-data.txt"] == stager.user_data
    assert json.loads(files["/var/lib/cloud/data/result.json"] or b"{}")["v1"]["errors"] == []
    raid = stager.offline_journal("kimi-nvme-raid0.service")
    assert "kimi-deploy: AMI contract (stage): every item present" in raid  # its own contract, checked at boot
    assert "kimi-nvme: no instance-store NVMe device found" in raid and "kimi-nvme: /dev/md/kimi-nvme mounted" in raid
    log = stager.offline_journal("kimi-stage.service")
    assert "/mnt/k8s-disks/0 is not mounted: systemctl status kimi-nvme-raid0.service" in log  # the first attempt
    assert "kimi-weights: publish-mirror:" in log
    publish = json.loads(_last_json(log, '"dest": "s3://'))
    assert publish["revision"] == m.commit and publish["files_transferred"] == len(m.files)
    # The mirror: every file as the hub has it, the manifest, the marker naming the commit resolved.
    prefix = f"models/{m.spec.hub_repo}/{m.spec.revision}"
    s3 = m.services.s3
    for path, data in m.files.items():
        assert hashlib.sha256(s3.get_object(Bucket=m.bucket, Key=f"{prefix}/{path}")["Body"].read()).digest() == \
            hashlib.sha256(data).digest(), path
    marker = json.loads(s3.get_object(Bucket=m.bucket, Key=f"{prefix}/.weights-complete.json")["Body"].read())
    assert marker["revision"] == m.commit and marker["file_count"] == len(m.files)
    report(stager, "stager", phases=stager_phases(stager), powered_off_seconds=round(waited),
           stage_attempts=log.count("kimi-weights: attempt failed") + 1)
    # Between stage and serve, the hub's main moves to a new commit.
    moved = {**m.files, "model-00002-of-00002.safetensors": hashlib.sha256(b"moved").digest() * 8192}
    m.moved_commit = m.services.hub.state.add_repo(m.spec.hub_repo, moved)
    assert m.moved_commit != m.commit


def stager_phases(stager) -> dict[str, float | None]:
    """Seconds from the stager's kernel start (its journal's monotonic clock): cloud-init done, the
    array mounted, the mirror published, powered off (the journal's last entry)."""
    entries = [json.loads(line) for line in stager.offline_journal(output="json").splitlines() if line.startswith("{")]

    def first(predicate) -> float | None:
        found = [int(e["__MONOTONIC_TIMESTAMP"]) / 1e6 for e in entries if predicate(e)]
        return round(min(found), 1) if found else None

    def message(e) -> str:
        return str(e.get("MESSAGE", ""))

    return {
        "cloud_init_done": first(lambda e: "Cloud-init" in message(e) and "finished" in message(e)),
        "array_mounted": first(lambda e: "kimi-nvme: /dev/md/kimi-nvme mounted" in message(e)),
        "mirror_published": first(lambda e: message(e).startswith("{") and '"dest": "s3://' in message(e)),
        "powered_off": round(max(int(e["__MONOTONIC_TIMESTAMP"]) for e in entries) / 1e6, 1) if entries else None,
    }


def test_the_first_boot_serves_the_staged_commit_and_asks_nothing_of_the_hub(machine_a, vm_image):
    """After the stage: the serving instance's first boot (its own user data and AMI contract)
    builds its array, finds the mirror complete (its publish step keeps the staged commit without
    the hub, although ``main`` moved), copies it, verifies it and serves it. No request reaches the
    hub stand-in."""
    import hashlib

    m = machine_a
    assert getattr(m, "moved_commit", None), "needs the stager's scenario first"
    hub_forwarded, hub_requests = m.services.front.count("hub"), len(m.services.hub.state.requests)
    m.start(budget(FIRST_BOOT_AGENT_SECONDS, vm_image))
    waited = m.wait_serving(budget(FIRST_BOOT_SERVING_SECONDS, vm_image))
    result = json.loads(m.sh("cat /run/cloud-init/result.json"))
    assert result["v1"]["errors"] == [], result
    assert m.sh("cat /var/lib/cloud/instance/user-data.txt").encode() == m.user_data  # byte for byte
    raid = m.unit("kimi-nvme-raid0.service")
    assert (raid.active, raid.result) == ("active", "success")
    assert "kimi-deploy: AMI contract (serve): every item present" in m.journal("kimi-nvme-raid0.service")
    mdstat = m.sh("cat /proc/mdstat")
    assert "raid0" in mdstat and all(f"nvme{i}n1" in mdstat for i in range(4)), mdstat
    assert m.sh("findmnt -n -o FSTYPE /mnt/k8s-disks/0").strip() == "xfs"
    weights = m.unit("kimi-weights.service")
    assert (weights.active, weights.sub, weights.result, weights.restarts) == ("active", "exited", "success", 0)
    log = m.journal("kimi-weights.service")
    assert f"commit {m.commit}; kept without asking the hub" in log
    publish = json.loads(_last_json(log, '"dest": "s3://'))
    assert publish["revision"] == m.commit and publish["files_transferred"] == 0
    copy = json.loads(_last_json(log, '"dest": "/models'))
    assert copy["revision"] == m.commit and copy["files_transferred"] == len(m.files)
    marker = json.loads(m.sh(f"cat {m.host_model_dir()}/.weights-complete.json"))
    assert marker["revision"] == m.commit != m.moved_commit  # the staged commit, not what main became
    for path, data in m.files.items():
        assert m.sha256_in_guest(path) == hashlib.sha256(data).hexdigest(), path
    # The hub was asked nothing: no request reached its stand-in, through the front or at all.
    assert m.services.front.count("hub") == hub_forwarded and len(m.services.hub.state.requests) == hub_requests
    _assert_serving_once(m, vm_image)
    report(m, "first-boot-from-staged-mirror", waited_seconds=round(waited), guest_cpu_slowdown=round(cpu_slowdown(m), 1))


def _assert_serving_once(m, vm_image) -> None:
    """After a first boot: the stand-in server read the copy and answers with the API key from SSM
    only; vLLM's unit started once; the API guard was fetched from the mirror's _tools/, verified,
    mounted and imported by the server; the engine's caches were saved after the first healthy start."""
    from components.core.engine_cache import engine_cache_key
    from components.core.vllm import API_GUARD_CONTAINER_DIR, API_GUARD_MIDDLEWARE

    status, body = m.models(TEST_SECRETS["apiKey"])
    assert status == 200 and body["data"][0]["id"] == m.spec.served_model_name, body
    assert m.models(None)[0] == 401
    vllm = m.unit("kimi-vllm.service")
    assert (vllm.active, vllm.restarts) == ("active", 0)
    assert _journal_count(m, "kimi-vllm.service", "Application startup complete.") == 1
    assert f"middleware {API_GUARD_MIDDLEWARE} loaded from {API_GUARD_CONTAINER_DIR}/" in m.journal("kimi-vllm.service")
    key = engine_cache_key(m.spec, m.vllm).digest
    assert _wait_archive(m, key, budget(600, vm_image)), m.journal("kimi-engine-cache-save.service")


CPU_PROBE = "import time; t = time.perf_counter(); sum(i * i for i in range(1_000_000)); print(time.perf_counter() - t)"


def cpu_slowdown(m) -> float:
    """How much slower the guest's CPU is than the host's: the same Python loop in both (the
    guest has python3 for cloud-init), so the measured boot times can be read."""
    import subprocess
    import sys

    guest = float(m.sh(f"python3 -c '{CPU_PROBE}'").strip())
    host = float(subprocess.run([sys.executable, "-c", CPU_PROBE], capture_output=True, text=True, check=True).stdout)
    return guest / host


def _wait_archive(m, key: str, seconds: float) -> bool:
    from tests.vm.services import wait_for

    def saved() -> bool:
        listing = m.services.s3.list_objects_v2(Bucket=m.bucket, Prefix=f"models/{m.spec.hub_repo}")
        return any(o["Key"].endswith(f"{key}.tar") for o in listing.get("Contents", []))

    return bool(wait_for(saved, seconds, poll_seconds=10))


def test_stop_start_with_s3_unreachable_at_first_rebuilds_the_array_retries_and_serves(machine_a, vm_image):
    """EC2 stop/start: instance store comes back blank. S3 is unreachable when the weights unit
    first runs; its attempt fails and is retried (compute.weightsRetry), S3 is back, and the copy
    is made again from the mirror (the publish step a no-op), then vLLM starts once."""
    m = machine_a
    m.services.front.down.add("s3")
    refused_before = m.services.front.refused.get("s3", 0)
    hub_forwarded = m.services.front.count("hub")
    m.stop_start(budget(FIRST_BOOT_AGENT_SECONDS, vm_image))
    from tests.vm.services import wait_for

    failed_once = wait_for(lambda: "kimi-weights: attempt failed" in m.journal("kimi-weights.service"),
                           budget(1200, vm_image), poll_seconds=10)
    assert failed_once, m.describe()
    log = m.journal("kimi-weights.service")
    # it was S3 that failed it (not the array: then the RAID unit's journal says why)
    assert m.services.front.refused.get("s3", 0) > refused_before, \
        log[-4000:] + "\n" + m.describe() + "\n" + m.journal("kimi-nvme-raid0.service")[-3000:]
    m.services.front.down.discard("s3")
    m.wait_serving(budget(BOOT_SERVING_SECONDS, vm_image))
    weights = m.unit("kimi-weights.service")
    assert (weights.active, weights.result) == ("active", "success") and weights.restarts >= 1
    log = m.journal("kimi-weights.service")
    assert "kimi-weights: failed at: publish-mirror" in log  # the step named in the failed attempt's last lines
    assert "kimi-nvme: /dev/md/kimi-nvme mounted" in m.journal("kimi-nvme-raid0.service")  # a new array
    assert _journal_count(m, "kimi-vllm.service", "Application startup complete.") == 1  # started once
    copy = json.loads(_last_json(log, '"dest": "/models'))
    assert copy["files_transferred"] == len(m.files)  # copied again onto the blank array
    publish = json.loads(_last_json(log, '"dest": "s3://'))
    assert publish["files_transferred"] == 0 and publish["files_skipped"] == len(m.files)  # the mirror untouched
    assert publish["revision"] == m.commit  # the staged commit, although main moved
    assert m.services.front.count("hub") == hub_forwarded  # the hub was asked nothing
    report(m, "stop-start-s3-outage-cleared", weights_restarts=weights.restarts)


def _last_json(log: str, needle: str) -> str:
    """The last JSON summary line of the journal that contains ``needle``."""
    lines = [line for line in log.splitlines() if line.startswith("{") and needle in line]
    assert lines, f"no summary with {needle!r} in:\n{log[-3000:]}"
    return lines[-1]


@vm_all
def test_reboot_serves_without_copying_and_multi_user_does_not_wait_for_the_sync(machine_a, vm_image):
    m = machine_a
    pulls = m.services.registry.pulls()
    m.reboot(budget(FIRST_BOOT_AGENT_SECONDS, vm_image))
    m.wait_serving(budget(BOOT_SERVING_SECONDS, vm_image))
    log = m.journal("kimi-weights.service")
    assert "is complete and unchanged since verified: nothing fetched" in log
    assert "publish-mirror:" not in log and "node-copy:" not in log
    assert "kimi-nvme: /dev/md" in m.journal("kimi-nvme-raid0.service")  # reassembled, not recreated
    assert m.services.registry.pulls() == pulls
    after = m.sh("systemctl show multi-user.target -p After").split("=", 1)[1].split()
    assert "kimi-weights.service" not in after and "kimi-nvme-raid0.service" in after
    report(m, "reboot")


@vm_all
def test_reboot_with_the_hub_and_the_registry_down_still_serves(machine_a, vm_image):
    m = machine_a
    m.services.hub.state.outage_status = 503
    m.services.registry.down = True
    hub, registry = m.services.front.count("hub"), len(m.services.registry.requests)
    try:
        m.reboot(budget(FIRST_BOOT_AGENT_SECONDS, vm_image))
        m.wait_serving(budget(BOOT_SERVING_SECONDS, vm_image))
        assert m.services.front.count("hub") == hub and len(m.services.registry.requests) == registry
        weights = m.unit("kimi-weights.service")
        assert (weights.result, weights.restarts) == ("success", 0)
        report(m, "reboot-hub-and-registry-down")
    finally:
        m.services.hub.state.outage_status = None
        m.services.registry.down = False


@vm_all
def test_a_corrupted_weight_file_is_fetched_again_before_vllm_starts(machine_a, vm_image):
    import hashlib

    m = machine_a
    shard = "model-00002-of-00002.safetensors"
    path = f"{m.host_model_dir()}/{shard}"
    m.sh(f"printf '\\377' | dd of={path} bs=1 seek=4096 count=1 conv=notrunc status=none")
    assert m.sha256_in_guest(shard) != hashlib.sha256(m.files[shard]).hexdigest()
    m.reboot(budget(FIRST_BOOT_AGENT_SECONDS, vm_image))
    m.wait_serving(budget(BOOT_SERVING_SECONDS, vm_image))
    assert m.sha256_in_guest(shard) == hashlib.sha256(m.files[shard]).hexdigest()
    log = m.journal("kimi-weights.service")
    assert f"{shard} changed since it was verified" in log
    assert json.loads(_last_json(log, '"dest": "/models'))["files_transferred"] == 1
    phases = report(m, "reboot-corrupted-file")["phases"]
    assert phases["weights_verified"] < phases["server_healthy"]


@vm_all
def test_the_watchdog_restarts_a_vllm_whose_health_hangs(machine_a, vm_image):
    """The stand-in server hangs as a wedged engine does (process up, ``/health`` accepted and
    never answered: ``standin_vllm.py`` on SIGUSR1). ``kimi-watch.timer`` counts one failed check
    a minute and restarts ``kimi-vllm`` after the third in a row; the new start serves. systemd's
    own ``Restart=`` never fires (the unit did not fail)."""
    from components.aws.userdata import VLLM_CONTAINER, WATCH_FAILURES_BEFORE_RESTART, WATCH_STATE_FILE
    from tests.progress import announce
    from tests.vm.machine import READY_LINE
    from tests.vm.services import wait_for
    from tests.vm.standin_vllm import HANG_LINE

    m = machine_a
    assert m.healthy(), m.describe()
    before = m.unit("kimi-vllm.service")
    invocation = m.sh("systemctl show -p InvocationID --value kimi-vllm.service").strip()
    started = _journal_count(m, "kimi-vllm.service", READY_LINE)

    def answered_this_start() -> bool:  # the watchdog counts failures once this start has answered it
        state = m.guest.exec(f"cat {WATCH_STATE_FILE}", 60)
        return state.exit_code == 0 and state.stdout.split()[:2] == [invocation, "1"]

    assert wait_for(answered_this_start, budget(300, vm_image), poll_seconds=10), m.journal("kimi-watch.service")[-2000:]
    watch_lines = len(m.journal("kimi-watch.service").splitlines())
    m.sh(f"docker kill --signal USR1 {VLLM_CONTAINER}")
    hung_at = time.monotonic()
    announce("VM tier: the stand-in server hangs (SIGUSR1); waiting for the watchdog's restart")
    assert wait_for(lambda: HANG_LINE in m.journal("kimi-vllm.service"), budget(120, vm_image), poll_seconds=5)
    assert m.guest.exec("curl -sf -m 5 -o /dev/null http://127.0.0.1:8000/health", 60).exit_code != 0
    restarting = f"kimi-watch: restarting {before.name} (process up, /health failing)"
    alive_while_failing = []

    def restart_requested() -> bool:
        lines = m.journal("kimi-watch.service").splitlines()[watch_lines:]
        if restarting in lines:
            return True
        if any(" failed 1 of " in line for line in lines) and not alive_while_failing:  # counted: still up?
            alive_while_failing.append(m.sh(f"docker inspect -f '{{{{.State.Running}}}}' {VLLM_CONTAINER}").strip())
        return False

    assert wait_for(restart_requested, budget(900, vm_image), poll_seconds=10), m.journal("kimi-watch.service")[-3000:]
    restart_at = time.monotonic()
    assert alive_while_failing == ["true"]  # the container was running while /health failed: a hang, not a crash
    lines = m.journal("kimi-watch.service").splitlines()[watch_lines:]
    failures = [line for line in lines if "/health failed" in line]
    url = "http://127.0.0.1:8000/health"
    assert failures == [f"kimi-watch: {url} failed {n} of {WATCH_FAILURES_BEFORE_RESTART} checks in a row"
                        for n in range(1, WATCH_FAILURES_BEFORE_RESTART + 1)], lines
    assert lines.index(restarting) > lines.index(failures[-1])
    assert wait_for(lambda: _journal_count(m, "kimi-vllm.service", READY_LINE) == started + 1 and m.healthy(),
                    budget(BOOT_SERVING_SECONDS, vm_image), poll_seconds=10), m.describe()
    after = m.unit("kimi-vllm.service")
    assert after.active == "active" and after.restarts == before.restarts  # restarted by the watchdog, not Restart=
    assert m.sh("systemctl show -p InvocationID --value kimi-vllm.service").strip() != invocation
    assert m.models(TEST_SECRETS["apiKey"])[0] == 200
    report(m, "watchdog-hung-health", phases={
        "hang_to_restart_requested": round(restart_at - hung_at, 1),
        "restart_to_serving": round(time.monotonic() - restart_at, 1)})


EXPIRY_LEAD_SECONDS = 60  # the expiry is set this far ahead of a serving guest


def test_the_instance_powers_itself_off_at_its_expiry(machine_a, vm_image):
    """The last boot of machine A, serving: the trial's expiry (its SSM String parameter, as
    ``pulumi up`` writes it when ``expiresAt`` changes) moves from a day ahead to a minute ahead.
    The instance's own ``kimi-watch.timer`` reads it and powers the guest off once it has passed
    (QEMU exits); the guest's journal says it was the expiry, at or after it by the guest's clock."""
    from datetime import UTC, datetime, timedelta

    from components.aws.userdata import WATCH_EXPIRY_FILE
    from tests.progress import announce

    m = machine_a
    assert m.healthy(), m.describe()
    # kimi-watch has read the day-ahead expiry seeded before the first boot, through the SSM stand-in.
    seeded = m.sh(f"cat {WATCH_EXPIRY_FILE}").strip()
    assert datetime.fromisoformat(seeded) > datetime.now(UTC) + timedelta(hours=12), seeded
    m.sh("mkdir -p /var/log/journal && journalctl --flush")  # kept on disk: read after the power-off
    host_before = time.time()
    guest_clock = float(m.sh("date +%s.%N").strip())
    clock_offset = guest_clock - (host_before + time.time()) / 2
    value = m.set_expiry(datetime.now(UTC) + timedelta(seconds=EXPIRY_LEAD_SECONDS))
    set_at = time.time()
    announce(f"VM tier: the trial's expiry set to {value} ({EXPIRY_LEAD_SECONDS} s ahead); waiting for the guest "
             "to power itself off")
    waited = m.guest.wait_exit(budget(1800, vm_image))
    exited_at = time.time()
    assert waited is not None, f"still running {budget(1800, vm_image):.0f} s after the expiry was set: {m.describe()}"
    console = (m.guest.run_dir / "console.log").read_text(errors="replace")
    assert "reboot: Power down" in console  # an OS power-off (on EC2 it stops the instance)
    entries = [json.loads(line) for line in
               m.guest.offline_journal(["-b", "-o", "json", "-u", "kimi-watch.service"]).splitlines()
               if line.startswith("{")]
    said = f"kimi-watch: the stack expired at {value}: powering off"
    powered = [int(e["__REALTIME_TIMESTAMP"]) / 1e6 for e in entries if e.get("MESSAGE") == said]
    assert powered, [e.get("MESSAGE") for e in entries][-20:]
    expires = datetime.fromisoformat(value).timestamp()
    assert powered[0] >= expires  # not before the expiry (by the guest's clock, the one it reads)
    report(m, "expiry-poweroff", phases={
        "expiry_set_to_expiry": EXPIRY_LEAD_SECONDS,
        "expiry_to_poweroff_line_guest": round(powered[0] - expires, 1),
        "expiry_set_to_qemu_exit": round(exited_at - set_at, 1),
    }, guest_clock_ahead_seconds=round(clock_offset, 1), expires_at=value)


# --- machine B -------------------------------------------------------------------------------------

@vm_all
def test_a_weights_failure_that_never_clears_leaves_vllm_stopped_and_says_why(machine_b, vm_image):
    m = machine_b
    m.start(budget(FIRST_BOOT_AGENT_SECONDS, vm_image))
    from tests.vm.services import wait_for

    def failed_for_good() -> bool:
        u = m.unit("kimi-weights.service")
        return u.active == "failed"

    assert wait_for(failed_for_good, budget(2400, vm_image), poll_seconds=10), m.describe()
    log = m.journal("kimi-weights.service")
    assert log.count("kimi-weights: attempt failed") == 3, log[-3000:]  # compute.weightsRetry.attempts
    vllm = m.unit("kimi-vllm.service")
    assert vllm.active == "inactive" and vllm.active_enter_seconds is None  # never started
    status = m.status("kimi-weights.service")
    # The cause on the default status page: the Status: line the script sent, above the log.
    assert 'Status: "kimi-weights: failed at: weight-sync program (exit' in status, status
    assert "systemctl reset-failed kimi-weights.service && systemctl start kimi-weights.service" in log
    refused = m.guest.exec("systemctl start kimi-weights.service", 120)
    assert refused.exit_code != 0  # the start limit holds until reset-failed, as the status says
    m.services.front.down.discard("s3")
    m.sh("systemctl reset-failed kimi-weights.service && systemctl start --no-block kimi-weights.service")
    m.wait_serving(budget(FIRST_BOOT_SERVING_SECONDS, vm_image))
    report(m, "s3-down-for-good-then-reset-failed")


@vm_all
def test_no_instance_store_fails_the_raid_unit_and_the_weights_unit_visibly(machine_b, vm_image):
    m = machine_b
    m.stop_start(budget(FIRST_BOOT_AGENT_SECONDS, vm_image), nvme_disks=0)
    from tests.vm.services import wait_for

    assert wait_for(lambda: m.unit("kimi-weights.service").active == "failed", budget(1800, vm_image), poll_seconds=10), \
        m.describe()
    raid = m.unit("kimi-nvme-raid0.service")
    assert (raid.active, raid.result) == ("failed", "exit-code")
    assert "kimi-nvme: no instance-store NVMe device found" in m.status("kimi-nvme-raid0.service")
    status = m.status("kimi-weights.service")
    assert "Active: failed" in status, status
    assert 'Status: "kimi-weights: failed at: setup (exit 1): /mnt/k8s-disks/0 is not mounted: systemctl status ' \
           'kimi-nvme-raid0.service"' in status, status
    assert m.unit("kimi-vllm.service").active_enter_seconds is None
    report(m, "no-instance-store")


# --- machine C -------------------------------------------------------------------------------------

@vm_all
def test_first_boot_from_an_empty_mirror_publishes_copies_and_serves(machine_c, vm_image):
    m = machine_c
    m.start(budget(FIRST_BOOT_AGENT_SECONDS, vm_image))
    waited = m.wait_serving(budget(FIRST_BOOT_SERVING_SECONDS, vm_image))
    # cloud-init ran the user data without an error.
    result = json.loads(m.sh("cat /run/cloud-init/result.json"))
    assert result["v1"]["errors"] == [], result
    seed = m.sh("cat /var/lib/cloud/instance/user-data.txt")
    assert seed.encode() == m.user_data  # what ran is the plan's rendering, byte for byte
    # The array: RAID0 over every instance-store disk, XFS, mounted where the units expect it.
    raid = m.unit("kimi-nvme-raid0.service")
    assert (raid.active, raid.result) == ("active", "success")
    mdstat = m.sh("cat /proc/mdstat")
    assert "raid0" in mdstat and all(f"nvme{i}n1" in mdstat for i in range(4)), mdstat
    assert m.sh("findmnt -n -o FSTYPE /mnt/k8s-disks/0").strip() == "xfs"
    # The weights: published to the mirror, copied, verified; every file as the hub has it.
    weights = m.unit("kimi-weights.service")
    assert (weights.active, weights.sub, weights.result, weights.restarts) == ("active", "exited", "success", 0)
    log = m.journal("kimi-weights.service")
    assert "kimi-weights: publish-mirror:" in log and "kimi-weights: node-copy:" in log
    marker = json.loads(m.sh(f"cat {m.host_model_dir()}/.weights-complete.json"))
    assert marker["revision"] == m.commit and marker["file_count"] == len(m.files)
    import hashlib

    for path, data in m.files.items():
        assert m.sha256_in_guest(path) == hashlib.sha256(data).hexdigest(), path
    prefix = f"models/{m.spec.hub_repo}/{m.spec.revision}"
    mirror_marker = json.loads(m.services.s3.get_object(Bucket=m.bucket, Key=f"{prefix}/.weights-complete.json")["Body"].read())
    assert mirror_marker["revision"] == m.commit
    _assert_serving_once(m, vm_image)
    report(m, "first-boot", waited_seconds=round(waited), guest_cpu_slowdown=round(cpu_slowdown(m), 1))

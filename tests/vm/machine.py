"""One ``b300`` EC2 instance stood in by a VM: the plan's user data, the stand-ins seeded with what
``pulumi up`` creates (the mirror bucket with the two tool objects, the SSM SecureString
parameters), a small checkpoint on the hub stand-in, and the guest. The scenarios
(tests/test_vm_boot.py) drive it and read its state from inside the guest. ``Stager`` is the
``phase: stage`` stager of the same stack on the same stand-ins (the same mirror), booted before it.

The plan is the real program under the mock engine (``tests/conftest.plan_for``), with one config
change a user could make the same way: ``compute.weightsRetry.delaySeconds`` (the boot's retry
delay, 120 s by default) shortened so that a retried attempt fits the test's time budget.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from components.aws.storage import ENGINE_CACHE_KEY, WEIGHT_SYNC_KEY
from components.core.config import read_stack_config
from tests.conftest import TEST_SECRETS, plan_for
from tests.hub_server import git_blob_sha1
from tests.vm import guest_env
from tests.vm.guest import Guest, GuestError
from tests.vm.image import GuestImage, cache_root, load_ca
from tests.vm.services import Services, start_services, wait_for
from tests.vm.standin_image import standin_image

STACK = "b300"
RETRY_DELAY_SECONDS = 15
INSTANCE_ID = "i-0kimivmtier000001"
STAGER_INSTANCE_ID = "i-0kimivmstager0001"
UNITS = ("cloud-final.service", "multi-user.target", "kimi-nvme-raid0.service", "kimi-weights.service",
         "kimi-vllm.service", "kimi-engine-cache-restore.service", "kimi-engine-cache-save.service")
READY_LINE = "Application startup complete."
KEEP_RUNS = 4


def checkpoint_files() -> dict[str, bytes]:
    """A small checkpoint in the layout vLLM reads: config and tokenizer files outside LFS (the
    hub gives their git blob id), two safetensors shards and an index (LFS: the hub gives sha256)."""
    shard = hashlib.sha256(b"kimi-vm-tier").digest() * 8192  # 256 KiB of a fixed pattern
    index = {"metadata": {"total_size": 2 * len(shard) * 16},
             "weight_map": {f"layers.{i}.weight": f"model-0000{1 + i % 2}-of-00002.safetensors" for i in range(64)}}
    return {
        "config.json": json.dumps({"model_type": "kimi_k3", "architectures": ["KimiK3ForCausalLM"]}).encode(),
        "generation_config.json": b'{"max_new_tokens": 1024}',
        "configuration_kimi_k3.py": b"# remote code stand-in\n",
        "tokenizer_config.json": b'{"tokenizer_class": "TikTokenTokenizer"}',
        "model.safetensors.index.json": json.dumps(index, indent=1).encode(),
        "model-00001-of-00002.safetensors": shard * 16,
        "model-00002-of-00002.safetensors": bytes(reversed(shard)) * 16,
    }


@dataclass
class UnitState:
    """``systemctl show`` of one unit (monotonic times in seconds since the guest's kernel started)."""

    name: str
    active: str
    sub: str
    result: str
    restarts: int
    active_enter_seconds: float | None
    exec_main_status: int


def unit_state(sh: Callable[[str], str], name: str) -> UnitState:
    """``systemctl show`` of ``name`` through ``sh`` (a command run in the guest, its stdout)."""
    out = sh(f"systemctl show {name} -p ActiveState,SubState,Result,NRestarts,ActiveEnterTimestampMonotonic,"
             "ExecMainStatus")
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    enter = int(props.get("ActiveEnterTimestampMonotonic") or 0)
    return UnitState(name, props.get("ActiveState", ""), props.get("SubState", ""), props.get("Result", ""),
                     int(props.get("NRestarts") or 0), enter / 1e6 if enter else None,
                     int(props.get("ExecMainStatus") or 0))


class GuestReads:
    """What a scenario reads in a running guest (``self.guest``): a command's output, a unit's
    state, a unit's journal of this boot. ``Machine`` and ``Stager`` both read their guests so."""

    guest: Guest

    def sh(self, command: str, timeout_seconds: float = 120) -> str:
        """stdout of a command that must succeed in the running guest.

        Raises:
            GuestError: it exited non-zero (the message has its stderr).
        """
        result = self.guest.exec(command, timeout_seconds)
        if result.exit_code != 0:
            raise GuestError(f"{command!r} exited {result.exit_code}: {result.stderr.strip()[-2000:]}")
        return result.stdout

    def unit(self, name: str) -> UnitState:
        """The unit's state as systemd reports it."""
        return unit_state(self.sh, name)

    def journal(self, unit: str) -> str:
        """This boot's journal of ``unit``, message text only (a powered-off stager: ``offline_journal``)."""
        return self.sh(f"journalctl -b --no-pager -o cat -u {unit}", timeout_seconds=180)


@dataclass
class Machine(GuestReads):
    """The VM standing in for the instance, and its stand-ins.

    Attributes:
        name: the scenario group (run directory under the cache's ``runs/``).
        image: the cached guest image.
        nvme_disks: instance-store disks at the first start.
    """

    name: str
    image: GuestImage
    nvme_disks: int = 4
    run_dir: Path = field(init=False)
    services: Services = field(init=False)
    guest: Guest = field(init=False)
    user_data: bytes = field(init=False)
    commit: str = field(init=False)
    files: dict[str, bytes] = field(init=False)
    boots: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        runs = cache_root() / "runs"
        # The last runs stay for their logs (console, QEMU); older ones go (each holds GBs of disks).
        for old in sorted(runs.glob("*-*T*"), key=lambda p: p.stat().st_mtime)[:-KEEP_RUNS] if runs.is_dir() else []:
            shutil.rmtree(old, ignore_errors=True)
        self.run_dir = runs / f"{self.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        compute = dict(read_stack_config(STACK)["kimi-deploy:compute"])
        compute["weightsRetry"] = {"attempts": 3, "delaySeconds": RETRY_DELAY_SECONDS}
        self.plan = plan_for(STACK, overrides={"kimi-deploy:compute": compute})
        ctx = self.plan.context
        self.spec, self.vllm = ctx.spec, ctx.vllm
        self.user_data = base64.b64decode(self.plan.named("gpu-lt").inputs["userData"])
        objects = {r.inputs["key"]: r.inputs for r in self.plan.of_type("aws:s3/bucketObjectv2:BucketObjectv2")}
        self.bucket = objects[WEIGHT_SYNC_KEY]["bucket"]
        self.services = start_services(
            load_ca(), bucket=self.bucket, region=self.spec.region, availability_zone="us-east-1a",
            instance_id=INSTANCE_ID, image_reference=self.vllm.image, image=standin_image(self.run_dir / "image"))
        try:
            self._seed(objects)
            self.guest = Guest(self.image, self.run_dir, self.user_data, self.services.forwards,
                               guest_env.hosts_lines(self.bucket, self.spec.region), INSTANCE_ID,
                               nvme_disks=self.nvme_disks)
            self.guest.create_disks()
        except BaseException:
            self.services.stop()
            raise

    def _seed(self, objects: dict) -> None:
        """What ``pulumi up`` creates, as the plan declares it: the tool objects, the SSM
        parameters (the plan's secret values), and the model on the hub (a token required)."""
        s3 = self.services.s3
        # Every object the plan uploads (the weight-sync zipapp, the engine-cache program, the API
        # guard), as the provider would: contentBase64 or content, with its type and metadata.
        assert {WEIGHT_SYNC_KEY, ENGINE_CACHE_KEY} <= set(objects), sorted(objects)
        for key, obj in objects.items():
            body = base64.b64decode(obj["contentBase64"]) if "contentBase64" in obj else obj["content"].encode()
            extra = {"ContentType": obj["contentType"]} if obj.get("contentType") else {}
            s3.put_object(Bucket=self.bucket, Key=key, Body=body, Metadata=dict(obj.get("metadata") or {}), **extra)
        values = {"vllm-api-key": TEST_SECRETS["apiKey"], "hub-token": TEST_SECRETS["hfToken"],
                  "stage-hub-token": TEST_SECRETS["hfToken"]}
        for param in self.plan.of_type("aws:ssm/parameter:Parameter"):
            name = param.inputs["name"]
            if param.inputs.get("type") == "String":
                # Not a secret: the stack's expiry, which the instance's kimi-watch reads. The plan's value
                # is at the tests' fixed clock (past by now): a day from now, so the guest is not expired.
                self.set_expiry(datetime.now(UTC) + timedelta(days=1), name)
                continue
            self.services.ssm.put_parameter(Name=name, Type="SecureString", Value=values[name.rsplit("/", 1)[1]])
        self.files = checkpoint_files()
        self.commit = self.services.hub.state.add_repo(self.spec.hub_repo, self.files)
        self.services.hub.state.required_token = TEST_SECRETS["hfToken"]

    def set_expiry(self, expires_at: datetime, name: str | None = None) -> str:
        """Write the stack's expiry into its SSM String parameter (``name``: the plan's; as
        ``pulumi up`` does when ``expiresAt`` changes), in the plan's format. Returns the value."""
        if name is None:
            name = next(p.inputs["name"] for p in self.plan.of_type("aws:ssm/parameter:Parameter")
                        if p.inputs.get("type") == "String")
        value = expires_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.services.ssm.put_parameter(Name=name, Type="String", Value=value, Overwrite=True)
        return value

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, budget_seconds: float) -> None:
        """Start QEMU and wait for the guest agent."""
        self.guest.start()
        self.boots.append({"started_at": self.guest.started_at, "kind": "start"})
        self.guest.wait_agent(budget_seconds)

    def reboot(self, budget_seconds: float) -> None:
        """An in-guest reboot (same disks, instance store kept)."""
        requested = time.time()
        self.guest.reboot(budget_seconds)
        self.boots.append({"started_at": requested, "kind": "reboot"})

    def stop_start(self, budget_seconds: float, nvme_disks: int | None = None) -> None:
        """Power off, blank the instance store (EC2 stop/start), start again."""
        self.guest.poweroff(budget_seconds)
        if nvme_disks is not None:
            self.guest.nvme_disks = nvme_disks
        self.guest.blank_instance_store()
        self.start(budget_seconds)
        self.boots[-1]["kind"] = "stop-start"

    def close(self) -> None:
        """Stop QEMU and every stand-in."""
        try:
            self.guest.kill()
        finally:
            self.services.stop()

    # -- reading the guest ----------------------------------------------------------------------

    def status(self, unit: str) -> str:
        """``systemctl status`` as an operator reads it by default (its last journal lines)."""
        return self.guest.exec(f"SYSTEMD_COLORS=0 systemctl status --no-pager --full {unit}", 120).stdout

    def healthy(self) -> bool:
        """Whether vLLM's /health answers 200 inside the guest."""
        try:
            return self.guest.exec("curl -sf -m 10 -o /dev/null http://127.0.0.1:8000/health", 60).exit_code == 0
        except GuestError:
            return False

    def models(self, api_key: str | None) -> tuple[int, dict | None]:
        """(HTTP status, body) of /v1/models inside the guest, with the key or without."""
        header = f"-H 'Authorization: Bearer {api_key}'" if api_key else ""
        out = self.guest.exec(f"curl -s -w '\\n%{{http_code}}' {header} http://127.0.0.1:8000/v1/models", 60).stdout
        body, _, status = out.rpartition("\n")
        try:
            return int(status), json.loads(body) if body.strip() else None
        except ValueError:
            return int(status or 0), None

    def wait_serving(self, budget_seconds: float) -> float:
        """Wait until /health answers; returns the seconds waited.

        Raises:
            GuestError: not within the budget (with the units' states).
        """
        started = time.monotonic()
        if not wait_for(self.healthy, budget_seconds, poll_seconds=5):
            raise GuestError(f"not serving after {budget_seconds:.0f} s: {self.describe()}")
        return time.monotonic() - started

    def describe(self) -> str:
        """One line per unit of the chain (for failure messages)."""
        try:
            return "; ".join(f"{u.name} {u.active}/{u.sub} result={u.result} restarts={u.restarts}"
                             for u in map(self.unit, UNITS[2:]))
        except GuestError as exc:
            return f"(guest unreachable: {exc})"

    def phases(self) -> dict[str, float | None]:
        """Seconds from the guest kernel's start to each phase of this boot: cloud-init done,
        multi-user.target, array mounted, weights verified, server healthy (the stand-in's
        ready line in the journal); plus ``qemu_to_kernel``, from QEMU's start or the reboot
        request to the kernel's start (host clock minus guest uptime)."""
        states = {u: self.unit(u) for u in UNITS}
        ready = None
        out = self.sh("journalctl -b --no-pager -o json -u kimi-vllm.service", timeout_seconds=180)
        for line in out.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if READY_LINE in str(entry.get("MESSAGE", "")):
                ready = int(entry["__MONOTONIC_TIMESTAMP"]) / 1e6
                break
        host_before = time.time()
        uptime = float(self.sh("cut -d' ' -f1 /proc/uptime").strip())
        kernel_at = (host_before + time.time()) / 2 - uptime
        phases = {
            "qemu_to_kernel": kernel_at - self.boots[-1]["started_at"] if self.boots else None,
            "cloud_init_done": states["cloud-final.service"].active_enter_seconds,
            "multi_user_target": states["multi-user.target"].active_enter_seconds,
            "array_mounted": states["kimi-nvme-raid0.service"].active_enter_seconds,
            "weights_verified": states["kimi-weights.service"].active_enter_seconds,
            "server_healthy": ready,
        }
        return {k: round(v, 1) if v is not None else None for k, v in phases.items()}

    def sha256_in_guest(self, relative: str) -> str:
        """sha256 of a file of the served copy (path relative to the model directory)."""
        path = f"{self.host_model_dir()}/{relative}"
        return self.sh(f"sha256sum {path}").split()[0]

    def host_model_dir(self) -> str:
        """The served copy on the guest's array (the container's /models/... on the host)."""
        from components.core.naming import NVME_RAID0_HOST_PATH
        from components.core.weights import WEIGHTS_MOUNT_PATH, serving_path

        return NVME_RAID0_HOST_PATH + serving_path(self.spec)[len(WEIGHTS_MOUNT_PATH):]

    def blob_ids(self) -> dict[str, str]:
        """Git blob ids of the checkpoint's files (what the hub reports)."""
        return {p: git_blob_sha1(d) for p, d in self.files.items()}


class Stager(GuestReads):
    """The stager of ``phase: stage`` for ``machine``'s stack, on its stand-ins: the stage plan's
    user data (the ``Ec2Stager`` instance's, byte for byte) in its own guest, with its own instance
    id and instance store (an ``m6idn.4xlarge`` has one NVMe disk), filling ``machine``'s mirror.

    The plan is the same stack as ``machine``'s with ``phase: stage`` and
    ``compute.weightsRetry`` set as ``machine``'s, except ``attempts`` (the scenario's retry may
    need more than the default 3 under emulation). The guest powers itself off when the mirror is
    complete, so the scenario reads it afterwards from its disk (``Guest.offline_*``); the journal
    is made persistent as soon as the guest agent answers (``/var/log/journal``, as on Amazon Linux
    2023, where it is persistent by default).
    """

    def __init__(self, machine: Machine, *, nvme_disks: int = 1, attempts: int = 3, hotplug_slots: int = 0):
        self.machine = machine
        compute = dict(read_stack_config(STACK)["kimi-deploy:compute"])
        compute["weightsRetry"] = {"attempts": attempts, "delaySeconds": RETRY_DELAY_SECONDS}
        self.plan = plan_for(STACK, overrides={"kimi-deploy:compute": compute, "kimi-deploy:phase": "stage"})
        self.instance = next(r for r in self.plan.resources if r.type == "aws:ec2/instance:Instance")
        self.user_data = base64.b64decode(self.instance.inputs["userDataBase64"])
        objects = {r.inputs["key"]: r.inputs for r in self.plan.of_type("aws:s3/bucketObjectv2:BucketObjectv2")}
        assert objects and {o["bucket"] for o in objects.values()} == {machine.bucket}  # the same mirror
        s3 = machine.services.s3
        for key, obj in objects.items():  # what the stage uploads is what serve uploads (seeded already)
            body = base64.b64decode(obj["contentBase64"]) if "contentBase64" in obj else obj["content"].encode()
            assert s3.get_object(Bucket=machine.bucket, Key=key)["Body"].read() == body, key
        names = [p.inputs["name"] for p in self.plan.of_type("aws:ssm/parameter:Parameter")]
        assert any(n.endswith("/stage-hub-token") for n in names), names
        for name in (n for n in names if n.endswith("hub-token")):
            machine.services.ssm.put_parameter(Name=name, Type="SecureString", Value=TEST_SECRETS["hfToken"],
                                               Overwrite=True)
        self.guest = Guest(machine.image, machine.run_dir / "stager", self.user_data, machine.services.forwards,
                           guest_env.hosts_lines(machine.bucket, machine.spec.region), STAGER_INSTANCE_ID,
                           nvme_disks=nvme_disks, hotplug_slots=hotplug_slots)
        self.guest.create_disks()

    def start(self, budget_seconds: float) -> None:
        """Start QEMU, wait for the guest agent, make the journal persistent (kept for ``journal``)."""
        self.guest.start()
        self.guest.wait_agent(budget_seconds)
        self.sh("mkdir -p /var/log/journal && journalctl --flush")

    def offline_journal(self, unit: str | None = None, output: str = "cat") -> str:
        """The powered-off guest's last boot journal (of ``unit``, or all), in ``journalctl -o OUTPUT``."""
        return self.guest.offline_journal(["-b", "-o", output, *(["-u", unit] if unit else [])])

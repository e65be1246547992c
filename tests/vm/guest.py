"""One QEMU guest of the VM tier: its disks, the NoCloud seed, the QEMU process and the guest agent.

- Disks: the cached root image as the read-only backing file of a per-run qcow2 overlay (virtio);
  ``nvme_disks`` blank qcow2 files as QEMU NVMe controllers (the instance store; recreated blank
  by ``blank_instance_store``, as an EC2 stop/start gives); the NoCloud seed (an ISO 9660 volume
  labelled ``cidata`` holding ``user-data`` and ``meta-data``: cloud-init's NoCloud datasource).
- Network: QEMU's user-mode network (guest_env.GUEST_NETWORK, ``restrict=on``) whose only ways
  out are the forwarded addresses, each relayed to a host port (relay.py).
- Acceleration: KVM when it works here (a probe boots the guest kernel with ``-accel kvm -cpu
  host``), else TCG (software emulation, ``thread=multi``); ``KIMI_VM_ACCEL=kvm|tcg`` forces one.
- The guest agent (qemu-guest-agent on a virtio-serial port; QEMU Guest Agent Protocol,
  https://www.qemu.org/docs/master/interop/qemu-ga-ref.html): ``guest-sync`` then ``guest-exec``
  with captured output, which the scenarios use to read unit states, journals and files.
- QMP (QEMU Machine Protocol, https://www.qemu.org/docs/master/interop/qmp-spec.html) on a unix
  socket: ``hotplug_nvme`` adds an instance-store disk to a running guest through a PCIe root port
  left empty at start (``hotplug_slots``): ``blockdev-add`` then ``device_add``.
- A guest that powered itself off (the stager) is read from its root disk afterwards
  (``offline_files``, ``offline_journal``: ``qemu-img convert`` to raw, e2fsprogs' ``debugfs``, the
  host's ``journalctl --directory``); the scenario makes its journal persistent first.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.progress import announce
from tests.vm import guest_env
from tests.vm.image import GuestImage

RELAY = Path(__file__).with_name("relay.py")
MEMORY_MIB = 2048
# vCPUs per guest: 2 (a loaded 2-core machine's budgets were set for it); `make test` runs the VM
# tier beside the rest of the suite with 1 (KIMI_VM_CPUS, tests/suite.py): under TCG each vCPU is a
# host thread, and a 2-vCPU guest on a machine whose other core is busy spends its time in guest
# spinlocks whose holder's thread is descheduled (seen: 13.5 min alone, 30.7 min beside the suite).
CPUS = int(os.environ.get("KIMI_VM_CPUS") or 2)


class GuestError(RuntimeError):
    """The guest did not do what was asked in time (the message names what and where the logs are)."""


@functools.lru_cache(maxsize=1)
def accelerator(kernel: str) -> str:
    """``kvm`` when a KVM guest boots here, else ``tcg`` (``KIMI_VM_ACCEL`` overrides).

    The probe boots ``kernel`` with no root file system under ``-accel kvm -cpu host``: a usable
    KVM reaches the kernel's panic (QEMU exits 0 with ``-no-reboot``); an unusable one aborts
    (here: an MSR assertion, exit 134) or cannot open /dev/kvm."""
    forced = os.environ.get("KIMI_VM_ACCEL")
    if forced in ("kvm", "tcg"):
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg"
    try:
        proc = subprocess.run(
            ["qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-machine", "q35", "-m", "256", "-nodefaults",
             "-display", "none", "-no-reboot", "-serial", "stdio", "-kernel", kernel,
             "-append", "console=ttyS0 panic=-1 root=/dev/nonexistent"],
            capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "tcg"
    return "kvm" if proc.returncode == 0 and "Linux version" in proc.stdout else "tcg"


@dataclass
class ExecResult:
    """What a command run in the guest returned."""

    exit_code: int
    stdout: str
    stderr: str


class GuestAgent:
    """A client of the QEMU guest agent on a unix socket (one request at a time)."""

    def __init__(self, path: Path):
        self.path = path
        self.sock: socket.socket | None = None
        self.buffer = b""
        self.sync_id = int(time.time()) % 100_000

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.buffer = b""

    def _connect(self) -> socket.socket:
        if self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(self.path))
            self.sock = sock
        return self.sock

    def _read_reply(self, deadline: float) -> dict:
        sock = self._connect()
        while True:
            if b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                line = line.strip(b"\xff \r\t")
                if not line:
                    continue
                try:
                    return json.loads(line)
                except ValueError:
                    continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("guest agent: no reply")
            sock.settimeout(min(remaining, 5.0))
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                continue
            if not data:
                self.close()
                raise ConnectionError("guest agent: socket closed")
            self.buffer += data

    def request(self, command: str, arguments: dict | None = None, timeout_seconds: float = 30) -> object:
        """One command after a ``guest-sync`` (which discards stale replies). Raises
        TimeoutError/ConnectionError when the agent does not answer, GuestError on an error reply."""
        deadline = time.monotonic() + timeout_seconds
        self.sync_id += 1
        sock = self._connect()
        sock.sendall(json.dumps({"execute": "guest-sync", "arguments": {"id": self.sync_id}}).encode() + b"\n")
        while True:
            reply = self._read_reply(deadline)
            if reply.get("return") == self.sync_id:
                break
        message = {"execute": command, **({"arguments": arguments} if arguments else {})}
        sock.sendall(json.dumps(message).encode() + b"\n")
        reply = self._read_reply(deadline)
        if "error" in reply:
            raise GuestError(f"guest agent: {command}: {reply['error']}")
        return reply.get("return")


class Guest:
    """A QEMU guest booting the plan's user data.

    Args:
        image: the cached guest image.
        run_dir: this guest's files (overlay, NVMe disks, seed, logs, sockets).
        user_data: the exact bytes of the user data (the seed's ``user-data``).
        forwards: (guest address, port) -> host port on 127.0.0.1.
        hosts: the /etc/hosts lines (fw_cfg ``guest_env.HOSTS_FW_CFG``).
        instance_id: the seed's ``instance-id`` (cloud-init runs per-instance modules once per id).
        nvme_disks, nvme_gib: the instance store.
    """

    def __init__(self, image: GuestImage, run_dir: Path, user_data: bytes, forwards: dict[tuple[str, int], int],
                 hosts: str, instance_id: str, nvme_disks: int = 4, nvme_gib: int = 2, hotplug_slots: int = 0):
        self.image, self.run_dir, self.user_data = image, run_dir, user_data
        self.forwards, self.hosts, self.instance_id = forwards, hosts, instance_id
        self.nvme_disks, self.nvme_gib, self.hotplug_slots = nvme_disks, nvme_gib, hotplug_slots
        self.hotplugged = 0
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0  # time.time() of the last QEMU start
        self.agent = GuestAgent(run_dir / "qga.sock")
        self.accel = accelerator(str(image.kernel))
        run_dir.mkdir(parents=True, exist_ok=True)

    # -- disks ----------------------------------------------------------------------------------

    def create_disks(self) -> None:
        """The root overlay, blank NVMe disks and the seed."""
        root = self.run_dir / "root.qcow2"
        root.unlink(missing_ok=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(self.image.rootfs), str(root)],
                       check=True)
        self.blank_instance_store()
        seed = self.run_dir / "seed"
        shutil.rmtree(seed, ignore_errors=True)
        seed.mkdir()
        (seed / "user-data").write_bytes(self.user_data)
        (seed / "meta-data").write_text(f"instance-id: {self.instance_id}\nlocal-hostname: kimi-vm\n")
        subprocess.run(["genisoimage", "-quiet", "-output", str(self.run_dir / "seed.iso"), "-volid", "cidata", "-joliet",
                        "-rock", str(seed / "user-data"), str(seed / "meta-data")], check=True)
        (self.run_dir / "hosts").write_text(self.hosts)

    def blank_instance_store(self) -> None:
        """(Re)create the NVMe disks empty: what an EC2 stop/start does to instance store."""
        for i in range(8):
            (self.run_dir / f"nvme{i}.qcow2").unlink(missing_ok=True)
        for i in range(self.nvme_disks):
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(self.run_dir / f"nvme{i}.qcow2"),
                            f"{self.nvme_gib}G"], check=True)

    # -- the QEMU process -----------------------------------------------------------------------

    def argv(self) -> list[str]:
        """The QEMU command line."""
        accel = ["-accel", "kvm", "-cpu", "host"] if self.accel == "kvm" else ["-accel", "tcg,thread=multi", "-cpu", "max"]
        relay = f"{sys.executable} -S -E {RELAY}"
        fwd = ",".join(f"guestfwd=tcp:{addr}:{port}-cmd:{relay} {host_port}" for (addr, port), host_port in self.forwards.items())
        net = (f"user,id=net0,restrict=on,net={guest_env.GUEST_NETWORK},host={guest_env.GUEST_GATEWAY},"
               f"dns={guest_env.GUEST_DNS},dhcpstart={guest_env.GUEST_DHCP_START},{fwd}")
        r = self.run_dir
        cmd = [
            "qemu-system-x86_64", "-machine", "q35", *accel, "-smp", str(CPUS), "-m", str(MEMORY_MIB),
            "-nodefaults", "-no-user-config", "-display", "none", "-rtc", "base=utc",
            "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd), "-append", guest_env.KERNEL_CMDLINE,
            "-drive", f"file={r / 'root.qcow2'},if=virtio,format=qcow2",
            "-drive", f"file={r / 'seed.iso'},if=virtio,format=raw,readonly=on",
            "-netdev", net, "-device", "virtio-net-pci,netdev=net0",
            "-chardev", f"socket,id=qga0,path={r / 'qga.sock'},server=on,wait=off",
            "-device", "virtio-serial-pci", "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
            "-serial", f"file:{r / 'console.log'}",
            "-fw_cfg", f"name={guest_env.HOSTS_FW_CFG},file={r / 'hosts'}",
        ]
        for i in range(self.nvme_disks):
            cmd += ["-drive", f"file={r / f'nvme{i}.qcow2'},if=none,id=nvme{i},format=qcow2",
                    "-device", f"nvme,serial=kimi-instance-store-{i},drive=nvme{i}"]
        cmd += ["-qmp", f"unix:{r / 'qmp.sock'},server=on,wait=off"]
        for i in range(self.hotplug_slots):  # empty PCIe root ports: hotplug_nvme fills them
            cmd += ["-device", f"pcie-root-port,id=hotplug{i},chassis={10 + i},slot={10 + i}"]
        return cmd

    def start(self) -> None:
        """Start QEMU (the guest boots at once)."""
        if self.process is not None and self.process.poll() is None:
            raise GuestError("QEMU is already running")
        self.agent.close()
        self.hotplugged = 0
        (self.run_dir / "qga.sock").unlink(missing_ok=True)
        (self.run_dir / "qmp.sock").unlink(missing_ok=True)
        log = open(self.run_dir / "qemu.log", "a")
        announce(f"VM tier: booting guest {self.run_dir.parent.name}/{self.run_dir.name} ({self.accel}; console: "
                 f"{self.run_dir / 'console.log'})")
        self.started_at = time.time()
        self.process = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, preexec_fn=_die_with_parent)
        log.close()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """Stop QEMU now (and its relay children: the process group)."""
        self.agent.close()
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(OSError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.process = None

    # -- inside the guest -----------------------------------------------------------------------

    def exec(self, command: str, timeout_seconds: float = 120) -> ExecResult:
        """``/bin/sh -c command`` in the guest through the agent.

        Raises:
            GuestError: the agent is unreachable or the command outlived ``timeout_seconds``.
        """
        deadline = time.monotonic() + timeout_seconds
        try:
            started = self.agent.request("guest-exec", {"path": "/bin/sh", "arg": ["-c", command], "capture-output": True},
                                         timeout_seconds=min(60, timeout_seconds))
            pid = started["pid"]  # type: ignore[index]
            while time.monotonic() < deadline:
                status = self.agent.request("guest-exec-status", {"pid": pid}, timeout_seconds=60)
                if status.get("exited"):  # type: ignore[union-attr]
                    out = base64.b64decode(status.get("out-data", "")).decode(errors="replace")  # type: ignore[union-attr]
                    err = base64.b64decode(status.get("err-data", "")).decode(errors="replace")  # type: ignore[union-attr]
                    return ExecResult(int(status.get("exitcode", -1)), out, err)  # type: ignore[union-attr]
                time.sleep(0.5)
        except (TimeoutError, ConnectionError, OSError) as exc:
            self.agent.close()
            raise GuestError(f"guest agent unreachable ({exc}); console: {self.run_dir / 'console.log'}") from None
        raise GuestError(f"{command!r} still running after {timeout_seconds:.0f} s")

    def wait_agent(self, timeout_seconds: float, boot_id_not: str | None = None) -> str:
        """Wait until the agent answers (and, after a reboot, from a boot other than ``boot_id_not``).
        Returns the boot id.

        Raises:
            GuestError: not within ``timeout_seconds``, or QEMU exited.
        """
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if not self.running():
                raise GuestError(f"QEMU exited ({self.run_dir / 'qemu.log'}, {self.run_dir / 'console.log'})")
            try:
                boot_id = self.exec("cat /proc/sys/kernel/random/boot_id", timeout_seconds=30).stdout.strip()
                if boot_id and boot_id != boot_id_not:
                    return boot_id
            except GuestError:
                pass
            time.sleep(3)
        raise GuestError(f"the guest agent did not answer within {timeout_seconds:.0f} s "
                         f"(console: {self.run_dir / 'console.log'})")

    def reboot(self, timeout_seconds: float) -> str:
        """``systemctl reboot`` in the guest (same QEMU process, same disks); returns the new boot id."""
        old = self.wait_agent(60)
        announce(f"VM tier: rebooting guest {self.run_dir.parent.name}/{self.run_dir.name}")
        try:
            self.agent.request("guest-exec", {"path": "/bin/systemctl", "arg": ["reboot"]}, timeout_seconds=30)
        except (TimeoutError, ConnectionError, OSError, GuestError):
            pass
        self.agent.close()
        return self.wait_agent(timeout_seconds, boot_id_not=old)

    def poweroff(self, timeout_seconds: float) -> None:
        """``systemctl poweroff`` in the guest and wait for QEMU to exit (killed after the timeout)."""
        announce(f"VM tier: powering guest {self.run_dir.parent.name}/{self.run_dir.name} off")
        try:
            self.agent.request("guest-exec", {"path": "/bin/systemctl", "arg": ["poweroff"]}, timeout_seconds=30)
        except (TimeoutError, ConnectionError, OSError, GuestError):
            pass
        self.agent.close()
        assert self.process is not None
        try:
            self.process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None

    # -- QMP and the powered-off disk -------------------------------------------------------------

    def qmp(self, command: str, arguments: dict | None = None, timeout_seconds: float = 30) -> object:
        """One QMP command (after the greeting and ``qmp_capabilities``) on a fresh connection.

        Raises:
            GuestError: QEMU answered with an error, or not in time.
        """
        deadline = time.monotonic() + timeout_seconds
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_seconds)
            sock.connect(str(self.run_dir / "qmp.sock"))
            reader = sock.makefile("rb")

            def reply() -> dict:
                while time.monotonic() < deadline:
                    message = json.loads(reader.readline() or b"{}")
                    if "return" in message or "error" in message or "QMP" in message:
                        return message
                raise GuestError(f"QMP {command}: no reply within {timeout_seconds:.0f} s")

            reply()  # the greeting
            for name, args in (("qmp_capabilities", None), (command, arguments)):
                sock.sendall(json.dumps({"execute": name, **({"arguments": args} if args else {})}).encode() + b"\n")
                answer = reply()
                if "error" in answer:
                    raise GuestError(f"QMP {name}: {answer['error']}")
            return answer.get("return")

    def hotplug_nvme(self) -> str:
        """Add a blank instance-store NVMe disk to the running guest in the next empty root port
        (``hotplug_slots``); returns its serial. The guest's kernel sees a new NVMe controller."""
        i = self.hotplugged
        if i >= self.hotplug_slots:
            raise GuestError(f"no empty hotplug slot left ({self.hotplug_slots})")
        path = self.run_dir / f"hotplug-nvme{i}.qcow2"
        path.unlink(missing_ok=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), f"{self.nvme_gib}G"], check=True)
        self.qmp("blockdev-add", {"driver": "qcow2", "node-name": f"hotplug-disk{i}",
                                  "file": {"driver": "file", "filename": str(path)}})
        serial = f"kimi-instance-store-hotplug-{i}"
        self.qmp("device_add", {"driver": "nvme", "id": f"hotplug-nvme{i}", "drive": f"hotplug-disk{i}",
                                "serial": serial, "bus": f"hotplug{i}"})
        self.hotplugged += 1
        return serial

    def wait_exit(self, timeout_seconds: float, poll: Callable[[], None] | None = None) -> float | None:
        """Wait for QEMU to exit by itself (the guest powered off); ``poll()`` is called between
        checks (it may raise to stop waiting). Returns the seconds since QEMU started, or None
        after the timeout (QEMU still running)."""
        deadline = time.monotonic() + timeout_seconds
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.agent.close()
                return time.time() - self.started_at
            if poll is not None:
                poll()
            time.sleep(5)
        return None

    @contextlib.contextmanager
    def _raw_root(self) -> Iterator[Path]:
        """The root overlay (with its backing image) as a sparse raw file, while QEMU is stopped."""
        if self.running():
            raise GuestError("the guest is running: its disk can be read only once it is off")
        raw = self.run_dir / "root-offline.raw"
        subprocess.run(["qemu-img", "convert", "-O", "raw", str(self.run_dir / "root.qcow2"), str(raw)], check=True,
                       timeout=600)
        try:
            yield raw
        finally:
            raw.unlink(missing_ok=True)

    def offline_files(self, paths: list[str]) -> dict[str, bytes | None]:
        """The bytes of each absolute path on the powered-off guest's root file system (None when
        missing): e2fsprogs' ``debugfs -R 'dump PATH OUT'`` on a raw copy."""
        out: dict[str, bytes | None] = {}
        with self._raw_root() as raw:
            for i, path in enumerate(paths):
                target = self.run_dir / f"offline-{i}"
                target.unlink(missing_ok=True)
                subprocess.run(["debugfs", "-R", f"dump {path} {target}", str(raw)], capture_output=True, timeout=120)
                out[path] = target.read_bytes() if target.is_file() and target.stat().st_size else None
                target.unlink(missing_ok=True)
        return out

    def offline_journal(self, args: list[str]) -> str:
        """``journalctl --directory=<the guest's /var/log/journal> ARGS`` on the host, on the
        powered-off guest's persistent journal (copied out with ``debugfs rdump``)."""
        directory = self.run_dir / "journal-offline"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        with self._raw_root() as raw:
            subprocess.run(["debugfs", "-R", f"rdump /var/log/journal {directory}", str(raw)], capture_output=True,
                           check=True, timeout=300)
        journal_dirs = [p for p in (directory / "journal").glob("*") if p.is_dir()]
        if not journal_dirs:
            raise GuestError(f"no persistent journal on the guest's disk ({directory})")
        proc = subprocess.run(["journalctl", f"--directory={journal_dirs[0]}", "--no-pager", *args], capture_output=True,
                              text=True, timeout=300)
        return proc.stdout


def _die_with_parent() -> None:
    """In the QEMU child before exec: SIGKILL when the test process dies, however it dies
    (prctl PR_SET_PDEATHSIG), so no guest outlives its test."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG

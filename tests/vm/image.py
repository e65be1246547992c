"""The VM guest image: Debian 12 built with debootstrap from the AMI contract's package list,
cached by content hash under ``${XDG_CACHE_HOME:-~/.cache}/kimi-deploy/vm/``.

    python -m tests.vm.image build      # build what is missing (guest, stand-in base layer, test CA)
    python -m tests.vm.image status     # what is cached, with sizes and build times

The guest: ``debootstrap --variant=minbase`` then ``apt-get install --no-install-recommends`` of
``ami_contract.DEBIAN_PACKAGES`` + ``guest_env.GUEST_EXTRA_PACKAGES`` in a chroot, the files of
``guest_env.GUEST_FILES`` and the test CA, then an ext4 file system made from the tree
(``mke2fs -d``: no loop device) converted to qcow2. The kernel and initrd are kept beside it for
QEMU's direct kernel boot. Needs root (debootstrap, chroot mounts), debootstrap, e2fsprogs and
qemu-utils, and Debian's archive over the network (``KIMI_VM_DEBIAN_MIRROR``, default
deb.debian.org). The key hashes every input (this file, the package lists, the guest files, the
CA), so a change rebuilds and an unchanged tree reuses the cache on this machine.

One build at a time per cache directory (an exclusive ``flock`` on ``.lock``): ``make test``
starts the build in the background at its start and the VM tests wait for it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from components.aws.ami_contract import DEBIAN_PACKAGES
from tests.vm import guest_env

SUITE = "bookworm"  # Debian 12: systemd 252, the version AL2023 ships
DEFAULT_MIRROR = "http://deb.debian.org/debian"
ROOT_FS_BYTES = 8 << 30  # sparse: the tree is about 1.2 GB, the rest holds the pulled image and logs
BUILD_FORMAT = 1  # bump to force a rebuild when the recipe changes outside the hashed inputs


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kimi-deploy/vm``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kimi-deploy" / "vm"


@contextlib.contextmanager
def build_lock(root: Path | None = None) -> Iterator[None]:
    """Exclusive lock of the cache directory (blocks while another process builds)."""
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class BuildError(RuntimeError):
    """The image cannot be built here (one line: what is missing or which step failed)."""


def _log(message: str) -> None:
    print(f"vm-image: {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, log: Path | None = None, env: dict | None = None, timeout: float = 3600) -> None:
    """Run ``cmd``; output to ``log`` (appended). Raises BuildError naming the command."""
    with open(log, "a") if log else open(os.devnull, "w") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd[:4])}... exited {proc.returncode} (log: {log})")


def check_prerequisites() -> list[str]:
    """What this machine lacks to build the images (empty: it can)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (debootstrap and chroot mounts)")
    for tool in ("debootstrap", "mke2fs", "qemu-img", "chroot", "mount"):
        if shutil.which(tool) is None:
            missing.append(tool)
    return missing


# --- the test CA ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CertificateAuthority:
    """The test certificate authority the guest and the stand-in image trust.

    Attributes:
        cert_pem, key_pem: PEM bytes.
        fingerprint: sha256 (hex) of the certificate's PEM, part of the image keys.
    """

    cert_pem: bytes
    key_pem: bytes

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.cert_pem).hexdigest()


def load_ca(root: Path | None = None) -> CertificateAuthority:
    """The cached test CA (made once: EC P-256, 10 years, name-constrained to the stand-in names)."""
    root = root or cache_root()
    ca_dir = root / "ca"
    cert_path, key_path = ca_dir / "ca.pem", ca_dir / "ca.key"
    if cert_path.is_file() and key_path.is_file():
        return CertificateAuthority(cert_path.read_bytes(), key_path.read_bytes())
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kimi-deploy VM tier test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        # Only the names the stand-ins answer for: the key can never vouch for anything else.
        .add_extension(x509.NameConstraints(permitted_subtrees=[x509.DNSName("amazonaws.com"), x509.DNSName(guest_env.HUB_HOST)],
                                            excluded_subtrees=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    ca_dir.mkdir(parents=True, exist_ok=True)
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return CertificateAuthority(cert_path.read_bytes(), key_path.read_bytes())


# --- chroot helpers ------------------------------------------------------------------------------

@contextlib.contextmanager
def chroot_mounts(root: Path) -> Iterator[None]:
    """proc, sysfs, /dev and /dev/pts mounted in ``root`` for package scripts; unmounted after."""
    mounted: list[Path] = []
    try:
        for args, src, dst in ((["-t", "proc"], "proc", "proc"), (["-t", "sysfs"], "sysfs", "sys"),
                               (["--bind"], "/dev", "dev"), (["--bind"], "/dev/pts", "dev/pts")):
            target = root / dst
            target.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", *args, src, str(target)], check=True)
            mounted.append(target)
        yield
    finally:
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", str(target)], check=False)


def host_apt_settings() -> dict[str, bytes]:
    """The host's apt settings that make its archive reachable (proxies, validity overrides),
    copied into a chroot for the build only: file name -> bytes."""
    out = {}
    conf = Path("/etc/apt/apt.conf.d")
    if conf.is_dir():
        for path in sorted(conf.iterdir()):
            try:
                text = path.read_bytes()
            except OSError:
                continue
            if b"Acquire::" in text:
                out[path.name] = text
    return out


def debootstrap(root: Path, include: tuple[str, ...], log: Path) -> None:
    """``debootstrap --variant=minbase`` of ``SUITE`` into ``root``."""
    mirror = os.environ.get("KIMI_VM_DEBIAN_MIRROR", DEFAULT_MIRROR)
    cmd = ["debootstrap", "--variant=minbase"]
    if include:
        cmd.append("--include=" + ",".join(include))
    run([*cmd, SUITE, str(root), mirror], log=log)


def apt_install(root: Path, packages: tuple[str, ...], log: Path) -> None:
    """``apt-get install --no-install-recommends`` in the chroot; daemons never start (policy-rc.d)."""
    mirror = os.environ.get("KIMI_VM_DEBIAN_MIRROR", DEFAULT_MIRROR)
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror} {SUITE} main\ndeb {mirror} {SUITE}-updates main\n"
        f"deb {mirror.replace('/debian', '/debian-security')} {SUITE}-security main\n")
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    copied = []
    for name, text in host_apt_settings().items():
        path = root / "etc/apt/apt.conf.d" / f"00host-{name}"
        path.write_bytes(text)
        copied.append(path)
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
    try:
        with chroot_mounts(root):
            run(["chroot", str(root), "apt-get", "update", "-q"], log=log, env=env)
            run(["chroot", str(root), "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], log=log, env=env)
            run(["chroot", str(root), "apt-get", "clean"], log=log, env=env)
    finally:
        policy.unlink(missing_ok=True)
        for path in copied:
            path.unlink(missing_ok=True)
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


def package_versions(root: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``names`` in the tree (dpkg-query over its database)."""
    proc = subprocess.run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Package} ${Version}\\n", *names],
                          capture_output=True, text=True)
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


def _assert_unmounted(root: Path) -> None:
    with open("/proc/self/mounts") as f:
        busy = [line.split()[1] for line in f if line.split()[1].startswith(str(root) + "/")]
    if busy:
        raise BuildError(f"still mounted under the tree: {busy}")


# --- the guest image -----------------------------------------------------------------------------

GUEST_PACKAGES: tuple[str, ...] = tuple(dict.fromkeys((*DEBIAN_PACKAGES, *guest_env.GUEST_EXTRA_PACKAGES)))


@dataclass(frozen=True)
class GuestImage:
    """A built guest image.

    Attributes:
        directory: ``<cache>/guest-<key>``.
        rootfs: the qcow2 root disk (used read-only, as the backing file of each run's overlay).
        kernel, initrd: for QEMU's direct kernel boot.
        info: build.json (seconds per step, sizes, package versions).
    """

    directory: Path
    rootfs: Path
    kernel: Path
    initrd: Path
    info: dict


def guest_key(ca: CertificateAuthority) -> str:
    """Content hash of every input of the guest image (16 hex characters)."""
    h = hashlib.sha256()
    h.update(json.dumps({
        "format": BUILD_FORMAT, "suite": SUITE, "packages": GUEST_PACKAGES,
        "files": {p: [t, m] for p, (t, m) in sorted(guest_env.GUEST_FILES.items())},
        "units": guest_env.GUEST_UNITS_ENABLED, "ca": ca.fingerprint, "root_fs_bytes": ROOT_FS_BYTES,
    }, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def _load(directory: Path) -> GuestImage | None:
    info_path = directory / "build.json"
    if not info_path.is_file():
        return None
    return GuestImage(directory, directory / "rootfs.qcow2", directory / "vmlinuz", directory / "initrd.img",
                      json.loads(info_path.read_text()))


def cached_guest(root: Path | None = None) -> GuestImage | None:
    """The guest image of this tree when it is cached, else None."""
    root = root or cache_root()
    if not (root / "ca" / "ca.pem").is_file():
        return None
    return _load(root / f"guest-{guest_key(load_ca(root))}")


def build_guest(root: Path | None = None) -> GuestImage:
    """The guest image of this tree: from the cache, else built (about 5-25 min; see the module
    docstring). Holds the cache lock while building.

    Raises:
        BuildError: a prerequisite is missing or a step failed (the log's path is named).
    """
    root = root or cache_root()
    with build_lock(root):
        ca = load_ca(root)
        key = guest_key(ca)
        final = root / f"guest-{key}"
        if (image := _load(final)) is not None:
            return image
        if missing := check_prerequisites():
            raise BuildError(f"cannot build the VM image here: missing {', '.join(missing)}")
        work = root / f"build-guest-{key}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log = work / "build.log"
        tree = work / "root"
        steps: dict[str, float] = {}
        started = time.monotonic()

        def step(name: str) -> None:
            steps[name] = round(time.monotonic() - started - sum(steps.values()), 1)
            _log(f"guest {key}: {name} done ({steps[name]:.0f} s)")

        _log(f"building the guest image {key} (debootstrap + {len(GUEST_PACKAGES)} packages; log {log})")
        debootstrap(tree, (), log)
        step("debootstrap")
        apt_install(tree, GUEST_PACKAGES, log)
        step("packages")
        for path, (text, mode) in guest_env.GUEST_FILES.items():
            target = tree / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(mode)
        ca_target = tree / "usr/local/share/ca-certificates/kimi-vm-test-ca.crt"
        ca_target.parent.mkdir(parents=True, exist_ok=True)
        ca_target.write_bytes(ca.cert_pem)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
        with chroot_mounts(tree):
            run(["chroot", str(tree), "update-ca-certificates"], log=log, env=env)
            run(["chroot", str(tree), "systemctl", "enable", *guest_env.GUEST_UNITS_ENABLED], log=log, env=env)
        _assert_unmounted(tree)
        kernels = sorted((tree / "boot").glob("vmlinuz-*"))
        initrds = sorted((tree / "boot").glob("initrd.img-*"))
        if not kernels or not initrds:
            raise BuildError(f"no kernel or initrd in {tree}/boot (log: {log})")
        shutil.copy2(kernels[-1], work / "vmlinuz")
        shutil.copy2(initrds[-1], work / "initrd.img")
        versions = package_versions(tree, ("systemd", "cloud-init", "awscli", "docker.io", "mdadm", "xfsprogs",
                                           "qemu-guest-agent", "linux-image-cloud-amd64"))
        tree_bytes = int(subprocess.run(["du", "-sbx", str(tree)], capture_output=True, text=True).stdout.split()[0])
        step("configure")
        raw = work / "rootfs.raw"
        run(["mke2fs", "-q", "-t", "ext4", "-L", "kimi-root", "-d", str(tree), "-F", str(raw), f"{ROOT_FS_BYTES >> 20}M"],
            log=log)
        run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(work / "rootfs.qcow2")], log=log)
        raw.unlink()
        shutil.rmtree(tree)
        step("disk")
        info = {
            "key": key, "suite": SUITE, "packages": list(GUEST_PACKAGES), "versions": versions,
            "build_seconds": round(time.monotonic() - started, 1), "steps_seconds": steps,
            "tree_bytes": tree_bytes, "qcow2_bytes": (work / "rootfs.qcow2").stat().st_size,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (work / "build.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        for old in root.glob("guest-*"):  # one guest per cache: an older tree's image goes
            shutil.rmtree(old, ignore_errors=True)
        work.rename(final)
        _log(f"guest {key}: built in {info['build_seconds']:.0f} s, qcow2 {info['qcow2_bytes'] / 1e9:.2f} GB")
        image = _load(final)
        assert image is not None
        return image


def build_all(root: Path | None = None) -> dict:
    """Everything the VM tier needs: the test CA, the guest image, the stand-in base layer.
    Returns their build.json documents."""
    from tests.vm import standin_image

    guest = build_guest(root)
    base = standin_image.build_base_layer(root)
    return {"guest": guest.info, "standin_base": base.info}


def main(argv: list[str] | None = None) -> int:
    """``build`` or ``status``; exit 0 ok, 1 build failed, 2 usage."""
    parser = argparse.ArgumentParser(prog="python -m tests.vm.image", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("build", "status"), help="build what is missing, or show the cache")
    parser.add_argument("--cached", action="store_true", help="status: exit 1 unless everything is cached")
    args = parser.parse_args(argv)
    if args.action == "status":
        from tests.vm import standin_image

        guest = cached_guest()
        base = standin_image.cached_base_layer()
        if args.cached and (guest is None or base is None):
            return 1
        print(json.dumps({"cache": str(cache_root()), "guest": guest.info if guest else None,
                          "standin_base": base.info if base else None}, indent=1, sort_keys=True))
        return 0
    try:
        infos = build_all()
    except BuildError as exc:
        print(f"vm-image: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({k: {"key": v["key"], "build_seconds": v["build_seconds"]} for k, v in infos.items()}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

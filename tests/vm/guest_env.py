"""The VM guest's environment: what differs from a p6-b300 booting the DLAMI on EC2, in one place.

The user data runs as rendered (byte for byte what ``pulumi up`` sends, from the NoCloud seed); it
never special-cases the test. Everything the guest gets instead of EC2 is listed in
``DIFFERENCES`` with its reason, and the files the image adds for it are ``GUEST_FILES``.

Addresses: QEMU's user-mode network (libslirp) with ``restrict=on`` (the guest reaches nothing but
the forwarded addresses) on a link-local network, so that the metadata address 169.254.169.254 is
inside it and can be forwarded (libslirp forwards only addresses of its own network); each
forwarded address runs ``relay.py`` to a host port on 127.0.0.1 (``guestfwd=...-cmd:``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from components.aws.ami_contract import INSTANCE_STORE_MODEL

# libslirp network of the guest (QEMU -netdev user: net=, host=, dhcpstart=, dns=).
GUEST_NETWORK = "169.254.0.0/16"
GUEST_GATEWAY = "169.254.0.2"
GUEST_DNS = "169.254.0.3"
GUEST_DHCP_START = "169.254.0.15"
# Forwarded addresses (guest side): instance metadata as on EC2; one TLS front for the AWS
# endpoints and the hub (names resolved by /etc/hosts, see HOSTS_FW_CFG); the registry mirror.
IMDS_ADDRESS, IMDS_PORT = "169.254.169.254", 80
FRONT_ADDRESS, FRONT_PORT = "169.254.0.10", 443
REGISTRY_ADDRESS, REGISTRY_PORT = "169.254.0.11", 5000
# QEMU fw_cfg item carrying the /etc/hosts lines of one run (the bucket's name is known per run).
HOSTS_FW_CFG = "opt/kimi-deploy/hosts"
QEMU_NVME_MODEL = "QEMU NVMe Ctrl"
HUB_HOST = "huggingface.co"


def endpoint_names(bucket: str, region: str) -> tuple[str, ...]:
    """The host names the chain resolves: S3 (virtual-hosted and path style, global and regional),
    SSM, STS and the hub. botocore and the AWS CLI address buckets as ``BUCKET.s3...``
    (virtual-hosted style) for DNS-compatible names."""
    return (
        f"{bucket}.s3.amazonaws.com", f"{bucket}.s3.{region}.amazonaws.com", "s3.amazonaws.com",
        f"s3.{region}.amazonaws.com", f"ssm.{region}.amazonaws.com", f"sts.{region}.amazonaws.com",
        "sts.amazonaws.com", HUB_HOST,
    )


def hosts_lines(bucket: str, region: str) -> str:
    """The /etc/hosts lines of one run (fw_cfg ``HOSTS_FW_CFG``)."""
    return "".join(f"{FRONT_ADDRESS} {name}\n" for name in endpoint_names(bucket, region))


@dataclass(frozen=True)
class Difference:
    """One way the VM differs from EC2.

    Attributes:
        what: the part of the chain concerned.
        ec2: what a p6-b300 with the DLAMI has.
        vm: what the guest has instead.
        reason: why.
    """

    what: str
    ec2: str
    vm: str
    reason: str


DIFFERENCES: tuple[Difference, ...] = (
    Difference("operating system", "Amazon Linux 2023 (DLAMI), systemd 252, cloud-init 22.2, AWS CLI 2.x, Docker 25",
               "Debian 12 from Debian's packages (ami_contract.DEBIAN_PACKAGES): systemd 252, cloud-init 22.4, "
               "AWS CLI 2.9, docker.io 20.10",
               "AL2023 packages are not installable here; systemd, the part whose semantics the chain relies on, "
               "is the same major version"),
    Difference("boot", "UEFI firmware, GRUB, the AL2023 kernel, XFS root on EBS, no AppArmor (SELinux permissive)",
               "QEMU direct kernel boot of Debian's cloud kernel 6.1 with apparmor=0, ext4 root on virtio",
               "no bootloader is under test; the root disk is not part of the chain; Debian's kernel enables "
               "AppArmor, whose Docker profile needs apparmor_parser, which AL2023 does not have either"),
    Difference("CPU", "KVM on Nitro", "KVM where usable, else software emulation (TCG)",
               "KVM aborts here (-cpu host: MSR assertion); TCG is 10-50x slower, so times are upper bounds"),
    Difference("user data delivery", "IMDS /latest/user-data read by cloud-init's Ec2 datasource",
               "a NoCloud seed (cidata ISO) holding the same bytes; datasource_list [NoCloud, None]",
               "cloud-init runs the same modules on the same #cloud-config either way"),
    Difference("instance store", "8 x 3.8 TB NVMe, model 'Amazon EC2 NVMe Instance Storage'",
               f"4 QEMU NVMe disks of a few GiB; kimi-vm-env.service overlays each controller's model attribute "
               f"('{QEMU_NVME_MODEL}') with '{INSTANCE_STORE_MODEL}' before local-fs.target",
               "QEMU 7.2's nvme device has no property for its model string"),
    Difference("DLAMI array", "dlami-nvme.service stripes the instance store at /opt/dlami/nvme",
               "no dlami-nvme.service: nvme-raid0.sh builds its own mdadm RAID0 (its path on other AMIs)",
               "the DLAMI's unit is not public; the mdadm path is the one that can break"),
    Difference("GPUs", "8 B300, NVIDIA driver, NVIDIA Container Toolkit",
               "no GPU; /usr/bin/nvidia-container-runtime-hook is a no-op stand-in so `docker run --gpus all` "
               "starts the container", "no GPU here; the hook is what Docker's --gpus calls"),
    Difference("vLLM", "the pinned vllm/vllm-openai image (~25 GB)",
               "a small image of the same name and tag: Debian python3 with boto3 and huggingface_hub at "
               "requirements.txt's pins, and a `vllm` entry point that reads every weight file, then answers "
               "/health and /v1/models (tests/vm/standin_vllm.py)",
               "the GPU server cannot run here; the sync steps run their real code in it"),
    Difference("network", "VPC subnet, S3 gateway endpoint, the AWS endpoints and the hub over the internet",
               f"QEMU user-mode network {GUEST_NETWORK} with restrict=on; AWS endpoint and hub names resolve "
               f"through /etc/hosts (written at boot from fw_cfg) to a TLS front on the host ({FRONT_ADDRESS}:443) "
               "whose certificate is signed by a test CA that the guest and the stand-in image trust",
               "no AWS here; names and TLS stay as the real clients use them, no endpoint override"),
    Difference("AWS services", "S3, SSM Parameter Store, IMDSv2 with the instance role",
               "moto in server mode (S3, SSM) behind the TLS front; an IMDSv2 stand-in (token required) at "
               "169.254.169.254 serving region and role credentials (tests/vm/services.py)",
               "no AWS account here"),
    Difference("image registry", "Docker Hub",
               f"Docker's registry-mirrors set to a read-only registry stand-in on the host "
               f"({REGISTRY_ADDRESS}:{REGISTRY_PORT}, /etc/docker/daemon.json)",
               "no Docker Hub here; a mirror is how a site points Docker at another registry"),
    Difference("operator access", "Session Manager (SSM agent)", "QEMU guest agent (qemu-guest-agent) for the test",
               "the scenarios read unit states, journals and files from inside the guest"),
    # The stager (phase: stage), booted from the same guest image:
    Difference("stager AMI", "the standard Amazon Linux 2023 AMI: no docker, no NVIDIA Container Toolkit; the stage "
               "contract installs docker and mdadm with dnf at boot",
               "the same Debian guest: docker.io and mdadm are there, so the contract's install step is skipped (the "
               "no-op NVIDIA hook is there too; the stage contract does not ask for it)",
               "one guest image for both roles; the install step runs on a stand-in PATH in "
               "tests/test_ami_contract.py"),
    Difference("stager instance store", "an m6idn.4xlarge's one NVMe disk, there from the start",
               "no disk at first; one QEMU NVMe disk hot-plugged (QMP device_add into an empty PCIe root port) "
               "after the first stage attempt failed, its model overlaid by kimi-vm-env run again",
               "the scenario proves a failed RAID unit runs again at the next attempt"),
    Difference("stager journal", "persistent (/var/log/journal), lost when the instance terminates",
               "made persistent by the test as soon as the guest agent answers, read from the disk after the "
               "power-off (debugfs, journalctl --directory)",
               "the stager powers itself off: there is nothing to ask afterwards"),
)

# Packages the guest needs beyond the AMI contract, each with its reason.
GUEST_EXTRA_PACKAGES: dict[str, str] = {
    "systemd-sysv": "systemd as PID 1",
    "udev": "device nodes for the NVMe disks and the md array",
    "linux-image-cloud-amd64": "the kernel (virtio, NVMe, md RAID0, XFS, fw_cfg as modules or built in)",
    "initramfs-tools": "the initrd that mounts the virtio root",
    "ifupdown": "cloud-init's network renderer on Debian (DHCP on the first NIC)",
    "isc-dhcp-client": "DHCP from QEMU's user-mode network",
    "iproute2": "network configuration",
    "ca-certificates": "the trust store the test CA is added to",
    "curl": "the scenarios ask the server's /health from inside the guest",
    "kmod": "modprobe (qemu_fw_cfg)",
    "procps": "ps, for the scenarios",
    "qemu-guest-agent": "the test's way into the guest (guest-exec)",
}

VM_ENV_SCRIPT = f"""#!/bin/bash
# kimi-deploy VM test environment (tests/vm/guest_env.py DIFFERENCES): what EC2 provides and
# QEMU does not. Runs at every boot before local-fs.target.
set -euo pipefail
modprobe qemu_fw_cfg || true
hosts=/sys/firmware/qemu_fw_cfg/by_name/{HOSTS_FW_CFG}/raw
if [ -r "$hosts" ]; then
  sed -i '/# kimi-vm-env$/d' /etc/hosts
  sed 's/$/ # kimi-vm-env/' "$hosts" >>/etc/hosts
fi
# QEMU's NVMe controller reports "{QEMU_NVME_MODEL}" and has no property to change it; EC2's
# instance store reports "{INSTANCE_STORE_MODEL}".
mkdir -p /run/kimi-vm-env
for ctrl in /sys/class/nvme/nvme*; do
  [ -e "$ctrl/model" ] || continue
  model=$(readlink -f "$ctrl/model")
  case "$(cat "$model")" in
    *"{QEMU_NVME_MODEL}"*) ;;
    *) continue ;;
  esac
  printf '%-40s\\n' "{INSTANCE_STORE_MODEL}" >"/run/kimi-vm-env/${{ctrl##*/}}.model"
  mount --bind "/run/kimi-vm-env/${{ctrl##*/}}.model" "$model"
  echo "kimi-vm-env: ${{ctrl##*/}} reports '{INSTANCE_STORE_MODEL}'"
done
"""

VM_ENV_UNIT = """[Unit]
Description=kimi-deploy VM test environment (host names, NVMe model): tests/vm/guest_env.py
DefaultDependencies=no
# The NVMe driver is built into Debian's cloud kernel: the controllers exist before PID 1 starts.
After=systemd-remount-fs.service systemd-modules-load.service
Before=local-fs.target cloud-init-local.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/kimi-vm-env

[Install]
WantedBy=sysinit.target
"""

NVIDIA_HOOK_STANDIN = """#!/bin/sh
# Stand-in for the NVIDIA Container Toolkit's OCI prestart hook (tests/vm/guest_env.py): Docker's
# --gpus runs `nvidia-container-runtime-hook prestart` with the container state on stdin; the real
# hook mounts the driver and the GPU devices. This guest has no GPU, so it passes nothing in.
cat >/dev/null
exit 0
"""

CLOUD_CFG = """# kimi-deploy VM tier (tests/vm/guest_env.py): user data from the NoCloud seed only; the root
# file system is not partitioned (direct kernel boot); there is no SSH server; the minimal image
# generates no en_US locale (Debian's default here), so the built-in C.UTF-8.
datasource_list: [ NoCloud, None ]
growpart: {mode: "off"}
resize_rootfs: false
ssh_genkeytypes: []
locale: C.UTF-8
"""

DOCKER_DAEMON_JSON = json.dumps({"registry-mirrors": [f"http://{REGISTRY_ADDRESS}:{REGISTRY_PORT}"],
                                 "insecure-registries": [f"{REGISTRY_ADDRESS}:{REGISTRY_PORT}"]}) + "\n"

# Files the image adds: path -> (text, mode). The test CA is added by image.py.
GUEST_FILES: dict[str, tuple[str, int]] = {
    "/usr/local/sbin/kimi-vm-env": (VM_ENV_SCRIPT, 0o755),
    "/etc/systemd/system/kimi-vm-env.service": (VM_ENV_UNIT, 0o644),
    "/usr/bin/nvidia-container-runtime-hook": (NVIDIA_HOOK_STANDIN, 0o755),
    "/etc/cloud/cloud.cfg.d/90-kimi-vm.cfg": (CLOUD_CFG, 0o644),
    "/etc/docker/daemon.json": (DOCKER_DAEMON_JSON, 0o644),
    "/etc/fstab": ("/dev/vda / ext4 defaults,errors=remount-ro 0 1\n", 0o644),
    "/etc/hostname": ("kimi-vm\n", 0o644),
}
GUEST_UNITS_ENABLED = ("kimi-vm-env.service",)
KERNEL_CMDLINE = "root=/dev/vda rw console=ttyS0,115200 net.ifnames=0 panic=-1 apparmor=0"

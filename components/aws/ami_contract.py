"""What the ``aws-ec2`` boot chain needs from the AMI: one list (pure data; no Pulumi).

The user data (``userdata.py``) runs shell scripts and systemd units that call these commands,
start these units and read these paths and device strings. The default AMI, the AWS Deep Learning
Base OSS NVIDIA Driver GPU AMI (Amazon Linux 2023), provides all of them; a custom AMI
(``compute.amiId``) must too. ``check_script`` renders the list as the first step of the chain
(``kimi-nvme-raid0.service``'s ``ExecStartPre=``): a missing item fails the boot early with one
line naming it and its package. The VM test tier (``tests/vm/``) builds its guest from
``DEBIAN_PACKAGES``, so a boot that passes there proves the list is complete.

Sources:
- DLAMI release notes, "AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023)"
  (https://docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html): Amazon Linux
  2023 with the NVIDIA driver, CUDA, the NVIDIA Container Toolkit (``nvidia_container_toolkit_version``),
  Docker, the EFA installer (``efa_version``), the SSM agent, and the instance store striped and
  mounted at ``nvme_location`` ``/opt/dlami/nvme``.
- Amazon Linux 2023 package list (https://docs.aws.amazon.com/linux/al2023/release-notes/all-packages.html):
  ``awscli-2``, ``docker``, ``mdadm``, ``xfsprogs``, ``util-linux``, ``coreutils``, ``gawk``,
  ``systemd``, ``cloud-init`` (systemd 252: https://docs.aws.amazon.com/linux/al2023/ug/systemd.html).
- EC2 User Guide, "Instance store volumes: NVMe SSD" / "Amazon EBS and NVMe": instance-store NVMe
  devices report the model ``Amazon EC2 NVMe Instance Storage``; EBS volumes report ``Amazon
  Elastic Block Store`` (https://docs.aws.amazon.com/ebs/latest/userguide/nvme-ebs-volumes.html).
- NVIDIA Container Toolkit: Docker's ``--gpus`` runs the prestart hook
  ``nvidia-container-runtime-hook`` found on PATH (moby ``daemon/nvidia_linux.go``; the toolkit
  package installs it: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The model string of instance-store NVMe devices (EC2 User Guide, see the module docstring); the
# RAID script stripes every /sys/block/nvme*n* whose device/model contains INSTANCE_STORE_MODEL_MATCH.
INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
INSTANCE_STORE_MODEL_MATCH = "Instance Storage"
EBS_MODEL = "Amazon Elastic Block Store"
# The Deep Learning AMI's own RAID0 of the instance store (DLAMI release notes: nvme_location),
# made by DLAMI_NVME_UNIT at every boot before user data runs.
DLAMI_NVME_PATH = "/opt/dlami/nvme"
DLAMI_NVME_UNIT = "dlami-nvme.service"
EFA_DEVICE_PATH = "/dev/infiniband"

Kind = Literal["command", "unit", "path", "device-model"]
# When an item is needed: always; only without the DLAMI's own array (the script builds one);
# only with EFA (the vLLM container gets the EFA devices).
When = Literal["always", "no-dlami-array", "efa"]


@dataclass(frozen=True)
class AmiRequirement:
    """One thing the boot chain needs from the AMI.

    Attributes:
        name: the command (found on PATH), unit, path or device model string.
        kind: ``command``, ``unit``, ``path`` or ``device-model``.
        al2023_package: the Amazon Linux 2023 / DLAMI package that provides it (None: hardware).
        debian_package: the Debian package the VM guest installs for it (None: the guest has a
            stand-in, listed in ``tests/vm/guest_env.py`` ``DIFFERENCES`` with the reason).
        used_by: which part of the user data needs it.
        when: ``always``, ``no-dlami-array`` or ``efa``.
    """

    name: str
    kind: Kind
    al2023_package: str | None
    debian_package: str | None
    used_by: str
    when: When = "always"


AMI_REQUIREMENTS: tuple[AmiRequirement, ...] = (
    AmiRequirement("bash", "command", "bash", "bash", "every script (#!/bin/bash, arrays)"),
    AmiRequirement("cloud-init", "command", "cloud-init", "cloud-init", "reads the #cloud-config user data"),
    AmiRequirement("systemctl", "command", "systemd", "systemd", "the units (ExecStartPost= starts vLLM)"),
    AmiRequirement("systemd-notify", "command", "systemd", "systemd", "weights.sh (the unit's Status: line)"),
    AmiRequirement("aws", "command", "awscli-2", "awscli", "weights.sh (S3), secret-env.sh (SSM)"),
    AmiRequirement("docker", "command", "docker", "docker.io", "weights.sh, run-vllm.sh, the units"),
    AmiRequirement("docker.service", "unit", "docker", "docker.io", "Requires= of the weights and vLLM units"),
    AmiRequirement("sh", "command", "bash", "dash", "the weights unit's ExecStopPost= (/bin/sh)"),
    AmiRequirement("sha256sum", "command", "coreutils", "coreutils", "weights.sh (checks the zipapp)"),
    AmiRequirement("install", "command", "coreutils", "coreutils", "weights.sh"),
    AmiRequirement("mktemp", "command", "coreutils", "coreutils", "secret-env.sh"),
    AmiRequirement("mkdir", "command", "coreutils", "coreutils", "every script"),
    AmiRequirement("mv", "command", "coreutils", "coreutils", "weights.sh, secret-env.sh"),
    AmiRequirement("cat", "command", "coreutils", "coreutils", "nvme-raid0.sh"),
    AmiRequirement("dirname", "command", "coreutils", "coreutils", "secret-env.sh"),
    AmiRequirement("rm", "command", "coreutils", "coreutils", "weights.sh"),
    AmiRequirement("tee", "command", "coreutils", "coreutils", "weights.sh (keeps the failed step's last line)"),
    AmiRequirement("tail", "command", "coreutils", "coreutils", "weights.sh (the failed step's last line)"),
    AmiRequirement("awk", "command", "gawk", "mawk", "nvme-raid0.sh (mdadm --detail --scan)"),
    AmiRequirement("mountpoint", "command", "util-linux", "util-linux", "nvme-raid0.sh, weights.sh"),
    AmiRequirement("mount", "command", "util-linux", "mount", "nvme-raid0.sh"),
    AmiRequirement("nvidia-container-runtime-hook", "command", "nvidia-container-toolkit", None,
                   "docker run --gpus all (run-vllm.sh)"),
    AmiRequirement("mdadm", "command", "mdadm", "mdadm", "nvme-raid0.sh", "no-dlami-array"),
    AmiRequirement("mkfs.xfs", "command", "xfsprogs", "xfsprogs", "nvme-raid0.sh", "no-dlami-array"),
    AmiRequirement("blkid", "command", "util-linux", "util-linux", "nvme-raid0.sh", "no-dlami-array"),
    AmiRequirement(INSTANCE_STORE_MODEL, "device-model", None, None, "nvme-raid0.sh (which NVMe devices to stripe)",
                   "no-dlami-array"),
    AmiRequirement(DLAMI_NVME_PATH, "path", "DLAMI (dlami-nvme.service)", None,
                   "nvme-raid0.sh: bind-mounted when mounted, else its own RAID0 (optional)", "no-dlami-array"),
    AmiRequirement(EFA_DEVICE_PATH, "path", "aws-efa-installer", None, "run-vllm.sh (--device, EFA on)", "efa"),
)

# The Debian packages of the VM guest (tests/vm/image.py) that stand for the AMI's.
DEBIAN_PACKAGES: tuple[str, ...] = tuple(dict.fromkeys(r.debian_package for r in AMI_REQUIREMENTS if r.debian_package))
CHECK_SCRIPT_MESSAGE = "kimi-deploy: this AMI lacks what the boot needs:"


def _commands(when: When) -> str:
    """``name:package`` words of the commands needed ``when``."""
    return " ".join(f"{r.name}:{r.al2023_package}" for r in AMI_REQUIREMENTS if r.kind == "command" and r.when == when)


def check_script(efa: bool) -> str:
    """Shell script: every requirement of ``AMI_REQUIREMENTS`` for this node (EFA or not), checked
    in one pass; when something is missing, one line on stderr naming each missing item and its
    AL2023 package, exit 1. The RAID items are checked only when the DLAMI's array is not mounted
    (the script then builds its own). Instance-store devices are counted by the RAID script itself
    (``kimi-nvme: no instance-store NVMe device found``)."""
    lines = [
        "#!/bin/bash",
        "# The AMI contract (components/aws/ami_contract.py): fail early, one line naming what is missing.",
        "missing=()",
        'need() { for c in "$@"; do command -v "${c%%:*}" >/dev/null 2>&1 || missing+=("${c%%:*} (package ${c#*:})"); done; }',
        f"need {_commands('always')}",
        'systemctl cat docker.service >/dev/null 2>&1 || missing+=("docker.service (package docker)")',
        f"mountpoint -q {DLAMI_NVME_PATH} || need {_commands('no-dlami-array')}",
    ]
    if efa:
        lines.append(f'[ -e {EFA_DEVICE_PATH} ] || missing+=("{EFA_DEVICE_PATH} (package aws-efa-installer)")')
    lines += [
        '[ "${#missing[@]}" -eq 0 ] && exit 0',
        "printf -v list '%s, ' \"${missing[@]}\"",
        f'echo "{CHECK_SCRIPT_MESSAGE} ${{list%, }} (docs/operations.md: AMI contract)" >&2',
        "exit 1",
    ]
    return "\n".join(lines) + "\n"

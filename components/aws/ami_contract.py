"""What the ``aws-ec2`` boot chains need from their AMIs: one list, one contract per role (pure data;
no Pulumi).

The user data (``userdata.py``) runs shell scripts and systemd units that call these commands,
start these units and read these paths and device strings. Two roles boot it, each with its own
contract (``CONTRACTS``):

- ``serve``: the GPU instance, on the AWS Deep Learning Base OSS NVIDIA Driver GPU AMI (Amazon
  Linux 2023) by default, which provides every item; a custom AMI (``compute.amiId``) must too.
- ``stage``: the stager of ``phase: stage`` (``stager.py``), a CPU instance on the standard Amazon
  Linux 2023 AMI: no GPU items (no NVIDIA Container Toolkit, no EFA), and two packages that AMI
  does not ship (``docker``, ``mdadm``) installed at boot with ``dnf`` when their command is
  missing (``install_on``), inside the retried chain rather than by cloud-init's ``packages:``
  (which runs once: a repository hiccup there would leave the stager idle).

``check_script(role)`` renders a role's contract as the first step of its chain
(``kimi-nvme-raid0.service``'s ``ExecStartPre=``, written by that role's own user data): the
installs, then every item checked in one pass; a missing item fails the boot early with one line
naming it, its package and the contract. The VM test tier (``tests/vm/``) builds its guest from
``DEBIAN_PACKAGES`` and boots both roles' user data, so a boot that passes there proves each list
is complete.

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
- Amazon Linux 2023 user guide, "Package management tool" (dnf) and "Using Docker on AL2023"
  (https://docs.aws.amazon.com/linux/al2023/ug/package-management.html,
  https://docs.aws.amazon.com/linux/al2023/ug/docker.html: ``dnf install docker``; the standard
  AMI does not ship docker).
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
# Which instance boots the user data: the GPU server, or the stager of phase: stage.
Role = Literal["serve", "stage"]
ROLES: tuple[Role, ...] = ("serve", "stage")
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
        roles: the roles whose user data needs it (``ROLES``: both unless it is a GPU item).
        install_on: the roles whose user data installs ``al2023_package`` with ``dnf`` at boot
            when the command is missing (their default AMI lacks it), before the check.
    """

    name: str
    kind: Kind
    al2023_package: str | None
    debian_package: str | None
    used_by: str
    when: When = "always"
    roles: tuple[Role, ...] = ROLES
    install_on: tuple[Role, ...] = ()


AMI_REQUIREMENTS: tuple[AmiRequirement, ...] = (
    AmiRequirement("bash", "command", "bash", "bash", "every script (#!/bin/bash, arrays)"),
    AmiRequirement("cloud-init", "command", "cloud-init", "cloud-init", "reads the #cloud-config user data"),
    AmiRequirement("systemctl", "command", "systemd", "systemd", "the units (ExecStartPost= starts vLLM)"),
    AmiRequirement("systemd-notify", "command", "systemd", "systemd", "weights.sh (the unit's Status: line)"),
    AmiRequirement("aws", "command", "awscli-2", "awscli", "weights.sh (S3), secret-env.sh (SSM)"),
    AmiRequirement("docker", "command", "docker", "docker.io", "weights.sh, run-vllm.sh, the units",
                   install_on=("stage",)),
    AmiRequirement("docker.service", "unit", "docker", "docker.io",
                   "Requires= of the weights and vLLM units; started by kimi-stage.service", install_on=("stage",)),
    AmiRequirement("sh", "command", "bash", "dash", "the weights unit's ExecStopPost= (/bin/sh)"),
    AmiRequirement("sha256sum", "command", "coreutils", "coreutils", "weights.sh (checks the zipapp)"),
    AmiRequirement("install", "command", "coreutils", "coreutils", "weights.sh"),
    AmiRequirement("mktemp", "command", "coreutils", "coreutils", "secret-env.sh"),
    AmiRequirement("mkdir", "command", "coreutils", "coreutils", "every script"),
    AmiRequirement("mv", "command", "coreutils", "coreutils", "weights.sh, secret-env.sh"),
    AmiRequirement("cat", "command", "coreutils", "coreutils", "nvme-raid0.sh"),
    AmiRequirement("sleep", "command", "coreutils", "coreutils", "nvme-raid0.sh (waits for the array's /dev/md/ link)"),
    AmiRequirement("dirname", "command", "coreutils", "coreutils", "secret-env.sh"),
    AmiRequirement("rm", "command", "coreutils", "coreutils", "weights.sh"),
    AmiRequirement("tee", "command", "coreutils", "coreutils", "weights.sh (keeps the failed step's last line)"),
    AmiRequirement("tail", "command", "coreutils", "coreutils", "weights.sh (the failed step's last line)"),
    AmiRequirement("awk", "command", "gawk", "mawk", "nvme-raid0.sh (mdadm --detail --scan)"),
    AmiRequirement("date", "command", "coreutils", "coreutils", "watch.sh (the expiry, the startup budget)",
                   roles=("serve",)),
    AmiRequirement("curl", "command", "curl-minimal", "curl", "watch.sh (vLLM's /health)", roles=("serve",)),
    AmiRequirement("mountpoint", "command", "util-linux", "util-linux", "nvme-raid0.sh, weights.sh"),
    AmiRequirement("mount", "command", "util-linux", "mount", "nvme-raid0.sh"),
    AmiRequirement("nvidia-container-runtime-hook", "command", "nvidia-container-toolkit", None,
                   "docker run --gpus all (run-vllm.sh)", roles=("serve",)),
    AmiRequirement("mdadm", "command", "mdadm", "mdadm", "nvme-raid0.sh", "no-dlami-array", install_on=("stage",)),
    AmiRequirement("mkfs.xfs", "command", "xfsprogs", "xfsprogs", "nvme-raid0.sh", "no-dlami-array"),
    AmiRequirement("blkid", "command", "util-linux", "util-linux", "nvme-raid0.sh", "no-dlami-array"),
    AmiRequirement(INSTANCE_STORE_MODEL, "device-model", None, None, "nvme-raid0.sh (which NVMe devices to stripe)",
                   "no-dlami-array"),
    AmiRequirement(DLAMI_NVME_PATH, "path", "DLAMI (dlami-nvme.service)", None,
                   "nvme-raid0.sh: bind-mounted when mounted, else its own RAID0 (optional)", "no-dlami-array"),
    AmiRequirement(EFA_DEVICE_PATH, "path", "aws-efa-installer", None, "run-vllm.sh (--device, EFA on)", "efa",
                   roles=("serve",)),
    # Only where something is installed at boot (install_on): the standard AL2023 AMI's package manager.
    AmiRequirement("dnf", "command", "dnf", None, "ami-check.sh (installs what the stager's AMI lacks)",
                   roles=("stage",)),
)

# The Debian packages of the VM guest (tests/vm/image.py) that stand for the AMI's (both roles).
DEBIAN_PACKAGES: tuple[str, ...] = tuple(dict.fromkeys(r.debian_package for r in AMI_REQUIREMENTS if r.debian_package))
CHECK_SCRIPT_MESSAGE = "kimi-deploy: this AMI lacks what the boot needs:"


@dataclass(frozen=True)
class AmiContract:
    """What one role's user data needs from its AMI.

    Attributes:
        role: ``serve`` (the GPU instance) or ``stage`` (the stager).
        ami: the AMI it is written for (the role's default; see the module docstring's sources).
        requirements: the items of ``AMI_REQUIREMENTS`` this role needs (``AmiRequirement.roles``).
        installs: AL2023 packages its user data installs at boot when their command is missing.
    """

    role: Role
    ami: str
    requirements: tuple[AmiRequirement, ...]
    installs: tuple[str, ...]


def _contract(role: Role, ami: str) -> AmiContract:
    needed = tuple(r for r in AMI_REQUIREMENTS if role in r.roles)
    installs = tuple(dict.fromkeys(r.al2023_package for r in needed if role in r.install_on and r.al2023_package))
    return AmiContract(role, ami, needed, installs)


CONTRACTS: dict[Role, AmiContract] = {
    "serve": _contract("serve", "AWS Deep Learning Base OSS NVIDIA Driver GPU AMI (Amazon Linux 2023)"),
    "stage": _contract("stage", "Amazon Linux 2023 (standard, al2023-ami-kernel-default)"),
}


def _commands(contract: AmiContract, when: When) -> str:
    """``name:package`` words of the contract's commands needed ``when`` (``dnf`` only where it installs)."""
    return " ".join(f"{r.name}:{r.al2023_package}" for r in contract.requirements
                    if r.kind == "command" and r.when == when and r.name != "dnf")


def check_script(role: Role, efa: bool = False) -> str:
    """Shell script: ``role``'s contract (``CONTRACTS``) for this node (EFA or not), checked in one pass.

    First the installs (``AmiContract.installs``): the packages whose command is missing, with
    ``dnf install -y`` (then ``systemctl daemon-reload`` for their units); ``dnf`` itself is needed
    only then. Then every item: when something is missing, one line on stderr naming each missing
    item, its AL2023 package and the contract, exit 1; else one line on stdout saying the contract
    holds. The RAID items are checked only when the DLAMI's array is not mounted (the script then
    builds its own). Instance-store devices are counted by the RAID script itself (``kimi-nvme: no
    instance-store NVMe device found``).

    Raises:
        KeyError: an unknown role.
    """
    contract = CONTRACTS[role]
    lines = [
        "#!/bin/bash",
        f"# The AMI contract of the {role} role (components/aws/ami_contract.py, written for {contract.ami}):",
        "# fail early, one line naming what is missing.",
        "missing=()",
        'need() { for c in "$@"; do command -v "${c%%:*}" >/dev/null 2>&1 || missing+=("${c%%:*} (package ${c#*:})"); done; }',
    ]
    if contract.installs:
        pairs = " ".join(f"{r.name}:{r.al2023_package}" for r in contract.requirements
                         if role in r.install_on and r.kind == "command")
        lines += [
            "# Installed at boot where this AMI lacks them (a failed install is retried with the chain).",
            "install=()",
            f'for c in {pairs}; do command -v "${{c%%:*}}" >/dev/null 2>&1 || install+=("${{c#*:}}"); done',
            'if [ "${#install[@]}" -gt 0 ]; then',
            '  if command -v dnf >/dev/null 2>&1; then',
            '    echo "kimi-deploy: installing ${install[*]} (not on this AMI)"',
            '    dnf install -y -q "${install[@]}" && systemctl daemon-reload',
            '  else',
            '    missing+=("dnf (package dnf)")',
            '  fi',
            'fi',
        ]
    lines += [
        f"need {_commands(contract, 'always')}",
        'systemctl cat docker.service >/dev/null 2>&1 || missing+=("docker.service (package docker)")',
        f"mountpoint -q {DLAMI_NVME_PATH} || need {_commands(contract, 'no-dlami-array')}",
    ]
    if efa and role == "serve":
        lines.append(f'[ -e {EFA_DEVICE_PATH} ] || missing+=("{EFA_DEVICE_PATH} (package aws-efa-installer)")')
    lines += [
        f'[ "${{#missing[@]}}" -eq 0 ] && {{ echo "kimi-deploy: AMI contract ({role}): every item present"; exit 0; }}',
        "printf -v list '%s, ' \"${missing[@]}\"",
        f'echo "{CHECK_SCRIPT_MESSAGE} ${{list%, }}; contract: {role} (docs/operations.md: AMI contract)" >&2',
        "exit 1",
    ]
    return "\n".join(lines) + "\n"

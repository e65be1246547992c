"""Boot-time configuration of GPU nodes (pure functions; no Pulumi).

- ``ec2_cloud_config``: the ``#cloud-config`` of a single ``aws-ec2`` GPU instance. It writes
  small scripts and systemd units, then starts them:
  ``kimi-nvme-raid0`` (first the AMI contract check, ``ami_contract.check_script``: one line
  naming what the AMI lacks; then the instance-store NVMe as one RAID0 at ``NVME_RAID0_HOST_PATH``,
  idempotent across reboots: on the Deep Learning AMI, whose ``dlami-nvme.service`` already
  stripes and mounts every instance-store disk at ``/opt/dlami/nvme``, a bind mount of that;
  on another AMI, an mdadm RAID0 of its own) ->
  ``kimi-weights`` (fetch the weight-sync program from the mirror unless the copy on disk has its
  sha256, pull the pinned vLLM image unless it is cached, then: a complete local copy unchanged
  since verified (``weight_sync --check-local``) is served as is, with no request to the hub, the
  mirror or the registry; else run the ``publish-mirror`` and ``node-copy`` steps of
  ``core/weights.py sync_steps`` inside that image) -> ``kimi-vllm`` (the vLLM container with
  the argv and env of ``core/vllm.py``, restarted on failure). Secrets are fetched from SSM
  SecureString parameters into ``/run`` (tmpfs) when needed; user data holds only their names.

  The weights unit STARTS vLLM when it succeeds (``ExecStartPost=``), on its first attempt or a
  later ``Restart=`` attempt. vLLM has no ``Requires=`` on it: on systemd 252 (AL2023) a queued
  start of a unit that ``Requires=`` a failing one-shot fails with "dependency failed" and is
  never retried, even when the one-shot's retry succeeds (``RestartMode=direct`` needs 254).
  vLLM is not enabled on its own either, so it never starts without the weights: at every boot
  the weights unit runs (a complete copy is a fast no-op) and starts it. Each weights attempt
  has a finite ``TimeoutStartSec`` (the sync budget); ``compute.weightsRetry`` sets the attempts
  (``StartLimitBurst``) and the delay between them (``RestartSec``); after the last one it stays
  failed until ``systemctl reset-failed`` (every failed attempt says so in its last journal line,
  ``ExecStopPost=``). The weights unit has ``DefaultDependencies=no`` so that
  ``multi-user.target`` does not wait for the sync (a target is ordered after the units it wants
  unless they opt out: systemd.target(5)); it only ``Wants=`` the RAID unit and checks the
  mount itself, so a failed RAID unit fails it visibly instead of leaving it "inactive (dead)"
  with a dependency result (systemd.unit(5), ``Requires=``).
  ``kimi-watch.timer`` (``watch_units``) runs beside them, a minute after boot and every minute:
  on a stack that expires it powers the instance off once ``expires-at`` (read from an SSM
  parameter) has passed (the second net under the EventBridge Scheduler stop, ``expiry.py``),
  and it is the
  watchdog systemd's ``Restart=`` is not: it restarts ``kimi-vllm`` when its process is alive
  but ``/health`` fails (an error or no answer within ``WATCH_TIMEOUT_SECONDS``)
  ``WATCH_FAILURES_BEFORE_RESTART`` checks in a row once the engine answered, or once the
  startup budget has passed since the start.
- ``stage_cloud_config_text``: the stager's (``phase: stage``, ``stager.py``) ``#cloud-config``: its
  own AMI contract (``check_script("stage")``: the standard Amazon Linux 2023 AMI, no GPU items,
  docker and mdadm installed at boot), the same RAID0 and weights scripts with only the
  ``publish-mirror`` step, run by ``kimi-stage.service``, which powers the instance off (so
  terminates it) once the mirror is complete, and retries a failed attempt, RAID unit included.
- ``eks_node_user_data``: the MIME multi-part user data of EKS GPU nodes: a nodeadm
  ``NodeConfig`` with ``localStorage: RAID0`` (plus the cluster details for a custom AMI).

EC2 user data is limited to 16 KB, so the weight-sync program travels through S3.
"""

from __future__ import annotations

import gzip
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import yaml

from components.core.engine_cache import GATE_DIR, GATE_ENV, GATE_FILE
from components.core.naming import NVME_RAID0_HOST_PATH
from components.core.vllm import API_GUARD_CONTAINER_DIR, API_GUARD_FILENAME
from components.core.weights import STAGING_DIR, SYNC_SCRIPT_PATH, WEIGHTS_MOUNT_PATH, SyncStep

from .ami_contract import (
    DLAMI_NVME_PATH,
    DLAMI_NVME_UNIT,
    INSTANCE_STORE_MODEL,
    INSTANCE_STORE_MODEL_MATCH,
    Role,
    check_script,
)
from .common import HOST_TOOLS_DIR

USER_DATA_LIMIT_BYTES = 16 * 1024


def user_data_bytes(text: str) -> bytes:
    """The raw user data EC2 receives for ``text``: the text itself (UTF-8) when it fits
    ``USER_DATA_LIMIT_BYTES``, else its gzip (level 9, mtime 0, so a plan is reproducible).

    cloud-init reads gzip-compressed user data as the text it holds (cloud-init docs, "User-data
    formats": gzip compressed content is uncompressed and used as if it were not compressed), and EC2's
    16 KB limit applies to the raw bytes before base64, so a pinned commit, a longer command or a
    gated cache never pushes a stack over the limit by a few hundred bytes. Plain text is kept when it
    fits, so what an operator reads in the console stays readable.
    """
    raw = text.encode()
    if len(raw) <= USER_DATA_LIMIT_BYTES:
        return raw
    return gzip.compress(raw, compresslevel=9, mtime=0)
RUN_SECRETS_DIR = "/run/kimi-deploy"
RAID_SCRIPT = f"{HOST_TOOLS_DIR}/nvme-raid0.sh"
WEIGHTS_SCRIPT = f"{HOST_TOOLS_DIR}/weights.sh"
VLLM_SCRIPT = f"{HOST_TOOLS_DIR}/run-vllm.sh"
SECRET_ENV_SCRIPT = f"{HOST_TOOLS_DIR}/secret-env.sh"
AMI_CHECK_SCRIPT = f"{HOST_TOOLS_DIR}/ami-check.sh"
VLLM_ENV_FILE = f"{HOST_TOOLS_DIR}/vllm.env"
HUB_ENV_FILE = f"{RUN_SECRETS_DIR}/hub.env"
API_ENV_FILE = f"{RUN_SECRETS_DIR}/api.env"
# The weights script's current step output and the line naming why the last attempt failed (read
# by the unit's ExecStopPost=, so that `systemctl status` shows the cause after the last attempt).
WEIGHTS_STEP_LOG = f"{RUN_SECRETS_DIR}/weights-step.log"
WEIGHTS_FAILURE_FILE = f"{RUN_SECRETS_DIR}/weights-failure.txt"
UNITS = ("kimi-nvme-raid0.service", "kimi-weights.service", "kimi-vllm.service")
# The expiry power-off and the vLLM watchdog (``watch_units``): one timer, one script (user data
# is limited to 16 KB).
WATCH_SCRIPT = f"{HOST_TOOLS_DIR}/watch.sh"
WATCH_UNITS = ("kimi-watch.timer", "kimi-watch.service")
WATCH_STATE_FILE = f"{RUN_SECRETS_DIR}/watch.state"
# The last expiry read from SSM, kept across reboots (the power-off still comes when SSM does not answer).
WATCH_EXPIRY_FILE = "/var/lib/kimi-deploy/expires-at"
# Watchdog choices (not facts): one /health check a minute, an answer within 10 s, and three
# failed checks in a row before a restart, so a hung engine is restarted about 3 min after it
# stops answering (after the startup budget when it never answered since its start).
WATCH_INTERVAL_SECONDS = 60
WATCH_TIMEOUT_SECONDS = 10
WATCH_FAILURES_BEFORE_RESTART = 3
# The stager's (phase: stage) unit in place of the weights and vLLM units.
STAGE_UNIT = "kimi-stage.service"
# The Deep Learning AMI's own RAID0 of the instance store: ami_contract.DLAMI_NVME_PATH / _UNIT.
VLLM_CONTAINER = "kimi-vllm"
MD_NAME = "kimi-nvme"


@dataclass(frozen=True)
class EngineCacheBoot:
    """The engine's compile caches on an ``aws-ec2`` node (``components/core/engine_cache.py``).

    Attributes:
        tools_uri: ``s3://bucket/_tools/engine_cache.py``.
        tools_sha256: sha256 (hex) of that object's expected text.
        restore_argv, save_argv: ``engine_cache.cache_steps`` runs (inside the vLLM image).
        host_dir: the key's directory on the host's RAID0, mounted read-write into vLLM at
            ``engine_cache.ENGINE_CACHE_CONTAINER_PATH``.
        env: what points vLLM, Inductor/Triton and FlashInfer there (``engine_cache.vllm_cache_env``).
    """

    tools_uri: str
    tools_sha256: str
    restore_argv: Sequence[str]
    save_argv: Sequence[str]
    host_dir: str
    env: Mapping[str, str]


# The API guard module (components/core/vllm.py API_GUARD_*) on the host, mounted read-only into the
# vLLM container where its PYTHONPATH points. Fetched from the mirror's _tools/ (user data is
# limited to 16 KB) when the host's copy does not have the expected sha256.
API_GUARD_HOST_DIR = f"{HOST_TOOLS_DIR}/api-guard"


@dataclass(frozen=True)
class ApiGuardBoot:
    """Where the node gets the API guard: ``uri`` (``s3://bucket/_tools/kimi_vllm_api_guard.py``)
    and the sha256 (hex) its bytes must have."""

    uri: str
    sha256: str


def api_guard_fetch_line(region: str, guard: ApiGuardBoot) -> str:
    """Shell: keep the host's guard when its sha256 matches, else fetch it and verify the copy
    (``set -e`` ends the script on a failed fetch or a wrong sha256: vLLM never starts without it)."""
    path = f"{API_GUARD_HOST_DIR}/{API_GUARD_FILENAME}"
    return (
        f"g={path} s={guard.sha256}\n"
        'echo "$s  $g" | sha256sum -c --quiet - >/dev/null 2>&1 || { mkdir -p "${g%/*}"; '
        f"aws s3 cp --only-show-errors --region {shlex.quote(region)} {shlex.quote(guard.uri)} \"$g.new\"; "
        'echo "$s  $g.new" | sha256sum -c --quiet -; mv -f "$g.new" "$g"; }'
    )


@dataclass(frozen=True)
class Ec2BootConfig:
    """Everything the EC2 boot needs, as plain values.

    Attributes:
        region: AWS region (CLI calls and the sync container's SDK).
        image: the pinned vLLM image.
        vllm_argv: the server role's full argv (``vllm serve ...``) from the core builder.
        vllm_env: its plain environment.
        port: the vLLM port published by the container.
        sync_steps: the weight-sync runs, in order (``spec/weights.py sync_steps``).
        tools_uri: ``s3://bucket/_tools/weight_sync.pyz`` (the weight-sync zipapp).
        tools_sha256: sha256 (hex) of that object's expected bytes.
        api_key_parameter: SSM SecureString name holding the vLLM API key.
        hub_token_parameter: SSM SecureString name of the hub token, or None.
        hub_token_env: env var the sync reads the hub token from (``HF_TOKEN``...).
        nvme_devices: instance-store NVMe devices expected (a warning when fewer are found).
        efa: pass the EFA devices into the vLLM container.
        weights_timeout_seconds: ``TimeoutStartSec`` of one weights attempt: the sum of the sync
            steps' budgets (``sizing.sync_budget_seconds``); None = no timeout (tests only).
        engine_cache: restore the compile caches before vLLM starts and save them after its first
            healthy start (needs the mirror); None: every start compiles cold.
        api_guard: the API guard the server's ``--middleware`` loads (fetched before each start
            when the host's copy differs, mounted read-only); None: not mounted (tests only).
        weights_attempts: ``StartLimitBurst`` of the weights unit (``compute.weightsRetry.attempts``).
        weights_retry_seconds: its ``RestartSec`` (``compute.weightsRetry.delaySeconds``).
        expiry_parameter: the SSM String parameter holding the stack's expiry (RFC 3339 UTC):
            the instance powers itself off then (``watch_units``); None: it does not expire.
        startup_budget_seconds: how long the engine may take to answer ``/health`` after its
            start (``sizing.startup_budget_seconds``) before the watchdog counts failures; None:
            no watchdog (tests only).
    """

    region: str
    image: str
    vllm_argv: Sequence[str]
    vllm_env: Mapping[str, str]
    port: int
    sync_steps: Sequence[SyncStep]
    tools_uri: str
    tools_sha256: str
    api_key_parameter: str
    hub_token_parameter: str | None
    hub_token_env: str
    nvme_devices: int
    efa: bool = False
    extra_docker_args: Sequence[str] = field(default_factory=tuple)
    weights_timeout_seconds: int | None = None
    engine_cache: EngineCacheBoot | None = None
    api_guard: ApiGuardBoot | None = None
    weights_attempts: int = 3
    weights_retry_seconds: int = 120
    expiry_parameter: str | None = None
    startup_budget_seconds: int | None = None


def _q(args: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def raid0_script(nvme_devices: int) -> str:
    """Shell script: the instance-store NVMe as one RAID0 mounted at ``NVME_RAID0_HOST_PATH``.

    On the Deep Learning AMI ``dlami-nvme.service`` has already striped and mounted every
    instance-store disk at ``DLAMI_NVME_PATH`` (the disks are busy: mdadm would fail), so that
    mount is bind-mounted at the host path. Elsewhere: RAID0 over every instance-store NVMe
    device (never the EBS root; ``ami_contract.INSTANCE_STORE_MODEL``), XFS; re-assembled after a
    reboot, recreated after a stop/start (instance store comes back empty). The unit runs it at
    every boot, after ``ami-check.sh`` found mdadm, mkfs.xfs and blkid (``ami_contract``)."""
    return f"""#!/bin/bash
# The instance-store NVMe as one RAID0, mounted at {NVME_RAID0_HOST_PATH}.
# Idempotent: mounted -> nothing; DLAMI array mounted -> bind mount it; array present -> mount;
# devices blank -> create, format, mount.
set -euo pipefail
MOUNT={shlex.quote(NVME_RAID0_HOST_PATH)}
DLAMI_NVME={shlex.quote(DLAMI_NVME_PATH)}
EXPECTED={nvme_devices}
if mountpoint -q "$MOUNT"; then
  echo "kimi-nvme: $MOUNT already mounted"
  exit 0
fi
if mountpoint -q "$DLAMI_NVME"; then
  # Deep Learning AMI: {DLAMI_NVME_UNIT} owns the instance-store disks and their RAID0.
  mkdir -p "$MOUNT"
  mount --bind "$DLAMI_NVME" "$MOUNT"
  echo "kimi-nvme: $DLAMI_NVME (DLAMI RAID0) bind-mounted at $MOUNT"
  exit 0
fi
DEVICES=()
for sys in /sys/block/nvme*n*; do
  [ -e "$sys/device/model" ] || continue
  # Instance store reports "{INSTANCE_STORE_MODEL}"; EBS (the root) does not.
  case "$(cat "$sys/device/model")" in
    *"{INSTANCE_STORE_MODEL_MATCH}"*) DEVICES+=("/dev/${{sys##*/}}") ;;
  esac
done
if [ "${{#DEVICES[@]}}" -eq 0 ]; then
  echo "kimi-nvme: no instance-store NVMe device found" >&2
  exit 1
fi
if [ "${{#DEVICES[@]}}" -lt "$EXPECTED" ]; then
  echo "kimi-nvme: warning: found ${{#DEVICES[@]}} of $EXPECTED instance-store devices" >&2
fi
MD=$(mdadm --detail --scan 2>/dev/null | awk '/name=[^ ]*{MD_NAME}/ {{print $2; exit}}')
if [ -z "$MD" ]; then
  MD=/dev/md/{MD_NAME}
  if ! mdadm --assemble "$MD" "${{DEVICES[@]}}" 2>/dev/null; then
    mdadm --create "$MD" --name={MD_NAME} --level=0 --chunk=512 --raid-devices="${{#DEVICES[@]}}" --force --run "${{DEVICES[@]}}"
  fi
fi
# udev makes the array's /dev/md/ link after mdadm returns: wait (up to 60 s) until it is a block device.
for _ in {{1..60}}; do [ -b "$MD" ] && break; sleep 1; done
if [ "$(blkid -o value -s TYPE "$MD" || true)" != "xfs" ]; then
  mkfs.xfs -f -K "$MD"
fi
mkdir -p "$MOUNT"
mount -o noatime "$MD" "$MOUNT"
echo "kimi-nvme: $MD mounted at $MOUNT"
"""


def secret_env_script() -> str:
    """Shell script: ``secret-env.sh OUT REGION VAR=PARAMETER...`` writes ``VAR=<value>`` lines
    read from SSM SecureString parameters into OUT (mode 0600), atomically."""
    return """#!/bin/bash
# Usage: secret-env.sh OUT_FILE REGION VAR=SSM_PARAMETER...
set -euo pipefail
out=$1
region=$2
shift 2
umask 077
mkdir -p "$(dirname "$out")"
tmp=$(mktemp "$out.XXXXXX")
trap 'rm -f "$tmp"' EXIT
for pair in "$@"; do
  var=${pair%%=*}
  param=${pair#*=}
  value=$(aws ssm get-parameter --region "$region" --name "$param" --with-decryption --query Parameter.Value --output text)
  printf '%s=%s\\n' "$var" "$value" >>"$tmp"
done
mv "$tmp" "$out"
trap - EXIT
"""


def sync_docker_command(cfg: Ec2BootConfig, step: SyncStep) -> list[str]:
    """``docker run`` of one sync step: the step's exact argv inside the pinned image, with
    the RAID0 at ``/models`` and the weight-sync program at ``SYNC_SCRIPT_PATH``. Host
    networking so the instance role (IMDSv2, hop limit 1) reaches the container."""
    cmd = [
        "docker", "run", "--rm", "--network", "host", "--name", f"kimi-weight-sync-{step.name}",
        "-e", f"AWS_REGION={cfg.region}", "-e", f"AWS_DEFAULT_REGION={cfg.region}",
        "-v", f"{SYNC_SCRIPT_PATH}:{SYNC_SCRIPT_PATH}:ro",
        "-v", f"{NVME_RAID0_HOST_PATH}:{WEIGHTS_MOUNT_PATH}",
    ]
    if step.needs_hub_token and cfg.hub_token_parameter:
        cmd += ["--env-file", HUB_ENV_FILE]
    cmd += ["--entrypoint", step.argv[0], cfg.image, *step.argv[1:]]
    return cmd


def vllm_docker_command(cfg: Ec2BootConfig) -> list[str]:
    """``docker run`` of the vLLM server: the core builder's argv and env, all GPUs, host IPC
    (NCCL shared memory), the API port published, weights read-only."""
    cmd = [
        "docker", "run", "--rm", "--name", VLLM_CONTAINER,
        "--gpus", "all", "--ipc", "host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
        "-p", f"{cfg.port}:{cfg.port}",
        "--env-file", VLLM_ENV_FILE, "--env-file", API_ENV_FILE,
        "-v", f"{NVME_RAID0_HOST_PATH}:{WEIGHTS_MOUNT_PATH}:ro",
    ]
    if cfg.efa:
        cmd += ["--device", "/dev/infiniband"]
    if cfg.engine_cache is not None:
        from components.core.engine_cache import ENGINE_CACHE_CONTAINER_PATH

        # The only writable path vLLM gets: its compile caches (restored before, saved after); the
        # gate the API guard waits for (engine_cache_units), read-only.
        cmd += ["-v", f"{cfg.engine_cache.host_dir}:{ENGINE_CACHE_CONTAINER_PATH}", "-v", f"{GATE_DIR}:{GATE_DIR}:ro"]
    if cfg.api_guard is not None:
        cmd += ["-v", f"{API_GUARD_HOST_DIR}:{API_GUARD_CONTAINER_DIR}:ro"]
    cmd += list(cfg.extra_docker_args)
    cmd += ["--entrypoint", cfg.vllm_argv[0], cfg.image, *cfg.vllm_argv[1:]]
    return cmd


def local_check_step(cfg: Ec2BootConfig) -> SyncStep | None:
    """The node-copy step with ``--check-local`` added: proves the local copy complete from the
    node's own disk (no request to the hub, the mirror or the registry), or None without a
    node-copy step."""
    step = next((s for s in cfg.sync_steps if s.name == "node-copy"), None)
    if step is None:
        return None
    return SyncStep("check-local", step.source, step.dest, step.per_node, False, step.needs_fsx,
                    (*step.argv, "--check-local"))


def weights_script(cfg: Ec2BootConfig) -> str:
    """Shell script: the weights on the RAID0, then exit 0 (the unit then starts vLLM).

    Order: the RAID0 must be mounted (else one line pointing at the RAID unit); the tools are
    fetched from the mirror only when the copy on disk lacks the pinned sha256, the image pulled
    only when it is not cached; a complete local copy unchanged since verified
    (``local_check_step``) ends the script there, so a reboot needs neither the hub, nor the
    mirror, nor the registry; else the hub token is fetched and the sync steps run in order (a
    complete mirror or copy is a fast no-op). A failure names the step in its last line."""
    region = shlex.quote(cfg.region)
    lines = [
        "#!/bin/bash",
        "# hub -> S3 mirror (publish-mirror) -> NVMe (node-copy); a complete local copy asks nothing outside.",
        "set -Eeuo pipefail",
        f"install -d -m 0700 {RUN_SECRETS_DIR}",
        f"rm -f {WEIGHTS_FAILURE_FILE}",
        "# st: the unit's Status: line; at STEP: what a failure names; out CMD: run it, keeping its last line",
        'st() { systemd-notify --pid=$$ --status="$1" 2>/dev/null || true; }',
        f'at() {{ step=$1; : >{WEIGHTS_STEP_LOG}; st "kimi-weights: $1"; }}',
        f'out() {{ "$@" 2>&1 | tee {WEIGHTS_STEP_LOG}; }}',
        f'fail() {{ local m; m="kimi-weights: failed at: $step (exit $1): $(tail -n 1 {WEIGHTS_STEP_LOG})"; '
        f'echo "$m" | tee {WEIGHTS_FAILURE_FILE} >&2; st "$m"; }}',
        "trap 'fail $?' ERR",
        "at setup",
        f'mountpoint -q {NVME_RAID0_HOST_PATH} || {{ echo "{NVME_RAID0_HOST_PATH} is not mounted: '
        f'systemctl status {UNITS[0]}" | tee {WEIGHTS_STEP_LOG} >&2; false; }}',
        "# tool URI SHA256 PATH: fetched unless the file on disk has that digest",
        "tool() {",
        '  echo "$2  $3" | sha256sum -c --quiet - >/dev/null 2>&1 && return 0',
        f'  out aws s3 cp --only-show-errors --region {region} "$1" "$3.new"',
        '  echo "$2  $3.new" | sha256sum -c --quiet -',
        '  mv -f "$3.new" "$3"',
        "}",
        "at 'weight-sync program'",
        _q(["tool", cfg.tools_uri, cfg.tools_sha256, SYNC_SCRIPT_PATH]),
    ]
    if cfg.engine_cache is not None:
        from components.core.engine_cache import ENGINE_CACHE_SCRIPT_PATH

        ec = cfg.engine_cache
        lines += [
            "at 'engine-cache program'",
            _q(["tool", ec.tools_uri, ec.tools_sha256, ENGINE_CACHE_SCRIPT_PATH]),
            f"mkdir -p {shlex.quote(ec.host_dir)}",
        ]
    image = shlex.quote(cfg.image)
    lines += [
        "at image",
        f"docker image inspect {image} >/dev/null 2>&1 || out docker pull --quiet {image}",
    ]
    check = local_check_step(cfg)
    if check is not None:
        lines += [
            "at 'local copy check'",
            f"if {_q(sync_docker_command(cfg, check))}; then",
            "  echo " + shlex.quote(f"kimi-weights: {check.dest} is complete and unchanged since verified: nothing fetched"),
            "  st " + shlex.quote(f"kimi-weights: {check.dest} verified (local copy)"),
            "  exit 0",
            "fi",
        ]
    if cfg.hub_token_parameter:
        lines += ["at 'hub token'",
                  "out " + _q([SECRET_ENV_SCRIPT, HUB_ENV_FILE, cfg.region, f"{cfg.hub_token_env}={cfg.hub_token_parameter}"])]
    # The publish step's --staging-dir (weights.STAGING_DIR) as seen from the host.
    lines.append(f"mkdir -p {NVME_RAID0_HOST_PATH}/{PurePosixPath(STAGING_DIR).relative_to(WEIGHTS_MOUNT_PATH)}")
    for step in cfg.sync_steps:
        # Every message is quoted as a whole: a source or path never becomes shell syntax on the node.
        lines.append("at " + shlex.quote(step.name))
        lines.append("echo " + shlex.quote(f"kimi-weights: {step.name}: {step.source} -> {step.dest}"))
        lines.append("out " + _q(sync_docker_command(cfg, step)))
    if cfg.sync_steps:
        lines.append("st " + shlex.quote(f"kimi-weights: {cfg.sync_steps[-1].dest} verified"))
    return "\n".join(lines) + "\n"


def vllm_script(cfg: Ec2BootConfig) -> str:
    """Shell script run by ``kimi-vllm.service``: fetch the API key, then exec the container."""
    return "\n".join(
        [
            "#!/bin/bash",
            "# The vLLM server (argv and env from the core builder); the API key comes from SSM.",
            "set -euo pipefail",
            _q([SECRET_ENV_SCRIPT, API_ENV_FILE, cfg.region, f"VLLM_API_KEY={cfg.api_key_parameter}"]),
            *([api_guard_fetch_line(cfg.region, cfg.api_guard)] if cfg.api_guard is not None else []),
            "exec " + _q(vllm_docker_command(cfg)),
        ]
    ) + "\n"


def env_file(env: Mapping[str, str]) -> str:
    """A docker ``--env-file``: ``KEY=value`` lines, sorted (values are taken literally)."""
    for key, value in env.items():
        if "\n" in value or "\n" in key:
            raise ValueError(f"env {key!r} has a newline; docker env files cannot hold it")
    return "".join(f"{k}={env[k]}\n" for k in sorted(env))


def _start_limit_interval(cfg: Ec2BootConfig) -> str:
    # The window must span every attempt, or systemd forgets the early failures and retries forever.
    if cfg.weights_timeout_seconds is None:
        return "infinity"
    return str(cfg.weights_attempts * (cfg.weights_timeout_seconds + cfg.weights_retry_seconds) + 3600)


# The docs section that says how to read a failed boot and retry it.
README_BOOT_FAILURE = "docs/operations.md: When the EC2 boot fails"


def attempt_failed_line(cfg: Ec2BootConfig, unit: str = UNITS[1]) -> str:
    """What the weights unit (or the stager's ``unit``) logs after every failed attempt
    (``ExecStopPost=``, so it is the last line ``systemctl status`` shows): the retry policy and how
    to retry after the last attempt."""
    return (f"kimi-weights: attempt failed ($SERVICE_RESULT): $(cat {WEIGHTS_FAILURE_FILE} 2>/dev/null || echo killed). "
            f"{cfg.weights_attempts} attempts, {cfg.weights_retry_seconds} s apart, then failed until: systemctl reset-failed "
            f"{unit} && systemctl start {unit} ({README_BOOT_FAILURE})")


def raid_unit(role: Role) -> str:
    """``kimi-nvme-raid0.service`` of ``role``: that role's AMI contract (``ami_contract.check_script``,
    written by the same user data at ``AMI_CHECK_SCRIPT``) checked first, then the RAID0. The stager's
    contract installs packages with dnf, so its unit also waits for the network."""
    before, after, wants = "kimi-weights.service", f"local-fs.target {DLAMI_NVME_UNIT}", ""
    comment = "# On the Deep Learning AMI, after its own RAID0 is mounted (no such unit elsewhere: no-op)."
    if role == "stage":
        before, after, wants = STAGE_UNIT, "local-fs.target network-online.target", "Wants=network-online.target\n"
        comment = "# The stager's contract installs what its AMI lacks (dnf) first: after the network."
    return f"""[Unit]
Description=kimi-deploy: RAID0 of the instance-store NVMe at {NVME_RAID0_HOST_PATH}
{comment}
{wants}After={after}
Before={before}

[Service]
Type=oneshot
RemainAfterExit=yes
# What the {role} boot needs from the AMI (components/aws/ami_contract.py): one line naming what is missing.
ExecStartPre={AMI_CHECK_SCRIPT}
ExecStart={RAID_SCRIPT}

[Install]
WantedBy=multi-user.target
"""


def systemd_units(cfg: Ec2BootConfig) -> dict[str, str]:
    """The units by file name: RAID0, weights, vLLM, plus the engine-cache restore and save when
    ``cfg.engine_cache`` is set (see the module docstring for how they chain)."""
    raid = raid_unit("serve")
    timeout = "infinity" if cfg.weights_timeout_seconds is None else str(cfg.weights_timeout_seconds)
    # $$: systemd passes a literal $ to the shell, which reads SERVICE_RESULT from the environment.
    failed = attempt_failed_line(cfg).replace("$", "$$")
    weights = f"""[Unit]
Description=kimi-deploy: weight sync (hub -> S3 mirror -> local NVMe), then start vLLM
# No default dependencies: multi-user.target must not wait for the sync. The RAID unit only
# wanted: if it fails, this unit fails with that cause (Requires= leaves it inactive).
DefaultDependencies=no
Requires=docker.service sysinit.target
Wants=kimi-nvme-raid0.service network-online.target
After=sysinit.target basic.target docker.service kimi-nvme-raid0.service network-online.target
Conflicts=shutdown.target
Before=shutdown.target
StartLimitIntervalSec={_start_limit_interval(cfg)}
StartLimitBurst={cfg.weights_attempts}

[Service]
Type=oneshot
RemainAfterExit=yes
# The script's systemd-notify --status: the step now, or why the last attempt failed.
NotifyAccess=all
ExecStart={WEIGHTS_SCRIPT}
# Only after a successful sync, on whichever attempt: queue vLLM's start (--no-block: vLLM is
# ordered after this unit, which is still activating here).
ExecStartPost=/usr/bin/systemctl start --no-block {UNITS[2]}
# One attempt may take the sync budget (sizing.sync_budget_seconds); a stalled one is killed.
TimeoutStartSec={timeout}
Restart=on-failure
RestartSec={cfg.weights_retry_seconds}
ExecStopPost=/bin/sh -c '[ "$$SERVICE_RESULT" = success ] || echo "{failed}" >&2'

[Install]
WantedBy=multi-user.target
"""
    # With engine caches: the restore runs first and the save follows the start; Wants=, so a
    # failed restore or save means a cold start or no saved cache, never no server.
    cache = ""
    if cfg.engine_cache is not None:
        cache = f"Wants={' '.join(ENGINE_CACHE_UNITS)}\nAfter={ENGINE_CACHE_UNITS[0]}\n"
    vllm = f"""[Unit]
Description=kimi-deploy: vLLM OpenAI server on port {cfg.port}
# Started by {UNITS[1]} when the weights are complete; ordered after it, never Requires= it
# (a failed attempt there must not fail this start for good).
Requires=docker.service
After=docker.service {UNITS[1]}
{cache}StartLimitIntervalSec=0

[Service]
Type=simple
ExecStartPre=-/usr/bin/docker rm -f {VLLM_CONTAINER}
ExecStart={VLLM_SCRIPT}
ExecStop=/usr/bin/docker stop --time 60 {VLLM_CONTAINER}
Restart=on-failure
RestartSec=30
TimeoutStopSec=90
"""
    units = dict(zip(UNITS, (raid, weights, vllm), strict=False))
    if cfg.engine_cache is not None:
        units.update(engine_cache_units(cfg, cfg.engine_cache.restore_argv, cfg.engine_cache.save_argv))
    return units


def watch_script() -> str:
    """The check ``kimi-watch.service`` runs (bash), once per run of its timer.

    Usage: ``watch.sh PARAMETER REGION URL STARTUP_BUDGET_S FAILURES TIMEOUT_S UNIT``.

    1. Expiry: the stack's expiry is read from the SSM parameter ``PARAMETER`` (``-``: the stack
       does not expire) and kept in ``WATCH_EXPIRY_FILE`` (the last value read is used while SSM
       does not answer); at or past it the instance powers off (an OS shutdown stops an EC2
       instance: the launch template keeps the default ``instanceInitiatedShutdownBehavior``
       ``stop``). The expiry is read, not written into the user data, so extending a trial
       (``expiresAt``: the parameter changes in place) makes no new launch-template version,
       which would replace the instance and wipe its NVMe copy of the weights.
    2. Watchdog: when ``UNIT`` is active, GET ``URL``; a failure (an error status, or no answer
       within ``TIMEOUT_S``) counts once the engine has answered since the unit's start, or once
       ``STARTUP_BUDGET_S`` have passed since it; ``FAILURES`` in a row restart the unit. The count
       is kept per start (the unit's ``InvocationID``) in ``WATCH_STATE_FILE``.

    ``KIMI_SYSTEMCTL``, ``KIMI_WATCH_STATE`` and ``KIMI_WATCH_EXPIRY`` replace systemctl and the
    two files (tests)."""
    return f"""#!/bin/bash
# kimi-deploy: power off at expiry; restart a vLLM whose process is up but whose /health fails.
set -u
param=$1 region=$2 url=$3 budget=$4 limit=$5 timeout=$6 unit=$7
ctl=${{KIMI_SYSTEMCTL:-systemctl}} st=${{KIMI_WATCH_STATE:-{WATCH_STATE_FILE}}}
ex=${{KIMI_WATCH_EXPIRY:-{WATCH_EXPIRY_FILE}}}
mkdir -p "$(dirname "$st")" "$(dirname "$ex")"
if [ "$param" != - ]; then
  v=$(aws ssm get-parameter --region "$region" --name "$param" --query Parameter.Value --output text) &&
    [ -n "$v" ] && echo "$v" >"$ex"
  if [ -s "$ex" ] && t=$(date -d "$(cat "$ex")" +%s) && [ "$(date +%s)" -ge "$t" ]; then
    echo "kimi-watch: the stack expired at $(cat "$ex"): powering off"; exec $ctl poweroff
  fi
fi
[ "$($ctl is-active "$unit")" = active ] || {{ rm -f "$st"; exit 0; }}
run=$($ctl show -p InvocationID --value "$unit")
since=$(date -d "$($ctl show -p ActiveEnterTimestamp --value "$unit")" +%s) || since=0
last=- ok=0 n=0
read -r last ok n 2>/dev/null <"$st"
[ "$last" = "$run" ] || {{ ok=0; n=0; }}
if curl -fso /dev/null -m "$timeout" "$url"; then echo "$run 1 0" >"$st"; exit 0; fi
[ "$ok" = 1 ] || [ $(($(date +%s) - since)) -ge "$budget" ] || exit 0
n=$((1 + n)); echo "$run $ok $n" >"$st"
echo "kimi-watch: $url failed $n of $limit checks in a row"
[ "$n" -ge "$limit" ] || exit 0
rm -f "$st"; echo "kimi-watch: restarting $unit (process up, /health failing)"
exec $ctl restart --no-block "$unit"
"""


def watch_units(cfg: Ec2BootConfig) -> dict[str, str]:
    """``kimi-watch.timer`` and its one-shot service running ``watch_script``: a minute after boot
    and every ``WATCH_INTERVAL_SECONDS`` after (so the power-off comes at most about a minute after
    the expiry), with ``cfg.expiry_parameter`` and ``http://127.0.0.1:<port>/health`` (open without
    the API key: ``scripts/node/kimi_vllm_api_guard.py`` ``OPEN_PATHS``) and
    ``cfg.startup_budget_seconds`` (0 when None: tests only)."""
    args = [cfg.expiry_parameter or "-", cfg.region or "-", f"http://127.0.0.1:{cfg.port}/health",
            str(cfg.startup_budget_seconds or 0), str(WATCH_FAILURES_BEFORE_RESTART), str(WATCH_TIMEOUT_SECONDS), UNITS[2]]
    timer = f"""[Timer]
OnBootSec=60
OnUnitActiveSec={WATCH_INTERVAL_SECONDS}
AccuracySec=1
[Install]
WantedBy=timers.target
"""
    service = f"""[Unit]
Description=kimi-deploy: power off at expiry, restart a hung vLLM
[Service]
Type=oneshot
ExecStart={WATCH_SCRIPT} {_q(args)}
"""
    return dict(zip(WATCH_UNITS, (timer, service), strict=True))


class _BlockDumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def ec2_cloud_config(cfg: Ec2BootConfig) -> str:
    """The complete ``#cloud-config`` user data.

    Raises:
        ValueError: the result exceeds EC2's 16 KB user-data limit (``program.build_context``
            checks the same rendering with ``compute.check_ec2_user_data`` before any resource is
            declared, so a stack never gets here with too much user data).
    """
    text = cloud_config_text(cfg)
    size = len(user_data_bytes(text))
    if size > USER_DATA_LIMIT_BYTES:
        raise ValueError(f"EC2 user data is {size} bytes (gzip); the limit is {USER_DATA_LIMIT_BYTES}")
    return text


def without_comments(text: str) -> str:
    """``text`` (a shell script or a systemd unit) without its comment lines (a line whose first
    non-blank character is ``#``; a ``#!`` first line is kept). The comments stay in this
    module's source, where they document the boot; the instance gets only what runs, so the user
    data keeps room under EC2's 16 KB for the config values it carries (``vllm.extraArgs``). None
    of the scripts has a here-document or a multi-line string a ``#`` line could belong to."""
    lines = text.splitlines(keepends=True)
    return "".join(
        line for i, line in enumerate(lines) if not line.lstrip().startswith("#") or (i == 0 and line.startswith("#!"))
    )


def cloud_config_text(cfg: Ec2BootConfig) -> str:
    """The ``#cloud-config`` text of ``cfg`` without the size check (UTF-8 bytes = raw size).
    Comment lines are left out of every file (``without_comments``)."""
    files = [
        (AMI_CHECK_SCRIPT, check_script("serve", cfg.efa), "0755"),
        (RAID_SCRIPT, raid0_script(cfg.nvme_devices), "0755"),
        (SECRET_ENV_SCRIPT, secret_env_script(), "0755"),
        (WEIGHTS_SCRIPT, weights_script(cfg), "0755"),
        (VLLM_SCRIPT, vllm_script(cfg), "0755"),
        (VLLM_ENV_FILE, env_file({**cfg.vllm_env, **engine_cache_env(cfg)}), "0644"),
        (WATCH_SCRIPT, watch_script(), "0755"),
    ] + [(f"/etc/systemd/system/{unit}", text, "0644") for unit, text in {**systemd_units(cfg), **watch_units(cfg)}.items()]
    doc = {
        # No owner: cloud-init writes root:root by default (cloudinit/distros/__init__.py default_owner).
        "write_files": [{"path": p, "permissions": m, "content": without_comments(c)} for p, c, m in files],
        "runcmd": [
            ["systemctl", "daemon-reload"],
            # vLLM is not enabled: the weights unit starts it at every boot once the copy is complete.
            ["systemctl", "enable", *UNITS[:2]],
            # --no-block: the first weight sync takes hours; cloud-init must not wait for it.
            ["systemctl", "start", "--no-block", UNITS[1]],
            # The expiry power-off and the watchdog, at every boot from now on.
            ["systemctl", "enable", "--now", WATCH_UNITS[0]],
        ],
    }
    return "#cloud-config\n" + yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False, width=1_000_000)


# -- stage (phase: stage) --------------------------------------------------------------------

def stage_unit(cfg: Ec2BootConfig) -> str:
    """``kimi-stage.service``: the publish (the weights script with only the ``publish-mirror``
    step), then power off. The stager instance is launched with shutdown behaviour ``terminate``,
    so a complete mirror ends its billing.

    Every attempt starts the RAID unit and docker itself (``ExecStartPre=-systemctl start``): a RAID
    unit that failed (its contract's dnf install, the array) runs again on the next attempt, and
    the weights script checks the mount and names that unit. No ``Requires=`` on the RAID unit: on
    systemd 252 (AL2023) a start that ``Requires=`` a failing one-shot fails with "dependency" and
    is never retried (systemd.unit(5), Requires=), which left the stager idle until the trial expired.
    A failed attempt is retried like the weights unit's (``compute.weightsRetry``); after the last
    one the instance stays up for ``journalctl -u kimi-stage`` (the trial's expiry and the sweeper
    still end it). ``DefaultDependencies=no``: ``multi-user.target`` does not wait for the publish."""
    timeout = "infinity" if cfg.weights_timeout_seconds is None else str(cfg.weights_timeout_seconds)
    failed = attempt_failed_line(cfg, STAGE_UNIT).replace("$", "$$")
    return f"""[Unit]
Description=kimi-deploy: stage the weights (hub -> S3 mirror, verified), then power off (terminates)
# Wanted, never Requires= (see ExecStartPre=): a failed RAID unit must not fail this start for good.
DefaultDependencies=no
Requires=sysinit.target
Wants={UNITS[0]} network-online.target
After=sysinit.target basic.target network-online.target {UNITS[0]} docker.service
Conflicts=shutdown.target
Before=shutdown.target
StartLimitIntervalSec={_start_limit_interval(cfg)}
StartLimitBurst={cfg.weights_attempts}

[Service]
Type=oneshot
# The script's systemd-notify --status: the step now, or why the last attempt failed.
NotifyAccess=all
# At every attempt: the array (again, after a failure) and docker (installed by the RAID unit's
# contract step on the standard AMI, which does not start it); weights.sh names what is missing.
ExecStartPre=-/usr/bin/systemctl start {UNITS[0]}
ExecStartPre=-/usr/bin/systemctl start docker.service
ExecStart={WEIGHTS_SCRIPT}
# The mirror is complete (manifest and marker written): nothing left for this instance to do.
ExecStartPost=/usr/bin/systemctl poweroff
TimeoutStartSec={timeout}
Restart=on-failure
RestartSec={cfg.weights_retry_seconds}
ExecStopPost=/bin/sh -c '[ "$$SERVICE_RESULT" = success ] || echo "{failed}" >&2'

[Install]
WantedBy=multi-user.target
"""


def stage_cloud_config_text(cfg: Ec2BootConfig) -> str:
    """The ``#cloud-config`` of the stager (a CPU instance on the standard Amazon Linux 2023 AMI):
    the stager's AMI contract (``ami_contract.check_script("stage")``: docker and mdadm installed with
    dnf where missing, then every item checked), the instance store as the staging RAID0, the hub
    token from SSM, and ``kimi-stage.service`` running ``cfg.sync_steps`` (the publish) in
    ``cfg.image``, then powering off.

    Raises:
        ValueError: a step other than ``publish-mirror`` (a stage copies to no node), or over
            EC2's 16 KB user-data limit.
    """
    if any(step.name != "publish-mirror" for step in cfg.sync_steps):
        raise ValueError(f"a stage runs only the publish-mirror step, not {[s.name for s in cfg.sync_steps]}")
    files = [
        (AMI_CHECK_SCRIPT, check_script("stage"), "0755"),
        (RAID_SCRIPT, raid0_script(cfg.nvme_devices), "0755"),
        (SECRET_ENV_SCRIPT, secret_env_script(), "0755"),
        (WEIGHTS_SCRIPT, weights_script(cfg), "0755"),
        (f"/etc/systemd/system/{UNITS[0]}", raid_unit("stage"), "0644"),
        (f"/etc/systemd/system/{STAGE_UNIT}", stage_unit(cfg), "0644"),
    ]
    doc = {
        "write_files": [{"path": p, "owner": "root:root", "permissions": m, "content": c} for p, c, m in files],
        "runcmd": [
            ["systemctl", "daemon-reload"],
            # The stage unit pulls in the RAID unit (and starts docker) at every attempt.
            ["systemctl", "enable", STAGE_UNIT],
            # --no-block: the publish takes hours; cloud-init must not wait for it.
            ["systemctl", "start", "--no-block", STAGE_UNIT],
        ],
    }
    text = "#cloud-config\n" + yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False, width=1_000_000)
    if len(text.encode()) > USER_DATA_LIMIT_BYTES:
        raise ValueError(f"stage user data is {len(text.encode())} bytes; the limit is {USER_DATA_LIMIT_BYTES}")
    return text


# -- EKS ------------------------------------------------------------------------------------

MIME_BOUNDARY = "==KIMI-DEPLOY-BOUNDARY=="


@dataclass(frozen=True)
class ClusterDetails:
    """What nodeadm needs when the AMI is not an EKS-managed one (``compute.amiId``)."""

    name: str
    endpoint: str
    certificate_authority: str
    service_cidr: str


def node_config(cluster: ClusterDetails | None = None) -> dict:
    """The nodeadm ``NodeConfig``: instance-store NVMe as RAID0 (mounted under /mnt/k8s-disks)."""
    spec: dict = {"instance": {"localStorage": {"strategy": "RAID0"}}}
    if cluster is not None:
        spec["cluster"] = {
            "name": cluster.name,
            "apiServerEndpoint": cluster.endpoint,
            "certificateAuthority": cluster.certificate_authority,
            "cidr": cluster.service_cidr,
        }
    return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}


def eks_node_user_data(cluster: ClusterDetails | None = None) -> str:
    """MIME multi-part user data with the ``NodeConfig`` part (``application/node.eks.aws``)."""
    body = yaml.safe_dump(node_config(cluster), sort_keys=False)
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{MIME_BOUNDARY}"\n\n'
        f"--{MIME_BOUNDARY}\n"
        "Content-Type: application/node.eks.aws\n\n"
        "---\n"
        f"{body}\n"
        f"--{MIME_BOUNDARY}--\n"
    )


# -- engine caches (components/core/engine_cache.py) -----------------------------------------

ENGINE_CACHE_UNITS = ("kimi-engine-cache-restore.service", "kimi-engine-cache-save.service")
# The gate (engine_cache.GATE_DIR/GATE_FILE): on the host's /run (tmpfs, empty after a reboot),
# created by the save right after its snapshot; the vLLM container's API guard answers 503 on every
# route but /health and /metrics until it exists (engine_cache.GATE_ENV).
ENGINE_CACHE_GATE_DIR = GATE_DIR
ENGINE_CACHE_GATE_FILE = GATE_FILE


def engine_cache_env(cfg: Ec2BootConfig) -> dict[str, str]:
    """What the vLLM container's env file gains with engine caches: ``cfg.engine_cache.env`` and
    the gate its API guard waits for (``engine_cache.GATE_ENV``); empty without."""
    if cfg.engine_cache is None:
        return {}
    return {**cfg.engine_cache.env, GATE_ENV: ENGINE_CACHE_GATE_FILE}


def engine_cache_docker_command(cfg: Ec2BootConfig, argv: Sequence[str], name: str) -> list[str]:
    """``docker run`` of one ``scripts/node/engine_cache.py`` step in the pinned image: the NVMe at
    ``/models`` read-write (the cache directory lives there), the program mounted read-only,
    host networking (instance role; the save polls vLLM's health on 127.0.0.1). The save also
    gets the gate directory read-write and ``--gate``: it opens the API right after its snapshot."""
    from components.core.engine_cache import ENGINE_CACHE_SCRIPT_PATH

    save = name == "engine-cache-save"
    return [
        "docker", "run", "--rm", "--network", "host", "--name", f"kimi-{name}",
        "-e", f"AWS_REGION={cfg.region}", "-e", f"AWS_DEFAULT_REGION={cfg.region}",
        "-v", f"{ENGINE_CACHE_SCRIPT_PATH}:{ENGINE_CACHE_SCRIPT_PATH}:ro",
        "-v", f"{NVME_RAID0_HOST_PATH}:{WEIGHTS_MOUNT_PATH}",
        *(["-v", f"{ENGINE_CACHE_GATE_DIR}:{ENGINE_CACHE_GATE_DIR}"] if save else []),
        "--entrypoint", argv[0], cfg.image, *argv[1:],
        *(["--gate", ENGINE_CACHE_GATE_FILE] if save else []),
    ]


def engine_cache_units(cfg: Ec2BootConfig, restore_argv: Sequence[str], save_argv: Sequence[str]) -> dict[str, str]:
    """The restore and save units, by file name.

    restore: one-shot after ``kimi-weights.service`` (the image is pulled there), before
    ``kimi-vllm.service``; ``Wants=`` rather than ``Requires=`` on the vLLM side, so a failed
    restore means a cold start, never no start. save: one-shot after vLLM started; the program
    waits for the health URL in its argv (open through the API guard), snapshots the cache
    directory, opens the gate (``ENGINE_CACHE_GATE_FILE``: until then the guard answers 503 to
    every request, so no request reaches the engine before the snapshot), then archives once
    (never overwrites). A save that fails or is killed opens the gate too (``ExecStopPost=``):
    nothing is archived after that, and the server is never kept closed by the cache.
    Neither is enabled: ``kimi-vllm.service`` pulls both in (``Wants=``, after the restore), so
    they run exactly when vLLM is started by the weights unit (``systemd_units``).
    """
    restore = f"""[Unit]
Description=kimi-deploy: restore the engine's compile caches from the mirror (cold start if absent)
Requires=docker.service
After=docker.service kimi-weights.service
Before=kimi-vllm.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={_q(engine_cache_docker_command(cfg, restore_argv, "engine-cache-restore"))}
TimeoutStartSec=1800
"""
    save = f"""[Unit]
Description=kimi-deploy: save the engine's compile caches to the mirror after the first healthy start
Requires=docker.service
After=docker.service kimi-vllm.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={_q(engine_cache_docker_command(cfg, save_argv, "engine-cache-save"))}
# Runs after a failed or killed save too (a success opened the gate itself). The directory exists:
# docker run -v created it for vLLM, which starts before this unit.
ExecStopPost=/usr/bin/touch {ENGINE_CACHE_GATE_FILE}
# engine_cache.py waits up to 4 h (--wait-seconds) for vLLM's health, then archives: 1 h for that.
TimeoutStartSec=18000
"""
    return dict(zip(ENGINE_CACHE_UNITS, (restore, save), strict=False))

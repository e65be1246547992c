"""The inputs of the time-to-ready model (``time_to_ready.py``): every figure with its source (a
public figure, a measured value from ``kimi-deploy:timeToReady``, or the word ``estimate``), and
the rates they give for one node (the hub download, a copy from the S3 mirror, the Run:ai stream, the image pull,
the engine start).

Below ``sizing`` and ``time_to_ready`` in the domain layer: ``sizing`` reads the engine start and
the mirror copy rate from here, ``time_to_ready`` reads ``sizing``; neither imports the other back.
The sync's parallelism is ``weights.SYNC_WORKERS`` files x ``naming.S3_PART_CONCURRENCY`` ranged
parts (the sync's own constants; the core never imports scripts/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .config.spec import DeploymentSpec
from .naming import S3_PART_CONCURRENCY
from .targets import GB, STAGING_INSTANCE
from .weights import SYNC_WORKERS

ESTIMATE = "estimate"


@dataclass(frozen=True)
class Fact:
    """One input of the model with its source.

    Attributes:
        value: the figure, in the unit its name carries.
        source: where it comes from; starts with ``estimate`` when no public figure exists.
    """

    value: float
    source: str

    @property
    def is_estimate(self) -> bool:
        """Whether the figure is an estimate (to be replaced by a measured value)."""
        return self.source.startswith(ESTIMATE)


# --- S3 -> node copy -------------------------------------------------------------------------
# One TCP flow to S3 tops out near 5 Gbps; parallel ranged GETs are needed beyond it.
S3_CONNECTION_GBPS = Fact(
    5.0,
    "AWS S3 performance guidelines / EC2 network bandwidth: about 5 Gbps per connection "
    "(docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance-guidelines.html)",
)
# Share of an instance's network bandwidth a tuned parallel S3 reader reaches.
S3_ACHIEVABLE_FRACTION = Fact(
    0.64, "dvassallo/s3-benchmark (2019): 8,003 MB/s from S3 on c5n.18xlarge (100 Gbps) = 64 % of line rate"
)

# --- hub download ----------------------------------------------------------------------------
# A hub is shared and nothing here can measure it: the rate is a range of public figures. The high
# end is a measurement, the low end the rate past which only a Rust client keeps up (the sync's
# client is one: hf_xet with HF_XET_HIGH_PERFORMANCE, scripts/node/weight_sync/sources.py), which a
# busy hub or a slow path may not exceed. The model's timeline uses the measurement; every sync
# budget uses the low end (a timeout must outlive a slow hub); the plan shows both.
HUB_DOWNLOAD_BYTES_PER_SECOND = Fact(
    865e9 / 533,
    "measured: cold pull from Hugging Face of DeepSeek-V4-Pro (865 GB, vllm-project/recipes PR #779) in 8 m 53 s "
    "on 8xB200 (ai-dynamo/modelexpress docs/BENCHMARKS.md, read 2026-12-07): 1.62 GB/s",
)
HUB_DOWNLOAD_LOW_BYTES_PER_SECOND = Fact(
    500e6,
    "estimate: ~500 MB/s, where Hugging Face's Python client tops out and only a Rust client (hf_transfer, hf_xet) "
    "goes beyond (github.com/huggingface/hf_transfer README, read 2026-12-07); a shared hub may give less",
)

# --- image -----------------------------------------------------------------------------------
# Compressed size of vllm/vllm-openai (what a pull downloads) and its unpacked size.
VLLM_IMAGE_COMPRESSED_BYTES = Fact(
    12.64e9, "vllm-project/vllm#27154 (discuss.vllm.ai, 2025-10): vllm/vllm-openai 12.64 GB; estimate for the pinned tag"
)
VLLM_IMAGE_UNPACKED_BYTES = Fact(
    28.6e9, "vllm-project/vllm#22377 (2025-12): vllm/vllm-openai:latest 28.6 GB unpacked; estimate for the pinned tag"
)
# Layers are fetched in parallel but gunzipped and unpacked one stream per layer: the unpack of
# the largest layers bounds the pull, not the 300 Gbps network.
IMAGE_PULL_BYTES_PER_SECOND = Fact(
    100e6, "estimate: ~100 MB/s of compressed layers (gzip unpack per layer); measure `time docker pull`"
)

# --- infrastructure and boot -------------------------------------------------------------------
INFRASTRUCTURE_SECONDS = {
    # VPC, endpoints, bucket, IAM, instance launch until `running`.
    "aws-ec2": Fact(300, "estimate: VPC + endpoints + IAM + RunInstances until running"),
    # EKS control plane, add-ons, node group.
    "aws-eks": Fact(1_200, "estimate: EKS control plane + add-ons + GPU node group"),
    # Existing cluster: namespace, secrets, workloads only.
    "kubernetes": Fact(60, "estimate: namespace, secrets and workloads on an existing cluster"),
}
# A replacement node: from the request until the instance is running.
INSTANCE_LAUNCH_SECONDS = Fact(120, "estimate: RunInstances / node-group scale-up until running")

# What the VM tier measured booting the b300 user data (tests/test_vm_boot.py, recorded by
# `python -m tests.vm.record`): the parts of the boot that do not depend on the GPU instance.
VM_BOOT_FILE = Path(__file__).with_name("data") / "vm_boot_measured.json"


@dataclass(frozen=True)
class VmBootMeasurement:
    """One recorded VM-tier run (``VM_BOOT_FILE``).

    Attributes:
        recorded_at: when (ISO 8601 date).
        accel: ``kvm`` or ``tcg`` (software emulation: every figure an upper bound).
        guest_cpu_slowdown: the guest's time for a fixed Python workload over the host's.
        cloud_init_done_seconds, array_mounted_seconds: first boot, seconds from the guest
            kernel's start until cloud-init finished and until the RAID0 was mounted.
        reboot_weights_verified_seconds: a reboot with a complete local copy: until the weights
            unit had verified it (nothing fetched).
    """

    recorded_at: str
    accel: str
    guest_cpu_slowdown: float
    cloud_init_done_seconds: float
    array_mounted_seconds: float
    reboot_weights_verified_seconds: float | None

    @property
    def citation(self) -> str:
        """One line for a phase's source."""
        reboot = (f", a reboot's local copy verified at {self.reboot_weights_verified_seconds:.0f} s"
                  if self.reboot_weights_verified_seconds is not None else "")
        return (f"measured in the VM tier ({self.recorded_at}, {self.accel}, guest CPU {self.guest_cpu_slowdown:.0f}x slower "
                f"than its host: an upper bound): cloud-init done {self.cloud_init_done_seconds:.0f} s and the RAID0 "
                f"mounted {self.array_mounted_seconds:.0f} s after the kernel started{reboot} "
                f"[tests/test_vm_boot.py, components/core/data/{VM_BOOT_FILE.name}]")


def vm_boot_measurement(path: Path = VM_BOOT_FILE) -> VmBootMeasurement:
    """The recorded VM-tier run.

    Raises:
        ValueError: the file lacks the first boot's phases (re-record with ``python -m tests.vm.record``).
    """
    doc = json.loads(path.read_text())
    try:
        first = doc["boots"]["first-boot"]["phases"]
        reboot = doc["boots"].get("reboot", {}).get("phases", {})
        return VmBootMeasurement(str(doc["recorded_at"]), str(doc["accel"]), float(doc["guest_cpu_slowdown"]),
                                 float(first["cloud_init_done"]), float(first["array_mounted"]),
                                 float(reboot["weights_verified"]) if reboot.get("weights_verified") else None)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a VM-tier record ({exc!r}); run `python -m tests.vm.record`") from None


VM_BOOT = vm_boot_measurement()
# From `running` until the node's own units (or the kubelet) start work: firmware, kernel,
# cloud-init, docker, the RAID0 (mkfs.xfs -K does not discard, so it takes seconds).
INSTANCE_BOOT_SECONDS = {
    "aws-ec2": Fact(120, "estimate: firmware, NVIDIA driver and fabric manager of the GPU instance, then its boot chain, "
                         f"whose GPU-independent part was {VM_BOOT.citation}"),
    "aws-eks": Fact(180, "estimate: boot + nodeadm RAID0 + kubelet join + device plugins"),
    "kubernetes": Fact(0, "existing node: already booted"),
}

# --- engine ----------------------------------------------------------------------------------
# Engine start after the weights are in GPU memory: torch.compile, FlashInfer/Triton JIT,
# CUDA-graph capture and warm-up for a 93-layer MoE, with no cache.
ENGINE_INIT_COLD_SECONDS = Fact(900, "estimate: torch.compile + kernel JIT + CUDA graphs + warm-up, no cache")
# With the compile caches restored: loading compiled artifacts takes seconds (Baseten: 5-20 s
# with a restored torch.compile cache); CUDA graphs are captured at every start and the warm-up
# runs again, which this estimate keeps.
ENGINE_INIT_CACHED_SECONDS = Fact(
    300, "estimate: compile from restored cache (5-20 s, Baseten torch-compile-cache docs) + CUDA graphs + warm-up"
)
# Size of the saved caches (torch_compile_cache for 8 ranks, Triton and FlashInfer JIT output).
ENGINE_CACHE_BYTES = Fact(5e9, "estimate: torch.compile + Triton + FlashInfer caches of 8 ranks")

# --- goal ------------------------------------------------------------------------------------
# The repeat trial of the b300 stack is ready this long after the instance is running (issue 14).
REPEAT_TRIAL_GOAL_SECONDS = 900

FACTS: dict[str, Fact] = {
    "S3_CONNECTION_GBPS": S3_CONNECTION_GBPS,
    "S3_ACHIEVABLE_FRACTION": S3_ACHIEVABLE_FRACTION,
    "VLLM_IMAGE_COMPRESSED_BYTES": VLLM_IMAGE_COMPRESSED_BYTES,
    "VLLM_IMAGE_UNPACKED_BYTES": VLLM_IMAGE_UNPACKED_BYTES,
    "IMAGE_PULL_BYTES_PER_SECOND": IMAGE_PULL_BYTES_PER_SECOND,
    "HUB_DOWNLOAD_BYTES_PER_SECOND": HUB_DOWNLOAD_BYTES_PER_SECOND,
    "HUB_DOWNLOAD_LOW_BYTES_PER_SECOND": HUB_DOWNLOAD_LOW_BYTES_PER_SECOND,
    "INSTANCE_LAUNCH_SECONDS": INSTANCE_LAUNCH_SECONDS,
    "ENGINE_INIT_COLD_SECONDS": ENGINE_INIT_COLD_SECONDS,
    "ENGINE_INIT_CACHED_SECONDS": ENGINE_INIT_CACHED_SECONDS,
    "ENGINE_CACHE_BYTES": ENGINE_CACHE_BYTES,
    **{f"INFRASTRUCTURE_SECONDS[{k}]": v for k, v in INFRASTRUCTURE_SECONDS.items()},
    **{f"INSTANCE_BOOT_SECONDS[{k}]": v for k, v in INSTANCE_BOOT_SECONDS.items()},
}


def measured_source(key: str) -> str:
    """The source text of a figure the stack measured (``kimi-deploy:timeToReady.<key>``)."""
    return f"measured (kimi-deploy:timeToReady.{key})"


@dataclass(frozen=True)
class Rate:
    """A transfer rate with the reason it has that value.

    Attributes:
        bytes_per_second: the rate.
        bound: what limits it (``network``, ``connections``, ``nvme-write``, ``measured``).
        source: the inputs, each with its source or ``estimate``.
    """

    bytes_per_second: float
    bound: str
    source: str


def mirror_copy_rate(spec: DeploymentSpec) -> Rate:
    """Rate of a copy from the S3 mirror onto one node's NVMe.

    min(network x ``S3_ACHIEVABLE_FRACTION``, ``SYNC_WORKERS`` x ``S3_PART_CONCURRENCY`` x
    ``S3_CONNECTION_GBPS``, NVMe write); ``timeToReady.copyGBps`` replaces it when set.
    Unknown network or NVMe figures drop out of the minimum (the source says so).
    """
    measured = spec.config.time_to_ready.copy_gbps
    if measured is not None:
        return Rate(measured * GB, "measured", measured_source("copyGBps"))
    inst = spec.instance
    connections = SYNC_WORKERS * S3_PART_CONCURRENCY
    candidates = [
        (
            connections * S3_CONNECTION_GBPS.value * 1e9 / 8,
            "connections",
            f"{connections} connections ({SYNC_WORKERS} files x {S3_PART_CONCURRENCY} parts) x "
            f"{S3_CONNECTION_GBPS.value:g} Gbps [{S3_CONNECTION_GBPS.source}]",
        )
    ]
    if inst.network_gbps:
        candidates.append((
            inst.network_gbps * 1e9 / 8 * S3_ACHIEVABLE_FRACTION.value,
            "network",
            f"{inst.network_gbps:g} Gbps [{inst.network_source}] x {S3_ACHIEVABLE_FRACTION.value:g} "
            f"[{S3_ACHIEVABLE_FRACTION.source}]",
        ))
    if inst.nvme_write_bytes_per_second:
        candidates.append((
            float(inst.nvme_write_bytes_per_second), "nvme-write",
            f"NVMe write {inst.nvme_write_bytes_per_second / GB:g} GB/s [{inst.nvme_write_source}]",
        ))
    rate, bound, _ = min(candidates)
    detail = "; ".join(text for _, _, text in candidates)
    return Rate(rate, bound, f"min of: {detail}")


@dataclass(frozen=True)
class HubRate:
    """The hub download rate onto one machine, as a range.

    Attributes:
        expected: the rate the model's timeline uses (``HUB_DOWNLOAD_BYTES_PER_SECOND``, or the
            measured ``timeToReady.hubDownloadGBps``), capped by the machine's network.
        low: the slow end of the range (``HUB_DOWNLOAD_LOW_BYTES_PER_SECOND``; the measured
            value when set), capped alike: every sync budget uses it.
        capped_by: what caps ``expected`` below the hub's figure (``"<instance> network"``), or None.
    """

    expected: Rate
    low: Rate
    capped_by: str | None

    def range_text(self) -> str:
        """``0.50-1.62 GB/s`` (one figure when both ends agree)."""
        lo, hi = self.low.bytes_per_second / GB, self.expected.bytes_per_second / GB
        return f"{hi:.2f} GB/s" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f} GB/s"


def hub_download_rate(spec: DeploymentSpec, network_gbps: float | None = None, machine: str = "",
                      network_source: str = "") -> HubRate:
    """The hub download rate onto ``machine`` (a GPU node, the stager, the system nodes): the hub's
    range (``HUB_DOWNLOAD_LOW_BYTES_PER_SECOND`` - ``HUB_DOWNLOAD_BYTES_PER_SECOND``), or the measured
    ``timeToReady.hubDownloadGBps`` for both ends, each capped by ``network_gbps`` (its baseline
    bandwidth, Gbps; None: not known, no cap) x ``S3_ACHIEVABLE_FRACTION`` (the same machine uploads
    to the mirror at the same time on a full-duplex link, so the download alone sets the cap).
    """
    measured = spec.config.time_to_ready.hub_download_gbps
    if measured is not None:
        hub_hi = hub_lo = Rate(measured * GB, "measured", measured_source("hubDownloadGBps"))
    else:
        hub_hi = Rate(HUB_DOWNLOAD_BYTES_PER_SECOND.value, "hub", HUB_DOWNLOAD_BYTES_PER_SECOND.source)
        hub_lo = Rate(HUB_DOWNLOAD_LOW_BYTES_PER_SECOND.value, "hub", HUB_DOWNLOAD_LOW_BYTES_PER_SECOND.source)
    if not network_gbps:
        return HubRate(hub_hi, hub_lo, None)
    cap_bps = network_gbps * 1e9 / 8 * S3_ACHIEVABLE_FRACTION.value
    cap_text = (f"{machine} network {network_gbps:g} Gbps [{network_source}] x {S3_ACHIEVABLE_FRACTION.value:g} "
                f"[{S3_ACHIEVABLE_FRACTION.source}]")

    def capped(rate: Rate) -> Rate:
        if rate.bytes_per_second <= cap_bps:
            return rate
        return Rate(cap_bps, "network", f"{cap_text}, below the hub's {rate.bytes_per_second / GB:.2f} GB/s [{rate.source}]")

    hi, lo = capped(hub_hi), capped(hub_lo)
    return HubRate(hi, lo, f"{machine} network" if hi.bound == "network" else None)


# The EKS system nodes (components/aws/cluster.py SYSTEM_INSTANCE_TYPE) run a stage's publish there.
SYSTEM_NODE_INSTANCE_TYPE = "m7i.xlarge"
SYSTEM_NODE_NETWORK_GBPS = Fact(
    1.562, "EC2 DescribeInstanceTypes (moto 5 data): m7i.xlarge BaselineBandwidthInGbps 1.562, 'Up to 12.5 Gigabit'"
)


def publish_machine(spec: DeploymentSpec, staging: bool) -> tuple[str, float | None, str]:
    """``(name, baseline network Gbps or None, its source)`` of what runs the hub -> mirror publish:
    in a stage the stager (aws-ec2: ``targets.STAGING_INSTANCE``), the EKS system nodes, or the
    cluster's own nodes (unknown network); in serve a GPU node (``spec.instance``)."""
    if staging and spec.profile.serves_under_systemd:
        s = STAGING_INSTANCE
        return f"{s.instance_type} stager", s.network_gbps, s.network_source
    if staging and spec.profile.stages_on_system_nodes:
        return (f"{SYSTEM_NODE_INSTANCE_TYPE} system node", SYSTEM_NODE_NETWORK_GBPS.value, SYSTEM_NODE_NETWORK_GBPS.source)
    if staging:
        return "the cluster's node", None, "unknown"
    return f"{spec.instance.instance_type} GPU node", spec.instance.network_gbps, spec.instance.network_source


def publish_hub_rate(spec: DeploymentSpec, staging: bool) -> HubRate:
    """``hub_download_rate`` on the machine that runs the publish (``publish_machine``)."""
    name, gbps, source = publish_machine(spec, staging)
    return hub_download_rate(spec, gbps, name, source)


def stream_rate(spec: DeploymentSpec) -> Rate:
    """Rate of vLLM's Run:ai streamer reading straight from S3 into GPU memory on one node:
    the copy's network and connection bounds without the NVMe write (``runai_streamer`` with
    ``{"distributed": true}``: each file is read once per node, not once per rank)."""
    inst = spec.instance
    connections = SYNC_WORKERS * S3_PART_CONCURRENCY
    options = [(connections * S3_CONNECTION_GBPS.value * 1e9 / 8, "connections",
                f"{connections} streamer connections x {S3_CONNECTION_GBPS.value:g} Gbps [{S3_CONNECTION_GBPS.source}]")]
    if inst.network_gbps:
        options.append((inst.network_gbps * 1e9 / 8 * S3_ACHIEVABLE_FRACTION.value, "network",
                        f"{inst.network_gbps:g} Gbps [{inst.network_source}] x {S3_ACHIEVABLE_FRACTION.value:g} "
                        f"[{S3_ACHIEVABLE_FRACTION.source}]"))
    rate, bound, _ = min(options)
    return Rate(rate, bound, "min of: " + "; ".join(t for _, _, t in options))


def fact_or_measured(fact: Fact, measured: float | None, key: str) -> tuple[float, str]:
    if measured is not None:
        return measured, measured_source(key)
    return fact.value, fact.source


def image_pull_seconds(spec: DeploymentSpec) -> tuple[float, str]:
    """``(seconds, source)`` of the vLLM image pull: ``timeToReady.imagePullSeconds`` when set, else
    the compressed image size at ``IMAGE_PULL_BYTES_PER_SECOND``."""
    measured = spec.config.time_to_ready.image_pull_seconds
    if measured is not None:
        return measured, measured_source("imagePullSeconds")
    seconds = VLLM_IMAGE_COMPRESSED_BYTES.value / IMAGE_PULL_BYTES_PER_SECOND.value
    return seconds, (
        f"{VLLM_IMAGE_COMPRESSED_BYTES.value / 1e9:.1f} GB [{VLLM_IMAGE_COMPRESSED_BYTES.source}] at "
        f"{IMAGE_PULL_BYTES_PER_SECOND.value / 1e6:g} MB/s [{IMAGE_PULL_BYTES_PER_SECOND.source}]"
    )


def engine_init_seconds(spec: DeploymentSpec, cached: bool) -> tuple[float, str]:
    """``(seconds, source)`` of the engine start once the weights are in GPU memory, with the compile
    caches restored (``cached``) or not: the measured ``timeToReady`` value when set, else the estimate."""
    ttr = spec.config.time_to_ready
    if cached:
        return fact_or_measured(ENGINE_INIT_CACHED_SECONDS, ttr.engine_init_cached_seconds, "engineInitCachedSeconds")
    return fact_or_measured(ENGINE_INIT_COLD_SECONDS, ttr.engine_init_seconds, "engineInitSeconds")


def engine_init_cold_seconds(spec: DeploymentSpec) -> float:
    """Seconds of a cold engine start (no caches): the measured value when set, else the estimate."""
    return engine_init_seconds(spec, cached=False)[0]

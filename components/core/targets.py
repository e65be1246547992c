"""GPU, instance and target profiles: the hardware facts every other module reads.

Adding a target adds an entry to ``TARGETS`` (and its instances to ``INSTANCES``), not a code path.
All figures carry their source in the comment beside them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .prices import PRICES, list_price_usd_per_hour

MIB = 1024**2
GB = 10**9
GIB = 2**30
TB = 10**12


@dataclass(frozen=True)
class GpuFacts:
    """One GPU model.

    Attributes:
        name: marketing name, e.g. ``"B300"``.
        vendor: ``"nvidia"`` or ``"amd"``.
        memory_bytes: HBM per GPU in bytes.
        fp4_native: whether the GPU has native FP4 (MXFP4) tensor units.
        architecture: GPU architecture family (``blackwell``, ``hopper``, ``cdna4``).
        compute_capability: CUDA compute capability ``(major, minor)`` (NVIDIA's CUDA GPU list,
            developer.nvidia.com/cuda-gpus: B200/GB200 10.0, B300/GB300 10.3, H100/H200 9.0);
            None for GPUs that CUDA does not run (AMD). vLLM gates kernels by it: "SM10x" is
            major 10 (``current_platform.is_device_capability_family(100)``).
    """

    name: str
    vendor: str
    memory_bytes: int
    fp4_native: bool
    architecture: str
    compute_capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class InstanceFacts:
    """One machine shape that hosts a node of a target.

    Attributes:
        instance_type: provider name, e.g. ``"p6-b300.48xlarge"``.
        cloud: ``"aws"`` or ``"oci"`` (where the shape is sold).
        gpu: the GPU model in the instance (``GPUS``): EC2 DescribeInstanceTypes'
            ``GpuInfo.Gpus[].Name`` for the types in its catalog (tests compare moto's copy).
        gpus: GPUs per instance.
        vcpus: virtual CPUs.
        memory_gib: host memory in GiB.
        cpu_architecture: ``"x86_64"`` or ``"arm64"``.
        nvme_devices: local instance-store NVMe devices.
        nvme_device_bytes: bytes per NVMe device (decimal, as vendors quote them).
        nvme_read_bytes_per_second: sequential read of the RAID0 set, bytes/s. An estimate
            where the vendor publishes none (see ``nvme_read_source``); override per stack
            with ``kimi-deploy:storage.readGBps`` after measuring with fio.
        nvme_read_source: where ``nvme_read_bytes_per_second`` comes from.
        efa_interfaces: EFA-capable network interfaces (0 = no EFA).
        network_cards: network cards (each can hold one EFA interface).
        usd_per_hour_on_demand: on-demand price in USD/hour in ``price_region``, or None when
            the shape has no public on-demand price (capacity blocks, other clouds).
        price_region: region of ``usd_per_hour_on_demand``.
        offered_azs: region -> availability zones that offer the type (EC2
            DescribeInstanceTypeOfferings as shipped in moto 5.2). Empty for shapes outside
            that catalog; preflight asks the live API.
        in_ec2_catalog: whether EC2's DescribeInstanceTypes knows the type (moto 5.2 data).
        network_card_interface_types: per network card (index = card), the interface types it
            takes (``interface``, ``efa``, ``efa-only``), as EC2 DescribeInstanceTypes reports
            them in ``NetworkInfo.NetworkCards[].InterfaceTypes``. Empty where not recorded.
        efa_cards: the network cards that get one EFA-only interface in a launch template (the
            family's published EFA layout, data per instance; empty = no EFA layout).
        facts_source: where the figures come from (``unverified`` when they are an analogy
            that preflight's DescribeInstanceTypes must confirm).
        ultraserver_instances: instances (trays) per UltraServer, for types sold only as whole
            UltraServers in capacity blocks (the block is paid in full however many trays the
            node group uses); smallest first. Empty for types sold per instance.
        network_gbps: bandwidth of the interface that reaches S3 and the registry (ENA, not
            EFA), Gbit/s, or None when unknown; read by ``time_to_ready.py``.
        network_source: where ``network_gbps`` comes from (or ``estimate: ...``).
        nvme_write_bytes_per_second: sequential write of the RAID0 set, bytes/s, or None.
        nvme_write_source: where ``nvme_write_bytes_per_second`` comes from.
    """

    instance_type: str
    cloud: str
    gpu: GpuFacts
    gpus: int
    vcpus: int
    memory_gib: int
    cpu_architecture: str
    nvme_devices: int
    nvme_device_bytes: int
    nvme_read_bytes_per_second: int
    nvme_read_source: str
    efa_interfaces: int
    network_cards: int
    usd_per_hour_on_demand: float | None
    price_region: str | None
    offered_azs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    in_ec2_catalog: bool = True
    network_card_interface_types: tuple[tuple[str, ...], ...] = ()
    efa_cards: tuple[int, ...] = ()
    facts_source: str = ""
    ultraserver_instances: tuple[int, ...] = ()
    network_gbps: float | None = None
    network_source: str = "unknown"
    nvme_write_bytes_per_second: int | None = None
    nvme_write_source: str = "unknown"

    @property
    def nvme_total_bytes(self) -> int:
        """Raw capacity of all local NVMe devices in bytes (RAID0 usable capacity)."""
        return self.nvme_devices * self.nvme_device_bytes


@dataclass(frozen=True)
class TargetProfile:
    """A deployable 8-GPU target: what one model copy runs on.

    Attributes:
        name: config value of ``kimi-deploy:target``.
        display_name: for people.
        gpu: the GPU model.
        gpus_per_node: GPUs per node (instance).
        nodes_per_copy: nodes that form one tensor-parallel group (one model copy).
        platforms: platform -> instance type used on it (``aws-ec2``, ``aws-eks``, ``kubernetes``).
        image_family: ``"cuda"`` or ``"rocm"``: selects the vLLM image and recipe flags.
        gpu_resource_name: Kubernetes extended resource, e.g. ``"nvidia.com/gpu"``.
        needs_compute_domain: multi-node NVLink needs an NVIDIA DRA ComputeDomain claim.
        unsupported_reason: set for profiles kept only to explain why they cannot serve.
        aws_capacity_types: the ``compute.capacity.type`` values AWS sells this target's
            instances under (None: any of on-demand, odcr, capacity-block).
        aws_capacity_reason: why ``aws_capacity_types`` is limited (shown in the config error).
    """

    name: str
    display_name: str
    gpu: GpuFacts
    gpus_per_node: int
    nodes_per_copy: int
    platforms: Mapping[str, str]
    image_family: str
    gpu_resource_name: str
    needs_compute_domain: bool = False
    unsupported_reason: str | None = None
    aws_capacity_types: tuple[str, ...] | None = None
    aws_capacity_reason: str = ""

    @property
    def gpus_per_copy(self) -> int:
        """GPUs in one model copy (the tensor-parallel size)."""
        return self.gpus_per_node * self.nodes_per_copy

    @property
    def gpu_memory_per_copy_bytes(self) -> int:
        """HBM of one model copy in bytes."""
        return self.gpus_per_copy * self.gpu.memory_bytes

    def instance_for(self, platform: str) -> InstanceFacts:
        """The instance facts used on ``platform``.

        Raises:
            KeyError: the target does not run on that platform (config validation reports it first).
        """
        return INSTANCES[self.platforms[platform]]


# Compute capabilities: NVIDIA's CUDA GPU table (developer.nvidia.com/cuda-gpus): B300 and GB300
# 10.3 (Blackwell Ultra, SM103), B200 and GB200 10.0 (SM100), H100 and H200 9.0.
GPUS: Mapping[str, GpuFacts] = MappingProxyType(
    {
        # 275,040 MiB per GPU: EC2 DescribeInstanceTypes for p6-b300.48xlarge (moto 5.2 data).
        "B300": GpuFacts("B300", "nvidia", 275_040 * MIB, True, "blackwell", (10, 3)),
        # About 288 GB HBM3e per GB300 GPU (NVIDIA GB300 NVL72 datasheet).
        "GB300": GpuFacts("GB300", "nvidia", 288 * GB, True, "blackwell", (10, 3)),
        # 288 GB HBM3E per MI355X (AMD Instinct MI355X datasheet; OCI BM.GPU.MI355X.8 shape).
        "MI355X": GpuFacts("MI355X", "amd", 288 * GB, True, "cdna4"),
        # 183,359 MiB per GPU: EC2 DescribeInstanceTypes for p6-b200.48xlarge (moto 5.2 data).
        "B200": GpuFacts("B200", "nvidia", 183_359 * MIB, True, "blackwell", (10, 0)),
        # Up to 186 GB HBM3e per GB200 GPU (NVIDIA GB200 NVL72: 13.4 TB over 72 GPUs).
        "GB200": GpuFacts("GB200", "nvidia", 186 * GB, True, "blackwell", (10, 0)),
        # Kept to explain rejections: 80 GB (H100 SXM) and 141 GB (H200), no native FP4.
        "H100": GpuFacts("H100", "nvidia", 80 * GB, False, "hopper", (9, 0)),
        "H200": GpuFacts("H200", "nvidia", 141 * GB, False, "hopper", (9, 0)),
    }
)

# Interface types of a network card (EC2 DescribeInstanceTypes NetworkCards[].InterfaceTypes).
_ENA_ONLY = ("interface",)
_EFA_CAPABLE = ("interface", "efa", "efa-only")

# Offerings of p6-b300.48xlarge (moto 5.2 DescribeInstanceTypeOfferings, availability-zone).
_P6_B300_AZS = MappingProxyType(
    {
        "us-east-1": ("us-east-1a", "us-east-1c"),
        "us-west-2": ("us-west-2a", "us-west-2b"),
        "ap-northeast-2": ("ap-northeast-2c",),
        "ap-south-2": ("ap-south-2a", "ap-south-2c"),
        "ap-southeast-3": ("ap-southeast-3a", "ap-southeast-3b", "ap-southeast-3c"),
        "sa-east-1": ("sa-east-1b", "sa-east-1c"),
    }
)

INSTANCES: Mapping[str, InstanceFacts] = MappingProxyType(
    {
        "p6-b300.48xlarge": InstanceFacts(
            instance_type="p6-b300.48xlarge",
            cloud="aws",
            gpu=GPUS["B300"],
            gpus=8,
            vcpus=192,
            memory_gib=4096,
            cpu_architecture="x86_64",
            nvme_devices=8,
            nvme_device_bytes=3_800 * GB,
            # AWS publishes no instance-store throughput for P6; 8 Nitro SSDs at a
            # conservative 2 GB/s each in RAID0.
            nvme_read_bytes_per_second=16 * GB,
            nvme_read_source="estimate: 8 Nitro NVMe x 2 GB/s (no AWS figure; measure with fio)",
            efa_interfaces=16,
            network_cards=17,
            # The on-demand list price lives in the price table (prices.py, with its source).
            usd_per_hour_on_demand=list_price_usd_per_hour("p6-b300.48xlarge"),
            price_region="us-east-1",
            offered_azs=_P6_B300_AZS,
            # Card 0 ENA only, cards 1-16 EFA-capable at 400 Gbps (DescribeInstanceTypes, moto 5.2).
            network_card_interface_types=(_ENA_ONLY,) + (_EFA_CAPABLE,) * 16,
            # One EFA-only interface on each of cards 1-16: the full 6.4 Tbps (EC2 user guide,
            # "Maximize network bandwidth ... multiple network cards").
            efa_cards=tuple(range(1, 17)),
            facts_source="EC2 DescribeInstanceTypes (moto 5.2 data), checked live by preflight",
            # AWS P6-B300 launch (2025-12): 300 Gbps of ENA beside 6.4 Tbps of EFA (AWS "Amazon EC2 P6-B300 instances"
            # launch announcement).
            network_gbps=300,
            network_source="AWS P6-B300 launch 2025-12: 300 Gbps ENA (S3 and registry traffic)",
            nvme_write_bytes_per_second=12 * GB,
            nvme_write_source="estimate: 8 Nitro NVMe x 1.5 GB/s write (no AWS figure; measure with fio)",
        ),
        "p6e-gb300.36xlarge": InstanceFacts(
            instance_type="p6e-gb300.36xlarge",
            cloud="aws",
            gpu=GPUS["GB300"],
            gpus=4,
            # By analogy with p6e-gb200.36xlarge (one Grace-Blackwell tray): 144 vCPU,
            # 960 GiB, 3 x 7.5 TB NVMe, 17 network cards. Sold only as UltraServer
            # capacity blocks, so no on-demand price and no entry in moto's catalog.
            vcpus=144,
            memory_gib=960,
            cpu_architecture="arm64",
            nvme_devices=3,
            nvme_device_bytes=7_500 * GB,
            nvme_read_bytes_per_second=6 * GB,
            nvme_read_source="estimate: 3 Nitro NVMe x 2 GB/s (no AWS figure; measure with fio)",
            efa_interfaces=16,
            network_cards=17,
            usd_per_hour_on_demand=None,
            price_region=None,
            offered_azs=MappingProxyType({}),
            in_ec2_catalog=False,
            # Unverified, as p6e-gb200: card 0 ENA only; EFA on cards 1-16.
            network_card_interface_types=(_ENA_ONLY,) + (_EFA_CAPABLE,) * 16,
            # P6e layout (EC2 user guide, P6e-GB200 EFA configuration; AWS ParallelCluster
            # #6930): EFA-only interfaces on the odd cards 1-15 give the full bandwidth; AWS
            # recommends 4 or 8 EFA interfaces per tray, not 16. Eight here.
            efa_cards=(1, 3, 5, 7, 9, 11, 13, 15),
            facts_source="unverified: by analogy with p6e-gb200.36xlarge; preflight compares DescribeInstanceTypes",
            # Sold only as UltraServer capacity blocks: u-p6e-gb300x72 = 72 GB300 GPUs = 18 trays
            # of 4 (NVIDIA GB300 NVL72). (GB200 is also sold as u-p6e-gb200x36 = 9 trays; set
            # compute.capacity.blockInstances to the size of the block you bought.)
            ultraserver_instances=(18,),
            network_gbps=100,
            network_source="estimate: no AWS ENA figure for a GB300 tray (read DescribeInstanceTypes)",
            nvme_write_bytes_per_second=4_500 * 10**6,
            nvme_write_source="estimate: 3 Nitro NVMe x 1.5 GB/s write (no AWS figure; measure with fio)",
        ),
        "BM.GPU.MI355X.8": InstanceFacts(
            instance_type="BM.GPU.MI355X.8",
            cloud="oci",
            gpu=GPUS["MI355X"],
            gpus=8,
            vcpus=256,
            # OCI BM.GPU.MI355X.8: 8 x 288 GB, 3 TB RAM, 8 x 7.68 TB NVMe.
            memory_gib=3072,
            cpu_architecture="x86_64",
            nvme_devices=8,
            nvme_device_bytes=7_680 * GB,
            nvme_read_bytes_per_second=16 * GB,
            nvme_read_source="estimate: 8 NVMe x 2 GB/s (no vendor figure; measure with fio)",
            efa_interfaces=0,
            network_cards=1,
            usd_per_hour_on_demand=None,
            price_region=None,
            offered_azs=MappingProxyType({}),
            in_ec2_catalog=False,
            network_gbps=100,
            network_source="estimate: front-end network of BM.GPU.MI355X.8 (no OCI figure recorded)",
            nvme_write_bytes_per_second=12 * GB,
            nvme_write_source="estimate: 8 NVMe x 1.5 GB/s write (no vendor figure; measure with fio)",
        ),
        "p6-b200.48xlarge": InstanceFacts(
            instance_type="p6-b200.48xlarge",
            cloud="aws",
            # EC2 DescribeInstanceTypes (moto 5.2 data): 8x B200, 192 vCPU, 2 TiB, 8 x 3,800 GB
            # NVMe, 8 network cards with 8 EFA interfaces.
            gpu=GPUS["B200"],
            gpus=8,
            vcpus=192,
            memory_gib=2048,
            cpu_architecture="x86_64",
            nvme_devices=8,
            nvme_device_bytes=3_800 * GB,
            nvme_read_bytes_per_second=16 * GB,
            nvme_read_source="estimate: 8 Nitro NVMe x 2 GB/s (no AWS figure; measure with fio)",
            efa_interfaces=8,
            network_cards=8,
            usd_per_hour_on_demand=None,
            price_region=None,
            # moto 5.2 DescribeInstanceTypeOfferings (availability-zone), the regions used here.
            offered_azs=MappingProxyType(
                {
                    "us-east-1": ("us-east-1c",),
                    "us-east-2": ("us-east-2a", "us-east-2b", "us-east-2c"),
                    "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2d"),
                }
            ),
        ),
        "p6e-gb200.36xlarge": InstanceFacts(
            instance_type="p6e-gb200.36xlarge",
            cloud="aws",
            gpu=GPUS["GB200"],
            gpus=4,
            # One Grace-Blackwell tray of a P6e-GB200 UltraServer (u-p6e-gb200x36 = 9 trays, x72 =
            # 18): 144 vCPU, 960 GiB, 3 x 7.5 TB NVMe (by analogy with p6e-gb200: EC2 instance types, accelerated
            # computing); 17 network
            # cards, the odd cards 1-15 EFA-only (AWS recommends 4 or 8 EFA). Sold only as
            # UltraServer capacity blocks: no on-demand price, not in moto's catalog.
            vcpus=144,
            memory_gib=960,
            cpu_architecture="arm64",
            nvme_devices=3,
            nvme_device_bytes=7_500 * GB,
            nvme_read_bytes_per_second=6 * GB,
            nvme_read_source="estimate: 3 Nitro NVMe x 2 GB/s (no AWS figure; measure with fio)",
            efa_interfaces=8,
            network_cards=17,
            usd_per_hour_on_demand=None,
            price_region=None,
            offered_azs=MappingProxyType({}),
            in_ec2_catalog=False,
        ),
        "p5.48xlarge": InstanceFacts(
            instance_type="p5.48xlarge",
            cloud="aws",
            gpu=GPUS["H100"],
            gpus=8,
            vcpus=192,
            memory_gib=2048,
            cpu_architecture="x86_64",
            nvme_devices=8,
            nvme_device_bytes=3_840 * GB,
            nvme_read_bytes_per_second=16 * GB,
            nvme_read_source="estimate",
            efa_interfaces=32,
            network_cards=32,
            usd_per_hour_on_demand=None,
            price_region=None,
        ),
        "p5en.48xlarge": InstanceFacts(
            instance_type="p5en.48xlarge",
            cloud="aws",
            gpu=GPUS["H200"],
            gpus=8,
            vcpus=192,
            memory_gib=2048,
            cpu_architecture="x86_64",
            nvme_devices=8,
            nvme_device_bytes=3_840 * GB,
            nvme_read_bytes_per_second=16 * GB,
            nvme_read_source="estimate",
            efa_interfaces=16,
            network_cards=16,
            usd_per_hour_on_demand=None,
            price_region=None,
        ),
    }
)

TARGETS: Mapping[str, TargetProfile] = MappingProxyType(
    {
        "b300": TargetProfile(
            name="b300",
            display_name="1x p6-b300.48xlarge (8x NVIDIA B300)",
            gpu=GPUS["B300"],
            gpus_per_node=8,
            nodes_per_copy=1,
            platforms=MappingProxyType({"aws-ec2": "p6-b300.48xlarge", "aws-eks": "p6-b300.48xlarge"}),
            image_family="cuda",
            gpu_resource_name="nvidia.com/gpu",
        ),
        "gb300": TargetProfile(
            name="gb300",
            display_name="2x p6e-gb300.36xlarge trays (8x NVIDIA GB300, one TP8 group over MNNVL)",
            gpu=GPUS["GB300"],
            gpus_per_node=4,
            nodes_per_copy=2,
            platforms=MappingProxyType({"aws-eks": "p6e-gb300.36xlarge"}),
            image_family="cuda",
            gpu_resource_name="nvidia.com/gpu",
            needs_compute_domain=True,
            aws_capacity_types=("capacity-block",),
            aws_capacity_reason="AWS sells GB300 only as UltraServer capacity blocks",
        ),
        "mi355x": TargetProfile(
            name="mi355x",
            display_name="1x 8x AMD MI355X node on an existing Kubernetes cluster",
            gpu=GPUS["MI355X"],
            gpus_per_node=8,
            nodes_per_copy=1,
            platforms=MappingProxyType({"kubernetes": "BM.GPU.MI355X.8"}),
            image_family="rocm",
            gpu_resource_name="amd.com/gpu",
        ),
        # Data only, no code path: the same fields as gb300. Four trays (16 GPUs, one TP16 group
        # over multi-node NVLink in one UltraServer): two trays hold 8 x 186 GB = 1,488 GB, less
        # than the 1.56 TB of weights.
        "gb200": TargetProfile(
            name="gb200",
            display_name="4x p6e-gb200.36xlarge trays (16x NVIDIA GB200, one TP16 group over MNNVL)",
            gpu=GPUS["GB200"],
            gpus_per_node=4,
            nodes_per_copy=4,
            platforms=MappingProxyType({"aws-eks": "p6e-gb200.36xlarge"}),
            image_family="cuda",
            gpu_resource_name="nvidia.com/gpu",
            needs_compute_domain=True,
            aws_capacity_types=("capacity-block",),
            aws_capacity_reason="AWS sells GB200 only as UltraServer capacity blocks",
        ),
        # Data only: 8 x 192 GB = 1,538 GB < 1.56 TB of weights, so config rejects it for memory
        # (and does not list it as supported).
        "b200": TargetProfile(
            name="b200",
            display_name="1x p6-b200.48xlarge (8x NVIDIA B200)",
            gpu=GPUS["B200"],
            gpus_per_node=8,
            nodes_per_copy=1,
            platforms=MappingProxyType({"aws-ec2": "p6-b200.48xlarge", "aws-eks": "p6-b200.48xlarge"}),
            image_family="cuda",
            gpu_resource_name="nvidia.com/gpu",
        ),
        "h100": TargetProfile(
            name="h100",
            display_name="8x NVIDIA H100",
            gpu=GPUS["H100"],
            gpus_per_node=8,
            nodes_per_copy=1,
            platforms=MappingProxyType({"aws-ec2": "p5.48xlarge", "aws-eks": "p5.48xlarge"}),
            image_family="cuda",
            gpu_resource_name="nvidia.com/gpu",
            unsupported_reason="Hopper has no native FP4 units for the MXFP4 experts",
        ),
        "h200": TargetProfile(
            name="h200",
            display_name="8x NVIDIA H200",
            gpu=GPUS["H200"],
            gpus_per_node=8,
            nodes_per_copy=1,
            platforms=MappingProxyType({"aws-ec2": "p5en.48xlarge", "aws-eks": "p5en.48xlarge"}),
            image_family="cuda",
            gpu_resource_name="nvidia.com/gpu",
            unsupported_reason="Hopper has no native FP4 units for the MXFP4 experts",
        ),
    }
)

_VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD"}


def gpu_text(count: int, gpu: GpuFacts) -> str:
    """``"8x NVIDIA B300 of 288 GB"``: GPUs for people (memory in decimal GB, as vendors quote it)."""
    return f"{count}x {_VENDOR_NAMES.get(gpu.vendor, gpu.vendor)} {gpu.name} of {gpu.memory_bytes / GB:,.0f} GB"


def hardware_mismatch(instance: InstanceFacts, target: TargetProfile) -> str | None:
    """Why ``instance`` is not a node of ``target`` (GPU model, GPUs per node, memory per GPU), as
    the words after the instance type in a config error (``"has 8x Nvidia H100 (...), not ..."``),
    or None when it is one."""
    if (
        instance.gpu.name == target.gpu.name
        and instance.gpus == target.gpus_per_node
        and instance.gpu.memory_bytes == target.gpu.memory_bytes
    ):
        return None
    return (
        f"has {gpu_text(instance.gpus, instance.gpu)}, not the {gpu_text(target.gpus_per_node, target.gpu)} per node "
        f"of target {target.name}"
    )


def instance_types_of(target: TargetProfile) -> list[str]:
    """The instance types in ``INSTANCES`` that are nodes of ``target`` (no ``hardware_mismatch``), sorted."""
    return sorted(name for name, facts in INSTANCES.items() if hardware_mismatch(facts, target) is None)


@dataclass(frozen=True)
class HardwareLabel:
    """A node label that names hardware, which a ``kubernetes.nodeSelector`` may select on.

    Attributes:
        key: the label key.
        names: what its value names: ``instance-type``, ``gpu-model``, ``gpu-count`` or
            ``gpu-memory``.
        memory_unit_bytes: for ``gpu-memory``, the bytes of one unit of the value (MiB, or GB
            where the value ends in ``G``).
        source: who sets the label and what its value looks like.
    """

    key: str
    names: str
    memory_unit_bytes: int = 0
    source: str = ""


_GFD = "NVIDIA GPU Feature Discovery (NVIDIA/k8s-device-plugin docs/gpu-feature-discovery, Generated Labels)"
# The NVLink domain of a node: GPU Feature Discovery writes ``<GPUFabric ClusterUUID>.<CliqueID>``
# from NVML (NVIDIA/k8s-device-plugin v0.18.0 internal/lm/imex.go; docs/gpu-feature-discovery/README.md
# "nvidia.com/gpu.clique", e.g. 7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1). Two nodes share NVLink (one
# NVL72 rack, or a fabric partition of it) exactly when their values are equal; nodes whose GPUs have
# no fabric (no NVSwitch tray) carry no such label.
NVLINK_CLIQUE_LABEL = "nvidia.com/gpu.clique"
_KARPENTER = "Karpenter AWS well-known labels (karpenter.sh docs, Instance Types), from EC2 DescribeInstanceTypes"
_AMD_LABELLER = "AMD GPU node labeller (ROCm/k8s-device-plugin k8s-node-labeller; also as beta.amd.com/gpu.*)"
HARDWARE_LABELS: tuple[HardwareLabel, ...] = (
    HardwareLabel("node.kubernetes.io/instance-type", "instance-type",
                  source="Kubernetes well-known label, set by the cloud provider (kubernetes.io/docs/reference/labels-"
                         "annotations-taints/#nodekubernetesioinstance-type)"),
    HardwareLabel("beta.kubernetes.io/instance-type", "instance-type",
                  source="deprecated alias of node.kubernetes.io/instance-type"),
    HardwareLabel("nvidia.com/gpu.product", "gpu-model",
                  source=f"{_GFD}: the product name, spaces as '-' (NVIDIA-H100-80GB-HBM3)"),
    HardwareLabel("nvidia.com/gpu.count", "gpu-count", source=_GFD),
    HardwareLabel("nvidia.com/gpu.memory", "gpu-memory", MIB, f"{_GFD}: MiB per GPU"),
    HardwareLabel("karpenter.k8s.aws/instance-gpu-name", "gpu-model", source=f"{_KARPENTER}: lower case (h100)"),
    HardwareLabel("karpenter.k8s.aws/instance-gpu-count", "gpu-count", source=_KARPENTER),
    HardwareLabel("karpenter.k8s.aws/instance-gpu-memory", "gpu-memory", MIB, f"{_KARPENTER}: MiB per GPU"),
    *(
        label
        for prefix in ("amd.com", "beta.amd.com")
        for label in (
            HardwareLabel(f"{prefix}/gpu.product-name", "gpu-model", source=f"{_AMD_LABELLER}: AMD_Instinct_MI300X_OAM"),
            HardwareLabel(f"{prefix}/gpu.vram", "gpu-memory", GB, f"{_AMD_LABELLER}: per GPU, e.g. 192G"),
        )
    ),
    HardwareLabel("kubernetes.io/arch", "cpu-arch",
                  source="Kubernetes well-known label, the node's GOARCH (kubernetes.io/docs/reference/labels-annotations-"
                         "taints/#kubernetes-io-arch)"),
)
# EC2's processor architecture (DescribeInstanceTypes) as Go, and so kubernetes.io/arch, names it.
KUBERNETES_ARCH_OF_CPU = {"x86_64": "amd64", "arm64": "arm64"}
# Reported and marketed GPU memory differ a little (H100: 80 GB sold, 81,559 MiB reported by the
# driver, 81,920 MiB in EC2's catalog): a memory label within this fraction is the same GPU.
GPU_MEMORY_LABEL_TOLERANCE = 0.05


def hardware_label_mismatch(key: str, value: str, target: TargetProfile) -> str | None:
    """Why a node label ``key``=``value`` in a selector does not select a node of ``target``
    (``HARDWARE_LABELS``), as the words after the value in a config error; None when it does or
    the label does not name hardware. An instance type with no profile here never passes: nothing
    says it is the target's hardware."""
    label = next((h for h in HARDWARE_LABELS if h.key == key), None)
    if label is None:
        return None
    text = str(value).strip()
    if label.names == "instance-type":
        instance = INSTANCES.get(text)
        if instance is None:
            return (
                f"is an instance type with no profile: nothing says it is a {target.name} node "
                f"(instance types of {target.name}: {', '.join(instance_types_of(target))})"
            )
        return hardware_mismatch(instance, target)
    if label.names == "cpu-arch":
        arches = sorted({KUBERNETES_ARCH_OF_CPU[INSTANCES[t].cpu_architecture] for t in instance_types_of(target)})
        if not arches or text in arches:
            return None
        return f"is not the CPU architecture of target {target.name}'s nodes ({' or '.join(arches)}): no node would match"
    if label.names == "gpu-model":
        tokens = {t for t in re.split(r"[-_\s]+", text.upper()) if t}
        if target.gpu.name.upper() in tokens:
            return None
        return f"names another GPU than the {target.gpu.name} of target {target.name} (its value must name {target.gpu.name})"
    if label.names == "gpu-count":
        if text.isdigit() and int(text) == target.gpus_per_node:
            return None
        return f"is not the {target.gpus_per_node} GPUs per node of target {target.name}"
    number = text[:-1] if text.upper().endswith("G") else text
    unit = GB if text.upper().endswith("G") else label.memory_unit_bytes
    try:
        memory_bytes = float(number) * unit
    except ValueError:
        memory_bytes = -1.0
    if abs(memory_bytes - target.gpu.memory_bytes) <= GPU_MEMORY_LABEL_TOLERANCE * target.gpu.memory_bytes:
        return None
    return f"is not the {target.gpu.memory_bytes / GB:,.0f} GB per GPU of the {target.gpu.name} of target {target.name}"


PLATFORMS: tuple[str, ...] = ("aws-ec2", "aws-eks", "kubernetes")

# AWS regions with EC2, every partition: botocore 1.44.8 ``data/endpoints.json`` as
# ``Session.get_available_regions("ec2", partition_name=p)`` lists them (tests/test_config_inputs.py
# compares with the installed botocore). A region AWS opens later is added here.
AWS_REGIONS: tuple[str, ...] = (
    "af-south-1", "ap-east-1", "ap-east-2", "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-south-1",
    "ap-south-2", "ap-southeast-1", "ap-southeast-2", "ap-southeast-3", "ap-southeast-4", "ap-southeast-5",
    "ap-southeast-6", "ap-southeast-7", "ca-central-1", "ca-west-1", "eu-central-1", "eu-central-2", "eu-north-1",
    "eu-south-1", "eu-south-2", "eu-west-1", "eu-west-2", "eu-west-3", "il-central-1", "me-central-1", "me-south-1",
    "mx-central-1", "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
    "cn-north-1", "cn-northwest-1", "us-gov-east-1", "us-gov-west-1",
    "us-iso-east-1", "us-iso-west-1", "us-isob-east-1", "us-isob-west-1", "eu-isoe-west-1", "us-isof-east-1",
    "us-isof-south-1", "eusc-de-east-1",
)

# EC2 On-Demand vCPU quotas (Service Quotas, service code "ec2"), keyed by the instance family
# letter the quota covers. Instances launched into an ODCR count against these quotas.
# Source: AWS Service Quotas console, "Running On-Demand P instances" (L-417A185B).
EC2_ON_DEMAND_VCPU_QUOTAS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {"p": ("L-417A185B", "Running On-Demand P instances")}
)


def ec2_vcpu_quota(instance_type: str) -> tuple[str, str] | None:
    """``(quota_code, quota_name)`` of the On-Demand vCPU quota covering ``instance_type``
    (e.g. ``p6-b300.48xlarge`` -> the P-instance quota), or None when not recorded here."""
    # The quota groups families by their leading letters: "p6-b300", "p6e-gb300" -> "p".
    letters = re.match(r"[a-z]*", instance_type.lower())
    return EC2_ON_DEMAND_VCPU_QUOTAS.get(letters.group(0) if letters else "")


# A Local Zone name: the parent region, the zone group's location code and a letter
# (``us-east-1-dfw-2a``); AZ names end in a letter right after the region (``us-east-1a``).
_LOCAL_ZONE_RE = re.compile(r"^(?P<region>[a-z]{2}(-[a-z]+)+-\d)-[a-z]+-\d[a-z]$")


def is_local_zone(zone: str | None) -> bool:
    """Whether ``zone`` is named like a Local Zone (``us-east-1-dfw-2a``) rather than an AZ.

    The name is the plan's offline guess; preflight confirms it with ``ZoneType`` from EC2
    DescribeAvailabilityZones (``local-zone`` vs ``availability-zone``). P6e UltraServer
    capacity blocks have been sold in Local Zones (e.g. Dallas ``us-east-1-dfw-2a``).
    """
    return bool(zone and _LOCAL_ZONE_RE.match(zone))



@dataclass(frozen=True)
class StagingInstance:
    """The CPU instance that publishes the mirror in a ``phase: stage`` of ``aws-ec2``
    (``components/aws/stager.py``): sized for the hub download's network and the publish's staging disk.

    Attributes:
        instance_type: the EC2 type.
        cpu_architecture: ``x86_64`` or ``arm64`` (its AMI).
        vcpus: vCPUs (sha256 + CRC of every byte, one worker per file in flight).
        network_gbps: baseline network bandwidth (not the burst "up to" figure).
        network_source: where ``network_gbps`` comes from.
        nvme_bytes: instance-store NVMe (the publish's staging disk: workers x largest shard).
        usd_per_hour: on-demand price in ``price_region``; price_source: where it comes from.
        price_region: the price's region.
    """

    instance_type: str
    cpu_architecture: str
    vcpus: int
    network_gbps: float
    network_source: str
    nvme_bytes: int
    usd_per_hour: float
    price_source: str
    price_region: str


# m6idn.4xlarge: its 25 Gbps baseline x time_inputs.S3_ACHIEVABLE_FRACTION (~2.0 GB/s) carries the
# measured hub download (time_inputs.HUB_DOWNLOAD_BYTES_PER_SECOND, 1.62 GB/s) in and the same out to
# S3 (ENA is full duplex); its 950 GB instance store holds 16 workers x ~14 GB shards with room; 16
# vCPUs hash both streams. The cheapest current-generation type with local NVMe whose baseline
# carries that rate (m6idn.2xlarge: 12.5 Gbps = 1.56 GB/s raw; a c6id.2xlarge, 3.125 Gbps, ~250 MB/s
# achieved, would cap the download at a sixth of the measurement).
STAGING_INSTANCE = StagingInstance(
    instance_type="m6idn.4xlarge",
    cpu_architecture="x86_64",
    vcpus=16,
    network_gbps=25.0,
    network_source="EC2 DescribeInstanceTypes (moto 5 data): m6idn.4xlarge BaselineBandwidthInGbps 25, 'Up to 50 Gigabit'",
    nvme_bytes=950 * GB,
    usd_per_hour=PRICES["m6idn.4xlarge"].usd,
    price_source=f"{PRICES['m6idn.4xlarge'].source}, {PRICES['m6idn.4xlarge'].date}",
    price_region=PRICES["m6idn.4xlarge"].region,
)

"""FSx for Lustre facts: valid capacities, throughput tiers and metadata IOPS.

Source: Amazon FSx for Lustre user guide (storage capacity, throughput and metadata
configuration: https://docs.aws.amazon.com/fsx/latest/LustreGuide/). moto accepts sizes AWS rejects,
so these rules are enforced here and tested on their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .targets import GIB

DEPLOYMENT_TYPES: tuple[str, ...] = ("SCRATCH_2", "PERSISTENT_1", "PERSISTENT_2")

# SSD capacity: 1,200 GiB, 2,400 GiB, then steps of 2,400 GiB (SCRATCH_2, PERSISTENT_1/2).
FIRST_CAPACITIES_GIB: tuple[int, ...] = (1_200, 2_400)
CAPACITY_STEP_GIB = 2_400

# Throughput per TiB of storage, MB/s.
THROUGHPUT_PER_TIB_MBPS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        "PERSISTENT_1": (50, 100, 200),
        "PERSISTENT_2": (125, 250, 500, 1000),
        # SCRATCH_2 has a fixed baseline of 200 MB/s per TiB and takes no throughput setting.
        "SCRATCH_2": (200,),
    }
)

# PERSISTENT_2 metadata configuration, USER_PROVISIONED mode: 1500/3000/6000/12000, then
# multiples of 12000 (up to 192000).
METADATA_IOPS_SMALL: tuple[int, ...] = (1_500, 3_000, 6_000, 12_000)
METADATA_IOPS_STEP = 12_000
METADATA_IOPS_MAX = 192_000

# Data repository associations per file system.
MAX_DATA_REPOSITORY_ASSOCIATIONS = 8

# How long a reader of the file system waits for the automatic import of the S3 mirror to produce
# a file the mirror's manifest lists (the node copy of nvme-from-fsx: weight_sync
# --source-wait-seconds), by default. Estimate: AWS documents no bound on auto-import latency
# ("Automatically import updates from your S3 bucket" describes an event-driven, asynchronous
# import); storage.fsx.importWaitSeconds sets a measured value, up to MAX_IMPORT_WAIT_SECONDS.
IMPORT_WAIT_SECONDS = 1_800
MAX_IMPORT_WAIT_SECONDS = 86_400


def is_valid_capacity_gib(capacity_gib: int) -> bool:
    """Whether ``capacity_gib`` is a size FSx for Lustre SSD file systems accept."""
    return capacity_gib in FIRST_CAPACITIES_GIB or (
        capacity_gib > 0 and capacity_gib % CAPACITY_STEP_GIB == 0
    )


def round_up_capacity_gib(needed_gib: float) -> int:
    """Smallest valid FSx capacity in GiB that holds ``needed_gib``.

    Raises:
        ValueError: ``needed_gib`` is not positive.
    """
    if needed_gib <= 0:
        raise ValueError(f"needed capacity must be positive, got {needed_gib} GiB")
    for size in FIRST_CAPACITIES_GIB:
        if needed_gib <= size:
            return size
    steps = -(-needed_gib // CAPACITY_STEP_GIB)
    return int(steps * CAPACITY_STEP_GIB)


def is_valid_metadata_iops(iops: int) -> bool:
    """Whether ``iops`` is a valid USER_PROVISIONED metadata IOPS value for PERSISTENT_2."""
    return iops in METADATA_IOPS_SMALL or (
        iops % METADATA_IOPS_STEP == 0 and METADATA_IOPS_STEP <= iops <= METADATA_IOPS_MAX
    )


# A storage.fsx.capacityGib above this multiple of the size the weights need (fsx_capacity_gib) is
# warned with what the surplus adds per hour: a larger file system also reads faster (capacity x
# tier), so a few times the need can be deliberate; a judgement, not a published figure.
FSX_OVERSIZE_FACTOR = 4


def fsx_capacity_gib(weights_bytes: int, headroom_fraction: float) -> int:
    """Smallest valid FSx for Lustre capacity (GiB) holding the weights plus headroom.

    1.56 TB = 1,453 GiB; with 10 % headroom 1,598 GiB -> 2,400 GiB (FSx for Lustre capacity steps:
    https://docs.aws.amazon.com/fsx/latest/LustreGuide/managing-storage-capacity.html).
    """
    return round_up_capacity_gib(weights_bytes * (1 + headroom_fraction) / GIB)


def fsx_read_bytes_per_second(capacity_gib: int, throughput_per_tib_mbps: int) -> int:
    """Aggregate FSx read throughput in bytes/s: capacity (TiB) x tier (MB/s per TiB).

    2,400 GiB at 1,000 MB/s/TiB = 2.34 GB/s (about 11 minutes for 1.56 TB).
    """
    return int(capacity_gib / 1024 * throughput_per_tib_mbps * 1e6)

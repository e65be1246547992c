"""EC2 Capacity Blocks for ML: how much of a block's time the cloud really gives.

A capacity block has an end time (``EndDate`` of DescribeCapacityReservations,
``compute.capacity.endsAt`` in config), but its instances do not run until then:

- "Amazon EC2 will terminate any instances that are still running 30 minutes before the end time
  of the Capacity Block" (EC2 Auto Scaling user guide, "Use Capacity Blocks for machine learning
  workloads": https://docs.aws.amazon.com/autoscaling/ec2/userguide/launch-template-capacity-blocks.html).
- "Forty minutes before your Capacity Block reservation ends, you receive another EventBridge event
  that tells you that any instances running in the reservation will begin to terminate in 10
  minutes" (EC2 user guide, "Monitor Capacity Blocks using EventBridge":
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html).

So a block is usable until its end minus ``CAPACITY_BLOCK_TERMINATION_SECONDS``; the config check
(``config.compute.check_capacity_block_end``) and preflight's ``capacity-end`` /
``capacity-ready`` checks compare that moment, never the end itself, with the stack's expiry and
the modelled time to ready. Pure data and arithmetic (no Pulumi, no boto3).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

# Instances in a capacity block are terminated from this long before the block's end.
CAPACITY_BLOCK_TERMINATION_SECONDS = 30 * 60
# EventBridge's "Capacity Block Expiration Warning" arrives this long before the block's end.
CAPACITY_BLOCK_WARNING_SECONDS = 40 * 60
CAPACITY_BLOCK_SOURCE = (
    "AWS terminates capacity-block instances 30 min before the block's end (EventBridge warns at 40 min: "
    "docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-monitor.html)"
)


def usable_until(end: datetime) -> datetime:
    """When a capacity block ending at ``end`` stops running instances: ``end`` minus
    ``CAPACITY_BLOCK_TERMINATION_SECONDS`` (aware UTC; a naive ``end`` is read as UTC)."""
    end = end if end.tzinfo else end.replace(tzinfo=UTC)
    return end.astimezone(UTC) - timedelta(seconds=CAPACITY_BLOCK_TERMINATION_SECONDS)

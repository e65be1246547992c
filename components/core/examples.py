"""Example values shipped in ``stacks/Pulumi.*.yaml`` that a user must replace with their own.

They are syntactically valid (so the example stacks plan), but deploying them fails or pulls the
wrong weights: the example commit pin is not a real revision of the model, the reservation ids
are not the user's capacity, and the EKS API source is a documentation range no machine has.
Each one still in place is a blocker (``spec.every_phase_blockers``): the offline plan renders
and marks the stack refused, and `pulumi up` (every phase) refuses it before any resource is
declared, so a placeholder never half-deploys a stack (a VPC, NAT, EKS and FSx built, then a GPU
node group that fails on a reservation that is not the user's while theirs bills). The API source
is worded by ``config.network.api_server_blockers`` (it also refuses any documentation range);
``example_value_blockers`` words the others. This is the only list of them (tests check each one
still appears in a shipped stack file, so the list cannot go stale).
"""

from __future__ import annotations

from collections.abc import Mapping

from .errors import ConfigError

# config key (without namespace) -> (example value, what to put there instead)
SHIPPED_EXAMPLE_VALUES: Mapping[str, Mapping[str, str]] = {
    "model.revision": {
        "4f1e2d3c5b6a79880716253443526170819a0b1c": "the commit your trial's weight sync recorded (`revision` in "
                                                    ".weights-complete.json)",
    },
    "network.apiServerPublicCidrs": {
        "203.0.113.0/24": "the egress address of the machine that runs `pulumi up` and of your CI runner",
    },
    "compute.capacity.reservationId": {
        "cr-0123456789abcdef0": "your capacity block's reservation id (aws ec2 describe-capacity-reservations)",
        "cr-0a1b2c3d4e5f60718": "your on-demand capacity reservation's id (aws ec2 describe-capacity-reservations)",
    },
}


def example_value_blockers(values: Mapping[str, str | None]) -> list[ConfigError]:
    """One ``ConfigError`` per config value that is still a shipped example.

    Args:
        values: config key (``model.revision``) -> the value in use (None when unset).

    Returns:
        ``[ConfigError("kimi-deploy:model.revision: '4f1e...' is the example value shipped in
        stacks/: replace it with ... before `pulumi up`")]``, in the order of ``values``; empty
        when none is an example.
    """
    out = []
    for key, value in values.items():
        replacement = SHIPPED_EXAMPLE_VALUES.get(key, {}).get(value or "")
        if replacement:
            out.append(ConfigError(
                key, value, f"is the example value shipped in stacks/: replace it with {replacement} before `pulumi up`"
            ))
    return out

"""AWS infrastructure (issue 3). Being built."""
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AwsResult:
    outputs: dict[str, Any] = field(default_factory=dict)


def declare_aws(ctx):
    return AwsResult()

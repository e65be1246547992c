"""Kubernetes workloads (issue 4). Being built."""
from dataclasses import dataclass, field
from typing import Any


@dataclass
class K8sResult:
    outputs: dict[str, Any] = field(default_factory=dict)


def declare_workloads(ctx, aws_result):
    return K8sResult()

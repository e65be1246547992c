"""What every component receives: ``DeploymentContext``, built by ``components/program.py``.

The program (``program.build_context``) makes it and hands it to the platform's declare function
and to the Kubernetes edge; the edges (``components/aws``, ``components/k8s``) import the type from
here, never from the program, so the import graph runs one way: program -> edges -> context ->
core. Nothing here declares a resource.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pulumi

from components.core.config import DeploymentSpec
from components.core.sizing import Sizing
from components.core.vllm import VllmCommand


@dataclass
class DeploymentContext:
    """What every component receives: the validated spec and its derived values, plus secrets.

    Attributes:
        spec: the deployment spec (pure data).
        sizing: its sizing.
        vllm: the serving command of one model copy.
        tags: tags for every taggable resource (``expires-at`` included when the stack expires;
            it may be an Output: the trial expiry is fixed when the stack is first created).
        expires_at: the expiry as an RFC 3339 string Output, or None when the stack does not expire.
        hub_token: the hub token (secret Output), or None when not configured.
        api_key: the vLLM API key (secret Output): configured, or generated once and kept.
        kubeconfig: the kubeconfig of an existing cluster (secret Output), or None.
        now: the clock used for this run (UTC).
    """

    spec: DeploymentSpec
    sizing: Sizing
    vllm: VllmCommand
    tags: dict[str, Any]
    expires_at: pulumi.Output[str] | None
    hub_token: pulumi.Output[str] | None
    api_key: pulumi.Output[str]
    kubeconfig: pulumi.Output[str] | None
    now: datetime
    exports: dict[str, Any] = field(default_factory=dict)

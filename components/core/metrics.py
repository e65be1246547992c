"""Metric names the autoscaler, the dashboard and the alerts read, with where each comes from, and
the PromQL built over them. Pure: no Pulumi import.

Sources (re-check on every version bump; ``tests/test_observability.py`` reads the first one):
- vLLM: ``vllm/v1/metrics/loggers.py`` of the pinned wheel (``VLLM_VERSION``). Labels
  ``model_name`` (the served model name) and ``engine``. prometheus_client appends ``_total`` to
  counters and ``_bucket``/``_sum``/``_count`` to histograms in the exposition.
- NVIDIA DCGM exporter 4.8.2, ``etc/default-counters.csv``: ``DCGM_FI_DEV_GPU_UTIL`` (%),
  ``DCGM_FI_DEV_FB_USED``/``DCGM_FI_DEV_FB_FREE`` (MiB), ``DCGM_FI_DEV_XID_ERRORS`` (last XID).
  With ``honorLabels`` its ``namespace``/``pod`` labels name the pod that holds the GPU.
- AMD device metrics exporter v1.5.4, ``docs/configuration/metricslist.md`` (exposed in lower
  case): ``gpu_gfx_activity`` (%), ``gpu_used_vram``/``gpu_total_vram`` (MB),
  ``gpu_ecc_uncorrect_total``.
- kube-state-metrics (``docs/metrics/workload/pod-metrics.md``, ``job-metrics.md``): pod readiness
  and creation time, Job status. Installed with every kube-prometheus-stack; not by this toolkit.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- vLLM (vllm/v1/metrics/loggers.py) -------------------------------------------------------------
VLLM_NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # a fraction 0..1 despite the name
VLLM_TTFT = "vllm:time_to_first_token_seconds"  # histogram
VLLM_ITL = "vllm:inter_token_latency_seconds"  # histogram
VLLM_E2E_LATENCY = "vllm:e2e_request_latency_seconds"  # histogram
VLLM_GENERATION_TOKENS = "vllm:generation_tokens"  # counter
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens"  # counter
VLLM_REQUEST_SUCCESS = "vllm:request_success"  # counter
VLLM_NUM_PREEMPTIONS = "vllm:num_preemptions"  # counter

# Registered names (as in loggers.py) -> exposition kind.
VLLM_METRICS: dict[str, str] = {
    VLLM_NUM_REQUESTS_WAITING: "gauge",
    VLLM_NUM_REQUESTS_RUNNING: "gauge",
    VLLM_KV_CACHE_USAGE: "gauge",
    VLLM_TTFT: "histogram",
    VLLM_ITL: "histogram",
    VLLM_E2E_LATENCY: "histogram",
    VLLM_GENERATION_TOKENS: "counter",
    VLLM_PROMPT_TOKENS: "counter",
    VLLM_REQUEST_SUCCESS: "counter",
    VLLM_NUM_PREEMPTIONS: "counter",
}

# -- GPU exporters -----------------------------------------------------------------------------------
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
AMD_GFX_ACTIVITY = "gpu_gfx_activity"
AMD_USED_VRAM = "gpu_used_vram"
AMD_TOTAL_VRAM = "gpu_total_vram"
AMD_ECC_UNCORRECTABLE = "gpu_ecc_uncorrect_total"
# Exporter add-on (components/core/versions.py HELM_CHARTS) -> the names it exports that we use.
GPU_EXPORTER_METRICS: dict[str, frozenset[str]] = {
    "dcgm-exporter": frozenset({DCGM_GPU_UTIL, DCGM_FB_USED, DCGM_FB_FREE, DCGM_XID_ERRORS}),
    "amd-metrics-exporter": frozenset({AMD_GFX_ACTIVITY, AMD_USED_VRAM, AMD_TOTAL_VRAM, AMD_ECC_UNCORRECTABLE}),
}

# -- kube-state-metrics ------------------------------------------------------------------------------
KSM_POD_CREATED = "kube_pod_created"
KSM_POD_STATUS_READY = "kube_pod_status_ready"
KSM_POD_INFO = "kube_pod_info"
KSM_JOB_FAILED = "kube_job_status_failed"
KSM_JOB_ACTIVE = "kube_job_status_active"
KSM_JOB_START_TIME = "kube_job_status_start_time"
KSM_METRICS = frozenset({KSM_POD_CREATED, KSM_POD_STATUS_READY, KSM_POD_INFO, KSM_JOB_FAILED, KSM_JOB_ACTIVE, KSM_JOB_START_TIME})

# Subquery resolution of the scaling queries, seconds (the scaler polls every 30 s).
SUBQUERY_STEP_SECONDS = 30


def gpu_exporter_for(vendor: str) -> str:
    """The exporter add-on of a GPU vendor (``nvidia`` or ``amd``).

    Raises:
        KeyError: unknown vendor.
    """
    return {"nvidia": "dcgm-exporter", "amd": "amd-metrics-exporter"}[vendor]


def vllm_selector(namespace: str, served_model_name: str) -> str:
    """Label matchers of this deployment's vLLM series: its namespace (added by the scrape) and
    ``model_name`` (added by vLLM itself). E.g. ``namespace="kimi",model_name="kimi-k3.1-pro"``."""
    return f'namespace="{namespace}",model_name="{served_model_name}"'


@dataclass(frozen=True)
class ScalingQueries:
    """The PromQL of each scaling signal; each returns one sample (cluster-wide for the deployment).

    Every query takes the maximum over the scale-down delay (a subquery), so a rise shows at once
    (scale-up reacts on the next poll) and a fall shows only after the whole delay (scale-down
    waits longer than a new replica takes to start).

    Attributes:
        queue: requests waiting, summed over replicas (target: waiting requests per replica).
        kv_cache: KV-cache usage fractions summed over replicas (target: fraction per replica).
        busy_replicas: replicas with at least one running request (target 1: never fewer
            replicas than are serving requests).
    """

    queue: str
    kv_cache: str
    busy_replicas: str


def scaling_queries(namespace: str, served_model_name: str, hold_seconds: int) -> ScalingQueries:
    """The scaling queries of a deployment; ``hold_seconds`` is the scale-down delay.

    Raises:
        ValueError: ``hold_seconds`` below one subquery step.
    """
    if hold_seconds < SUBQUERY_STEP_SECONDS:
        raise ValueError(f"hold_seconds must be at least {SUBQUERY_STEP_SECONDS}, got {hold_seconds}")
    sel = vllm_selector(namespace, served_model_name)
    window = f"[{hold_seconds}s:{SUBQUERY_STEP_SECONDS}s]"
    return ScalingQueries(
        queue=f"max_over_time((sum({VLLM_NUM_REQUESTS_WAITING}{{{sel}}}) or vector(0)){window})",
        kv_cache=f"max_over_time((sum({VLLM_KV_CACHE_USAGE}{{{sel}}}) or vector(0)){window})",
        busy_replicas=f"max_over_time((count({VLLM_NUM_REQUESTS_RUNNING}{{{sel}}} > 0) or vector(0)){window})",
    )


def exposition_names(name: str, kind: str) -> tuple[str, ...]:
    """The series names a registered metric appears under (prometheus_client conventions)."""
    if kind == "counter":
        return (name + "_total", name + "_created")
    if kind == "histogram":
        return (name + "_bucket", name + "_sum", name + "_count", name + "_created")
    return (name,)


def known_series_names() -> frozenset[str]:
    """Every series name the pinned engine, the GPU exporters and kube-state-metrics export
    (as far as this module uses them), plus Prometheus' own ``up``."""
    names: set[str] = {"up"}
    for name, kind in VLLM_METRICS.items():
        names.update(exposition_names(name, kind))
    for exported in GPU_EXPORTER_METRICS.values():
        names.update(exported)
    names.update(KSM_METRICS)
    return frozenset(names)

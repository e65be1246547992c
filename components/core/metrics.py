"""Metric names the autoscaler, the dashboard and the alerts read, with where each comes from, and
the PromQL built over them. Pure: no Pulumi import.

Sources (re-check on every version bump; ``tests/test_observability.py`` reads the first one):
- vLLM: ``vllm/v1/metrics/loggers.py`` of the pinned wheel (``VLLM_VERSION``). Labels
  ``model_name`` (the served model name) and ``engine``. prometheus_client appends ``_total`` to
  counters and ``_bucket``/``_sum``/``_count`` to histograms in the exposition.
- NVIDIA DCGM exporter 4.8.2 (image 4.5.3-4.8.2), ``etc/default-counters.csv`` (the chart's
  default ``-f``): ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_FB_USED``/``DCGM_FI_DEV_FB_FREE``
  (MiB), ``DCGM_FI_DEV_XID_ERRORS`` ("Value of the last XID error encountered": it keeps that
  value after recovery; the per-event ``DCGM_EXP_XID_ERRORS_COUNT`` is commented out there).
  With ``honorLabels`` its ``namespace``/``pod`` labels name the pod that holds the GPU.
- AMD device metrics exporter v1.5.4, ``docs/configuration/metricslist.md`` (exposed in lower
  case): ``gpu_gfx_activity`` (%), ``gpu_used_vram``/``gpu_total_vram`` (MB),
  ``gpu_ecc_uncorrect_total`` (a counter). ``docs/configuration/configmap.md``: the labels
  ``pod``, ``namespace``, ``container`` are always set (the pod holding the GPU).
- kube-state-metrics (``docs/metrics/workload/pod-metrics.md``, ``job-metrics.md``,
  ``deployment-metrics.md``, ``statefulset-metrics.md``): pod readiness and creation time, Job
  status and Failed condition, the workloads' replica counts. Installed with every
  kube-prometheus-stack; not by this toolkit. ``kube_pod_status_initialized_time`` (EXPERIMENTAL in
  ``pod-metrics.md``, read 2026-12-07) is the pod's Initialized condition time: when its last init
  container finished.
- The weight sync (``scripts/node/weight_sync/metrics.py``): its bytes moved, on ``/metrics`` of the
  port named ``SYNC_METRICS_PORT_NAME`` while it runs (the init container and the sync Jobs).
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
KSM_POD_START_TIME = "kube_pod_start_time"  # when the kubelet acknowledged the pod (after scheduling)
KSM_POD_INITIALIZED_TIME = "kube_pod_status_initialized_time"  # when its init containers finished (unix s)
KSM_INIT_CONTAINER_RUNNING = "kube_pod_init_container_status_running"
KSM_INIT_CONTAINER_RESTARTS = "kube_pod_init_container_status_restarts_total"
KSM_INIT_CONTAINER_TERMINATED_REASON = "kube_pod_init_container_status_terminated_reason"  # label reason
KSM_JOB_STATUS_FAILED = "kube_job_status_failed"  # failed pods so far (retries included)
KSM_JOB_FAILED_CONDITION = "kube_job_failed"  # the Job's Failed condition (label condition=true|false|unknown)
KSM_JOB_ACTIVE = "kube_job_status_active"
KSM_JOB_START_TIME = "kube_job_status_start_time"
KSM_DEPLOYMENT_SPEC_REPLICAS = "kube_deployment_spec_replicas"
KSM_STATEFULSET_REPLICAS = "kube_statefulset_replicas"
KSM_METRICS = frozenset({
    KSM_POD_CREATED, KSM_POD_STATUS_READY, KSM_POD_INFO, KSM_POD_START_TIME, KSM_POD_INITIALIZED_TIME,
    KSM_INIT_CONTAINER_RUNNING,
    KSM_INIT_CONTAINER_RESTARTS, KSM_INIT_CONTAINER_TERMINATED_REASON, KSM_JOB_STATUS_FAILED, KSM_JOB_FAILED_CONDITION,
    KSM_JOB_ACTIVE,
    KSM_JOB_START_TIME, KSM_DEPLOYMENT_SPEC_REPLICAS, KSM_STATEFULSET_REPLICAS,
})

# -- the weight sync (scripts/node/weight_sync/metrics.py; a test keeps the names equal) ------------
SYNC_TRANSFERRED_BYTES = "kimi_weight_sync_transferred_bytes_total"  # counter, bytes moved by this process
SYNC_PLANNED_BYTES = "kimi_weight_sync_planned_bytes"  # gauge, bytes the process set out to move
SYNC_METRICS = frozenset({SYNC_TRANSFERRED_BYTES, SYNC_PLANNED_BYTES})
# The environment variable that turns the sync's /metrics on, its port (a free port of the pod:
# vLLM serves on 8000 in its own container) and the port's name the PodMonitor scrapes.
SYNC_METRICS_PORT_ENV = "KIMI_SYNC_METRICS_PORT"
SYNC_METRICS_PORT = 9465
SYNC_METRICS_PORT_NAME = "sync-metrics"

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


def serving_pod_regex(workload_name: str, multi_node: bool) -> str:
    """Pod names of the serving vLLM pods (the ones with ``/metrics``): LeaderWorkerSet leaders
    ``<name>-<group>`` (workers are ``<name>-<group>-<index>``); Deployment pods
    ``<name>-<replicaset hash>-<suffix>``."""
    return f"{workload_name}-[0-9]+" if multi_node else f"{workload_name}-[a-z0-9]+-[a-z0-9]+"


def vllm_pod_regex(workload_name: str, multi_node: bool) -> str:
    """Pod names of every vLLM pod of the workload: the serving pods (``serving_pod_regex``) and,
    for a LeaderWorkerSet, its workers ``<name>-<group>-<index>`` (each runs the node-local copy)."""
    return f"{workload_name}-[0-9]+(-[0-9]+)?" if multi_node else serving_pod_regex(workload_name, False)


def workload_replicas_selector(namespace: str, workload_name: str, multi_node: bool) -> str:
    """kube-state-metrics' desired replica count of the scaled workload: the Deployment's
    ``kube_deployment_spec_replicas``, or for a LeaderWorkerSet the ``kube_statefulset_replicas``
    of its leader StatefulSet, which the LWS controller names after the LeaderWorkerSet and sizes to
    its replicas (kubernetes-sigs/lws ``test/testutils/validators.go`` ExpectLeaderSetExist).
    kube-state-metrics does not export LeaderWorkerSets themselves."""
    if multi_node:
        return f'{KSM_STATEFULSET_REPLICAS}{{namespace="{namespace}",statefulset="{workload_name}"}}'
    return f'{KSM_DEPLOYMENT_SPEC_REPLICAS}{{namespace="{namespace}",deployment="{workload_name}"}}'


@dataclass(frozen=True)
class ScalingQueries:
    """The PromQL of each scaling signal; each returns one sample (cluster-wide for the deployment)
    or nothing, which the scaler must treat as an error (KEDA: ``ignoreNullValues: "false"``).

    Every query takes the maximum over the scale-down delay (a subquery), so a rise shows at once
    (scale-up reacts on the next poll) and a fall shows only after the whole delay (scale-down
    waits longer than a new replica takes to start).

    What each returns, by state (``tests/test_prometheus_rules.py`` evaluates every one in promtool):
    - demand or idle: the value (0 when idle);
    - zero replicas (outside the serving windows): 0, because kube-state-metrics shows the scaled
      workload at 0 replicas (``zero_replicas``); no vLLM series exist then, and an error here
      would make KEDA's fallback scale the workload back up (a failing trigger counts as active);
    - a new replica loading: the held 0 (its pod is not ready, it has no series yet);
    - a lost scrape: nothing, at once when a ready serving pod (kube-state-metrics) has no vLLM
      series (``scrape_lost``: the sum would undercount), else once the hold has passed;
    - nothing readable at all (neither vLLM nor kube-state-metrics): nothing.

    Attributes:
        queue: requests waiting, summed over replicas (target: waiting requests per replica).
        kv_cache: KV-cache usage fractions summed over replicas (target: fraction per replica).
        busy_replicas: replicas with at least one running request (target 1: never fewer
            replicas than are serving requests).
        zero_replicas: 0 while the scaled workload is at zero replicas, else nothing.
        scrape_lost: a sample while a ready serving pod has no vLLM series, else nothing.
    """

    queue: str
    kv_cache: str
    busy_replicas: str
    zero_replicas: str
    scrape_lost: str


def scaling_queries(
    namespace: str, served_model_name: str, hold_seconds: int, *, workload_name: str, multi_node: bool
) -> ScalingQueries:
    """The scaling queries of a deployment; ``hold_seconds`` is the scale-down delay;
    ``workload_name``/``multi_node`` name the scaled Deployment or LeaderWorkerSet.

    Raises:
        ValueError: ``hold_seconds`` below one subquery step.
    """
    if hold_seconds < SUBQUERY_STEP_SECONDS:
        raise ValueError(f"hold_seconds must be at least {SUBQUERY_STEP_SECONDS}, got {hold_seconds}")
    sel = vllm_selector(namespace, served_model_name)
    pods = f'namespace="{namespace}",pod=~"{serving_pod_regex(workload_name, multi_node)}"'
    window = f"[{hold_seconds}s:{SUBQUERY_STEP_SECONDS}s]"
    zero = f"sum({workload_replicas_selector(namespace, workload_name, multi_node)} == 0)"
    lost = (
        f'count({KSM_POD_STATUS_READY}{{{pods},condition="true"}} == 1'
        f" unless on(namespace, pod) {VLLM_NUM_REQUESTS_RUNNING}{{{sel}}}) > 0"
    )

    def held(signal: str) -> str:
        return f"max_over_time(({signal} or {zero}){window}) unless on() ({lost})"

    return ScalingQueries(
        queue=held(f"sum({VLLM_NUM_REQUESTS_WAITING}{{{sel}}})"),
        kv_cache=held(f"sum({VLLM_KV_CACHE_USAGE}{{{sel}}})"),
        busy_replicas=held(f"sum({VLLM_NUM_REQUESTS_RUNNING}{{{sel}}} > bool 0)"),
        zero_replicas=zero,
        scrape_lost=lost,
    )


def exposition_names(name: str, kind: str) -> tuple[str, ...]:
    """The series names a registered metric appears under (prometheus_client conventions)."""
    if kind == "counter":
        return (name + "_total", name + "_created")
    if kind == "histogram":
        return (name + "_bucket", name + "_sum", name + "_count", name + "_created")
    return (name,)


def known_series_names() -> frozenset[str]:
    """Every series name the pinned engine, the GPU exporters, kube-state-metrics and the weight
    sync export (as far as this module uses them), plus Prometheus' own ``up``."""
    names: set[str] = {"up"}
    for name, kind in VLLM_METRICS.items():
        names.update(exposition_names(name, kind))
    for exported in GPU_EXPORTER_METRICS.values():
        names.update(exported)
    names.update(KSM_METRICS)
    names.update(SYNC_METRICS)
    return frozenset(names)

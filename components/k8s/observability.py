"""Observability of the vLLM deployment (``kimi-deploy:observability``): a Grafana dashboard and
Prometheus alerts.

- Dashboard: ``components/k8s/dashboards/kimi-vllm.json`` (the file is generated from
  ``dashboard()`` by ``scripts/dev/render_dashboard.py``; a test keeps them equal). With
  ``observability.grafanaNamespace`` it is declared as a ConfigMap there, labelled
  ``grafana_dashboard: "1"``, the label the Grafana sidecar of the grafana and
  kube-prometheus-stack charts watches by default (``sidecar.dashboards.label``). Its variables
  (data source, namespace, model name) make one file serve every stack and vendor: the GPU panels
  query both the DCGM and the AMD exporter names and show whichever exists, each limited to the
  GPUs of the chosen namespace (both exporters label a GPU with the pod that holds it).
- Alerts: a ``PrometheusRule`` (monitoring.coreos.com/v1) in the workload namespace when the
  Prometheus Operator is installed (``kubernetes.installedAddons: prometheus-operator``) and
  ``observability.alerts`` is true: no ready replica, queue growing, KV cache near full, weight
  sync failed or stalled (its bytes stopped moving: the sync serves them on ``/metrics``), a pod not
  ready a vLLM start budget after its init containers finished, GPU errors. Thresholds come from
  the sizing (startup budget, sync budgets) and config. ``observability.monitorLabels`` (e.g.
  ``release: kube-prometheus-stack``) go on it, the PodMonitor and the exporters' ServiceMonitors,
  so a Prometheus with a label selector picks them up.

Metric names and their sources: ``components/core/metrics.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.core import metrics as m
from components.core.config import DeploymentSpec
from components.core.sizing import Sizing, sync_budget_seconds
from components.core.time_to_ready import VLLM_START_PHASE, PodReadyBudget
from components.core.weights import SHAPE_BUCKET, SyncStep, sync_steps

from .common import VLLM_NAME, labels, metadata
from .weight_sync import NODE_COPY_CONTAINER, SYNC_RETRIES_PER_COMPLETION

DASHBOARD_PATH = Path(__file__).resolve().parent / "dashboards" / "kimi-vllm.json"
DASHBOARD_CONFIGMAP = "kimi-vllm-dashboard"
DASHBOARD_UID = "kimi-vllm"
# Label (and value) the Grafana dashboard sidecar selects ConfigMaps by (grafana chart default).
GRAFANA_DASHBOARD_LABEL = ("grafana_dashboard", "1")
# Weight-sync Job names start with this (components/k8s/weight_sync.py).
WEIGHT_SYNC_JOB_PREFIX = "kimi-weights-"
# A sync is "stalled" when its bytes moved (metrics.SYNC_TRANSFERRED_BYTES) have not grown for this
# long while it runs: five of the sync's own throughput windows (scripts/node/weight_sync/verify.py
# THROUGHPUT_WINDOW_SECONDS, 120 s), each longer than its largest retry backoff (retry.py, 30 s).
# A slow copy whose bytes still move never fires, however long it runs (its Job deadline and the
# pod's budget bound it).
SYNC_STALL_WINDOW_MINUTES = 10
# A pod whose init containers have finished (the weights are on its node) and is not ready this
# many vLLM start budgets later (PodReadyBudget's VLLM_START_PHASE: the startup budget + margin,
# what the startup probe allows before it restarts vLLM) counts as not starting: 1, so the alert
# comes when the probe has given up once, not after the worst case of every phase before it.
NOT_READY_START_BUDGETS = 1
KV_CACHE_ALERT_MINUTES = 5
NO_READY_ALERT_MINUTES = 5
# A GPU error alert fires on a new error and resolves this long after the last one.
GPU_ERROR_WINDOW_MINUTES = 10


# -- alerts ----------------------------------------------------------------------------------------


def serving_pod_regex(multi_node: bool) -> str:
    """Pod names of the serving vLLM pods (``metrics.serving_pod_regex`` of ``kimi-vllm``)."""
    return m.serving_pod_regex(VLLM_NAME, multi_node)


def vllm_pod_regex(multi_node: bool) -> str:
    """Pod names of every vLLM pod (serving pods and LeaderWorkerSet workers): ``metrics.vllm_pod_regex``."""
    return m.vllm_pod_regex(VLLM_NAME, multi_node)


def runs_in_pod(step: SyncStep) -> bool:
    """Whether a sync step runs as the ``weight-sync`` init container of every vLLM pod (the
    node-local copy) rather than as a Job (``weight_sync.declare_weight_sync`` makes the same cut)."""
    return step.name == "node-copy" and step.per_node


def after_init_seconds(budget: PodReadyBudget) -> int:
    """Seconds after a pod's init containers finished (``kube_pod_status_initialized_time``) at which
    a pod still not ready counts as not starting: ``NOT_READY_START_BUDGETS`` x the budget of its
    ``VLLM_START_PHASE`` (weight load + engine init; the same in every scenario)."""
    start = next(p for p in budget.phases if p.name == VLLM_START_PHASE)
    return int(NOT_READY_START_BUDGETS * start.budget_seconds)


def sync_stall_expr(selector: str) -> str:
    """PromQL: the sync series of ``selector`` whose bytes moved have not grown over
    ``SYNC_STALL_WINDOW_MINUTES`` and that existed that long ago (a sync that has just started is
    not judged on a partial window; ``increase`` survives a restarted container's reset to 0).
    A finished sync's target goes away with its container, and so does the alert."""
    window = f"{SYNC_STALL_WINDOW_MINUTES}m"
    moved = f"{m.SYNC_TRANSFERRED_BYTES}{{{selector}}}"
    return f"(increase({moved}[{window}]) == 0) and ({moved} offset {window})"


def alert_rules(spec: DeploymentSpec, sizing: Sizing, multi_node: bool, budget: PodReadyBudget) -> list[dict[str, Any]]:
    """The alerting rules (prometheus-operator ``Rule`` objects) of the deployment.

    ``budget``: the creation-to-ready budget of one vLLM pod (``time_to_ready.pod_ready_budget``:
    the phases that run on this platform, the init containers' copy and restore included), the
    same number as the Deployment's progress deadline and Pulumi's timeouts. Sync alerts watch
    what runs: Jobs for the steps that are Jobs (``runs_in_pod`` false), the ``weight-sync`` init
    container of the vLLM pods for the node-local copy; a rule with nothing to feed it is not rendered.
    """
    ns = spec.config.kubernetes.namespace
    obs = spec.config.observability
    sel = m.vllm_selector(ns, spec.served_model_name)
    pods = f'namespace="{ns}",pod=~"{serving_pod_regex(multi_node)}"'
    budget_s = budget.budget_seconds
    after_init = after_init_seconds(budget)
    initialized = f"{m.KSM_POD_INITIALIZED_TIME}{{{pods}}}"
    queue_minutes = obs.queue_alert_minutes
    rules: list[dict[str, Any]] = [
        {
            # An outage: pods exist, none is ready, and none is still within its phase's budget (a
            # pod past its init containers: after_init; one before: the whole creation-to-ready budget).
            "alert": "KimiVllmNoReadyReplica",
            "expr": (
                f"(count({m.KSM_POD_INFO}{{{pods}}}) > 0)"
                f" unless on() (count({m.KSM_POD_STATUS_READY}{{{pods},condition=\"true\"}} == 1) > 0)"
                f" unless on() (count((time() - {initialized}) < {after_init}) > 0)"
                f" unless on() (count(((time() - {m.KSM_POD_CREATED}{{{pods}}}) < {budget_s})"
                f" unless on(namespace, pod) {initialized}) > 0)"
            ),
            "for": f"{NO_READY_ALERT_MINUTES}m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": f"No vLLM replica of {spec.stack} is ready and none is still starting "
                f"(within {after_init} s of its init containers finishing, or {budget_s} s of its creation before that)",
                "description": f"Pods exist in namespace {ns} but none serves the model: the endpoint is down.",
            },
        },
        {
            "alert": "KimiVllmStartupOverBudget",
            "expr": (
                f"(((time() - {initialized}) > {after_init})"
                f" or (((time() - {m.KSM_POD_CREATED}{{{pods}}}) > {budget_s}) unless on(namespace, pod) {initialized}))"
                f" and on(namespace, pod) ({m.KSM_POD_STATUS_READY}{{{pods},condition=\"false\"}} == 1)"
            ),
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "vLLM pod {{ $labels.pod }} is not ready "
                + f"{after_init} s after its init containers finished (its vLLM start budget), "
                f"or {budget_s} s after creation while still initializing",
                "description": "The startup probe will restart it; check the weight copy, the load and `kubectl logs`.",
            },
        },
        {
            "alert": "KimiVllmQueueGrowing",
            "expr": (
                f"(sum({m.VLLM_NUM_REQUESTS_WAITING}{{{sel}}}) > 0)"
                f" and (deriv(sum({m.VLLM_NUM_REQUESTS_WAITING}{{{sel}}})[{queue_minutes}m:1m]) > 0)"
            ),
            "for": f"{queue_minutes}m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"vLLM request queue of {spec.stack} has grown for {queue_minutes} minutes",
                "description": "Demand exceeds the serving replicas; a scale-up takes the whole startup budget.",
            },
        },
        {
            "alert": "KimiVllmKvCacheNearFull",
            "expr": f"max({m.VLLM_KV_CACHE_USAGE}{{{sel}}}) > {obs.kv_cache_alert_fraction:g}",
            "for": f"{KV_CACHE_ALERT_MINUTES}m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"vLLM KV cache above {obs.kv_cache_alert_fraction:.0%} for {KV_CACHE_ALERT_MINUTES} minutes",
                "description": "Requests are preempted or queued; add replicas or lower max-model-len.",
            },
        },
    ]
    steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    job_steps = [s for s in steps if not runs_in_pod(s)]
    in_pod = [s for s in steps if runs_in_pod(s)]
    if job_steps:
        # The Job's Failed condition (retries exhausted or deadline passed), not its failed-pod
        # count: a pod that failed and was retried successfully leaves kube_job_status_failed > 0
        # on a Job that completed.
        rules.append({
            "alert": "KimiWeightSyncFailed",
            "expr": (
                f"max by (namespace, job_name) ({m.KSM_JOB_FAILED_CONDITION}"
                f'{{namespace="{ns}",job_name=~"{WEIGHT_SYNC_JOB_PREFIX}.*",condition="true"}}) == 1'
            ),
            "for": "1m",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "Weight-sync Job {{ $labels.job_name }} failed (retries exhausted or deadline passed)",
                "description": "Replicas wait for the weight-complete marker; `kubectl logs job/{{ $labels.job_name }}`.",
            },
        })
    window_s = SYNC_STALL_WINDOW_MINUTES * 60
    for step in job_steps:
        sync = f'namespace="{ns}",pod=~"{WEIGHT_SYNC_JOB_PREFIX}{step.name}-.*",container="{NODE_COPY_CONTAINER}"'
        rules.append({
            "alert": "KimiWeightSyncStalled",
            "expr": sync_stall_expr(sync),
            "labels": {"severity": "warning", "step": step.name},
            "annotations": {
                "summary": "Weight sync " + step.name + " in pod {{ $labels.pod }} has moved no byte for "
                f"{window_s} s (the Job gives up at {sync_budget_seconds(spec, sizing, step)} s)",
                "description": "Check the source's reachability and credentials: `kubectl logs {{ $labels.pod }}`.",
            },
        })
    if in_pod:
        step = in_pod[0]
        all_pods = f'namespace="{ns}",pod=~"{vllm_pod_regex(multi_node)}"'
        init = f'{all_pods},container="{NODE_COPY_CONTAINER}"'
        rules.append({
            # Every vLLM pod copies onto its own node before vLLM starts (weights follow the node):
            # a first deploy, a scale-up onto a new node, a replaced node. The copy serves its bytes
            # moved while it runs (metrics.SYNC_TRANSFERRED_BYTES): a slow copy is not a stalled one.
            "alert": "KimiWeightSyncStalled",
            "expr": sync_stall_expr(init),
            "labels": {"severity": "warning", "step": step.name},
            "annotations": {
                "summary": "The node-local weight copy of pod {{ $labels.pod }} has moved no byte for "
                f"{window_s} s (the pod's budget is {budget_s} s)",
                "description": "Check the source's reachability and credentials: `kubectl logs {{ $labels.pod }} -c "
                f"{NODE_COPY_CONTAINER} -f`.",
            },
        })
        rules.append({
            # An init container that fails is restarted in place (the copy resumes from its journal);
            # as many failures as a Job allows before it gives up is a failed copy. Resolves when
            # the copy completes or the pod is replaced.
            "alert": "KimiWeightSyncFailed",
            "expr": (
                f"(max by (namespace, pod) ({m.KSM_INIT_CONTAINER_RESTARTS}{{{init}}}) >= {SYNC_RETRIES_PER_COMPLETION})"
                f" unless on(namespace, pod) ({m.KSM_INIT_CONTAINER_TERMINATED_REASON}{{{init},reason=\"Completed\"}} == 1)"
            ),
            "for": "1m",
            "labels": {"severity": "critical", "step": step.name},
            "annotations": {
                "summary": "The node-local weight copy of pod {{ $labels.pod }} failed "
                f"{SYNC_RETRIES_PER_COMPLETION} times (a Job would have given up)",
                "description": "vLLM cannot start on this node; `kubectl logs {{ $labels.pod }} -c "
                f"{NODE_COPY_CONTAINER} --previous`.",
            },
        })
    window = f"{GPU_ERROR_WINDOW_MINUTES}m"
    gpus = f'namespace="{ns}"'  # the exporters label a GPU with the pod holding it (honorLabels)
    if spec.target.gpu.vendor == "amd":
        gpu_rule = {
            "alert": "KimiGpuUncorrectableEcc",
            "expr": f"increase({m.AMD_ECC_UNCORRECTABLE}{{{gpus}}}[{window}]) > 0",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "AMD GPU {{ $labels.gpu_id }} of {{ $labels.hostname }}: uncorrectable ECC errors "
                "(device metrics exporter)",
                "description": "A GPU serving the model reported uncorrectable ECC errors in the last "
                f"{GPU_ERROR_WINDOW_MINUTES} minutes; drain its node.",
            },
        }
    else:
        # DCGM_FI_DEV_XID_ERRORS is the last XID and keeps it after recovery: the alert fires when it
        # changes to a new XID and resolves GPU_ERROR_WINDOW_MINUTES later. A repeat of the same XID
        # value leaves the gauge unchanged and is not seen (dcgm-exporter's per-event
        # DCGM_EXP_XID_ERRORS_COUNT is off in its default counters).
        xid = f"{m.DCGM_XID_ERRORS}{{{gpus}}}"
        gpu_rule = {
            "alert": "KimiGpuXidError",
            "expr": f"({xid} > 0) and (changes({xid}[{window}]) > 0)",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "NVIDIA XID {{ $value }} on GPU {{ $labels.gpu }} of {{ $labels.Hostname }} (DCGM exporter)",
                "description": "A new XID error hit a GPU serving the model; see the NVIDIA XID catalog before restarting.",
            },
        }
    rules.append(gpu_rule)
    return rules


def prometheus_rule_spec(spec: DeploymentSpec, sizing: Sizing, multi_node: bool, budget: PodReadyBudget) -> dict[str, Any]:
    """The PrometheusRule ``spec``: one group of the deployment's alerts."""
    return {"groups": [{"name": f"kimi-vllm-{spec.stack}", "rules": alert_rules(spec, sizing, multi_node, budget)}]}


# -- dashboard -------------------------------------------------------------------------------------

_SEL = 'namespace="$namespace",model_name="$model_name"'


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": expr, "legendFormat": legend, "refId": ref}


def _panel(
    pid: int, title: str, kind: str, grid: tuple[int, int, int, int], unit: str, targets: list[tuple[str, str]]
) -> dict[str, Any]:
    x, y, w, h = grid
    return {
        "id": pid,
        "title": title,
        "type": kind,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
    }


def _quantiles(metric: str) -> list[tuple[str, str]]:
    return [
        (f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{_SEL}}}[5m])))", f"p{int(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ]


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard (JSON model, schemaVersion 39) of a vLLM deployment."""
    panels = [
        _panel(
            1, "Serving replicas", "stat", (0, 0, 4, 4), "none", [(f"count({m.VLLM_NUM_REQUESTS_RUNNING}{{{_SEL}}})", "replicas")]
        ),
        _panel(
            2, "Requests waiting", "stat", (4, 0, 4, 4), "none", [(f"sum({m.VLLM_NUM_REQUESTS_WAITING}{{{_SEL}}})", "waiting")]
        ),
        _panel(
            3, "Requests running", "stat", (8, 0, 4, 4), "none", [(f"sum({m.VLLM_NUM_REQUESTS_RUNNING}{{{_SEL}}})", "running")]
        ),
        _panel(
            4, "KV cache usage (max)", "stat", (12, 0, 4, 4), "percentunit", [(f"max({m.VLLM_KV_CACHE_USAGE}{{{_SEL}}})", "kv")]
        ),
        _panel(
            5,
            "Generation tokens/s",
            "stat",
            (16, 0, 4, 4),
            "none",
            [(f"sum(rate({m.VLLM_GENERATION_TOKENS}_total{{{_SEL}}}[5m]))", "tokens/s")],
        ),
        _panel(
            6,
            "Requests/s",
            "stat",
            (20, 0, 4, 4),
            "reqps",
            [(f"sum(rate({m.VLLM_REQUEST_SUCCESS}_total{{{_SEL}}}[5m]))", "requests/s")],
        ),
        _panel(7, "Time to first token", "timeseries", (0, 4, 12, 8), "s", _quantiles(m.VLLM_TTFT)),
        _panel(8, "Inter-token latency", "timeseries", (12, 4, 12, 8), "s", _quantiles(m.VLLM_ITL)),
        _panel(
            9,
            "Throughput (tokens/s)",
            "timeseries",
            (0, 12, 12, 8),
            "none",
            [
                (f"sum(rate({m.VLLM_PROMPT_TOKENS}_total{{{_SEL}}}[5m]))", "prompt"),
                (f"sum(rate({m.VLLM_GENERATION_TOKENS}_total{{{_SEL}}}[5m]))", "generation"),
            ],
        ),
        _panel(
            10,
            "Queue depth",
            "timeseries",
            (12, 12, 12, 8),
            "none",
            [
                (f"sum({m.VLLM_NUM_REQUESTS_WAITING}{{{_SEL}}})", "waiting"),
                (f"sum(rate({m.VLLM_NUM_PREEMPTIONS}_total{{{_SEL}}}[5m]))", "preemptions/s"),
            ],
        ),
        _panel(
            11,
            "Running and waiting per replica",
            "timeseries",
            (0, 20, 12, 8),
            "none",
            [
                (f"sum by (pod) ({m.VLLM_NUM_REQUESTS_RUNNING}{{{_SEL}}})", "running {{pod}}"),
                (f"sum by (pod) ({m.VLLM_NUM_REQUESTS_WAITING}{{{_SEL}}})", "waiting {{pod}}"),
            ],
        ),
        _panel(
            12,
            "KV cache usage per replica",
            "timeseries",
            (12, 20, 12, 8),
            "percentunit",
            [
                (f"max by (pod) ({m.VLLM_KV_CACHE_USAGE}{{{_SEL}}})", "{{pod}}"),
            ],
        ),
        _panel(
            13,
            "GPU utilisation",
            "timeseries",
            (0, 28, 12, 8),
            "percent",
            [
                (f'avg by (Hostname) ({m.DCGM_GPU_UTIL}{{namespace="$namespace"}})', "NVIDIA {{Hostname}}"),
                (f'avg by (hostname) ({m.AMD_GFX_ACTIVITY}{{namespace="$namespace"}})', "AMD {{hostname}}"),
            ],
        ),
        _panel(
            14,
            "GPU memory used",
            "timeseries",
            (12, 28, 12, 8),
            "bytes",
            [
                (f'sum by (Hostname) ({m.DCGM_FB_USED}{{namespace="$namespace"}}) * 1048576', "NVIDIA {{Hostname}}"),
                (f'sum by (hostname) ({m.AMD_USED_VRAM}{{namespace="$namespace"}}) * 1000000', "AMD {{hostname}}"),
            ],
        ),
    ]
    variables = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "hide": 0},
        {
            "name": "namespace",
            "label": "Namespace",
            "type": "query",
            "hide": 0,
            "refresh": 2,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": f"label_values({m.VLLM_NUM_REQUESTS_RUNNING}, namespace)", "refId": "namespace"},
            "definition": f"label_values({m.VLLM_NUM_REQUESTS_RUNNING}, namespace)",
        },
        {
            "name": "model_name",
            "label": "Served model",
            "type": "query",
            "hide": 0,
            "refresh": 2,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {
                "query": f'label_values({m.VLLM_NUM_REQUESTS_RUNNING}{{namespace="$namespace"}}, model_name)',
                "refId": "model_name",
            },
            "definition": f'label_values({m.VLLM_NUM_REQUESTS_RUNNING}{{namespace="$namespace"}}, model_name)',
        },
    ]
    return {
        "uid": DASHBOARD_UID,
        "title": "Kimi K3.1 Pro on vLLM",
        "description": "kimi-deploy: latency, throughput, queue, KV cache, replicas and GPUs of one deployment.",
        "tags": ["kimi-deploy", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": variables},
        "panels": panels,
    }


def dashboard_text() -> str:
    """The dashboard as the committed file holds it (2-space JSON, trailing newline)."""
    return json.dumps(dashboard(), indent=2) + "\n"


def dashboard_expressions(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every query in a dashboard document."""
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]


def substitute_variables(expr: str, values: dict[str, str] | None = None) -> str:
    """An expression with the dashboard variables (``$namespace``, ``$model_name``) replaced by
    ``values``, by default sample values (for parsing)."""
    values = values or {"namespace": "kimi", "model_name": "kimi-k3.1-pro"}
    return expr.replace("$namespace", values["namespace"]).replace("$model_name", values["model_name"])


# -- resources ------------------------------------------------------------------------------------


def alerts_enabled(spec: DeploymentSpec) -> bool:
    """Whether a PrometheusRule is declared: alerts on and the Prometheus Operator installed."""
    return spec.config.observability.alerts and "prometheus-operator" in spec.config.kubernetes.installed_addons


def declare_observability(
    spec: DeploymentSpec,
    sizing: Sizing,
    multi_node: bool,
    budget: PodReadyBudget,
    provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
) -> dict[str, pulumi.Resource]:
    """Declare the dashboard ConfigMap (with ``observability.grafanaNamespace``) and the
    PrometheusRule (``alerts_enabled``). Returns role -> resource."""
    out: dict[str, pulumi.Resource] = {}
    opts = pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on)
    grafana_ns = spec.config.observability.grafana_namespace
    if grafana_ns:
        meta = metadata(spec, DASHBOARD_CONFIGMAP, "dashboard")
        meta["namespace"] = grafana_ns
        meta["labels"] = {**labels(spec, "dashboard"), GRAFANA_DASHBOARD_LABEL[0]: GRAFANA_DASHBOARD_LABEL[1]}
        out["dashboard"] = k8s.core.v1.ConfigMap(
            "vllm-dashboard",
            metadata=meta,
            data={DASHBOARD_PATH.name: DASHBOARD_PATH.read_text()},
            opts=opts,
        )
    if alerts_enabled(spec):
        out["alerts"] = k8s.apiextensions.CustomResource(
            "vllm-alerts",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata={
                **metadata(spec, VLLM_NAME, "alerts"),
                "labels": {**labels(spec, "alerts"), **spec.config.observability.monitor_labels},
            },
            spec=prometheus_rule_spec(spec, sizing, multi_node, budget),
            opts=opts,
        )
    return out

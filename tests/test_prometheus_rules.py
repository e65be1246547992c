"""Every rule group and scaling query the stacks render, evaluated by the real Prometheus rule engine
(Debian's promtool 2.42; issue 19 item 4).

- ``promtool check rules`` on the PrometheusRule groups of every stack that can have them (alerts
  and autoscaling on), and on the scaling queries wrapped as recording rules.
- ``promtool test rules`` per alert with input series shaped like the exporters' (vLLM through a
  PodMonitor scrape, kube-state-metrics, dcgm-exporter, AMD's device metrics exporter): it fires,
  it resolves, and a second event fires again; the look-alikes that must not fire do not.
- ``promtool test rules`` per scaling query (every KEDA trigger and prometheus-adapter rule) in
  the states a scaler meets: demand, idle, demand held over the scale-down delay, zero replicas,
  a scale-up from zero while the new replica loads, and a lost scrape. Where the result must be an
  error (nothing to read), the expected promtool result is empty and the trigger must not have
  ``ignoreNullValues`` (KEDA 2.20.2 would read an empty result as 0: ``promtool.keda_reading``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import pytest

from components.core import metrics as m
from components.core import time_to_ready as ttr
from components.core.config import read_stack_config
from components.core.scaling import scaling_plan
from components.core.sizing import sync_expected_seconds
from components.core.time_to_ready import pod_ready_budget
from components.core.weights import SHAPE_BUCKET, sync_steps
from components.k8s import autoscaling as asc_mod
from components.k8s import observability as obs
from components.k8s.vllm_service import per_pod_budget_seconds
from tests import promtool
from tests.test_autoscaling import autoscaled
from tests.test_k8s_workloads import one

# Stacks that can carry alerts and a scaler, each with both on (b300 runs on EC2: neither).
RULE_STACKS = ("b300-prod", "gb300", "mi355x")
OTHER_NAMESPACE = "other-team"
MINUTE = 60


@functools.cache
def observed(name: str, variant: str = "keda"):
    """The mock run of ``name`` with alerts and autoscaling on (prometheus-operator installed).
    ``variant``: ``keda`` (as shipped or turned on), ``zero`` (mi355x: minReplicas 0 with a
    serving window), ``hpa`` (mi355x: an HPA on prometheus-adapter's external metrics)."""
    k8s_cfg = read_stack_config(name)["kimi-deploy:kubernetes"]
    addons = set(k8s_cfg.get("installedAddons", [])) | {"prometheus-operator"}
    extra: dict[str, Any] = {}
    if variant == "zero":
        extra["kimi-deploy:autoscaling"] = {
            "enabled": True, "minReplicas": 0, "maxReplicas": 2,
            "schedule": [{"start": "0 8 * * 1-5", "end": "0 20 * * 1-5", "timezone": "Europe/Berlin"}],
        }
    if variant == "hpa":
        extra["kimi-deploy:autoscaling"] = {"enabled": True, "maxReplicas": 2, "controller": "hpa"}
        addons.add("prometheus-adapter")
    extra["kimi-deploy:kubernetes"] = {**k8s_cfg, "installedAddons": sorted(addons)}
    return autoscaled(name, extra)


@dataclass(frozen=True)
class World:
    """What the input series of one stack look like: names and labels as the exporters and the
    PodMonitor scrape write them."""

    name: str
    namespace: str
    model: str
    multi_node: bool
    pods: tuple[str, str]  # two serving pods (Deployment pods or LeaderWorkerSet leaders)
    worker_pod: str | None  # a LeaderWorkerSet worker (never serves /metrics)
    groups: list[dict[str, Any]]

    def vllm(self, metric: str, pod: str) -> str:
        """A vLLM series of ``pod`` as scraped through the PodMonitor (prometheus-operator's
        relabeling adds namespace, pod, container, endpoint, job)."""
        return promtool.selector(metric, {
            "namespace": self.namespace, "pod": pod, "container": "vllm", "endpoint": "http",
            "job": f"{self.namespace}/kimi-vllm", "instance": f"10.1.0.{self.pods.index(pod) + 5}:8000",
            "model_name": self.model, "engine": "0",
        })

    def sync(self, pod: str) -> str:
        """The weight sync's bytes moved in ``pod`` (its ``weight-sync`` container: the init container
        of a vLLM pod, or a sync Job's pod) as the PodMonitor's ``sync-metrics`` endpoint scrapes it."""
        return promtool.selector(m.SYNC_TRANSFERRED_BYTES, {
            "namespace": self.namespace, "pod": pod, "container": obs.NODE_COPY_CONTAINER,
            "endpoint": m.SYNC_METRICS_PORT_NAME, "job": f"{self.namespace}/kimi-vllm",
            "instance": f"10.1.1.9:{m.SYNC_METRICS_PORT}",
        })

    def pod(self, metric: str, pod: str, **extra: str) -> str:
        """A kube-state-metrics series of ``pod``."""
        return promtool.selector(metric, {"namespace": self.namespace, "pod": pod, "job": "kube-state-metrics", **extra})

    def scale_target(self) -> str:
        """kube-state-metrics' replica count of the scaled workload (the LeaderWorkerSet's leader
        StatefulSet carries its name)."""
        if self.multi_node:
            return promtool.selector(m.KSM_STATEFULSET_REPLICAS,
                                     {"namespace": self.namespace, "statefulset": "kimi-vllm", "job": "kube-state-metrics"})
        return promtool.selector(m.KSM_DEPLOYMENT_SPEC_REPLICAS,
                                 {"namespace": self.namespace, "deployment": "kimi-vllm", "job": "kube-state-metrics"})


def world(name: str, variant: str = "keda") -> World:
    run = observed(name, variant)
    spec = run.context.spec
    multi_node = spec.nodes_per_copy > 1
    pods = ("kimi-vllm-0", "kimi-vllm-1") if multi_node else ("kimi-vllm-7d9f8c6b5-x2k4q", "kimi-vllm-7d9f8c6b5-p9m3z")
    return World(name, spec.config.kubernetes.namespace, spec.served_model_name, multi_node, pods,
                 "kimi-vllm-0-1" if multi_node else None, one(run, "PrometheusRule")["spec"]["groups"])


def rules_by_alert(w: World) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for group in w.groups:
        for rule in group["rules"]:
            out.setdefault(rule["alert"], []).append(rule)
    return out


def expect(rule: dict[str, Any], sample_labels: dict[str, str], value: float = 1.0) -> dict[str, Any]:
    """One expected alert of ``rule`` from its sample's labels (the rule's labels added; the
    annotations expanded as Prometheus does)."""
    return {
        "exp_labels": {**sample_labels, **rule.get("labels", {})},
        "exp_annotations": {
            k: promtool.render_annotation(v, sample_labels, value) for k, v in rule.get("annotations", {}).items()
        },
    }


def run_case(tmp_path, w: World, case: str, series: dict[str, str], checks: list[tuple[int, str, list[dict]]],
             exprs: list[dict] | None = None) -> None:
    """promtool test of ``w``'s rule groups: ``series`` (selector -> values, 1-minute interval),
    ``checks`` (eval minute, alertname, expected alerts)."""
    test: dict[str, Any] = {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [{"eval_time": f"{t}m", "alertname": a, "exp_alerts": e} for t, a, e in checks],
    }
    if exprs:
        test["promql_expr_test"] = exprs
    done = promtool.unit_test(w.groups, test, tmp_path, case)
    assert done.returncode == 0, f"{w.name} {case}:\n{done.stdout}{done.stderr}"


# -- promtool check rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", RULE_STACKS)
def test_promtool_checks_every_rule_group(name, tmp_path):
    w = world(name)
    done = promtool.check_rules(w.groups, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in w.groups)} rules found" in done.stdout


@pytest.mark.parametrize("name, variant", [(n, "keda") for n in RULE_STACKS] + [("mi355x", "zero"), ("mi355x", "hpa")])
def test_promtool_checks_every_scaling_query(name, variant, tmp_path):
    queries = scaling_queries(name, variant)
    rules = [{"record": f"kimi:scaling:{q.replace('-', '_')}", "expr": expr} for q, expr in queries.items()]
    done = promtool.check_rules([{"name": "scaling", "rules": rules}], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_check_can_fail(tmp_path):
    done = promtool.check_rules([{"name": "g", "rules": [{"alert": "A", "expr": "sum(rate(x[5m])"}]}], tmp_path)
    assert done.returncode != 0 and "parse error" in (done.stdout + done.stderr)


# -- alerts: fires, resolves, fires again ------------------------------------------------------------


@pytest.mark.parametrize("name", RULE_STACKS)
def test_no_ready_replica_fires_resolves_and_fires_again(name, tmp_path):
    w = world(name)
    (rule,) = rules_by_alert(w)["KimiVllmNoReadyReplica"]
    budget = per_pod_budget_seconds(observed(name).context.spec, observed(name).context.sizing)
    p1 = w.pods[0]
    ready = promtool.values((0, 15), (1, 15), (0, 31))  # ready from 15 m to 29 m
    series = {
        w.pod(m.KSM_POD_INFO, p1): promtool.values((1, 61)),
        w.pod(m.KSM_POD_CREATED, p1): promtool.values((-(budget + 600), 61)),  # created long before
        w.pod(m.KSM_POD_STATUS_READY, p1, condition="true"): ready,
        w.pod(m.KSM_POD_STATUS_READY, p1, condition="false"): promtool.values((1, 15), (0, 15), (1, 31)),
    }
    if w.worker_pod:  # a worker is never a serving replica: its readiness counts for nothing
        series[w.pod(m.KSM_POD_INFO, w.worker_pod)] = promtool.values((1, 61))
        series[w.pod(m.KSM_POD_STATUS_READY, w.worker_pod, condition="true")] = promtool.values((1, 61))
    fired = [expect(rule, {})]
    checks = [(3, rule["alert"], []), (7, rule["alert"], fired), (20, rule["alert"], []),
              (33, rule["alert"], []), (37, rule["alert"], fired)]
    run_case(tmp_path, w, "no-ready", series, checks)
    # A pod still inside its startup budget: not (yet) an outage.
    young = {
        w.pod(m.KSM_POD_INFO, p1): promtool.values((1, 31)),
        w.pod(m.KSM_POD_CREATED, p1): promtool.values((0, 31)),
        w.pod(m.KSM_POD_STATUS_READY, p1, condition="true"): promtool.values((0, 31)),
    }
    run_case(tmp_path, w, "no-ready-young", young, [(30, rule["alert"], [])])


@pytest.mark.parametrize("name", RULE_STACKS)
def test_startup_over_budget_fires_per_pod_resolves_and_fires_for_the_next(name, tmp_path):
    w = world(name)
    (rule,) = rules_by_alert(w)["KimiVllmStartupOverBudget"]
    budget = per_pod_budget_seconds(observed(name).context.spec, observed(name).context.sizing)
    p1, p2 = w.pods
    series = {
        # p1 passes its budget at 2 m, becomes ready at 20 m
        w.pod(m.KSM_POD_CREATED, p1): promtool.values((-(budget - 2 * MINUTE), 61)),
        w.pod(m.KSM_POD_STATUS_READY, p1, condition="false"): promtool.values((1, 20), (0, 41)),
        w.pod(m.KSM_POD_STATUS_READY, p1, condition="true"): promtool.values((0, 20), (1, 41)),
        # p2 is created at 25 m (passes its budget at 27 m) and never becomes ready
        w.pod(m.KSM_POD_CREATED, p2): promtool.values((None, 25), (25 * MINUTE - budget + 2 * MINUTE, 36)),
        w.pod(m.KSM_POD_STATUS_READY, p2, condition="false"): promtool.values((None, 25), (1, 36)),
    }
    labels = {p: {"namespace": w.namespace, "pod": p, "job": "kube-state-metrics"} for p in (p1, p2)}
    checks = [(1, rule["alert"], []), (8, rule["alert"], [expect(rule, labels[p1])]), (22, rule["alert"], []),
              (30, rule["alert"], []), (34, rule["alert"], [expect(rule, labels[p2])])]
    run_case(tmp_path, w, "startup", series, checks)


@pytest.mark.parametrize("name", RULE_STACKS)
def test_queue_growing_fires_resolves_and_fires_again_but_not_for_a_steady_queue(name, tmp_path):
    w = world(name)
    (rule,) = rules_by_alert(w)["KimiVllmQueueGrowing"]
    minutes = observed(name).context.spec.config.observability.queue_alert_minutes
    p1, p2 = w.pods
    waiting = promtool.values((0, 5), "1+1x29", (0, 20), "1+1x59")  # grows 5-34 m, drained 35-54 m, grows again from 55 m
    series = {
        w.vllm(m.VLLM_NUM_REQUESTS_WAITING, p1): waiting,
        w.vllm(m.VLLM_NUM_REQUESTS_WAITING, p2): promtool.values((0, 115)),
    }
    fired = [expect(rule, {})]
    checks = [(5 + minutes - 2, rule["alert"], []), (5 + minutes + 5, rule["alert"], fired), (45, rule["alert"], []),
              (50, rule["alert"], []), (55 + minutes + 5, rule["alert"], fired)]
    run_case(tmp_path, w, "queue", series, checks)
    steady = {w.vllm(m.VLLM_NUM_REQUESTS_WAITING, p1): promtool.values((20, 61))}
    run_case(tmp_path, w, "queue-steady", steady, [(60, rule["alert"], [])])


@pytest.mark.parametrize("name", RULE_STACKS)
def test_kv_cache_near_full_fires_resolves_and_fires_again(name, tmp_path):
    w = world(name)
    (rule,) = rules_by_alert(w)["KimiVllmKvCacheNearFull"]
    limit = observed(name).context.spec.config.observability.kv_cache_alert_fraction
    high, low = (1 + limit) / 2, limit / 2
    series = {
        w.vllm(m.VLLM_KV_CACHE_USAGE, w.pods[0]): promtool.values((low, 10), (high, 20), (low, 20), (high, 21)),
        w.vllm(m.VLLM_KV_CACHE_USAGE, w.pods[1]): promtool.values((low, 71)),
    }
    fired = [expect(rule, {}, high)]
    checks = [(8, rule["alert"], []), (13, rule["alert"], []), (20, rule["alert"], fired), (40, rule["alert"], []),
              (60, rule["alert"], fired)]
    run_case(tmp_path, w, "kv", series, checks)


def job_steps(name: str) -> list:
    spec = observed(name).context.spec
    return [s for s in sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None) if not obs.runs_in_pod(s)]


def init_rule(w: World, alert: str) -> dict[str, Any] | None:
    """The rule of ``alert`` that watches the node-local copy's init container (in the vLLM pods), or None."""
    return next((r for r in rules_by_alert(w).get(alert, [])
                 if obs.NODE_COPY_CONTAINER in r["expr"] and NODE_COPY_POD_RE in r["expr"]), None)


@pytest.mark.parametrize("name", [n for n in RULE_STACKS if n != "mi355x"])
def test_weight_sync_failed_fires_for_a_failed_job_not_for_a_retried_one(name, tmp_path):
    w = world(name)
    (rule,) = [r for r in rules_by_alert(w)["KimiWeightSyncFailed"] if "job_name" in r["expr"]]
    step = job_steps(name)[-1].name

    def job(metric: str, job_name: str, **extra: str) -> str:
        return promtool.selector(metric, {"namespace": w.namespace, "job_name": job_name, "job": "kube-state-metrics", **extra})

    retried, failed, next_failed = (f"{obs.WEIGHT_SYNC_JOB_PREFIX}{step}-{h}" for h in ("aaaa1111", "bbbb2222", "cccc3333"))
    series = {
        # a pod of `retried` failed at 5 m, its retry succeeded at 20 m: the Job completed
        job(m.KSM_JOB_STATUS_FAILED, retried): promtool.values((0, 5), (1, 56)),
        job(m.KSM_JOB_FAILED_CONDITION, retried, condition="true"): promtool.values((0, 61)),
        job(m.KSM_JOB_FAILED_CONDITION, retried, condition="false"): promtool.values((1, 61)),
        # `failed` exhausted its retries at 10 m; replaced (deleted) at 30 m
        job(m.KSM_JOB_STATUS_FAILED, failed): promtool.values((0, 10), (7, 20)),
        job(m.KSM_JOB_FAILED_CONDITION, failed, condition="true"): promtool.values((0, 10), (1, 20)),
        job(m.KSM_JOB_FAILED_CONDITION, failed, condition="false"): promtool.values((1, 10), (0, 20)),
        # its successor fails at 45 m
        job(m.KSM_JOB_STATUS_FAILED, next_failed): promtool.values((None, 35), (0, 10), (7, 16)),
        job(m.KSM_JOB_FAILED_CONDITION, next_failed, condition="true"): promtool.values((None, 35), (0, 10), (1, 16)),
        job(m.KSM_JOB_FAILED_CONDITION, next_failed, condition="false"): promtool.values((None, 35), (1, 10), (0, 16)),
    }
    labels = {j: {"namespace": w.namespace, "job_name": j} for j in (failed, next_failed)}
    checks = [(8, rule["alert"], []), (13, rule["alert"], [expect(rule, labels[failed])]), (40, rule["alert"], []),
              (50, rule["alert"], [expect(rule, labels[next_failed])])]
    run_case(tmp_path, w, "sync-failed", series, checks)


def test_sync_alerts_watch_what_runs_for_each_storage_kind():
    """A rule is rendered for what exists: Job rules for the steps that are Jobs, init-container
    rules for the node-local copy; mi355x (no mirror: no Job at all) gets no Job rule, and with
    ``storage.kind: pvc`` the node copy is one Job and no init container copies."""
    for name in RULE_STACKS:
        w = world(name)
        spec = observed(name).context.spec
        steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
        stalled = rules_by_alert(w)["KimiWeightSyncStalled"]
        job_rules = {r["labels"]["step"] for r in stalled if obs.WEIGHT_SYNC_JOB_PREFIX in r["expr"]}
        assert job_rules == {s.name for s in steps if not obs.runs_in_pod(s)}, name
        in_pod = any(obs.runs_in_pod(s) for s in steps)
        assert (init_rule(w, "KimiWeightSyncStalled") is not None) == in_pod == (init_rule(w, "KimiWeightSyncFailed") is not None)
        failed_jobs = [r for r in rules_by_alert(w).get("KimiWeightSyncFailed", []) if "job_name" in r["expr"]]
        assert bool(failed_jobs) == bool(job_rules), name
    assert not job_steps("mi355x")
    assert not [r["expr"] for rs in rules_by_alert(world("mi355x")).values() for r in rs
                if obs.WEIGHT_SYNC_JOB_PREFIX in r["expr"]]
    storage = {**read_stack_config("b300-prod")["kimi-deploy:storage"], "kind": "pvc", "existingClaim": "kimi-weights",
               "readGBps": 2}
    k8s_cfg = {**read_stack_config("b300-prod")["kimi-deploy:kubernetes"], "installedAddons": ["prometheus-operator"]}
    run = autoscaled("b300-prod", {"kimi-deploy:storage": storage, "kimi-deploy:kubernetes": k8s_cfg})
    rules = one(run, "PrometheusRule")["spec"]["groups"][0]["rules"]
    exprs = [r["expr"] for r in rules if r["alert"].startswith("KimiWeightSync")]
    assert exprs and not [e for e in exprs if NODE_COPY_POD_RE in e]
    assert any('pod=~"kimi-weights-node-copy-.*"' in e and m.SYNC_TRANSFERRED_BYTES in e for e in exprs)


@pytest.mark.parametrize("name", RULE_STACKS)
def test_node_copy_init_container_failure_fires_after_a_jobs_retries_and_resolves_on_success(name, tmp_path):
    w = world(name)
    rule = init_rule(w, "KimiWeightSyncFailed")
    assert rule is not None
    p1 = w.pods[0]
    init = {"container": obs.NODE_COPY_CONTAINER}
    retries = obs.SYNC_RETRIES_PER_COMPLETION
    series = {
        # fails once a minute from 5 m until it has failed `retries` + 2 times; then runs and completes at 50 m
        w.pod(m.KSM_INIT_CONTAINER_RESTARTS, p1, **init): promtool.values((0, 5), f"1+1x{retries + 1}", (retries + 2, 60)),
        w.pod(m.KSM_INIT_CONTAINER_TERMINATED_REASON, p1, reason="Completed", **init): promtool.values((0, 50), (1, 21)),
    }
    fired_at = 5 + retries - 1  # the minute the restarts reach the retries a Job allows
    labels = {"namespace": w.namespace, "pod": p1}
    checks = [(fired_at - 1, rule["alert"], []), (fired_at + 2, rule["alert"], [expect(rule, labels)]),
              (45, rule["alert"], [expect(rule, labels)]), (52, rule["alert"], [])]
    run_case(tmp_path, w, "init-failed", series, checks)


def _sync_cases(w: World, name: str) -> list[tuple[dict[str, Any], str]]:
    """(rule, a pod it watches) of every KimiWeightSyncStalled rule: one per sync Job step (a pod of
    its Job) and the node-local copy's (a vLLM pod's init container)."""
    out = []
    for step in job_steps(name):
        (rule,) = [r for r in rules_by_alert(w)["KimiWeightSyncStalled"]
                   if r["labels"]["step"] == step.name and NODE_COPY_POD_RE not in r["expr"]]
        out.append((rule, f"{obs.WEIGHT_SYNC_JOB_PREFIX}{step.name}-aaaa1111-0-q7x2z"))
    rule = init_rule(w, "KimiWeightSyncStalled")
    assert rule is not None
    out.append((rule, w.pods[0]))
    return out


NODE_COPY_POD_RE = 'pod=~"kimi-vllm-'
WINDOW = obs.SYNC_STALL_WINDOW_MINUTES


@pytest.mark.parametrize("name", RULE_STACKS)
def test_weight_sync_stalled_fires_when_bytes_stop_not_when_a_slow_sync_runs_long(name, tmp_path):
    """Progress, not elapsed time: a sync whose bytes stop moving alerts one window later and
    resolves when it moves again; a slow sync (1 MB a minute, for far longer than the old
    1.5 x expected threshold of any step) and a sync just started never do."""
    w = world(name)
    for rule, pod in _sync_cases(w, name):
        labels = {"namespace": w.namespace, "pod": pod, "container": obs.NODE_COPY_CONTAINER,
                  "endpoint": m.SYNC_METRICS_PORT_NAME, "job": f"{w.namespace}/kimi-vllm",
                  "instance": f"10.1.1.9:{m.SYNC_METRICS_PORT}"}
        # moves 1 GB/min for 10 min, stops at 10 m (flat 9 GB), moves again from 40 m, done at 60 m
        stalled = promtool.values("0+1000000000x9", (9 * 10**9, 30), f"{10 * 10**9}+1000000000x19", ("stale", 1))
        run_case(tmp_path, w, "stalled", {w.sync(pod): stalled}, [
            (9 + WINDOW - 1, rule["alert"], []),
            (9 + WINDOW + 2, rule["alert"], [expect(rule, labels, 0)]),
            (38, rule["alert"], [expect(rule, labels, 0)]),
            (42, rule["alert"], []),
            (70, rule["alert"], []),
        ])
        # 1 MB a minute for 8 hours: slow, never stalled
        slow = promtool.values(f"0+1000000x{8 * 60}")
        run_case(tmp_path, w, "slow", {w.sync(pod): slow},
                 [(t, rule["alert"], []) for t in (30, 120, 240, 8 * 60)])
        # a sync that has just started (listing its source: 0 bytes for 5 minutes) is not judged yet
        fresh = promtool.values((0, 5), f"1000000+1000000x{WINDOW}")
        run_case(tmp_path, w, "fresh", {w.sync(pod): fresh}, [(t, rule["alert"], []) for t in range(0, 16)])


@pytest.mark.parametrize("name", ["b300-prod", "gb300"])
def test_gpu_xid_alert_fires_on_a_new_xid_resolves_and_fires_on_the_next(name, tmp_path):
    """dcgm-exporter's DCGM_FI_DEV_XID_ERRORS holds the last XID and never returns to 0: the alert
    must fire when it changes, resolve after its window, and fire again on another XID."""
    w = world(name)
    (rule,) = rules_by_alert(w)["KimiGpuXidError"]

    def gpu(index: str, namespace: str, pod: str | None) -> dict[str, str]:
        labels = {"gpu": index, "UUID": f"GPU-{index}", "Hostname": "node-a", "device": f"nvidia{index}",
                  "modelName": "NVIDIA B300", "job": "gpu-monitoring/dcgm-exporter"}
        return {**labels, "namespace": namespace, "pod": pod, "container": "vllm"} if pod else labels

    ours, idle, theirs = gpu("0", w.namespace, w.pods[0]), gpu("1", w.namespace, w.pods[0]), gpu("2", OTHER_NAMESPACE, "x")
    series = {
        promtool.selector(m.DCGM_XID_ERRORS, ours): promtool.values((0, 10), (79, 50), (48, 41)),
        promtool.selector(m.DCGM_XID_ERRORS, idle): promtool.values((0, 101)),
        promtool.selector(m.DCGM_XID_ERRORS, theirs): promtool.values((0, 5), (31, 96)),
    }
    checks = [(5, rule["alert"], []), (12, rule["alert"], [expect(rule, ours, 79)]), (40, rule["alert"], []),
              (62, rule["alert"], [expect(rule, ours, 48)]), (95, rule["alert"], [])]
    run_case(tmp_path, w, "xid", series, checks)


def test_gpu_ecc_alert_fires_for_this_namespace_resolves_and_fires_again(tmp_path):
    w = world("mi355x")
    (rule,) = rules_by_alert(w)["KimiGpuUncorrectableEcc"]

    def gpu(index: str, namespace: str, pod: str) -> dict[str, str]:
        return {"gpu_id": index, "hostname": "node-a", "card_model": "MI355X", "namespace": namespace, "pod": pod,
                "container": "vllm", "job": "kube-amd-gpu/amd-metrics-exporter"}

    ours, theirs = gpu("0", w.namespace, w.pods[0]), gpu("1", OTHER_NAMESPACE, "x")
    series = {
        promtool.selector(m.AMD_ECC_UNCORRECTABLE, ours): promtool.values((0, 10), (2, 50), (5, 41)),
        promtool.selector(m.AMD_ECC_UNCORRECTABLE, theirs): promtool.values((0, 5), (3, 96)),
    }
    checks = [(5, rule["alert"], []), (12, rule["alert"], [expect(rule, ours)]), (40, rule["alert"], []),
              (62, rule["alert"], [expect(rule, ours)]), (95, rule["alert"], [])]
    run_case(tmp_path, w, "ecc", series, checks)


# -- a healthy deploy stays quiet; a stall fires (issue 28 item 3) ----------------------------------
# The timelines are the time-to-ready model's (components/core/time_to_ready.py, what the plan shows):
# each pod runs the phases of its scenario for the model's expected durations.


def _minutes(seconds: int) -> int:
    return max(1, math.ceil(seconds / MINUTE))


@dataclass
class Timeline:
    """Input series of one case (1-minute samples over ``length`` minutes) and the minutes at
    which a serving pod became ready."""

    w: World
    length: int
    series: dict[str, str]

    def const(self, value: float, start: int = 0, end: int | None = None) -> str:
        """``value`` from minute ``start`` to ``end`` (exclusive; default: the end), absent before and after."""
        end = self.length if end is None else end
        return promtool.values((None, start), (value, end - start), *([("stale", 1)] if end < self.length else []))

    def steps(self, before: float, after: float, at: int, start: int = 0, end: int | None = None) -> str:
        """``before`` from ``start``, ``after`` from minute ``at``, until ``end``."""
        end = self.length if end is None else end
        at = min(max(at, start), end)
        return promtool.values((None, start), (before, at - start), (after, end - at),
                               *([("stale", 1)] if end < self.length else []))

    def job(self, step: str, start: int, minutes: int) -> None:
        """A sync Job of ``step`` running from ``start`` for ``minutes``, then complete."""
        name = f"{obs.WEIGHT_SYNC_JOB_PREFIX}{step}-aaaa1111"

        def sel(metric: str, **extra: str) -> str:
            return promtool.selector(metric, {"namespace": self.w.namespace, "job_name": name, "job": "kube-state-metrics",
                                              **extra})

        self.series[sel(m.KSM_JOB_START_TIME)] = self.const(start * MINUTE, start)
        self.series[sel(m.KSM_JOB_ACTIVE)] = self.steps(1, 0, start + minutes, start)
        self.series[sel(m.KSM_JOB_FAILED_CONDITION, condition="true")] = self.const(0, start)
        self.series[sel(m.KSM_JOB_STATUS_FAILED)] = self.const(0, start)
        self.series[self.w.sync(f"{name}-0-q7x2z")] = self.moving(start, start + minutes)

    def moving(self, start: int, end: int, stop: int | None = None) -> str:
        """A sync's bytes moved from minute ``start`` until its container ends at ``end`` (its
        target gone: stale): 1 GB a minute, or only until minute ``stop`` and then flat (stalled)."""
        end = min(end, self.length)
        grow = end - start if stop is None else max(min(stop, end) - start, 1)
        return promtool.values((None, start), f"0+{10**9}x{grow - 1}", ((grow - 1) * 10**9, end - start - grow),
                               *([("stale", 1)] if end < self.length else []))

    def pod(self, pod: str, created: int, phases: tuple, serving: bool = True, end: int | None = None,
            stall_copy: bool = False, never_ready: bool = False) -> int | None:
        """A vLLM pod created at minute ``created`` that runs ``phases`` (``time_to_ready.PodPhase``)
        for their expected durations; returns the minute it is ready (None if never). With
        ``stall_copy`` its node-local copy stops moving bytes after two minutes and never ends; with
        ``never_ready`` vLLM never becomes ready after the init containers finished."""
        w, t = self.w, created
        for phase in phases:
            if phase.name == ttr.NODE_WAIT_PHASE:
                t += _minutes(phase.expected_seconds)  # Pending: no node yet
        started = t
        copy_start = copy_end = None
        initialized: int | None = None
        ready: int | None = None
        for phase in phases:
            if phase.name == ttr.NODE_WAIT_PHASE:
                continue
            if phase.name == ttr.VLLM_START_PHASE:
                initialized = t  # the init containers (copy, restore) have finished
            if phase.name == ttr.VLLM_START_PHASE and never_ready:
                break
            if phase.init_container and phase.name != "engine cache restore":
                copy_start, copy_end = t, (self.length + 1 if stall_copy else t + _minutes(phase.expected_seconds))
                if stall_copy:
                    break
            t += _minutes(phase.expected_seconds)
        else:
            ready = t
        ready_at = self.length if ready is None else min(ready, self.length)
        self.series[w.pod(m.KSM_POD_CREATED, pod)] = self.const(created * MINUTE, created, end)
        self.series[w.pod(m.KSM_POD_START_TIME, pod)] = self.const(started * MINUTE, min(started, end or self.length), end)
        if initialized is not None and initialized < self.length:
            self.series[w.pod(m.KSM_POD_INITIALIZED_TIME, pod)] = self.const(initialized * MINUTE, initialized, end)
        if serving:
            self.series[w.pod(m.KSM_POD_INFO, pod)] = self.const(1, created, end)
            self.series[w.pod(m.KSM_POD_STATUS_READY, pod, condition="true")] = self.steps(0, 1, ready_at, created, end)
            self.series[w.pod(m.KSM_POD_STATUS_READY, pod, condition="false")] = self.steps(1, 0, ready_at, created, end)
        if copy_start is not None and copy_end is not None:
            init = {"container": obs.NODE_COPY_CONTAINER}
            stop = min(copy_end, self.length)
            self.series[w.pod(m.KSM_INIT_CONTAINER_RUNNING, pod, **init)] = self.steps(1, 0, stop, copy_start, end)
            self.series[w.pod(m.KSM_INIT_CONTAINER_RESTARTS, pod, **init)] = self.const(0, copy_start, end)
            self.series[w.pod(m.KSM_INIT_CONTAINER_TERMINATED_REASON, pod, reason="Completed", **init)] = self.steps(
                0, 1, stop, copy_start, end)
            self.series[w.sync(pod)] = self.moving(copy_start, min(stop, end or self.length),
                                                   stop=copy_start + 2 if stall_copy else None)
        return ready


def _quiet_checks(w: World, length: int) -> list[tuple[int, str, list[dict]]]:
    """No alert of the group firing, every 10 minutes over the case."""
    names = sorted(rules_by_alert(w))
    return [(t, a, []) for t in range(0, length + 1, 10) for a in names]


def _budget(name: str):
    run = observed(name)
    return pod_ready_budget(run.context.spec, run.context.sizing)


def _first_pods(w: World, tl: Timeline, phases: tuple, created: int, stall_copy: bool = False) -> int | None:
    """The first copy's pods: the serving pod (a LeaderWorkerSet leader also gets its worker)."""
    ready = tl.pod(w.pods[0], created, phases, stall_copy=stall_copy)
    if w.worker_pod:
        tl.pod(w.worker_pod, created, phases, serving=False, stall_copy=stall_copy)
    return ready


@pytest.mark.parametrize("name", RULE_STACKS)
def test_no_alert_fires_on_a_healthy_first_deploy(name, tmp_path):
    """The first deploy as the model schedules it: the sync Jobs (the hub download into the
    mirror), then the vLLM pods: image pull, the node-local copy (an init container), vLLM's load
    and start. On mi355x the copy is the hub download itself (about 4.3 h), far past the old
    5,700 s budget."""
    w, budget = world(name), _budget(name)
    run = observed(name)
    spec, sizing = run.context.spec, run.context.sizing
    jobs = job_steps(name)
    job_minutes = [_minutes(sync_expected_seconds(spec, sizing, s)) for s in jobs]
    pods_at = 1 + sum(job_minutes)
    length = pods_at + _minutes(budget.expected_seconds("first_deploy")) + 30
    tl = Timeline(w, length, {})
    start = 1
    for step, minutes in zip(jobs, job_minutes, strict=True):
        tl.job(step.name, start, minutes)
        start += minutes
    ready = _first_pods(w, tl, budget.scenarios["first_deploy"], pods_at)
    assert ready is not None
    # The pod is ready within its own budget (startup + pull + the node-local copy, which on mi355x is
    # the hub download itself), however long the model says the copy takes at the hub's rate.
    assert (ready - pods_at) * MINUTE <= budget.budget_seconds
    run_case(tmp_path, w, "healthy-first-deploy", tl.series, _quiet_checks(w, length))


@pytest.mark.parametrize("name", RULE_STACKS)
def test_no_alert_fires_on_a_healthy_scale_up(name, tmp_path):
    """A serving copy, and a second one added by the scaler onto a new node: it waits for the
    node, pulls, copies onto it, loads (the model's replaced-node scenario, as the plan's scale-up)."""
    w, budget = world(name), _budget(name)
    phases = budget.scenarios["replaced_node"]
    length = _minutes(budget.expected_seconds("replaced_node")) + 40
    tl = Timeline(w, length, {})
    # the first copy: serving since long before
    p1 = w.pods[0]
    tl.series[w.pod(m.KSM_POD_INFO, p1)] = tl.const(1)
    tl.series[w.pod(m.KSM_POD_CREATED, p1)] = tl.const(-100_000)
    tl.series[w.pod(m.KSM_POD_START_TIME, p1)] = tl.const(-100_000)
    tl.series[w.pod(m.KSM_POD_STATUS_READY, p1, condition="true")] = tl.const(1)
    tl.series[w.pod(m.KSM_POD_STATUS_READY, p1, condition="false")] = tl.const(0)
    assert tl.pod(w.pods[1], 5, phases) is not None
    if w.worker_pod:
        tl.pod(f"{w.pods[1]}-1", 5, phases, serving=False)
    run_case(tmp_path, w, "healthy-scale-up", tl.series, _quiet_checks(w, length))


@pytest.mark.parametrize("name", RULE_STACKS)
def test_no_alert_fires_on_a_healthy_node_replacement(name, tmp_path):
    """One copy; its node is replaced at minute 10: the pod is deleted with the node and its
    successor waits for the new node, copies onto it and loads. The endpoint is down meanwhile
    (one copy cannot stay up through a node replacement), but nothing is wrong."""
    w, budget = world(name), _budget(name)
    phases = budget.scenarios["replaced_node"]
    length = 10 + _minutes(budget.expected_seconds("replaced_node")) + 40
    tl = Timeline(w, length, {})
    old, new = w.pods
    tl.series[w.pod(m.KSM_POD_INFO, old)] = tl.const(1, 0, 10)
    tl.series[w.pod(m.KSM_POD_CREATED, old)] = tl.const(-100_000, 0, 10)
    tl.series[w.pod(m.KSM_POD_STATUS_READY, old, condition="true")] = tl.const(1, 0, 10)
    tl.series[w.pod(m.KSM_POD_STATUS_READY, old, condition="false")] = tl.const(0, 0, 10)
    assert tl.pod(new, 10, phases) is not None
    if w.worker_pod:
        tl.pod(f"{new}-1", 10, phases, serving=False)
    run_case(tmp_path, w, "healthy-node-replacement", tl.series, _quiet_checks(w, length))


@pytest.mark.parametrize("name", RULE_STACKS)
def test_a_stalled_node_copy_fires_the_stall_then_the_startup_alerts(name, tmp_path):
    """The same first pod, but its node-local copy stops moving bytes two minutes in and never
    finishes: the stall warning fires one window after the last byte, then (no replica ready past
    the pod's budget, the pod never initialized) the startup and outage alerts; not before."""
    w, budget = world(name), _budget(name)
    created = 1
    length = created + _minutes(budget.budget_seconds) + 15
    tl = Timeline(w, length, {})
    assert _first_pods(w, tl, budget.scenarios["first_deploy"], created, stall_copy=True) is None
    stalled = init_rule(w, "KimiWeightSyncStalled")
    assert stalled is not None
    labels = {"namespace": w.namespace, "pod": w.pods[0], "job": "kube-state-metrics"}
    copy_start = created + _minutes(budget.scenarios["first_deploy"][0].expected_seconds)  # after the image pull
    last_byte = copy_start + 1  # two samples of growth (within a minute: promtool's `_xN` is N blanks)
    over = created + math.ceil(budget.budget_seconds / MINUTE)
    (no_ready,) = rules_by_alert(w)["KimiVllmNoReadyReplica"]
    (over_budget,) = rules_by_alert(w)["KimiVllmStartupOverBudget"]
    sync_labels = {"namespace": w.namespace, "container": obs.NODE_COPY_CONTAINER, "endpoint": m.SYNC_METRICS_PORT_NAME,
                   "job": f"{w.namespace}/kimi-vllm", "instance": f"10.1.1.9:{m.SYNC_METRICS_PORT}"}
    expected_stalled = [expect(stalled, {**sync_labels, "pod": w.pods[0]}, 0)]
    if w.worker_pod:
        expected_stalled.append(expect(stalled, {**sync_labels, "pod": w.worker_pod}, 0))
    checks = [
        (last_byte + WINDOW - 3, stalled["alert"], []),
        (last_byte + WINDOW + 2, stalled["alert"], expected_stalled),
        (over - 1, no_ready["alert"], []), (over - 1, over_budget["alert"], []),
        (over + 7, no_ready["alert"], [expect(no_ready, {})]),
        (over + 7, over_budget["alert"], [expect(over_budget, labels)]),
    ]
    run_case(tmp_path, w, "stalled-copy", tl.series, checks)


def not_ready_minutes(name: str) -> tuple[int, int, int]:
    """``(initialized, before, after)`` minutes after creation for a pod of ``name`` whose weights
    are already on its node (the repeat-trial phases) and whose vLLM never becomes ready: when its
    init containers finish, when the old creation-budget rule would fire, and when the
    phase-aware one does (each with the rule's 5-minute ``for``)."""
    budget = _budget(name)
    phases = budget.scenarios["repeat_trial"]
    initialized = sum(_minutes(p.expected_seconds) for p in phases if p.name != ttr.VLLM_START_PHASE)
    before = math.ceil(budget.budget_seconds / MINUTE) + 5
    after = initialized + math.ceil(obs.after_init_seconds(budget) / MINUTE) + 5
    return initialized, before, after


@pytest.mark.parametrize("name", RULE_STACKS)
def test_a_pod_with_local_weights_that_never_gets_ready_alerts_a_start_budget_after_its_init(name, tmp_path):
    """Weights already on the node (the copy finds its marker in seconds), vLLM never ready: the
    startup and outage alerts fire NOT_READY_START_BUDGETS x the vLLM start budget after the init
    containers finished (kube_pod_status_initialized_time), not after the worst case of every
    phase counted from the pod's creation (hours)."""
    w, budget = world(name), _budget(name)
    created = 0
    initialized, before, after = not_ready_minutes(name)
    assert after < before
    length = after + 15
    tl = Timeline(w, length, {})
    assert tl.pod(w.pods[0], created, budget.scenarios["repeat_trial"], never_ready=True) is None
    (no_ready,) = rules_by_alert(w)["KimiVllmNoReadyReplica"]
    (over_budget,) = rules_by_alert(w)["KimiVllmStartupOverBudget"]
    labels = {"namespace": w.namespace, "pod": w.pods[0], "job": "kube-state-metrics"}
    checks = [
        (after - 2, no_ready["alert"], []), (after - 2, over_budget["alert"], []),
        (after + 2, no_ready["alert"], [expect(no_ready, {})]),
        (after + 2, over_budget["alert"], [expect(over_budget, labels)]),
    ]
    run_case(tmp_path, w, "not-ready-after-init", tl.series, checks)


def test_alert_unit_tests_can_fail(tmp_path):
    """The same harness rejects a rule that stays firing (today's XID rule shape) where the
    expectation says resolved."""
    w = world("gb300")
    broken = [{"name": "g", "rules": [{"alert": "KimiGpuXidError", "expr": f"{m.DCGM_XID_ERRORS} > 0",
                                       "labels": {"severity": "critical"}}]}]
    test = {"interval": "1m",
            "input_series": [
                {"series": promtool.selector(m.DCGM_XID_ERRORS, {"gpu": "0"}), "values": promtool.values((0, 5), (79, 40))}
            ],
            "alert_rule_test": [{"eval_time": "40m", "alertname": "KimiGpuXidError", "exp_alerts": []}]}
    done = promtool.unit_test(broken, test, tmp_path, "broken")
    assert done.returncode != 0 and "KimiGpuXidError" in done.stdout + done.stderr
    del w


# -- scaling queries ------------------------------------------------------------------------------


def scaling_queries(name: str, variant: str = "keda") -> dict[str, str]:
    """Signal -> the query the scaler runs: the ScaledObject's Prometheus triggers, or the
    prometheus-adapter rules of the HPA variant."""
    run = observed(name, variant)
    if variant == "hpa":
        plan = scaling_plan(run.context.spec, run.context.sizing)
        names = {v: k for k, v in asc_mod.HPA_EXTERNAL_METRICS.items()}
        return {names[r["name"]["as"]]: r["metricsQuery"] for r in asc_mod.adapter_rules(run.context.spec, plan)}
    return {t["name"]: t["metadata"]["query"] for t in one(run, "ScaledObject")["spec"]["triggers"] if t["type"] == "prometheus"}


def hold_minutes(name: str, variant: str) -> int:
    run = observed(name, variant)
    return math.ceil(scaling_plan(run.context.spec, run.context.sizing).scale_down_delay_seconds / MINUTE)


@dataclass(frozen=True)
class ScalingCase:
    """One state of the world and what each signal must read then (None: no value, an error for
    the scaler, so KEDA's fallback holds the replicas)."""

    series: dict[str, str]
    eval_minute: int
    queue: float | None
    kv_cache: float | None
    busy_replicas: float | None


def scaling_cases(w: World, hold: int) -> dict[str, ScalingCase]:
    """The states a scaler meets, over ``hold`` minutes of scale-down delay."""
    p1, p2 = w.pods
    end = hold + 60  # every case runs longer than the hold
    n = end + 1

    def replica(pod: str, waiting: str, running: str, kv: str) -> dict[str, str]:
        return {w.vllm(m.VLLM_NUM_REQUESTS_WAITING, pod): waiting, w.vllm(m.VLLM_NUM_REQUESTS_RUNNING, pod): running,
                w.vllm(m.VLLM_KV_CACHE_USAGE, pod): kv}

    def ready(pod: str, values: str) -> dict[str, str]:
        return {w.pod(m.KSM_POD_STATUS_READY, pod, condition="true"): values}

    def workers() -> dict[str, str]:  # LeaderWorkerSet workers: ready, no /metrics of their own
        return ready(w.worker_pod, promtool.values((1, n))) if w.worker_pod else {}

    two = {w.scale_target(): promtool.values((2, n)), **ready(p1, promtool.values((1, n))), **ready(p2, promtool.values((1, n))),
           **workers()}

    def const(value: float) -> str:
        return promtool.values((value, n))

    def until(value: float, minute: int) -> str:  # scraped until `minute`, then the scrape is lost
        return promtool.values((value, minute), ("stale", 1))

    lost_at = hold + 10
    busy = {**two, **replica(p1, const(3), const(2), const(0.5)), **replica(p2, const(5), const(0), const(0.25))}
    quiet = {**two, **replica(p1, const(0), const(0), const(0)), **replica(p2, const(0), const(0), const(0))}
    # demand 10 minutes in, none since
    earlier = {**two, **replica(p1, promtool.values((6, 10), (0, n - 10)), const(0), const(0)),
               **replica(p2, const(0), const(0), const(0))}
    lost_p2 = replica(p2, until(0, lost_at), until(0, lost_at), until(0.1, lost_at))
    cases = {
        "demand": ScalingCase(busy, end, 8, 0.75, 1),
        "idle": ScalingCase(quiet, end, 0, 0, 0),
        # held for the whole scale-down delay, then gone
        "demand-held": ScalingCase(earlier, hold, 6, 0, 0),
        "demand-expired": ScalingCase(earlier, end, 0, 0, 0),
        # scaled to zero (outside the serving windows): no vLLM series, the workload says 0 replicas
        "zero-replicas": ScalingCase({w.scale_target(): const(0)}, end, 0, 0, 0),
        # nothing to read at all (kube-state-metrics and vLLM both gone): an error, not "idle"
        "nothing-readable": ScalingCase({w.scale_target(): until(2, 10)}, end, None, None, None),
        # both replicas ready but their scrape is lost at `lost_at`: an error at once, not a held value
        "scrape-lost": ScalingCase(
            {**two, **replica(p1, until(3, lost_at), until(1, lost_at), until(0.5, lost_at)), **lost_p2},
            lost_at + 2, None, None, None,
        ),
        # one of two ready replicas unscraped: the sum would undercount, so no value either
        "one-scrape-lost": ScalingCase(
            {**two, **replica(p1, const(3), const(1), const(0.5)), **lost_p2}, lost_at + 2, None, None, None,
        ),
        # lost for longer than the hold, kube-state-metrics unread: still an error, never "idle"
        "scrape-lost-past-hold": ScalingCase(
            replica(p1, until(3, 10), until(1, 10), until(0.5, 10)), hold + 20, None, None, None,
        ),
    }
    # The serving window opens at `start`: 0 -> 1 replica; the new pod loads for 30 minutes (no
    # series, not ready), then serves. While it loads the signals read the held 0, not an error.
    start = hold + 10
    loading, serving = (None, start + 30), n + 10 - start - 30
    scale_up = {w.scale_target(): promtool.values((0, start), (1, n + 40 - start)),
                **ready(p1, promtool.values((None, start), (0, 30), (1, n + 10 - start)))}
    scale_up.update(replica(p1, promtool.values(loading, (2, serving)), promtool.values(loading, (1, serving)),
                            promtool.values(loading, (0.25, serving))))
    cases["scale-up-loading"] = ScalingCase(scale_up, start + 15, 0, 0, 0)
    cases["scale-up-serving"] = ScalingCase(scale_up, start + 40, 2, 0.25, 1)
    return cases


SCALING_VARIANTS = [(n, "keda") for n in RULE_STACKS] + [("mi355x", "zero"), ("mi355x", "hpa")]
CASE_NAMES = ("demand", "idle", "demand-held", "demand-expired", "zero-replicas", "nothing-readable", "scrape-lost",
              "one-scrape-lost", "scrape-lost-past-hold", "scale-up-loading", "scale-up-serving")


@pytest.mark.parametrize("case", CASE_NAMES)
@pytest.mark.parametrize("name, variant", SCALING_VARIANTS)
def test_scaling_query_reads_each_state_of_the_world(name, variant, case, tmp_path):
    w = world(name, variant)
    c = scaling_cases(w, hold_minutes(name, variant))[case]
    queries = scaling_queries(name, variant)
    assert set(queries) == {"queue", "kv-cache", "busy-replicas"}
    expected = {"queue": c.queue, "kv-cache": c.kv_cache, "busy-replicas": c.busy_replicas}
    exprs = [
        {"expr": queries[q], "eval_time": f"{c.eval_minute}m", "exp_samples": [] if v is None else promtool.samples([({}, v)])}
        for q, v in expected.items()
    ]
    series = [{"series": s, "values": v} for s, v in c.series.items()]
    test = {"interval": "1m", "input_series": series, "promql_expr_test": exprs}
    done = promtool.unit_test([], test, tmp_path, f"{variant}-{case}")
    assert done.returncode == 0, f"{name} ({variant}) {case}:\n{done.stdout}{done.stderr}"
    if variant != "hpa" and any(v is None for v in expected.values()):
        # KEDA reads an empty result as an error (engaging the fallback) only without ignoreNullValues
        triggers = {t["name"]: t for t in one(observed(name, variant), "ScaledObject")["spec"]["triggers"]}
        for q, v in expected.items():
            if v is None:
                ignore = triggers[q]["metadata"].get("ignoreNullValues", "true") == "true"  # KEDA's default: true
                with pytest.raises(promtool.KedaError):
                    promtool.keda_reading({"result": []}, ignore)


def test_keda_reading_mirrors_the_scaler():
    assert promtool.keda_reading({"result": []}, True) == 0.0
    with pytest.raises(promtool.KedaError, match="result is empty"):
        promtool.keda_reading({"result": []}, False)
    with pytest.raises(promtool.KedaError, match="multiple elements"):
        promtool.keda_reading({"result": [{"value": [0, "1"]}, {"value": [0, "2"]}]}, True)
    assert promtool.keda_reading({"data": {"result": [{"metric": {}, "value": [0, "2.5"]}]}}, False) == 2.5
    with pytest.raises(promtool.KedaError):
        promtool.keda_reading({"result": [{"value": [0, "NaN"]}]}, False)


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_without_promtool_the_rule_tests_fail_under_ci_and_skip_elsewhere(ci, outcome, monkeypatch, tmp_path):
    """The XID rule's changes(), the budgets and every alert above are held by promtool: where it
    is missing, CI=true must fail the test (never a silent skip); a laptop skips with the hint."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no promtool on it
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="promtool is not installed"):
        promtool.check_rules([], tmp_path)

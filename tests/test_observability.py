"""Observability (issue 15): every PromQL expression the stack ships (scaler queries, alerts,
dashboard) parses with a real PromQL parser (promql-parser, the Rust parser's Python binding) and
names only series the pinned vLLM (its loggers.py, read from the installed wheel), the pinned GPU
exporters or kube-state-metrics export; each alert reads at least one of them; the dashboard file
is what the code builds and its ConfigMap is labelled for the Grafana sidecar; the NetworkPolicy
admits the Prometheus pods to the metrics port only; the GPU exporters are pinned add-ons."""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import pytest

from components.core import metrics as m
from components.core.config import read_stack_config
from components.core.load import load_stack
from components.core.versions import HELM_CHARTS, VLLM_VERSION
from components.k8s import observability as obs
from components.k8s.addons import addon_values, addons_to_install
from tests.conftest import FIXED_NOW, plan_for
from tests.test_autoscaling import autoscaled
from tests.test_k8s_schemas import validate_against_crd, validate_core
from tests.test_k8s_workloads import HELM_RELEASE, of_kind, one
from tests.vllm_contract import require_vllm_python

REQUIRED_ALERTS = {
    "KimiVllmNoReadyReplica", "KimiVllmStartupOverBudget", "KimiVllmQueueGrowing", "KimiVllmKvCacheNearFull",
    "KimiWeightSyncFailed", "KimiWeightSyncStalled",
}


def vllm_package() -> Path:
    """site-packages/vllm of the pinned engine's venv (skips where it is not installed)."""
    python = require_vllm_python()
    found = sorted(python.resolve().parent.parent.glob("lib/python3*/site-packages/vllm")) or sorted(
        Path(python).parent.parent.glob("lib/python3*/site-packages/vllm")
    )
    if not found:
        pytest.skip(f"no vllm package next to {python}")
    return found[0]


def engine_metric_names() -> set[str]:
    """Metric names the pinned vLLM registers (``name="vllm:..."`` in v1/metrics/loggers.py)."""
    text = (vllm_package() / "v1" / "metrics" / "loggers.py").read_text()
    return set(re.findall(r'name="(vllm:[a-z0-9_]+)"', text))


def selectors(expr: str) -> list[str]:
    """Series names of every vector selector in ``expr`` (parsed; raises ValueError if invalid)."""
    names: list[str] = []
    promql_parser.walk(
        promql_parser.parse(expr),
        lambda n: names.append(n.name) if isinstance(n, promql_parser.VectorSelector) and n.name else None,
    )
    return names


def vector_matchers(expr: str) -> list[tuple[str, dict[str, str]]]:
    """``(series name, {label: value})`` of every vector selector in ``expr``."""
    found: list[tuple[str, dict[str, str]]] = []
    promql_parser.walk(
        promql_parser.parse(expr),
        lambda n: found.append((n.name, {mm.name: mm.value for mm in n.matchers.matchers}))
        if isinstance(n, promql_parser.VectorSelector) else None,
    )
    return found


def all_alerts(run) -> list[dict]:
    return [r for g in one(run, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]


# -- the metric registry -------------------------------------------------------------------------


def test_pinned_vllm_registers_every_engine_metric_we_read():
    registered = engine_metric_names()
    assert len(registered) > 30  # the regex reads the real file
    missing = set(m.VLLM_METRICS) - registered
    assert not missing, f"vLLM {VLLM_VERSION} does not register {sorted(missing)}"


def test_vllm_serves_metrics_on_the_api_port_without_a_metrics_port_option():
    pkg = vllm_package()
    mount = (pkg / "entrypoints" / "serve" / "instrumentator" / "metrics.py").read_text()
    assert 'Mount("/metrics", make_asgi_app(' in mount  # mounted on the API app itself
    cli = "".join(p.read_text() for p in (pkg / "entrypoints").rglob("cli_args.py"))
    assert not re.search(r"metrics[-_]port", cli), (
        "vLLM now has a metrics port option: give /metrics its own port in the NetworkPolicy"
    )


def test_registry_check_can_fail():
    with pytest.raises(ValueError):
        selectors("sum(rate(vllm:generation_tokens_total[5m])")  # unbalanced
    assert "vllm:generation_tokens_totl" not in m.known_series_names()
    assert selectors('max(vllm:kv_cache_usage_perc{namespace="kimi"}) > 0.9') == ["vllm:kv_cache_usage_perc"]


# -- alerts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mi355x", "gb300"])
def test_prometheus_rule_validates_and_has_every_alert(name):
    extra = {}
    if name == "gb300":
        extra = {
            "kimi-deploy:kubernetes": {
                **read_stack_config("gb300")["kimi-deploy:kubernetes"],
                "installedAddons": ["prometheus-operator"],
            }
        }
    run = autoscaled(name, extra)
    rule = one(run, "PrometheusRule")
    validate_against_crd(rule)
    alerts = {a["alert"] for a in all_alerts(run)}
    gpu_alert = "KimiGpuUncorrectableEcc" if name == "mi355x" else "KimiGpuXidError"
    assert REQUIRED_ALERTS | {gpu_alert} == alerts


@pytest.mark.parametrize("name", ["mi355x", "gb300"])
def test_every_alert_parses_and_reads_only_exported_metrics(name):
    extra = {
        "kimi-deploy:kubernetes": {
            **read_stack_config(name)["kimi-deploy:kubernetes"],
            "installedAddons": ["prometheus-operator"],
        }
    }
    run = autoscaled(name, extra)
    known = m.known_series_names()
    engine = engine_metric_names()
    vendor_metrics = m.GPU_EXPORTER_METRICS[m.gpu_exporter_for(run.context.spec.target.gpu.vendor)]
    for alert in all_alerts(run):
        names = selectors(alert["expr"])
        assert names, f"{alert['alert']} reads no metric"
        unknown = [n for n in names if n not in known]
        assert not unknown, f"{alert['alert']}: {unknown} are not exported by vLLM, the GPU exporter or kube-state-metrics"
        for n in names:
            if n.startswith("vllm:"):
                base = re.sub(r"_(total|bucket|sum|count|created)$", "", n)
                assert n in engine or base in engine, f"{alert['alert']}: {n} not registered by vLLM {VLLM_VERSION}"
            if n.startswith(("DCGM_", "gpu_")):
                assert n in vendor_metrics, f"{alert['alert']}: {n} is another vendor's metric"
        assert alert["labels"]["severity"] in ("warning", "critical") and alert["annotations"]["summary"]


def test_alert_thresholds_follow_the_sizing_and_config():
    run = plan_for("mi355x")
    sizing = run.context.sizing
    from components.k8s.vllm_service import per_pod_budget_seconds

    budget = per_pod_budget_seconds(run.context.spec, sizing)
    alerts = {a["alert"]: a for a in all_alerts(run)}
    assert (
        f"< {budget})" in alerts["KimiVllmNoReadyReplica"]["expr"]
        and f"> {budget})" in alerts["KimiVllmStartupOverBudget"]["expr"]
    )
    assert alerts["KimiVllmQueueGrowing"]["for"] == "10m" and "[10m:1m]" in alerts["KimiVllmQueueGrowing"]["expr"]
    assert alerts["KimiVllmKvCacheNearFull"]["expr"].endswith("> 0.95")
    assert 'pod=~"kimi-vllm-[a-z0-9]+-[a-z0-9]+"' in alerts["KimiVllmNoReadyReplica"]["expr"]
    # mi355x has no Job at all: the node-local copy is the vLLM pods' init container.
    assert 'container="weight-sync"' in alerts["KimiWeightSyncStalled"]["expr"]
    assert "job_name" not in alerts["KimiWeightSyncStalled"]["expr"] + alerts["KimiWeightSyncFailed"]["expr"]
    changed = plan_for("mi355x", overrides={"kimi-deploy:observability": {
        **read_stack_config("mi355x")["kimi-deploy:observability"], "queueAlertMinutes": 30, "kvCacheAlertFraction": 0.9}})
    alerts = {a["alert"]: a for a in all_alerts(changed)}
    assert alerts["KimiVllmQueueGrowing"]["for"] == "30m" and alerts["KimiVllmKvCacheNearFull"]["expr"].endswith("> 0.9")


def test_lws_alerts_select_the_leader_pods():
    extra = {
        "kimi-deploy:kubernetes": {
            **read_stack_config("gb300")["kimi-deploy:kubernetes"],
            "installedAddons": ["prometheus-operator"],
        }
    }
    alerts = {a["alert"]: a for a in all_alerts(autoscaled("gb300", extra))}
    assert 'pod=~"kimi-vllm-[0-9]+"' in alerts["KimiVllmNoReadyReplica"]["expr"]
    assert re.fullmatch(obs.serving_pod_regex(True), "kimi-vllm-0") and not re.fullmatch(
        obs.serving_pod_regex(True), "kimi-vllm-0-1"
    )
    assert re.fullmatch(obs.serving_pod_regex(False), "kimi-vllm-7d9f8c6b5-x2k4q")


def test_no_prometheus_rule_without_the_operator_or_with_alerts_off():
    assert not of_kind(plan_for("b300-prod"), "PrometheusRule")
    off = plan_for(
        "mi355x",
        overrides={"kimi-deploy:observability": {**read_stack_config("mi355x")["kimi-deploy:observability"], "alerts": False}},
    )
    assert not of_kind(off, "PrometheusRule")


# -- scaler queries --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["b300-prod", "gb300", "mi355x"])
def test_scaler_queries_parse_and_read_the_engine_metrics(name):
    engine = engine_metric_names()
    # besides vLLM: kube-state-metrics' replica count (zero replicas) and pod readiness (a lost scrape)
    ksm = {m.KSM_POD_STATUS_READY, m.KSM_STATEFULSET_REPLICAS if name == "gb300" else m.KSM_DEPLOYMENT_SPEC_REPLICAS}
    for trig in one(autoscaled(name), "ScaledObject")["spec"]["triggers"]:
        if trig["type"] != "prometheus":
            continue
        names = set(selectors(trig["metadata"]["query"]))
        assert names - ksm and names - ksm <= engine and ksm <= names, f"{trig['name']}: {names}"


# -- dashboard ------------------------------------------------------------------------------------


def test_dashboard_file_is_what_the_code_builds():
    assert obs.DASHBOARD_PATH.read_text() == obs.dashboard_text()
    from scripts.dev.render_dashboard import main

    assert main(["--check"]) == 0


def test_render_dashboard_usage_and_unreachable_prometheus(capsys):
    from scripts.dev.render_dashboard import legend, main
    from tests.live_prometheus import free_port

    assert legend("running {{pod}}", {"pod": "kimi-vllm-0"}) == "running kimi-vllm-0"
    with pytest.raises(SystemExit) as exit_info:
        main(["--png", "x.png"])
    assert exit_info.value.code == 2 and "--prometheus and --png go together" in capsys.readouterr().err
    assert main(["--prometheus", f"http://127.0.0.1:{free_port()}", "--png", "x.png", "--minutes", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: http://127.0.0.1:") and len(err.strip().splitlines()) == 1


def test_dashboard_panels_cover_the_issue_and_every_query_parses():
    doc = json.loads(obs.DASHBOARD_PATH.read_text())
    titles = {p["title"] for p in doc["panels"]}
    for wanted in (
        "Time to first token",
        "Inter-token latency",
        "Throughput (tokens/s)",
        "Queue depth",
        "KV cache usage per replica",
        "Running and waiting per replica",
        "GPU utilisation",
        "GPU memory used",
    ):
        assert wanted in titles
    known = m.known_series_names()
    engine = engine_metric_names()
    seen: set[str] = set()
    for title, expr in obs.dashboard_expressions(doc):
        names = selectors(obs.substitute_variables(expr))
        assert names and set(names) <= known, f"{title}: {names}"
        seen.update(names)
        for n in names:
            if n.startswith("vllm:"):
                assert re.sub(r"_(total|bucket|sum|count)$", "", n) in engine, f"{title}: {n}"
    # both vendors' GPU metrics, so one file serves B300/GB300 and MI355X
    assert {m.DCGM_GPU_UTIL, m.DCGM_FB_USED, m.AMD_GFX_ACTIVITY, m.AMD_USED_VRAM} <= seen


def test_dashboard_panels_do_not_overlap():
    cells: dict[tuple[int, int], str] = {}
    for p in obs.dashboard()["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells.get((x, y))}"
                cells[(x, y)] = p["title"]


def test_dashboard_configmap_for_the_grafana_sidecar():
    run = plan_for("mi355x")
    (cm,) = [c for c in of_kind(run, "ConfigMap") if c["metadata"]["name"] == obs.DASHBOARD_CONFIGMAP]
    validate_core(cm)
    assert cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["kimi-vllm.json"]) == obs.dashboard()
    assert not [c for c in of_kind(plan_for("b300-prod"), "ConfigMap") if c["metadata"]["name"] == obs.DASHBOARD_CONFIGMAP]


# -- NetworkPolicy --------------------------------------------------------------------------------


def test_network_policy_admits_prometheus_pods_to_the_metrics_port_only():
    run = plan_for("mi355x")
    policy = one(run, "NetworkPolicy")
    validate_core(policy)
    scrape = [r for r in policy["spec"]["ingress"] if any("podSelector" in p and "namespaceSelector" in p for p in r["from"])]
    assert scrape == [{
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
        "ports": [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": m.SYNC_METRICS_PORT}],
    }]
    # the client rule is unchanged: monitoring is not a client namespace
    client = [r for r in policy["spec"]["ingress"] if r not in scrape]
    assert all("monitoring" not in json.dumps(r) for r in client)


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions In/NotIn/Exists) against labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        value = labels.get(e["key"])
        ok = {"In": value in e.get("values", []), "NotIn": value not in e.get("values", []),
              "Exists": e["key"] in labels, "DoesNotExist": e["key"] not in labels}[e["operator"]]
        if not ok:
            return False
    return True


def _admitted_ports(policy: dict, namespace: str, pod_labels: dict[str, str]) -> set[int]:
    """Ports of the policy's pods that a pod (in ``namespace``, with ``pod_labels``) may reach."""
    ns_labels = {"kubernetes.io/metadata.name": namespace}
    ports: set[int] = set()
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            if "ipBlock" in peer:
                continue
            in_ns = _selects(peer["namespaceSelector"], ns_labels) if "namespaceSelector" in peer else namespace == "kimi"
            if in_ns and _selects(peer.get("podSelector", {}), pod_labels):
                ports |= {p["port"] for p in rule.get("ports", [{"port": "all"}])}
    return ports


def test_network_policy_admits_exactly_the_scraping_prometheus():
    """The Prometheus Operator's Prometheus pods (labels from prometheus-operator
    pkg/prometheus/server/statefulset_test.go) in observability.prometheusNamespace reach the metrics
    port; nothing else in that namespace, and no Prometheus elsewhere."""
    policy = one(plan_for("mi355x"), "NetworkPolicy")
    operator_prometheus = {
        "prometheus": "kube-prometheus-stack-prometheus", "app.kubernetes.io/name": "prometheus",
        "app.kubernetes.io/managed-by": "prometheus-operator", "app.kubernetes.io/instance": "kube-prometheus-stack-prometheus",
        "operator.prometheus.io/name": "kube-prometheus-stack-prometheus", "operator.prometheus.io/shard": "0",
    }
    assert _admitted_ports(policy, "monitoring", operator_prometheus) == {8000, m.SYNC_METRICS_PORT}
    neighbours = [
        {"app.kubernetes.io/name": "grafana"}, {"app.kubernetes.io/name": "kube-state-metrics"},
        {"app.kubernetes.io/name": "prometheus-node-exporter"}, {"app.kubernetes.io/name": "alertmanager"},
        {"app.kubernetes.io/name": "prometheus-agent", "app.kubernetes.io/managed-by": "prometheus-operator"},
    ]
    for labels in neighbours:
        assert not _admitted_ports(policy, "monitoring", labels), labels
    assert not _admitted_ports(policy, "team-x", operator_prometheus)


@pytest.mark.parametrize("name", ["b300-prod", "gb300", "mi355x"])
def test_pod_monitor_selects_the_serving_pods_and_their_metrics_port_only(name):
    from tests.test_k8s_workloads import pod_templates

    extra = {"kimi-deploy:kubernetes": {**read_stack_config(name)["kimi-deploy:kubernetes"],
                                        "installedAddons": ["prometheus-operator"]}}
    run = autoscaled(name, extra)
    monitor = one(run, "PodMonitor")
    endpoint, sync = monitor["spec"]["podMetricsEndpoints"]
    assert sync["port"] == m.SYNC_METRICS_PORT_NAME  # the weight sync's progress (test_sync_progress_metrics.py)
    serving = []
    for _, pod in pod_templates(run):
        if not _selects(monitor["spec"]["selector"], pod["metadata"]["labels"]):
            continue
        # an endpoint yields a target only where a container names its port: the API port on the serving pods
        ports = [p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports", [])]
        if endpoint["port"] in ports:
            serving.append(pod["metadata"]["labels"]["app.kubernetes.io/component"])
            (vllm,) = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
            assert endpoint["port"] in [p.get("name") for p in vllm["ports"]]
    assert serving == ["leader" if name == "gb300" else "server"]  # LeaderWorkerSet workers serve no /metrics


def test_network_policy_has_no_scrape_rule_without_a_prometheus_namespace():
    policy = one(plan_for("b300-prod"), "NetworkPolicy")
    assert not [r for r in policy["spec"]["ingress"] if any("podSelector" in p and "namespaceSelector" in p for p in r["from"])]


def test_plan_warns_when_a_configured_scraper_would_be_blocked():
    from components.core.config import namespace_config
    from components.core.load import parse_spec

    full = dict(read_stack_config("mi355x"))
    full["kimi-deploy:observability"] = {"grafanaNamespace": "monitoring", "prometheusUrl": "http://prom.monitoring.svc:9090"}
    ns, secrets = namespace_config(full)
    spec = parse_spec(ns, stack="mi355x", now=FIXED_NOW, secrets_set=secrets)
    assert any("NetworkPolicy blocks its scrape" in w for w in spec.warnings)
    assert not any("NetworkPolicy blocks" in w for w in load_stack("mi355x", now=FIXED_NOW).warnings)


# -- GPU exporters ----------------------------------------------------------------------------------


def test_gpu_exporters_are_pinned_addons_of_the_vendor_unless_installed():
    run = plan_for("mi355x")
    releases = {r.name.removeprefix("addon-"): r.inputs for r in run.of_type(HELM_RELEASE)}
    chart = HELM_CHARTS["amd-metrics-exporter"]
    assert (
        releases["amd-metrics-exporter"]["chart"] == chart.chart and releases["amd-metrics-exporter"]["version"] == chart.version
    )
    values = releases["amd-metrics-exporter"]["values"]
    assert values["serviceMonitor"] == {"enabled": True, "honorLabels": True, "labels": {"release": "kube-prometheus-stack"}}
    assert values["nodeSelector"]["amd.com/gpu.product-name"] == "AMD_Instinct_MI355X"
    nvidia = autoscaled("gb300")
    assert "dcgm-exporter" in nvidia.outputs["kubernetesAddons"]
    dcgm = addon_values(nvidia.context.spec, "dcgm-exporter")
    assert dcgm["serviceMonitor"] == {
        "enabled": True,
        "honorLabels": True,
        "additionalLabels": {"release": "kube-prometheus-stack"},
    }
    installed = plan_for(
        "mi355x",
        overrides={
            "kimi-deploy:kubernetes": {
                **read_stack_config("mi355x")["kimi-deploy:kubernetes"],
                "installedAddons": ["amd-gpu-operator", "prometheus-operator", "amd-metrics-exporter", "keda"],
            }
        },
    )
    assert addons_to_install(installed.context.spec) == ()
    assert HELM_CHARTS["keda"].version == "2.20.2"  # matches the CRDs the ScaledObject is validated against


@pytest.mark.parametrize("name", ["b300-prod", "gb300", "mi355x"])
def test_monitor_labels_reach_every_object_a_prometheus_selects(name):
    """kube-prometheus-stack's Prometheus selects PodMonitors, ServiceMonitors and PrometheusRules
    labelled release=<its release>: by default every object carries release=kube-prometheus-stack,
    and the plan names the selector it assumes."""
    from scripts.ops.plan import build_plan_document

    extra = {"kimi-deploy:kubernetes": {**read_stack_config(name)["kimi-deploy:kubernetes"],
                                        "installedAddons": ["prometheus-operator"]}}
    run = autoscaled(name, extra)
    vendor_exporter = m.gpu_exporter_for(run.context.spec.target.gpu.vendor)
    for kind in ("PodMonitor", "PrometheusRule"):
        doc = one(run, kind)
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        validate_against_crd(doc)
    monitor = addon_values(run.context.spec, vendor_exporter)["serviceMonitor"]
    assert monitor["enabled"] and monitor.get("labels", monitor.get("additionalLabels")) == {"release": "kube-prometheus-stack"}
    if name == "mi355x":
        doc = build_plan_document(name, now=FIXED_NOW)
        assert doc["scraping"].startswith("PodMonitor and PrometheusRule labelled release=kube-prometheus-stack: assumes")
    # another release name, or {} for a Prometheus that selects everything
    observability = {**read_stack_config("mi355x")["kimi-deploy:observability"], "monitorLabels": {"release": "prom"}}
    other = plan_for("mi355x", overrides={"kimi-deploy:observability": observability})
    assert one(other, "PodMonitor")["metadata"]["labels"]["release"] == "prom"
    observability["monitorLabels"] = {}
    everything = plan_for("mi355x", overrides={"kimi-deploy:observability": observability})
    assert "release" not in one(everything, "PrometheusRule")["metadata"]["labels"]


def test_the_plan_names_the_scrape_path():
    from components.core.config import namespace_config
    from components.core.load import parse_spec
    from components.core.scraping import scraping_summary

    assert scraping_summary(load_stack("b300", now=FIXED_NOW)) is None  # EC2: no Kubernetes scrape
    assert scraping_summary(load_stack("b300-prod", now=FIXED_NOW)).startswith("not scraped")
    full = dict(read_stack_config("mi355x"))
    full["kimi-deploy:kubernetes"] = {**full["kimi-deploy:kubernetes"], "installedAddons": ["amd-gpu-operator"]}
    full["kimi-deploy:observability"] = {**full["kimi-deploy:observability"], "prometheusUrl": "http://prom.monitoring.svc:9090"}
    ns, secrets = namespace_config(full)
    annotated = scraping_summary(parse_spec(ns, stack="mi355x", now=FIXED_NOW, secrets_set=secrets))
    assert annotated.startswith("prometheus.io/* annotations on the serving pods, for the Prometheus at http://prom.monitoring")


def test_bad_monitor_label_is_a_config_error():
    from components.core.errors import ConfigError

    observability = {**read_stack_config("mi355x")["kimi-deploy:observability"], "monitorLabels": {"release": "kube prometheus"}}
    with pytest.raises(
        ConfigError, match=r"observability.monitorLabels: \{'release': 'kube prometheus'\} is not a valid Kubernetes label"
    ):
        plan_for("mi355x", overrides={"kimi-deploy:observability": observability})


def test_every_dashboard_query_is_limited_to_the_chosen_namespace():
    """GPU panels included: both exporters label a GPU with the namespace of the pod holding it, so
    on a shared cluster the panels show only this deployment's GPUs."""
    gpu_metrics = set().union(*m.GPU_EXPORTER_METRICS.values())
    seen_gpu = set()
    for title, expr in obs.dashboard_expressions(obs.dashboard()):
        for name, matchers in vector_matchers(obs.substitute_variables(expr)):
            assert matchers.get("namespace") == "kimi", f"{title}: {name} is not limited to the dashboard's namespace"
            seen_gpu |= {name} & gpu_metrics
    assert {m.AMD_GFX_ACTIVITY, m.AMD_USED_VRAM, m.DCGM_GPU_UTIL, m.DCGM_FB_USED} <= seen_gpu


def _unparen(node):
    while isinstance(node, promql_parser.ParenExpr):
        node = node.expr
    return node


@pytest.mark.parametrize("name", ["b300-prod", "gb300"])
def test_xid_alert_fires_on_a_change_of_the_last_xid_not_on_its_level(name):
    """Without promtool: dcgm-exporter's DCGM_FI_DEV_XID_ERRORS holds the last XID and never resets,
    so the rule must be ``(xid > 0) and (changes(xid[window]) > 0)`` over this namespace's GPUs; a
    plain ``xid > 0`` would fire for ever after one error (the promtool tests run it too)."""
    extra = {"kimi-deploy:kubernetes": {**read_stack_config(name)["kimi-deploy:kubernetes"],
                                        "installedAddons": ["prometheus-operator"]}}
    (rule,) = [a for a in all_alerts(autoscaled(name, extra)) if a["alert"] == "KimiGpuXidError"]
    top = _unparen(promql_parser.parse(rule["expr"]))
    assert isinstance(top, promql_parser.BinaryExpr) and str(top.op) == "and"
    sides = [_unparen(top.lhs), _unparen(top.rhs)]
    level = next(s for s in sides if isinstance(_unparen(s.lhs), promql_parser.VectorSelector))
    change = next(s for s in sides if isinstance(_unparen(s.lhs), promql_parser.Call))
    assert str(level.op) == ">" and level.rhs.val == 0
    call = _unparen(change.lhs)
    assert call.func.name == "changes" and str(change.op) == ">" and change.rhs.val == 0
    (matrix,) = call.args
    assert isinstance(matrix, promql_parser.MatrixSelector)
    assert matrix.range.total_seconds() == obs.GPU_ERROR_WINDOW_MINUTES * 60
    for selector in (_unparen(level.lhs), matrix.vector_selector):
        assert selector.name == m.DCGM_XID_ERRORS
        assert {mm.name: mm.value for mm in selector.matchers.matchers} == {"namespace": "kimi"}
    assert "for" not in rule  # it fires at once on a change and resolves when the window has passed

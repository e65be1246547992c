"""A real Prometheus scraping the real vLLM server under a bounded load evaluates every KEDA trigger,
prometheus-adapter rule, alert rule and dashboard query the stacks render (issue 19 item 4).

One Prometheus (Debian's 2.42, on 127.0.0.1) scrapes the one real server (``tests/real_vllm``'s
``real_vllm_server``) through the PodMonitor of each Kubernetes stack, each stack in its own
namespace (``LIVE_NAMESPACES``), plus the same PodMonitor in another team's namespace: each job
replays prometheus-operator's relabeling over the pods the stack renders (``tests/live_prometheus``),
so the queries' ``namespace``/``pod``/``model_name`` matchers meet the labels a cluster scrape gives.
It also loads every stack's PrometheusRule groups. The load is ``LOAD_CONCURRENCY`` streams of
long-prompt chat completions that keep requests running and waiting in the engine at every step, until
the scaling signals show the load in every namespace (at most ``LOAD_MAX_SECONDS``).

Timings (Prometheus start to ready, to the first scrape of every target, to the signals) and each
namespace's scrapes during the load are printed by ``test_live_tier_timings``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.core import metrics as m
from components.core.config import read_stack_config
from components.core.scaling import scaling_plan
from components.k8s import autoscaling as asc_mod
from components.k8s import observability as obs
from tests import promtool
from tests.live_prometheus import Pod, Prometheus, pod_monitor_job
from tests.test_autoscaling import autoscaled
from tests.test_k8s_workloads import one, vllm_pods

pytestmark = pytest.mark.real_engine

# Each Kubernetes stack's scrape of the one server lands in its own namespace.
LIVE_NAMESPACES = {"b300-prod": "kimi-prod", "gb300": "kimi-lws", "mi355x": "kimi"}
OTHER_NAMESPACE = "other-team"  # another team's scrape of a server with the same model name
DASHBOARD_STACK = "mi355x"
DEPLOYMENT_POD = "kimi-vllm-7d9f8c6b5-x2k4q"
# Also the scrape timeout. On 2 cores busy with the load (and other jobs), the server's /metrics took
# more than 5 s: a failed scrape marks every series stale at once, and the queries read only the
# scale-to-zero branch (0.0 in every namespace while 58 long requests were served). 15 s leaves room
# and still puts a sample in every 30 s step of the scaling queries.
SCRAPE_INTERVAL = "15s"
SCRAPE_INTERVAL_SECONDS = 15
# The load keeps requests queued in the engine, so any scrape at any moment sees them. Each of the
# LOAD_CONCURRENCY workers sends a prompt of LOAD_PROMPT_TOKENS tokens longer than the engine's step
# budget (the CPU build's default max_num_batched_tokens, 2,048: vllm/engine/arg_utils.py, "cpu specific
# default values"): a prefill takes several engine steps, and while a running request uses the whole
# budget the V1 scheduler admits no waiting one (vllm/v1/core/sched/scheduler.py ``schedule``: the
# waiting loop runs while ``token_budget > 0``). So requests run and wait in the engine at every step,
# with no gap between one request's end and the next one's start, and the frontend has only
# LOAD_MAX_TOKENS tokens per request to stream. Measured on this machine (load 6-10, 60 s, /metrics read
# every second): 40 requests served, running 3-4 and waiting 4-5 in 59 of 60 reads (the first before the
# load), /metrics in 0.01-0.12 s. The load before (eight streams of 2,000-3,200 generated tokens each, EOS
# ignored) kept the engine busy only while its replies were streamed: waiting 0 in every read, and on a
# loaded machine the server answered /metrics late (up to 44 s) and when its event loop was free, i.e. when
# no reply streamed and the engine was idle, so one namespace's scrapes read 0 running for the whole window.
LOAD_CONCURRENCY = 8
LOAD_PROMPT_TOKENS = 12_000  # the tiny model's tokenizer is byte level: one token per character
LOAD_MAX_TOKENS = 16
# The load runs until every namespace's scaling signals show it (the queries sample at 30 s steps) and
# every target has been scraped busy once more after that (the dashboard window ends in load). These
# bounds are guards against a hung engine or Prometheus, not windows: each wait ends when its
# condition holds.
LOAD_MAX_SECONDS = 600
# One request's bound: it waits behind the others in the engine (seconds each when quiet, more on a
# loaded machine).
LOAD_REQUEST_TIMEOUT_SECONDS = 300
FIRST_SCRAPE_TIMEOUT_SECONDS = 60
SIGNAL_TIMEOUT_SECONDS = LOAD_MAX_SECONDS
# After the load: every target scraped once more (the last requests' counters and histograms).
SCRAPED_AFTER_TIMEOUT_SECONDS = 4 * SCRAPE_INTERVAL_SECONDS


def live_run(name: str, served_model_name: str, variant: str = "keda"):
    """``name`` rendered with the real server's served model name, in its live namespace, with the
    Prometheus Operator installed and autoscaling on (``variant`` ``hpa``: prometheus-adapter)."""
    cfg = read_stack_config(name)
    k8s_cfg = cfg["kimi-deploy:kubernetes"]
    addons = set(k8s_cfg.get("installedAddons", [])) | {"prometheus-operator"}
    extra: dict[str, Any] = {"kimi-deploy:model": {**cfg["kimi-deploy:model"], "servedModelName": served_model_name}}
    if variant == "hpa":
        extra["kimi-deploy:autoscaling"] = {"enabled": True, "maxReplicas": 2, "controller": "hpa"}
        addons.add("prometheus-adapter")
    extra["kimi-deploy:kubernetes"] = {**k8s_cfg, "namespace": LIVE_NAMESPACES[name], "installedAddons": sorted(addons)}
    return autoscaled(name, extra)


def stack_pods(run, namespace: str) -> list[Pod]:
    """The pods the stack's workload makes: a Deployment pod, or a LeaderWorkerSet leader and worker."""
    templates = vllm_pods(run)
    if "leader" in templates:
        return [Pod.from_template(namespace, "kimi-vllm-0", templates["leader"]),
                Pod.from_template(namespace, "kimi-vllm-0-1", templates["worker"])]
    return [Pod.from_template(namespace, DEPLOYMENT_POD, templates["server"])]


@dataclass
class LoadReport:
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ended_at: float = 0.0  # unix seconds


def load_prompt(worker: int, request: int) -> str:
    """The prompt of ``worker``'s ``request``-th request: ``LOAD_PROMPT_TOKENS`` characters that begin
    with both numbers, so no two requests share more than the chat template's prefix (the server runs
    with ``--enable-prefix-caching``: a repeated prompt would be served from the cache, without a prefill)."""
    head = f"load {worker}.{request}: "
    return head + "abcdefghij" * ((LOAD_PROMPT_TOKENS - len(head)) // 10)


def drive_load(server: Any, stop: threading.Event, report: LoadReport | None = None) -> LoadReport:
    """``LOAD_CONCURRENCY`` workers send streamed chat completions until ``stop`` (bounded by
    ``LOAD_MAX_SECONDS``): each a prompt of ``LOAD_PROMPT_TOKENS`` tokens (``load_prompt``) and
    ``LOAD_MAX_TOKENS`` tokens asked for, EOS ignored. ``report`` (filled as requests end) lets a
    caller read the counts while the load runs."""
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key, timeout=LOAD_REQUEST_TIMEOUT_SECONDS,
                           max_retries=0)
    report = report if report is not None else LoadReport()
    lock = threading.Lock()
    began = time.monotonic()

    def worker(i: int) -> None:
        sent = 0
        while not stop.is_set() and time.monotonic() - began < LOAD_MAX_SECONDS:
            sent += 1
            try:
                stream = client.chat.completions.create(
                    model=server.served_model_name, max_tokens=LOAD_MAX_TOKENS, stream=True,
                    messages=[{"role": "user", "content": load_prompt(i, sent)}],
                    extra_body={"ignore_eos": True},
                )
                for _ in stream:
                    pass
                with lock:
                    report.ok += 1
            except Exception as exc:  # noqa: BLE001  (reported and asserted on by the tests)
                with lock:
                    report.failed.append(f"{type(exc).__name__}: {exc}"[:300])
                time.sleep(1)

    with concurrent.futures.ThreadPoolExecutor(LOAD_CONCURRENCY) as pool:
        list(pool.map(worker, range(LOAD_CONCURRENCY)))
    report.seconds = time.monotonic() - began
    report.ended_at = time.time()
    return report


@dataclass
class Live:
    prometheus: Prometheus
    runs: dict[str, Any]
    hpa_run: Any
    served_model_name: str
    load: LoadReport
    timings: dict[str, float]
    peak: dict[str, dict[str, float]]
    window: tuple[float, float]
    scrapes: dict[str, ScrapeRecord]  # by namespace, from the load's start to its end


def queries_of(run) -> dict[str, str]:
    return {t["name"]: t["metadata"]["query"] for t in one(run, "ScaledObject")["spec"]["triggers"] if t["type"] == "prometheus"}


def scraped_since(prometheus: Prometheus, since: float, busy: bool = False) -> bool:
    """Whether every target (each stack's and the other team's) was scraped after ``since`` (unix
    seconds), and with ``busy``, that scrape saw requests running.

    ``timestamp()`` is taken of the bare selector: of any other expression (``x > 0``) Prometheus
    returns the evaluation time, not the sample's."""
    running = m.VLLM_NUM_REQUESTS_RUNNING
    expr = f"timestamp({running}) > {since}" + (f" and on(namespace, pod) {running} > 0" if busy else "")
    result = prometheus.query(expr)["result"]
    return len({(r["metric"]["namespace"], r["metric"]["pod"]) for r in result}) == len(LIVE_NAMESPACES) + 1


@dataclass(frozen=True)
class ScrapeRecord:
    """One namespace's scrapes of the server between two instants: ``samples`` are ``(seconds after
    the start, requests running, requests waiting)``, one per scrape, at the scrape's own timestamp;
    ``longest_scrape_seconds`` is the slowest of those scrapes (Prometheus' ``scrape_duration_seconds``)."""

    samples: tuple[tuple[float, float, float], ...]
    longest_scrape_seconds: float = 0.0

    def first_busy_seconds(self) -> float | None:
        """Seconds from the start to the first scrape that saw a request running (None: none did)."""
        return next((t for t, running, _ in self.samples if running > 0), None)

    def summary(self) -> str:
        busy = sum(1 for _, running, _ in self.samples if running > 0)
        queued = sum(1 for _, _, waiting in self.samples if waiting > 0)
        first = self.first_busy_seconds()
        return (f"{len(self.samples)} scrapes, {busy} saw running, {queued} saw waiting, first busy at "
                + ("never" if first is None else f"{first:.1f} s") + f", longest {self.longest_scrape_seconds:.2f} s")


def scrape_records(prometheus: Prometheus, since: float, until: float) -> dict[str, ScrapeRecord]:
    """Each namespace's scrapes between ``since`` and ``until`` (unix seconds), from the stored
    samples of ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and ``scrape_duration_seconds``
    (a range selector returns each sample with its scrape's timestamp)."""
    window = f"{max(int(until - since), 1)}s"
    by_name: dict[str, dict[str, dict[float, float]]] = {}
    for name in (m.VLLM_NUM_REQUESTS_RUNNING, m.VLLM_NUM_REQUESTS_WAITING, "scrape_duration_seconds"):
        for series in prometheus.query(f"{name}[{window}]", at=until)["result"]:
            values = {float(t): float(v) for t, v in series["values"]}
            by_name.setdefault(series["metric"].get("namespace", "?"), {})[name] = values
    out = {}
    for namespace, values in by_name.items():
        running = values.get(m.VLLM_NUM_REQUESTS_RUNNING, {})
        waiting = values.get(m.VLLM_NUM_REQUESTS_WAITING, {})
        durations = values.get("scrape_duration_seconds", {})
        out[namespace] = ScrapeRecord(tuple((round(t - since, 1), running[t], waiting.get(t, 0.0)) for t in sorted(running)),
                                      max(durations.values(), default=0.0))
    return out


def load_story(prometheus: Prometheus, server: Any, so_far: LoadReport, since: float) -> str:
    """What the load, the scrapes and the server did since ``since``: for a failure message. Per
    namespace, the scrapes since then (``up`` samples), those that failed and the most requests a
    scrape saw running; each target's health and last error; the served and failed requests; the
    server log's tail."""
    window = f"{max(int(time.time() - since), 1)}s"
    per_ns: dict[str, dict[str, float]] = {}
    for label, expr in (("scrapes", f"count_over_time(up[{window}])"),
                        ("failed", f"count_over_time(up[{window}]) - sum_over_time(up[{window}])"),
                        ("running max", f"max_over_time({m.VLLM_NUM_REQUESTS_RUNNING}[{window}])")):
        for r in prometheus.query(expr)["result"]:
            per_ns.setdefault(r["metric"].get("namespace", "?"), {})[label] = float(r["value"][1])
    tail = " | ".join(server.log_path.read_text(errors="replace").splitlines()[-8:]) \
        if server.log_path.exists() else "(no server log)"
    samples = {ns: [f"{t:g}s:{r:g}/{w:g}" for t, r, w in record.samples]
               for ns, record in scrape_records(prometheus, since, time.time()).items()}
    return (f"scrapes by namespace {per_ns}; each scrape (seconds after the load began: running/waiting) {samples}; "
            f"targets {prometheus.targets_health()}; load so far: {so_far.ok} served, "
            f"{len(so_far.failed)} failed {so_far.failed[:3]}; server log tail: {tail[-1500:]}")


@pytest.fixture(scope="module")
def live(real_vllm_server, tmp_path_factory) -> Any:
    tier_began = time.monotonic()
    served = real_vllm_server.served_model_name
    address = re.sub(r"^https?://", "", real_vllm_server.metrics_url).split("/", 1)[0]
    runs = {name: live_run(name, served) for name in LIVE_NAMESPACES}
    jobs, groups = [], []
    for name, run in runs.items():
        jobs.append(pod_monitor_job(one(run, "PodMonitor"), stack_pods(run, LIVE_NAMESPACES[name]), address, SCRAPE_INTERVAL))
        groups += one(run, "PrometheusRule")["spec"]["groups"]
    # another team's deployment of the same model: its PodMonitor and pod in its own namespace
    theirs = json.loads(json.dumps(one(runs[DASHBOARD_STACK], "PodMonitor")))
    theirs["metadata"]["namespace"] = OTHER_NAMESPACE
    server_pod = vllm_pods(runs[DASHBOARD_STACK])["server"]
    their_pod = Pod.from_template(OTHER_NAMESPACE, DEPLOYMENT_POD, server_pod)
    jobs.append(pod_monitor_job(theirs, [their_pod], address, SCRAPE_INTERVAL))
    directory = tmp_path_factory.mktemp("prometheus")
    (directory / "rules.yml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    prometheus = Prometheus(jobs, directory, rule_files=["rules.yml"])
    prometheus.start()
    try:
        timings = {"prometheus_ready_seconds": prometheus.started_seconds or 0.0}
        expected_targets = len(LIVE_NAMESPACES) + 1
        timings["first_scrape_seconds"] = prometheus.started_seconds + prometheus.wait_for(
            "every target scraped once",
            lambda: len(prometheus.query(f'up{{pod=~"kimi-vllm-.*"}} == 1 and on(namespace, pod) {m.VLLM_NUM_REQUESTS_RUNNING}')
                        ["result"]) == expected_targets,
            FIRST_SCRAPE_TIMEOUT_SECONDS,
        )
        stop = threading.Event()
        peak: dict[str, dict[str, float]] = {name: {} for name in runs}
        window_start = time.time()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            so_far = LoadReport()
            load_future = pool.submit(drive_load, real_vllm_server, stop, so_far)

            def load_running() -> None:
                """Raise when the load has ended (its error, or its time bound): nothing more will show."""
                if load_future.done():
                    ended = load_future.result()  # raises the load's own error
                    raise TimeoutError(f"the load ended after {ended.seconds:.0f} s ({ended.ok} served, "
                                       f"{len(ended.failed)} failed {ended.failed[:3]}) before the condition held")

            def busy_everywhere() -> bool:
                load_running()
                for name, run in runs.items():
                    for signal, expr in queries_of(run).items():
                        result = prometheus.query(expr)["result"]
                        if len(result) == 1:
                            peak[name][signal] = max(peak[name].get(signal, 0.0), float(result[0]["value"][1]))
                # every signal read (a new series shows in the 30 s subquery steps after the next step),
                # and the load seen as queued requests, busy replicas and KV-cache use in every namespace
                return all(len(p) == 3 and p["queue"] > 0 and p["busy-replicas"] >= 1 and p["kv-cache"] > 0
                           for p in peak.values())

            try:
                timings["signals_seen_seconds"] = prometheus.wait_for(
                    "queue, busy replicas and KV-cache use under load", busy_everywhere, SIGNAL_TIMEOUT_SECONDS, 1.0)
                # then every target scraped busy once more: the dashboard's window ends in load
                seen_at = time.time()

                def busy_again() -> bool:
                    load_running()
                    return scraped_since(prometheus, seen_at, busy=True)

                prometheus.wait_for("every target scraped busy after the signals", busy_again, SIGNAL_TIMEOUT_SECONDS, 1.0)
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}; seen {peak}; {load_story(prometheus, real_vllm_server, so_far, window_start)}") \
                    from None
            finally:
                stop.set()
                load = load_future.result()
        # the last requests' counters and histograms: every target scraped after the load ended
        prometheus.wait_for("every target scraped after the load", lambda: scraped_since(prometheus, load.ended_at),
                            SCRAPED_AFTER_TIMEOUT_SECONDS, 1.0)
        timings["load_seconds"] = load.seconds
        timings["fixture_seconds"] = time.monotonic() - tier_began
        scrapes = scrape_records(prometheus, window_start, load.ended_at)
        yield Live(prometheus, runs, live_run(DASHBOARD_STACK, served, "hpa"), served, load, timings, peak,
                   (window_start, time.time()), scrapes)
    finally:
        prometheus.stop()


# -- the scrape -----------------------------------------------------------------------------------


def test_the_load_was_served(live):
    assert live.load.ok > 0 and not live.load.failed, live.load.failed[:3]


def test_targets_are_the_serving_pods_labelled_as_a_cluster_scrape_labels_them(live):
    targets = live.prometheus.api("targets")
    active = {(t["labels"]["namespace"], t["labels"]["pod"]): t for t in targets["activeTargets"]}
    expected = {(ns, "kimi-vllm-0" if name == "gb300" else DEPLOYMENT_POD) for name, ns in LIVE_NAMESPACES.items()}
    assert set(active) == expected | {(OTHER_NAMESPACE, DEPLOYMENT_POD)}
    for (ns, _pod), t in active.items():
        assert t["health"] == "up", t.get("lastError")
        labels = t["labels"]
        assert (labels["container"], labels["endpoint"], labels["job"]) == ("vllm", "http", f"{ns}/kimi-vllm")
    # the LeaderWorkerSet worker (no /metrics) and every other container and port were dropped
    dropped = [t["discoveredLabels"] for t in targets["droppedTargets"]]
    assert any(d["__meta_kubernetes_pod_name"] == "kimi-vllm-0-1" for d in dropped)
    assert any(d["__meta_kubernetes_pod_container_init"] == "true" for d in dropped)


def _names(live, namespace: str) -> set[str]:
    query = f'count by (__name__) ({{__name__=~"vllm.+",namespace="{namespace}"}})'
    return {r["metric"]["__name__"] for r in live.prometheus.query(query)["result"]}


def test_vllm_names_arrive_as_the_queries_spell_them(live):
    """Every name the queries read arrives as ``vllm:*`` (a scrape that escaped ``:`` to ``_``, as
    prometheus_client's OpenMetrics output does for Prometheus 2.x, would leave them all empty;
    vLLM's ``/metrics`` is prometheus-fastapi-instrumentator's plain-text handler, which keeps them)."""
    query = f'count by (__name__) ({{__name__=~"vllm.+",namespace="{LIVE_NAMESPACES[DASHBOARD_STACK]}"}})'
    names = {r["metric"]["__name__"] for r in live.prometheus.query(query)["result"]}
    assert m.VLLM_NUM_REQUESTS_RUNNING in names and not [n for n in names if n.startswith("vllm_")]
    for name, kind in m.VLLM_METRICS.items():
        assert set(m.exposition_names(name, kind)) - {name + "_created"} <= names, name


# -- scaling queries --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LIVE_NAMESPACES))
def test_every_keda_trigger_reads_one_value_and_sees_the_load(live, name):
    run = live.runs[name]
    triggers = {t["name"]: t for t in one(run, "ScaledObject")["spec"]["triggers"] if t["type"] == "prometheus"}
    for signal, trigger in triggers.items():
        ignore = trigger["metadata"]["ignoreNullValues"] == "true"
        value = promtool.keda_reading(live.prometheus.query(trigger["metadata"]["query"]), ignore)
        assert value >= 0, signal
    peak = live.peak[name]
    # one replica in this namespace although the same server is scraped in four
    assert peak["busy-replicas"] == 1 and 0 < peak["kv-cache"] <= 1, peak
    # the load holds requests in the engine's queue: the queue signal reads them in every namespace
    assert peak["queue"] >= 1, peak


def test_every_hpa_adapter_rule_reads_one_value(live):
    run = live.hpa_run
    plan = scaling_plan(run.context.spec, run.context.sizing)
    rules = asc_mod.adapter_rules(run.context.spec, plan)
    assert {r["name"]["as"] for r in rules} == set(asc_mod.HPA_EXTERNAL_METRICS.values())
    for rule in rules:
        assert "<<" not in rule["metricsQuery"]  # no adapter template left to expand
        result = live.prometheus.query(rule["metricsQuery"])["result"]
        assert len(result) == 1 and float(result[0]["value"][1]) >= 0, rule["name"]["as"]
    busy = next(r for r in rules if r["name"]["as"] == asc_mod.HPA_EXTERNAL_METRICS["busy-replicas"])
    window = live.window
    series = live.prometheus.query_range(busy["metricsQuery"], window[0], window[1], 1)["result"]
    assert max(float(v) for _, v in series[0]["values"]) == 1


# -- alerts -----------------------------------------------------------------------------------------


def test_every_alert_rule_loads_and_evaluates_without_error(live):
    groups = live.prometheus.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    expected = sum(len(one(run, "PrometheusRule")["spec"]["groups"][0]["rules"]) for run in live.runs.values())
    assert len(rules) == expected
    for rule in rules:
        assert rule["health"] == "ok" and not rule.get("lastError"), (rule["name"], rule.get("lastError"))
    # nothing is wrong with the server under this load: no vLLM alert fires
    firing = [a for a in live.prometheus.api("alerts")["alerts"] if a["labels"]["alertname"].startswith("KimiVllm")]
    assert not firing, firing


# -- dashboard ----------------------------------------------------------------------------------------


def dashboard_queries(live) -> list[tuple[str, str, str]]:
    """``(panel, legend, expr)`` with the dashboard variables set to the live stack."""
    values = {"namespace": LIVE_NAMESPACES[DASHBOARD_STACK], "model_name": live.served_model_name}
    out = []
    for panel in obs.dashboard()["panels"]:
        for target in panel["targets"]:
            out.append((panel["title"], target["legendFormat"], obs.substitute_variables(target["expr"], values)))
    return out


def test_every_dashboard_query_returns_data_where_it_should(live):
    gpu = set().union(*m.GPU_EXPORTER_METRICS.values())
    start, end = live.window
    for title, legend, expr in dashboard_queries(live):
        result = live.prometheus.query_range(expr, start, end, 2)["result"]
        if any(name in expr for name in gpu):
            assert not result, f"{title} / {legend}: no GPU exporter runs here"  # CPU machine
            continue
        assert result, f"{title} / {legend}: no data for {expr}"
        for series in result:
            assert series["metric"].get("namespace", LIVE_NAMESPACES[DASHBOARD_STACK]) == LIVE_NAMESPACES[DASHBOARD_STACK]
    # the variables: every namespace scraping vLLM, then this namespace's served model
    namespaces = live.prometheus.api("label/namespace/values", **{"match[]": m.VLLM_NUM_REQUESTS_RUNNING})
    assert set(namespaces) == set(LIVE_NAMESPACES.values()) | {OTHER_NAMESPACE}
    ours = f'{m.VLLM_NUM_REQUESTS_RUNNING}{{namespace="{LIVE_NAMESPACES[DASHBOARD_STACK]}"}}'
    models = live.prometheus.api("label/model_name/values", **{"match[]": ours})
    assert models == [live.served_model_name]


def test_dashboard_picture_from_the_live_series(live, tmp_path):
    from scripts.dev.render_dashboard import panel_series, render_png

    namespace = LIVE_NAMESPACES[DASHBOARD_STACK]
    # the picture ends while the last requests are still in flight (stat panels show the last value)
    start, end = live.window[0], live.load.ended_at - 2
    series = panel_series(obs.dashboard(), live.prometheus.url, namespace, live.served_model_name, start, end)
    with_data = {pid for pid, lines in series.items() if lines}
    panels = {p["id"]: p for p in obs.dashboard()["panels"]}
    gpu_panels = {pid for pid, p in panels.items() if p["title"].startswith("GPU")}
    assert with_data == set(panels) - gpu_panels
    target = Path(os.environ.get("KIMI_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    note = f"vLLM {live.served_model_name} on CPU, {LOAD_CONCURRENCY} streams for {live.load.seconds:.0f} s"
    render_png(obs.dashboard(), series, target, note=note, no_data="no data: no GPU exporter on this CPU machine")
    assert target.stat().st_size > 20_000


def test_live_tier_timings(live, capsys):
    with capsys.disabled():
        print("\nlive Prometheus tier: " + ", ".join(f"{k} {v:.1f}" for k, v in live.timings.items())
              + f"; {live.load.ok} requests served; scrapes during the load: "
              + "; ".join(f"{ns} {record.summary()}" for ns, record in sorted(live.scrapes.items())))
    assert live.timings["prometheus_ready_seconds"] < 60


def test_every_load_request_needs_several_engine_steps_and_none_repeats_a_prompt():
    """A prompt within one engine step (2,048 tokens on CPU) would let every waiting request in at
    once, and a repeated prompt is served from the prefix cache without a prefill: either way the
    engine empties its queue between scrapes."""
    prompts = [load_prompt(worker, request) for worker in range(LOAD_CONCURRENCY) for request in (1, 2, 10)]
    assert min(len(p) for p in prompts) >= 2 * 2048
    assert len({p[:32] for p in prompts}) == len(prompts)


def test_the_tier_waits_on_conditions_not_for_fixed_times():
    """Every sleep of the live tier (this module and its Prometheus helper) is a poll inside a loop
    that checks a condition; a bare ``time.sleep`` outside a loop is a window that is too short on
    a loaded machine and wasted on a quiet one (the load's tail and the settle after it were)."""
    import ast

    for path in (Path(__file__), Path(__file__).with_name("live_prometheus.py")):
        tree = ast.parse(path.read_text())
        in_loop: set[int] = set()
        for loop in ast.walk(tree):
            if isinstance(loop, (ast.While, ast.For)):
                in_loop |= {id(n) for n in ast.walk(loop)}
        bare = [f"{path.name}:{n.lineno}" for n in ast.walk(tree)
                if isinstance(n, ast.Call) and ast.unparse(n.func) == "time.sleep" and id(n) not in in_loop]
        assert not bare, f"fixed waits (sleep outside a polling loop): {bare}"

"""The weight sync's progress on ``/metrics`` (what the stall alert reads) and its wiring into the
pods and the PodMonitor (issue 34, Why 8: "the sync stall alert is elapsed time, not progress")."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from components.core import metrics as core_metrics
from scripts.node.weight_sync import metrics as sync_metrics
from scripts.node.weight_sync.progress import Progress
from tests.test_autoscaling import autoscaled
from tests.test_k8s_workloads import one, pod_templates


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")}


def test_the_sync_serves_the_bytes_it_moves_while_it_runs(monkeypatch):
    port = _free_port()
    monkeypatch.setenv(sync_metrics.PORT_ENV, str(port))
    server = sync_metrics.serve_from_env("127.0.0.1")
    assert server is not None
    try:
        before = _scrape(port)
        progress = Progress(3_000, 1, enabled=False)
        progress.add(1_000)
        progress.add(2_000)
        after = _scrape(port)
    finally:
        server.shutdown()
        server.server_close()
    assert after[core_metrics.SYNC_TRANSFERRED_BYTES] - before[core_metrics.SYNC_TRANSFERRED_BYTES] == 3_000
    assert after[core_metrics.SYNC_PLANNED_BYTES] - before[core_metrics.SYNC_PLANNED_BYTES] == 3_000


def test_no_server_without_the_variable_and_a_bad_port_is_refused(monkeypatch):
    monkeypatch.delenv(sync_metrics.PORT_ENV, raising=False)
    assert sync_metrics.serve_from_env() is None
    monkeypatch.setenv(sync_metrics.PORT_ENV, "70000")
    with pytest.raises(ValueError, match=sync_metrics.PORT_ENV):
        sync_metrics.serve_from_env()


def test_the_node_program_and_the_alerts_use_the_same_names():
    assert sync_metrics.TRANSFERRED_BYTES == core_metrics.SYNC_TRANSFERRED_BYTES
    assert sync_metrics.PLANNED_BYTES == core_metrics.SYNC_PLANNED_BYTES
    assert sync_metrics.PORT_ENV == core_metrics.SYNC_METRICS_PORT_ENV


@pytest.mark.parametrize("name", ["b300-prod", "gb300", "mi355x"])
def test_every_sync_container_serves_its_progress_and_the_pod_monitor_scrapes_it(name):
    """Each ``weight-sync`` container (the init container of every vLLM pod, workers included, and
    every sync Job's) turns its /metrics on and names the port; the PodMonitor selects those pods
    and scrapes that port name."""
    from components.core.config import read_stack_config

    extra = {"kimi-deploy:kubernetes": {**read_stack_config(name)["kimi-deploy:kubernetes"],
                                        "installedAddons": ["prometheus-operator"]}}
    run = autoscaled(name, extra)
    monitor = one(run, "PodMonitor")["spec"]
    assert {"port": core_metrics.SYNC_METRICS_PORT_NAME, "path": "/metrics", "interval": "30s"} in monitor["podMetricsEndpoints"]
    (selected,) = [e["values"] for e in monitor["selector"]["matchExpressions"] if e["key"] == "app.kubernetes.io/component"]
    seen = 0
    for _, pod in pod_templates(run):
        for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            if container["name"] != "weight-sync":
                continue
            seen += 1
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env[core_metrics.SYNC_METRICS_PORT_ENV] == str(core_metrics.SYNC_METRICS_PORT)
            assert {"name": core_metrics.SYNC_METRICS_PORT_NAME, "containerPort": core_metrics.SYNC_METRICS_PORT,
                    "protocol": "TCP"} in container["ports"]
            assert pod["metadata"]["labels"]["app.kubernetes.io/component"] in selected
    assert seen

"""Helper (not a test module): a real Prometheus (Debian's ``prometheus`` 2.42) started by the tests on
127.0.0.1, scraping a real target with the labels a Kubernetes scrape gives it.

``pod_monitor_job`` turns a rendered PodMonitor and the pods it should find into a scrape job that
replays prometheus-operator's PodMonitor relabeling (``pkg/prometheus/promcfg.go``
``generatePodMonitorConfig``; golden file ``pkg/prometheus/testdata/
podMonitorObjectWithNonDefaultScrapeClassWithRelabelings.golden``) over each pod's Kubernetes
metadata, given as the ``__meta_kubernetes_*`` labels that role-``pod`` service discovery sets on
one target per container port (and per container without ports, init containers included). So,
as in a cluster, a pod the PodMonitor's selector misses, a finished pod, or a port other than the
PodMonitor's is dropped, and the kept targets get
``namespace``, ``pod``, ``container``, ``endpoint`` and ``job`` from the operator's rules. Only the
address differs: every target points at the one real server on 127.0.0.1.

``Prometheus`` runs the server with such jobs (its own data directory, a free port) and answers
``/api/v1/query`` and ``query_range`` the way KEDA, prometheus-adapter and Grafana call them.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests import promtool

READY_TIMEOUT_SECONDS = 90
QUERY_TIMEOUT_SECONDS = 30


def sanitize_label_name(name: str) -> str:
    """Kubernetes label key -> the suffix of its ``__meta_kubernetes_pod_label_*`` name (Prometheus'
    ``strutil.SanitizeLabelName``: every character outside ``[a-zA-Z0-9_]`` becomes ``_``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


@dataclass(frozen=True)
class Pod:
    """A pod as role-``pod`` service discovery sees it: namespace, name, labels, phase and the
    ``(container name, [(port name, port number)])`` of its containers."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    # (container name, init container?, [(port name, port number)])
    containers: Sequence[tuple[str, bool, Sequence[tuple[str, int]]]]
    phase: str = "Running"

    @classmethod
    def from_template(cls, namespace: str, name: str, template: Mapping[str, Any]) -> Pod:
        """A pod made from a rendered pod template (Deployment, LeaderWorkerSet leader/worker),
        its init containers included (service discovery lists them too)."""
        containers = [
            (c["name"], init, [(p.get("name", ""), int(p["containerPort"])) for p in c.get("ports", [])])
            for init, key in ((True, "initContainers"), (False, "containers"))
            for c in template["spec"].get(key, [])
        ]
        return cls(namespace, name, dict(template["metadata"]["labels"]), containers)

    def targets(self) -> list[dict[str, str]]:
        """The ``__meta_kubernetes_*`` labels of each target discovery makes of the pod: one per
        container port, one per container without ports."""
        out = []
        for container, init, ports in self.containers:
            for port in ports or [None]:
                out.append(self.meta_labels(container, init, port))
        return out

    def meta_labels(self, container: str, init: bool, port: tuple[str, int] | None) -> dict[str, str]:
        """The ``__meta_kubernetes_*`` labels of one target of the pod."""
        out = {
            "__meta_kubernetes_namespace": self.namespace,
            "__meta_kubernetes_pod_name": self.name,
            "__meta_kubernetes_pod_phase": self.phase,
            "__meta_kubernetes_pod_container_name": container,
            "__meta_kubernetes_pod_container_init": str(init).lower(),
        }
        if port is not None:
            out["__meta_kubernetes_pod_container_port_name"] = port[0]
            out["__meta_kubernetes_pod_container_port_number"] = str(port[1])
        for key, value in self.labels.items():
            out[f"__meta_kubernetes_pod_label_{sanitize_label_name(key)}"] = value
            out[f"__meta_kubernetes_pod_labelpresent_{sanitize_label_name(key)}"] = "true"
        return out


def _selector_relabelings(selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for key in sorted(selector.get("matchLabels", {})):
        name = sanitize_label_name(key)
        rules.append({"action": "keep", "source_labels": [f"__meta_kubernetes_pod_label_{name}",
                                                          f"__meta_kubernetes_pod_labelpresent_{name}"],
                      "regex": f"({selector['matchLabels'][key]});true"})
    for exp in selector.get("matchExpressions", []):
        name = sanitize_label_name(exp["key"])
        both = [f"__meta_kubernetes_pod_label_{name}", f"__meta_kubernetes_pod_labelpresent_{name}"]
        present = [f"__meta_kubernetes_pod_labelpresent_{name}"]
        values = "|".join(exp.get("values", []))
        rules.append({
            "In": {"action": "keep", "source_labels": both, "regex": f"({values});true"},
            "NotIn": {"action": "drop", "source_labels": both, "regex": f"({values});true"},
            "Exists": {"action": "keep", "source_labels": present, "regex": "true"},
            "DoesNotExist": {"action": "drop", "source_labels": present, "regex": "true"},
        }[exp["operator"]])
    return rules


def pod_monitor_job(pod_monitor: Mapping[str, Any], pods: Sequence[Pod], address: str, scrape_interval: str) -> dict[str, Any]:
    """The scrape job prometheus-operator generates for ``pod_monitor``'s first endpoint, with
    ``pods`` as its discovered targets (each container port one target at ``address``).

    ``scrape_interval`` replaces the PodMonitor's own (30 s in a cluster) so a test sees data in
    seconds; nothing else of the PodMonitor is changed.
    """
    meta = pod_monitor["metadata"]
    endpoint = pod_monitor["spec"]["podMetricsEndpoints"][0]  # vLLM's; [1] is the weight sync's
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        *_selector_relabelings(pod_monitor["spec"]["selector"]),
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"]},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    static = [{"targets": [address], "labels": labels} for pod in pods for labels in pod.targets()]
    # the operator writes the endpoint's metricRelabelings as metric_relabel_configs, keys in snake case
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label", "regex": "regex", "replacement": "replacement",
            "separator": "separator", "modulus": "modulus"}
    metric_relabel = [
        {**{keys[k]: v for k, v in r.items() if k in keys}, "action": r.get("action", "replace").lower()}
        for r in endpoint.get("metricRelabelings", [])
    ]
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": scrape_interval,
        "scrape_timeout": scrape_interval,
        "static_configs": static,
        "relabel_configs": relabel,
        **({"metric_relabel_configs": metric_relabel} if metric_relabel else {}),
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prometheus:
    """A Prometheus server on 127.0.0.1 with ``jobs`` (scrape configs) and ``rule_files``, its data
    in ``directory``.

    ``start()`` returns when ``/-/ready`` answers; ``started_seconds`` is that wait. ``stop()``
    ends the process (also on ``__exit__``).
    """

    jobs: Sequence[Mapping[str, Any]]
    directory: Path
    rule_files: Sequence[str] = ()  # relative to ``directory``
    evaluation_interval: str = "1s"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    started_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        return {"global": {"evaluation_interval": self.evaluation_interval}, "rule_files": list(self.rule_files),
                "scrape_configs": list(self.jobs)}

    def check_config(self) -> subprocess.CompletedProcess:
        """``promtool check config`` on the generated configuration."""
        path = self.directory / "prometheus.yml"
        path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        return subprocess.run([promtool.require("promtool"), "check", "config", str(path)],
                              capture_output=True, text=True, timeout=promtool.PROMTOOL_TIMEOUT_SECONDS, check=False)

    def start(self) -> Prometheus:
        binary = promtool.require("prometheus")
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        log = (self.directory / "prometheus.log").open("wb")
        began = time.monotonic()
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={self.directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        deadline = began + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log_tail = (self.directory / "prometheus.log").read_text()[-2000:]
                raise RuntimeError(f"prometheus exited {self.process.returncode}: {log_tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        self.started_seconds = time.monotonic() - began
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus not ready within {READY_TIMEOUT_SECONDS} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api(self, path: str, **params: Any) -> dict[str, Any]:
        """GET ``/api/v1/<path>`` with ``params``; the response's ``data``.

        Raises:
            RuntimeError: the API answered with an error status.
        """
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=QUERY_TIMEOUT_SECONDS) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """An instant query as KEDA's Prometheus scaler sends it (``/api/v1/query?query=&time=``)."""
        return self.api("query", query=expr, time=at if at is not None else time.time())

    def query_range(self, expr: str, start: float, end: float, step: float) -> dict[str, Any]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)

    def targets_health(self) -> list[dict[str, Any]]:
        """Each active target's ``namespace``, ``pod``, ``health``, ``lastError``, ``lastScrape`` and
        ``lastScrapeDuration`` (seconds), as ``/api/v1/targets`` reports them: what a failure message
        shows when a namespace's series do not move."""
        return [{"namespace": t["labels"].get("namespace"), "pod": t["labels"].get("pod"), "health": t["health"],
                 "lastError": t.get("lastError", ""), "lastScrape": t.get("lastScrape", ""),
                 "lastScrapeDuration": round(float(t.get("lastScrapeDuration", 0.0)), 3)}
                for t in self.api("targets")["activeTargets"]]

    def wait_for(self, what: str, check: Callable[[], bool], timeout_seconds: float, poll_seconds: float = 0.5) -> float:
        """Poll ``check`` until true; the seconds it took.

        Raises:
            TimeoutError: not true within ``timeout_seconds`` (``what`` names it).
        """
        began = time.monotonic()
        while time.monotonic() - began < timeout_seconds:
            if check():
                return time.monotonic() - began
            time.sleep(poll_seconds)
        raise TimeoutError(f"{what}: not within {timeout_seconds} s")

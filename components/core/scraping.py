"""How the Prometheus that the scaler and the alerts read finds the vLLM pods. Pure: no Pulumi import.

The scrape path must be the one that Prometheus reads, or the queries return nothing:

- ``pod-monitor`` (``prometheus-operator`` in ``kubernetes.installedAddons``): a Prometheus
  Operator's Prometheus discovers targets only through the PodMonitor/ServiceMonitor objects its
  ``podMonitorSelector``/``serviceMonitorSelector`` select, loads only the PrometheusRules its
  ``ruleSelector`` selects, and ignores ``prometheus.io/*`` annotations. The PodMonitor and the
  PrometheusRule carry ``observability.monitorLabels``, by default ``release: kube-prometheus-stack``:
  kube-prometheus-stack (prometheus-community/helm-charts ``charts/kube-prometheus-stack``, values
  ``prometheus.prometheusSpec.*SelectorNilUsesHelmValues: true``) selects ``release: <its Helm
  release name>``, and ``kube-prometheus-stack`` is the release name its README installs.
- ``annotations``: no operator, but a Prometheus is named (``observability.prometheusUrl`` or
  ``prometheusNamespace``): ``prometheus.io/scrape``, ``/port``, ``/path`` on the serving pods, as
  the prometheus-community ``prometheus`` chart's ``kubernetes-pods`` job reads them.
- none: no Prometheus is configured, and nothing is annotated (the NetworkPolicy admits no scraper).

The scaler queries ``observability.prometheusUrl``, else the operator's ``prometheus-operated``
Service in ``observability.prometheusNamespace``: config validation refuses that default without
``prometheus-operator`` listed (``config/scaling.py``).
"""

from __future__ import annotations

from .config.spec import DeploymentSpec

POD_MONITOR = "pod-monitor"
ANNOTATIONS = "annotations"
# kubernetes.installedAddons name of the Prometheus Operator (versions.ADDON_EQUIVALENTS).
PROMETHEUS_OPERATOR = "prometheus-operator"


def scrape_path(spec: DeploymentSpec) -> str | None:
    """``POD_MONITOR``, ``ANNOTATIONS`` or None (no Prometheus configured; not Kubernetes)."""
    if not spec.profile.runs_kubernetes:
        return None
    if PROMETHEUS_OPERATOR in spec.config.kubernetes.installed_addons:
        return POD_MONITOR
    obs = spec.config.observability
    if obs.prometheus_url or obs.prometheus_namespace:
        return ANNOTATIONS
    return None


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def scraping_summary(spec: DeploymentSpec) -> str | None:
    """One line for the plan: how vLLM is scraped and which selector that assumes of the
    Prometheus (None off Kubernetes)."""
    if not spec.profile.runs_kubernetes:
        return None
    path = scrape_path(spec)
    obs = spec.config.observability
    if path == POD_MONITOR:
        labels = dict(obs.monitor_labels)
        if not labels:
            return ("PodMonitor and PrometheusRule without labels: the Prometheus must select every one "
                    "(podMonitorSelector and ruleSelector {}; observability.monitorLabels)")
        return (f"PodMonitor and PrometheusRule labelled {_labels(labels)}: assumes the Prometheus' podMonitorSelector and "
                "ruleSelector match it (kube-prometheus-stack selects release=<its Helm release>; observability.monitorLabels)")
    if path == ANNOTATIONS:
        where = obs.prometheus_url or f"namespace {obs.prometheus_namespace}"
        return (f"prometheus.io/* annotations on the serving pods, for the Prometheus at {where}: it must read them "
                "(a Prometheus Operator's ignores them: list prometheus-operator in kubernetes.installedAddons)")
    return "not scraped: no Prometheus configured (observability.prometheusNamespace or prometheusUrl)"

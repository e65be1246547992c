"""``autoscaling`` and ``observability`` (components/core/scaling.py reads them)."""

from __future__ import annotations

import re

from ..errors import ConfigError
from ..platforms import PlatformProfile
from .patterns import DNS_LABEL_RE, LABEL_VALUE_RE
from .raw import RawConfig

_CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*/,?-]+$")
# Numeric ranges of the five fields as KEDA's cron scaler parses them (robfig/cron v3 standard parser,
# parser.go: minutes 0-59, hours 0-23, day of month 1-31, month 1-12, day of week 0-6).
_CRON_RANGES: tuple[tuple[str, int, int], ...] = (
    ("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 6),
)


def _cron_range_problem(fields: list[str]) -> str | None:
    """The first number outside its field's range (``61`` as a minute), else None. Step values
    (``*/15``) are not ranges and names (``MON``) are KEDA's to read."""
    for text, (field, low, high) in zip(fields, _CRON_RANGES, strict=True):
        for part in text.split(","):
            span = part.split("/", 1)[0]
            for number in span.split("-"):
                if number.isdigit() and not low <= int(number) <= high:
                    return f"has {field} {number}, outside {low}-{high}"
    return None
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")


def check_autoscaling_and_observability(raw: RawConfig, platform: PlatformProfile, warnings: list[str]) -> None:
    """Validate ``autoscaling`` and ``observability`` (components/core/scaling.py reads them).

    Raises:
        ConfigError: the first invalid value, one line.
    """
    import zoneinfo

    asc, obs, k8s_cfg = raw.autoscaling, raw.observability, raw.kubernetes
    on_k8s = platform.runs_kubernetes
    for key, ns in (
        ("observability.prometheusNamespace", obs.prometheus_namespace),
        ("observability.grafanaNamespace", obs.grafana_namespace),
    ):
        if ns is None:  # off Kubernetes refused by config/platform_keys.py
            continue
        if not DNS_LABEL_RE.match(ns):
            raise ConfigError(key, ns, "is not a valid namespace name (lowercase DNS label)")
    for label_key, label_value in {**obs.monitor_labels, **obs.prometheus_pod_labels}.items():
        if not re.match(
            r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", label_key
        ) or not LABEL_VALUE_RE.match(label_value):
            which = "observability.monitorLabels" if label_key in obs.monitor_labels else "observability.prometheusPodLabels"
            raise ConfigError(
                which,
                {label_key: label_value},
                "is not a valid Kubernetes label (key [prefix/]name, value 1-63 of letters, digits, '-', '_', '.')",
            )
    if obs.prometheus_url is not None:
        from .storage import check_http_url

        check_http_url(
            "observability.prometheusUrl", obs.prometheus_url, "http://prometheus-operated.monitoring.svc:9090",
            where="the scaler's objects (KEDA ScaledObject metadata)",
            instead="point it at a Prometheus the scaler reaches without credentials in the URL",
        )
    if obs.prometheus_url is not None and not _URL_RE.match(obs.prometheus_url):
        raise ConfigError("observability.prometheusUrl", obs.prometheus_url, "is not an http(s) URL without credentials (e.g. http://prometheus-operated.monitoring.svc:9090)")
    scrapers = "prometheus-operator" in k8s_cfg.installed_addons or obs.prometheus_url is not None
    if on_k8s and scrapers and obs.prometheus_namespace is None:
        warnings.append(
            "a Prometheus is configured (prometheus-operator in kubernetes.installedAddons or observability.prometheusUrl) but "
            "observability.prometheusNamespace is not: the NetworkPolicy blocks its scrape of vLLM's /metrics; name its namespace"
        )
    if not asc.enabled or not on_k8s:  # enabled off Kubernetes: refused by config/platform_keys.py
        return
    max_replicas = asc.max_replicas if asc.max_replicas is not None else raw.compute.replicas
    if max_replicas < max(asc.min_replicas, 1):
        raise ConfigError(
            "autoscaling.maxReplicas", max_replicas, f"is below autoscaling.minReplicas {asc.min_replicas} (and at least 1)"
        )
    replicas = raw.compute.replicas
    if not max(asc.min_replicas, 1) <= replicas <= max_replicas:
        raise ConfigError(
            "compute.replicas",
            replicas,
            "is the initial replica count and must lie within autoscaling.minReplicas..maxReplicas "
            f"({max(asc.min_replicas, 1)}..{max_replicas})",
        )
    if asc.min_replicas == 0 and not asc.schedule:
        raise ConfigError(
            "autoscaling.minReplicas",
            0,
            "needs autoscaling.schedule: with no replica there is no queue metric to scale up from (name the serving windows)",
        )
    if asc.schedule and asc.controller != "keda":
        raise ConfigError(
            "autoscaling.schedule",
            [w.start for w in asc.schedule],
            f"needs autoscaling.controller keda (a cron trigger); {asc.controller} has none",
        )
    for i, window in enumerate(asc.schedule):
        for name in ("start", "end"):
            expr = getattr(window, name)
            fields = expr.split()
            if len(fields) != 5 or not all(_CRON_FIELD_RE.match(f) for f in fields):
                raise ConfigError(
                    f"autoscaling.schedule.{i}.{name}",
                    expr,
                    "is not a 5-field cron expression (minute hour day-of-month month day-of-week, e.g. '0 8 * * 1-5')",
                )
            if (problem := _cron_range_problem(fields)) is not None:
                raise ConfigError(f"autoscaling.schedule.{i}.{name}", expr, f"{problem} (minute hour day-of-month month "
                                                                            "day-of-week, e.g. '0 8 * * 1-5')")
        if window.start.split() == window.end.split():
            raise ConfigError(f"autoscaling.schedule.{i}.end", window.end,
                              "equals its start: the window would open and close at once (a window needs two times)")
        try:
            zoneinfo.ZoneInfo(window.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigError(
                f"autoscaling.schedule.{i}.timezone",
                window.timezone,
                "is not an IANA time zone (e.g. UTC, Europe/Berlin, Asia/Shanghai)",
            ) from None
    if asc.controller == "hpa" and "prometheus-adapter" not in k8s_cfg.installed_addons:
        raise ConfigError(
            "autoscaling.controller",
            "hpa",
            "needs an external metrics adapter on the cluster: list prometheus-adapter in kubernetes.installedAddons (or use "
            "keda)",
        )
    if obs.prometheus_namespace is None and obs.prometheus_url is None:
        raise ConfigError(
            "autoscaling.enabled",
            True,
            "needs observability.prometheusNamespace or observability.prometheusUrl (the Prometheus that scrapes vLLM and "
            "answers the scaler's queries)",
        )
    if obs.prometheus_url is None and "prometheus-operator" not in k8s_cfg.installed_addons:
        # The scaler's default is the operator's prometheus-operated Service (k8s/autoscaling.py), whose
        # Prometheus reads only PodMonitors: annotated pods would never be scraped and it would never scale.
        raise ConfigError(
            "kubernetes.installedAddons",
            list(k8s_cfg.installed_addons),
            f"lacks prometheus-operator: autoscaling queries the Prometheus Operator's prometheus-operated Service in "
            f"observability.prometheusNamespace {obs.prometheus_namespace}, which scrapes PodMonitors only (list "
            "prometheus-operator once kube-prometheus-stack runs on the cluster, or set observability.prometheusUrl to a "
            "Prometheus that reads prometheus.io/* annotations)",
        )

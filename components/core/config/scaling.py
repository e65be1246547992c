"""``autoscaling`` and ``observability`` (components/core/scaling.py reads them)."""

from __future__ import annotations

import bisect
import re
from datetime import datetime, timedelta

from ..errors import ConfigError
from ..platforms import PlatformProfile
from .patterns import DNS_LABEL_RE, LABEL_VALUE_RE
from .raw import RawConfig

_CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*/,?-]+\Z")
# The five fields as KEDA's cron scaler parses them: kedacore/keda pkg/scalers/cron_scaler.go builds
# robfig/cron v3's parser with Minute | Hour | Dom | Month | Dow; parser.go's bounds (minutes 0-59,
# hours 0-23, day of month 1-31, month 1-12 or jan-dec, day of week 0-6 or sun-sat) and getRange's
# rules: ``*``/``?``, ``a``, ``a-b``, each with an optional ``/step``; a step of 0, a range whose
# start is beyond its end, a number outside the bounds, a negative number, a second ``-`` or ``/``
# and an unknown name are errors.
_CRON_RANGES: tuple[tuple[str, int, int], ...] = (
    ("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 6),
)
_CRON_NAMES: dict[str, dict[str, int]] = {
    "month": {name: i for i, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)},
    "day-of-week": {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))},
}
# Days in each month, February in a leap year (a day a window may name at all).
_MONTH_DAYS: dict[int, int] = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
_CRON_EXAMPLE = "(minute hour day-of-month month day-of-week, e.g. '0 8 * * 1-5')"


class CronFieldError(ValueError):
    """A cron field KEDA's parser refuses; ``str`` is the reason (``has minute 61, outside 0-59``)."""


def cron_field(text: str, field: str, low: int, high: int) -> tuple[frozenset[int], bool]:
    """The values one cron field matches and whether it is a star (``*`` or ``?`` with no step
    above 1: robfig/cron then ANDs day-of-month with day-of-week, else it ORs them).

    Raises:
        CronFieldError: what robfig/cron v3's ``getRange`` refuses, in one phrase.
    """
    names = _CRON_NAMES.get(field, {})

    def number(token: str, part: str) -> int:
        if token.lower() in names:
            return names[token.lower()]
        if not token.isdigit():
            raise CronFieldError(f"has {field} {part!r}, which KEDA's cron parser (robfig/cron v3) cannot read")
        return int(token)

    values: set[int] = set()
    star = False
    for part in text.split(","):
        range_and_step = part.split("/")
        if len(range_and_step) > 2:
            raise CronFieldError(f"has {field} {part!r} with two '/' (KEDA's cron parser refuses it)")
        bounds = range_and_step[0].split("-")
        if len(bounds) > 2:
            raise CronFieldError(f"has {field} {part!r} with two '-' (KEDA's cron parser refuses it)")
        is_star = bounds[0] in ("*", "?")
        if is_star and len(bounds) > 1:
            raise CronFieldError(f"has {field} {part!r}, which KEDA's cron parser (robfig/cron v3) cannot read")
        first = low if is_star else number(bounds[0], part)
        last = high if is_star else number(bounds[-1], part)
        step = 1
        if len(range_and_step) == 2:
            step = number(range_and_step[1], part)
            if len(bounds) == 1 and not is_star:
                last = high  # robfig/cron: "N/step" means "N-max/step"
        for value in (first, last):
            if not low <= value <= high:
                raise CronFieldError(f"has {field} {value}, outside {low}-{high}")
        if first > last:
            raise CronFieldError(f"has {field} range {part!r} running backwards ({first} > {last}): KEDA's cron parser "
                                 f"refuses it (write it low-high, or as two ranges such as 22-23,0-5)")
        if step == 0:
            raise CronFieldError(f"has {field} step 0 in {part!r}: KEDA's cron parser refuses it (a step is 1 or more)")
        star = star or (is_star and step == 1)
        values.update(range(first, last + 1, step))
    return frozenset(values), star


def cron_days(fields: list[str]) -> list[tuple[int, int]]:
    """The (month, day) pairs on which a 5-field cron expression can fire in some year (29
    February counts: leap years), or ``[]`` when it never fires. robfig/cron's ``dayMatches``: when
    day-of-month or day-of-week is a star the two must both match, else either; every date falls
    on every weekday in some year.

    Raises:
        CronFieldError: a field KEDA's parser refuses (``cron_field``).
    """
    parsed = [cron_field(text, field, low, high) for text, (field, low, high) in zip(fields, _CRON_RANGES, strict=True)]
    (days, days_star), (months, _), (_weekdays, weekdays_star) = parsed[2], parsed[3], parsed[4]
    if not (days_star or weekdays_star):  # either matches: every month has every weekday
        return [(month, day) for month in sorted(months) for day in range(1, _MONTH_DAYS[month] + 1)]
    return [(month, day) for month in sorted(months) for day in sorted(days) if day <= _MONTH_DAYS[month]]


# Minutes of one year (from a fixed Monday) that ``cron_fire_minutes`` walks: every window a 5-field
# cron expression opens repeats within it (a leap day's aside), and more starts than
# ``_MAX_STARTS`` add no shorter window (the pattern repeats).
_WINDOW_SPAN_DAYS = 371
_WINDOW_EPOCH = datetime(2029, 1, 1)  # a Monday; 2029-2030 hold no leap day, so 29 February is skipped
_MAX_STARTS = 5_000


def cron_fire_minutes(expr: str, days: int = _WINDOW_SPAN_DAYS) -> list[int]:
    """Minutes after ``_WINDOW_EPOCH`` (wall clock, one time zone) at which the 5-field cron ``expr``
    fires within ``days`` days, ascending; robfig/cron's ``dayMatches`` rule (day-of-month and
    day-of-week both must match when either is a star, else either).

    Raises:
        CronFieldError: a field KEDA's parser refuses (``cron_field``).
    """
    fields = expr.split()
    parsed = [cron_field(text, field, low, high) for text, (field, low, high) in zip(fields, _CRON_RANGES, strict=True)]
    (minutes, _), (hours, _), (doms, dom_star), (months, _), (dows, dow_star) = parsed
    out: list[int] = []
    for d in range(days):
        day = _WINDOW_EPOCH + timedelta(days=d)
        if day.month not in months:
            continue
        dom_ok, dow_ok = day.day in doms, (day.isoweekday() % 7) in dows
        if not ((dom_ok and dow_ok) if (dom_star or dow_star) else (dom_ok or dow_ok)):
            continue
        out.extend(d * 1440 + h * 60 + m for h in sorted(hours) for m in sorted(minutes))
    return out


def shortest_window_seconds(start: str, end: str) -> int | None:
    """Seconds of the shortest window the cron pair opens (``start``) and closes (``end``, the next
    firing of ``end`` after a start), or None when ``start`` never fires. Both in one time zone, so a
    daylight-saving shift (an hour at most) is not counted.

    Raises:
        CronFieldError: a field KEDA's parser refuses.
    """
    starts = cron_fire_minutes(start)[:_MAX_STARTS]
    ends = cron_fire_minutes(end, _WINDOW_SPAN_DAYS * 2)
    gaps = []
    for s in starts:
        i = bisect.bisect_right(ends, s)
        if i < len(ends):
            gaps.append(ends[i] - s)
    return min(gaps) * 60 if gaps else None


_URL_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?\Z")


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
    if on_k8s and not obs.prometheus_pod_labels:
        # An empty podSelector in the NetworkPolicy's rule selects every pod of the Prometheus namespace.
        raise ConfigError("observability.prometheusPodLabels", {}, "is empty, which would admit every pod of the "
                          "Prometheus namespace to the API port; give the Prometheus pods' labels "
                          "(default app.kubernetes.io/name: prometheus)")
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
            try:
                fires = cron_days(fields)
            except CronFieldError as err:
                raise ConfigError(f"autoscaling.schedule.{i}.{name}", expr, f"{err} {_CRON_EXAMPLE}") from None
            when = "opens" if name == "start" else "closes"
            if not fires and (name == "start" and asc.min_replicas == 0):
                raise ConfigError(
                    f"autoscaling.schedule.{i}.{name}", expr,
                    f"names no day that exists (day-of-month {fields[2]} in month {fields[3]}): the window never {when}, "
                    "and with autoscaling.minReplicas 0 the deployment would never get a replica",
                )
            if not fires:
                warnings.append(f"autoscaling.schedule.{i}.{name} {expr!r} names no day that exists (day-of-month "
                                f"{fields[2]} in month {fields[3]}): the window never {when}")
            elif set(fires) == {(2, 29)}:
                warnings.append(f"autoscaling.schedule.{i}.{name} {expr!r} fires on 29 February only: the window "
                                f"{when} in leap years alone")
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
        if "/" not in window.timezone and window.timezone.upper() not in ("UTC", "GMT", "UCT", "ZULU", "UNIVERSAL"):
            # EST, MST, HST are fixed offsets (no daylight saving); CET, EET, EST5EDT and the like are kept for
            # backward compatibility only (IANA tz database, files `northamerica`, `europe`, `backward`).
            warnings.append(f"autoscaling.schedule.{i}.timezone {window.timezone!r} is a legacy zone name of the IANA "
                            "database (EST, MST and HST never change for daylight saving): name the region's city zone "
                            "(e.g. America/New_York, Europe/Berlin) so the window follows local time")
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

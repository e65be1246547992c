"""Helper (not a test module): run Debian's ``promtool`` (Prometheus 2.42) on the rule groups and
queries the stack renders, and read a Prometheus query result the way KEDA's Prometheus scaler does.

- ``check_rules``: ``promtool check rules`` on rule groups (the PrometheusRule ``spec.groups``).
- ``unit_test``: ``promtool test rules`` on one test (input series, alert and PromQL expectations)
  over those groups; one file per case, so a failure names its case.
- ``values``: the expanding notation of ``input_series`` (``0x9 79x49 stale``) from segments.
- ``render_annotation``: an alert annotation as Prometheus expands ``{{ $labels.x }}`` and
  ``{{ $value }}`` (the only template forms our rules use), for ``exp_annotations``.
- ``keda_reading``: what KEDA 2.20.2 makes of a query result (``pkg/scalers/prometheus_scaler.go``
  ``ExecutePromQuery``): the single value, or ``KedaError`` where KEDA returns an error (empty
  result or NaN/Inf without ``ignoreNullValues``, more than one element). An error is what
  engages the ScaledObject's ``fallback`` (``pkg/fallback/fallback.go``).

Without the binaries: under CI (``CI=true``) the calling test fails, never skips; elsewhere it is
skipped with the package to install (``.ci/apt-packages.txt`` lists ``prometheus``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

# Each promtool run is a few hundred ms of Go; a hung one must not hang the suite.
PROMTOOL_TIMEOUT_SECONDS = 120
INSTALL_HINT = "apt-get install prometheus (Debian's package ships prometheus and promtool)"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def require(binary: str) -> str:
    """Absolute path of ``binary`` (``promtool`` or ``prometheus``): skips the calling test where it
    is missing, fails it under ``CI=true``."""
    found = shutil.which(binary)
    if found:
        return found
    message = f"{binary} is not installed: {INSTALL_HINT}"
    if _in_ci():
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)
    raise AssertionError("unreachable")  # pytest.skip raises


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=10_000)


def check_rules(groups: Sequence[Mapping[str, Any]], directory: Path, name: str = "rules") -> subprocess.CompletedProcess:
    """``promtool check rules`` on ``{"groups": groups}`` written to ``directory/<name>.yml``."""
    path = directory / f"{name}.yml"
    path.write_text(_dump({"groups": list(groups)}))
    return subprocess.run(
        [require("promtool"), "check", "rules", str(path)],
        capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_SECONDS, check=False,
    )


def unit_test(
    groups: Sequence[Mapping[str, Any]],
    test: Mapping[str, Any],
    directory: Path,
    name: str,
    evaluation_interval: str = "30s",
) -> subprocess.CompletedProcess:
    """``promtool test rules`` on one ``test`` (``interval``, ``input_series``, ``alert_rule_test``,
    ``promql_expr_test``) against ``groups``; files ``directory/<name>.rules.yml`` and
    ``<name>.test.yml``. Returns the finished process (``returncode`` 0: every expectation held)."""
    rules = directory / f"{name}.rules.yml"
    rules.write_text(_dump({"groups": list(groups)}))
    tests = directory / f"{name}.test.yml"
    tests.write_text(_dump({"rule_files": [rules.name], "evaluation_interval": evaluation_interval, "tests": [dict(test)]}))
    return subprocess.run(
        [require("promtool"), "test", "rules", tests.name],
        capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_SECONDS, check=False, cwd=directory,
    )


def values(*segments: tuple[float | str | None, int] | str) -> str:
    """``input_series`` values from ``(value, samples)`` segments, one sample per interval:
    a number repeats, ``None`` is a missing sample (``_``), ``"stale"`` a staleness marker (as
    Prometheus writes when a scrape fails or a target disappears). A plain string is passed
    through (promtool's own notation, e.g. a ramp ``"1+1x29"`` = 30 samples).
    E.g. ``values((0, 10), (79, 50))`` -> ``"0x9 79x49"``."""
    out: list[str] = []
    for segment in segments:
        if isinstance(segment, str):
            out.append(segment)
            continue
        value, count = segment
        if count <= 0:
            continue
        if value == "stale":
            out.extend(["stale"] * count)
            continue
        token = "_" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
        out.append(token if count == 1 else f"{token}x{count - 1}")
    return " ".join(out)


def selector(name: str, labels: Mapping[str, str]) -> str:
    """A series in promtool's notation: ``name{a="x",b="y"}`` (labels sorted)."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


_TEMPLATE_RE = re.compile(r"\{\{\s*\$(labels\.([A-Za-z_][A-Za-z0-9_]*)|value)\s*\}\}")


def render_annotation(text: str, labels: Mapping[str, str], value: float) -> str:
    """``text`` with ``{{ $labels.x }}`` and ``{{ $value }}`` expanded as Prometheus' template
    engine does (Go's ``%v`` of a float64: ``79``, ``0.5``)."""

    def sub(match: re.Match[str]) -> str:
        if match.group(1) == "value":
            return f"{value:g}" if not float(value).is_integer() else str(int(value))
        return labels.get(match.group(2), "")

    return _TEMPLATE_RE.sub(sub, text)


class KedaError(Exception):
    """What KEDA's Prometheus scaler returns as an error (then counted towards ``fallback``)."""


def keda_reading(result: Mapping[str, Any], ignore_null_values: bool) -> float:
    """The value KEDA 2.20.2 reads from a ``/api/v1/query`` response body ``result`` (its ``data``
    object, or the whole response), mirroring ``ExecutePromQuery``: no element -> 0 with
    ``ignoreNullValues`` else error; more than one element -> error; NaN/Inf -> 0 with
    ``ignoreNullValues`` else error; otherwise the sample value.

    Raises:
        KedaError: where KEDA returns an error.
    """
    data = result.get("data", result)
    elements = data.get("result", [])
    if not elements:
        if ignore_null_values:
            return 0.0
        raise KedaError("prometheus metrics 'prometheus' target may be lost, the result is empty")
    if len(elements) > 1:
        raise KedaError("prometheus query returned multiple elements")
    value = float(elements[0]["value"][1])
    if math.isinf(value) or math.isnan(value):
        if ignore_null_values:
            return 0.0
        raise KedaError(f"prometheus query returns {value}")
    return value


def samples(expected: Iterable[tuple[Mapping[str, str], float]]) -> list[dict[str, Any]]:
    """``exp_samples`` of a ``promql_expr_test`` from ``(labels, value)`` pairs."""
    return [{"labels": selector("", labels) if labels else "{}", "value": value} for labels, value in expected]

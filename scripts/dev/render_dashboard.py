#!/usr/bin/env python3
"""Write the Grafana dashboard JSON, and draw the dashboard from a Prometheus' real series.

The dashboard is built by ``components/k8s/observability.py`` (``dashboard()``); this writes it to
``components/k8s/dashboards/kimi-vllm.json`` (the file the ConfigMap and the README use). With
``--prometheus URL --png PATH`` it asks that Prometheus for every panel's queries over the last
``--minutes``, with the dashboard's variables set to ``--namespace`` and ``--model-name``, and draws
the panels at their grid positions (24 columns; a stat panel shows its last value, a time series
its lines) with matplotlib, a developer tool (``pip install matplotlib``; in requirements-dev.txt).
``docs/dashboard.png`` is drawn this way by the test suite's live tier, from the Prometheus that
scrapes a real vLLM server under load:
``KIMI_DASHBOARD_PNG=docs/dashboard.png pytest tests/test_prometheus_live.py``.

Exit codes: 0 ok; 1 ``--check`` found the JSON out of date, or Prometheus could not be queried;
2 usage error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: the project may not be installed here; scripts/ops/_cli.py's hook
    # first (a missing package, or the project itself, prints `make setup`, not a traceback)
    import os
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops", "_cli.py"), run_name="_cli")

from components.k8s.observability import DASHBOARD_PATH, dashboard, dashboard_expressions, dashboard_text, substitute_variables

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_PATH = REPO_ROOT / "docs" / "dashboard.png"
# Grafana's grid: 24 columns; a row is 30 px against a column of about 50 px at 1200 px wide.
GRID_COLUMNS = 24
ROW_TO_COLUMN = 30 / 50
# Points per series asked of Prometheus (query_range step = window / this).
POINTS_PER_SERIES = 240
QUERY_TIMEOUT_SECONDS = 30

# panel id -> [(legend, [(unix seconds, value), ...])]
PanelSeries = dict[int, list[tuple[str, list[tuple[float, float]]]]]


def query_range(prometheus_url: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """``/api/v1/query_range`` of ``expr``: the result's series (``metric``, ``values``).

    Raises:
        RuntimeError: Prometheus answered with an error or could not be reached.
    """
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    try:
        with urllib.request.urlopen(f"{prometheus_url.rstrip('/')}/api/v1/query_range?{params}",
                                    timeout=QUERY_TIMEOUT_SECONDS) as r:
            body = json.loads(r.read())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{prometheus_url}: {exc}") from exc
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body.get('error', body)}")
    return list(body["data"]["result"])


def legend(fmt: str, labels: dict[str, str]) -> str:
    """A Grafana ``legendFormat`` with ``{{label}}`` filled from the series' labels."""
    return re.sub(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", lambda mt: labels.get(mt.group(1), ""), fmt).strip()


def panel_series(
    doc: dict[str, Any], prometheus_url: str, namespace: str, model_name: str, start: float, end: float
) -> PanelSeries:
    """Every panel's series from ``prometheus_url`` between ``start`` and ``end`` (unix seconds),
    the variables set to ``namespace`` and ``model_name``. Panels without data map to ``[]``.

    Raises:
        RuntimeError: a query failed.
    """
    step = max(1.0, (end - start) / POINTS_PER_SERIES)
    values = {"namespace": namespace, "model_name": model_name}
    out: PanelSeries = {}
    for panel in doc["panels"]:
        lines: list[tuple[str, list[tuple[float, float]]]] = []
        for target in panel["targets"]:
            for series in query_range(prometheus_url, substitute_variables(target["expr"], values), start, end, step):
                points = [(float(t), float(v)) for t, v in series["values"]]
                lines.append((legend(target["legendFormat"], series["metric"]), points))
        out[panel["id"]] = lines
    return out


def _scale(unit: str) -> tuple[float, str]:
    """Multiplier and suffix that show a value of Grafana ``unit`` as people read it."""
    return {"percentunit": (100.0, " %"), "percent": (1.0, " %"), "bytes": (2.0**-30, " GiB"), "s": (1.0, " s"),
            "reqps": (1.0, " req/s")}.get(unit, (1.0, ""))


def _number(value: float, unit: str) -> str:
    factor, suffix = _scale(unit)
    shown = value * factor
    text = f"{shown:.3g}" if abs(shown) < 1000 else f"{shown:,.0f}"
    return text + suffix


def render_png(doc: dict[str, Any], series: PanelSeries, path: Path, note: str = "", no_data: str = "no data") -> None:
    """Draw ``doc``'s panels with ``series`` (``panel_series``) at their grid positions as a PNG;
    ``note`` goes in the header, ``no_data`` in panels without series.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["text.parse_math"] = False  # legends and titles may hold $ signs
    panels = doc["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width_in = 16.0
    header_in = 0.6
    height_in = width_in * rows * ROW_TO_COLUMN / GRID_COLUMNS + header_in
    fig = plt.figure(figsize=(width_in, height_in), dpi=100, facecolor="#111217")
    fig.text(0.01, 1 - 0.35 / height_in, doc["title"], color="#e6e6e6", fontsize=13, fontweight="bold", va="center")
    if note:
        fig.text(0.99, 1 - 0.35 / height_in, note, color="#9aa0a6", fontsize=8, ha="right", va="center")
    body = 1 - header_in / height_in
    ends = [t for lines in series.values() for _, pts in lines for t, _ in pts[-1:]]
    end = max(ends) if ends else time.time()
    for p in panels:
        g = p["gridPos"]
        unit = p["fieldConfig"]["defaults"].get("unit", "none")
        left, w = g["x"] / GRID_COLUMNS, g["w"] / GRID_COLUMNS
        top, h = g["y"] / rows * body, g["h"] / rows * body
        # room for the y tick labels of time series on the left, a little on the right
        pad_left = 0.03 if p["type"] != "stat" else 0.006
        pad_right, pad_top, pad_bottom = 0.006, 0.028 * 36 / rows, 0.016 * 36 / rows
        ax = fig.add_axes((left + pad_left, 1 - header_in / height_in - top - h + pad_bottom,
                           w - pad_left - pad_right, h - pad_top - pad_bottom), facecolor="#181b1f")
        ax.set_title(p["title"], color="#d8d9da", fontsize=9, loc="left", pad=4)
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.tick_params(colors="#8e8e8e", labelsize=7)
        lines = series.get(p["id"], [])
        if not lines:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, no_data, color="#8e8e8e", fontsize=9, ha="center", va="center", transform=ax.transAxes)
            continue
        factor, _ = _scale(unit)
        if p["type"] == "stat":
            label, pts = lines[0]
            ax.plot([(t - end) / 60 for t, _ in pts], [v * factor for _, v in pts], color="#73bf69", alpha=0.35, lw=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.45, _number(pts[-1][1], unit), color="#73bf69", fontsize=18, fontweight="bold",
                    ha="center", va="center", transform=ax.transAxes)
            continue
        for label, pts in lines:
            ax.plot([(t - end) / 60 for t, _ in pts], [v * factor for _, v in pts], lw=1.2, label=label)
        ax.set_xlabel("minutes before the end of the load", color="#8e8e8e", fontsize=6, labelpad=1)
        ax.grid(color="#2c3235", lw=0.5)
        _, suffix = _scale(unit)
        if suffix:
            ax.set_ylabel(suffix.strip(), color="#8e8e8e", fontsize=6)
        ax.legend(fontsize=7, loc="upper left", frameon=False, labelcolor="#d8d9da", ncol=min(3, len(lines)))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, facecolor=fig.get_facecolor())
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="render_dashboard.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the committed dashboard JSON differs from what the code builds")
    parser.add_argument("--prometheus", metavar="URL",
                        help="a Prometheus that scrapes vLLM (e.g. after `kubectl -n monitoring port-forward "
                             "svc/prometheus-operated 9090`: http://127.0.0.1:9090); with --png")
    parser.add_argument("--png", type=Path, metavar="PATH",
                        help=f"draw the dashboard from --prometheus (e.g. {PNG_PATH.relative_to(REPO_ROOT)})")
    parser.add_argument("--namespace", default="kimi", help="the dashboard's namespace variable (default kimi)")
    parser.add_argument("--model-name", default="kimi-k3.1-pro",
                        help="the dashboard's served-model variable (default kimi-k3.1-pro)")
    parser.add_argument("--minutes", type=float, default=60.0, help="how far back to draw (default 60)")
    args = parser.parse_args(argv)
    if bool(args.prometheus) != bool(args.png):
        parser.error("--prometheus and --png go together")
    if args.minutes <= 0:
        parser.error(f"--minutes: {args.minutes:g} must be above 0")
    doc = dashboard()
    if args.check:
        if not DASHBOARD_PATH.is_file() or DASHBOARD_PATH.read_text() != dashboard_text():
            print(f"out of date: {DASHBOARD_PATH.relative_to(REPO_ROOT)} (run scripts/dev/render_dashboard.py)", file=sys.stderr)
            return 1
        return 0
    if not args.png:
        DASHBOARD_PATH.write_text(dashboard_text())
        queries = len(dashboard_expressions(doc))
        print(f"wrote {DASHBOARD_PATH.relative_to(REPO_ROOT)}: {len(doc['panels'])} panels, {queries} queries")
    else:
        end = time.time()
        try:
            series = panel_series(doc, args.prometheus, args.namespace, args.model_name, end - args.minutes * 60, end)
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        try:
            render_png(doc, series, args.png, note=f"namespace {args.namespace}, model {args.model_name}")
        except ImportError:
            print("error: --png needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
        print(f"wrote {args.png}: {sum(1 for lines in series.values() if lines)} of {len(series)} panels with data")
    return 0


if __name__ == "__main__":
    sys.exit(main())

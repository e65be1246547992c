#!/usr/bin/env python3
"""Write the Grafana dashboard JSON and a picture of its layout.

The dashboard is built by ``components/k8s/observability.py`` (``dashboard()``); this writes it to
``components/k8s/dashboards/kimi-vllm.json`` (the file the ConfigMap and the README use) and draws
its panels from their ``gridPos`` (24 columns; one grid row = 30 px as in Grafana) as
``docs/dashboard.svg``. With ``--png`` it also draws the same layout as ``docs/dashboard.png`` with
matplotlib (when installed; not needed for the JSON or the SVG).

Exit codes: 0 ok; 1 ``--check`` found a file out of date; 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from html import escape
from pathlib import Path

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.k8s.observability import DASHBOARD_PATH, dashboard, dashboard_expressions, dashboard_text

REPO_ROOT = Path(__file__).resolve().parents[1]

SVG_PATH = REPO_ROOT / "docs" / "dashboard.svg"
PNG_PATH = REPO_ROOT / "docs" / "dashboard.png"
COLUMN_PX = 50
ROW_PX = 30
MARGIN_PX = 10
KIND_FILL = {"stat": "#dbeafe", "timeseries": "#dcfce7"}


def layout_svg(doc: dict) -> str:
    """An SVG of the dashboard's panels at their grid positions: title, kind and first query's metric."""
    panels = doc["panels"]
    width = 24 * COLUMN_PX + 2 * MARGIN_PX
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    height = rows * ROW_PX + 2 * MARGIN_PX + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="DejaVu Sans, sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{MARGIN_PX}" y="22" font-size="16" font-weight="bold">{escape(doc["title"])}  (variables: '
        + escape(", ".join(v["name"] for v in doc["templating"]["list"])) + ")</text>",
    ]
    for p in panels:
        g = p["gridPos"]
        x = MARGIN_PX + g["x"] * COLUMN_PX
        y = MARGIN_PX + 30 + g["y"] * ROW_PX
        w, h = g["w"] * COLUMN_PX - 6, g["h"] * ROW_PX - 6
        fill = KIND_FILL.get(p["type"], "#f3f4f6")
        out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="4" fill="{fill}" stroke="#6b7280"/>')
        out.append(f'<text x="{x + 8}" y="{y + 18}" font-size="13" font-weight="bold">{escape(p["title"])}</text>')
        legends = ", ".join(t["legendFormat"] for t in p["targets"])
        out.append(
            f'<text x="{x + 8}" y="{y + 36}" font-size="10" fill="#374151">{escape(p["type"])}: {escape(legends)[:60]}</text>'
        )
        if h > 60:
            for i, t in enumerate(p["targets"][:4]):
                out.append(
                    f'<text x="{x + 8}" y="{y + 56 + 14 * i}" font-size="9" '
                    f'fill="#6b7280">{escape(t["expr"])[: int(w / 5.2)]}</text>'
                )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def layout_png(doc: dict, path: Path) -> None:
    """The layout of ``layout_svg`` as a PNG (matplotlib, Agg backend).

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    panels = doc["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    plt.rcParams["text.parse_math"] = False  # queries contain $variables
    fig, ax = plt.subplots(figsize=(14, 14 * (rows + 2) / 24 * ROW_PX / COLUMN_PX), dpi=100)
    ax.set_xlim(0, 24)
    ax.set_ylim(rows + 1.5, 0)
    ax.axis("off")
    ax.text(
        0,
        0.9,
        f"{doc['title']}  (variables: {', '.join(v['name'] for v in doc['templating']['list'])})",
        fontsize=12,
        fontweight="bold",
    )
    for p in panels:
        g = p["gridPos"]
        x, y, w, h = g["x"], g["y"] + 1.5, g["w"], g["h"]
        ax.add_patch(FancyBboxPatch((x + 0.08, y + 0.1), w - 0.16, h - 0.2, boxstyle="round,pad=0,rounding_size=0.15",
                                    facecolor=KIND_FILL.get(p["type"], "#f3f4f6"), edgecolor="#6b7280"))
        ax.text(x + 0.3, y + 0.9, p["title"], fontsize=9, fontweight="bold", va="center")
        legends = ", ".join(t["legendFormat"] for t in p["targets"])
        ax.text(x + 0.3, y + 1.9, f"{p['type']}: {legends}"[: int(w * 5.5)], fontsize=7, color="#374151", va="center")
        if h > 4:
            for i, t in enumerate(p["targets"][:4]):
                ax.text(
                    x + 0.3,
                    y + 3.0 + 0.9 * i,
                    t["expr"][: int(w * 7)],
                    fontsize=5.5,
                    color="#6b7280",
                    va="center",
                    family="monospace",
                )
    fig.savefig(path, bbox_inches="tight", facecolor="white")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="render_dashboard.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the committed JSON or SVG differs from what the code builds"
    )
    parser.add_argument("--png", action="store_true", help="also write docs/dashboard.png (needs ImageMagick's convert)")
    args = parser.parse_args(argv)
    doc = dashboard()
    files = {DASHBOARD_PATH: dashboard_text(), SVG_PATH: layout_svg(doc)}
    if args.check:
        stale = [str(p.relative_to(REPO_ROOT)) for p, text in files.items() if not p.is_file() or p.read_text() != text]
        for name in stale:
            print(f"out of date: {name} (run scripts/render_dashboard.py)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    if args.png:
        try:
            layout_png(doc, PNG_PATH)
        except ImportError:
            print("error: --png needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
        print(f"wrote {PNG_PATH.relative_to(REPO_ROOT)}")
    print(f"{len(doc['panels'])} panels, {len(dashboard_expressions(doc))} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main())

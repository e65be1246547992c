"""The cost model and scripts/ops/cost.py against the reference task's published figures and the
prices in the core (never re-typed here: read from MODELS / INSTANCES / compute_sizing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.core import cost
from components.core.load import load_stack
from components.core.model import MODELS
from components.core.sizing import billed_gpu_nodes, compute_sizing
from components.core.targets import INSTANCES
from tests.conftest import FIXED_NOW, STACKS, without_overlay_notice

REPO_ROOT = Path(__file__).resolve().parents[1]
PRICE = MODELS["kimi-k3.1-pro"].api_price


def test_reference_task_reproduces_design_figures():
    task = cost.REFERENCE_TASK
    # 0.42M x 13 = 5.5, 3.81M x 1.3 = 5.0, 0.22M x 68 = 15.1 -> about 26 RMB.
    assert round(task.uncached_input_tokens / 1e6, 2) == 0.42
    assert round(task.cached_input_tokens / 1e6, 2) == 3.80
    assert round(task.output_tokens / 1e6, 2) == 0.22
    api = cost.api_cost_per_task(PRICE)
    assert round(api.uncached_input, 1) == 5.5
    assert round(api.cached_input, 0) == 5.0
    assert round(api.output, 1) == 15.1
    assert round(api.total) == 26
    assert round(api.total * 1000, -3) == 26_000


def test_conversion_break_even_and_capacity():
    assert cost.to_rmb(10, "USD", 7.0) == 70 and cost.to_rmb(10, "RMB", 7.0) == 10
    with pytest.raises(ValueError):
        cost.to_rmb(1, "EUR", 7.0)
    assert cost.break_even_tasks_per_month(26_000, 26) == 1000
    assert cost.break_even_tasks_per_month(26_001, 26) == 1001
    # 222,500 output tokens per task; 1,000 tok/s for a whole month = 2.628e9 tokens.
    assert cost.tasks_per_month_capacity(1000, busy_fraction=1.0) == int(1000 * 730 * 3600 / 222_500)
    with pytest.raises(ValueError):
        cost.TaskProfile(100, 1.5, 0.5)


def _cost(*args, columns: int | None = None):
    # The overlay notice (the suite's engine overlay is set) is the first line: tests/test_operator_inputs.py.
    env = {**os.environ, **({"COLUMNS": str(columns)} if columns else {})}
    return without_overlay_notice(subprocess.run([sys.executable, "scripts/ops/cost.py", *args], cwd=REPO_ROOT,
                                                 capture_output=True, text=True, timeout=60, env=env))


def test_b300_json_against_the_core():
    out = _cost("--stack", "b300", "--json", "--rmb-per-usd", "7.0")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    on_demand = INSTANCES["p6-b300.48xlarge"].usd_per_hour_on_demand
    assert report["api_cost_per_task_rmb"] == pytest.approx(cost.api_cost_per_task(PRICE).total, abs=0.01)
    assert round(report["api_cost_per_task_rmb"]) == 26
    assert round(report["api_cost_per_month_rmb"], -3) == 26_000  # 1,000 tasks by default
    assert report["self_hosted_cost_per_hour_usd"] == pytest.approx(on_demand)
    assert report["self_hosted_cost_per_month_usd"] == pytest.approx(on_demand * 730, abs=0.01)
    expected = cost.break_even_tasks_per_month(on_demand * 730 * 7.0, cost.api_cost_per_task(PRICE).total)
    assert report["break_even_tasks_per_month"] == expected
    assert report["cheaper_at_this_volume"] == "api"
    assert report["capacity"] is None


def test_tasks_per_month_and_exchange_rate_are_parameters():
    a = json.loads(_cost("--stack", "b300", "--json", "--tasks-per-month", "50000", "--rmb-per-usd", "7.0").stdout)
    b = json.loads(_cost("--stack", "b300", "--json", "--tasks-per-month", "50000", "--rmb-per-usd", "8.0").stdout)
    assert a["api_cost_per_month_rmb"] == pytest.approx(a["api_cost_per_task_rmb"] * 50_000, rel=1e-3)
    assert a["cheaper_at_this_volume"] == "self-hosted"
    assert b["break_even_tasks_per_month"] > a["break_even_tasks_per_month"]


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_prices_through_the_sizing(stack):
    spec = load_stack(stack, now=FIXED_NOW)
    sizing = compute_sizing(spec)
    out = _cost("--stack", stack, "--json")
    # No price means no comparison: the report is printed, the exit code says it was not made.
    assert out.returncode == (0 if sizing.usd_per_hour is not None else 2), out.stderr
    report = json.loads(out.stdout)
    if sizing.usd_per_hour is None:
        assert out.stderr.count("\n") == 1 and "--usd-per-hour" in out.stderr
        assert report["self_hosted_cost_per_month_usd"] is None and report["break_even_tasks_per_month"] is None
        assert any("--usd-per-hour" in n for n in report["notes"])
        priced = json.loads(_cost("--stack", stack, "--json", "--usd-per-hour", "100").stdout)
        # An UltraServer block is paid whole (gb300: 18 trays), not per tray used.
        assert priced["self_hosted_cost_per_hour_usd"] == pytest.approx(100 * billed_gpu_nodes(spec))
    else:
        assert report["self_hosted_cost_per_hour_usd"] == pytest.approx(sizing.usd_per_hour)


def test_throughput_json_says_whether_one_deployment_serves(tmp_path):
    validate_json = {"ok": True, "checks": [{"name": "throughput", "status": "pass", "reason": "",
                                             "metrics": {"output_tokens_per_second": 1000.0, "concurrency": 8}}]}
    path = tmp_path / "validate.json"
    path.write_text(json.dumps(validate_json))
    capacity = int(1000 * 730 * 3600 * 0.5 / 222_500)
    serves = json.loads(_cost("--stack", "b300", "--json", "--throughput-json", str(path)).stdout)["capacity"]
    assert serves["tasks_per_month_capacity"] == capacity and serves["can_serve"] is True
    short = json.loads(
        _cost("--stack", "b300", "--json", "--throughput-json", str(path), "--tasks-per-month", str(capacity * 3)).stdout
    )["capacity"]
    assert short["can_serve"] is False and short["deployments_needed"] == 3
    table = _cost("--stack", "b300", "--throughput-json", str(path))
    assert table.returncode == 0 and "One deployment serves" in table.stdout


def test_usage_errors_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args in (
        ["--stack", "nope"],
        ["--stack", "b300", "--rmb-per-usd", "0"],
        ["--stack", "b300", "--throughput-json", str(bad)],
        ["--stack", "b300", "--throughput-json", str(tmp_path / "missing.json")],
        ["--stack", "b300", "--input-fraction", "2"],
    ):
        out = _cost(*args)
        assert out.returncode == 2, args
        assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    helptext = _cost("--help").stdout
    for flag in (
        "--stack",
        "--tasks-per-month",
        "--throughput-json",
        "--json",
        "--rmb-per-usd",
        "--usd-per-hour",
        "--busy-fraction",
    ):
        assert flag in helptext


def _usage_error(out, *needles):
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, (
        out.stderr
    )
    for needle in needles:
        assert needle in out.stderr, out.stderr


@pytest.mark.parametrize("flag, value", [("--usd-per-hour", "nan"), ("--usd-per-hour", "inf"), ("--usd-per-hour", "1e308"),
                                         ("--usd-per-hour", "-5"), ("--rmb-per-usd", "nan"), ("--rmb-per-usd", "inf"),
                                         ("--rmb-per-usd", "-inf"), ("--busy-fraction", "nan"), ("--task-tokens", "0")])
def test_money_flags_must_be_finite_and_sane(flag, value):
    _usage_error(_cost("--stack", "b300", f"{flag}={value}"), flag, value)


def test_abbreviated_flags_and_usage_errors_are_one_line():
    _usage_error(_cost("--stack", "b300", "--usd", "100"), "unrecognized arguments: --usd")
    _usage_error(_cost("--tasks-per-month", "5"), "--stack")  # no multi-line usage block


@pytest.mark.parametrize("metrics, needle", [
    ({"concurrency": 8}, "has no metrics.output_tokens_per_second"),
    ({"output_tokens_per_second": "fast"}, "metrics.output_tokens_per_second in"),
    (None, "has no 'metrics' object"),
])
def test_throughput_json_names_the_missing_or_wrong_metric(tmp_path, metrics, needle):
    check = {"name": "throughput", "status": "pass", "reason": "ok"}
    if metrics is not None:
        check["metrics"] = metrics
    path = tmp_path / "validate.json"
    path.write_text(json.dumps({"ok": True, "checks": [check]}))
    out = _cost("--stack", "b300", "--throughput-json", str(path))
    _usage_error(out, "--throughput-json", needle)
    assert "(None)" not in out.stderr
    check.update(status="fail", reason="3 of 16 streams failed")
    path.write_text(json.dumps({"ok": False, "checks": [check]}))
    _usage_error(_cost("--stack", "b300", "--throughput-json", str(path)), "status 'fail'", "3 of 16 streams failed")


def test_price_source_cites_the_price_list_not_a_file_outside_the_repo():
    assert PRICE.source.startswith("Kimi open platform price list")
    report = json.loads(_cost("--stack", "b300", "--json").stdout)
    table = _cost("--stack", "b300", columns=250).stdout  # the table follows COLUMNS: wide enough for one line a cell
    assert report["api_price_source"].startswith("Kimi open platform price list")
    for text in (report["api_price_source"], table):
        assert "DESIGN.md" not in text
    assert "Kimi open platform price list" in table


def test_verdict_counts_the_deployments_the_volume_needs(tmp_path):
    """Above one deployment's capacity the volume needs two: the verdict flips to the API."""
    validate_json = {"ok": True, "checks": [{"name": "throughput", "status": "pass", "reason": "",
                                             "metrics": {"output_tokens_per_second": 6000.0, "concurrency": 64}}]}
    path = tmp_path / "validate.json"
    path.write_text(json.dumps(validate_json))
    capacity = int(6000 * 730 * 3600 * 0.5 / 222_500)
    volume = str(capacity + 1)
    unchecked = json.loads(_cost("--stack", "b300", "--json", "--tasks-per-month", volume).stdout)
    assert unchecked["capacity_checked"] is False and unchecked["deployments_needed"] is None
    assert unchecked["cheaper_at_this_volume"] == "self-hosted" and "capacity not checked" in unchecked["verdict"]
    checked = json.loads(_cost("--stack", "b300", "--json", "--tasks-per-month", volume,
                               "--throughput-json", str(path)).stdout)
    assert checked["capacity_checked"] is True and checked["deployments_needed"] == 2
    one = checked["self_hosted_cost_per_month_rmb"]
    assert checked["self_hosted_cost_at_volume_rmb"] == round(2 * one, 2)
    assert checked["cheaper_at_this_volume"] == "api" and "2 deployments" in checked["verdict"]
    table = _cost("--stack", "b300", "--tasks-per-month", volume, "--throughput-json", str(path))
    assert "2 deployments" in " ".join(table.stdout.split()) and "Verdict" in table.stdout
    low = json.loads(_cost("--stack", "b300", "--json", "--tasks-per-month", str(capacity // 2),
                           "--throughput-json", str(path)).stdout)
    assert low["deployments_needed"] == 1


def test_verdict_says_when_self_hosting_never_breaks_even(tmp_path):
    validate_json = {"ok": True, "checks": [{"name": "throughput", "status": "pass", "reason": "",
                                             "metrics": {"output_tokens_per_second": 100.0, "concurrency": 1}}]}
    path = tmp_path / "validate.json"
    path.write_text(json.dumps(validate_json))
    report = json.loads(_cost("--stack", "b300", "--json", "--tasks-per-month", "100000",
                              "--throughput-json", str(path)).stdout)
    assert report["cheaper_at_this_volume"] == "api" and "never breaks even" in report["verdict"]

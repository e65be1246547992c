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
    # The self-hosted price is the whole bill: the GPU at its list price plus every other billable resource.
    assert report["gpu_cost_per_hour_usd"] == pytest.approx(on_demand)
    total = report["bill"]["usd_per_hour"]
    assert total == pytest.approx(sum(line["usd_per_hour"] or 0 for line in report["bill"]["lines"]), abs=1e-3)
    assert on_demand < total < on_demand + 1
    assert report["self_hosted_cost_per_hour_usd"] == pytest.approx(total, abs=1e-3)
    assert report["self_hosted_cost_per_month_usd"] == pytest.approx(report["bill"]["usd_per_month"], abs=0.01)
    expected = cost.break_even_tasks_per_month(report["self_hosted_cost_per_month_usd"] * 7.0,
                                               cost.api_cost_per_task(PRICE).total)
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
        assert priced["gpu_cost_per_hour_usd"] == pytest.approx(100 * billed_gpu_nodes(spec))
        assert priced["self_hosted_cost_per_hour_usd"] == pytest.approx(priced["bill"]["usd_per_hour"], abs=1e-3)
    else:
        assert report["gpu_cost_per_hour_usd"] == pytest.approx(sizing.usd_per_hour)


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
    # Both figures are rounded to the fen from the unrounded monthly cost: within one fen of 2x the shown one.
    assert abs(checked["self_hosted_cost_at_volume_rmb"] - 2 * one) <= 0.011
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


# --- the price table: every billable resource the stacks declare (components/core/prices.py) ---

def _declared(stack: str, **kw) -> list[dict]:
    from tests.conftest import plan_for

    return [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in plan_for(stack, **kw).resources]


@pytest.mark.parametrize("stack", STACKS)
def test_every_declared_type_is_priced_or_free_with_a_source(stack):
    """The real program under the mock engine: each type maps to price entries or to free with a
    source, and each priced type that bills shows up as a line of the stack's bill."""
    from components.core import prices

    resources = _declared(stack)
    bill = cost.spec_bill(load_stack(stack, now=FIXED_NOW), resources)
    assert bill.unpriced == ()
    for kind in {r["type"] for r in resources}:
        pricing = prices.pricing_of(kind)
        if isinstance(pricing, prices.Free):
            assert pricing.source and kind in bill.free
        else:
            assert all(key == prices.INSTANCE_TYPE or key in prices.PRICES for key in pricing.keys)
            # Billed: a line, or (gateway endpoint, ClusterIP Service) free with the reason.
            assert any(line.resource_type == kind for line in bill.lines) or kind in bill.free, kind
    for entry in prices.PRICES.values():
        assert entry.usd > 0 and entry.source.startswith("https://") and entry.region and entry.date and entry.unit


def test_an_unpriced_billable_type_fails():
    from components.core import prices

    resources = _declared("b300") + [{"type": "aws:rds/instance:Instance", "name": "db", "inputs": {}}]
    with pytest.raises(prices.UnpricedResourceType, match="aws:rds/instance:Instance"):
        prices.pricing_of("aws:rds/instance:Instance")
    bill = cost.spec_bill(load_stack("b300", now=FIXED_NOW), resources)
    assert bill.unpriced == ("aws:rds/instance:Instance",)
    doc = cost.bill_document(bill, None)
    assert "NOT PRICED: aws:rds/instance:Instance" in cost.bill_summary(doc)
    # An instance type the table does not know is unpriced too, not silently free.
    odd = _declared("b300")
    for r in odd:
        if r["type"] == "aws:ec2/launchTemplate:LaunchTemplate":
            r["inputs"] = {**r["inputs"], "instanceType": "x9z.metal"}
    spec = load_stack("b300", now=FIXED_NOW)
    bill = prices.stack_bill(odd, prices.GpuPrice("p6-b300.48xlarge", 1.0, "test", 1), weights_bytes=1,
                             gpu_volume_survives_stop=True)
    assert bill.unpriced == ("aws:ec2/instance:Instance gpu-instance (x9z.metal)",) and spec


def test_fsx_is_priced_only_when_declared_by_type_tier_and_capacity():
    from components.core import prices

    spec = load_stack("b300", now=FIXED_NOW)
    base = _declared("b300")
    assert not any("FSx" in line.item for line in cost.spec_bill(spec, base).lines)
    fsx = {"type": "aws:fsx/lustreFileSystem:LustreFileSystem", "name": "fsx-fs",
           "inputs": {"deploymentType": "PERSISTENT_2", "perUnitStorageThroughput": 250, "storageCapacity": 4800}}
    bill = cost.spec_bill(spec, base + [fsx])
    (line,) = [line for line in bill.lines if "FSx" in line.item]
    unit = prices.PRICES["fsxPersistent2Ssd250GbMonth"].usd
    assert line.usd_per_hour == pytest.approx(4800 * unit / 730) and line.keeps_billing
    assert bill.usd_per_hour == pytest.approx(cost.spec_bill(spec, base).usd_per_hour + 4800 * unit / 730)
    # A tier the table lacks is named, not priced at another tier's rate.
    odd = {**fsx, "inputs": {**fsx["inputs"], "perUnitStorageThroughput": 300}}
    assert cost.spec_bill(spec, base + [odd]).unpriced == ("aws:fsx/lustreFileSystem:LustreFileSystem fsx-fs "
                                                           "(PERSISTENT_2 at 300 MB/s/TiB)",)


def test_trial_bill_at_expiry_and_what_keeps_billing():
    from scripts.ops import plan as plan_script

    doc = plan_script.build_plan_document("b300", now=FIXED_NOW)
    bill = doc["bill"]
    gpu = [line for line in bill["lines"] if line["item"].startswith("GPU nodes")]
    rest = [line for line in bill["lines"] if line not in gpu]
    assert gpu[0]["usd_per_hour"] == pytest.approx(INSTANCES["p6-b300.48xlarge"].usd_per_hour_on_demand)
    items = " | ".join(line["item"] for line in rest)
    for needle in ("NAT gateway", "S3 Standard", "public IPv4", "EBS gp3"):
        assert needle in items
    assert bill["usd_per_hour"] == pytest.approx(sum(line["usd_per_hour"] or 0 for line in bill["lines"]), abs=1e-3)
    assert bill["usd_per_month"] == pytest.approx(bill["usd_per_hour"] * 730, abs=0.05)
    # A trial: hours to its expiry x the hourly bill + the hub download through NAT (1,560 GB x USD 0.045).
    assert bill["one_time_usd"] == pytest.approx(1560 * 0.045)
    assert bill["trial_usd"] == pytest.approx(bill["trial_hours"] * bill["usd_per_hour"] + bill["one_time_usd"], abs=0.05)
    # After the GPUs stop: everything but the GPU line (the EC2 instance is stopped: its root volume stays).
    assert not gpu[0]["keeps_billing"]
    assert bill["after_gpu_stop_usd_per_hour"] == pytest.approx(
        sum(line["usd_per_hour"] or 0 for line in rest), abs=1e-3)
    rows = dict(plan_script.summary_rows(doc))
    assert "trial to expiry" in rows["total cost"] and "after the GPUs stop" in rows["total cost"]
    # prod on reserved capacity: the ODCR bills on whether the nodes run or not.
    prod = plan_script.build_plan_document("b300-prod", now=FIXED_NOW)["bill"]
    assert prod["trial_usd"] is None
    assert [line["keeps_billing"] for line in prod["lines"] if line["item"].startswith("GPU nodes")] == [True]
    assert any("EKS cluster" in line["item"] for line in prod["lines"])


def test_the_gpu_list_price_has_one_home():
    from components.core import prices
    from components.core.targets import STAGING_INSTANCE

    assert INSTANCES["p6-b300.48xlarge"].usd_per_hour_on_demand == prices.PRICES["p6-b300.48xlarge"].usd
    assert STAGING_INSTANCE.usd_per_hour == prices.PRICES[STAGING_INSTANCE.instance_type].usd
    homes = [str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "components").rglob("*.py")
             if any(price in p.read_text() for price in ("142.416", "0.4032", "0.2016"))]
    assert homes == ["components/core/prices.py"]


def test_prices_are_overridable_from_the_stack_config():
    from components.core import prices
    from components.core.config.stack_file import namespace_config, read_stack_config
    from components.core.errors import ConfigError
    from components.core.load import parse_spec

    config, _ = namespace_config(read_stack_config("b300"))
    spec = parse_spec({**config, "prices": {"natGatewayHour": 0.059}}, stack="b300", now=FIXED_NOW)
    (nat,) = [line for line in cost.spec_bill(spec, _declared("b300")).lines if line.item.startswith("NAT gateway, per")]
    assert nat.usd_per_unit == 0.059 and nat.source == "prices.natGatewayHour (config)"
    with pytest.raises(ConfigError, match=r"prices\.natGatewayHours.*not an entry of the price table.*natGatewayHour"):
        parse_spec({**config, "prices": {"natGatewayHours": 0.059}}, stack="b300", now=FIXED_NOW)
    with pytest.raises(ConfigError, match=r"prices\.nlbHour"):
        prices.price_table({"nlbHour": -1})


def _overlay_compute(stack: str, **changes) -> str:
    from components.core.config.stack_file import read_stack_config
    from tests.conftest import TEST_ENGINE_OVERLAY

    overlay = json.loads(TEST_ENGINE_OVERLAY)
    compute = {**read_stack_config(stack).get("kimi-deploy:compute", {}), **changes}
    overlay.setdefault("stacks", {}).setdefault(stack, {})["kimi-deploy:compute"] = compute
    return json.dumps(overlay)


def test_a_price_far_below_the_list_price_is_warned_and_the_verdict_says_it_rests_on_it(monkeypatch):
    """Issue 35 item 8: compute.usdPerHour 0.0001 where the list price is 142.42."""
    overlay = _overlay_compute("b300", usdPerHour=0.0001)
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", overlay)
    spec = load_stack("b300", now=FIXED_NOW)
    (warning,) = [w for w in spec.warnings if "compute.usdPerHour" in w]
    assert "0.0001" in warning and "142.42" in warning and "p6-b300.48xlarge" in warning
    env_report = json.loads(_cost("--stack", "b300", "--json").stdout)
    assert "rests on compute.usdPerHour 0.0001" in env_report["verdict"] and "142.42" in env_report["verdict"]
    # A real discount (half the list price) is no typo: no warning, no caveat.
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", _overlay_compute("b300", usdPerHour=71.0))
    assert not [w for w in load_stack("b300", now=FIXED_NOW).warnings if "compute.usdPerHour" in w]
    assert "rests on" not in json.loads(_cost("--stack", "b300", "--json").stdout)["verdict"]


def test_the_small_figures_beside_the_bill_agree_with_it():
    """Three small errors of the plan's text: "-1 other lines" where the GPU price is unknown
    (mi355x), "ready 8 min later" under 44 and 51 min (the 427 s difference rounded up on its own),
    and a "still billing" list without the NAT gateway's public IPv4 address, which the bill prices."""
    import re

    from components.core.prices import PRICES
    from scripts.ops import plan as plan_script

    mi = plan_script.build_plan_document("mi355x", now=FIXED_NOW)
    summary = cost.bill_summary(mi["bill"])
    assert "-1" not in summary and "GPU unknown (no other line" in summary, summary
    b300 = plan_script.build_plan_document("b300", now=FIXED_NOW)
    rows = plan_script.stage_then_serve_rows(b300)
    single, staged = (int(rows[i][1].removesuffix(" min")) for i in (0, 1))
    later = re.search(r"ready (\d+) min later", b300["stage_then_serve"]["verdict"])
    assert later and int(later[1]) == staged - single, (rows, b300["stage_then_serve"]["verdict"])
    for doc in (b300, plan_script.build_plan_document("gb300", now=FIXED_NOW)):
        billing = doc["at_expiry"].split("still billing: ", 1)[1]
        assert "public IPv4 address" in billing, billing
        assert PRICES["publicIpv4Hour"].usd == 0.005 and "vpc/pricing" in PRICES["publicIpv4Hour"].source
        keeps = [line for line in doc["bill"]["lines"] if line["keeps_billing"] and line["usd_per_hour"]]
        assert f"(USD {sum(line['usd_per_hour'] for line in keeps):,.2f}/h)" in billing, billing
    assert "FSx" not in billing  # gb300 declares no FSx (the hand-written list named it)


def test_a_capacity_blocks_unknown_price_says_how_blocks_are_priced():
    """A capacity block's cost said "no public price": blocks are priced per block at purchase
    (an upfront fee); the plan bills compute.capacity.usdPerHour."""
    from components.core.sizing import gpu_usd_per_hour

    usd, source = gpu_usd_per_hour(load_stack("gb300", now=FIXED_NOW))
    assert usd is None
    assert "no public price" not in source, source
    assert "priced per block at purchase" in source and "describe-capacity-block-offerings" in source
    assert "set compute.capacity.usdPerHour = fee / (hours x trays)" in source, source


def test_an_unknown_gpu_price_is_said_as_a_sum_without_the_gpus_not_a_floor():
    """gb300's whole-block bill read "at least USD 0.65/h": a floor under a block of 18 trays whose
    price is unknown; the sum is said as what it is, without the GPUs, and the block's term named."""
    from scripts.ops import plan as plan_script

    summary = cost.bill_summary(plan_script.build_plan_document("gb300", now=FIXED_NOW)["bill"])
    assert "at least" not in summary, summary
    assert "/month) without the GPUs: GPU unknown + 8 other lines" in summary, summary
    assert "without the GPUs; after the GPUs stop" in summary and "+ the reserved GPUs' term" in summary


def test_a_per_gpu_price_is_warned_as_such_in_the_plan_and_in_cost(monkeypatch):
    """Issue 35 (trials t119, t715): 17.80 (12.5% of the 142.42 list, per GPU) passed the 10% bound."""
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", _overlay_compute("b300", usdPerHour=17.8))
    (warning,) = [w for w in load_stack("b300", now=FIXED_NOW).warnings if "compute.usdPerHour" in w]
    assert "compute.usdPerHour 17.8 is 12.5%" in warning and "142.42" in warning
    assert "looks like a per-GPU price (17.8 x 8 GPUs = USD 142.40/h)" in warning
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY")
    verdict = json.loads(_cost("--stack", "b300", "--json", "--usd-per-hour", "17.8").stdout)["verdict"]
    assert "rests on --usd-per-hour 17.8" in verdict and "looks like a per-GPU price" in verdict
    # Far below list but no per-GPU figure (x 8 is far from the list price): a typo, not per GPU.
    verdict = json.loads(_cost("--stack", "b300", "--json", "--usd-per-hour", "30").stdout)["verdict"]
    assert "rests on --usd-per-hour 30" in verdict and "per-GPU" not in verdict


def test_an_exchange_rate_outside_the_plausible_band_is_refused_and_an_inverted_one_named():
    """Issue 35 (trial t718): --rmb-per-usd 0.14 (USD per RMB) flipped the verdict to self-hosting."""
    out = _cost("--stack", "b300", "--rmb-per-usd", "0.14")
    assert out.returncode != 0 and "--rmb-per-usd: 0.14 is outside the plausible band 5-10" in out.stderr
    assert "looks inverted" in out.stderr and "7.14 RMB per USD" in out.stderr
    out = _cost("--stack", "b300", "--rmb-per-usd", "71")
    assert out.returncode != 0 and "outside the plausible band" in out.stderr and "inverted" not in out.stderr
    assert _cost("--stack", "b300", "--rmb-per-usd", "7.2", "--json").returncode == 0


def _overlay_storage(stack: str, **changes) -> str:
    from components.core.config.stack_file import read_stack_config
    from tests.conftest import TEST_ENGINE_OVERLAY

    overlay = json.loads(TEST_ENGINE_OVERLAY)
    storage = {**read_stack_config(stack).get("kimi-deploy:storage", {}), **changes}
    overlay.setdefault("stacks", {}).setdefault(stack, {})["kimi-deploy:storage"] = storage
    return json.dumps(overlay)


def test_an_fsx_far_larger_than_the_weights_is_warned_with_its_usd_per_hour(monkeypatch):
    """Issue 35 (trial t281): capacityGib 2,400,000 added USD 1,973/h with no warning."""
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY",
                       _overlay_storage("b300-prod", kind="nvme-from-fsx", fsx={"capacityGib": 2_400_000}))
    (warning,) = [w for w in load_stack("b300-prod", now=FIXED_NOW).warnings if "storage.fsx.capacityGib" in w]
    assert "2,400,000 is 1,000x the 2,400 GiB the weights need" in warning and "adds USD 1,971/h" in warning
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY",
                       _overlay_storage("b300-prod", kind="nvme-from-fsx", fsx={"capacityGib": 9_600}))
    assert not [w for w in load_stack("b300-prod", now=FIXED_NOW).warnings if "storage.fsx.capacityGib" in w]


def test_provisioned_fsx_metadata_iops_are_named_unpriced_in_the_bill(monkeypatch):
    """Issue 35 (trial t287): metadataIops 192000 was rendered but the bill listed nothing unpriced."""
    from scripts.ops import plan as plan_script

    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY",
                       _overlay_storage("b300-prod", kind="nvme-from-fsx", fsx={"metadataIops": 192_000}))
    unpriced = plan_script.build_plan_document("b300-prod", now=FIXED_NOW)["bill"]["unpriced"]
    assert [u for u in unpriced if "192,000 provisioned metadata IOPS" in u], unpriced
    # AUTOMATIC metadata (no metadataIops) is in the storage price: nothing unpriced.
    from components.core.prices import GpuPrice, stack_bill

    fs = {"type": "aws:fsx/lustreFileSystem:LustreFileSystem", "name": "fs", "inputs": {
        "deploymentType": "PERSISTENT_2", "perUnitStorageThroughput": 1000, "storageCapacity": 2400}}
    gpu = GpuPrice("p6-b300.48xlarge", 142.42, "list", 1)
    for meta, unpriced_count in (({"mode": "AUTOMATIC"}, 0), ({"mode": "USER_PROVISIONED", "iops": 12000}, 1)):
        bill = stack_bill([{**fs, "inputs": {**fs["inputs"], "metadataConfiguration": meta}}], gpu,
                          weights_bytes=10**12, gpu_volume_survives_stop=False)
        assert len(bill.unpriced) == unpriced_count, bill.unpriced

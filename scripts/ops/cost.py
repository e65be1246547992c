#!/usr/bin/env python3
"""Self-hosting vs the vendor API: cost per hour and month, API cost per task, break-even volume.

    python scripts/ops/cost.py --stack b300 [--tasks-per-month N] [--throughput-json FILE] [--json]

Prices come from the core, never from this file: the self-hosted price is the sizing's
(``compute.usdPerHour``, the capacity-block price, else the on-demand list price), the API
price is the model profile's ``api_price``. With ``--throughput-json`` (the JSON of
``scripts/ops/validate.py --checks throughput --json``) it also says whether one deployment can
serve the volume. Exit codes: 0 ok, 2 usage or config error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.core import cost as costmodel
from components.core import prices
from components.core.config import DeploymentSpec, stack_names
from components.core.load import load_stack
from components.core.sizing import billed_gpu_nodes, compute_sizing
from scripts.ops._cli import (
    EXIT_USAGE,
    CliParser,
    UsageError,
    print_json,
    print_overlay_notice,
    print_table,
    prog_name,
    run_cli,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

DEFAULT_TASKS_PER_MONTH = 1_000
DEFAULT_BUSY_FRACTION = 0.5
# Sane ranges of the money flags: a GPU node costs USD 1-1,000 an hour (the largest list prices
# are ~USD 140); exchange rates of any currency the API may bill in sit well inside 0.001-10,000.
USD_PER_HOUR_RANGE = (0.01, 100_000.0)
RMB_PER_USD_RANGE = (0.01, 1_000.0)
MAX_TASKS_PER_MONTH = 10**12


# The JSON report's note for a stack without a price (the table leaves it to the stderr line).
PRICE_UNKNOWN_NOTE = "self-hosted price unknown"

def _number(kind: type, low: float, high: float, *, low_open: bool = False) -> Any:
    """An argparse ``type``: a finite ``kind`` in ``[low, high]`` (``(low, high]`` with
    ``low_open``); the error names the value and the allowed range (nan, inf, 1e308 rejected)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number (allowed {_range(low, high, low_open)})")
        if value < low or value > high or (low_open and value == low):
            raise argparse.ArgumentTypeError(f"{text} is outside the allowed range {_range(low, high, low_open)}")
        return value

    return parse


def _range(low: float, high: float, low_open: bool) -> str:
    return f"{'(' if low_open else '['}{low:g}, {high:g}]"


def build_parser() -> argparse.ArgumentParser:
    ref = costmodel.REFERENCE_TASK
    parser = CliParser(
        prog=prog_name("scripts/ops/cost.py"),
        description="Compare self-hosting a stack with the model vendor's API price for your volume.",
        epilog="Example: kimi-deploy cost --stack b300 --tasks-per-month 5000 "
        "--throughput-json validate.json",
    )
    parser.add_argument("--stack", required=True, help=f"stack name: stacks/Pulumi.<stack>.yaml ({', '.join(stack_names())})")
    parser.add_argument(
        "--tasks-per-month", type=_number(int, 0, MAX_TASKS_PER_MONTH), default=DEFAULT_TASKS_PER_MONTH, metavar="N",
        help=f"agent tasks your team runs per month (default {DEFAULT_TASKS_PER_MONTH:,})",
    )
    parser.add_argument(
        "--throughput-json", type=Path, metavar="FILE",
        help="JSON written by `kimi-deploy validate --checks throughput --json`; adds whether one "
        "deployment can serve --tasks-per-month at the measured output tokens/s",
    )
    parser.add_argument(
        "--busy-fraction", type=_number(float, 0, 1, low_open=True), default=DEFAULT_BUSY_FRACTION, metavar="F",
        help="share of the month the endpoint runs at the measured throughput, 0-1 "
        f"(default {DEFAULT_BUSY_FRACTION}: traffic has peaks and idle hours)",
    )
    parser.add_argument(
        "--rmb-per-usd", type=_number(float, *RMB_PER_USD_RANGE), default=costmodel.DEFAULT_RMB_PER_USD, metavar="RATE",
        help=f"exchange rate, RMB per USD (default {costmodel.DEFAULT_RMB_PER_USD}, approximate: "
        "use your finance team's rate)",
    )
    parser.add_argument(
        "--usd-per-hour", type=_number(float, *USD_PER_HOUR_RANGE), metavar="USD",
        help="price of one GPU node per hour, USD; overrides the stack's price (compute.usdPerHour, "
        "the capacity-block price or the on-demand list price)",
    )
    parser.add_argument(
        "--task-tokens", type=_number(int, 1, 10**12), default=ref.total_tokens, metavar="N",
        help=f"tokens per task, input plus output (default {ref.total_tokens:,}: the reference coding-agent task)",
    )
    parser.add_argument(
        "--input-fraction", type=_number(float, 0, 1), default=ref.input_fraction, metavar="F",
        help=f"share of a task's tokens that is input, 0-1 (default {ref.input_fraction})",
    )
    parser.add_argument(
        "--cached-input-fraction", type=_number(float, 0, 1), default=ref.cached_input_fraction, metavar="F",
        help=f"share of the input that hits the API's prefix cache, 0-1 (default {ref.cached_input_fraction})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for machines instead of a table")
    return parser


def read_throughput(path: Path) -> dict[str, Any]:
    """The throughput metrics from validate.py's JSON.

    Raises:
        StackFileError: the file cannot be read or is not UTF-8.
        UsageError: not validate.py JSON, or no passing throughput check.
    """
    from components.core.config.stack_file import read_text_file

    text = read_text_file(path, "--throughput-json", str(path), "file")  # unreadable or not UTF-8: one line
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"--throughput-json: {path} is not JSON ({err.msg} at line {err.lineno})") from None
    checks = document.get("checks") if isinstance(document, dict) else None
    if not isinstance(checks, list):
        raise UsageError(f"--throughput-json: {path} is not the JSON of scripts/ops/validate.py --json (no 'checks' list)")
    for check in checks:
        if isinstance(check, dict) and check.get("name") == "throughput":
            if check.get("status") != "pass":
                why = f": {check['reason']}" if check.get("reason") else ""
                raise UsageError(
                    f"--throughput-json: the throughput check in {path} has status {check.get('status')!r}, not 'pass'{why}"
                )
            metrics = check.get("metrics")
            if not isinstance(metrics, dict):
                raise UsageError(f"--throughput-json: the throughput check in {path} has no 'metrics' object")
            tps = metrics.get("output_tokens_per_second")
            if "output_tokens_per_second" not in metrics:
                raise UsageError(f"--throughput-json: the throughput check in {path} has no metrics.output_tokens_per_second")
            if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not math.isfinite(tps) or tps <= 0:
                raise UsageError(
                    f"--throughput-json: metrics.output_tokens_per_second in {path} is {tps!r}; expected a positive number"
                )
            return metrics
    raise UsageError(f"--throughput-json: {path} has no throughput check (run validate.py with --checks throughput)")


def estimate(spec: DeploymentSpec, args: argparse.Namespace) -> dict[str, Any]:
    """The cost report of ``spec`` for the command-line options (see ``--json``)."""
    if args.tasks_per_month < 0:
        raise UsageError(f"--tasks-per-month: {args.tasks_per_month} must not be negative")
    if args.rmb_per_usd <= 0:
        raise UsageError(f"--rmb-per-usd: {args.rmb_per_usd} must be positive")
    low, high = costmodel.RMB_PER_USD_PLAUSIBLE
    if not low <= args.rmb_per_usd <= high:
        inverted = (f"; it looks inverted (USD per RMB): 1/{args.rmb_per_usd:g} = {1 / args.rmb_per_usd:.2f} RMB per USD"
                    if low <= 1 / args.rmb_per_usd <= high else "")
        raise UsageError(f"--rmb-per-usd: {args.rmb_per_usd:g} is outside the plausible band {low:g}-{high:g} RMB per USD "
                         f"(default {costmodel.DEFAULT_RMB_PER_USD:g}){inverted}")
    if args.usd_per_hour is not None and args.usd_per_hour <= 0:
        raise UsageError(f"--usd-per-hour: {args.usd_per_hour} must be positive")
    if not 0 < args.busy_fraction <= 1:
        raise UsageError(f"--busy-fraction: {args.busy_fraction} must be in (0, 1]")
    try:
        task = costmodel.TaskProfile(args.task_tokens, args.input_fraction, args.cached_input_fraction)
    except ValueError as err:
        raise UsageError(f"task shape: {err} (--task-tokens, --input-fraction, --cached-input-fraction)") from None
    rate = args.rmb_per_usd
    price = spec.model.api_price
    api = costmodel.api_cost_per_task(price, task)
    api_task_rmb = costmodel.to_rmb(api.total, price.currency, rate)
    notes: list[str] = []

    if args.usd_per_hour is not None:
        # An UltraServer capacity block is paid whole: every tray of it, not the trays used.
        billed = billed_gpu_nodes(spec)
        price_source = f"--usd-per-hour {args.usd_per_hour} x {billed} node(s)" + (
            f" (the whole UltraServer block; {spec.gpu_nodes} used)" if billed != spec.gpu_nodes else ""
        )
        gpu = costmodel.gpu_price(spec, args.usd_per_hour, price_source)
        node_price, override = args.usd_per_hour, "--usd-per-hour"
    else:
        sizing = compute_sizing(spec)
        gpu = costmodel.gpu_price(spec)
        price_source = sizing.price_source
        node_price, override = spec.config.compute.usd_per_hour, "compute.usdPerHour"
    # Every billable resource the stack declares (components/core/prices.py), not the GPUs alone.
    bill = costmodel.bill_document(costmodel.spec_bill(spec, declared_resources(spec), gpu),
                                   costmodel.trial_hours(spec, datetime.now(UTC)))
    usd_per_hour: float | None = bill["usd_per_hour"] if gpu.usd_per_hour is not None else None
    rests_on = None
    warned = (prices.node_price_warning(override, node_price, spec.instance.instance_type, spec.instance.gpus)
              if node_price is not None else None)
    if warned is not None:
        rests_on = f"this verdict rests on {override} {node_price:g}; check it: {warned}"
        notes.append(rests_on)
    month_usd = bill["usd_per_month"] if usd_per_hour is not None else None
    month_rmb = month_usd * rate if month_usd is not None else None
    break_even = costmodel.break_even_tasks_per_month(month_rmb, api_task_rmb) if month_rmb is not None else None
    api_month_rmb = api_task_rmb * args.tasks_per_month
    cheaper = None
    if month_rmb is None:
        notes.append(f"{PRICE_UNKNOWN_NOTE} ({price_source}); or pass --usd-per-hour")
    else:
        cheaper = "self-hosted" if month_rmb < api_month_rmb else "api"
        if spec.config.compute.capacity.type == "capacity-block":
            notes.append("a capacity block is paid for its whole term, also after `pulumi destroy`")

    capacity = None
    if args.throughput_json is not None:
        metrics = read_throughput(args.throughput_json)
        tps = float(metrics["output_tokens_per_second"])
        per_deployment = costmodel.tasks_per_month_capacity(tps, task, args.busy_fraction)
        capacity = {
            "output_tokens_per_second": round(tps, 1),
            "concurrency": metrics.get("concurrency"),
            "busy_fraction": args.busy_fraction,
            "tasks_per_month_capacity": per_deployment,
            "can_serve": per_deployment >= args.tasks_per_month,
            "deployments_needed": math.ceil(args.tasks_per_month / per_deployment) if per_deployment else None,
        }
        notes.append(
            "capacity counts output tokens only (decode-bound; prefix caching serves most input) at the "
            "measured concurrency: measure at your real concurrency"
        )
    volume = volume_verdict(args.tasks_per_month, month_rmb, api_month_rmb, break_even, capacity)
    if rests_on is not None:
        volume["verdict"] += f"; {rests_on}"
    if volume["deployments_needed"] is not None and month_rmb is not None:
        cheaper = "self-hosted" if volume["self_hosted_cost_at_volume_rmb"] < api_month_rmb else "api"
    return {
        "stack": spec.stack,
        "target": spec.target.name,
        "instance_type": spec.instance.instance_type,
        "gpu_nodes": spec.gpu_nodes,
        "rmb_per_usd": rate,
        "task": {
            "total_tokens": task.total_tokens,
            "uncached_input_tokens": round(task.uncached_input_tokens),
            "cached_input_tokens": round(task.cached_input_tokens),
            "output_tokens": round(task.output_tokens),
        },
        "api_price_source": price.source,
        "api_price_per_million_tokens": {
            "currency": price.currency,
            "uncached_input": price.input_cache_miss_per_mtok,
            "cached_input": price.input_cache_hit_per_mtok,
            "output": price.output_per_mtok,
        },
        "api_cost_breakdown_rmb": {
            "uncached_input": round(costmodel.to_rmb(api.uncached_input, price.currency, rate), 2),
            "cached_input": round(costmodel.to_rmb(api.cached_input, price.currency, rate), 2),
            "output": round(costmodel.to_rmb(api.output, price.currency, rate), 2),
        },
        "api_cost_per_task_rmb": round(api_task_rmb, 2),
        "tasks_per_month": args.tasks_per_month,
        "api_cost_per_month_rmb": round(api_month_rmb, 2),
        "self_hosted_cost_per_hour_usd": round(usd_per_hour, 3) if usd_per_hour is not None else None,
        "gpu_cost_per_hour_usd": round(gpu.usd_per_hour, 3) if gpu.usd_per_hour is not None else None,
        "bill": bill,
        "self_hosted_cost_per_month_usd": round(month_usd, 2) if month_usd is not None else None,
        "self_hosted_cost_per_month_rmb": round(month_rmb, 2) if month_rmb is not None else None,
        "hours_per_month": costmodel.HOURS_PER_MONTH,
        "price_source": price_source,
        "break_even_tasks_per_month": break_even,
        "cheaper_at_this_volume": cheaper,
        "capacity": capacity,
        "capacity_checked": capacity is not None,
        "deployments_needed": volume["deployments_needed"],
        "self_hosted_cost_at_volume_rmb": volume["self_hosted_cost_at_volume_rmb"],
        "verdict": volume["verdict"],
        "notes": notes,
    }


def declared_resources(spec: DeploymentSpec) -> list[dict[str, Any]]:
    """The resources ``pulumi up`` would declare for ``spec``'s stack, as ``{type, name, inputs}``
    (the program under the mock engine, as the plan runs it; no cloud call)."""
    from components.core.config.stack_file import read_stack_config
    from components.plan_engine import run_program

    run = run_program(read_stack_config(spec.stack), stack=spec.stack, allow_blockers=True)
    return [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in run.resources]


def volume_verdict(
    tasks_per_month: int,
    month_rmb: float | None,
    api_month_rmb: float,
    break_even: int | None,
    capacity: dict[str, Any] | None,
) -> dict[str, Any]:
    """The verdict at a volume, counting the deployments the volume needs.

    Args:
        tasks_per_month: the volume.
        month_rmb: one deployment's cost per month (RMB), or None when its price is unknown.
        api_month_rmb: the API's cost for the volume (RMB per month).
        break_even: tasks per month at which ONE deployment costs what the API does, or None.
        capacity: ``estimate``'s capacity dict (``tasks_per_month_capacity`` of one deployment,
            measured by ``validate.py --checks throughput``), or None when not measured.

    Returns:
        ``{"deployments_needed": int | None, "self_hosted_cost_at_volume_rmb": float | None,
        "verdict": str}``: with capacity, the volume needs ``ceil(volume / capacity)``
        deployments (at least 1) and self-hosting costs that many times one deployment; without
        it, the verdict assumes one deployment and says capacity was not checked.
    """
    if month_rmb is None:
        return {"deployments_needed": None, "self_hosted_cost_at_volume_rmb": None,
                "verdict": "unknown: the comparison needs a self-hosted price"}
    per_deployment = capacity["tasks_per_month_capacity"] if capacity else None
    if not per_deployment:
        cheaper = "self-hosted" if month_rmb < api_month_rmb else "api"
        why = ("capacity measured as 0 tasks/month" if capacity else
               "capacity not checked: pass --throughput-json from `kimi-deploy validate --checks throughput --json`")
        return {"deployments_needed": None, "self_hosted_cost_at_volume_rmb": None,
                "verdict": f"{cheaper} is cheaper at {tasks_per_month:,} tasks/month IF one deployment can serve "
                           f"them ({why})"}
    needed = max(1, math.ceil(tasks_per_month / per_deployment))
    cost_rmb = round(needed * month_rmb, 2)
    cheaper = "self-hosted" if cost_rmb < api_month_rmb else "api"
    text = (f"{cheaper} is cheaper at {tasks_per_month:,} tasks/month: {needed} deployment"
            f"{'s' if needed != 1 else ''} of {per_deployment:,} tasks/month each cost {cost_rmb:,.0f} RMB/month, "
            f"the API {api_month_rmb:,.0f} RMB/month")
    if break_even is not None and break_even > per_deployment:
        text += (f"; self-hosting never breaks even at this throughput (break-even {break_even:,} tasks/month "
                 f"is above one deployment's capacity)")
    return {"deployments_needed": needed, "self_hosted_cost_at_volume_rmb": cost_rmb, "verdict": text}


def _money(value: float | None, unit: str) -> str:
    return "unknown" if value is None else f"{value:,.2f} {unit}"


def print_report(report: dict[str, Any]) -> None:
    task = report["task"]
    b = report["api_cost_breakdown_rmb"]
    unit = report["api_price_per_million_tokens"]
    per_hour = report["self_hosted_cost_per_hour_usd"]
    nodes = report["gpu_nodes"]
    # The "how" column shows quantities x unit prices = amounts, so every figure can be re-derived.
    rows = [
        (
            "API cost per task",
            _money(report["api_cost_per_task_rmb"], "RMB"),
            f"{task['uncached_input_tokens'] / 1e6:.2f}M uncached in x {unit['uncached_input']:,.2f} + "
            f"{task['cached_input_tokens'] / 1e6:.2f}M cached in x {unit['cached_input']:,.2f} + "
            f"{task['output_tokens'] / 1e6:.2f}M out x {unit['output']:,.2f} {unit['currency']}/1M tokens "
            f"= {b['uncached_input']:,.2f} + {b['cached_input']:,.2f} + {b['output']:,.2f} RMB",
        ),
        (
            f"API cost, {report['tasks_per_month']:,} tasks/month",
            _money(report["api_cost_per_month_rmb"], "RMB"),
            f"{report['tasks_per_month']:,} tasks x {_money(report['api_cost_per_task_rmb'], 'RMB')}; "
            f"{report['api_price_source']}",
        ),
        (
            "Self-hosted per hour",
            _money(per_hour, "USD"),
            f"GPU {nodes}x {report['instance_type']} = {_money(report['gpu_cost_per_hour_usd'], 'USD')}/h "
            f"({report['price_source']}) + the rest of the bill {_money(per_hour - report['gpu_cost_per_hour_usd'], 'USD')}/h"
            # Without a price the why stays here and what to set is said once, on stderr (main).
            if per_hour is not None else report["price_source"].split("; set ", 1)[0],
        ),
        *[
            (f"  {line['item']}", _money(line["usd_per_hour"], "USD") + "/h" if line["usd_per_hour"] is not None
             else "per use", f"{line['quantity']:,.6g} x "
             + ("unknown" if line["usd_per_unit"] is None else f"USD {line['usd_per_unit']:g}")
             + f"/{line['unit']}; {line['source']}" + (" (estimate)" if line["estimate"] else ""))
            for line in report["bill"]["lines"] if not line["item"].startswith("GPU nodes")
        ],
        (
            "Self-hosted per month",
            _money(report["self_hosted_cost_per_month_usd"], "USD"),
            f"{_money(per_hour, 'USD')}/h x {report['hours_per_month']:,.0f} h; "
            f"{_money(report['self_hosted_cost_per_month_rmb'], 'RMB')} at {report['rmb_per_usd']} RMB/USD"
            if per_hour is not None else f"{report['hours_per_month']:,.0f} h at {report['rmb_per_usd']} RMB/USD",
        ),
        *([("Trial to expiry", _money(report["bill"]["trial_usd"], "USD"),
            f"{report['bill']['trial_hours']:,.0f} h x the hourly bill + once "
            f"{_money(report['bill']['one_time_usd'], 'USD')} (hub download through NAT)")]
          if report["bill"]["trial_usd"] is not None and per_hour is not None else []),
        ("After the GPUs stop", _money(report["bill"]["after_gpu_stop_usd_per_hour"], "USD") + "/h",
         f"{_money(report['bill']['after_gpu_stop_usd_per_month'], 'USD')}/month keeps billing until `pulumi destroy`: "
         + ", ".join(line["item"].split(",")[0] for line in report["bill"]["lines"]
                     if line["keeps_billing"] and line["usd_per_hour"])),
        (
            "Break-even",
            "unknown"
            if report["break_even_tasks_per_month"] is None
            else f"{report['break_even_tasks_per_month']:,} tasks/month",
            "one deployment vs the API",
        ),
    ]
    cap = report["capacity"]
    if cap is not None:
        rows.append(
            (
                "One deployment serves",
                f"{cap['tasks_per_month_capacity']:,} tasks/month",
                f"{cap['output_tokens_per_second']:,} output tok/s at concurrency {cap['concurrency']}, busy "
                f"{cap['busy_fraction']:.0%}: "
                + ("enough" if cap["can_serve"] else f"NOT enough, {cap['deployments_needed']} deployments needed"),
            )
        )
    rows.append(("Verdict", report["cheaper_at_this_volume"] or "unknown", report["verdict"]))
    # The missing price is a note of the JSON report; here main says it once, on stderr, with the fix.
    notes = [n for n in report["notes"] if not n.startswith(PRICE_UNKNOWN_NOTE)]
    print_table(
        f"Cost: stack {report['stack']} ({report['gpu_nodes']}x {report['instance_type']})",
        ("item", "value", "how"),
        rows,
        caption="; ".join(notes) or None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Print the cost report of ``--stack``; return the exit code.

    0 when the comparison was made; 2 (``EXIT_USAGE``) when it could not be, because the
    stack's price is unknown (no public price, none configured, no ``--usd-per-hour``): the
    report is still printed, with one line on stderr saying what to set.
    """
    args = build_parser().parse_args(argv)
    print_overlay_notice(stack=args.stack)
    spec = load_stack(args.stack)
    report = estimate(spec, args)
    if args.json:
        print_json(report)
    else:
        print_report(report)
    if report["self_hosted_cost_per_hour_usd"] is None:
        # compute.capacity.* is read on AWS platforms only (config/platform_keys.py).
        also = " (or compute.capacity.usdPerHour)" if spec.profile.provisions_aws else ""
        print(
            f"error: stack {spec.stack}: no self-hosted price, so no comparison; set "
            f"kimi-deploy:compute.usdPerHour{also} or pass --usd-per-hour",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))

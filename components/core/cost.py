"""The cost model: the vendor API's price per task against self-hosting's price per hour.

Pure functions over the model's ``ApiPrice`` (``model.py``) and the hourly price the sizing
derives (``sizing.gpu_usd_per_hour``: config override, capacity-block price, on-demand list
price). No Pulumi import. The reference task is an estimate of a coding-agent task:
4.45M tokens, 95 % input, 90 % of the input cached -> about 26 RMB per task at the Kimi open
platform's list prices (https://platform.moonshot.cn/docs/pricing/chat).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .model import ApiPrice
from .prices import HOURS_PER_MONTH, Bill, GpuPrice, stack_bill

if TYPE_CHECKING:
    from .config import DeploymentSpec

MTOK = 1_000_000
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
# RMB per USD used when the caller gives none: an approximate rate, not a live quote. The
# scripts take ``--rmb-per-usd``; pass the rate your finance team uses.
DEFAULT_RMB_PER_USD = 7.1
# The RMB-per-USD rates ``cost`` accepts: the central parity has stayed within 6.1-7.4 since 2014 and
# 8.28 was the peg before 2005 (People's Bank of China, https://www.pbc.gov.cn; estimate of the band, read
# 2026-12); a rate outside 5-10 is a typo or inverted (USD per RMB, ~0.14) and would flip the verdict.
RMB_PER_USD_PLAUSIBLE = (5.0, 10.0)


@dataclass(frozen=True)
class TaskProfile:
    """The token shape of one agent task.

    Attributes:
        total_tokens: input plus output tokens of the whole task.
        input_fraction: share of ``total_tokens`` that is input (0..1).
        cached_input_fraction: share of the input served from the provider's prefix cache (0..1).
    """

    total_tokens: int
    input_fraction: float
    cached_input_fraction: float

    def __post_init__(self) -> None:
        if self.total_tokens <= 0:
            raise ValueError(f"total_tokens must be positive, got {self.total_tokens}")
        for name in ("input_fraction", "cached_input_fraction"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")

    @property
    def input_tokens(self) -> float:
        """Input tokens of the task."""
        return self.total_tokens * self.input_fraction

    @property
    def cached_input_tokens(self) -> float:
        """Input tokens that hit the prefix cache."""
        return self.input_tokens * self.cached_input_fraction

    @property
    def uncached_input_tokens(self) -> float:
        """Input tokens that miss the prefix cache."""
        return self.input_tokens - self.cached_input_tokens

    @property
    def output_tokens(self) -> float:
        """Output tokens of the task."""
        return self.total_tokens - self.input_tokens


# The reference coding-agent task (an estimate; override with cost.py --task-tokens etc.).
REFERENCE_TASK = TaskProfile(total_tokens=4_450_000, input_fraction=0.95, cached_input_fraction=0.90)


@dataclass(frozen=True)
class ApiTaskCost:
    """The API price of one task, in the price list's currency.

    Attributes:
        currency: ISO code (``ApiPrice.currency``).
        uncached_input, cached_input, output: cost of each part.
    """

    currency: str
    uncached_input: float
    cached_input: float
    output: float

    @property
    def total(self) -> float:
        """Cost of the whole task."""
        return self.uncached_input + self.cached_input + self.output


def api_cost_per_task(price: ApiPrice, task: TaskProfile = REFERENCE_TASK) -> ApiTaskCost:
    """The API cost of ``task`` at ``price`` (reference task at Kimi's list price: about 25.6 RMB)."""
    return ApiTaskCost(
        currency=price.currency,
        uncached_input=task.uncached_input_tokens / MTOK * price.input_cache_miss_per_mtok,
        cached_input=task.cached_input_tokens / MTOK * price.input_cache_hit_per_mtok,
        output=task.output_tokens / MTOK * price.output_per_mtok,
    )


def to_rmb(amount: float, currency: str, rmb_per_usd: float) -> float:
    """``amount`` in ``currency`` (``RMB``/``CNY`` or ``USD``) converted to RMB.

    Raises:
        ValueError: another currency, or a non-positive rate.
    """
    if rmb_per_usd <= 0:
        raise ValueError(f"the exchange rate must be positive, got {rmb_per_usd} RMB per USD")
    code = currency.upper()
    if code in ("RMB", "CNY"):
        return amount
    if code == "USD":
        return amount * rmb_per_usd
    raise ValueError(f"no exchange rate for {currency} (known: RMB, CNY, USD)")


def monthly_usd(usd_per_hour: float, hours_per_month: float = HOURS_PER_MONTH) -> float:
    """Price of keeping a deployment up for a month, USD (``usd_per_hour`` x 730 h by default)."""
    return usd_per_hour * hours_per_month


def break_even_tasks_per_month(self_hosted_rmb_per_month: float, api_rmb_per_task: float) -> int:
    """Tasks per month above which self-hosting is cheaper than the API (rounded up).

    Raises:
        ValueError: the API cost per task is not positive.
    """
    if api_rmb_per_task <= 0:
        raise ValueError(f"the API cost per task must be positive, got {api_rmb_per_task}")
    return math.ceil(self_hosted_rmb_per_month / api_rmb_per_task)


def tasks_per_month_capacity(
    output_tokens_per_second: float, task: TaskProfile = REFERENCE_TASK, busy_fraction: float = 1.0
) -> int:
    """Tasks a deployment can finish in a month when output generation is the bottleneck.

    ``output_tokens_per_second`` is the aggregate decode rate measured at some concurrency
    (``scripts/ops/validate.py`` throughput); ``busy_fraction`` is the share of the month the
    endpoint runs at that rate. Prefill of uncached input is not counted (prefix caching
    serves most of an agent's input), so this is an upper bound.

    Raises:
        ValueError: a negative rate, or ``busy_fraction`` outside (0, 1].
    """
    if output_tokens_per_second < 0:
        raise ValueError(f"output tokens per second must not be negative, got {output_tokens_per_second}")
    if not 0 < busy_fraction <= 1:
        raise ValueError(f"busy_fraction must be in (0, 1], got {busy_fraction}")
    return math.floor(output_tokens_per_second * SECONDS_PER_MONTH * busy_fraction / task.output_tokens)


def gpu_price(spec: DeploymentSpec, usd_per_node_hour: float | None = None, source: str | None = None) -> GpuPrice:
    """The GPU line's price: ``usd_per_node_hour`` x billed nodes when given (``cost --usd-per-hour``),
    else the sizing's (``sizing.gpu_usd_per_hour``: config override, capacity block, list price)."""
    from .sizing import billed_gpu_nodes, gpu_usd_per_hour

    nodes = billed_gpu_nodes(spec)
    if usd_per_node_hour is not None:
        usd: float | None = usd_per_node_hour * nodes
        why = source or f"{usd_per_node_hour} per node-hour"
    else:
        usd, why = gpu_usd_per_hour(spec)
    reserved = spec.profile.provisions_aws and spec.config.compute.capacity.type in ("odcr", "capacity-block")
    return GpuPrice(spec.instance.instance_type, usd, why, nodes, reserved)


def spec_bill(spec: DeploymentSpec, resources: Sequence[Mapping[str, Any]], gpu: GpuPrice | None = None) -> Bill:
    """The bill of ``spec``'s declared ``resources`` (``prices.stack_bill``) with its GPU price,
    the checkpoint's size and the stack's ``kimi-deploy:prices`` overrides.

    Raises:
        ConfigError: a bad ``kimi-deploy:prices`` override.
    """
    from .weights import per_node_copy_step

    mirror = spec.config.storage.mirror.enabled
    copy = per_node_copy_step(spec, mirror) if spec.profile.provisions_aws else None
    # No mirror: every GPU node copies the weights from the hub itself, on every deploy and replacement.
    hub_nodes = spec.gpu_nodes if copy is not None and copy[1].needs_hub_token else 0
    return stack_bill(resources, gpu or gpu_price(spec), weights_bytes=spec.model.weights_bytes,
                      gpu_volume_survives_stop=spec.profile.serves_under_systemd,
                      gpu_nodes_declared=spec.profile.provisions_aws, overrides=spec.config.prices,
                      hub_download_nodes=hub_nodes)


def trial_hours(spec: DeploymentSpec, now: datetime | None = None) -> float | None:
    """Hours a trial runs until its expiry: ``expires_at - now`` when both are known, else
    ``trialTtlHours``; None outside trials."""
    if spec.environment != "trial":
        return None
    if spec.expires_at is not None and now is not None:
        return max(0.0, (spec.expires_at - now).total_seconds() / 3600)
    return float(spec.trial_ttl_hours)


def bill_document(bill: Bill, hours: float | None) -> dict[str, Any]:
    """``bill`` as JSON for the plan and ``cost``: ``{usd_per_hour, usd_per_month,
    after_gpu_stop_usd_per_hour, after_gpu_stop_usd_per_month, one_time_usd (per deploy when
    hub_download_nodes > 0: each GPU node downloads the weights), hub_download_nodes, trial_hours,
    trial_usd (hours x hourly + one-time; None outside trials), gpu_price_known, lines [{item,
    resource_type, quantity, unit, usd_per_unit, usd_per_hour, usd_per_month, one_time_usd,
    keeps_billing, source, estimate, note}], free {type: source}}``."""
    def month(value: float | None) -> float | None:
        return None if value is None else round(value * HOURS_PER_MONTH, 2)

    return {
        "usd_per_hour": round(bill.usd_per_hour, 4),
        "usd_per_month": round(bill.usd_per_month, 2),
        "after_gpu_stop_usd_per_hour": round(bill.after_gpu_stop_usd_per_hour, 4),
        "after_gpu_stop_usd_per_month": round(bill.after_gpu_stop_usd_per_hour * HOURS_PER_MONTH, 2),
        "one_time_usd": round(bill.one_time_usd, 2),
        "hub_download_nodes": bill.hub_download_nodes,
        "trial_hours": None if hours is None else round(hours, 2),
        "trial_usd": None if hours is None else round(bill.trial_usd(hours), 2),
        "gpu_price_known": bill.gpu_price_known,
        "unpriced": list(bill.unpriced),
        "lines": [
            {
                "item": line.item, "resource_type": line.resource_type, "quantity": line.quantity, "unit": line.unit,
                "usd_per_unit": line.usd_per_unit,
                "usd_per_hour": None if line.usd_per_hour is None else round(line.usd_per_hour, 4),
                "usd_per_month": month(line.usd_per_hour), "one_time_usd": line.one_time_usd,
                "keeps_billing": line.keeps_billing, "source": line.source, "estimate": line.estimate,
                "note": line.note,
            }
            for line in bill.lines
        ],
        "free": dict(sorted(bill.free.items())),
    }


def bill_summary(doc: Mapping[str, Any]) -> str:
    """One line for people: ``USD 142.57/h (USD 104,076/month): GPU 142.42 + 6 other lines 0.15; ...``
    from ``bill_document``'s dict."""
    gpu = [line for line in doc["lines"] if line["item"].startswith("GPU nodes")]
    gpu_hour = sum(line["usd_per_hour"] or 0.0 for line in gpu)
    rest = doc["usd_per_hour"] - gpu_hour
    # The priced lines beside the GPU's (an unpriced GPU line is no line to subtract: "-1 other lines").
    others = len([line for line in doc["lines"] if line["usd_per_hour"] is not None and line not in gpu])
    # "at least" only for a resource type left unpriced; an unknown GPU price is said as a sum without
    # the GPUs ("at least USD 0.65/h" read as the bill of a block whose 18 trays cost far more).
    floor = "at least " if doc["unpriced"] else ""
    without = "" if doc["gpu_price_known"] else " without the GPUs"
    text = (f"{floor}USD {doc['usd_per_hour']:,.2f}/h ({floor}USD {doc['usd_per_month']:,.0f}/month){without}: GPU "
            + (f"{gpu_hour:,.2f}" if doc["gpu_price_known"] else "unknown")
            + (f" + {others} other line{'s' if others != 1 else ''} {rest:,.2f}" if others
               else " (no other line: nothing else priced is declared here)"))
    nodes = doc.get("hub_download_nodes") or 0
    if doc["one_time_usd"] and nodes:
        text += (f"; per deploy: USD {doc['one_time_usd']:,.2f} (each of {nodes} GPU nodes downloads the weights from "
                 f"the hub through NAT; USD {doc['one_time_usd'] / nodes:,.2f} more per replaced node)")
    elif doc["one_time_usd"]:
        text += f"; once: USD {doc['one_time_usd']:,.2f} (the hub download through NAT)"
    if doc["trial_usd"] is not None:
        text += (f"; trial to expiry ({doc['trial_hours']:,.0f} h): {floor}USD {doc['trial_usd']:,.2f}{without}")
    reserved = "" if doc["gpu_price_known"] or not any(line["keeps_billing"] for line in gpu) else \
        ", + the reserved GPUs' term"
    text += (f"; after the GPUs stop USD {doc['after_gpu_stop_usd_per_hour']:,.2f}/h "
             f"(USD {doc['after_gpu_stop_usd_per_month']:,.0f}/month) keeps billing until destroy{reserved}")
    if doc["unpriced"]:
        text += f"; NOT PRICED: {', '.join(doc['unpriced'])}"
    return text

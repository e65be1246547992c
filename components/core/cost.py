"""The cost model: the vendor API's price per task against self-hosting's price per hour.

Pure functions over the model's ``ApiPrice`` (``model.py``) and the hourly price the sizing
derives (``sizing.gpu_usd_per_hour``: config override, capacity-block price, on-demand list
price). No Pulumi import. The reference task is an estimate of a coding-agent task:
4.45M tokens, 95 % input, 90 % of the input cached -> about 26 RMB per task at the Kimi open
platform's list prices (https://platform.moonshot.cn/docs/pricing/chat).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .model import ApiPrice

MTOK = 1_000_000
# 365 days x 24 h / 12 months: the usual "month" of cloud price lists.
HOURS_PER_MONTH = 730.0
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
# RMB per USD used when the caller gives none: an approximate rate, not a live quote. The
# scripts take ``--rmb-per-usd``; pass the rate your finance team uses.
DEFAULT_RMB_PER_USD = 7.1


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

"""The statistics behind validate's verdicts that a noisy server must not pass by chance.

- ``wilson_interval``: the Wilson score interval of a binomial proportion (E. B. Wilson, "Probable
  inference, the law of succession, and statistical inference", JASA 22, 1927). It stays inside
  [0, 1] and keeps its coverage near 0 losses, where the plain normal interval collapses to a point.
- ``rank_sum_test``: a one-sided permutation test of the Mann-Whitney U statistic (H. B. Mann and
  D. R. Whitney, Ann. Math. Statist. 18, 1947) with mid-ranks for ties: the probability, with the
  group labels shuffled at random, of a U at least as large as the one observed. Exact (every
  relabelling) up to ``EXACT_LIMIT`` relabellings, else a seeded Monte Carlo estimate.

Standard library only.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

# Up to this many relabellings the permutation distribution is enumerated (C(20, 10) = 184,756:
# ten samples per group); above it, MONTE_CARLO_DRAWS random relabellings estimate it.
EXACT_LIMIT = 200_000
MONTE_CARLO_DRAWS = 20_000


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of the proportion ``successes / trials``.

    Args:
        successes: events counted (0..trials).
        trials: trials in all (> 0).
        confidence: two-sided coverage, e.g. 0.95.

    Raises:
        ValueError: ``trials`` < 1, ``successes`` outside 0..trials, or ``confidence`` outside (0, 1).
    """
    if trials < 1 or not 0 <= successes <= trials or not 0 < confidence < 1:
        raise ValueError(f"wilson_interval({successes}, {trials}, {confidence}): needs 0 <= successes <= trials, "
                         "trials >= 1 and 0 < confidence < 1")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def midranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n of ``values`` in their order, tied values sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


@dataclass(frozen=True)
class RankTest:
    """The outcome of ``rank_sum_test``.

    Attributes:
        p_value: one-sided probability of a U at least this large under random labels.
        u_statistic: pairs (h, l) with h > l, ties counted half, out of ``len(higher) * len(lower)``.
        pairs: ``len(higher) * len(lower)``.
        exact: True when every relabelling was enumerated, False for the Monte Carlo estimate.
    """

    p_value: float
    u_statistic: float
    pairs: int
    exact: bool


def rank_sum_test(higher: Sequence[float], lower: Sequence[float], *, seed: int = 0) -> RankTest:
    """One-sided test that the values in ``higher`` tend to exceed those in ``lower``.

    The smallest p-value possible is ``1 / C(n + m, n)`` (5 samples each: 1/252 = 0.004), reached
    when every value of ``higher`` exceeds every value of ``lower``.

    Raises:
        ValueError: a group is empty.
    """
    n, m = len(higher), len(lower)
    if not n or not m:
        raise ValueError("rank_sum_test needs at least one value in each group")
    ranks = midranks([*higher, *lower])
    offset = n * (n + 1) / 2
    observed = sum(ranks[:n]) - offset
    # Compare rank sums with a tolerance: mid-ranks are halves, sums of floats may differ in the last bit.
    threshold = observed + offset - 1e-9
    total = math.comb(n + m, n)
    if total <= EXACT_LIMIT:
        at_least = sum(1 for chosen in itertools.combinations(ranks, n) if sum(chosen) >= threshold)
        return RankTest(at_least / total, observed, n * m, True)
    rng = random.Random(seed)
    at_least = sum(1 for _ in range(MONTE_CARLO_DRAWS) if sum(rng.sample(ranks, n)) >= threshold)
    return RankTest((at_least + 1) / (MONTE_CARLO_DRAWS + 1), observed, n * m, False)


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (the mean of the middle two for an even count).

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

"""Confidence intervals over seeds: Student t on the per-seed values, exact quantiles.

One seed is an anecdote, so policy comparisons run several (paired: program ``i`` of a seed is
the same program under every policy) and report each metric as a mean with a 95 % interval,
and each policy against a baseline as the mean of its per-seed ratios with the interval of
those ratios. A ratio whose interval contains 1 is not a significant difference. The t
interval assumes roughly normal per-seed values; with the handful of seeds a sweep affords,
it is wider, and more honest, than a bootstrap, which understates spread at n = 3..10.

Not every mean has an interval to judge by: one seed has no spread to estimate one from, and
seeds that all give the same value (a scenario the seed does not change) make the t interval
a point, which would call every other value significantly different. `Interval.no_interval`
says which, and `Interval.significant` then gives no verdict: this is the one place that rule
lives, for every command that reports intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LEVEL = 0.95
METHOD = "Student t, 95 %"
ONE_SEED = "1 seed: no interval"
NO_SPREAD = "the seeds did not change it: no interval"


@dataclass(frozen=True, slots=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def no_interval(self) -> str | None:
        """Why this mean has no interval to judge by, or None when it has one."""
        if self.n < 2:
            return ONE_SEED
        if self.low == self.high:  # `mean_interval` makes equal values an exact point
            return NO_SPREAD
        return None

    def significant(self, null: float = 1.0) -> bool | None:
        """Whether ``null`` (1 for a ratio) lies outside the interval: a significant difference;
        None where there is no interval, so no verdict either way."""
        return None if self.no_interval else not self.contains(null)

    def record(self) -> dict[str, Any]:
        """The interval as a JSON record: ``low`` and ``high`` are null where there is none, and
        ``no_interval`` says why."""
        reason = self.no_interval
        return {"mean": self.mean, "low": None if reason else self.low, "high": None if reason else self.high, "no_interval": reason}


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (bisection on the CDF; p in (0.5, 1))."""
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean of ``values`` with its 95 % t interval (a single value, or values all equal: a
    point, exactly, which `Interval.no_interval` tells apart)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    if all(v == values[0] for v in values):  # exactly: the rounding of a mean could widen the point by an ulp
        return Interval(values[0], values[0], values[0], n)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + LEVEL / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def complete_interval(values: Sequence[float | None]) -> Interval | None:
    """`mean_interval` of ``values`` when every one is present; None when one is missing (a seed
    with no call completed in its window leaves its cell without an interval)."""
    present = [v for v in values if v is not None]
    return mean_interval(present) if present and len(present) == len(values) else None


def paired_ratio(values: Sequence[float], baseline: Sequence[float]) -> Interval | None:
    """The mean of the per-seed ratios value / baseline with their interval; None when a
    baseline value is zero (no ratio exists)."""
    if len(values) != len(baseline):
        raise ValueError(f"{len(values)} values against {len(baseline)} baseline values")
    if any(b == 0 for b in baseline):
        return None
    return mean_interval([v / b for v, b in zip(values, baseline)])

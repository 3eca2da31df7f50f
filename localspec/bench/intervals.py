"""Confidence intervals for speed ratios measured repetition by repetition.

A ratio of two decoders' speeds is measured once per repetition, the two runs side by side in the
same rotation. Its logarithm is close to normal and the repetitions close to independent, so the
interval is Student's t on the mean log ratio, turned back into a ratio: a geometric mean with a
95% interval, asymmetric around it as ratios are.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

#: Two-sided 95% quantiles of Student's t for 1 to 30 degrees of freedom.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom (``df`` >= 1)."""
    if df < 1:
        raise ValueError(f"Student's t needs at least one degree of freedom, not {df}.")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959964  # beyond the table, the first two terms of the Cornish-Fisher expansion
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass(frozen=True)
class Interval:
    """A ratio's geometric mean over repetitions and its 95% confidence interval."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def width(self) -> float:
        """The interval's width relative to its mean (0.04: plus or minus about 2%)."""
        return (self.high - self.low) / self.mean

    def __str__(self) -> str:
        return f"{self.low:.2f}-{self.high:.2f}"


def ratio_interval(ratios: Sequence[float]) -> Optional[Interval]:
    """The interval of the mean of ``ratios`` (each > 0), or None for fewer than two of them."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))

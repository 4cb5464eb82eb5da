"""The statistics of the results page: a paired delta over seeds, its 95 % interval, the smallest effect its seeds
could have detected, and the verdict that sets it beside the paper's number.

A delta is *ours − reference* in the final validation loss, one value per seed (the two runs of a seed share the
init seed and the data order), so its spread is the paired spread. With n seeds, mean m and sample sd s:

    95 % interval     m ± t_{0.975, n−1} · s / √n                                (two-sided Student t)
    MDE               (t_{0.975, n−1} + t_{0.80, n−1}) · s / √n                  (two-sided 95 %, 80 % power)

The MDE is the true delta that a paired t-test at this n and this sd would resolve four times in five: a paper effect
smaller than it can hide in the noise of these seeds, one larger than it should show.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

# Student t quantiles for 1..30 degrees of freedom (any statistics table); beyond, the normal's.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
T80 = (1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879, 0.876, 0.873, 0.870, 0.868, 0.866,
       0.865, 0.863, 0.862, 0.861, 0.860, 0.859, 0.858, 0.858, 0.857, 0.856, 0.856, 0.855, 0.855, 0.854, 0.854)
Z975, Z80 = 1.960, 0.842
ALPHA = 0.05  # two-sided: the chance that a zero delta's interval excludes 0
FACTOR = 2.0  # a resolved delta of the paper's sign within this factor of the paper's value reproduces it


def t975(df: int) -> float:
    return T975[df - 1] if df <= len(T975) else Z975


def t80(df: int) -> float:
    return T80[df - 1] if df <= len(T80) else Z80


@dataclass(frozen=True)
class Stat:
    mean: float
    sd: float
    n: int

    @property
    def half(self) -> float:
        """Half width of the 95 % interval of the mean (nan for one value)."""
        return t975(self.n - 1) * self.sd / math.sqrt(self.n) if self.n >= 2 else math.nan

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half

    @property
    def mde(self) -> float:
        """(t_{0.975, n−1} + t_{0.80, n−1}) · sd / √n: the module docstring's minimum detectable effect."""
        return (t975(self.n - 1) + t80(self.n - 1)) * self.sd / math.sqrt(self.n) if self.n >= 2 else math.nan

    @property
    def resolved(self) -> bool:
        return self.n >= 2 and (self.lo > 0 or self.hi < 0)

    def contains(self, value: float) -> bool:
        return self.n >= 2 and self.lo <= value <= self.hi


def stat(values: list[float]) -> Optional[Stat]:
    if not values:
        return None
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return Stat(mean, sd, len(values))


def ratio(delta: Optional[Stat], paper: Optional[float]) -> Optional[float]:
    """ours / paper (None where either is missing or the paper's is 0)."""
    if delta is None or not paper:
        return None
    return delta.mean / paper


# The verdict classes, in the order the page tallies them.
REPRODUCES, LARGER, SMALLER, NOISE, OPPOSITE, RESOLVED, ONE_SEED, NO_RUNS = (
    "reproduces", "right sign, larger", "right sign, smaller", "within noise", "opposite sign", "resolved",
    "one seed", "no runs")
VERDICTS = (REPRODUCES, LARGER, SMALLER, NOISE, OPPOSITE, RESOLVED, ONE_SEED, NO_RUNS)


def verdict_class(delta: Optional[Stat], paper: Optional[float]) -> str:
    """Sign and size against the paper's value. A resolved delta (interval excluding 0) of the paper's sign
    reproduces it when the paper's value lies inside the interval or ours/paper is within [1/FACTOR, FACTOR];
    outside both it is larger or smaller than the paper's. An unresolved one is within noise."""
    if delta is None:
        return NO_RUNS
    if delta.n < 2:
        return ONE_SEED
    if not delta.resolved:
        return NOISE
    r = ratio(delta, paper)
    if r is None:
        return RESOLVED
    if r < 0:
        return OPPOSITE
    if delta.contains(paper) or 1 / FACTOR <= r <= FACTOR:
        return REPRODUCES
    return LARGER if r > FACTOR else SMALLER


def verdict(delta: Optional[Stat], paper: Optional[float]) -> str:
    """The verdict as the page writes it: "within noise" always with the MDE of its seeds."""
    v = verdict_class(delta, paper)
    return f"{NOISE} (MDE {delta.mde:.4f})" if v == NOISE else v


def at_least(k: int, m: int, p: float = ALPHA) -> float:
    """P(X ≥ k) for X ~ Binomial(m, p): the chance that m independent zero deltas give k or more resolved ones."""
    return sum(math.comb(m, j) * p ** j * (1 - p) ** (m - j) for j in range(k, m + 1))


def fmt(s: Optional[Stat], sign: bool = False) -> str:
    """A loss as "mean ± sd", a delta (sign=True) as "mean [lo, hi]"; one seed: the mean alone."""
    if s is None:
        return "–"
    mean = f"{s.mean:+.4f}" if sign else f"{s.mean:.4f}"
    if s.n < 2:
        return mean
    return f"{mean} [{s.lo:+.4f}, {s.hi:+.4f}]" if sign else f"{mean} ± {s.sd:.4f}"

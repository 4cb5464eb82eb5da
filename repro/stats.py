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


# The verdict classes, in the order the page tallies them. Each says what the interval can and cannot say about the
# paper's value: no label hides an interval that excludes the paper's value, and none claims a size the interval
# cannot fix (an interval wider than the paper's |Δ| holds the paper's value and values half or twice as large).
REPRODUCES, CONSISTENT, LARGER, SMALLER, CONTRADICTS, RULED_OUT, UNINFORMATIVE, UNDECIDED, RESOLVED, UNRESOLVED, \
    ONE_SEED, NO_RUNS = ("reproduces the size", "consistent with the paper", "right sign, larger",
                         "right sign, smaller", "contradicts", "the paper's size is ruled out here",
                         "cannot tell at this power (uninformative)", "undecided at this power", "resolved",
                         "unresolved", "one seed", "no runs")
VERDICTS = (REPRODUCES, CONSISTENT, LARGER, SMALLER, CONTRADICTS, RULED_OUT, UNINFORMATIVE, UNDECIDED, RESOLVED,
            UNRESOLVED, ONE_SEED, NO_RUNS)
SUPPORTS = (REPRODUCES, CONSISTENT, LARGER, SMALLER)  # resolved, with the paper's sign
SIZE_RULE = 0.5  # "reproduces the size": the interval's half-width at most this times the paper's |Δ|
FAR = 3.0  # a point estimate more than FAR times the paper's, or under 1/FAR of it, is far from the paper's


def verdict_class(delta: Optional[Stat], paper: Optional[float]) -> str:
    """What the interval says about the paper's value.

    Resolved (the interval excludes 0): of the paper's sign, an interval that holds the paper's value *reproduces
    the size* when its half-width is at most SIZE_RULE × the paper's |Δ| (narrow enough to tell the paper's size
    from half or twice it), and is only *consistent with the paper* when wider; one that does not hold it is *right
    sign, larger* or *smaller*; of the opposite sign it *contradicts* the paper. Unresolved: an interval that
    excludes the paper's value rules the paper's size out here (a verdict of its own, not noise); one that holds it
    cannot tell when the MDE exceeds the paper's |Δ| (these seeds could not have seen the paper's effect:
    uninformative, not a null), and is *undecided* when the seeds had the power and the interval still holds both 0
    and the paper's value."""
    if delta is None:
        return NO_RUNS
    if delta.n < 2:
        return ONE_SEED
    if paper is None or paper == 0:
        return RESOLVED if delta.resolved else UNRESOLVED
    if delta.resolved:
        if (delta.mean > 0) != (paper > 0):
            return CONTRADICTS
        if delta.contains(paper):
            return REPRODUCES if delta.half <= SIZE_RULE * abs(paper) else CONSISTENT
        return LARGER if abs(delta.mean) > abs(paper) else SMALLER
    if not delta.contains(paper):
        return RULED_OUT
    return UNINFORMATIVE if delta.mde > abs(paper) else UNDECIDED


def verdict(delta: Optional[Stat], paper: Optional[float]) -> str:
    """The verdict as a table cell writes it: with the ratio ours/paper where the interval holds the paper's value,
    with the MDE against the paper's |Δ| where the seeds lack (or have) the power to tell."""
    v = verdict_class(delta, paper)
    if v == REPRODUCES:
        return f"{v} (ours/paper {ratio(delta, paper):.2f}{', far from the paper' if far(delta, paper) else ''})"
    if v == CONSISTENT:
        return (f"{v} (ours/paper {ratio(delta, paper):.2f}{', far from the paper' if far(delta, paper) else ''}; "
                f"± {delta.half:.4f} is wider than half the paper's |Δ|, so no size)")
    if v in (LARGER, SMALLER):
        return f"{v} (the paper's value outside the interval)"
    if v == CONTRADICTS:
        return f"{v} (resolved, opposite sign)"
    if v == RULED_OUT:
        return f"unresolved; {v} (the interval excludes {paper:+.4f})"
    if v == UNINFORMATIVE:
        return f"{v}: MDE {delta.mde:.4f} > |paper| {abs(paper):.4f}"
    if v == UNDECIDED:
        return f"{v}: MDE {delta.mde:.4f} ≤ |paper| {abs(paper):.4f}, the interval holds 0 and the paper's value"
    return v


# What retuning the lr does to the same-lr delta's lead (results v3), from the same-lr and best-vs-best deltas.
SURVIVES, FADES, REVERSES, APPEARS, NO_LEAD, TOO_FEW = ("survives", "does not survive", "reverses", "appears",
                                                        "no lead", "too few seeds")


def retuned(same: Optional[Stat], best: Optional[Stat]) -> str:
    """A lead (a resolved same-lr delta) *survives* lr retuning when the best-vs-best delta is resolved with its sign,
    *does not survive* when the best-vs-best delta is unresolved (at one lr the lead may be only the other design's
    lr tolerance), and *reverses* when it is resolved with the other sign; without a lead at the same lr, one
    *appears* when the best-vs-best delta is resolved, else there is *no lead* either way."""
    if same is None or best is None or same.n < 2 or best.n < 2:
        return TOO_FEW
    if same.resolved:
        if not best.resolved:
            return FADES
        return SURVIVES if (same.mean > 0) == (best.mean > 0) else REVERSES
    return APPEARS if best.resolved else NO_LEAD


UNSETTLED = "change unresolved"  # the lead moved with retuning, but the change's own interval holds 0


def retuning_verdict(same: Optional[Stat], best: Optional[Stat], change: Optional[Stat]) -> str:
    """`retuned`, where a verdict that says retuning moved the lead (it does not survive, reverses or appears) also
    needs the change itself resolved: best-vs-best − same-lr, paired by seed. Two intervals that differ in whether
    they hold 0 do not make a resolved difference; without one the page says the change is unresolved."""
    v = retuned(same, best)
    if v in (FADES, REVERSES, APPEARS) and (change is None or change.n < 2 or not change.resolved):
        return UNSETTLED
    return v


@dataclass(frozen=True)
class Difference:
    """b − a of two means from different runs (two horizons' deltas): Welch's 95 % interval, its degrees of freedom
    from Welch–Satterthwaite (rounded down, so the interval errs wide)."""
    mean: float
    half: float

    @property
    def resolved(self) -> bool:
        return abs(self.mean) > self.half


def welch(a: Stat, b: Stat) -> Optional[Difference]:
    """b.mean − a.mean with Welch's interval; None unless both have two or more values."""
    if a.n < 2 or b.n < 2:
        return None
    va, vb = a.sd ** 2 / a.n, b.sd ** 2 / b.n
    if va + vb == 0:
        return Difference(b.mean - a.mean, 0.0)
    df = (va + vb) ** 2 / (va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1))
    return Difference(b.mean - a.mean, t975(max(1, math.floor(df))) * math.sqrt(va + vb))


# What a longer horizon does to a delta (results v4), from the shortest horizon's delta to the longest's.
HOLDS, GROWS, SHRINKS, H_FADES, H_REVERSES, H_APPEARS, H_NONE = (
    "holds", "grows", "shrinks", "fades", "reverses", "appears", "no lead at either horizon")


def over_horizon(short: Optional[Stat], long: Optional[Stat]) -> str:
    """A resolved delta at the shortest horizon *holds* at the longest when it is resolved there with its sign and
    the two differ by less than Welch's interval, *grows* or *shrinks* when they differ by more (a larger or a
    smaller |Δ|), *fades* when it is unresolved at the longest and *reverses* when it is resolved with the other
    sign; an unresolved delta at the shortest *appears* when the longest is resolved. TOO_FEW without two seeds at
    both."""
    if short is None or long is None or short.n < 2 or long.n < 2:
        return TOO_FEW
    if not short.resolved:
        return H_APPEARS if long.resolved else H_NONE
    if not long.resolved:
        return H_FADES
    if (short.mean > 0) != (long.mean > 0):
        return H_REVERSES
    d = welch(short, long)
    if not d.resolved:
        return HOLDS
    return GROWS if abs(long.mean) > abs(short.mean) else SHRINKS


def far(delta: Optional[Stat], paper: Optional[float]) -> bool:
    """The point estimate is of the opposite sign, or more than FAR times or under 1/FAR of the paper's."""
    r = ratio(delta, paper)
    return r is not None and delta.n >= 2 and (r < 0 or r > FAR or r < 1 / FAR)


def fmt(s: Optional[Stat], sign: bool = False) -> str:
    """A loss as "mean ± sd", a delta (sign=True) as "mean [lo, hi]"; one seed: the mean alone."""
    if s is None:
        return "–"
    mean = f"{s.mean:+.4f}" if sign else f"{s.mean:.4f}"
    if s.n < 2:
        return mean
    return f"{mean} [{s.lo:+.4f}, {s.hi:+.4f}]" if sign else f"{mean} ± {s.sd:.4f}"

"""Compute scaling laws per strategy, as in Figs. 6 and 7 (docs/paper.md §4.5, §4.6): L = a·C^b fitted to final
validation losses, the equal-loss compute multiplier against a reference strategy, and — for a ladder measured over
seeds — whether the two exponents differ and where the two laws cross.

C = 6·N·D / 8.64e19 PFLOP/s-days, with D the tokens seen at the final evaluation and N the parameters without the
input embedding — for MoE all of them, not the activated ones (docs/paper.md §3.6: the paper's compute axis). Each
strategy's N is its own (results v4): unified's scale vectors add a few percent at the proxy's widths, and a law
that gave them the baseline's N would credit unified with compute it did not spend.

The multiplier at loss L is C_ref(L) / C_new(L), with C(L) = (L/a)^(1/b) from each fit: how much more compute the
reference strategy needs to reach the loss the other reaches. Two laws with equal exponents have one multiplier,
(a_ref/a_new)^(1/b) (the paper's 1.22×: (2.6165/2.5880)^(1/0.0547), docs/paper.md §4.5); with different exponents it
changes along the compute axis, and it is 1 where the two laws cross.

Every multiplier and crossing the page prints carries a bootstrap interval over seeds (results v3): resample
each rung's seeds with replacement (the two strategies' runs of a seed stay paired), refit both laws to the
resampled seed means, and take the 2.5 and 97.5 percentiles over BOOTSTRAP_RESAMPLES resamples from a fixed RNG
seed. The fits are closed-form least squares, so 2,000 resamples take milliseconds. With 4 seeds a percentile
bootstrap is narrower than a t interval would be (it resamples the seeds it has): the page prints both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from repro.stats import Stat, stat

PFLOPS_DAY = 8.64e19  # FLOPs in one PFLOP/s-day
BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED = 2000, 0


@dataclass(frozen=True)
class PowerLaw:
    """L = a·C^b (b < 0 for a loss that falls with compute)."""

    a: float
    b: float

    def loss(self, compute: float) -> float:
        return self.a * compute ** self.b

    def compute(self, loss: float) -> float:
        return (loss / self.a) ** (1.0 / self.b)


def fit_power_law(compute: list[float], loss: list[float]) -> PowerLaw:
    """Least squares on log L = log a + b·log C; needs two distinct compute values."""
    if len(set(compute)) < 2:
        raise ValueError(f"a power law needs at least two compute values, got {sorted(set(compute))}")
    b, log_a = np.polyfit(np.log(compute), np.log(loss), 1)
    return PowerLaw(float(math.exp(log_a)), float(b))


def compute_multiplier(reference: PowerLaw, other: PowerLaw, losses: list[float]) -> list[float]:
    """C_ref(L) / C_other(L) at each loss."""
    return [reference.compute(L) / other.compute(L) for L in losses]


def log_multiplier_at(reference: PowerLaw, other: PowerLaw, compute: float) -> float:
    """log of the equal-loss multiplier at the loss L_ref(C) the reference's law gives at C = `compute`:
    log C − log C_other(L_ref(C)) = log C − (log a_r + b_r·log C − log a_o) / b_o, in logs so that a law with b near
    0 (a loss that barely moves with compute) gives a large number, not an overflow."""
    log_c = math.log(compute)
    return log_c - (math.log(reference.a) + reference.b * log_c - math.log(other.a)) / other.b


def times_text(log_m: float) -> str:
    """A multiplier from its log: "1.22×", or beyond 10⁴ either way, its order of magnitude."""
    if abs(log_m) > math.log(1e4):
        return f"{'>' if log_m > 0 else '<'} 1e{'+' if log_m > 0 else '-'}4×"
    return f"{math.exp(log_m):.2f}×"


def crossing(reference: PowerLaw, other: PowerLaw) -> Optional[float]:
    """The compute at which the two laws give the same loss: a_r·C^b_r = a_o·C^b_o, so
    log C = (log a_o − log a_r) / (b_r − b_o); None for parallel laws (equal exponents)."""
    if reference.b == other.b:
        return None
    log_c = (math.log(other.a) - math.log(reference.a)) / (reference.b - other.b)
    return math.exp(log_c) if abs(log_c) < 700 else math.inf if log_c > 0 else 0.0  # nearly parallel: far away


def pflops_days(n_params: int, tokens: float) -> float:
    return 6.0 * n_params * tokens / PFLOPS_DAY


@dataclass
class LawReport:
    fits: dict[str, PowerLaw]
    multipliers: dict[str, list[float]]  # strategy → at each reference loss

    def geometric_mean(self, strategy: str) -> float:
        m = self.multipliers[strategy]
        return math.exp(sum(map(math.log, m)) / len(m))


def analyze(points: dict[str, list[tuple[float, float]]], reference: str) -> LawReport:
    """A law per strategy from (C, loss) points, and each one's multiplier at the reference's own losses."""
    if reference not in points:
        raise ValueError(f"no runs of the reference strategy {reference!r}; strategies found: {sorted(points)} "
                         "(choose one with --reference)")
    fits = {name: fit_power_law([c for c, _ in pts], [L for _, L in pts]) for name, pts in points.items()}
    ref_losses = [L for _, L in sorted(points[reference])]
    multipliers = {name: compute_multiplier(fits[reference], fit, ref_losses)
                   for name, fit in fits.items() if name != reference}
    return LawReport(fits, multipliers)


def points_from_runs(runs: list, warn=None) -> dict[str, list[tuple[float, float]]]:
    """(C, final val loss) per strategy (the preset a run's strategy matches, or "custom") from loaded runs."""
    from repro.proxy import compute_params
    points: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        if run.final_eval is None:
            raise ValueError(f"{run.path} has no evaluation in metrics.jsonl yet")
        if not 0 < (run.final_val_loss or math.nan) < math.inf:  # train.py logs a non-finite loss as null
            raise ValueError(f"{run.path}: its last val_loss is {run.final_val_loss} (the run diverged?); leave it out "
                             "of the fit")
        if not run.finished and warn:
            warn(f"warning: {run.path} stopped at step {run.final_eval['step']} of {run.cfg.train.steps}; "
                 "using its last evaluation")
        c = pflops_days(compute_params(run.cfg), run.final_tokens)
        points.setdefault(run.strategy, []).append((c, run.final_val_loss))
    return points


# --------------------------------------------------------------------------------------- a ladder over seeds

@dataclass(frozen=True)
class Rung:
    """One model size of a ladder: its compute and every strategy's final loss per seed. A strategy with more
    parameters at the same size (unified's scale vectors) has its own compute in `computes`; the rung's `compute`
    is the reference strategy's, where its multiplier is read."""
    compute: float
    losses: dict[str, dict[int, float]]  # strategy → seed → final val loss
    computes: dict[str, float] = field(default_factory=dict)  # strategy → its own C, where it differs

    def c(self, strategy: str) -> float:
        return self.computes.get(strategy, self.compute)


def _fits(points: dict[str, list[tuple[float, float]]]) -> Optional[dict[str, PowerLaw]]:
    if any(len({c for c, _ in pts}) < 2 for pts in points.values()):
        return None
    return {k: fit_power_law([c for c, _ in pts], [L for _, L in pts]) for k, pts in points.items()}


@dataclass(frozen=True)
class LadderLaw:
    """Two strategies' laws over a ladder, as the data has them (docs/paper.md §4.5: the paper's laws are parallel)."""
    reference: str
    other: str
    compute: tuple[float, ...]  # C of each rung, smallest first
    fits: dict[str, PowerLaw]  # fitted to the seed means
    log_multipliers: tuple[float, ...]  # at each rung, from the seed-mean laws
    seed_multipliers: tuple[Optional[Stat], ...]  # at each rung: log multiplier over the seeds' own laws
    exponent_diff: Optional[Stat]  # b_other − b_reference of the seeds' own laws, paired by seed
    mean_multiplier: Optional[Stat]  # log of the geometric mean over rungs, over the seeds' own laws
    boot: Optional["LawBootstrap"] = None  # the percentile intervals over resampled seeds

    @property
    def falling(self) -> bool:
        """Both seed-mean laws lose loss with compute (b < 0): only then is a compute multiplier meaningful."""
        return all(f.b < 0 for f in self.fits.values())

    @property
    def parallel(self) -> Optional[bool]:
        """The exponents' difference has a 95 % interval that holds 0 (None: fewer than two seeds' laws)."""
        if self.exponent_diff is None or self.exponent_diff.n < 2:
            return None
        return self.exponent_diff.contains(0.0)

    @property
    def crossing(self) -> Optional[float]:
        return crossing(self.fits[self.reference], self.fits[self.other])

    @property
    def crossing_place(self) -> Optional[str]:
        """Where the laws cross against the measured compute: "below", "inside" or "above" (None: parallel)."""
        c = self.crossing
        if c is None:
            return None
        return "below" if c < min(self.compute) else "above" if c > max(self.compute) else "inside"

    @property
    def resolved(self) -> bool:
        """The ladder's multiplier (the geometric mean over the rungs, over the seeds' own laws) has a 95 % interval
        that excludes 1. Parallel laws alone are not enough for a headline: with few seeds the exponents'
        interval is wide enough to hold 0 whatever the laws do, and then so is the multiplier's."""
        return self.mean_multiplier is not None and self.mean_multiplier.n >= 2 and self.mean_multiplier.resolved

    @property
    def log_headline(self) -> Optional[float]:
        """One multiplier for the whole ladder (the log of the geometric mean over the rungs), only for parallel
        laws that fall with compute and a multiplier whose interval excludes 1."""
        if not (self.parallel and self.falling and self.resolved):
            return None
        return self.log_mean

    @property
    def log_mean(self) -> float:
        """The log of the geometric mean of the seed-mean laws' multipliers over the rungs."""
        return sum(self.log_multipliers) / len(self.log_multipliers)


# A law L = a·C^b has 2 parameters: through 2 rungs it is a line through two points, with nothing left to test it.
# 3 rungs leave 1 residual degree of freedom per law (results v4, item 6).
MIN_RUNGS = 3


def ladder_law(rungs: list[Rung], reference: str, other: str) -> Optional[LadderLaw]:
    """The laws of the seed means and of each seed's own losses (None: fewer than MIN_RUNGS rungs with both)."""
    rungs = sorted((r for r in rungs if r.losses.get(reference) and r.losses.get(other)),
                   key=lambda r: r.c(reference))
    if len(rungs) < MIN_RUNGS:
        return None
    means = {k: [(r.c(k), sum(r.losses[k].values()) / len(r.losses[k])) for r in rungs] for k in (reference, other)}
    fits = _fits(means)
    if fits is None:
        return None
    compute = tuple(r.c(reference) for r in rungs)
    seeds = sorted(set.intersection(*(set(r.losses[k]) for r in rungs for k in (reference, other))))
    per_seed = [f for f in (_fits({k: [(r.c(k), r.losses[k][s]) for r in rungs] for k in (reference, other)})
                            for s in seeds) if f is not None]
    logs = [[log_multiplier_at(f[reference], f[other], c) for c in compute] for f in per_seed]
    return LadderLaw(
        reference, other, compute, fits,
        tuple(log_multiplier_at(fits[reference], fits[other], c) for c in compute),
        tuple(stat([row[i] for row in logs]) for i in range(len(compute))),
        stat([f[other].b - f[reference].b for f in per_seed]),
        stat([sum(row) / len(row) for row in logs]),
        bootstrap_law(rungs, reference, other))


@dataclass(frozen=True)
class LawBootstrap:
    """2.5 and 97.5 percentiles over resampled seeds: (lo, hi) of each log quantity."""
    resamples: int
    log_multipliers: tuple[tuple[float, float], ...]  # at each rung
    log_mean: tuple[float, float]  # the geometric mean over the rungs
    log_crossing: tuple[float, float]  # log of the crossing's compute over the largest rung's (±inf: parallel)
    exponent_diff: tuple[float, float]  # b_other − b_reference


def _slopes(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares (log a, b) of y = log a + b·x for each row of y (resamples × rungs)."""
    xc = x - x.mean()
    b = (y - y.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
    return y.mean(axis=1) - b * x.mean(), b


def bootstrap_law(rungs: list[Rung], reference: str, other: str, resamples: int = BOOTSTRAP_RESAMPLES,
                  seed: int = BOOTSTRAP_SEED) -> Optional[LawBootstrap]:
    """The percentile intervals of the laws' multipliers, crossing and exponents' difference over seeds resampled
    with replacement per rung, paired across the two strategies (None: a rung with fewer than two paired seeds)."""
    rng = np.random.default_rng(seed)
    x, x_other = (np.log([r.c(k) for r in rungs]) for k in (reference, other))
    means = {reference: [], other: []}
    for r in rungs:
        seeds = sorted(set(r.losses[reference]) & set(r.losses[other]))
        if len(seeds) < 2:
            return None
        pick = rng.integers(0, len(seeds), size=(resamples, len(seeds)))
        for k in means:
            means[k].append(np.array([r.losses[k][s] for s in seeds])[pick].mean(axis=1))
    (la_r, b_r), (la_o, b_o) = (_slopes(xk, np.log(np.stack(means[k], axis=1)))
                                for xk, k in ((x, reference), (x_other, other)))
    logm = x[None, :] - (la_r[:, None] + b_r[:, None] * x[None, :] - la_o[:, None]) / b_o[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(b_r != b_o, (la_o - la_r) / (b_r - b_o), np.inf) - x.max()

    def pct(v: np.ndarray) -> tuple[float, float]:
        with np.errstate(invalid="ignore"):  # parallel resamples cross at ±inf: inf − inf between two of them
            lo, hi = np.percentile(v, [2.5, 97.5])
        return float(lo), float(hi)
    return LawBootstrap(resamples, tuple(pct(logm[:, i]) for i in range(len(x))), pct(logm.mean(axis=1)),
                        pct(cross), pct(b_o - b_r))


def times_interval(lo_hi: tuple[float, float], text=None) -> str:
    """A bootstrap interval of a multiplier from its logs: "[lo×, hi×]", each end by `text` (default times_text)."""
    text = text or times_text
    return f"[{text(lo_hi[0])}, {text(lo_hi[1])}]"


def ratio_text(log_r: float) -> str:
    """A ratio of computes from its log, to three significant figures ("0.00125×", "11.1×"), capped as times_text."""
    return times_text(log_r) if abs(log_r) > math.log(1e4) else f"{math.exp(log_r):.3g}×"


def times(log_stat: Optional[Stat]) -> str:
    """A multiplier's interval from its logs: "[lo×, hi×]" (– for fewer than two seeds)."""
    if log_stat is None or log_stat.n < 2:
        return "–"
    return f"[{times_text(log_stat.lo)}, {times_text(log_stat.hi)}]"


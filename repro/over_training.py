"""The page's readings over training, from each run's eval records (issue 52, items 7.5 and 7.6): WikiText-2 at its
minimum and at one pass beside its value at the end, and the lead inside the longest horizon's runs.

WikiText-2 is an eval-only set from another corpus. A run's WikiText-2 loss falls, is lowest before one pass over
the training data, then rises while the validation loss still falls. From then on it says how far the model drifts
toward its training corpus, not how well it models English at large, so its value at the end is not the only one worth
reading. Passes at an eval are the `epoch` of the train record nearest its step (runs.Run.passes at the end).
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Optional

from repro.measure import Results, Row
from repro.sources import eval_read
from repro.stats import Stat, fmt, stat
from runs import Run

BAND = (0.10, 0.30)  # the audit's reading of where WikiText-2 is lowest, in shares of training: checked, not assumed
FRACTIONS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0)  # where the lead-over-training table reads a row


@dataclass(frozen=True)
class Point:
    """One evaluation of a run: its step, its share of the run's steps, the passes made by then, a metric's value."""
    step: int
    share: float
    passes: Optional[float]
    value: float


def points(run: Run, metric: str) -> list[Point]:
    """Every evaluation after step 0 that has `metric` (the loss at init differs by design)."""
    trains = [(r["step"], r["epoch"]) for r in run.records if r.get("kind") == "train" and r.get("epoch") is not None]
    steps = [s for s, _ in trains]

    def passes(step: int) -> Optional[float]:
        if not trains:
            return None
        i = bisect.bisect_left(steps, step)
        near = [j for j in (i - 1, i) if 0 <= j < len(trains)]
        return trains[min(near, key=lambda j: abs(steps[j] - step))][1]
    total = run.cfg.train.steps
    return [Point(e["step"], e["step"] / total, passes(e["step"]), e[metric]) for e in run.evals
            if e["step"] > 0 and e.get(metric) is not None]


def lowest(run: Run, metric: str) -> Optional[Point]:
    pts = points(run, metric)
    return min(pts, key=lambda p: p.value) if pts else None


def near_one_pass(run: Run, metric: str) -> Optional[Point]:
    """The evaluation nearest one pass over the training data; None for a run that ends before one pass."""
    pts = [p for p in points(run, metric) if p.passes is not None]
    if run.passes is None or run.passes < 1 or not pts:
        return None
    return min(pts, key=lambda p: abs(p.passes - 1))


@dataclass(frozen=True)
class WikiCourse:
    """A row's WikiText-2 delta at the end, at each run's own minimum and at one pass, paired by seed; where the
    minima fall (shares of training and passes, over both curves' runs); the fewest passes any run ends at."""
    end: Optional[Stat]
    at_min: Optional[Stat]
    shares: tuple[float, float]
    passes: tuple[float, float]
    one_pass: Optional[Stat]  # None: a run ends before one pass
    end_passes: Optional[float]


def wiki_course(res: Results, row: Row) -> Optional[WikiCourse]:
    ours, ref = res.runs_of(row.comparison, row.ours), res.runs_of(row.comparison, row.ref)
    seeds = [s for s in sorted(set(ours) & set(ref))
             if lowest(ours[s], res.wiki) is not None and lowest(ref[s], res.wiki) is not None]
    if not seeds:
        return None
    lows = [(lowest(ours[s], res.wiki), lowest(ref[s], res.wiki)) for s in seeds]
    both = [p for pair in lows for p in pair]
    ones = [(near_one_pass(ours[s], res.wiki), near_one_pass(ref[s], res.wiki)) for s in seeds]
    one = stat([a.value - b.value for a, b in ones]) if all(a and b for a, b in ones) else None
    ends = [r.passes for s in seeds for r in (ours[s], ref[s]) if r.passes is not None]
    passes = [p.passes for p in both if p.passes is not None]
    return WikiCourse(row.wiki, stat([a.value - b.value for a, b in lows]), (min(p.share for p in both),
                      max(p.share for p in both)), (min(passes), max(passes)) if passes else (0.0, 0.0), one,
                      min(ends) if ends else None)


def span(lo: float, hi: float, spec: str, unit: str = "") -> str:
    a, b = format(lo, spec), format(hi, spec)
    return f"{a}{unit}" if a == b else f"{a}–{b}{unit}"


def wiki_cells(course: Optional[WikiCourse]) -> str:
    """The table cells: at the end, at each run's minimum, where the minima fall, at one pass."""
    if course is None:
        return "– | – | – | –"
    where = (f"{span(100 * course.shares[0], 100 * course.shares[1], '.0f', ' %')} of training, "
             f"{span(*course.passes, '.2f')} passes")
    one = (fmt(course.one_pass, True) if course.one_pass is not None else
           f"ends at {course.end_passes:.2f} passes" if course.end_passes is not None else "–")
    return f"{fmt(course.end, True)} | {fmt(course.at_min, True)} | {where} | {one}"


@dataclass(frozen=True)
class WikiShape:
    """Over every distinct curve's seed-mean WikiText-2 curve: where it is lowest and what it does after."""
    curves: int
    shares: list[float]  # each curve's lowest eval, as a share of training
    passes: list[float]  # the passes made by then
    rises: int  # curves whose WikiText-2 ends above its minimum while their val loss ends below its value there
    sources: tuple[str, ...]


def wiki_shape(res: Results) -> Optional[WikiShape]:
    seen, shares, passes, rises, sources = set(), [], [], 0, ()
    for comp in res.plan.comparisons:
        for curve in comp.curves:
            runs = list(res.runs_of(comp, curve).values())
            key = frozenset(r.path for r in runs)
            if not runs or key in seen:
                continue
            seen.add(key)
            wiki, val = mean_curve(runs, res.wiki), mean_curve(runs, "val_loss")
            if not wiki:
                continue
            low = min(wiki, key=lambda p: p.value)
            shares.append(low.share)
            if low.passes is not None:
                passes.append(low.passes)
            at = {p.step: p.value for p in val}
            rises += wiki[-1].value > low.value and val[-1].value < at.get(low.step, float("-inf"))
            sources = sources or tuple(n for n, _ in eval_read(runs[0]).shares)
    if not shares:
        return None
    return WikiShape(len(shares), shares, passes, rises, sources)


def mean_curve(runs: list[Run], metric: str) -> list[Point]:
    """The seed mean of `metric` at each evaluation every run has (the passes of the first run's)."""
    per_run = [{p.step: p for p in points(r, metric)} for r in runs]
    steps = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    return [Point(s, per_run[0][s].share, per_run[0][s].passes, statistics.mean(p[s].value for p in per_run))
            for s in steps]


def wiki_methods(res: Results) -> list[str]:
    """The methods paragraph on WikiText-2 over training, every number from the runs."""
    shape = wiki_shape(res)
    if shape is None:
        return []
    n, s = shape.curves, shape.shares
    inside = sum(round(100 * BAND[0]) <= round(100 * x) <= round(100 * BAND[1]) for x in s)  # whole %, as printed
    before = sum(p < 1 for p in shape.passes)
    corpus = (f"the training corpus of {len(shape.sources)} sources ({', '.join(shape.sources)})" if shape.sources
              else "the training corpus")
    return [f"**WikiText-2 over training.** Each curve's seed-mean WikiText-2 loss is lowest early. Over the {n} "
            f"curves read here its minimum falls at {span(100 * min(s), 100 * max(s), '.0f', ' %')} of training, "
            f"median {100 * statistics.median(s):.0f} %; {inside} of {n} at {100 * BAND[0]:.0f}–{100 * BAND[1]:.0f} %. "
            + (f"It falls at {span(min(shape.passes), max(shape.passes), '.2f')} passes over the training data: "
               f"before one pass in {before} of {len(shape.passes)}. " if shape.passes else "")
            + f"After it, WikiText-2 rises while the validation loss falls, in {shape.rises} of {n} curves. "
            f"Past one pass every training token has been seen, and WikiText-2 measures drift toward {corpus}. "
            "So the first screen gives WikiText-2 at each run's minimum and at one pass, beside its value at the end."]


# ------------------------------------------------------------------------------------------- the lead over training

def lead_over_training(res: Results, row: Row) -> list[tuple[float, Stat]]:
    """The row's delta at each evaluation every seed has, paired by seed, with its share of the row's training."""
    band = res.delta_band(row)
    if not band.tokens:
        return []
    last = band.tokens[-1]
    return [(x / last, s) for x, s in zip(band.tokens, band.stats)]


def peak(course: list[tuple[float, Stat]]) -> tuple[float, Stat]:
    """Where the delta is farthest from 0 on the side it ends on: the largest lead of the design ahead at the end."""
    sign = -1 if course[-1][1].mean < 0 else 1
    return max(course, key=lambda c: sign * c[1].mean)


def lead_table(res: Results, named: list[tuple[str, Row]]) -> list[str]:
    """A row per named row: its delta at FRACTIONS of training (the nearest evaluation) and where it peaks."""
    courses = [(name, c) for name, row in named if (c := lead_over_training(res, row))]
    if not courses:
        return []
    out = ["| rung | " + " | ".join(f"{100 * f:.0f} %" for f in FRACTIONS) + " | largest lead (where) |",
           "|---" * (len(FRACTIONS) + 2) + "|"]
    for name, c in courses:
        cells = [fmt(min(c, key=lambda p: abs(p[0] - f))[1], True) for f in FRACTIONS]
        at, s = peak(c)
        out.append(f"| {name} | " + " | ".join(cells) + f" | {fmt(s, True)} ({100 * at:.0f} %) |")
    return out


def lead_sentence(res: Results, where: str, row: Row) -> str:
    """Where the lead inside a row's runs is largest, against its value at the end; `where` names the runs."""
    c = lead_over_training(res, row)
    if not c:
        return ""
    at, s = peak(c)
    end = c[-1][1]
    if at == c[-1][0]:
        return f"Inside its runs {where} the lead is largest at the end, {fmt(end, True)}."
    return (f"Inside its runs {where} the lead is largest at {100 * at:.0f} % of training, {fmt(s, True)}. At the "
            f"end it is {fmt(end, True)}.")

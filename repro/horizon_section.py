"""The results page's section on the horizon (results v4, item 1): the headline comparisons at 1, 3 and 10 × the proxy's
tokens (repro/comparisons.py, HORIZONS), each rung an lr grid. Each family gets a table of its rungs, the verdict of
the longest against the shortest (repro/stats.py, over_horizon), each step's change and a plot of Δ against tokens per
compute parameter."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from repro.comparisons import Comparison
from repro.measure import Results, Row
from repro.over_training import lead_table
from repro.plotting import plot_horizon
from repro.proxy import compute_params
from repro.stats import (GROWS, H_APPEARS, H_FADES, H_NONE, H_REVERSES, HOLDS, SHRINKS, TOO_FEW, Difference, Stat,
                         fmt, over_horizon, verdict_class, welch)


@dataclass(frozen=True)
class HorizonPoint:
    """One horizon rung as the page reads it: its tokens per compute parameter (the baseline's runs), its same-lr
    row and its row with each design at its best lr (None until every lr of both designs has a seed)."""
    comp: Comparison
    tokens_per_param: float
    same: Row
    best: Optional[Row]


def horizon_families(res: Results) -> dict[str, list[Comparison]]:
    """The plan's horizon rungs by family ("fig6-horizon"), shortest first."""
    out: dict[str, list[Comparison]] = {}
    for comp in res.plan.comparisons:
        if comp.horizon is not None:
            out.setdefault(comp.key.rsplit("_x", 1)[0], []).append(comp)
    return {k: sorted(v, key=lambda c: c.horizon) for k, v in out.items()}


def horizon_points(res: Results, comps: list[Comparison]) -> list[HorizonPoint]:
    """The rungs of a family that have rows (every curve run), shortest first."""
    out = []
    for comp in comps:
        rows = res.rows_of(comp)
        if not rows:
            continue
        base = next(iter(res.runs_of(comp, rows[0].ref).values()))
        out.append(HorizonPoint(comp, base.final_tokens / compute_params(base.cfg), rows[0],
                                rows[1] if len(rows) == 2 else None))
    return out


def best_read(points: list[HorizonPoint]) -> list[HorizonPoint]:
    """The rungs read with each design at its best lr."""
    return [p for p in points if p.best is not None and p.best.delta is not None]


def families_read(res: Results) -> list[list[HorizonPoint]]:
    """Each horizon family's rungs read with each design at its best lr, shortest first (a family with none is left
    out): the last is the family's headline."""
    return [pts for comps in horizon_families(res).values() if (pts := best_read(horizon_points(res, comps)))]


HORIZON_WORDS = {HOLDS: "holds", GROWS: "grows", SHRINKS: "shrinks (still resolved)", H_FADES: "fades",
                 H_REVERSES: "reverses", H_APPEARS: "appears only at the longer horizon",
                 H_NONE: "is resolved at neither horizon", TOO_FEW: "cannot be read (too few seeds)"}


def from_to(points: list[HorizonPoint]) -> tuple[list[HorizonPoint], str]:
    """The rungs read with each design at its best lr, and "From 10.5 to 105 tokens per compute parameter" over
    them ("" with fewer than two)."""
    pts = best_read(points)
    if len(pts) < 2:
        return pts, ""
    return pts, f"From {pts[0].tokens_per_param:.3g} to {pts[-1].tokens_per_param:.3g} tokens per compute parameter"


def horizon_trend(points: list[HorizonPoint]) -> Optional[str]:
    """In words: what the longest horizon does to the shortest's best-vs-best delta (repro/stats.py, over_horizon),
    with both deltas and their Welch difference; then, over three or more rungs, each step's change (a path that
    moves both ways, each step resolved, is not a trend the ends can summarize); then the same on WikiText-2. None
    with fewer than two rungs read."""
    pts, span = from_to(points)
    if not span:
        return None
    first, last = pts[0].best, pts[-1].best
    out = [f"{span}, each design at its best lr, unified − baseline goes from "
           f"{change_text(first.delta, last.delta)}."]
    steps = path_steps(pts)
    if len(pts) >= 3 and steps:
        out.append("Rung by rung (Welch, 95 %): " + ", ".join(
            f"×{a.comp.horizon} to ×{b.comp.horizon} {d.mean:+.4f} ± {d.half:.4f}" for a, b, d in steps) + ".")
        if both_ways(steps):
            out[-1] = out[-1][:-1] + (": the path moves both ways, each way resolved, so its ends alone do not give "
                                      "its shape.")
    if first.wiki is not None and last.wiki is not None:
        out.append(f"On WikiText-2 it goes from {change_text(first.wiki, last.wiki)}.")
    return " ".join(out)


def horizon_brief(points: list[HorizonPoint]) -> Optional[str]:
    """horizon_trend for the first screen, in short sentences: the verdict from the shortest horizon to the longest
    with both means, whether the path moves both ways, the same on WikiText-2 (the horizon section has the
    intervals). None with fewer than two rungs read."""
    pts, span = from_to(points)
    if not span:
        return None
    a, b = pts[0].best, pts[-1].best
    out = [f"{span}, **{verdict_words(a.delta, b.delta)}** ({a.delta.mean:+.4f} to {b.delta.mean:+.4f})."]
    if len(pts) >= 3 and both_ways(path_steps(pts)):
        out.append("Its path moves both ways, each step resolved.")
    if a.wiki is not None and b.wiki is not None:
        out.append(f"On WikiText-2 **{verdict_words(a.wiki, b.wiki)}** ({a.wiki.mean:+.4f} to {b.wiki.mean:+.4f}).")
    return " ".join(out)


def path_steps(pts: list[HorizonPoint]) -> list[tuple[HorizonPoint, HorizonPoint, Difference]]:
    """Each step from one rung read to the next: its Welch difference of the best-vs-best deltas."""
    steps = [(a, b, welch(a.best.delta, b.best.delta)) for a, b in zip(pts, pts[1:])]
    return [(a, b, d) for a, b, d in steps if d is not None]


def both_ways(steps: list[tuple[HorizonPoint, HorizonPoint, Difference]]) -> bool:
    """Whether resolved steps move the delta both up and down."""
    return len({d.mean > 0 for _, _, d in steps if d.resolved}) == 2


def verdict_words(a: Stat, b: Stat) -> str:
    """"the verdict holds": over_horizon's verdict, with the design ahead where one appears."""
    verdict = over_horizon(a, b)
    leader = f", {'unified' if b.mean < 0 else 'baseline'} ahead" if verdict == H_APPEARS else ""  # which way it came
    return f"the verdict {HORIZON_WORDS[verdict]}{leader}"


def change_text(a: Stat, b: Stat) -> str:
    """A delta at the shortest and the longest horizon, their Welch difference and the verdict (over_horizon)."""
    d = welch(a, b) if a.n >= 2 and b.n >= 2 else None
    diff = f"; the change {d.mean:+.4f} ± {d.half:.4f} (Welch, 95 %)" if d else ""
    return f"{fmt(a, True)} to {fmt(b, True)}{diff}: **{verdict_words(a, b)}**"


def horizon_section(res: Results, img_dir: Path) -> list[str]:
    """Each horizon family: unified − baseline at every horizon (same lr and each at its best), its verdict, the
    WikiText-2 delta, the trend in words and the plot of Δ against tokens per compute parameter."""
    out = []
    for key, comps in horizon_families(res).items():
        name = comps[0].title.split(" at ")[0]
        out += [f"### {name}: unified − baseline against tokens per compute parameter", ""]
        points = horizon_points(res, comps)
        sames = sorted({c.grid.same for c in comps}, key=float)  # one lr, or each rung's (a grid without the paper's)
        same_name = f"same lr ({sames[0]})" if len(sames) == 1 else "same lr (each rung's)"
        if points:
            out += ["| × the proxy's tokens | tokens per compute parameter | seeds | best lr (baseline, unified) | "
                    "each at its best lr [95 % CI] | verdict | same lr [95 % CI] | WikiText-2, each at its best |",
                    "|---" * 8 + "|"]
        for p in points:
            g, best = p.comp.grid, p.best
            lrs = (f"{res.best_lr(p.comp, g.reference)}, {res.best_lr(p.comp, g.ours)}" if best else "–")
            out.append(f"| {p.comp.horizon} | {p.tokens_per_param:.1f} | {best.delta.n if best else p.same.delta.n} | "
                       f"{lrs} | {fmt(best.delta, True) if best else '–'} | "
                       f"{verdict_class(best.delta, best.paper) if best else '–'} | {fmt(p.same.delta, True)}"
                       f"{'' if len(sames) == 1 else f' at {g.same}'} | "
                       f"{fmt(best.wiki, True) if best else '–'} |")
        waiting = [c for c in comps if res.missing(c)]
        out.append("")
        if waiting:
            out += ["Not run yet: " + "; ".join(f"{c.horizon} × ({len(res.missing(c))} of {len(c.curves)} curves "
                                                "without a finished run)" for c in waiting)
                    + f". `python -m repro.results --only {' '.join(c.key for c in waiting)}` trains them.", ""]
        trend = horizon_trend(points)
        if trend:
            out += [trend, ""]
        if points:
            paper = points[0].same.paper
            series = {"each at its best lr": [(p.tokens_per_param, p.best.delta) for p in points if p.best],
                      same_name: [(p.tokens_per_param, p.same.delta) for p in points]}
            plot_horizon(series, paper, f"{name}: unified − baseline", img_dir / f"{key}.png")
            out += [f"![{name}](img/{img_dir.name}/{key}.png)", ""]
    return out + lead_inside(res)


def lead_inside(res: Results) -> list[str]:
    """The lead inside each family's longest runs, each design at its best lr: at a few shares of training, from the
    runs' eval records, and where it is largest. A lead read only at the end can hide one that peaked and faded."""
    named = [(f"{p.comp.title.split(' at ')[0].removeprefix('The horizon, ')} at {p.tokens_per_param:.3g}", p.best)
             for p in (pts[-1] for pts in families_read(res))]
    table = lead_table(res, named)
    if not table:
        return []
    return ["### The lead inside the longest runs", "",
            "Unified − baseline, each at its best lr, at the evaluation nearest each share of training (paired by "
            "seed, 95 % interval), and where the lead of the design ahead at the end is largest:", "", *table, ""]

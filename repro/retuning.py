"""What retuning the lr does to a lead, as the results page says it: an lr grid's ours − reference at the same lr
beside each design at its best lr, and the change between them, paired by seed (issue 52, item 7.2).

A lead "does not survive lr retuning" only where that change is resolved: two intervals that differ in whether they
hold 0 are not a resolved difference. Where the change's interval holds 0 the page gives it and says so plainly.
"""
from __future__ import annotations

from typing import Optional

from repro.comparisons import Comparison, LrGrid
from repro.measure import Results
from repro.stats import (APPEARS, FADES, NO_LEAD, REVERSES, SURVIVES, TOO_FEW, UNSETTLED, Stat, fmt, retuned,
                         retuning_verdict, stat)


def retuning_change(res: Results, comp: Comparison) -> Optional[Stat]:
    """An lr grid's best-vs-best delta minus its same-lr delta, per seed where all four runs have finished (None
    without both rows)."""
    rows = res.rows_of(comp)
    if len(rows) < 2:
        return None
    same, best = rows
    so, sr, bo, br = (res.finals(comp, c) for c in (same.ours, same.ref, best.ours, best.ref))
    seeds = sorted(set(so) & set(sr) & set(bo) & set(br))
    return stat([(bo[s] - br[s]) - (so[s] - sr[s]) for s in seeds])


def shared_best(res: Results, comp: Comparison) -> bool:
    """Whether both designs of an lr grid are best at its same lr: then best against best is the same-lr row itself,
    and nothing was retuned."""
    g = comp.grid
    return res.best_lr(comp, g.ours) == res.best_lr(comp, g.reference) == g.same


def lead_at_shared_best(g: LrGrid, same: Optional[Stat], say_lr: bool = True) -> str:
    """What the grid says when both designs are best at its same lr: retuning moved neither design, so the same-lr
    delta is the best-vs-best one and no claim about retuning follows (a lead "survives" only a retuning that ran).
    `say_lr` names that lr, for a sentence that has not."""
    if same is None or same.n < 2:
        return "with fewer than two seeds paired there is no interval"
    lead = g.ours if same.mean < 0 else g.reference
    said = f"{lead} leads, resolved" if same.resolved else "unresolved"
    return said + (f"; both designs are best at {g.same}" if say_lr else "") + ": **retuning moved neither design**"


def grid_edge(res: Results, comp: Comparison) -> str:
    """A sentence (with its leading space) naming each design whose best lr is the grid's smallest or largest: its
    optimum may lie outside the grid, so its "best" is only the grid's best; "" when every best is inside."""
    lrs = sorted(res.ran_lrs(comp), key=float)
    ends = {lrs[0]: "smallest", lrs[-1]: "largest"}
    at = [(d, lr) for d in (comp.grid.ours, comp.grid.reference) if (lr := res.best_lr(comp, d)) in ends]
    if not at:
        return ""
    if len(at) == 2 and at[0][1] == at[1][1]:
        said = f"Both designs' best lr is the grid's {ends[at[0][1]]} ({at[0][1]})"
    else:
        said = "; ".join(f"{'The' if i == 0 else 'the'} best lr of {d} is the grid's {ends[lr]} ({lr})"
                         for i, (d, lr) in enumerate(at))
    return f" {said}: an optimum may lie beyond the grid, so *best* is the grid's best; a wider grid would tell."


def lead_after_retuning(g: LrGrid, same: Optional[Stat], best: Optional[Stat], change: Optional[Stat]) -> str:
    """What lr retuning does to the same-lr lead, in words (lower loss leads); `change` is retuning_change's."""
    v = retuning_verdict(same, best, change)
    if v == TOO_FEW:
        return "with fewer than two seeds paired there is no interval, **too few seeds to say whether a lead survives"\
               " lr retuning**"
    lead = lambda s: g.ours if s.mean < 0 else g.reference  # noqa: E731
    trail = lambda s: g.reference if s.mean < 0 else g.ours  # noqa: E731
    moved = {FADES: f"{lead(same)} leads at the same lr, resolved, and is unresolved with each at its best lr",
             REVERSES: f"{lead(same)} leads at the same lr and {lead(best)} with each at its best, both resolved",
             APPEARS: f"unresolved at the same lr, {lead(best)} leads with each at its best lr"}
    if v == UNSETTLED:
        by = (f"retuning changes it by {fmt(change, True)}" if change is not None and change.n >= 2
              else "the change has fewer than two seeds paired, so no interval")
        return f"{moved[retuned(same, best)]}; {by}: **unresolved**"
    by = f"; retuning changes it by {fmt(change, True)}, resolved" if change is not None else ""
    return {SURVIVES: f"{lead(same)} leads, resolved, at the same lr and with each at its best: **the lead survives lr "
                      "retuning**",
            FADES: f"{moved[FADES]}{by}: **the lead does not survive lr retuning** (a lead at one lr can be only "
                   f"{trail(same)}'s lr tolerance)",
            REVERSES: f"{moved[REVERSES]}{by}: **the lead reverses under lr retuning**",
            APPEARS: f"{moved[APPEARS]}{by}: **a lead appears under lr retuning**",
            NO_LEAD: "neither is resolved: **no lead at the same lr, and none with each at its best lr**"}[v]


def retuning_words(res: Results, comp: Comparison, say_lr: bool = True) -> str:
    """What retuning did to an lr grid's lead: moved neither design, or lead_after_retuning's words."""
    same, best = res.rows_of(comp)
    if shared_best(res, comp):
        return lead_at_shared_best(comp.grid, same.delta, say_lr)
    return lead_after_retuning(comp.grid, same.delta, best.delta, retuning_change(res, comp))


def retuning_sentence(res: Results, comp: Comparison) -> Optional[str]:
    """An lr grid's ours − reference at the same lr beside each at its best lr (both paired by seed), and whether the
    same-lr lead survives lr retuning; None without the best-lr row."""
    rows = res.rows_of(comp)
    if len(rows) < 2:
        return None
    g, (same, best) = comp.grid, rows
    d = g.delta
    if (best.ours, best.ref) == (same.ours, same.ref):
        numbers = (f"Both designs are best at {g.same}, so the delta with each at its best lr is the same-lr one, "
                   f"{d} {fmt(same.delta, True)} (paired by seed)")
    else:
        numbers = (f"{d}: {fmt(same.delta, True)} at the same lr ({g.same}), {fmt(best.delta, True)} with each at "
                   f"its best lr ({g.ours} {res.best_lr(comp, g.ours)}, {g.reference} {res.best_lr(comp, g.reference)};"
                   " each paired by seed)")
    return f"{numbers}: {retuning_words(res, comp, say_lr=False)}.{grid_edge(res, comp)}"


def ladder_at_best_lr(res: Results, comp: Comparison) -> str:
    """A ladder trains every rung at the paper's lr. Where an lr grid shares a rung's runs (its same-lr row is that
    rung), its best-vs-best row says whether the rung's lead survives retuning; where it does not (the change
    resolved), the multiplier may be unified's tolerance of a low lr as much as its efficiency. Empty where no grid
    shares a rung."""
    rungs = {r.title: r for r in res.rows_of(comp)}
    read = []  # (the rung, each design at its best lr there, the change)
    for grid in (c for c in res.plan.comparisons if c.kind == "lr_grid"):
        rows = res.rows_of(grid)
        if len(rows) == 2 and rows[0].same_as in rungs and rows[1].delta is not None:
            read.append((rungs[rows[0].same_as], rows[1], retuning_change(res, grid)))
    if not read:
        return ""
    text = (" Every rung trains at the paper's lr; with each design at its best lr, unified − baseline is "
            + "; ".join(f"{fmt(best.delta, True)} at {rung.label}" for rung, best, _ in read))
    lost = [rung.label for rung, best, change in read
            if retuning_verdict(rung.delta, best.delta, change) in (FADES, REVERSES)]
    open_ = [f"{rung.label} ({fmt(change, True)})" for rung, best, change in read
             if retuning_verdict(rung.delta, best.delta, change) == UNSETTLED]
    if lost:
        text += (f": the lead at the paper's lr does not survive retuning at {', '.join(lost)}, so the multiplier "
                 "may be unified's tolerance of a low lr as much as its efficiency")
    if open_:
        text += (f"{'; ' if lost else ': '}retuning's change to the lead is unresolved at {', '.join(open_)}")
    return text + "."

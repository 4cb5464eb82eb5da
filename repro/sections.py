"""The results page's section of each comparison: its table of final losses and deltas (each beside the paper's,
with ours/paper, the 95 % interval, the MDE and the verdict), its Δ-loss curves over training and, for a ladder
(Figs. 6, 7), the scaling laws as the data has them. Numbers come from repro/measure.py, laws from repro/laws.py.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from repro.comparisons import Comparison, Curve, LrGrid
from repro.laws import (MIN_RUNGS, LadderLaw, Rung, ladder_law, pflops_days, ratio_text, times, times_interval,
                        times_text)
from repro.measure import CurvePanel, Results, Row, lr_curve
from repro.plotting import draw_deltas, plot_law
from repro.proxy import compute_params
from repro.retuning import retuning_sentence
from repro.stats import fmt, ratio

DAGGER = "†"
DELTA_HEAD = "Δ val [95 % CI] | paper Δ | ours/paper | MDE | Δ WikiText-2 [95 % CI] | verdict"


def delta_cells(row: Row) -> str:
    """The DELTA_HEAD cells of a row; a row with another's runs names it instead of showing its numbers again."""
    paper = f"{row.paper:+.4f}" if row.paper is not None else "–"
    if row.same_as:
        return f"(the same runs as *{row.same_as}*) | {paper} | | | | not counted again"
    r = ratio(row.delta, row.paper)
    mde = f"{row.delta.mde:.4f}" if row.delta and row.delta.n >= 2 else "–"
    return (f"{fmt(row.delta, True)} | {paper} | {f'{r:.2f}' if r is not None else '–'} | {mde} | "
            f"{fmt(row.wiki, True)} | {row.verdict}")


def marked(res: Results, comp: Comparison, curve: Curve, label: str, notes: dict[str, list[str]]) -> str:
    """`label`, with a † when another comparison reads this curve's runs (collected in `notes` for the footnote)."""
    others = res.readers(comp, curve)
    if not others:
        return label
    notes[label] = others
    return label + DAGGER


def footnote(notes: dict[str, list[str]]) -> list[str]:
    if not notes:
        return []
    return ["", f"{DAGGER} Runs shared with other comparisons (one run directory per seed, read by each): "
            + "; ".join(f"{label}: also {', '.join(others)}" for label, others in notes.items()) + "."]


def image(res: Results, comp: Comparison, panels: list[CurvePanel], img_dir: Path) -> list[str]:
    panels = [p for p in panels if p.losses or p.deltas]
    if not panels:
        return []
    draw_deltas(panels, img_dir / f"{comp.key}.png")
    return [f"![{comp.title}](img/{img_dir.name}/{comp.key}.png)", ""]


def curve_panel(res: Results, comp: Comparison, title: str, curves: list[Curve], rows: list[Row],
                ref_label: str) -> CurvePanel:
    return CurvePanel(title, ref_label, [res.loss_band(comp, c) for c in curves],
                      [res.delta_band(r) for r in rows if not r.same_as])


def ordering(res: Results, comp: Comparison, metric: str) -> list[str]:
    means = {c.label: res.final(comp, c, metric) for c in comp.curves}
    return [k for k, s in sorted(((k, s) for k, s in means.items() if s), key=lambda kv: kv[1].mean)]


def panel_section(res: Results, comp: Comparison, img_dir: Path) -> tuple[list[str], Optional[bool]]:
    """A panel of curves against curves[0]; returns its lines and, where ≥ 3 curves have runs, whether WikiText-2
    orders them as the validation loss does."""
    ref, rows, notes = comp.curves[0], res.rows_of(comp), {}
    out = [f"### {comp.title}", "", f"Reference: **{ref.label}**; the paper's deltas: {comp.cite}.", "",
           f"| curve | seeds | val loss | WikiText-2 | {DELTA_HEAD} |", "|---" * 10 + "|"]
    out.append(f"| {marked(res, comp, ref, ref.label, notes)} | {len(res.finals(comp, ref))} | {fmt(res.final(comp, ref))} "
               f"| {fmt(res.final(comp, ref, res.wiki))} | (reference) | | | | | |")
    for row in rows:
        c = row.ours
        out.append(f"| {marked(res, comp, c, c.label, notes)} | {len(res.finals(comp, c))} | {fmt(res.final(comp, c))} | "
                   f"{fmt(res.final(comp, c, res.wiki))} | {delta_cells(row)} |")
    out += footnote(notes) + [""]
    same = None
    val, wiki = ordering(res, comp, "val_loss"), ordering(res, comp, res.wiki)
    if len(val) >= 3 and len(wiki) == len(val):  # two curves' order is their delta; one has none
        same = val == wiki
        out += [f"Ordering by validation loss (best first): {' < '.join(val)}. On WikiText-2: {' < '.join(wiki)} "
                f"({'the same' if same else 'a different'} order).", ""]
    title = comp.title.split(", ", 1)[-1]
    out += image(res, comp, [curve_panel(res, comp, title, list(comp.curves), rows, ref.label)], img_dir)
    return out, same


def lr_grid_section(res: Results, comp: Comparison, img_dir: Path) -> list[str]:
    """An lr grid (Fig. 1; the headline rungs at ×½, ×1 and ×2 the paper's lr): each design's final loss at every lr
    with its best marked, then ours − reference at the same lr and with each at its best lr, and what retuning
    does to the lead, over the lrs both designs have run (a line names the rest). Until both designs have run the
    same lr the section is one line saying what has not run (and the comparison has no rows: repro/measure.py)."""
    g, rows, out = comp.grid, res.rows_of(comp), [f"### {comp.title}", ""]
    missing = res.missing(comp)
    if res.unread(comp):
        return out + [not_run_line(res, comp, missing), ""]
    best = {d: res.best_lr(comp, d) for d in (g.reference, g.ours)}
    ran = res.ran_lrs(comp)
    out += [f"| lr | {' | '.join(g.heads)} |", "|---|---|---|---|---|"]
    for lr in g.lrs:
        cells = [fmt(res.final(comp, lr_curve(comp, d, lr), metric)) + (" (best)" if metric == "val_loss"
                                                                          and best[d] == lr else "")
                 for metric in ("val_loss", res.wiki) for d in (g.reference, g.ours)]
        out.append(f"| {lr}{'' if lr in ran else ' (not read: not both run)'} | " + " | ".join(cells) + " |")
    notes: dict[str, list[str]] = {}
    for lr in ran:
        for d in (g.reference, g.ours):
            marked(res, comp, lr_curve(comp, d, lr), f"{d} lr {lr}", notes)
    out += footnote(notes) + [""]
    if missing:
        out += [partial_line(res, comp, missing, ran), ""]
    out += delta_table(g, rows) + [""] + ([g.note, ""] if g.note else [])
    said = retuning_sentence(res, comp)
    out += [said or "No seed has finished at every lr of both designs yet: no delta with each at its best lr.", ""]
    drawn = {row.runs: row for row in reversed(rows) if row.delta is not None}  # the first row of each pair of runs
    panels = [CurvePanel(f"{comp.title.split(',')[0]}, {row.label}", row.ref.label,
                         [res.loss_band(comp, c) for c in (row.ref, row.ours)], [res.delta_band(row)])
              for row in rows if drawn.get(row.runs) is row]
    return out + image(res, comp, panels, img_dir)


def delta_table(g: LrGrid, rows: list[Row]) -> list[str]:
    return [f"| {g.delta} | {DELTA_HEAD} |", "|---" * 7 + "|"] + [
        f"| {row.label} | {delta_cells(row)} |" for row in rows]


def not_run_line(res: Results, comp: Comparison, missing: list[Curve]) -> str:
    """The one line of a grid whose curves have not all run: which, the command that trains them, and where its
    same-lr delta is when another comparison shows it."""
    cmd = train_command(res, comp, missing)
    g = comp.grid
    same = res.row_reading(comp, lr_curve(comp, g.ours, g.same), lr_curve(comp, g.reference, g.same))
    where = f"; its same-lr delta is *{same.title}*" if same else ""
    return (f"**Not run yet:** {len(missing)} of its {len(comp.curves)} curves "
            f"{'has' if len(missing) == 1 else 'have'} no finished run "
            f"({', '.join(c.label for c in missing)}), so there is no delta with each design at its best lr"
            f"{where}. `{cmd}` trains them.")


def train_command(res: Results, comp: Comparison, missing: list[Curve]) -> str:
    """The command that trains a grid's missing curves at as many seeds as its curves that have run all have: enough
    to read it, no more (the plan's --seeds can be 20, for the central rows)."""
    have = [len(res.runs_of(comp, c)) for c in comp.curves if c not in missing]
    seeds = min(have) if have else res.plan.seeds
    return shlex.join(["python", "-m", "repro.results", "--seeds", str(seeds), "--only",
                       *(f"{comp.key}/{c.label}" for c in missing)])


def partial_line(res: Results, comp: Comparison, missing: list[Curve], ran: tuple[str, ...]) -> str:
    """The line of a grid read over part of its lrs: which curves have not run, the command that trains them, and
    that *best* is over the lrs both designs have run."""
    cmd = train_command(res, comp, missing)
    return (f"**Not run yet:** {', '.join(c.label for c in missing)}. Each design's *best* lr is the best of "
            f"{', '.join(ran)}, the lrs both have run. `{cmd}` trains the rest.")


@dataclass(frozen=True)
class LadderRung:
    """A ladder rung as the page reads it: its row, each strategy's compute parameters, the final tokens, and C."""
    row: Row
    n: int  # the baseline's
    n_unified: Optional[int]  # None until unified has a finished run
    tokens: int
    compute: float  # the baseline's C; unified's is its own N over the same tokens (repro/laws.py)
    rung: Rung


def ladder_rungs(res: Results, comp: Comparison) -> list[Optional[LadderRung]]:
    """Each rung of a ladder comparison (None where its baseline has no finished run)."""
    out = []
    for (base, uni), row in zip(comp.rungs, res.rows_of(comp)):
        runs = res.runs_of(comp, base)
        if not runs:
            out.append(None)
            continue
        run = next(iter(runs.values()))
        n = compute_params(run.cfg)
        c = pflops_days(n, run.final_tokens)
        uni_run = next(iter(res.runs_of(comp, uni).values()), None)
        n_uni = compute_params(uni_run.cfg) if uni_run else None
        computes = {"unified": pflops_days(n_uni, uni_run.final_tokens)} if uni_run else {}
        out.append(LadderRung(row, n, n_uni, run.final_tokens, c,
                              Rung(c, {"baseline": res.finals(comp, base), "unified": res.finals(comp, uni)},
                                   computes)))
    return out


def law_of(res: Results, comp: Comparison) -> Optional[LadderLaw]:
    """The ladder's laws (repro/laws.py), None with fewer than MIN_RUNGS rungs measured."""
    return ladder_law([r.rung for r in ladder_rungs(res, comp) if r], "baseline", "unified")


def ladder_section(res: Results, comp: Comparison, img_dir: Path) -> list[str]:
    """Figs. 6, 7: baseline vs unified at each rung, then the two laws L = a·C^b as the data has them."""
    out = [f"### {comp.title}", "", f"| rung | N (compute), baseline / unified | tokens | C (PFLOP/s-days), baseline "
           f"| baseline | unified | {DELTA_HEAD} |", "|---" * 12 + "|"]
    rungs, notes = [], {}
    for (base, uni), row, lr in zip(comp.rungs, res.rows_of(comp), ladder_rungs(res, comp)):
        if lr is None:
            out.append(f"| {row.label} | | | | – | {fmt(res.final(comp, uni))} | {delta_cells(row)} |")
            continue
        n_text = f"{lr.n:,} / {lr.n_unified:,}" if lr.n_unified else f"{lr.n:,}"
        out.append(f"| {marked(res, comp, base, row.label, notes)} | {n_text} | {lr.tokens:,} | {lr.compute:.3g} | "
                   f"{fmt(res.final(comp, base))} | {fmt(res.final(comp, uni))} | {delta_cells(row)} |")
        rungs.append(lr.rung)
    out += footnote(notes)
    out += ["", "Each strategy's compute counts its own parameters: unified's law places its losses at its own C, "
            "the same tokens over its N, and each multiplier is read at the baseline's C.",
            "", "A rung has no paper size of its own: its Δ is read against the mean of the paper's sizes ("
            + ", ".join(f"{k.upper()} {v:+.4f}" for k, v in comp.paper_sizes) + f"; {comp.cite}).", ""]
    law = ladder_law(rungs, "baseline", "unified")
    measured = sum(1 for r in rungs if r.losses.get("baseline") and r.losses.get("unified"))
    if law is None and measured:
        out += [f"No law yet: a power law has 2 parameters, so it needs {MIN_RUNGS} or more rungs with both "
                f"strategies (repro/laws.py, MIN_RUNGS); {measured} measured.", ""]
    if law is not None:
        out += law_lines(law, comp.paper_multiplier)
        pts = {k: [(r.c(k), sum(r.losses[k].values()) / len(r.losses[k])) for r in rungs if r.losses.get(k)]
               for k in ("baseline", "unified")}
        plot_law(pts, law.fits, f"{comp.title.split(',')[0]}: laws of the seed means", img_dir / f"{comp.key}_law.png")
        out += [f"![scaling law](img/{img_dir.name}/{comp.key}_law.png)", ""]
    panels = [curve_panel(res, comp, row.label, [base, uni], [row], base.label)
              for (base, uni), row in zip(comp.rungs, res.rows_of(comp))]
    return out + image(res, comp, panels, img_dir)


def law_lines(law: LadderLaw, paper: Optional[float]) -> list[str]:
    """The laws, the multiplier at each rung, the exponents' difference, the crossing, and a headline only for
    parallel laws (docs/paper.md §4.5: the paper's are parallel, one multiplier); every multiplier and the crossing
    with its bootstrap interval over seeds (repro/laws.py)."""
    ref, new, boot = law.fits[law.reference], law.fits[law.other], law.boot
    per_rung = boot.log_multipliers if boot else [None] * len(law.compute)
    out = [f"Power laws fitted to the seed means: baseline L = {ref.a:.4f}·C^{ref.b:.4f}, unified L = "
           f"{new.a:.4f}·C^{new.b:.4f}. The equal-loss compute multiplier of unified over baseline at each rung: the "
           "rung's compute over the compute unified's law needs for the loss the baseline's law gives there (above "
           "1: unified reaches that loss with less), with two intervals: the 2.5–97.5 percentiles over "
           f"{boot.resamples if boot else 0:,} bootstrap resamples of the seeds (per rung, paired, the laws refitted "
           "to each resample's means), and the t interval over the seeds' own laws:", "",
           "| C (PFLOP/s-days) | multiplier (seed-mean laws) | 95 % bootstrap over seeds | 95 % CI over the seeds' own "
           "laws (t) |", "|---|---|---|---|"]
    out += [f"| {c:.3g} | {times_text(m)} | {times_interval(b) if b else '–'} | {times(s)} |"
            for c, m, b, s in zip(law.compute, law.log_multipliers, per_rung, law.seed_multipliers)]
    d = law.exponent_diff
    if law.parallel is None:
        parallel = "With fewer than two seeds' laws the exponents' difference has no interval."
    else:
        parallel = (f"The exponents differ by b_unified − b_baseline = {d.mean:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}] over "
                    f"the {d.n} seeds' own laws (paired by seed"
                    + (f"; bootstrap [{boot.exponent_diff[0]:+.4f}, {boot.exponent_diff[1]:+.4f}]" if boot else "")
                    + "): " + ("the interval holds 0, so the laws are parallel within it." if law.parallel
                               else "the interval excludes 0: the laws are not parallel."))
    out += ["", parallel]
    if not law.falling:
        out.append("A seed-mean law whose loss does not fall with compute (b ≥ 0) gives no meaningful multiplier.")
    cross = law.crossing
    if cross is not None and boot is None:
        out.append("The laws' crossing is not given: a rung has fewer than two paired seeds, so it has no interval.")
    elif cross is not None and not 0 < cross < math.inf:
        out.append("The seed-mean laws are so nearly parallel that they cross only far outside any compute range.")
    elif cross is not None:
        where = {"inside": "inside the measured range", "above": "above the measured range",
                 "below": "below the measured range"}[law.crossing_place]
        ahead = "unified" if law.log_multipliers[-1] > 0 else "baseline"
        out.append(f"The seed-mean laws cross at C = {cross:.3g} PFLOP/s-days, {ratio_text(crossing_log(law))} the "
                   f"largest rung's compute ({where}; 95 % bootstrap over seeds "
                   f"{times_interval(boot.log_crossing, ratio_text)} of it); at the largest rung {ahead} is ahead.")
    paper_text = f" The paper: {paper:.2f}×, from parallel laws." if paper else ""
    gm_boot = f"bootstrap {times_interval(boot.log_mean)}" if boot else "no bootstrap interval"
    if law.log_headline is not None:
        gm = law.mean_multiplier
        ci = f", t {times(gm)} over the seeds' own laws" if gm and gm.n >= 2 else ""
        out.append(f"One multiplier for the ladder (the laws being parallel): **{times_text(law.log_headline)}** "
                   f"(geometric mean over the rungs; {gm_boot}{ci}).{paper_text}")
    elif law.parallel and law.falling:
        out.append(f"No single multiplier: the laws are parallel within their interval, but the ladder's multiplier "
                   f"(geometric mean over the rungs, {times_text(law.log_mean)} from the seed-mean laws; {gm_boot}) "
                   f"has the interval {times(law.mean_multiplier)} over the seeds' own laws, which holds 1."
                   f"{paper_text}")
    else:
        lo, hi = min(law.log_multipliers), max(law.log_multipliers)
        at_top = f" {times_interval(per_rung[-1])}" if per_rung[-1] else ""
        out.append(f"No single multiplier: it depends on the loss it is read at, from {times_text(lo)} to "
                   f"{times_text(hi)} over the measured rungs ({times_text(law.log_multipliers[-1])}{at_top} at the "
                   f"largest).{paper_text}")
    return out + [""]


def crossing_log(law: LadderLaw) -> float:
    """log of the seed-mean laws' crossing over the largest rung's compute."""
    return math.log(law.crossing) - math.log(max(law.compute))


def law_sentence(comp: Comparison, law: LadderLaw) -> str:
    """A ladder's laws in one sentence, every multiplier and crossing with its bootstrap interval."""
    boot, head = law.boot, comp.title.split(",")[0]
    paper = f" against the paper's {comp.paper_multiplier:.2f}× from parallel laws" if comp.paper_multiplier else ""
    d = law.exponent_diff
    exps = (f"the exponents differ by {d.mean:+.4f} [{d.lo:+.4f}, {d.hi:+.4f}]" if law.parallel is not None
            else "the exponents' difference has no interval")
    if law.parallel:
        text = (f"{head}'s laws are parallel within their interval ({exps}); the ladder's multiplier is "
                f"{times_text(law.log_mean)} (bootstrap over seeds {times_interval(boot.log_mean)}, t over the "
                f"seeds' own laws {times(law.mean_multiplier)}){paper}")
        if law.log_headline is not None:
            text += "."
        elif law.falling:
            text += (": the t interval holds 1, so the page gives it no headline (the percentile bootstrap, "
                     f"resampling only the {law.exponent_diff.n} seeds there are, is the narrower of the two).")
        else:
            text += ": a law whose loss does not fall with compute gives no multiplier."
    else:
        text = (f"{head}'s laws are not parallel ({exps}): the multiplier runs from "
                f"{times_text(law.log_multipliers[0])} {times_interval(boot.log_multipliers[0])} at the smallest rung "
                f"to {times_text(law.log_multipliers[-1])} {times_interval(boot.log_multipliers[-1])} at the largest"
                f"{paper}")
        cross = law.crossing
        if cross is not None and 0 < cross < float("inf"):
            text += (f", and the seed-mean laws cross at {ratio_text(crossing_log(law))} the largest rung's compute "
                     f"(bootstrap {times_interval(boot.log_crossing, ratio_text)})")
        text += "."
    return text

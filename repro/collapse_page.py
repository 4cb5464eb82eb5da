"""repro/pages/collapse.md: issue 52's page, written from its runs (repro/collapse.py's A/B, repro/headroom_risk.py's
first steps) and results v4's archive (the horizon rungs' lr curves, the ladder).

    python -m repro.collapse_page repro/archives/results_runs_v5.jsonl.gz repro/archives/results_runs_v4.jsonl.gz \
        --seeds 10
    python -m repro.collapse_page runs/v5 repro/archives/results_runs_v4.jsonl.gz --seeds 10 --page /tmp/collapse.md
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from repro.collapse import Arm, arms_of, paired, table
from repro.comparisons import (COLLAPSE_ROWS, FIG8_MOE_DELTA, Comparison, Plan, collapse_ab, default_comparisons,
                               lr_text)
from config import load_config
from repro.headroom_risk import (FIRST_BATCH, FIRST_LR, FIRST_RUNGS, FIRST_SEQ, FIRST_STEPS, PAPER_CONFIG, Early,
                                 calibrate, early, early_table, first_names, first_steps_argv, ladder, ladder_table,
                                 lr_sums, rung_of)
from repro.reading import MDE_FLOOR, planned_seeds
from repro.runner import CpuLedger, is_compact, plan_runs, unpack
from repro.stats import Stat, fmt, stat, welch
from runs import load_run


ROUTER_SEEDS = 20  # the most seeds any run of Fig. 8's MoE Muon row has


@dataclass(frozen=True)
class LrPoint:
    lr: str
    seeds: int  # the seeds every run of the curve has
    baseline: Optional[float]  # mean final val loss over the seeds every column has
    literal: Optional[float]
    removed: Optional[float]


def horizon_key(horizon: int, kind: str) -> str:
    return f"fig{'6' if kind == 'dense' else '7'}-horizon_x{horizon}"


def lr_curve(horizon: int, kind: str, ab_dir: Path, ladder_dir: Path, seeds: int) -> list[LrPoint]:
    """One horizon's lr curve: baseline and literal unified from the horizon rung's runs (results v4), the removed
    form where the A/B ran it; means over the seeds that every run of the curve has."""
    # The ladder comes first in the plan: a rung's run at the preset's lr is the ladder's run, in its directory.
    comps = {c.key: c for c in default_comparisons(Plan(1).lrs)}
    rung = comps[horizon_key(horizon, kind)]
    ladder_key = "fig6-ladder" if kind == "dense" else "fig7-ladder"
    _, where_v4 = plan_runs(Plan(seeds, comparisons=[comps[ladder_key], rung]), str(ladder_dir))
    comps = {lr_text(r[1]): collapse_ab(*r) for r in COLLAPSE_ROWS if (r[0], r[2]) == (horizon, kind)}
    _, where_ab = plan_runs(Plan(seeds, comparisons=list(comps.values())), str(ab_dir)) if comps else (None, {})
    cols = []
    for lr in rung.grid.lrs:
        base = {s: final(where_v4[(f"{rung.key}/baseline lr {lr}", s)]) for s in range(seeds)}
        lit = {s: final(where_v4[(f"{rung.key}/unified lr {lr}", s)]) for s in range(seeds)}
        rem = ({s: final(where_ab[(f"{comps[lr].key}/unified, magnitudes removed", s)]) for s in range(seeds)}
               if lr in comps else None)
        cols.append((lr, base, lit, rem))
    # One seed set for the whole curve, so that its rows compare: the seeds every run of it has.
    # A grid lr none of whose runs are there (not in this archive) is a row of dashes.
    ran = [row for row in cols if any(v is not None for c in row[1:] if c is not None for v in c.values())]
    common = [s for s in range(seeds) if all(c[s] is not None for row in ran for c in row[1:] if c is not None)]

    def mean(col: Optional[dict]) -> Optional[float]:
        return statistics.mean(col[s] for s in common) if col is not None and common else None
    return [LrPoint(lr, len(common), mean(base), mean(lit), mean(rem)) if (lr, base, lit, rem) in ran
            else LrPoint(lr, 0, None, None, None) for lr, base, lit, rem in cols]


def final(path: Path) -> Optional[float]:
    """A run's final val loss (None: not there, or not finished)."""
    if not (path / "config.yaml").exists():
        return None
    run = load_run(path)
    return run.final_val_loss if run.finished else None


def lr_table(points: list[LrPoint]) -> list[str]:
    def cell(v: Optional[float], best: Optional[float]) -> str:
        return "–" if v is None else (f"**{v:.4f}**" if v == best else f"{v:.4f}")
    best = {c: min((getattr(p, c) for p in points if getattr(p, c) is not None), default=None)
            for c in ("baseline", "literal", "removed")}
    lines = ["| lr | seeds | baseline | unified, literal | unified, magnitudes removed |", "|---|---|---|---|---|"]
    lines += [f"| {p.lr} | {p.seeds} | {cell(p.baseline, best['baseline'])} | {cell(p.literal, best['literal'])} | "
              f"{cell(p.removed, best['removed'])} |" for p in points]
    return lines


def reading(abs_: list[tuple[Comparison, list[Arm]]], curves: dict[str, list[LrPoint]], rows: list[Early],
            calibration: Optional[float], paper_sum: float) -> list[str]:
    """The page's plain words, each computed from the tables below it."""
    literal, removed, spared = ([a for _, arms in abs_ for a in arms if a.label == label]
                                for label in ("unified, literal", "unified, magnitudes removed",
                                              "unified, those β undecayed"))
    def count(arms: list[Arm]) -> str:
        return f"{sum(a.collapsed() for a in arms)} of {sum(len(a.runs) for a in arms)}"
    deltas = [paired(r.final("val_loss"), lit.final("val_loss")) for lit, r in zip(literal, removed)]
    deltas = [d for d in deltas if d is not None and d.n >= 2]
    better = sum(d.resolved and d.mean < 0 for d in deltas)
    worse = sum(d.resolved and d.mean > 0 for d in deltas)
    out = [f"- **Collapse.** Literal unified switched a branch off in {count(literal)} runs over {len(abs_)} rows. "
           f"Without those magnitudes: {count(removed)}. With them undecayed: {count(spared)}.",
           f"- **Loss.** Removed − literal, final val loss, over the {len(deltas)} rows with 2 or more seeds: better "
           f"in {better}, worse in {worse}, unresolved in {len(deltas) - better - worse} (95 % intervals, the tables "
           "below)."]
    for title, points in curves.items():
        best = {c: min(((getattr(p, c), p.lr) for p in points if getattr(p, c) is not None), default=None)
                for c in ("baseline", "literal", "removed")}
        if best["removed"] and best["literal"] and best["baseline"]:
            gap = best["removed"][0] - best["literal"][0]
            base, lit, rem = (float(best[c][1]) for c in ("baseline", "literal", "removed"))
            moves = gap < 0 and abs(rem - base) < abs(lit - base)
            out.append(f"- **Best lr, {title}.** Baseline {best['baseline'][1]}, literal {best['literal'][1]}; removed "
                       f"(at the lrs it ran) {best['removed'][1]}, {abs(gap):.4f} {'below' if gap < 0 else 'above'} "
                       "literal at its best" + (": unified's best lr moves back toward the baseline's." if moves
                                                 else "."))
    paper = next((e for e in rows if e.rung == rung_of(load_config(PAPER_CONFIG))), None)
    if paper is not None and calibration is not None:
        at = paper.sum_lr_to_collapse() * calibration
        preset = load_config(PAPER_CONFIG).model.scale.invariant_magnitude
        out.append(f"- **The paper model.** Literal unified on `configs/dense_0.12b_unified.yaml` reaches the collapse "
                   f"point at Σlr ≈ {at:.1f} by the calibrated estimate (a rough one: its method is below); its "
                   f"schedule sums to {paper_sum:.1f}. "
                   + ("It is at risk. " if at < paper_sum else "The estimate puts it out of reach. ")
                   + ("The config now removes those magnitudes (`configs/scale/unified.yaml`), so it cannot collapse; "
                      "`configs/scale/unified_literal.yaml` keeps them for a faithful reproduction, and its runs print "
                      "a warning when a branch switches off." if preset == "remove" else
                      "Read its warnings, or set `model.scale.invariant_magnitude=remove`."))
    return out


AB_BUDGET_HOURS = 15  # the CPU time the A/B was given, first steps and router rows included


def shortfall(abs_: list[tuple[Comparison, list[Arm]]], seconds: dict[str, float]) -> list[str]:
    """The rows short of the pilot rule's n (MDE_FLOOR), and what their missing runs would cost at the row's mean CPU
    time per run, as one line of the page's reading."""
    short, runs_missing, hours = [], 0, 0.0
    for comp, arms in abs_:
        ref = arms[0].final("val_loss")
        need = {}
        for arm in arms[1:]:
            val = arm.final("val_loss")
            n = planned_seeds([val[s] - ref[s] for s in sorted(val) if s in ref], MDE_FLOOR)
            if n is not None:
                need[arm.label] = n
        if need:
            need[arms[0].label] = max(need.values())  # literal pairs with every arm
        missing = {a.label: need[a.label] - len(a.runs) for a in arms if need.get(a.label, 0) > len(a.runs)}
        if not missing:
            continue
        cpu = [seconds[r.path.name] for a in arms for r in a.runs.values() if r.path.name in seconds]
        runs_missing += sum(missing.values())
        hours += sum(missing.values()) * statistics.mean(cpu) / 3600 if cpu else 0.0
        where = comp.title.removeprefix("The magnitudes only a Norm reads, ")
        short.append(f"{where}: " + ", ".join(f"{label.removeprefix('unified, ')} {len(a.runs)} of {need[label]}"
                                                for a in arms if (label := a.label) in missing))
    if not short:
        return ["- **Seeds.** Every row has the seeds its pilot asks for."]
    spent = sum(seconds.values()) / 3600
    over = spent + hours > AB_BUDGET_HOURS
    return [f"- **Seeds.** Short of their pilot's n: {'; '.join(short)}. The {runs_missing} missing runs would take "
            f"about {hours:.1f} CPU-hours at their rows' mean"
            + (f", past the A/B's budget of {AB_BUDGET_HOURS} with the {spent:.1f} spent, so "
               + ("that row stays where it is and its intervals say" if len(short) == 1 else
                  "those rows stay where they are and their intervals say") + " what they can." if over else ".")]


def write_page(page: Path, ab_dir: Path, ladder_dir: Path, seeds: int, rebuild: str) -> None:
    """The page from the A/B's runs and the first steps (`ab_dir`) and results v4's runs (`ladder_dir`)."""
    comps = [collapse_ab(*r) for r in COLLAPSE_ROWS]
    _, where = plan_runs(Plan(seeds, comparisons=comps), str(ab_dir))
    abs_ = [(comp, arms) for comp, arms in ((c, arms_of(c, where, seeds)) for c in comps) if any(a.runs for a in arms)]
    curves = {f"{'dense d32 L4' if kind == 'dense' else 'MoE d32 L2 E8'} at {h} ×": lr_curve(h, kind, ab_dir,
                                                                                          ladder_dir, seeds)
              for kind, hs in (("dense", (3, 10)), ("moe", (1, 10))) for h in hs}
    ladder_runs = [load_run(p.parent) for d in (ladder_dir, ab_dir) for p in sorted(d.glob("*/config.yaml"))]
    groups = ladder(list({r.path.name: r for r in ladder_runs}.values()))
    rows = first_steps(ab_dir)
    calibration = calibrate(groups, rows)
    paper_sum = lr_sums(load_config(PAPER_CONFIG))[-1]
    text = [
        "# Every branch stays on: the magnitudes only a Norm reads",
        "",
        f"<!-- Written by `{rebuild}`; edit repro/collapse_page.py, not this file. -->",
        "",
        "Under DNP an input-side vector feeds its branch's inner Norm, so its magnitude β reaches the loss only "
        "through that Norm's eps, while IWD decays it (docs/paper.md §1.7). Once β² times the branch's scale falls "
        "below eps, the Norm stops normalizing and the branch is switched off. This page measures where that happens "
        "on the CPU proxy, what removing those magnitudes does, and what it means for the paper's schedule.",
        "",
        *reading(abs_, curves, rows, calibration, paper_sum),
        *shortfall(abs_, CpuLedger(ab_dir).seconds),
        "",
        "## The A/B",
        "",
        "Unified (HG + DNP + OR + IWD) on the CPU proxy, where results v4's runs collapsed. Three arms: as the paper "
        "reads (literal), without the magnitudes only a Norm reads (`model.scale.invariant_magnitude=remove`), and "
        "with those magnitudes undecayed (`optim.scale_wd_invariant=false`). A run collapsed when some inner Norm's "
        "headroom (input mean square / eps) fell below 1 at an evaluation. Δ is paired by seed (mean [95 % interval]).",
        "",
        *[line for comp, arms in abs_ for line in (table(comp, arms), "")],
        "## Each horizon's lr curve",
        "",
        "Baseline and literal unified are the horizon rungs of results v4 (repro/pages/results.md, The horizon); the "
        "removed form ran where the A/B did. Each cell is the mean final val loss over the seeds every run of its "
        "curve has; bold is the column's best.",
        "",
        *[line for title, points in curves.items() for line in (f"**{title} the proxy's tokens**", "",
                                                                 *lr_table(points), "")],
        "## The paper-scale risk",
        "",
        "The ladder: each literal unified run's Σlr (its schedule's lr summed over its steps) at its first evaluation "
        "with some headroom below 1. Runs that predate the headroom telemetry show only their smallest |β|.",
        "",
        ladder_table(groups),
        "",
        f"The first steps: each rung and the real `configs/dense_0.12b_unified.yaml`, {FIRST_STEPS} steps at a "
        f"constant lr {FIRST_LR:g}, {FIRST_BATCH} × {FIRST_SEQ} tokens a step, literal form, fp32 "
        "(`python -m repro.headroom_risk --first-steps DIR --train`). The fastest β per Σlr is the largest |Δβ| over "
        "those steps over their Σlr. The branch growth is the median headroom / β² at the end over its value at "
        "init. β* = 1 / sqrt(headroom at init × growth) is where the smallest branch switches off. The raw Σlr to "
        "collapse is (1 − β*) / rate; the d32 rung's runs at the same lr calibrate it (their median Σlr at collapse "
        "over its raw estimate).",
        "",
        early_table(rows, calibration, paper_sum),
        "",
        *router_section(ab_dir, ladder_dir),
        "## The budget",
        "",
        *budget(ab_dir),
    ]
    page.write_text("\n".join(text).rstrip() + "\n")


def router_deltas(folder: Path, seeds: int) -> Optional[Stat]:
    """unified − baseline final val loss of Fig. 8's MoE Muon row, paired by seed, over the seeds both finished."""
    deltas = []
    for s in range(seeds):
        base, uni = (final(folder / f"fig8-moe_0.5b_{design}-tiny-s{s}") for design in ("baseline", "unified"))
        if base is not None and uni is not None:
            deltas.append(uni - base)
    return stat(deltas)


def router_section(ab_dir: Path, ladder_dir: Path) -> list[str]:
    """Fig. 8's MoE Muon row with the router on AdamW (results v4's runs) and on Muon (optim.muon.router, the
    paper's reading: Muon on "2D matrices inside Transformer layers", docs/paper.md §3.2)."""
    on_adamw, on_muon = router_deltas(ladder_dir, ROUTER_SEEDS), router_deltas(ab_dir, ROUTER_SEEDS)
    if on_muon is None:
        return []
    diff = welch(on_adamw, on_muon) if on_adamw is not None else None
    moved = "–" if diff is None else f"{diff.mean:+.4f} [{diff.mean - diff.half:+.4f}, {diff.mean + diff.half:+.4f}]"
    return [
        "## Muon on the router",
        "",
        "Fig. 8's MoE row with Muon (MoE d32 L2 E8, the figure's lr): unified − baseline final val loss, paired by "
        "seed (mean [95 % interval]). Results v4 kept the router on AdamW; `optim.muon.router: true`, the default "
        "now, puts it on Muon as the paper's sentence reads. The last column is Welch's difference of the two Δ.",
        "",
        "| router on | seeds | Δ unified − baseline | the paper's Δ (MoE-0.5B) | Δ on Muon − Δ on AdamW |",
        "|---|---|---|---|---|",
        f"| AdamW (results v4) | {0 if on_adamw is None else on_adamw.n} | {fmt(on_adamw, sign=True)} | "
        f"{FIG8_MOE_DELTA:+.4f} | |",
        f"| Muon | {on_muon.n} | {fmt(on_muon, sign=True)} | {FIG8_MOE_DELTA:+.4f} | {moved} |",
        "",
    ]


def first_steps(folder: Path) -> list[Early]:
    """The finished first-steps runs in `folder`, the rungs in ladder order and the paper's config last."""
    names = [first_steps_argv(r, folder)[0] for r in (*FIRST_RUNGS, None)]
    runs = [load_run(folder / n) for n in names if (folder / n / "config.yaml").exists()]
    return [early(r) for r in runs if r.finished]


def budget(ab_dir: Path) -> list[str]:
    """The CPU time of this page's runs (repro/runner.py's ledger), by part."""
    seconds = CpuLedger(ab_dir).seconds
    first = first_names()

    def part(name: str) -> str:
        return "the first steps" if name in first else ("Muon on the router" if name.startswith("fig8-") else "the A/B")
    rows = ["| part | runs | CPU-hours |", "|---|---|---|"]
    for label in ("the A/B", "the first steps", "Muon on the router"):
        mine = [v for k, v in seconds.items() if part(k) == label]
        if mine:
            rows.append(f"| {label} | {len(mine)} | {sum(mine) / 3600:.2f} |")
    return rows + [f"| total | {len(seconds)} | {sum(seconds.values()) / 3600:.2f} |"]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ab", type=Path, help="the A/B's runs and the first steps: a folder or a compact archive")
    p.add_argument("ladder", type=Path, help="results v4's runs (the horizon rungs' lr curves, the ladder)")
    p.add_argument("--seeds", type=int, required=True, help="the seeds the A/B was planned with")
    p.add_argument("--page", type=Path, default=Path(__file__).resolve().parent / "pages" / "collapse.md")
    args = p.parse_args(argv)
    rebuild = f"python -m repro.collapse_page {args.ab} {args.ladder} --seeds {args.seeds}"
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for i, source in enumerate((args.ab, args.ladder)):
            if is_compact(source):
                if not source.is_file():
                    print(f"error: {source}: no such archive", file=sys.stderr)
                    return 2
                unpack(source, Path(tmp) / str(i))
                source = Path(tmp) / str(i)
            elif not source.is_dir():
                print(f"error: {source}: no such folder", file=sys.stderr)
                return 2
            dirs.append(source)
        write_page(args.page, dirs[0], dirs[1], args.seeds, rebuild)
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

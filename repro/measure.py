"""What the runs measured, per comparison of the plan (repro/comparisons.py): final losses, paired deltas with their
verdicts, Δ-loss curves over training, and which rows and runs are shared between comparisons.

A *row* is one delta of the page: ours − reference in the final validation loss, paired by seed. Two rows that read
the same pair of run directories for every seed are one measurement (Fig. 1's "each at its best lr" when both best
lrs are the "same lr" pair; a headline lr grid's same-lr row, which is its ladder's rung): the page shows it once and
counts it once. A run directory read by several comparisons (Fig. 5's baseline is Fig. 1's at lr 4e-3 and a rung of
Fig. 6's ladder) is one run, marked where it is shared. An lr grid picks each design's best lr on its pilot: the first
PILOT_SEEDS seeds, of those that have run at every lr of the grid that both designs have run. Seeds trained later, to
power the best-vs-best row, never move the pick. A grid has no rows until both designs have run its same lr and one
more.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from repro.comparisons import Comparison, Curve, Plan
from runs import Run, load_run
from repro.stats import Stat, stat, verdict

PILOT_SEEDS = 4  # the first round of every curve (the plan's seeds): lr picks and each row's n are fixed from these


def pick_seeds(finals: dict[str, dict[int, float]]) -> set[int]:
    """The seeds an lr grid's pick reads: those finished at every lr of `finals` ({lr: {seed: final loss}}), and of
    them the pilot's (seed < PILOT_SEEDS), so each lr's mean is over the same seeds and later seeds never move it."""
    common = set.intersection(*(set(f) for f in finals.values())) if finals else set()
    return {s for s in common if s < PILOT_SEEDS}

FROM_TOKENS = 1  # curves start at the first evaluation after step 0: losses at init differ by design (DNP's Norm)


@dataclass(frozen=True)
class Band:
    """A curve over training: the mean over seeds and its 95 % interval at each evaluation's token count."""
    label: str
    tokens: list[int]
    stats: list[Stat]
    of: str = ""  # a delta's: the label of the curve it is "ours" of (the plot draws it in that curve's colour)


@dataclass(frozen=True)
class CurvePanel:
    """One row of a comparison's plot: the curves' losses and the rows' deltas against `reference`."""
    title: str
    reference: str
    losses: list[Band]
    deltas: list[Band]


@dataclass(frozen=True)
class Row:
    comparison: Comparison
    label: str  # in the comparison's table: a curve's label, "same lr (4e-3)", a rung's shape
    ours: Curve
    ref: Curve
    paper: Optional[float]  # the paper's delta this one is read against (docs/paper.md §4)
    delta: Optional[Stat]
    wiki: Optional[Stat]  # the same delta on WikiText-2's test set
    runs: tuple[tuple[Path, Path], ...]  # (ours, reference) run directory of every seed of the plan
    same_as: Optional[str] = None  # the title of the row shown before with the same runs

    @property
    def title(self) -> str:
        return f"{self.comparison.title}: {self.label}"

    @property
    def verdict(self) -> str:
        return f"same runs as {self.same_as}" if self.same_as else verdict(self.delta, self.paper)

    @property
    def counted(self) -> bool:
        """A distinct delta measured over two or more seeds: one test of the page's tally."""
        return self.same_as is None and self.delta is not None and self.delta.n >= 2


class Results:
    """The finished runs of every (comparison curve, seed), read once."""

    def __init__(self, plan: Plan, where: dict[tuple[str, int], Path], wiki: str):
        self.plan, self.where, self.wiki = plan, where, f"val_loss/{wiki}"
        self._runs: dict[Path, Optional[Run]] = {}
        self._rows: Optional[list[Row]] = None

    def path(self, comp: Comparison, curve: Curve, seed: int) -> Path:
        return self.where[(f"{comp.key}/{curve.label}", seed)]

    def run(self, comp: Comparison, curve: Curve, seed: int) -> Optional[Run]:
        path = self.path(comp, curve, seed)
        if path not in self._runs:
            try:
                run = load_run(path)
                self._runs[path] = run if run.finished else None
            except FileNotFoundError:
                self._runs[path] = None
        return self._runs[path]

    def runs_of(self, comp: Comparison, curve: Curve) -> dict[int, Run]:
        """seed → finished run."""
        return {s: r for s in range(self.plan.seeds) if (r := self.run(comp, curve, s)) is not None}

    def finals(self, comp: Comparison, curve: Curve, metric: str = "val_loss") -> dict[int, float]:
        return {s: r.final_eval[metric] for s, r in self.runs_of(comp, curve).items()
                if r.final_eval.get(metric) is not None}

    def final(self, comp: Comparison, curve: Curve, metric: str = "val_loss") -> Optional[Stat]:
        return stat(list(self.finals(comp, curve, metric).values()))

    def paired(self, comp: Comparison, curve: Curve, ref: Curve, metric: str = "val_loss") -> list[float]:
        """curve − ref of every seed both have finished, in seed order."""
        a, b = self.finals(comp, curve, metric), self.finals(comp, ref, metric)
        return [a[s] - b[s] for s in sorted(a) if s in b]

    def delta(self, comp: Comparison, curve: Curve, ref: Curve, metric: str = "val_loss") -> Optional[Stat]:
        return stat(self.paired(comp, curve, ref, metric))

    @property
    def loaded(self) -> list[Run]:
        return [r for r in self._runs.values() if r is not None]

    # ------------------------------------------------------------------------------------------------ rows

    def row(self, comp: Comparison, label: str, ours: Curve, ref: Curve, paper: Optional[float]) -> Row:
        runs = tuple((self.path(comp, ours, s), self.path(comp, ref, s)) for s in range(self.plan.seeds))
        return Row(comp, label, ours, ref, paper, self.delta(comp, ours, ref), self.delta(comp, ours, ref, self.wiki),
                   runs)

    def best_lr(self, comp: Comparison, design: str) -> Optional[str]:
        """An lr grid's lr where `design` ends lowest: the mean final val loss over the pilot's seeds finished at every
        lr of the grid (pick_seeds); None until one seed is."""
        lrs = self.ran_lrs(comp)
        finals = {lr: self.finals(comp, lr_curve(comp, design, lr)) for lr in lrs}
        seeds = pick_seeds(finals)
        if not seeds:
            return None
        means = {lr: sum(f[s] for s in seeds) / len(seeds) for lr, f in finals.items()}
        return min(lrs, key=means.get)

    def missing(self, comp: Comparison) -> list[Curve]:
        """The comparison's curves without a finished run."""
        return [c for c in comp.curves if not self.runs_of(comp, c)]

    def ran_lrs(self, comp: Comparison) -> tuple[str, ...]:
        """An lr grid's lrs where both designs have a finished run: the grid as read so far (an lr added to a grid
        is read once both its curves have run)."""
        g = comp.grid
        return tuple(lr for lr in g.lrs
                     if all(self.runs_of(comp, lr_curve(comp, d, lr)) for d in (g.reference, g.ours)))

    def unread(self, comp: Comparison) -> bool:
        """An lr grid without its same-lr pair and another lr run (no best to pick): its section is one line, and
        nothing of it is counted."""
        if comp.kind != "lr_grid":
            return False
        ran = self.ran_lrs(comp)
        return comp.grid.same not in ran or len(ran) < 2

    def comparison_rows(self, comp: Comparison) -> list[Row]:
        """Before deduplication: every delta the comparison reads, in its table's order."""
        if comp.kind == "lr_grid":  # ours − reference at one lr, then each at its best (docs/paper.md §4.1)
            if self.unread(comp):  # not run yet: its section says so in one line, and nothing of it is counted
                return []
            g = comp.grid
            out = [self.row(comp, f"same lr ({g.same})", lr_curve(comp, g.ours, g.same),
                            lr_curve(comp, g.reference, g.same), g.paper_same)]
            best_ours, best_ref = self.best_lr(comp, g.ours), self.best_lr(comp, g.reference)
            if best_ours and best_ref:
                out.append(self.row(comp, f"each at its best lr ({g.ours} {best_ours}, {g.reference} {best_ref})",
                                    lr_curve(comp, g.ours, best_ours), lr_curve(comp, g.reference, best_ref),
                                    g.paper_best))
            return out
        if comp.kind == "ladder":
            return [self.row(comp, rung_label(base), uni, base, uni.paper_delta) for base, uni in comp.rungs]
        ref = comp.curves[0]
        return [self.row(comp, c.label, c, ref, c.paper_delta) for c in comp.curves[1:]]

    def grid_contrasts(self, comp: Comparison) -> list[Row]:
        """The contrasts that pick an lr grid's best lrs: for each design, its best lr − its runner-up (the next
        lowest mean over the pick's seeds, pick_seeds), paired by every seed both have run. A best-vs-best verdict
        rests on them, so they join the page's multiple-comparison family (repro/reading.py, family); they have no
        paper value and no verdict."""
        if comp.kind != "lr_grid" or self.unread(comp):
            return []
        out = []
        for design in (comp.grid.reference, comp.grid.ours):
            lrs = self.ran_lrs(comp)
            finals = {lr: self.finals(comp, lr_curve(comp, design, lr)) for lr in lrs}
            seeds = pick_seeds(finals)
            if len(seeds) < 2:
                continue
            best, second = sorted(lrs, key=lambda lr: sum(finals[lr][s] for s in seeds))[:2]
            out.append(self.row(comp, f"{design} at its best lr {best} − at {second} (the lr pick)",
                                lr_curve(comp, design, best), lr_curve(comp, design, second), None))
        return out

    @property
    def rows(self) -> list[Row]:
        """Every comparison's rows in plan order; a row with the runs of an earlier one (either way round) names it."""
        if self._rows is None:
            seen: dict[tuple, str] = {}
            self._rows = []
            for comp in self.plan.comparisons:
                for row in self.comparison_rows(comp):
                    again = seen.get(row.runs) or seen.get(tuple((b, a) for a, b in row.runs))
                    self._rows.append(replace(row, same_as=again) if again else row)
                    seen.setdefault(row.runs, row.title)
        return self._rows

    def rows_of(self, comp: Comparison) -> list[Row]:
        return [r for r in self.rows if r.comparison is comp]

    def row_reading(self, comp: Comparison, ours: Curve, ref: Curve) -> Optional[Row]:
        """The first row of the page that reads ours − ref's run directories (either way round), if any."""
        runs = {(self.path(comp, ours, s), self.path(comp, ref, s)) for s in range(self.plan.seeds)}
        return next((r for r in self.rows if set(r.runs) == runs or {(b, a) for a, b in r.runs} == runs), None)

    # ---------------------------------------------------------------------------------------------- shared runs

    def readers(self, comp: Comparison, curve: Curve) -> list[str]:
        """The other comparisons that read any of this curve's run directories, in plan order (an lr grid not run yet
        reads none: its section is one line)."""
        mine = {self.path(comp, curve, s) for s in range(self.plan.seeds)}
        return [other.title for other in self.plan.comparisons if other is not comp
                and not self.unread(other)
                and any(self.path(other, c, s) in mine for c in other.curves for s in range(self.plan.seeds))]

    # -------------------------------------------------------------------------------------------------- curves

    def loss_band(self, comp: Comparison, curve: Curve, label: Optional[str] = None) -> Band:
        return band(label or curve.label, [r.curve(from_tokens=FROM_TOKENS) for r in self.runs_of(comp, curve).values()])

    def delta_band(self, row: Row) -> Band:
        """Δ val loss against tokens, paired by seed: at each evaluation, ours − reference of each seed."""
        ours, ref = self.runs_of(row.comparison, row.ours), self.runs_of(row.comparison, row.ref)
        curves = []
        for s in sorted(set(ours) & set(ref)):
            a, b = ours[s].curve(from_tokens=FROM_TOKENS), ref[s].curve(from_tokens=FROM_TOKENS)
            curves.append({x: a[x] - b[x] for x in a if x in b})
        return band(row.label, curves, of=row.ours.label)


def band(label: str, curves: list[dict[int, float]], of: str = "") -> Band:
    """The mean and interval over `curves` (one per seed) at the token counts every one of them has."""
    xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return Band(label, xs, [stat([c[x] for c in curves]) for x in xs], of)


def lr_curve(comp: Comparison, design: str, lr: str) -> Curve:
    """An lr grid's curve of `design` ("baseline", "none", "unified") at `lr` (its label: "<design> lr <lr>")."""
    return next(c for c in comp.curves if c.label == f"{design} lr {lr}")


def rung_label(curve: Curve) -> str:
    """A ladder curve's shape: "baseline d64 L4" → "d64 L4"."""
    return curve.label.split(" ", 1)[1]

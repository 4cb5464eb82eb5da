"""What the runs measured, per comparison of the plan (repro/comparisons.py): final losses, paired deltas with their
verdicts, Δ-loss curves over training, and which rows and runs are shared between comparisons.

A *row* is one delta of the page: ours − reference in the final validation loss, paired by seed. Two rows that read
the same pair of run directories for every seed are one measurement (Fig. 1's "each at its best lr" when both best
lrs are the "same lr" pair): the page shows it once and counts it once. A run directory read by several comparisons
(Fig. 5's baseline is Fig. 1's at lr 4e-3 and a rung of Fig. 6's ladder) is one run, marked where it is shared.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from repro.comparisons import FIG1_BEST_LR, FIG1_SAME_LR, Comparison, Curve, Plan, lr_text
from repro.runs import Run, load_run
from repro.stats import Stat, stat, verdict

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

    def delta(self, comp: Comparison, curve: Curve, ref: Curve, metric: str = "val_loss") -> Optional[Stat]:
        a, b = self.finals(comp, curve, metric), self.finals(comp, ref, metric)
        return stat([a[s] - b[s] for s in sorted(a) if s in b])

    @property
    def loaded(self) -> list[Run]:
        return [r for r in self._runs.values() if r is not None]

    # ------------------------------------------------------------------------------------------------ rows

    def row(self, comp: Comparison, label: str, ours: Curve, ref: Curve, paper: Optional[float]) -> Row:
        runs = tuple((self.path(comp, ours, s), self.path(comp, ref, s)) for s in range(self.plan.seeds))
        return Row(comp, label, ours, ref, paper, self.delta(comp, ours, ref), self.delta(comp, ours, ref, self.wiki),
                   runs)

    def best_lr(self, comp: Comparison, model: str) -> Optional[str]:
        """Fig. 1: the lr of the grid where `model` ("baseline" or "none") ends lowest, mean over seeds."""
        means = {lr_text(lr): self.final(comp, lr_curve(comp, model, lr_text(lr))) for lr in self.plan.lrs}
        means = {lr: s.mean for lr, s in means.items() if s is not None}
        return min(means, key=means.get) if means else None

    def same_lr(self) -> str:
        """Fig. 1's "same lr": the paper's 4e-3 when the grid has it, else the grid's middle."""
        lrs = [lr_text(lr) for lr in self.plan.lrs]
        return lr_text(4e-3) if lr_text(4e-3) in lrs else lrs[len(lrs) // 2]

    def comparison_rows(self, comp: Comparison) -> list[Row]:
        """Before deduplication: every delta the comparison reads, in its table's order."""
        if comp.kind == "lr_grid":  # without − with scale vectors (docs/paper.md §4.1)
            same = self.same_lr()
            out = [self.row(comp, f"same lr ({same})", lr_curve(comp, "none", same), lr_curve(comp, "baseline", same),
                            FIG1_SAME_LR)]
            best_none, best_base = self.best_lr(comp, "none"), self.best_lr(comp, "baseline")
            if best_none and best_base:
                out.append(self.row(comp, f"each at its best lr (none {best_none}, baseline {best_base})",
                                    lr_curve(comp, "none", best_none), lr_curve(comp, "baseline", best_base),
                                    FIG1_BEST_LR))
            return out
        if comp.kind == "ladder":
            return [self.row(comp, rung_label(base), uni, base, uni.paper_delta) for base, uni in comp.rungs]
        ref = comp.curves[0]
        return [self.row(comp, c.label, c, ref, c.paper_delta) for c in comp.curves[1:]]

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

    # ---------------------------------------------------------------------------------------------- shared runs

    def readers(self, comp: Comparison, curve: Curve) -> list[str]:
        """The other comparisons that read any of this curve's run directories, in plan order."""
        mine = {self.path(comp, curve, s) for s in range(self.plan.seeds)}
        return [other.title for other in self.plan.comparisons if other is not comp
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


def lr_curve(comp: Comparison, model: str, lr: str) -> Curve:
    """Fig. 1's curve of `model` ("baseline" or "none") at `lr` (its label: "<model> lr <lr>")."""
    return next(c for c in comp.curves if c.label == f"{model} lr {lr}")


def rung_label(curve: Curve) -> str:
    """A ladder curve's shape: "baseline d64 L4" → "d64 L4"."""
    return curve.label.split(" ", 1)[1]

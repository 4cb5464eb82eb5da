"""Compute scaling laws per strategy, as in Figs. 6 and 7: fit L = a·C^b to each strategy's final validation losses and
report the equal-loss compute multiplier against a reference strategy.

    python -m scripts.scaling_law runs/0.12b+baseline runs/0.25b+baseline ... runs/1b+unified --out law.png
    python -m scripts.scaling_law --points markers.csv          # rows: strategy,C,loss (C in PFLOP/s-days)

C = 6·N·D / 8.64e19 PFLOP/s-days, with D the tokens seen at the final evaluation and N the parameters without
the input embedding — for MoE all of them, not the activated ones (PAPER.md §3.6: the paper's compute axis).
Each run is labeled by the preset whose strategy it used (configs/scale/), or "custom".

The multiplier at loss L is C_ref(L) / C_new(L), with C(L) = (L/a)^(1/b) from each fit: how much more compute the
reference strategy needs to reach the loss the other reaches. It is evaluated at the reference's own final losses
and reported as their geometric mean and range (a single number when the two exponents are equal, PAPER.md §4.5).
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PFLOPS_DAY = 8.64e19  # FLOPs in one PFLOP/s-day


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


def pflops_days(n_params: int, tokens: float) -> float:
    return 6.0 * n_params * tokens / PFLOPS_DAY


def compute_params(cfg) -> int:
    """N of the compute axis: every parameter but the input embedding (total, not activated, for MoE)."""
    import torch

    from config import resolve_vocab
    from model.llama import Llama
    with torch.device("meta"):
        return Llama(resolve_vocab(cfg)).num_params(exclude_embedding=True)


def points_from_runs(run_dirs: list[Path]) -> dict[str, list[tuple[float, float]]]:
    from scripts.runs import load_run
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for path in run_dirs:
        run = load_run(path)
        if run.final_val_loss is None:
            raise ValueError(f"{path} has no evaluation in metrics.jsonl yet")
        if not run.finished:
            print(f"warning: {path} stopped at step {run.final_eval['step']} of {run.cfg.train.steps}; "
                  "using its last evaluation", file=sys.stderr)
        points[run.strategy].append((pflops_days(compute_params(run.cfg), run.final_tokens), run.final_val_loss))
    return points


def points_from_csv(path: Path) -> dict[str, list[tuple[float, float]]]:
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            points[row["strategy"]].append((float(row["C"]), float(row["loss"])))
    return points


@dataclass
class LawReport:
    fits: dict[str, PowerLaw]
    multipliers: dict[str, list[float]]  # strategy → at each reference loss

    def geometric_mean(self, strategy: str) -> float:
        m = self.multipliers[strategy]
        return math.exp(sum(map(math.log, m)) / len(m))


def analyze(points: dict[str, list[tuple[float, float]]], reference: str) -> LawReport:
    if reference not in points:
        raise ValueError(f"no runs of the reference strategy {reference!r}; strategies found: {sorted(points)} "
                         "(choose one with --reference)")
    fits = {name: fit_power_law([c for c, _ in pts], [L for _, L in pts]) for name, pts in points.items()}
    ref_losses = [L for _, L in sorted(points[reference])]
    multipliers = {name: compute_multiplier(fits[reference], fit, ref_losses)
                   for name, fit in fits.items() if name != reference}
    return LawReport(fits, multipliers)


def plot(points: dict[str, list[tuple[float, float]]], report: LawReport, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4.5))
    lo = min(c for pts in points.values() for c, _ in pts)
    hi = max(c for pts in points.values() for c, _ in pts)
    grid = np.geomspace(lo / 1.5, hi * 1.5, 50)
    for name, pts in sorted(points.items()):
        fit = report.fits[name]
        line = ax.plot([c for c, _ in pts], [L for _, L in pts], "o", label=f"{name}: {fit.a:.4f}·C^{fit.b:.4f}")[0]
        ax.plot(grid, [fit.loss(c) for c in grid], "--", color=line.get_color(), alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("compute C (PFLOP/s-days)")
    ax.set_ylabel("validation loss")
    title = ", ".join(f"{name}: {report.geometric_mean(name):.2f}× compute" for name in sorted(report.multipliers))
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", type=Path, help="run directories (config.yaml + metrics.jsonl)")
    p.add_argument("--points", type=Path, help="a CSV with columns strategy,C,loss instead of run directories")
    p.add_argument("--reference", default="baseline", help="the strategy the others are compared to")
    p.add_argument("--out", type=Path, help="plot both fits in log-log (png/svg/pdf)")
    args = p.parse_args(argv)
    if bool(args.runs) == bool(args.points):
        p.error("give run directories or --points, not both or neither")
    try:
        points = points_from_csv(args.points) if args.points else points_from_runs(args.runs)
        report = analyze(points, args.reference)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'strategy':<14}{'points':>7}{'a':>10}{'b':>10}   compute multiplier vs {args.reference}")
    for name in sorted(points):
        fit = report.fits[name]
        if name == args.reference:
            extra = "(reference)"
        else:
            m = report.multipliers[name]
            extra = f"{report.geometric_mean(name):.3f}× (from {min(m):.3f} to {max(m):.3f} over the reference's losses)"
        print(f"{name:<14}{len(points[name]):>7}{fit.a:>10.4f}{fit.b:>10.4f}   {extra}")
    if args.out:
        plot(points, report, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

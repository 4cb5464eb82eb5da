"""Compute scaling laws per strategy, as in Figs. 6 and 7: fit L = a·C^b to each strategy's final validation losses and
report the equal-loss compute multiplier against a reference strategy (repro/laws.py holds the math).

    python -m repro.scaling_law runs/0.12b+baseline runs/0.25b+baseline ... runs/1b+unified --out law.png
    python -m repro.scaling_law --points markers.csv            # rows: strategy,C,loss (C in PFLOP/s-days)

C = 6·N·D / 8.64e19 PFLOP/s-days, with D the tokens seen at the final evaluation and N the parameters without
the input embedding — for MoE all of them, not the activated ones (docs/paper.md §3.6: the paper's compute axis).
Each run is labeled by the preset whose strategy it used (configs/scale/), or "custom".

The multiplier at loss L is C_ref(L) / C_new(L), with C(L) = (L/a)^(1/b) from each fit: how much more compute the
reference strategy needs to reach the loss the other reaches. It is evaluated at the reference's own final losses
and reported as their geometric mean and range (a single number when the two exponents are equal, docs/paper.md §4.5).
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from pathlib import Path

from repro.laws import analyze, points_from_runs
from repro.plotting import plot_law
from runtime.files import image_out_problem
from runs import load_run


def points_from_csv(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Rows strategy,C,loss; a row that is not a name and two positive finite numbers is a ValueError naming it."""
    points: dict[str, list[tuple[float, float]]] = {}
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a text CSV ({e.reason} at byte {e.start})") from e
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not {"strategy", "C", "loss"} <= set(reader.fieldnames or ()):
        raise ValueError(f"{path}: the first row must name the columns strategy,C,loss (got {reader.fieldnames})")
    for row in reader:
        try:
            c, loss = float(row["C"]), float(row["loss"])
        except (TypeError, ValueError):  # a missing field (None) or a word
            c = loss = math.nan
        if not (row["strategy"] and 0 < c < math.inf and 0 < loss < math.inf):
            raise ValueError(f"{path}, line {reader.line_num}: {row}: give a strategy name and C and loss as "
                             "positive numbers")
        points.setdefault(row["strategy"], []).append((c, loss))
    return points


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", type=Path, help="run directories (config.yaml + metrics.jsonl)")
    p.add_argument("--points", type=Path, help="a CSV with columns strategy,C,loss instead of run directories")
    p.add_argument("--reference", default="baseline", help="the strategy the others are compared to")
    p.add_argument("--out", type=Path, help="plot both fits in log-log (png/svg/pdf)")
    args = p.parse_args(argv)
    if bool(args.runs) == bool(args.points):
        p.error("give run directories or --points, not both or neither")
    if args.points and not args.points.is_file():
        p.error(f"--points {args.points} is not a file: give a CSV with columns strategy,C,loss")
    problem = image_out_problem(args.out) if args.out else None
    if problem:
        p.error(f"--out {problem}")
    try:
        if args.points:
            points = points_from_csv(args.points)
        else:
            points = points_from_runs([load_run(r) for r in args.runs], warn=lambda m: print(m, file=sys.stderr))
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
        title = ", ".join(f"{name}: {report.geometric_mean(name):.2f}× compute" for name in sorted(report.multipliers))
        plot_law(points, report.fits, title, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

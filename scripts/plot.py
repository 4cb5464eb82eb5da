"""Plot loss curves from runs' metrics.jsonl (never from wandb).

    python -m scripts.plot runs/tiny_cpu --out docs/img/tiny_cpu.png
    python -m scripts.plot runs/a runs/b --metric val_loss --x tokens --delta-to runs/a --out cmp.png

A whole figure of the paper (panels, Δ to each panel's reference, seed bands, terminal table) is drawn by
`python -m scripts.reproduce FIG` (add --plot-only to draw finished runs without running anything), with
repro/plotting.py's draw_figure.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.runs import read_metrics, series


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories")
    p.add_argument("--metric", action="append", help="metric(s) to plot (default: loss and val_loss)")
    p.add_argument("--x", default="tokens", choices=["tokens", "step"])
    p.add_argument("--delta-to", type=Path, help="plot each run's metric minus this run's (on shared x values)")
    p.add_argument("--log-x", action="store_true", help="x on a log axis")
    p.add_argument("--out", type=Path, required=True, help="output image (png/pdf/svg)")
    args = p.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = args.metric or ["loss", "val_loss"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ref = read_metrics(args.delta_to) if args.delta_to else None
    for run in args.runs:
        recs = read_metrics(run)
        for metric in metrics:
            xs, ys = series(recs, metric, args.x)
            if ref is not None:
                base = dict(zip(*series(ref, metric, args.x)))
                xs, ys = [x for x in xs if x in base], [y - base[x] for x, y in zip(xs, ys) if x in base]
            ax.plot(xs, ys, label=f"{run.name} {metric}", marker="o" if metric.startswith("val") else None,
                    markersize=3)
    ax.set_xlabel(args.x)
    if args.log_x:
        ax.set_xscale("log")
    ax.set_ylabel("Δ loss" if ref is not None else "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


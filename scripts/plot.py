"""Plot loss curves from runs' metrics.jsonl (never from wandb).

    python -m scripts.plot runs/tiny_cpu --out docs/img/tiny_cpu.png
    python -m scripts.plot runs/a runs/b --metric val_loss --x tokens --delta-to runs/a --out cmp.png

A whole figure of the paper (panels, Δ to each panel's reference, seed bands, terminal table) is drawn by
`python -m scripts.reproduce FIG` (add --plot-only to draw finished runs without running anything).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.runs import read_metrics


def series(records: list[dict], metric: str, x: str) -> tuple[list[float], list[float]]:
    pts = [(r[x], r[metric]) for r in records if r.get(metric) is not None and x in r]
    return [p[0] for p in pts], [p[1] for p in pts]


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


# ------------------------------------------------------------------------------------------------ paper figures

def _mean_curve(runs, metric: str = "val_loss", from_tokens: int = 0) -> tuple[list[float], list[list[float]]]:
    """Token points (from `from_tokens` on) shared by every seed, and each seed's values there."""
    curves = [dict(zip(*series(r.records, metric, "tokens"))) for r in runs]
    xs = sorted(x for x in set.intersection(*(set(c) for c in curves)) if x >= from_tokens) if curves else []
    return xs, [[c[x] for x in xs] for c in curves]


def _stats(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return mean, sd


def terminal_table(figure, runs: dict) -> str:
    """Markdown: per panel and curve, the final val loss (mean ± sd over seeds) and its delta to the panel's
    reference, paired by seed (seeds in the same order)."""
    lines = [f"## Fig. {figure.number}: {figure.title}", "",
             "| panel | curve | seeds | final val loss | Δ vs reference |", "|---|---|---|---|---|"]
    for panel in figure.panels:
        ref = [r.final_val_loss for r in runs[panel.curves[0]]]
        for curve in panel.curves:
            final = [r.final_val_loss for r in runs[curve]]
            m, sd = _stats(final)
            if curve == panel.curves[0]:
                delta = "(reference)"
            else:
                dm, dsd = _stats([a - b for a, b in zip(final, ref)])
                delta = f"{dm:+.4f} ± {dsd:.4f}"
            lines.append(f"| {panel.title} | {curve} | {len(final)} | {m:.4f} ± {sd:.4f} | {delta} |")
    return "\n".join(lines) + "\n"


def draw_figure(figure, runs: dict, out_dir: Path, log_x: bool = False, name: str | None = None,
                formats: tuple[str, ...] = ("png", "svg"), table: bool = True, from_tokens: int = 0) -> list[Path]:
    """A figure in the paper's arrangement, one row per panel: validation loss against tokens (left) and its Δ to
    the panel's reference (right, as Figs. 1 and 5), each curve the mean over seeds with a min–max band. `runs` maps
    each of the figure's run names to its Run objects (one per seed). Writes PNG, SVG and the terminal table.
    `from_tokens` drops earlier evaluations (1: the step-0 loss at init, which would set the Δ plot's scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = figure.panels
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.6 * len(panels)), squeeze=False)
    for row, panel in zip(axes, panels):
        ref_x, ref_ys = _mean_curve(runs[panel.curves[0]], from_tokens=from_tokens)
        for curve in panel.curves:
            xs, ys = _mean_curve(runs[curve], from_tokens=from_tokens)
            mean = [sum(col) / len(col) for col in zip(*ys)]
            line = row[0].plot(xs, mean, label=curve)[0]
            if len(ys) > 1:
                row[0].fill_between(xs, [min(c) for c in zip(*ys)], [max(c) for c in zip(*ys)],
                                    color=line.get_color(), alpha=0.2)
            shared = [i for i, x in enumerate(xs) if x in set(ref_x)]
            where = {x: j for j, x in enumerate(ref_x)}
            deltas = [[y[i] - r[where[xs[i]]] for i in shared] for y, r in zip(ys, ref_ys)]
            dx = [xs[i] for i in shared]
            dmean = [sum(col) / len(col) for col in zip(*deltas)]
            row[1].plot(dx, dmean, color=line.get_color(), label=curve)
            if len(deltas) > 1:
                row[1].fill_between(dx, [min(c) for c in zip(*deltas)], [max(c) for c in zip(*deltas)],
                                    color=line.get_color(), alpha=0.2)
        row[0].set_title(f"Fig. {figure.number} — {panel.title}", fontsize=10)
        row[1].set_title(f"Δ val loss vs {panel.curves[0]}", fontsize=10)
        row[1].axhline(0.0, color="gray", lw=0.8)
        for ax in row:
            ax.set_xlabel("tokens")
            if log_x:
                ax.set_xscale("log")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        row[0].set_ylabel("validation loss")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    name = name or f"fig{figure.number}"
    paths = [out_dir / f"{name}.{fmt}" for fmt in formats]
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    if not table:
        return paths
    table_path = out_dir / f"{name}_terminal.md"
    table_path.write_text(terminal_table(figure, runs))
    print(table_path.read_text())
    return [*paths, table_path]

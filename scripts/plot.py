"""Plot loss curves from runs' metrics.jsonl (never from wandb).

    python -m scripts.plot runs/tiny_cpu --out docs/img/tiny_cpu.png
    python -m scripts.plot runs/a runs/b --metric val_loss --x tokens --delta-to runs/a --out cmp.png
    python -m scripts.plot runs/a --metric headroom --out headroom.png     # DNP's inner Norms against their eps

`headroom` is each eval's smallest inner-Norm headroom (input mean square / eps; `headroom/L3/attn.q_proj` one site),
drawn on a log axis with the warning threshold (log.headroom_warn's default, 1) dashed.

A whole figure of the paper (panels, Δ to each panel's reference, seed bands, terminal table) is drawn by
`python -m repro.reproduce FIG` (add --plot-only to draw finished runs without running anything), with
repro/plotting.py's draw_figure.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.files import image_out_problem
from runs import HEADROOM, HEADROOM_PREFIX, MetricsError, read_metrics, series


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories")
    p.add_argument("--metric", action="append", help="metric(s) to plot (default: loss and val_loss)")
    p.add_argument("--x", default="tokens", choices=["tokens", "step"])
    p.add_argument("--delta-to", type=Path, help="plot each run's metric minus this run's (on shared x values)")
    p.add_argument("--log-x", action="store_true", help="x on a log axis")
    p.add_argument("--out", type=Path, required=True, help="output image (png/pdf/svg)")
    args = p.parse_args(argv)
    problem = image_out_problem(args.out)
    if problem:
        p.error(f"--out {problem}")
    try:
        ref = read_metrics(args.delta_to) if args.delta_to else None
        records = [(run, read_metrics(run)) for run in args.runs]
    except (FileNotFoundError, MetricsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    metrics = args.metric or ["loss", "val_loss"]
    log_y = [m == HEADROOM or m.startswith(HEADROOM_PREFIX) for m in metrics]
    if any(log_y) and not all(log_y):
        p.error("--metric headroom (or headroom/...) goes on a log axis: plot it apart from the losses")
    found = {m for _, recs in records for m in metrics if series(recs, m, args.x)[0]}
    missing = [m for m in args.metric or [] if m not in found]
    if missing or not found:
        known = sorted({k for _, recs in records for r in recs for k, v in r.items()
                        if isinstance(v, float) and ("/" not in k or k.startswith("val_loss/"))}
                       | {HEADROOM for _, recs in records for r in recs for k in r if k.startswith(HEADROOM_PREFIX)})
        have = f"metrics found: {', '.join(known)}" if known else "no records yet (has the run logged a step?)"
        print(f"error: no record of {', '.join(map(str, args.runs))} has {' or '.join(missing or metrics)} with "
              f"{args.x}; {have}", file=sys.stderr)
        return 2
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, recs in records:
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
    if all(log_y):
        ax.set_yscale("log")
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="warning threshold")
        ax.set_ylabel("input mean square / eps")
    else:
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


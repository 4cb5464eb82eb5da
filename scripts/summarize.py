"""Final validation loss of runs side by side, best marked — the end of an lr sweep, or any set of runs.

    python -m scripts.summarize runs/sweep-0.12b/*            # one row per run directory
    python -m scripts.summarize --check-finished RUN          # exit 0 if RUN reached train.steps, else 1

Reads only config.yaml and metrics.jsonl. A run that has not reached train.steps is listed with its last evaluation
and its progress, and is never marked best. `headroom` is the run's smallest DNP inner-Norm headroom (input mean
square / eps, over its evaluations and sites); a run where one fell below log.headroom_warn is marked, with the site.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from strictconfig.config import ConfigError
from runs import MetricsError, Run, load_run


def table(runs: list[Run]) -> str:
    finished = [r for r in runs if r.finished and r.final_val_loss is not None]
    best = min(finished, key=lambda r: r.final_val_loss) if finished else None
    width = max(12, *(len(r.path.name) + 2 for r in runs))
    lines = [f"{'run':<{width}}{'strategy':<12}{'optim':<7}{'lr':>9}{'steps':>15}{'tokens':>16}{'val_loss':>10}"
             f"{'headroom':>10}"]
    for r in sorted(runs, key=lambda r: (r.cfg.optim.lr, r.path.name)):
        step = r.last_step
        loss = f"{r.final_val_loss:.4f}" if r.final_val_loss is not None else "-"
        low = r.lowest_headroom
        mark = "  ← best" if r is best else ("" if r.finished else "  (unfinished)")
        if r.stopped_normalizing:
            mark += f"  ← {low.site} stopped normalizing at step {low.step}"
        lines.append(f"{r.path.name:<{width}}{r.strategy:<12}{r.cfg.optim.name:<7}{r.cfg.optim.lr:>9.2e}"
                     f"{f'{step}/{r.cfg.train.steps}':>15}{r.final_tokens:>16,}{loss:>10}"
                     f"{'-' if low is None else f'{low.value:.1e}':>10}{mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", type=Path, help="run directories")
    p.add_argument("--check-finished", type=Path, metavar="RUN", help="exit 0 if RUN finished, 1 if not")
    args = p.parse_args(argv)
    if args.check_finished:
        try:
            return 0 if load_run(args.check_finished).finished else 1
        except (FileNotFoundError, ConfigError, MetricsError):  # not a run (yet), or one train.py will rewrite
            return 1
    runs = []
    for path in args.runs:
        try:
            runs.append(load_run(path))
        except (FileNotFoundError, ConfigError, MetricsError) as e:
            print(f"skipping {path}: {e}", file=sys.stderr)
    if not runs:
        print("error: no run directories with config.yaml and metrics.jsonl", file=sys.stderr)
        return 2
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

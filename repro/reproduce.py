"""Every run of one of the paper's figures, then the figure: at the paper's scale on GPUs, or as a CPU proxy.

    python -m repro.reproduce 5 --dry-run                      # the torchrun command of every run of Fig. 5
    python -m repro.reproduce 5 --scale tiny --seeds 3         # run them as CPU proxies, 3 seeds each, and draw
    python -m repro.reproduce 10 --scale tiny -- log.wandb.mode=disabled     # key=value after -- goes to every run
    NPROC=8 python -m repro.reproduce 6 --out-dir runs         # the paper's Fig. 6 on one 8-GPU machine

Runs come from configs/figures/fig<N>/ (repro/figures.py lists their panels). Each (run, seed) has its own run
directory, `<out-dir>/<run name>[-tiny][-s<seed>]`: a finished one is skipped and an unfinished one resumes, so the
same command continues an interrupted reproduction. At the end the figure is drawn from the runs' metrics.jsonl
(scripts/plot.py: curves, Δ-loss against each panel's reference, mean and band over seeds, the terminal-delta table).

--scale tiny layers repro/configs/tiny.yaml over each run (the built-in corpus in a 1,024-token BPE, sequences of
256, compiled bf16) at the run's proxy shape (repro/proxy.py: width d_model/12 rounded to a multiple of 32, heads of
32; Llama-0.12B → d 64, 4 layers), with its batch and steps sized to 10.5 tokens per compute parameter in ≥ 1,000
steps: the same comparisons at a size where one dense run takes one to two minutes on 2 CPU cores.
`python -m repro.results` runs the measured reproduction of repro/pages/results.md on this proxy.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from config import load_config

from strictconfig.config import ConfigError
from repro.figures import FIGURES
from repro.jobs import command, jobs, run_jobs, shown
from runtime.files import out_path_problem


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("figure", choices=[*sorted(FIGURES, key=int), "all"],
                   help="the paper's figure number, or all: every figure, a run that several read trained once")
    p.add_argument("--scale", choices=["paper", "tiny"], default="paper")
    p.add_argument("--seeds", type=int, default=1, help="runs per curve, seeds 0..N-1 (init and data order)")
    p.add_argument("--out-dir", default="runs", help="parent of the run directories")
    p.add_argument("--plot-dir", type=Path, help="where the figure goes (default: <out-dir>/fig<N>[-tiny]; with all, "
                                                 "<plot-dir>/fig<N>[-tiny])")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--plot-only", action="store_true", help="draw the figure from the runs as they are, run nothing")
    p.add_argument("--log-x", action="store_true", help="tokens on a log axis")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (after --)")
    args = p.parse_intermixed_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"{bad[0]!r} is not a key=value override: what follows -- goes to every run, e.g. train.steps=100")
    for flag, path in (("--out-dir", args.out_dir), ("--plot-dir", args.plot_dir)):
        problem = out_path_problem(path, "folder") if path else None
        if problem:
            p.error(f"{flag} {problem}")
    nproc_text = os.environ.get("NPROC", "8")
    if not nproc_text.isdigit() or int(nproc_text) < 1:
        p.error(f"NPROC={nproc_text!r}: give the processes per node (GPUs) as a whole number ≥ 1")
    nproc = int(nproc_text)
    figs = list(FIGURES.values()) if args.figure == "all" else [FIGURES[args.figure]]
    try:
        per_fig = {f.number: jobs(f, args.scale, args.seeds, args.out_dir, args.overrides) for f in figs}
        # a run directory that several figures read (paper scale: repro/paper.py) is trained once
        todo = list({job.run_name: job for js in per_fig.values() for job in js}.values())
        for job in todo:  # every run's config must load before anything starts
            load_config([a for a, b in zip(job.argv[1:], job.argv) if b == "--config"],
                        [a for a in job.argv if "=" in a and not a.startswith("--")])
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for job in todo:
            print(shown(command(job, args.scale, nproc)))
        if len(figs) > 1:
            print(f"{len(todo)} runs for the {sum(map(len, per_fig.values()))} runs of Figs. "
                  f"{', '.join(per_fig)}; `python -m repro.plan` gives their data and compute", file=sys.stderr)
        return 0

    code = 0 if args.plot_only else run_jobs(todo, args.out_dir, args.scale, nproc)
    if code != 0:
        return code

    from repro.plotting import draw_figure
    from runs import MetricsError, load_run
    for fig in figs:
        runs = {}
        for job in per_fig[fig.number]:
            try:
                runs.setdefault(job.run, []).append(load_run(Path(args.out_dir) / job.run_name))
            except FileNotFoundError as e:
                print(f"error: {e} (run the same command without --plot-only first)", file=sys.stderr)
                return 2
            except (ConfigError, MetricsError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        name = f"fig{fig.number}" + ("-tiny" if args.scale == "tiny" else "")
        plot_dir = (args.plot_dir / name if len(figs) > 1 else args.plot_dir) if args.plot_dir else None
        for path in draw_figure(fig, runs, plot_dir or Path(args.out_dir) / name, log_x=args.log_x):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every run of one of the paper's figures, then the figure: at the paper's scale on GPUs, or as a CPU proxy.

    python -m scripts.reproduce 5 --dry-run                    # the torchrun command of every run of Fig. 5
    python -m scripts.reproduce 5 --scale tiny --seeds 3       # run them as CPU proxies, 3 seeds each, and draw
    python -m scripts.reproduce 10 --scale tiny -- log.wandb.mode=disabled   # key=value after -- goes to every run
    NPROC=8 python -m scripts.reproduce 6 --out-dir runs       # the paper's Fig. 6 on one 8-GPU machine

Runs come from configs/figures/fig<N>/ (scripts/figures.py lists their panels). Each (run, seed) has its own run
directory, `<out-dir>/<run name>[-tiny][-s<seed>]`: a finished one is skipped and an unfinished one resumes, so the
same command continues an interrupted reproduction. At the end the figure is drawn from the runs' metrics.jsonl
(scripts/plot.py: curves, Δ-loss against each panel's reference, mean and band over seeds, the terminal-delta table).

--scale tiny layers configs/proxy/tiny.yaml over each run (the built-in corpus, 16 × 256-token batches, compiled
bf16) with a width of d_model/6 rounded to a multiple of 32 (Llama-0.12B → 128, heads of 32) and 4.69e-5 of the
paper's tokens (Llama-0.12B's 20k steps → 120): the same comparisons at a size where one run takes about a minute
on 2 CPU cores. `python -m scripts.results` runs the measured reproduction of docs/results.md on this proxy.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from config import ConfigError, load_config
from scripts.figures import FIGURES, Figure

TINY = Path("configs/proxy/tiny.yaml")
TINY_TOKEN_FRACTION = 120 * 16 * 256 / (20_000 * 512 * 1024)  # Llama-0.12B: 20k steps → 120
TINY_HEAD_DIM = 32


@dataclass(frozen=True)
class Job:
    run: str  # the figure's run name (configs/figures/fig<N>/<run>.yaml)
    seed: int
    run_name: str
    argv: list[str]  # train.py's arguments


def jobs(fig: Figure, scale: str, seeds: int, out_dir: str, overrides: list[str] = ()) -> list[Job]:
    return [make_job(fig, run, scale, seed, seeds, out_dir, overrides) for run in fig.runs for seed in range(seeds)]


def make_job(fig: Figure, run: str, scale: str, seed: int, seeds: int, out_dir: str, overrides: list[str] = (),
             suffix: str = "") -> Job:
    """One (run, seed) of a figure. `overrides` come last (they win over the proxy's sizes); `suffix` tells apart
    the run directories of a run changed by them (scripts/results.py's lr grid: "-lr2e-3")."""
    path = Path(os.path.relpath(fig.config(run)))  # as a user would type it from the repository root
    cfg = load_config(path)
    name = cfg.log.run_name + ("-tiny" if scale == "tiny" else "") + suffix + (f"-s{seed}" if seeds > 1 else "")
    argv = ["--config", str(path)]
    extra = [f"log.out_dir={out_dir}", f"log.run_name={name}"]
    if scale == "tiny":
        argv += ["--config", str(TINY)]
        extra += [*tiny_sizes(cfg), f"log.wandb.group=fig{fig.number}-tiny"]
    if seeds > 1:
        extra.append(f"train.seed={seed}")
    return Job(run, seed, name, argv + extra + list(overrides))


def tiny_sizes(cfg) -> list[str]:
    """The proxy's width, heads and steps for a paper run: width d_model/6 rounded to a multiple of 32 (heads of 32;
    Llama-0.12B → 128), and 4.69e-5 of the run's tokens in the proxy's batches (Llama-0.12B's 10.5B → 120 steps of
    16 × 256; a 4 × 512-sequence run gets 4 × the steps). A d_ffn the run sets keeps its offset from the default
    int(8d/3) (Fig. 10's Llama-large: + 8)."""
    d = max(64, TINY_HEAD_DIM * round(cfg.model.d_model / 6 / TINY_HEAD_DIM))
    tiny = load_config(TINY)
    tokens = cfg.train.steps * cfg.train.global_batch * cfg.data.seq_len * TINY_TOKEN_FRACTION
    steps = max(30, round(tokens / (tiny.train.global_batch * tiny.data.seq_len)))
    out = [f"model.d_model={d}", f"model.n_heads={d // TINY_HEAD_DIM}", f"train.steps={steps}"]
    if cfg.model.d_ffn is not None:
        out.append(f"model.d_ffn={int(8 * d / 3) + cfg.model.d_ffn - int(8 * cfg.model.d_model / 3)}")
    return out


def command(job: Job, scale: str, nproc: int) -> list[str]:
    """What runs here: this interpreter, under torch.distributed.run (torchrun's module) for several processes, so a
    `venv/bin/python -m scripts.reproduce` never picks up another environment's `torchrun` from PATH."""
    if scale == "tiny" or nproc == 1:
        return [sys.executable, "train.py", *job.argv]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "train.py", *job.argv]


def shown(cmd: list[str]) -> str:
    """A command as a user types it: `python train.py …` or `torchrun --nproc_per_node=N train.py …`."""
    if cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]:
        return shlex.join(["torchrun", *cmd[3:]])
    return shlex.join(["python" if cmd[0] == sys.executable else cmd[0], *cmd[1:]])


def launch(cmd: list[str]) -> int:
    """One run in its own process (a fresh process group, allocator and compile cache per run)."""
    return subprocess.run(cmd).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("figure", choices=sorted(FIGURES, key=int), help="the paper's figure number")
    p.add_argument("--scale", choices=["paper", "tiny"], default="paper")
    p.add_argument("--seeds", type=int, default=1, help="runs per curve, seeds 0..N-1 (init and data order)")
    p.add_argument("--out-dir", default="runs", help="parent of the run directories")
    p.add_argument("--plot-dir", type=Path, help="where the figure goes (default: <out-dir>/fig<N>[-tiny])")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--plot-only", action="store_true", help="draw the figure from the runs as they are, run nothing")
    p.add_argument("--log-x", action="store_true", help="tokens on a log axis")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (after --)")
    args = p.parse_intermixed_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    fig = FIGURES[args.figure]
    nproc = int(os.environ.get("NPROC", "8"))
    try:
        todo = jobs(fig, args.scale, args.seeds, args.out_dir, args.overrides)
        for job in todo:  # every run's config must load before anything starts
            load_config([a for a, b in zip(job.argv[1:], job.argv) if b == "--config"],
                        [a for a in job.argv if "=" in a and not a.startswith("--")])
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for job in todo:
            print(shown(command(job, args.scale, nproc)))
        return 0

    from scripts.runs import load_run
    for i, job in enumerate([] if args.plot_only else todo, 1):
        run_dir = Path(args.out_dir) / job.run_name
        if (run_dir / "config.yaml").exists() and load_run(run_dir).finished:
            print(f"[{i}/{len(todo)}] {job.run_name}: finished, skipped")
            continue
        print(f"[{i}/{len(todo)}] {job.run_name}", flush=True)
        code = launch(command(job, args.scale, nproc))
        if code != 0:
            print(f"error: {job.run_name} failed (exit {code}); run the same command again to resume",
                  file=sys.stderr)
            return code

    from scripts.plot import draw_figure
    runs = {}
    for job in todo:
        try:
            runs.setdefault(job.run, []).append(load_run(Path(args.out_dir) / job.run_name))
        except FileNotFoundError as e:
            print(f"error: {e} (run the same command without --plot-only first)", file=sys.stderr)
            return 2
    plot_dir = args.plot_dir or Path(args.out_dir) / (f"fig{fig.number}" + ("-tiny" if args.scale == "tiny" else ""))
    for path in draw_figure(fig, runs, plot_dir, log_x=args.log_x):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

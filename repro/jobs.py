"""A figure's runs as jobs: one (run, seed) each, its run directory, train.py's arguments, and the command that runs
it here. `python -m repro.reproduce` runs a figure's jobs and `python -m repro.results` (repro/runner.py) the
jobs of repro/pages/results.md; both build them here, so a run directory has one name whichever command trains it.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from config import load_config

from strictconfig.config import ConfigError
from repro.figures import FIGURES, Figure
from repro.paper import canonical
from repro.proxy import PROXY, Shape, run_overrides


@dataclass(frozen=True)
class Job:
    run: str  # the figure's run name (configs/figures/fig<N>/<run>.yaml)
    seed: int
    run_name: str
    argv: list[str]  # train.py's arguments


def jobs(fig: Figure, scale: str, seeds: int, out_dir: str, overrides: list[str] = ()) -> list[Job]:
    return [make_job(fig, run, scale, seed, seeds, out_dir, overrides) for run in fig.runs for seed in range(seeds)]


def make_job(fig: Figure, run: str, scale: str, seed: int, seeds: int, out_dir: str, overrides: list[str] = (),
             suffix: str = "", shape: Optional[Shape] = None, horizon: float = 1.0) -> Job:
    """One (run, seed) of a figure. At paper scale a run that is the same experiment as an earlier figure's trains
    as that one, in its run directory (repro/paper.py: Fig. 5's baseline is fig1-baseline). At --scale tiny the run
    becomes its CPU proxy (repro/proxy.py) at `shape` (default: the run's own proxy shape). `overrides` come last
    (they win over the proxy's sizes); `suffix` tells apart the run directories of a run changed by them or by
    `shape` (repro/comparisons.py: "-lr2e-3", "-d32L4"); `horizon` multiplies the proxy's tokens (repro/proxy.py,
    `size`)."""
    home = fig.config(run)
    if scale == "paper":
        number, first = canonical(fig.number, run, tuple(overrides))
        home = FIGURES[number].config(first)
    path = Path(os.path.relpath(home))  # as a user would type it from the repository root
    cfg = load_config(path)
    name = cfg.log.run_name + ("-tiny" if scale == "tiny" else "") + suffix + (f"-s{seed}" if seeds > 1 else "")
    argv = ["--config", str(path)]
    extra = [f"log.out_dir={out_dir}", f"log.run_name={name}"]
    if scale == "tiny":
        reference = next(p.curves[0] for p in fig.panels if run in p.curves)
        factor = cfg.train.steps / load_config(fig.config(reference)).train.steps
        argv += ["--config", str(PROXY)]
        extra += [*run_overrides(path, cfg, shape, factor, tuple(overrides), horizon), f"log.wandb.group=fig{fig.number}-tiny"]
    if seeds > 1:
        extra.append(f"train.seed={seed}")
    return Job(run, seed, name, argv + extra + list(overrides))


def command(job: Job, scale: str, nproc: int) -> list[str]:
    """What runs here: this interpreter, under torch.distributed.run (torchrun's module) for several processes, so a
    `venv/bin/python -m repro.reproduce` never picks up another environment's `torchrun` from PATH."""
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


def run_jobs(todo: list[Job], out_dir: str, scale: str, nproc: int) -> int:
    """Run each job whose run directory under `out_dir` is not finished, in order, each in a process of its own;
    stop at the first that fails and return its exit code (0: every job finished). A run directory that cannot be
    read (damaged by hand or by a disk) stops it too, with one error line and 2."""
    from runs import MetricsError, load_run
    for i, job in enumerate(todo, 1):
        run_dir = Path(out_dir) / job.run_name
        try:
            finished = (run_dir / "config.yaml").exists() and load_run(run_dir).finished
        except (ConfigError, MetricsError) as e:  # a run directory damaged by hand or by a disk
            print(f"error: {e}", file=sys.stderr)
            return 2
        if finished:
            print(f"[{i}/{len(todo)}] {job.run_name}: finished, skipped")
            continue
        print(f"[{i}/{len(todo)}] {job.run_name}", flush=True)
        code = launch(command(job, scale, nproc))
        if code != 0:
            print(f"error: {job.run_name} failed (exit {code}); run the same command again to resume",
                  file=sys.stderr)
            return code
    return 0

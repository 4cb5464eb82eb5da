"""The measured small-scale reproduction of the paper's Figures 1 and 5–9: every run, then docs/results.md.

    python -m scripts.results                       # run what is missing (4 seeds each), then write docs/results.md
    python -m scripts.results --page-only           # rewrite the page from the runs as they are, run nothing
    python -m scripts.results --page-only --archive docs/results_runs   # and keep what it read, to rewrite it later
    python -m scripts.results --restore docs/results_runs   # continue from an archive's finished runs
    python -m scripts.results --dry-run             # list the runs and their commands
    python -m scripts.results --seeds 8 -- key=value   # more seeds; key=value after -- goes to every run

Every run is a figure's run on the CPU proxy of `scripts.reproduce --scale tiny` (configs/proxy/tiny.yaml), in its
own process, with WikiText-2's test set as a second, eval-only validation set. Seeds change the init and the data
order; the curves of one comparison share each seed, so their differences are paired. A run needed by several
comparisons (Fig. 5's baseline is also Fig. 1's and the largest rung of Fig. 6's ladder) runs once. Runs go seed by
seed (every run of seed 0 first), so an interrupted reproduction already has whole comparisons at fewer seeds.

Re-running the command skips finished runs and resumes unfinished ones; a finished run whose saved config differs
from what the command would run now is an error, never silently reused. The CPU time of every run (user + system,
all its processes) accumulates in `<out-dir>/cpu_seconds.json` across invocations; the page states the total.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from config import ConfigError, resume_conflicts
from repro.comparisons import Plan
from repro.experiments import config_of, experiment_key
from repro.figures import FIGURES
from repro.runs import load_run
from scripts.reproduce import Job, command, make_job

ROOT = Path(__file__).resolve().parent.parent
WIKITEXT_SOURCE = ROOT.parent / "shared" / "data" / "wikitext-2-raw-test" / "wiki.test.raw"
WIKITEXT_URL = "https://huggingface.co/datasets/Salesforce/wikitext (config wikitext-2-raw-v1, split test)"


# ------------------------------------------------------------------------------------------------------ the runs

@dataclass
class Unique:
    """One run directory, and every (comparison curve, seed) that reads it."""
    job: Job
    key: str  # the resolved config without log.*: equal keys are the same experiment


def plan_runs(plan: Plan, out_dir: str) -> tuple[list[Unique], dict[tuple[str, int], Path]]:
    """The unique runs in running order (seed by seed), and the run directory of each (curve label path, seed)."""
    by_key: dict[str, Unique] = {}
    where: dict[tuple[str, int], Path] = {}
    for seed in range(plan.seeds):
        for comp in plan.comparisons:
            for curve in comp.curves:
                job = make_job(FIGURES[curve.figure], curve.run, "tiny", seed, plan.seeds, out_dir,
                               [*plan.overrides, *curve.overrides], curve.suffix, curve.shape)
                key = experiment_key(config_of(job.argv))
                unique = by_key.setdefault(key, Unique(job, key))
                where[(f"{comp.key}/{curve.label}", seed)] = Path(out_dir) / unique.job.run_name
    return list(by_key.values()), where


class CpuLedger:
    """CPU seconds per run directory, summed over every invocation: `<out-dir>/cpu_seconds.json`."""
    FILE = "cpu_seconds.json"

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / self.FILE
        self.seconds: dict[str, float] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def add(self, run: str, seconds: float) -> None:
        from runtime.files import atomic_write
        self.seconds[run] = self.seconds.get(run, 0.0) + seconds
        atomic_write(self.path, json.dumps(self.seconds, indent=1, sort_keys=True))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def cpu_now() -> float:
    """This process's CPU time (a run called in-process, as the tests do, counts as ours)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def launch(cmd: list[str], threads: int, log: Optional[Path] = None) -> tuple[int, float]:
    """One run in its own process with `threads` intra-op threads (OMP_NUM_THREADS, unless the caller set it), its
    output to `log` when given (several runs at once) or to ours; returns its exit code and CPU seconds — user +
    system of the process and the children it waited for (os.wait4's rusage), exact however many run at once."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    out = open(log, "a") if log else None
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        if out:
            out.close()
    return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def run_all(uniques: list[Unique], out_dir: Path, ledger: CpuLedger, jobs: int = 1) -> list[str]:
    """Run what is not finished, `jobs` at a time in plan order (each with cores // jobs threads; with several,
    each run's output goes to <out-dir>/logs/<run>.log); returns the names of runs that failed. Two single-thread
    runs side by side on 2 cores train 1.2× the tokens per second of one two-thread run (measured for the dense
    proxy: 21–23k + 17–21k against 32–35k tok/s; repro/proxy.py), and a single-thread run slows gracefully when
    other work shares the cores, where two threads of one run then wait on each other."""
    todo = []
    for i, u in enumerate(uniques, 1):
        run_dir = out_dir / u.job.run_name
        if (run_dir / "config.yaml").exists():
            conflicts = resume_conflicts((run_dir / "config.yaml").read_text(), config_of(u.job.argv))
            if conflicts:
                raise ConfigError(f"{run_dir} holds a run of another config than this command's ("
                                  + "; ".join(conflicts) + "): move it away, or give another --out-dir")
            if load_run(run_dir).finished:
                print(f"[{i}/{len(uniques)}] {u.job.run_name}: finished, skipped", flush=True)
                continue
        todo.append((i, u))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    logs = out_dir / "logs" if jobs > 1 else None
    if logs:
        logs.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    failed = []

    def one(i: int, u: Unique) -> None:
        print(f"[{i}/{len(uniques)}] {u.job.run_name}" + (f" (log: {logs / u.job.run_name}.log)" if logs else ""),
              flush=True)
        t0 = time.time()
        code, cpu = launch(command(u.job, "tiny", 1), threads, logs / f"{u.job.run_name}.log" if logs else None)
        with lock:
            ledger.add(u.job.run_name, cpu)
            print(f"    {u.job.run_name}: {time.time() - t0:.0f} s, {cpu:.0f} CPU-s", flush=True)
            if code != 0:
                print(f"error: {u.job.run_name} failed (exit {code}); the page leaves it out, and the same command "
                      "resumes it", file=sys.stderr)
                failed.append(u.job.run_name)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(one, i, u) for i, u in todo]:
            future.result()
    return failed


ARCHIVED = ("config.yaml", "metrics.jsonl")  # what the page reads of a run


def copy_run(src: Path, dest: Path) -> None:
    """What the page reads of one run (ARCHIVED), into a new directory `dest`."""
    dest.mkdir()
    for name in ARCHIVED:
        shutil.copy2(src / name, dest / name)


def archive(uniques: list[Unique], out_dir: Path, dest: Path) -> int:
    """Copy what the page reads — each finished run's config.yaml and metrics.jsonl, and the CPU ledger — to `dest`,
    replacing an earlier archive there, so that `--page-only --out-dir DEST` writes the same page from it. A `dest`
    that holds anything else is refused (it is not an archive). Returns the number of runs archived."""
    dest = Path(dest)
    if dest.exists():
        foreign = [p.name for p in dest.iterdir() if not (p.name == CpuLedger.FILE or (
            p.is_dir() and all(f.name in ARCHIVED for f in p.iterdir())))]
        if foreign:
            raise FileNotFoundError(f"{dest} holds more than run archives ({', '.join(sorted(foreign)[:3])}): give an "
                                    "empty directory or an earlier archive")
        for p in dest.iterdir():
            if p.is_dir():
                shutil.rmtree(p)
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    for u in uniques:
        run_dir = out_dir / u.job.run_name
        if (run_dir / "config.yaml").exists() and load_run(run_dir).finished:
            copy_run(run_dir, dest / u.job.run_name)
            n += 1
    if (out_dir / CpuLedger.FILE).exists():
        shutil.copy2(out_dir / CpuLedger.FILE, dest / CpuLedger.FILE)
    return n


def restore(src: Path, out_dir: Path) -> int:
    """Copy an archive's runs (what `archive` wrote) into `out_dir` where `out_dir` has no directory of that name,
    with their CPU seconds, so that the reproduction continues from them in a fresh checkout: a restored run is
    finished (its config.yaml and metrics.jsonl say so) and is skipped, never retrained. Runs already in `out_dir`
    are left as they are, and so is their ledger entry. Returns the number of runs restored."""
    src = Path(src)
    if not src.is_dir():
        raise FileNotFoundError(f"--restore {src}: no such directory (give an archive that --archive wrote)")
    ledger = CpuLedger(out_dir)
    archived = CpuLedger(src).seconds
    n = 0
    for run in sorted(p for p in src.iterdir() if p.is_dir() and all((p / f).is_file() for f in ARCHIVED)):
        if (out_dir / run.name).exists():
            continue
        copy_run(run, out_dir / run.name)
        if run.name in archived and run.name not in ledger.seconds:
            ledger.add(run.name, archived[run.name])
        n += 1
    return n


def prepare_wikitext(train_dir: str, out: Path, source: Optional[Path]) -> None:
    """WikiText-2's raw test set as an eval-only set, in the training data's tokenizer (data.prepare --eval-only)."""
    from data.config import DataConfig
    from data.prepare import prepare
    from data.shards import META_FILE
    if (out / META_FILE).is_file():
        return
    src = source or (WIKITEXT_SOURCE if WIKITEXT_SOURCE.is_file() else None)
    if src is None or not Path(src).is_file():
        raise FileNotFoundError(f"WikiText-2's test set is needed as {out}: give --wikitext PATH to its raw test "
                                f"file (wiki.test.raw, from {WIKITEXT_URL})")
    prepare(DataConfig(source=str(src), dir=str(out)), eval_only=True, like=train_dir, progress=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=4, help="runs per curve, seeds 0..N-1 (init and data order)")
    p.add_argument("--out-dir", default="runs/results", help="parent of the run directories")
    p.add_argument("--page", type=Path, default=ROOT / "docs" / "results.md", help="the page to write; its plots "
                   "go to img/results/ beside it")
    p.add_argument("--lrs", default="2e-3,4e-3,8e-3", help="Fig. 1's lr grid, for both models")
    p.add_argument("--wikitext", type=Path, help="WikiText-2's raw test file (default: ../shared's copy)")
    p.add_argument("--wikitext-dir", default="data_cache/wikitext2_bpe1024", help="its prepared eval-only set")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each with cores/jobs threads (2 on 2 cores: "
                   "1.2× the throughput, see run_all)")
    p.add_argument("--dry-run", action="store_true", help="print the runs' commands, run nothing")
    p.add_argument("--page-only", action="store_true", help="write the page from the runs as they are")
    p.add_argument("--archive", type=Path, metavar="DIR", help="then copy what the page reads (each finished run's "
                   "config.yaml and metrics.jsonl, the CPU ledger) to DIR, e.g. docs/results_runs")
    p.add_argument("--restore", type=Path, metavar="DIR", help="first copy an archive's finished runs (and their "
                   "CPU seconds) into --out-dir where it lacks them, e.g. to continue in a fresh checkout")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (after --)")
    args = p.parse_intermixed_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        p.error("--seeds and --jobs must be at least 1")
    try:
        lrs = tuple(float(x) for x in args.lrs.split(","))
    except ValueError as e:
        p.error(f"--lrs: {e}")
    try:
        return _run(args, lrs)
    except ConfigError as e:  # a run's config (the overrides): nothing was trained
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:  # --restore / --archive / WikiText-2's source: named in the message
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, lrs: tuple[float, ...]) -> int:
    """Plan, restore, train what is missing, write the page, archive: main's body, whose user errors main reports."""
    overrides = (f"data.val_sets=[{args.wikitext_dir}]", "log.wandb.mode=disabled", *args.overrides)
    out_dir = Path(args.out_dir)
    plan = Plan(args.seeds, lrs, overrides)
    uniques, where = plan_runs(plan, args.out_dir)
    if args.dry_run:
        import shlex
        for u in uniques:
            print(shlex.join(["python", *command(u.job, "tiny", 1)[1:]]))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.restore:
        print(f"restored {restore(args.restore, out_dir)} runs from {args.restore}")
    ledger = CpuLedger(out_dir)
    c0, failed = ledger.total, []
    if not args.page_only:
        prepare_wikitext(config_of(uniques[0].job.argv).data.dir, Path(args.wikitext_dir), args.wikitext)
        failed = run_all(uniques, out_dir, ledger, args.jobs)
    from repro.page import write_page
    write_page(plan, where, args.page, ledger.total, Path(args.wikitext_dir).name)
    print(f"wrote {args.page}")
    if args.archive:
        print(f"archived {archive(uniques, out_dir, args.archive)} runs in {args.archive}")
    print(f"CPU time: {(ledger.total - c0) / 3600:.2f} h in this invocation, {ledger.total / 3600:.2f} h for all "
          f"{len(ledger.seconds)} runs")
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())

"""The runner of the measured reproduction (`python -m repro.results`, repro/pages/results.md): the plan's unique runs
in running order, each run in a process of its own with its CPU time measured, the ledger that sums that time across
invocations, WikiText-2's eval-only set, and the archive that keeps what the page reads of every run.

A run needed by several comparisons (Fig. 5's baseline is also Fig. 1's and the largest rung of Fig. 6's ladder)
runs once: runs are keyed by their resolved config outside log.* (repro/experiments.py). A finished run whose saved
config differs from what the plan would run now is an error, never silently reused.
"""
from __future__ import annotations

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

from strictconfig.config import ConfigError, resume_conflicts
from data.config import DataConfig
from repro.comparisons import Plan
from repro.experiments import config_of, experiment_key
from repro.figures import FIGURES
from repro.jobs import Job, command, make_job
from runs import load_run

ROOT = Path(__file__).resolve().parent.parent
WIKITEXT_ENV = "SCALEVEC_WIKITEXT"  # the default for --wikitext: a path to wiki.test.raw
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
                               [*curve.defaults, *plan.overrides, *curve.overrides], curve.suffix, curve.shape,
                               curve.horizon)
                key = experiment_key(config_of(job.argv))
                unique = by_key.setdefault(key, Unique(job, key))
                where[(f"{comp.key}/{curve.label}", seed)] = Path(out_dir) / unique.job.run_name
    return list(by_key.values()), where


def select_runs(uniques: list[Unique], where: dict[tuple[str, int], Path], patterns: list[str]) -> list[Unique]:
    """The runs of the curves that match a pattern ('<comparison>/<curve>', or a comparison key for all its curves),
    in plan order; a pattern that matches no curve is an error naming the curves there are."""
    from fnmatch import fnmatchcase
    curves = sorted({path for path, _ in where})
    wanted = [p if "/" in p else p + "/*" for p in patterns]
    unmatched = [p for p, w in zip(patterns, wanted) if not any(fnmatchcase(c, w) for c in curves)]
    if unmatched:
        raise ValueError(f"--only {' '.join(map(repr, unmatched))} matches no curve; the curves are: "
                         + ", ".join(curves))
    names = {d.name for (path, _), d in where.items() if any(fnmatchcase(path, w) for w in wanted)}
    return [u for u in uniques if u.job.run_name in names]


class CpuLedger:
    """CPU seconds per run directory, summed over every invocation: `<out-dir>/cpu_seconds.json`. Two invocations
    may share an out-dir (the A/B and the first steps of repro/headroom_risk.py): each add re-reads the file under
    a lock, so neither overwrites the other's runs."""
    FILE = "cpu_seconds.json"

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / self.FILE
        self.seconds: dict[str, float] = self._read()

    def _read(self) -> dict[str, float]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def add(self, run: str, seconds: float) -> None:
        import fcntl
        from runtime.files import atomic_write
        with open(self.path.with_name(self.FILE + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.seconds = self._read()
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


COMPACT = ".jsonl.gz"  # a compact archive: one file, gzipped JSON lines


def is_compact(path) -> bool:
    return str(path).endswith(COMPACT)


def archive(uniques: list[Unique], out_dir: Path, dest: Path) -> int:
    """Save what the page reads — each finished run's config.yaml and metrics.jsonl, and the CPU ledger — to `dest`,
    replacing an earlier archive there, so that `--page-only --out-dir DEST` writes the same page from it. A `dest`
    ending in .jsonl.gz is a compact archive: one file, its first line the ledger, then a line per run (name and
    files), gzipped without a time stamp, so the same runs give the same bytes. Otherwise a folder of run folders;
    one that holds anything else is refused (it is not an archive). Returns the number of runs archived."""
    return archive_runs([u.job.run_name for u in uniques], out_dir, dest)


def archive_runs(names: list[str], out_dir: Path, dest: Path) -> int:
    """`archive` of the run directories `names` in `out_dir` (the finished ones)."""
    finished = [n for n in names if (out_dir / n / "config.yaml").exists() and load_run(out_dir / n).finished]
    ledger = json.loads((out_dir / CpuLedger.FILE).read_text()) if (out_dir / CpuLedger.FILE).exists() else None
    if is_compact(dest):
        _write_compact(Path(dest), ledger, {name: {f: (out_dir / name / f).read_text() for f in ARCHIVED}
                                            for name in finished})
        return len(finished)
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
    for name in finished:
        copy_run(out_dir / name, dest / name)
    if ledger is not None:
        shutil.copy2(out_dir / CpuLedger.FILE, dest / CpuLedger.FILE)
    return len(finished)


def _write_compact(dest: Path, ledger: Optional[dict], runs: dict[str, dict[str, str]]) -> None:
    import gzip
    from runtime.files import atomic_write
    lines = [json.dumps({"cpu_seconds": ledger}, sort_keys=True)]
    lines += [json.dumps({"run": name, "files": runs[name]}, ensure_ascii=False, sort_keys=True)
              for name in sorted(runs)]
    data = gzip.compress(("\n".join(lines) + "\n").encode("utf-8"), compresslevel=9, mtime=0)
    atomic_write(dest, data)


def _read_compact(src: Path) -> tuple[Optional[dict], dict[str, dict[str, str]]]:
    """(the ledger, {run name: {file name: text}}) of a compact archive."""
    import gzip
    lines = gzip.decompress(Path(src).read_bytes()).decode("utf-8").splitlines()
    ledger = json.loads(lines[0])["cpu_seconds"]
    runs = {}
    for line in lines[1:]:
        entry = json.loads(line)
        runs[entry["run"]] = entry["files"]
    return ledger, runs


def _write_run(dest: Path, files: dict[str, str]) -> None:
    """One archived run's files (ARCHIVED, as text) into a new directory `dest`."""
    dest.mkdir(parents=True)
    for name, text in files.items():
        (dest / name).write_text(text)


def unpack(src: Path, dest: Path) -> None:
    """A compact archive as the folder archive it stands for: its run folders and its ledger, as they were."""
    ledger, runs = _read_compact(src)
    for name, files in runs.items():
        _write_run(dest / name, files)
    if ledger is not None:
        (dest / CpuLedger.FILE).write_text(json.dumps(ledger, indent=1, sort_keys=True))


def restore(src: Path, out_dir: Path) -> int:
    """Copy an archive's runs (what `archive` wrote: a compact file or a folder) into `out_dir` where `out_dir` has
    no directory of that name, with their CPU seconds, so that the reproduction continues from them in a fresh
    checkout: a restored run is finished (its config.yaml and metrics.jsonl say so) and is skipped, never
    retrained. Runs already in `out_dir` are left as they are, and so is their ledger entry. Returns the number of
    runs restored."""
    src = Path(src)
    if is_compact(src):
        if not src.is_file():
            raise FileNotFoundError(f"--restore {src}: no such file (give an archive that --archive wrote)")
        archived, runs = _read_compact(src)
        archived = archived or {}
    elif src.is_dir():
        archived = CpuLedger(src).seconds
        runs = {p.name: None for p in sorted(src.iterdir())
                if p.is_dir() and all((p / f).is_file() for f in ARCHIVED)}
    else:
        raise FileNotFoundError(f"--restore {src}: no such directory (give an archive that --archive wrote)")
    ledger = CpuLedger(out_dir)
    n = 0
    for name, files in sorted(runs.items()):
        if (out_dir / name).exists():
            continue
        if files is None:
            copy_run(src / name, out_dir / name)
        else:
            _write_run(out_dir / name, files)
        if name in archived and name not in ledger.seconds:
            ledger.add(name, archived[name])
        n += 1
    return n


def prepare_wikitext(data: DataConfig, out: Path, source: Optional[Path]) -> None:
    """WikiText-2's raw test set as an eval-only set, in the training data's tokenizer (data.prepare --eval-only).
    The training data comes first, as a run would prepare it (a built-in source on first use), since the eval set
    is tokenized like it: in a fresh checkout nothing is prepared yet."""
    from dataclasses import replace
    from data.prepare import ensure_prepared, prepare
    from data.shards import META_FILE
    ensure_prepared(replace(data, val_sets=[]))
    if (out / META_FILE).is_file():
        return
    src = source or os.environ.get(WIKITEXT_ENV)
    if src is None or not Path(src).is_file():
        raise FileNotFoundError(f"WikiText-2's test set is needed as {out}: give --wikitext PATH to its raw test "
                                f"file (wiki.test.raw, from {WIKITEXT_URL}), or set {WIKITEXT_ENV}")
    prepare(DataConfig(source=str(src), dir=str(out)), eval_only=True, like=data.dir, progress=False)

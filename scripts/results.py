"""The measured small-scale reproduction of the paper's Figures 1, 5, 6, 8 and 9: every run, then docs/results.md.

    python -m scripts.results                       # run what is missing (4 seeds each), then write docs/results.md
    python -m scripts.results --page-only           # rewrite the page from the runs as they are, run nothing
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
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from config import ConfigError, resume_conflicts
from repro.experiments import config_of, experiment_key
from repro.proxy import DENSE_LADDER, MOE_LADDER, Shape
from scripts.figures import FIGURES
from scripts.reproduce import Job, command, launch, make_job

ROOT = Path(__file__).resolve().parent.parent
WIKITEXT_SOURCE = ROOT.parent / "shared" / "data" / "wikitext-2-raw-test" / "wiki.test.raw"
WIKITEXT_URL = "https://huggingface.co/datasets/Salesforce/wikitext (config wikitext-2-raw-v1, split test)"


@dataclass(frozen=True)
class Curve:
    label: str  # the name in the page
    figure: str  # configs/figures/fig<figure>/<run>.yaml
    run: str
    overrides: tuple[str, ...] = ()  # on top of the proxy's sizes (an lr of the grid)
    suffix: str = ""  # tells apart the run directories of one figure run under different overrides or shapes
    paper_delta: Optional[float] = None  # the paper's terminal Δ to the comparison's reference (PAPER.md §4)
    shape: Optional[Shape] = None  # the proxy shape (repro/proxy.py); None: the run's own (paper_shape)


@dataclass(frozen=True)
class Comparison:
    key: str  # names the plot: img/results/<key>.png
    title: str
    cite: str  # where the paper's numbers come from
    curves: tuple[Curve, ...]  # curves[0] is the reference of every Δ
    kind: str = "panel"  # panel | lr_grid (Fig. 1) | ladder (Figs. 6, 7: baseline, unified per rung)


# The paper's terminal deltas (PAPER.md §4.4, Fig. 5), each against its panel's first curve.
FIG5_DELTAS = {
    "heterogeneity": {"hg": -0.0044},
    "placement": {"hg_ap": +0.0099, "hg_dp": -0.0032, "hg_dnp": +0.0341},
    "reparameterization": {"hg_dnp": +0.037, "hg_dp_or": -0.0063, "hg_dp_er": +0.0027, "hg_dnp_or": -0.0245,
                           "hg_dnp_er": -0.0238},
    "weight decay": {"hg_dnp_er": +0.0008, "hg_dnp_or_iwd": -0.0009, "hg_dnp_er_iwd": -0.0004},
}
FIG6_DELTAS = {"0.12b": -0.0331, "0.25b": -0.0244, "0.5b": -0.0416, "0.75b": -0.0373, "1b": -0.0148}  # PAPER.md §4.5
FIG7_DELTAS = {"0.25b": -0.0305, "0.5b": -0.0209, "0.8b": -0.0499, "1b": -0.0236, "2b": -0.0207}  # PAPER.md §4.6
FIG6_MULTIPLIER, FIG7_MULTIPLIER = 1.22, 1.25  # PAPER.md §4.5, §4.6: equal-loss compute ratio of the fitted laws
FIG1_SAME_LR, FIG1_BEST_LR = +0.0285, +0.0149  # PAPER.md §4.1: without − with scale vectors
FIG8_DELTA, FIG8_MOE_DELTA = -0.0156, -0.0188  # PAPER.md §4.7: Dense-0.12B, MoE-0.5B, unified − baseline
FIG9_DELTA, FIG9_MOE_DELTA = -0.0269, -0.0186  # PAPER.md §4.8


@dataclass
class Plan:
    """What the page needs, in the order the runs go."""
    seeds: int
    lrs: tuple[float, ...] = (2e-3, 4e-3, 8e-3)
    overrides: tuple[str, ...] = ()  # for every run, under each curve's own (an lr of the grid)
    comparisons: list[Comparison] = field(default_factory=list)

    def __post_init__(self):
        if not self.comparisons:
            self.comparisons = default_comparisons(self.lrs)


def pair(figure: str, run: str, paper_delta: Optional[float], shape: Optional[Shape] = None) -> tuple[Curve, Curve]:
    """A figure's baseline and unified runs of one size (`run` is their common prefix, e.g. "0.12b")."""
    suffix = f"-{shape.label.replace(' ', '')}" if shape else ""
    label = f" {shape.label}" if shape else ""
    return (Curve(f"baseline{label}", figure, f"{run}_baseline", suffix=suffix, shape=shape),
            Curve(f"unified{label}", figure, f"{run}_unified", suffix=suffix, paper_delta=paper_delta, shape=shape))


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def default_comparisons(lrs: tuple[float, ...]) -> list[Comparison]:
    out = [Comparison(f"fig5-{p.title.replace(' ', '_')}", f"Fig. 5, {p.title}", "PAPER.md §4.4",
                      tuple(Curve(c, "5", c, paper_delta=FIG5_DELTAS[p.title].get(c)) for c in p.curves))
           for p in FIGURES["5"].panels]
    out.append(Comparison("fig1-lr_grid", "Fig. 1, with and without scale vectors over an lr grid", "PAPER.md §4.1",
                          tuple(Curve(f"{name} lr {lr_text(lr)}", "1", run, (f"optim.lr={lr_text(lr)}",), f"-lr{lr_text(lr)}")
                                for lr in lrs for name, run in (("baseline", "baseline"), ("none", "none_lr4e-3"))),
                          kind="lr_grid"))
    # A ladder rung has no paper size of its own: its Δ is compared with the mean of the paper's sizes.
    out.append(Comparison("fig6-ladder", "Fig. 6, unified vs baseline over a ladder of dense proxy sizes",
                          "PAPER.md §4.5",
                          tuple(c for shape in DENSE_LADDER for c in pair("6", "0.12b", mean(FIG6_DELTAS.values()), shape)),
                          kind="ladder"))
    out.append(Comparison("fig8-muon", "Fig. 8, Muon, dense (lr 5e-3)", "PAPER.md §4.7", pair("8", "0.12b", FIG8_DELTA)))
    out.append(Comparison("fig9-wsd", "Fig. 9, WSD schedule, dense (AdamW, lr 3e-3)", "PAPER.md §4.8",
                          pair("9", "0.12b", FIG9_DELTA)))
    out.append(Comparison("fig8-muon_moe", "Fig. 8, Muon, MoE (lr 4e-3)", "PAPER.md §4.7",
                          pair("8", "moe_0.5b", FIG8_MOE_DELTA)))
    out.append(Comparison("fig9-wsd_moe", "Fig. 9, WSD schedule, MoE (AdamW, lr 2e-3)", "PAPER.md §4.8",
                          pair("9", "moe_0.5b", FIG9_MOE_DELTA)))
    out.append(Comparison("fig7-ladder", "Fig. 7, unified vs baseline over a ladder of Llama-MoE proxy sizes",
                          "PAPER.md §4.6",
                          tuple(c for shape in MOE_LADDER for c in pair("7", "0.5b", mean(FIG7_DELTAS.values()), shape)),
                          kind="ladder"))
    return out


def lr_text(lr: float) -> str:
    """2e-3, not 0.002: as the paper and the configs write an lr."""
    return f"{lr:.0e}".replace("e-0", "e-").replace("e+0", "e")


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

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / "cpu_seconds.json"
        self.seconds: dict[str, float] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def add(self, run: str, seconds: float) -> None:
        from runtime.files import atomic_write
        self.seconds[run] = self.seconds.get(run, 0.0) + seconds
        atomic_write(self.path, json.dumps(self.seconds, indent=1, sort_keys=True))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def cpu_now() -> float:
    """This process's and its finished children's CPU time: a run in a subprocess counts as a child, one called
    in-process (tests) as ours."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_all(uniques: list[Unique], out_dir: Path, ledger: CpuLedger) -> list[str]:
    """Run what is not finished; returns the names of runs that failed."""
    from scripts.runs import load_run
    failed = []
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
        print(f"[{i}/{len(uniques)}] {u.job.run_name}", flush=True)
        t0, c0 = time.time(), cpu_now()
        code = launch(command(u.job, "tiny", 1))
        ledger.add(u.job.run_name, cpu_now() - c0)
        print(f"    {time.time() - t0:.0f} s", flush=True)
        if code != 0:
            print(f"error: {u.job.run_name} failed (exit {code}); the page leaves it out, and the same command "
                  "resumes it", file=sys.stderr)
            failed.append(u.job.run_name)
    return failed


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
    p.add_argument("--dry-run", action="store_true", help="print the runs' commands, run nothing")
    p.add_argument("--page-only", action="store_true", help="write the page from the runs as they are")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (after --)")
    args = p.parse_intermixed_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    try:
        lrs = tuple(float(x) for x in args.lrs.split(","))
    except ValueError as e:
        p.error(f"--lrs: {e}")
    overrides = (f"data.val_sets=[{args.wikitext_dir}]", "log.wandb.mode=disabled", *args.overrides)
    out_dir = Path(args.out_dir)
    try:
        plan = Plan(args.seeds, lrs, overrides)
        uniques, where = plan_runs(plan, args.out_dir)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        import shlex
        for u in uniques:
            print(shlex.join(["python", *command(u.job, "tiny", 1)[1:]]))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    ledger = CpuLedger(out_dir)
    c0, failed = ledger.total, []
    if not args.page_only:
        try:
            prepare_wikitext(config_of(uniques[0].job.argv).data.dir, Path(args.wikitext_dir), args.wikitext)
            failed = run_all(uniques, out_dir, ledger)
        except (ConfigError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from scripts.results_page import write_page
    write_page(plan, where, args.page, ledger.total, Path(args.wikitext_dir).name)
    print(f"wrote {args.page}")
    print(f"CPU time: {(ledger.total - c0) / 3600:.2f} h in this invocation, {ledger.total / 3600:.2f} h for all "
          f"{len(ledger.seconds)} runs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

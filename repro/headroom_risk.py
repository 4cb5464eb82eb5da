"""The paper-scale risk of the collapse, estimated on CPU (issue 52; docs/paper.md §1.7). Under DNP an input-side
magnitude β that only an inner Norm reads walks under Adam and decay; once β² times its branch's scale falls below
the Norm's eps, the Norm stops normalizing and the branch is switched off (headroom < 1: runtime/telemetry.py).

    python -m repro.headroom_risk runs/v5 repro/archives/results_runs_v4.jsonl.gz   # the ladder, from finished runs
    python -m repro.headroom_risk runs/v5 --first-steps runs/first_steps --train  # + the first steps (trains them)

The ladder: each literal unified run's Σlr (the sum of its schedule's lr over the steps taken) at its first
evaluation with some headroom below 1, and at its end. A run that predates the headroom telemetry is read by its
smallest magnitude alone.

The first steps: the dense proxy's rungs d32, d64 and d96 (L4) and the real configs/dense_0.12b_unified.yaml, each
FIRST_STEPS steps at a constant lr 4e-3 (no warmup) on the same batch shape, the literal form. Per rung: the headroom
at init, how fast the fastest magnitude moves per unit Σlr, and the branch scale (headroom / β²) as it grows.

The extrapolation, for each rung: β must fall to β* = 1 / sqrt(headroom at init × branch growth) before its branch
switches off. At the fastest magnitude's early rate r, that takes Σlr ≈ (1 − β*) / r. The d32 rung calibrates
it: its runs' measured Σlr at collapse over its own prediction. The calibrated Σlr is compared with the Σlr of the
paper schedule's 20,000 steps.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from config import RunConfig, load_config
from optim.schedule import lr_at
from repro.jobs import make_job
from repro.figures import FIGURES
from repro.proxy import DENSE_LADDER, Shape
from repro.runner import CpuLedger, is_compact, launch, unpack
from runs import Run, load_run

ROOT = Path(__file__).resolve().parent.parent
PAPER_CONFIG = ROOT / "configs" / "dense_0.12b_unified.yaml"
FIRST_STEPS, FIRST_EVERY, FIRST_LR = 40, 5, 4e-3
FIRST_BATCH, FIRST_SEQ = 4, 256  # sequences × tokens per step, for every rung
FIRST_RUNGS = tuple(s for s in DENSE_LADDER if s.n_layers == 4)  # d32, d64, d96 at L4


def lr_sums(cfg: RunConfig) -> list[float]:
    """Σlr after each number of steps: element s is the sum of the lrs of steps 0 .. s-1 (an eval at step s sees
    it)."""
    out, total = [0.0], 0.0
    for step in range(cfg.train.steps):
        total += lr_at(step, cfg.train.steps, cfg.optim.lr, cfg.schedule)
        out.append(total)
    return out


@dataclass(frozen=True)
class Point:
    """One evaluation of a run, over the vectors only an inner Norm reads."""
    step: int
    sum_lr: float
    headroom: Optional[float]  # the smallest, over sites
    beta: Optional[float]  # the smallest |β|
    scale: Optional[float]  # the median headroom / β² over sites: the branch's scale without its β


def trajectory(run: Run) -> list[Point]:
    sums = lr_sums(run.cfg)
    points = []
    for e in run.evals:
        heads = {k.removeprefix("headroom/"): v for k, v in e.items() if k.startswith("headroom/") and v is not None}
        # Dense literal unified: every logged magnitude is an input-side vector only inner Norms read (HG gives each
        # branch its own; the final norm's feeds the LM head's inner Norm).
        betas = {k: abs(v) for k, v in e.items() if k.startswith("magnitude/") and v is not None}
        ratios = [heads.get(k.removeprefix("magnitude/").replace("head/norm", "head/lm_head"), 0.0) / b ** 2
                  for k, b in betas.items() if b > 0]
        points.append(Point(e["step"], sums[min(e["step"], len(sums) - 1)], min(heads.values()) if heads else None,
                            min(betas.values()) if betas else None,
                            statistics.median(ratios) if ratios and heads else None))
    return points


def is_literal(cfg: RunConfig) -> bool:
    """unified as the paper reads it: DNP with OR, its Norm-read magnitudes kept and decayed."""
    s = cfg.model.scale
    return (s.placement == "dnp" and s.reparam == "or" and s.invariant_magnitude == "keep"
            and cfg.optim.scale_wd_invariant and cfg.optim.name == "adamw")


def rung_of(cfg: RunConfig) -> str:
    m = cfg.model
    return f"d{m.d_model}L{m.n_layers}" + (f"E{m.moe.n_experts}" if m.moe else "")


# ---------------------------------------------------------------------------------------------- the ladder

@dataclass(frozen=True)
class Group:
    rung: str
    lr: float
    steps: int
    points: tuple[tuple[Point, ...], ...]  # one trajectory per run

    @property
    def total(self) -> float:
        return max(p[-1].sum_lr for p in self.points)

    def collapse_sums(self) -> list[float]:
        """Each collapsed run's Σlr at its first evaluation with some headroom below 1."""
        return [next(p.sum_lr for p in t if p.headroom is not None and p.headroom < 1) for t in self.points
                if any(p.headroom is not None and p.headroom < 1 for p in t)]

    def measured(self) -> int:
        return sum(any(p.headroom is not None for p in t) for t in self.points)


def ladder(runs: list[Run]) -> list[Group]:
    """The finished literal unified dense runs by rung, lr and steps (the first-steps runs left out)."""
    groups: dict[tuple, list] = {}
    first = first_names()
    for run in runs:
        if run.finished and not run.cfg.model.moe and is_literal(run.cfg) and run.path.name not in first:
            key = (rung_of(run.cfg), run.cfg.optim.lr, run.cfg.train.steps)
            groups.setdefault(key, []).append(tuple(trajectory(run)))
    return [Group(*k, tuple(v)) for k, v in sorted(groups.items(), key=lambda kv: (int(kv[0][0][1:].split("L")[0]),
                                                                                    kv[0][2], kv[0][1]))]


def ladder_table(groups: list[Group]) -> str:
    lines = ["| rung | lr | steps | Σlr | runs | headroom measured | collapsed | Σlr at collapse | "
             "smallest β (median) |", "|---|---|---|---|---|---|---|---|---|"]
    for g in groups:
        sums = g.collapse_sums()
        betas = [min(p.beta for p in t if p.beta is not None) for t in g.points if any(p.beta is not None for p in t)]
        lines.append(f"| {g.rung} | {g.lr:g} | {g.steps} | {g.total:.1f} | {len(g.points)} | {g.measured()} | "
                     f"{len(sums) if g.measured() else '–'} | "
                     f"{(f'{min(sums):.1f}–{max(sums):.1f}' if sums else '–')} | "
                     f"{f'{statistics.median(betas):.2g}' if betas else '–'} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- the first steps

# For every rung, after its own config.
FIRST_OVERRIDES = (f"train.steps={FIRST_STEPS}", f"train.eval_every={FIRST_EVERY}", "train.eval_tokens=2048",
                   f"train.ckpt_every={FIRST_STEPS}", f"train.global_batch={FIRST_BATCH}",
                   f"train.micro_batch={FIRST_BATCH}", f"data.seq_len={FIRST_SEQ}", f"optim.lr={FIRST_LR}",
                   "schedule.warmup_steps=0", "schedule.min_lr_ratio=1", "train.compile=false",
                   "train.dtype=float32", "model.scale.invariant_magnitude=keep", "log.wandb.mode=disabled",
                   "data.val_sets=[]")


def first_steps_argv(rung: Optional[Shape], out_dir: Path) -> tuple[str, list[str]]:
    """The run name and train.py's arguments of one rung's first steps (None: the real 0.12B config, on the
    built-in corpus with its gpt2 tokenizer)."""
    if rung is None:
        name = "dense_0.12b_unified"
        argv = ["--config", str(PAPER_CONFIG.relative_to(ROOT)), "data.source=builtin:pd_english",
                "data.dir=data_cache/pd_english_gpt2", "data.max_tokens=null"]
    else:
        job = make_job(FIGURES["6"], "0.12b_unified", "tiny", 0, 1, str(out_dir), [], f"-{rung.label}", rung, 1)
        name, argv = f"proxy-{rung.label.replace(' ', '')}", list(job.argv)
    return name, argv + [*FIRST_OVERRIDES, f"log.out_dir={out_dir}", f"log.run_name={name}"]


def first_names() -> set[str]:
    """The first-steps runs' directory names."""
    return {first_steps_argv(r, Path("."))[0] for r in (*FIRST_RUNGS, None)}


def train_first_steps(out_dir: Path) -> None:
    """Train the first-steps runs that are not finished, one thread each, their CPU seconds in out_dir's ledger."""
    ledger = CpuLedger(out_dir)
    for rung in (*FIRST_RUNGS, None):
        name, argv = first_steps_argv(rung, out_dir)
        run_dir = out_dir / name
        if (run_dir / "config.yaml").exists() and load_run(run_dir).finished:
            continue
        print(f"training {name} ({FIRST_STEPS} steps)", flush=True)
        code, cpu = launch([sys.executable, str(ROOT / "train.py"), *argv], threads=1)
        ledger.add(name, cpu)
        if code != 0:
            raise RuntimeError(f"{name} failed (exit {code}); the same command resumes it")


@dataclass(frozen=True)
class Early:
    """A rung's first steps at a constant lr."""
    rung: str
    h0: float  # the smallest headroom at init (every β = 1)
    rate: float  # the fastest |Δβ| / Σlr over the first steps, over sites
    growth: float  # the median branch scale at the last evaluation over its value at init

    @property
    def beta_star(self) -> float:
        """The |β| at which the smallest branch's headroom reaches 1, its scale grown by `growth`."""
        return 1 / math.sqrt(self.h0 * self.growth)

    def sum_lr_to_collapse(self) -> float:
        return (1 - self.beta_star) / self.rate if self.rate > 0 else math.inf


def early(run: Run) -> Early:
    first, last = run.evals[0], run.evals[-1]
    sum_lr = lr_sums(run.cfg)[last["step"]]
    moved = [abs(last[k] - first[k]) for k in first if k.startswith("magnitude/")]
    t = trajectory(run)
    return Early(rung_of(run.cfg), t[0].headroom, max(moved) / sum_lr, t[-1].scale / t[0].scale)


def early_table(rows: list[Early], calibration: Optional[float], paper_sum: float) -> str:
    lines = ["| rung | headroom at init | fastest β per Σlr | branch growth | β* | Σlr to collapse, raw | "
             "calibrated by d32 |", "|---|---|---|---|---|---|---|"]
    paper = rung_of(load_config(PAPER_CONFIG))
    for e in rows:
        raw = e.sum_lr_to_collapse()
        cal = f"{raw * calibration:.1f}" if calibration else "–"
        name = f"Llama-0.12B, {e.rung}" if e.rung == paper else e.rung
        lines.append(f"| {name} | {e.h0:.2g} | {e.rate:.2f} | {e.growth:.2f} | {e.beta_star:.2g} | {raw:.1f} | "
                     f"{cal} |")
    lines.append(f"\nThe paper schedule (configs/dense_0.12b_unified.yaml): Σlr = {paper_sum:.1f} over its "
                 f"{load_config(PAPER_CONFIG).train.steps} steps.")
    return "\n".join(lines)


def calibrate(groups: list[Group], rows: list[Early]) -> Optional[float]:
    """The d32 rung's measured Σlr at collapse (median over its collapsed runs at lr FIRST_LR) over its predicted."""
    d32 = next((e for e in rows if e.rung == "d32L4"), None)
    sums = [s for g in groups if g.rung == "d32L4" and math.isclose(g.lr, FIRST_LR) for s in g.collapse_sums()]
    if d32 is None or not sums or not math.isfinite(d32.sum_lr_to_collapse()):
        return None
    return statistics.median(sums) / d32.sum_lr_to_collapse()


# ---------------------------------------------------------------------------------------------------- main

def load_runs(source: Path, tmp: Path) -> list[Run]:
    if is_compact(source):
        dest = tmp / source.name
        unpack(source, dest)
        source = dest
    return [load_run(p.parent) for p in sorted(source.glob("*/config.yaml"))]


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", type=Path, help="run folders or compact archives (repro/runner.py)")
    p.add_argument("--first-steps", type=Path, help="the folder of the first-steps runs")
    p.add_argument("--train", action="store_true", help="train the first-steps runs that are missing")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        # A run directory in several sources (an archive's run rerun with telemetry) counts once: the last given.
        runs = list({r.path.name: r for s in args.sources for r in load_runs(s, Path(tmp))}.values())
    groups = ladder(runs)
    print("The ladder, literal unified (dense):\n\n" + ladder_table(groups) + "\n")
    if args.first_steps:
        if args.train:
            train_first_steps(args.first_steps)
        names = [first_steps_argv(r, args.first_steps)[0] for r in (*FIRST_RUNGS, None)]
        found = [load_run(args.first_steps / n) for n in names if (args.first_steps / n / "config.yaml").exists()]
        rows = [early(r) for r in found if r.finished]
        paper_sum = lr_sums(load_config(PAPER_CONFIG))[-1]
        print(f"The first {FIRST_STEPS} steps at lr {FIRST_LR:g}, {FIRST_BATCH} × {FIRST_SEQ} tokens a step:\n\n"
              + early_table(rows, calibrate(groups, rows), paper_sum))
    return 0


if __name__ == "__main__":
    sys.exit(main())

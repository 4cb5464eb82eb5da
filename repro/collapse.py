"""Issue 52's A/B, read from its runs: where the literal form's magnitudes only a Norm reads collapsed in results v4,
unified as the paper reads it, without those magnitudes (model.scale.invariant_magnitude=remove), and with them
undecayed (optim.scale_wd_invariant=false) (repro/comparisons.py, COLLAPSE_ROWS and collapse_ab).

    python -m repro.collapse runs/v5 --seeds 4                 # every row of COLLAPSE_ROWS with runs in runs/v5
    python -m repro.collapse runs/v5 --seeds 4 --rows 0,2      # rows by index
    python -m repro.collapse repro/archives/results_runs_v5.jsonl.gz --seeds 4   # a compact archive of them
    python -m repro.collapse repro/archives/results_runs_v5.jsonl.gz --seeds 4 --page repro/pages/collapse.md \
        --ladder repro/archives/results_runs_v4.jsonl.gz                          # the page (repro/collapse_page.py)

Per row and arm: the runs found, how many collapsed (some inner Norm's headroom, input mean square / eps at an
evaluation, fell below the run's log.headroom_warn), the smallest headroom and the smallest magnitude of a vector
only an inner Norm reads that any run reached,
the final val loss and WikiText-2 loss, and each arm's paired difference to the literal arm over the seeds both have
(mean [95 % interval]).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from repro.comparisons import COLLAPSE_ROWS, Comparison, Plan, collapse_ab
from repro.runner import is_compact, plan_runs, unpack
from repro.reading import MDE_FLOOR, planned_seeds
from repro.stats import Stat, fmt, stat
from runs import Run, load_run

WIKI = "val_loss/wikitext2_bpe1024"  # the eval-only set repro.results adds to every run


@dataclass(frozen=True)
class Arm:
    """One curve of a row over its seeds: the finished runs by seed."""
    label: str
    runs: dict[int, Run]

    def collapsed(self) -> int:
        return sum(r.stopped_normalizing for r in self.runs.values())

    def smallest_headroom(self) -> Optional[float]:
        """The smallest headroom of any inner Norm at any evaluation of any seed."""
        values = [v for r in self.runs.values() for e in r.evals for k, v in e.items()
                  if k.startswith("headroom/") and v is not None]
        return min(values) if values else None

    def smallest_magnitude(self) -> Optional[float]:
        """The smallest |magnitude| of any input-side vector that only an inner Norm reads, at any evaluation of any
        seed: a site with a headroom key of its own (the final norm's: the LM head's). The MoE router's vector is
        read directly, so its magnitude is left out."""
        values = [abs(v) for r in self.runs.values() for e in r.evals for k, v in e.items()
                  if k.startswith("magnitude/") and v is not None and norm_read(k, e)]
        return min(values) if values else None

    def final(self, key: str) -> dict[int, float]:
        return {s: r.final_eval[key] for s, r in self.runs.items() if r.final_eval and key in r.final_eval}


def norm_read(key: str, record: dict) -> bool:
    """Whether magnitude/<layer>/<site> feeds an inner Norm: the record has that site's headroom (HG designs, whose
    every input-side vector is its branch's own; the final norm feeds the LM head's)."""
    _, layer, site = key.split("/", 2)
    return f"headroom/{layer}/{'lm_head' if (layer, site) == ('head', 'norm') else site}" in record


def arms_of(comp: Comparison, where: dict[tuple[str, int], Path], seeds: int) -> list[Arm]:
    """Each curve's finished runs (a missing or unfinished run is left out)."""
    arms = []
    for curve in comp.curves:
        found = {}
        for seed in range(seeds):
            path = where[(f"{comp.key}/{curve.label}", seed)]
            if (path / "config.yaml").exists():
                run = load_run(path)
                if run.finished:
                    found[seed] = run
        arms.append(Arm(curve.label, found))
    return arms


def paired(arm: dict[int, float], ref: dict[int, float]) -> Optional[Stat]:
    """arm − ref over the seeds both have."""
    return stat([arm[s] - ref[s] for s in sorted(arm) if s in ref])


def table(comp: Comparison, arms: list[Arm]) -> str:
    ref = arms[0]
    lines = [f"{comp.title}", "",
             "| arm | runs | collapsed | smallest headroom | smallest magnitude | val loss | Δ val vs literal | "
             f"WikiText-2 | Δ WikiText-2 | the pilot's n (MDE {MDE_FLOOR}) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        h, m = arm.smallest_headroom(), arm.smallest_magnitude()
        val, wiki, ref_val = arm.final("val_loss"), arm.final(WIKI), ref.final("val_loss")
        delta = "" if arm is ref else fmt(paired(val, ref_val), sign=True)
        dwiki = "" if arm is ref else fmt(paired(wiki, ref.final(WIKI)), sign=True)
        plan = planned_seeds([val[s] - ref_val[s] for s in sorted(val) if s in ref_val], MDE_FLOOR)
        n = "" if arm is ref else ("no pilot yet" if plan is None else str(plan))
        lines.append(f"| {arm.label} | {len(arm.runs)} | {arm.collapsed()} | {'–' if h is None else f'{h:.2g}'} | "
                     f"{'–' if m is None else f'{m:.2g}'} | {fmt(stat(list(val.values())))} | {delta} | "
                     f"{fmt(stat(list(wiki.values())))} | {dwiki} | {n} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path, help="the folder the A/B's runs were trained into")
    p.add_argument("--seeds", type=int, required=True, help="the seeds the runs were planned with")
    p.add_argument("--rows", help="indices into COLLAPSE_ROWS, comma-separated (default: every row)")
    args = p.parse_args(argv)
    rows = [int(i) for i in args.rows.split(",")] if args.rows else range(len(COLLAPSE_ROWS))
    comps = [collapse_ab(*COLLAPSE_ROWS[i]) for i in rows]
    if not is_compact(args.out_dir):
        return report(comps, args.out_dir, args.seeds)
    if not args.out_dir.is_file():
        print(f"error: {args.out_dir}: no such archive", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        unpack(args.out_dir, Path(tmp))
        return report(comps, Path(tmp), args.seeds)


def report(comps: list[Comparison], out_dir: Path, seeds: int) -> int:
    _, where = plan_runs(Plan(seeds, comparisons=comps), str(out_dir))
    printed = 0
    for comp in comps:
        arms = arms_of(comp, where, seeds)
        if any(arm.runs for arm in arms):
            print(table(comp, arms) + "\n")
            printed += 1
    if not printed:
        print(f"error: no finished run of the A/B in {out_dir} (repro/comparisons.py, collapse_ab)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

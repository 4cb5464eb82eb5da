"""Whether a row's paired sd could be cut without changing what is measured (the results page's power section): the
sd of the last evaluation against each run's last few averaged, and against the sd the same runs would give unpaired."""
from __future__ import annotations

import math
from typing import Optional

from repro.measure import Results, Row
from repro.stats import stat
from runs import Run

TAIL_EVALS = (3, 5)  # the last evaluations averaged, against the last one alone


def variance_lines(res: Results, rows: list[Row]) -> list[str]:
    """Whether the paired sd can be cut without changing what is measured, from the same runs:
    averaging each run's last few evaluations (it helps only if the spread is evaluation noise), and what pairing by
    seed (the same init and data order in both curves) buys over independent runs: the paired difference's variance
    is sd²_ours + sd²_ref − 2ρ·sd_ours·sd_ref, so it pays only as far as the curves' finals correlate (ρ > 0)."""
    rows = [r for r in rows if r.delta is not None and r.delta.n >= 3]
    if not rows:
        return []
    out = ["How much of that sd could be removed without changing what is measured, from the same runs: the paired "
           "sd of the final evaluation against that of each run's last "
           + " and ".join(str(k) for k in TAIL_EVALS) + " evaluations averaged (which helps only where the spread "
           "is evaluation noise), and against the sd the same runs would give unpaired, √(sd²_ours + sd²_ref) "
           "(what pairing by seed, the same init and data order in both curves, buys; ρ is the correlation of the "
           "two curves' final losses over seeds).", "",
           "| row | seeds | paired sd, last eval | " + " | ".join(f"last {k} averaged" for k in TAIL_EVALS)
           + " | unpaired sd | ρ |", "|---|---|---|" + "---|" * len(TAIL_EVALS) + "---|---|"]
    for r in rows:
        ours, ref = res.runs_of(r.comparison, r.ours), res.runs_of(r.comparison, r.ref)
        seeds = sorted(set(ours) & set(ref))
        tails = []
        for k in TAIL_EVALS:
            d = stat([tail_mean(ours[s], k) - tail_mean(ref[s], k) for s in seeds])
            tails.append(f"{d.sd:.4f}")
        a, b = [ours[s].final_val_loss for s in seeds], [ref[s].final_val_loss for s in seeds]
        sa, sb = stat(a).sd, stat(b).sd
        rho = correlation(a, b)
        out.append(f"| {r.title} | {len(seeds)} | {r.delta.sd:.4f} | " + " | ".join(tails)
                   + f" | {math.hypot(sa, sb):.4f} | {'–' if rho is None else f'{rho:+.2f}'} |")
    return out + [""]


def tail_mean(run: Run, k: int) -> float:
    """The mean val loss of a run's last k evaluations."""
    last = [e["val_loss"] for e in run.evals[-k:]]
    return sum(last) / len(last)


def correlation(a: list[float], b: list[float]) -> Optional[float]:
    """Pearson's ρ (None when either side does not vary)."""
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    saa, sbb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    if saa == 0 or sbb == 0:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / math.sqrt(saa * sbb)

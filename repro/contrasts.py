"""Which of the page's deltas are measurements of their own and which are sums of others.

Every row is ours − reference in the seed-mean final loss, so it is a vector over the run-mean columns (one column
per curve's run directories): +1 on ours, −1 on its reference. HG+DNP − HG is then exactly (HG+DP − HG) +
(HG+DNP − HG+DP), and Fig. 6's d64 L4 rung (Fig. 5's baseline against HG+DNP+OR+IWD) is the sum of Fig. 5's chain
of rows: a tally that counts such a row again counts the same runs twice. The basis is chosen greedily (a row joins
it when it raises the rank): first the rows the page's first screen reads, so that each of its claims gets its own
test, then the rest in page order; a row that is a sum of others is written as its combination of basis rows. Which
rows leave is a choice, the rank is not: the count of independent rows is the same in any order. Rows of the basis
still share runs
(a reference read by several deltas), so they are correlated, not independent: the page corrects its count of
resolved rows for multiplicity over the basis (repro/significance.py), never as if the tests were independent.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from repro.measure import Row


def columns(rows: list[Row]) -> list[tuple[Path, ...]]:
    """The run-mean columns the rows read, in first-read order: one per curve, as its run directories per seed."""
    out: dict[tuple[Path, ...], None] = {}
    for r in rows:
        for side in (0, 1):
            out.setdefault(tuple(pair[side] for pair in r.runs), None)
    return list(out)


def vector(row: Row, cols: list[tuple[Path, ...]]) -> np.ndarray:
    v = np.zeros(len(cols))
    v[cols.index(tuple(p for p, _ in row.runs))] += 1.0
    v[cols.index(tuple(p for _, p in row.runs))] -= 1.0
    return v


@dataclass(frozen=True)
class Contrasts:
    """The counted rows split into a basis (greedy by rank, listed in page order) and the rows that are combinations
    of it."""
    basis: list[Row]
    sums: list[tuple[Row, list[tuple[float, Row]]]]  # a dependent row and its (coefficient, basis row) terms

    @property
    def dependent(self) -> list[Row]:
        return [r for r, _ in self.sums]


def contrasts(rows: list[Row], first: tuple[Row, ...] = ()) -> Contrasts:
    """The rank-greedy basis of `rows` (numpy.linalg.matrix_rank), the rows of `first` tried before the others, and
    each other row's exact combination of it."""
    cols = columns(rows)
    vectors = {id(r): vector(r, cols) for r in rows}
    firsts = {id(r) for r in first}
    kept: list[np.ndarray] = []
    chosen: set[int] = set()
    for r in [r for r in rows if id(r) in firsts] + [r for r in rows if id(r) not in firsts]:
        v = vectors[id(r)]
        if np.linalg.matrix_rank(np.array([*kept, v])) > len(kept):
            kept.append(v)
            chosen.add(id(r))
    basis = [r for r in rows if id(r) in chosen]
    sums = []
    for r in rows:
        if id(r) not in chosen:
            coef = np.linalg.lstsq(np.array([vectors[id(b)] for b in basis]).T, vectors[id(r)], rcond=None)[0]
            sums.append((r, [(round(float(c), 6), b) for c, b in zip(coef, basis) if abs(c) > 1e-9]))
    return Contrasts(basis, sums)


def combination_text(terms: list[tuple[float, Row]]) -> str:
    """"Fig. 5, placement: hg_dnp − Fig. 5, placement: hg_dp"; a coefficient other than ±1 is written out."""
    out = []
    for i, (c, row) in enumerate(terms):
        sign = "−" if c < 0 else "+"
        size = "" if abs(abs(c) - 1) < 1e-6 else f"{abs(c):g}·"
        lead = ("−" if c < 0 else "") if i == 0 else f" {sign} "
        out.append(f"{lead}{size}*{row.title}*")
    return "".join(out)

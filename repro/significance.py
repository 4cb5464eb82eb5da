"""How many of the page's deltas the seeds resolve, counted honestly: each row's two-sided paired t test, the
family-wise (Holm) and false-discovery (Benjamini–Hochberg) corrections over the rows that are linearly independent
(repro/contrasts.py), and the seeds a row would need for a given MDE.

The Student t CDF is computed here, from the regularized incomplete beta function (a continued fraction, evaluated
by the modified Lentz method), so the page needs nothing beyond the standard library: for t ≥ 0 and ν degrees of
freedom, P(|T| ≥ t) = I_x(ν/2, 1/2) with x = ν / (ν + t²).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from repro.stats import ALPHA, Stat, t80, t975


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes' betacf), modified Lentz; converges for
    x < (a + 1) / (a + b + 2)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b  # the symmetry I_x(a,b) = 1 − I_1−x(b,a)


def t_two_sided(t: float, df: int) -> float:
    """P(|T| ≥ |t|) for Student's t with `df` degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t)."""
    half = 0.5 * t_two_sided(t, df)
    return 1.0 - half if t >= 0 else half


def p_value(delta: Optional[Stat]) -> Optional[float]:
    """The two-sided paired t test of a zero mean delta: t = mean / (sd / √n), n − 1 degrees of freedom (None for
    fewer than two seeds; a spread of exactly 0 gives 0 for a non-zero mean)."""
    if delta is None or delta.n < 2:
        return None
    if delta.sd == 0:
        return 1.0 if delta.mean == 0 else 0.0
    return t_two_sided(delta.mean / (delta.sd / math.sqrt(delta.n)), delta.n - 1)


def holm(p: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down rejections at family-wise error `alpha`, in the order of `p`: the i-th smallest (from 0) is
    rejected while every smaller one was and it is ≤ alpha / (m − i). Valid under any dependence between the tests."""
    m, out = len(p), [False] * len(p)
    for i, k in enumerate(sorted(range(m), key=lambda j: p[j])):
        if p[k] > alpha / (m - i):
            break
        out[k] = True
    return out


def benjamini_hochberg(p: Sequence[float], q: float = ALPHA) -> list[bool]:
    """Benjamini–Hochberg rejections at false-discovery rate `q`, in the order of `p`: every test up to the largest
    rank k (from 1) with p_(k) ≤ k·q/m. It controls the FDR for independent or positively dependent tests (deltas
    that share a reference run are positively dependent when it is the reference that is noisy)."""
    m = len(p)
    order = sorted(range(m), key=lambda j: p[j])
    last = max((i for i, k in enumerate(order, 1) if p[k] <= i * q / m), default=0)
    out = [False] * m
    for k in order[:last]:
        out[k] = True
    return out


def mde_at(sd: float, n: int) -> float:
    """(t_{0.975, n−1} + t_{0.80, n−1}) · sd / √n: repro/stats.py's MDE for `n` seeds at paired sd `sd`."""
    return (t975(n - 1) + t80(n - 1)) * sd / math.sqrt(n)


def seeds_for(sd: float, target: float, most: int = 100_000) -> Optional[int]:
    """The fewest seeds (≥ 2) whose MDE at paired sd `sd` is at most `target` (None beyond `most`)."""
    return fewest(lambda n: mde_at(sd, n), target, most)


def half_at(sd: float, n: int) -> float:
    """t_{0.975, n−1} · sd / √n: the 95 % interval's half-width for `n` seeds at paired sd `sd`."""
    return t975(n - 1) * sd / math.sqrt(n)


def seeds_for_half(sd: float, half: float, most: int = 100_000) -> Optional[int]:
    """The fewest seeds (≥ 2) whose interval half-width at paired sd `sd` is at most `half` (None beyond `most`)."""
    return fewest(lambda n: half_at(sd, n), half, most)


def fewest(width, target: float, most: int) -> Optional[int]:
    """The fewest n in 2..most with width(n) ≤ target; None for a target ≤ 0 or none up to `most`."""
    if target <= 0:
        return None
    return next((n for n in range(2, most + 1) if width(n) <= target), None)

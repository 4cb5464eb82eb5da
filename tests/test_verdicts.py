"""repro.stats, repro.measure and repro.laws on synthetic numbers: the MDE's formula and its 1/√n, verdicts on sign
and size, a row with another's runs shown once, shared runs marked, v1 against v2, and the ladder's laws — parallel
or not, where they cross, one headline multiplier only for parallel laws."""
from __future__ import annotations

import json
import math

import pytest

from config import load_config
from repro.comparisons import Comparison, Curve, Plan
from repro.laws import PowerLaw, Rung, crossing, ladder_law, log_multiplier_at
from repro.measure import Results
from repro.page import reading, versus_v1
from repro.sections import delta_cells, law_lines, lr_grid_section
from repro.stats import T80, T975, Stat, at_least, stat, verdict, verdict_class


def t_quantile(p: float, df: int) -> float:
    """Student t's p-quantile from its density (Simpson's rule, then bisection): the tables' reference."""
    def pdf(x):
        return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                        - (df + 1) / 2 * math.log1p(x * x / df))

    def cdf(t, k=4000):
        h = t / k
        return 0.5 + h / 3 * sum((1 if i in (0, k) else 4 if i % 2 else 2) * pdf(i * h) for i in range(k + 1))
    lo, hi = 0.0, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("df", [1, 2, 3, 5, 8, 13, 30])
def test_t_tables_are_the_quantiles(df):
    assert T975[df - 1] == pytest.approx(t_quantile(0.975, df), abs=6e-4)
    assert T80[df - 1] == pytest.approx(t_quantile(0.80, df), abs=6e-4)


def test_mde_is_the_formula_and_shrinks_as_one_over_root_n():
    sd = 0.02
    for n in (2, 4, 6, 12, 31):
        s = Stat(0.0, sd, n)
        assert s.mde == pytest.approx((T975[n - 2] + T80[n - 2]) * sd / math.sqrt(n) if n <= 31 else 0)
        assert s.mde * math.sqrt(n) / (T975[n - 2] + T80[n - 2]) == pytest.approx(sd)  # √n·MDE / (t + t) = sd
    # Past the tables the quantiles are the normal's: four times the seeds, half the MDE, exactly.
    assert Stat(0.0, sd, 160).mde / Stat(0.0, sd, 40).mde == pytest.approx(0.5, rel=1e-12)
    assert Stat(0.0, sd, 40).mde == pytest.approx((1.960 + 0.842) * sd / math.sqrt(40))
    # Within them the t quantiles fall too: from 4 to 16 seeds the MDE falls by more than √4.
    assert Stat(0.0, sd, 16).mde < Stat(0.0, sd, 4).mde / 2
    assert math.isnan(Stat(0.0, sd, 1).mde)


def test_verdicts_on_sign_and_size():
    paper = -0.0245
    five_times = Stat(5 * paper, 0.004, 6)  # resolved, tight: the paper's value far outside the interval
    assert five_times.resolved and not five_times.contains(paper)
    assert verdict_class(five_times, paper) == "right sign, larger" != "reproduces"
    assert verdict_class(Stat(paper / 5, 0.0005, 6), paper) == "right sign, smaller"
    assert verdict_class(Stat(1.8 * paper, 0.004, 6), paper) == "reproduces"  # within the factor of 2
    assert verdict_class(Stat(5 * paper, 0.1, 6), paper) == "reproduces"  # the paper's value inside the interval
    assert verdict_class(Stat(-paper, 0.004, 6), paper) == "opposite sign"
    noise = Stat(paper, 0.05, 4)
    assert verdict(noise, paper) == f"within noise (MDE {noise.mde:.4f})"
    assert verdict(Stat(paper, 0.0, 1), paper) == "one seed" and verdict(None, paper) == "no runs"
    assert verdict(five_times, None) == "resolved"


def test_chance_is_binomial():
    assert at_least(0, 24) == pytest.approx(1.0)
    assert at_least(1, 20) == pytest.approx(1 - 0.95 ** 20)
    assert at_least(3, 10) == pytest.approx(1 - sum(math.comb(10, j) * 0.05 ** j * 0.95 ** (10 - j) for j in range(3)))


# ---------------------------------------------------------------------------------------------- runs, rows

def fake_run(path, finals: list[float], steps: int = 10) -> None:
    """A finished run directory: its config and a metrics.jsonl with three evaluations ending at `finals[-1]`."""
    path.mkdir(parents=True)
    cfg = load_config("configs/tiny_cpu.yaml", [f"train.steps={steps}", "schedule.warmup_steps=1"])
    (path / "config.yaml").write_text(cfg.to_yaml())
    recs = [{"kind": "eval", "step": 0, "tokens": 0, "val_loss": 9.0, "val_loss/wiki": 9.0}]
    recs += [{"kind": "eval", "step": steps * (i + 1) // len(finals), "tokens": 100 * (i + 1), "val_loss": v,
              "val_loss/wiki": v + 1} for i, v in enumerate(finals)]
    recs.append({"kind": "train", "step": steps, "tokens": 100 * len(finals), "epoch": 0.5, "loss": finals[-1]})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


SEEDS = 3


def grid_plan(tmp_path, losses: dict[str, list[float]]):
    """Fig. 1's grid at 4e-3 and 8e-3, and a panel "fig8-muon" whose two curves read the grid's 4e-3 runs."""
    grid = Comparison("fig1-lr_grid", "Fig. 1, grid", "§4.1", tuple(
        Curve(f"{m} lr {lr}", "1", m) for lr in ("4e-3", "8e-3") for m in ("baseline", "none")), kind="lr_grid")
    muon = Comparison("fig8-muon", "Fig. 8, Muon", "§4.7", (Curve("baseline", "8", "b"),
                                                            Curve("unified", "8", "u", paper_delta=-0.0156)))
    plan = Plan(SEEDS, (4e-3, 8e-3), (), [grid, muon])
    where = {}
    for label, base in losses.items():
        for s in range(SEEDS):
            fake_run(tmp_path / f"{label.replace(' ', '_')}-s{s}", [base + 0.1, base + 0.01 * s])
            where[(f"fig1-lr_grid/{label}", s)] = tmp_path / f"{label.replace(' ', '_')}-s{s}"
    for s in range(SEEDS):  # the panel reads the grid's runs at 4e-3: the same pair as "same lr (4e-3)"
        where[("fig8-muon/baseline", s)] = where[("fig1-lr_grid/baseline lr 4e-3", s)]
        where[("fig8-muon/unified", s)] = where[("fig1-lr_grid/none lr 4e-3", s)]
    return plan, where


def test_a_row_with_the_runs_of_another_is_shown_once(tmp_path):
    # Both models are best at 4e-3: "each at its best lr" is the "same lr (4e-3)" pair.
    plan, where = grid_plan(tmp_path, {"baseline lr 4e-3": 3.0, "none lr 4e-3": 3.03, "baseline lr 8e-3": 3.2,
                                       "none lr 8e-3": 3.3})
    res = Results(plan, where, "wiki")
    same, best, muon = res.rows
    assert (same.label, best.label) == ("same lr (4e-3)", "each at its best lr (none 4e-3, baseline 4e-3)")
    assert same.same_as is None and same.counted and same.delta.mean == pytest.approx(0.03)
    assert best.same_as == same.title and not best.counted
    assert muon.same_as == same.title  # another comparison, the same runs reversed in name only
    assert [r.counted for r in res.rows] == [True, False, False]
    text = "\n".join(lr_grid_section(res, plan.comparisons[0], tmp_path / "img"))
    assert text.count("| same lr (4e-3) | +0.0300 [") == 1 and text.count("not counted again") == 1
    assert text.count("+0.0300 [") == 2  # its val and WikiText-2 deltas, once each: the best-lr row repeats neither
    assert f"(the same runs as *{same.title}*)" in delta_cells(best)
    # Shared runs: the grid's 4e-3 curves are read by the Muon panel too, and marked so.
    assert res.readers(plan.comparisons[0], plan.comparisons[0].curves[0]) == ["Fig. 8, Muon"]
    assert "† Runs shared with other comparisons" in text and "baseline lr 4e-3: also Fig. 8, Muon" in text
    assert (tmp_path / "img" / "fig1-lr_grid.png").stat().st_size > 1000


def test_distinct_best_lrs_are_their_own_row_and_curves_are_paired(tmp_path):
    plan, where = grid_plan(tmp_path, {"baseline lr 4e-3": 3.0, "none lr 4e-3": 3.03, "baseline lr 8e-3": 3.2,
                                       "none lr 8e-3": 2.95})
    res = Results(plan, where, "wiki")
    same, best, _ = res.rows
    assert best.label == "each at its best lr (none 8e-3, baseline 4e-3)" and best.same_as is None
    assert best.delta.mean == pytest.approx(-0.05) and best.delta.sd == pytest.approx(0.0, abs=1e-12)
    band = res.delta_band(best)  # from the first evaluation after step 0, every seed paired
    assert band.tokens == [100, 200] and [s.n for s in band.stats] == [SEEDS, SEEDS]
    assert [s.mean for s in band.stats] == pytest.approx([-0.05, -0.05])


def test_v1_deltas_persist_or_fade(tmp_path):
    plan, where = grid_plan(tmp_path, {"baseline lr 4e-3": 3.0, "none lr 4e-3": 3.03, "baseline lr 8e-3": 3.2,
                                       "none lr 8e-3": 3.3})
    text = "\n".join(versus_v1(Results(plan, where, "wiki")))
    # v1's same-lr delta was +0.0258 [+0.0020, +0.0496]; here +0.0300 with no spread: resolved, the same sign.
    assert "- **persist** (resolved in both with the same sign): Fig. 1, grid: same lr (4e-3) (+0.0258 → +0.0300)" \
        in text
    assert "Of the 1 deltas measured in both" in text and "0.15–0.17 tokens per parameter" in text


def test_a_page_of_one_seed_tallies_no_signs(tmp_path):
    plan, where = grid_plan(tmp_path, {"baseline lr 4e-3": 3.0, "none lr 4e-3": 3.03, "baseline lr 8e-3": 3.2,
                                       "none lr 8e-3": 3.3})
    one = {key: path if key[1] == 0 else tmp_path / "not-run" for key, path in where.items()}  # seeds 1, 2 unrun
    text = "\n".join(reading(Results(plan, one, "wiki"), []))
    assert "No delta has two seeds yet" in text and "of the 0 mean deltas" not in text
    text = "\n".join(reading(Results(plan, where, "wiki"), []))  # three seeds: the tally is back
    assert "No delta has two seeds yet" not in text and "1 of the 1 mean deltas have the paper's sign" in text


# ---------------------------------------------------------------------------------------------------- laws

def synthetic_ladder(ref: PowerLaw, other: PowerLaw, compute: list[float], seeds: int = 4) -> list[Rung]:
    """Each seed's losses on the two laws with a small deterministic wobble (±0.2 %, different per seed/rung)."""
    def wobble(s, i, k):
        return 1 + 0.002 * math.sin(1.7 * s + 2.3 * i + 0.9 * k)
    return [Rung(c, {"baseline": {s: ref.loss(c) * wobble(s, i, 0) for s in range(seeds)},
                     "unified": {s: other.loss(c) * wobble(s, i, 1) for s in range(seeds)}})
            for i, c in enumerate(compute)]


def test_parallel_laws_have_one_multiplier():
    ref, other = PowerLaw(3.0, -0.05), PowerLaw(2.9, -0.05)
    law = ladder_law(synthetic_ladder(ref, other, [1, 4, 16, 64]), "baseline", "unified")
    assert law.parallel and law.exponent_diff.contains(0.0) and law.falling
    assert crossing(ref, other) is None
    expected = (3.0 / 2.9) ** (1 / 0.05)  # (a_ref / a_new)^(1/b), docs/paper.md §4.5's formula
    assert math.exp(law.log_headline) == pytest.approx(expected, rel=0.1)
    assert all(math.exp(m) == pytest.approx(expected, rel=0.1) for m in law.log_multipliers)
    lines = "\n".join(law_lines(law, 1.22))
    assert "One multiplier for the ladder" in lines and "No single multiplier" not in lines
    assert "the laws are parallel within it" in lines


def test_parallel_laws_whose_multiplier_holds_1_have_no_headline():
    """Parallel laws (the exponents' interval holds 0), but each seed's unified curve sits up to 1 % off at every
    rung alike, so the ladder's multiplier is unresolved: no headline."""
    ref, other = PowerLaw(3.0, -0.05), PowerLaw(2.995, -0.05)  # a true multiplier of (3/2.995)^20 ≈ 1.03×
    rungs = synthetic_ladder(ref, other, [1, 4, 16, 64])
    for rung in rungs:  # a per-seed offset moves a seed's a, not its b: log multiplier ±0.01/0.05 = ±0.2
        rung.losses["unified"].update({s: L * (1 + 0.01 * math.sin(1.3 * s + 0.4))
                                       for s, L in rung.losses["unified"].items()})
    law = ladder_law(rungs, "baseline", "unified")
    assert law.parallel and law.falling
    assert law.mean_multiplier.contains(0.0) and not law.resolved
    assert law.log_headline is None
    lines = "\n".join(law_lines(law, 1.22))
    assert "One multiplier for the ladder" not in lines
    assert "the laws are parallel within their interval, but the ladder's multiplier" in lines
    assert "which holds 1" in lines


def test_laws_that_cross_above_the_range_have_no_headline():
    ref, other = PowerLaw(3.0, -0.05), PowerLaw(2.8, -0.04)
    c_cross = math.exp((math.log(2.8) - math.log(3.0)) / (-0.05 + 0.04))  # ≈ 991
    assert crossing(ref, other) == pytest.approx(c_cross)
    assert math.exp(log_multiplier_at(ref, other, c_cross)) == pytest.approx(1.0)  # equal losses: multiplier 1
    assert log_multiplier_at(ref, other, 10.0) == pytest.approx(math.log(10.0 / other.compute(ref.loss(10.0))))
    law = ladder_law(synthetic_ladder(ref, other, [1, 4, 16, 64]), "baseline", "unified")
    assert law.parallel is False and not law.exponent_diff.contains(0.0)
    assert law.exponent_diff.mean == pytest.approx(0.01, abs=0.002)
    assert law.crossing == pytest.approx(c_cross, rel=0.3) and law.crossing_place == "above"
    assert law.log_headline is None
    assert law.log_multipliers[0] > law.log_multipliers[-1] > 0  # unified ahead, by less at more compute
    lines = "\n".join(law_lines(law, 1.22))
    assert "No single multiplier: it depends on the loss" in lines and "One multiplier" not in lines
    assert "above the measured range" in lines and "the laws are not parallel" in lines


def test_a_crossing_inside_the_range_and_too_few_seeds():
    ref, other = PowerLaw(3.0, -0.05), PowerLaw(2.8, -0.04)  # cross at C ≈ 991
    law = ladder_law(synthetic_ladder(ref, other, [100, 1000, 10000]), "baseline", "unified")
    assert law.crossing_place == "inside"
    assert law.log_multipliers[0] > 0 > law.log_multipliers[-1]  # unified ahead below the crossing, behind above
    one = ladder_law(synthetic_ladder(ref, other, [100, 1000, 10000], seeds=1), "baseline", "unified")
    assert one.parallel is None and one.log_headline is None
    assert "fewer than two seeds" in "\n".join(law_lines(one, None))
    assert ladder_law(synthetic_ladder(ref, other, [100]), "baseline", "unified") is None  # one rung: no law


def test_stat_of_values():
    s = stat([1.0, 2.0, 3.0])
    assert (s.mean, s.sd, s.n) == (2.0, 1.0, 3)
    assert s.half == pytest.approx(T975[1] / math.sqrt(3)) and not s.resolved  # [−0.48, 4.48] holds 0
    assert stat([1.0, 1.1, 1.2]).resolved
    assert stat([]) is None

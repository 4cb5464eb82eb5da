"""repro.stats, repro.significance, repro.contrasts, repro.measure and repro.laws on synthetic numbers: the MDE's
formula and its 1/√n, every verdict label on constructed intervals, the t test's p values and the Holm and
Benjamini–Hochberg counts, rows that are sums of others, a row with another's runs shown once, shared runs marked,
v1 against v2, and the ladder's laws — parallel or not, where they cross, one headline multiplier only for parallel
laws."""
from __future__ import annotations

import json
import math

import pytest

from config import load_config
from repro.comparisons import Comparison, Curve, Plan, fig1_grid
from repro.laws import PowerLaw, Rung, crossing, ladder_law, log_multiplier_at
from repro.contrasts import combination_text, contrasts
from repro.measure import Results
from repro.first_screen import plain_reading
from repro.reading import CENTRAL, count_section, count_sentence, short_of_power, versus_past
from repro.sections import delta_cells, law_lines, lr_grid_section, panel_section
from repro.significance import benjamini_hochberg, betainc, holm, mde_at, p_value, seeds_for, t_cdf, t_two_sided
from repro.stats import T80, T975, Stat, far, stat, t975, verdict, verdict_class


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


def test_every_verdict_label_on_constructed_intervals():
    """Each label of repro/stats.py from an interval built for it (paper −0.02; half width t₀.₉₇₅ · sd / √n)."""
    paper = -0.02
    cases = {  # Stat → (label, interval)
        "reproduces the size": Stat(-0.022, 0.004, 6),  # [-0.0262, -0.0178]: holds -0.02, ±0.0042 ≤ 0.01
        "consistent with the paper": Stat(-0.022, 0.012, 6),  # [-0.0346, -0.0094]: holds -0.02, ±0.0126 > 0.01
        "right sign, larger": Stat(-0.1, 0.004, 6),  # [-0.104, -0.096]: resolved, the paper's value above it
        "right sign, smaller": Stat(-0.005, 0.001, 6),  # [-0.006, -0.004]
        "contradicts": Stat(+0.02, 0.004, 6),  # resolved, opposite sign
        "the paper's size is ruled out here": Stat(+0.01, 0.02, 6),  # [-0.011, +0.031]: holds 0, not -0.02
        "cannot tell at this power (uninformative)": Stat(-0.01, 0.05, 4),  # holds both; MDE 0.104 > 0.02
        "undecided at this power": Stat(-0.01, 0.0379, 40),  # holds both (±0.0118); MDE 0.0168 ≤ 0.02
    }
    for label, s in cases.items():
        assert verdict_class(s, paper) == label, (label, s.lo, s.hi, s.mde)
    ruled = cases["the paper's size is ruled out here"]
    assert not ruled.resolved and ruled.contains(0.0) and not ruled.contains(paper)
    blind, undecided = cases["cannot tell at this power (uninformative)"], cases["undecided at this power"]
    assert blind.contains(0.0) and blind.contains(paper) and blind.mde > abs(paper)
    assert undecided.contains(0.0) and undecided.contains(paper) and undecided.mde <= abs(paper)
    # The size rule's edge: a half-width of exactly half the paper's |Δ| still fixes the size.
    edge = Stat(-0.02, 0.01 * 6 ** 0.5 / t975(5), 6)
    assert edge.half == pytest.approx(0.01) and verdict_class(edge, paper) == "reproduces the size"
    assert verdict_class(Stat(-0.02, 1.01 * edge.sd, 6), paper) == "consistent with the paper"
    # What each cell says: the ratio where it holds the paper's value, the MDE against |paper| where it cannot tell.
    assert verdict(cases["reproduces the size"], paper) == "reproduces the size (ours/paper 1.10)"
    assert verdict(cases["consistent with the paper"], paper) == (
        "consistent with the paper (ours/paper 1.10; ± 0.0126 is wider than half the paper's |Δ|, so no size)")
    assert verdict(ruled, paper) == "unresolved; the paper's size is ruled out here (the interval excludes -0.0200)"
    assert verdict(blind, paper) == f"cannot tell at this power (uninformative): MDE {blind.mde:.4f} > |paper| 0.0200"
    assert "within noise" not in " ".join(verdict(s, paper) for s in cases.values())
    # A wide interval that holds a paper value 6.8× smaller is only consistent with it, and far (hg_dp_or in v2).
    wide = Stat(-0.0430, 0.0262, 4)
    assert verdict_class(wide, -0.0063) == "consistent with the paper" and far(wide, -0.0063)
    assert verdict(wide, -0.0063) == ("consistent with the paper (ours/paper 6.83, far from the paper; ± 0.0417 is "
                                      "wider than half the paper's |Δ|, so no size)")
    assert far(cases["contradicts"], paper) and far(cases["right sign, smaller"], paper)
    assert not far(cases["reproduces the size"], paper) and not far(cases["reproduces the size"], None)
    # Without a paper value, without seeds.
    assert verdict_class(cases["right sign, larger"], None) == "resolved"
    assert verdict_class(blind, None) == "unresolved"
    assert verdict(Stat(paper, 0.0, 1), paper) == "one seed" and verdict(None, paper) == "no runs"


def test_t_cdf_from_the_incomplete_beta():
    # The tables' two-sided 5 % points give p = 0.05, and a few closed forms: df 1 is Cauchy, df 2 has
    # P(T ≤ t) = 1/2 + t / (2·√(2 + t²)).
    for df, t in ((4, 2.776), (1, 12.706), (10, 2.228), (30, 2.042)):
        assert t_two_sided(t, df) == pytest.approx(0.05, abs=2e-4)
        assert t_two_sided(T975[df - 1], df) == pytest.approx(0.05, abs=2e-4)
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)  # ½ + atan(1)/π
    for t in (-3.0, -0.4, 0.0, 0.7, 5.0):
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_two_sided(0.0, 7) == pytest.approx(1.0) and t_two_sided(math.inf, 3) == 0.0
    assert t_cdf(-2.0, 5) == pytest.approx(1 - t_cdf(2.0, 5), abs=1e-12)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 − Σ_{j<2} C(4,j) 0.4^j 0.6^(4−j)
    # The paired test: t = mean / (sd / √n), n − 1 degrees of freedom.
    assert p_value(Stat(0.05, 0.05 * math.sqrt(5) / 2.776, 5)) == pytest.approx(0.05, abs=2e-4)
    assert p_value(Stat(0.01, 0.0, 3)) == 0.0 and p_value(Stat(0.0, 0.0, 3)) == 1.0 and p_value(Stat(1, 0, 1)) is None


def test_holm_and_benjamini_hochberg():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: 0.005 ≤ 0.05/4, 0.01 ≤ 0.05/3, then 0.03 > 0.05/2 stops it.
    assert holm(p) == [True, False, False, True]
    # BH: the largest k with p_(k) ≤ k·0.05/4 is k = 4 (0.04 ≤ 0.05): all four.
    assert benjamini_hochberg(p) == [True, True, True, True]
    assert benjamini_hochberg([0.02, 0.5, 0.03]) == [True, False, True]  # 0.03 ≤ 2·0.05/3: both smaller ones
    assert benjamini_hochberg([0.02, 0.5, 0.04]) == [False, False, False]  # 0.02 > 0.05/3, 0.04 > 0.1/3, 0.5 > 0.05
    assert holm([]) == [] and benjamini_hochberg([]) == []
    for ps in ([0.001, 0.2, 0.012, 0.013, 0.04], [0.3, 0.6], [0.0004] * 5):
        h, b = holm(ps), benjamini_hochberg(ps)
        assert all(b_ for h_, b_ in zip(h, b) if h_)  # BH rejects at least what Holm does


def test_seeds_for_an_mde():
    sd = 0.051  # Fig. 6's d64 L4 rung in v2
    n = seeds_for(sd, 0.0302)
    assert mde_at(sd, n) <= 0.0302 < mde_at(sd, n - 1)
    assert mde_at(sd, 4) == pytest.approx(Stat(0.0, sd, 4).mde)
    assert seeds_for(0.0, 0.02) == 2 and seeds_for(sd, 0.0) is None
    assert seeds_for(sd / 2, 0.0302) < n  # half the spread, fewer seeds


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
        Curve(f"{m} lr {lr}", "1", m) for lr in ("4e-3", "8e-3") for m in ("baseline", "none")), kind="lr_grid",
        grid=fig1_grid((4e-3, 8e-3)))
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
    # its val and WikiText-2 deltas, once each: the best-lr row repeats neither; the sentence under the table says it
    # is the same delta, and that retuning moved neither design
    assert text.count("+0.0300 [") == 3
    assert ("Both designs are best at 4e-3, so the delta with each at its best lr is the same-lr one, without − with "
            "+0.0300 [") in text and "baseline leads, resolved: **retuning moved neither design**" in text
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
    # With scale vectors ahead at the same lr, without ahead with each at its best: the lead reverses.
    text = "\n".join(lr_grid_section(res, plan.comparisons[0], tmp_path / "img"))
    assert ("without − with: +0.0300 [+0.0300, +0.0300] at the same lr (4e-3), -0.0500 [-0.0500, -0.0500] with each "
            "at its best lr (none 8e-3, baseline 4e-3; each paired by seed): baseline leads at the same lr and none "
            "with each at its best, both resolved; retuning changes it by -0.0800 [-0.0800, -0.0800], resolved: "
            "**the lead reverses under lr retuning**.") in text


def test_v1_deltas_persist_or_fade(tmp_path):
    plan, where = grid_plan(tmp_path, {"baseline lr 4e-3": 3.0, "none lr 4e-3": 3.03, "baseline lr 8e-3": 3.2,
                                       "none lr 8e-3": 3.3})
    text = "\n".join(versus_past(Results(plan, where, "wiki")))
    # v1's same-lr delta was +0.0258 [+0.0020, +0.0496]; here +0.0300 with no spread: resolved, the same sign.
    assert "- **persist** (resolved in both with the same sign): Fig. 1, grid: same lr (4e-3) (+0.0258 → +0.0300)" \
        in text
    assert "Of the 1 deltas measured in both" in text and "0.15–0.17 tokens per parameter" in text


def test_runs_on_the_training_mixture_are_read_against_v2(tmp_path):
    # The same runs, but evaluating the mixture as v3's do: the page is v3's, and its predecessor is v2.
    plan, where = grid_plan(tmp_path, {"baseline lr 4e-3": 3.0, "none lr 4e-3": 3.03, "baseline lr 8e-3": 3.2,
                                       "none lr 8e-3": 3.3})
    for run in set(where.values()):
        cfg = load_config(run / "config.yaml", ["train.eval_sample=mixture"])
        (run / "config.yaml").write_text(cfg.to_yaml())
    res = Results(plan, where, "wiki")
    text = "\n".join(versus_past(res))
    # Fig. 1's best-vs-best row (its same-lr row, both best at 4e-3) and the Muon panel (the same runs) have no spread
    # over seeds (MDE 0), but 3 seeds are short of a pilot's 4: the rule has no n for them, so every claim is short.
    assert short_of_power(res) == [name for name, _, _ in CENTRAL]
    assert text.startswith("### v3 against v2") and "Shakespeare alone" in text
    # v2's same-lr delta was +0.0435 [+0.0017, +0.0852], resolved; here +0.0300, resolved with the same sign.
    assert "- **persist** (resolved in both with the same sign): Fig. 1, grid: same lr (4e-3) (+0.0435 → +0.0300)" \
        in text and "Of the 1 deltas measured in both (v2 → v3):" in text


def chain_plan(tmp_path, finals: dict[str, list[float]]):
    """Two panels over four curves' runs: "A" (reference r: x, y, z) and "B" (reference x: y), so that B's y − x is
    A's y − r minus A's x − r; z is on its own."""
    a = Comparison("fig5-a", "A", "§4.4", (Curve("r", "5", "r"), Curve("x", "5", "x", paper_delta=-0.01),
                                           Curve("y", "5", "y", paper_delta=-0.02),
                                           Curve("z", "5", "z", paper_delta=0.01)))
    b = Comparison("fig5-b", "B", "§4.4", (Curve("x", "5", "x"), Curve("y", "5", "y", paper_delta=-0.01)))
    where = {}
    for name, values in finals.items():
        for s, v in enumerate(values):
            fake_run(tmp_path / f"{name}-s{s}", [v + 0.1, v])
            for comp in (a, b):
                where[(f"{comp.key}/{name}", s)] = tmp_path / f"{name}-s{s}"
    return Plan(len(next(iter(finals.values()))), (4e-3,), (), [a, b]), where


def test_rows_that_are_sums_of_others_are_not_counted_again(tmp_path):
    plan, where = chain_plan(tmp_path, {"r": [3.0, 3.01, 2.99, 3.0], "x": [2.98, 2.985, 2.975, 2.99],
                                        "y": [2.9, 2.93, 2.88, 2.91], "z": [3.0, 3.05, 2.96, 3.02]})
    res = Results(plan, where, "wiki")
    assert [r.title for r in res.rows] == ["A: x", "A: y", "A: z", "B: y"] and all(r.counted for r in res.rows)
    c = contrasts(res.rows)
    assert [r.title for r in c.basis] == ["A: x", "A: y", "A: z"]
    (row, terms), = c.sums
    assert row.title == "B: y" and [(k, t.title) for k, t in terms] == [(-1.0, "A: x"), (1.0, "A: y")]
    assert combination_text(terms) == "−*A: x* + *A: y*"
    assert row.delta.mean == pytest.approx(res.rows[1].delta.mean - res.rows[0].delta.mean)
    text = "\n".join(count_section(res, []))
    assert "- *B: y* = −*A: x* + *A: y*" in text and "3 rows form the basis" in text
    # The tests run over the basis only: one p per basis row, Holm and BH over those three.
    p = [p_value(r.delta) for r in c.basis]
    table = [line for line in text.splitlines() if line.startswith(("| A: ", "| B: "))]
    assert [line.split(" | ")[0] for line in table] == ["| A: x", "| A: y", "| A: z"]
    assert [line.split(" | ")[2] for line in table] == [f"{v:.2g}" for v in p]
    sentence = count_sentence(res, c)
    assert sentence.startswith("Counting only what is measured once: 3 of the 4 distinct rows are linearly independent")
    assert f"{sum(holm(p))} {'survives' if sum(holm(p)) == 1 else 'survive'} Holm's" in sentence
    assert f"and {sum(benjamini_hochberg(p))} Benjamini–Hochberg's" in sentence
    plain = "\n".join(plain_reading(res))
    assert sentence in plain and "**Supported**" in plain


def test_a_row_the_page_leads_with_keeps_its_own_test(tmp_path):
    """B: y is A: y − A: x. In page order B: y is the sum; tried first, it joins the basis and A: y becomes the sum
    (of B: y and A: x), the rank the same. The basis is listed in page order either way."""
    plan, where = chain_plan(tmp_path, {"r": [3.0, 3.01, 2.99, 3.0], "x": [2.98, 2.985, 2.975, 2.99],
                                        "y": [2.9, 2.93, 2.88, 2.91], "z": [3.0, 3.05, 2.96, 3.02]})
    rows = Results(plan, where, "wiki").rows
    c = contrasts(rows, first=(rows[3],))
    assert [r.title for r in c.basis] == ["A: x", "A: z", "B: y"]
    (row, terms), = c.sums
    assert row.title == "A: y" and combination_text(terms) == "*A: x* + *B: y*"
    assert row.delta.mean == pytest.approx(rows[0].delta.mean + rows[3].delta.mean)
    assert len(contrasts(rows).basis) == len(c.basis) == 3


def test_a_panel_orders_its_curves_only_where_three_have_runs(tmp_path):
    """A's four curves order by loss, WikiText-2 (val + 1 here) in the same order; with only two of them run the
    panel states no order at all, rather than an order of what happens to be there."""
    plan, where = chain_plan(tmp_path, {"r": [3.0, 3.01, 2.99], "x": [2.98, 2.985, 2.975],
                                        "y": [2.9, 2.93, 2.88], "z": [3.05, 3.06, 3.04]})
    a = plan.comparisons[0]
    lines, same = panel_section(Results(plan, where, "wiki"), a, tmp_path / "img")
    assert same is True and "Ordering by validation loss (best first): y < x < r < z. On WikiText-2: y < x < r < z " \
        "(the same order)." in lines
    two = {k: (d if k[0].split("/")[1] in ("r", "x") else tmp_path / "not-run") for k, d in where.items()}
    lines, same = panel_section(Results(plan, two, "wiki"), a, tmp_path / "img")
    assert same is None and not any(line.startswith("Ordering") for line in lines)


def test_a_page_of_one_seed_tallies_no_signs(tmp_path):
    plan, where = grid_plan(tmp_path, {"baseline lr 4e-3": 3.0, "none lr 4e-3": 3.03, "baseline lr 8e-3": 3.2,
                                       "none lr 8e-3": 3.3})
    one = {key: path if key[1] == 0 else tmp_path / "not-run" for key, path in where.items()}  # seeds 1, 2 unrun
    text = "\n".join(count_section(Results(plan, one, "wiki"), []))
    assert "No delta has two seeds yet" in text and "of the 0 mean deltas" not in text
    assert "No delta has two seeds yet" in "\n".join(plain_reading(Results(plan, one, "wiki")))
    text = "\n".join(count_section(Results(plan, where, "wiki"), []))  # three seeds: the tally is back
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
    # two rungs: a line through two points, nothing left to test it (results v4, item 6)
    assert ladder_law(synthetic_ladder(ref, other, [100, 1000]), "baseline", "unified") is None


def test_stat_of_values():
    s = stat([1.0, 2.0, 3.0])
    assert (s.mean, s.sd, s.n) == (2.0, 1.0, 3)
    assert s.half == pytest.approx(T975[1] / math.sqrt(3)) and not s.resolved  # [−0.48, 4.48] holds 0
    assert stat([1.0, 1.1, 1.2]).resolved
    assert stat([]) is None


def test_wikitext_beside_a_central_row_and_every_resolved_flip_named():
    """The first screen's table gives each claim's WikiText-2 delta and marks one whose sign flips there, resolved
    both ways; an unresolved flip or a kept sign is no flip."""
    from types import SimpleNamespace

    from repro.first_screen import wiki_cell
    from repro.reading import sign_flips
    up, down, unsure = Stat(+0.04, 0.01, 6), Stat(-0.10, 0.02, 6), Stat(-0.01, 0.05, 6)
    flip = SimpleNamespace(title="flips", delta=up, wiki=down)
    kept = SimpleNamespace(title="kept", delta=up, wiki=Stat(+0.05, 0.01, 6))
    open_ = SimpleNamespace(title="open", delta=up, wiki=unsure)
    assert wiki_cell(flip) == "-0.1000 [-0.1210, -0.0790], flips"
    assert wiki_cell(open_).startswith("-0.0100 [") and "flips" not in wiki_cell(open_)
    assert wiki_cell(SimpleNamespace(title="none", delta=up, wiki=None)) == "–"
    assert sign_flips([flip, kept, open_]) == [flip]


def test_each_rows_n_is_fixed_from_its_pilot(monkeypatch):
    """The page's rule as written: n is fixed from the first 4 paired deltas' sd (the fewest seeds, at least 4, whose
    MDE meets the target), and later deltas never change it; rows above or below their n are said plainly."""
    from types import SimpleNamespace

    from repro.reading import PILOT_SEEDS, beyond_rule_lines, planned_seeds
    from repro.significance import mde_at
    pilot = [0.01, -0.01, 0.01, -0.01]
    sd = stat(pilot).sd
    target = mde_at(sd, 6)  # met first at 6 seeds, exactly
    assert mde_at(sd, 5) > target and PILOT_SEEDS == 4
    assert planned_seeds(pilot, target) == 6 and planned_seeds(pilot[:3], target) is None
    assert planned_seeds(pilot + [0.5, -0.5, 0.5], target) == 6  # the later spread leaves n as the pilot fixed it
    assert planned_seeds(pilot, 1.0) == PILOT_SEEDS  # a loose target: never fewer than the pilot itself
    rows = {n: SimpleNamespace(title=f"row {n}", paper=None, comparison=None, ours=n, ref=None) for n in (4, 6, 9)}
    res = SimpleNamespace(paired=lambda comp, ours, ref: (pilot * 3)[:ours])
    monkeypatch.setattr("repro.reading.target_mde", lambda r: target)
    text = " ".join(beyond_rule_lines(res, [("", r) for r in rows.values()]))
    assert beyond_rule_lines(res, [("", rows[6])]) == ["Every row has run exactly the seeds its pilot fixed.", ""]
    assert "row 9 ran 9 where its pilot gives 6" in text and "their n was chosen from the data" in text
    assert "Short of their pilot's n (the runs to come): row 4 has 4 of 6." in text


def test_a_central_row_says_whether_it_survives_holm():
    """Holm over the page's basis rows: a strong row survives, a weak one resolved alone does not."""
    from types import SimpleNamespace

    from repro.contrasts import Contrasts
    from repro.reading import holm_family, survives_holm
    strong, weak, null = (SimpleNamespace(delta=Stat(m, 0.01, 8), label="") for m in (-0.05, -0.009, 0.0))
    assert strong.delta.resolved and weak.delta.resolved and not null.delta.resolved
    c = Contrasts(basis=[strong, weak, null], sums=[])
    kept = survives_holm(c)
    assert kept[id(strong)] is True and kept[id(weak)] is False and kept[id(null)] is False
    assert holm_family(c) == "the 3 basis rows"

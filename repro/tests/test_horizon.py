"""The horizon (results v4, repro/comparisons.py HORIZONS): the dense headline at 1, 3 and 10 × the proxy's tokens,
trained by more steps of the same batch; what a longer horizon does to a delta (repro/stats.py over_horizon), and the
page's horizon section on synthetic runs."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from config import load_config
from repro import proxy
from repro.comparisons import (HORIZON_DENSE, HORIZON_LRS, HORIZON_MOE, HORIZONS, MOE_HORIZON_LRS,
                               Plan, horizon_rung, lr_text)
from repro.experiments import config_of
from repro.measure import Results
from repro.runner import plan_runs
from repro.horizon_section import change_text, horizon_section
from repro.stats import (GROWS, H_APPEARS, H_FADES, H_NONE, H_REVERSES, HOLDS, SHRINKS, TOO_FEW, Stat, fmt,
                         over_horizon, t975, welch)


def test_a_horizon_trains_more_steps_of_the_same_batch():
    """Each horizon rung keeps the ×1 batch and multiplies the steps (warmup, evaluations and checkpoints keep their
    share); the longest reaches ≥ 100 tokens per compute parameter within the corpus's pass limit; the runs compile
    by default, and the plan's own overrides (a user's `-- train.compile=false`) win over that."""
    plan = Plan(1)
    uniques, where = plan_runs(plan, "runs/x")
    by_name = {u.job.run_name: u for u in uniques}
    cfgs = {}
    for h in HORIZONS:
        d = where[(f"fig6-horizon_x{h}/unified lr 4e-3", 0)]
        cfgs[h] = cfg = config_of(by_name[d.name].job.argv)
        assert (cfg.model.d_model, cfg.model.n_layers) == (HORIZON_DENSE.d_model, HORIZON_DENSE.n_layers)
        assert cfg.train.compile is True and cfg.optim.lr == 4e-3
        assert cfg.schedule.warmup_steps == round(proxy.WARMUP_FRAC * cfg.train.steps)
        assert cfg.train.eval_every == cfg.train.steps // proxy.EVALS
    one, ten = cfgs[1], cfgs[10]
    assert one.train.global_batch == ten.train.global_batch and one.train.steps >= proxy.MIN_STEPS
    assert ten.train.steps == math.ceil(10 * proxy.TOKENS_PER_PARAM * proxy.compute_params(
        load_config([Path("configs/figures/fig6/0.12b_baseline.yaml"), proxy.PROXY],
                    HORIZON_DENSE.overrides())) / (one.train.global_batch * proxy.SEQ_LEN))
    base = config_of(by_name[where[("fig6-horizon_x10/baseline lr 4e-3", 0)].name].job.argv)
    tokens = base.train.steps * base.train.global_batch * base.data.seq_len
    assert tokens / proxy.compute_params(base) >= 100
    assert tokens <= proxy.MAX_PASSES * proxy.BUILTIN_BPE1024_TRAIN_TOKENS
    moe = {h: config_of(by_name[where[(f"fig7-horizon_x{h}/unified lr 8e-3", 0)].name].job.argv) for h in HORIZONS}
    assert [moe[h].train.compile for h in HORIZONS] == [False, False, True]  # the compile pays only at 10 ×
    assert all(moe[h].model.moe.n_experts == HORIZON_MOE.n_experts for h in HORIZONS)
    assert all(len(MOE_HORIZON_LRS[h]) >= 3 for h in HORIZONS)
    # the grids follow the pilots' best lrs: 1.6e-2 best at 3 × on 4 seeds, the edge, so 3 × goes to 3.2e-2; 4e-3
    # best at 10 × over 4e-3..1.6e-2, so 10 × goes down to the paper's 2e-3, where every rung reads its same-lr row
    assert max(MOE_HORIZON_LRS[1]) == 1.6e-2 and max(MOE_HORIZON_LRS[3]) == 3.2e-2 and min(MOE_HORIZON_LRS[10]) == 2e-3
    grids = {c.horizon: c.grid for c in Plan(1).comparisons if c.key.startswith("fig7-horizon")}
    assert [grids[h].same for h in HORIZONS] == ["2e-3", "2e-3", "2e-3"]
    with pytest.raises(ValueError, match="same-lr row at 2e-3 is not in its grid"):
        horizon_rung(10, "7", "0.5b", -0.0291, HORIZON_MOE, (4e-3, 8e-3))
    eager = Plan(1, overrides=("train.compile=false",))
    uniques, where = plan_runs(eager, "runs/x")
    run = where[("fig6-horizon_x10/baseline lr 4e-3", 0)].name
    assert config_of(next(u for u in uniques if u.job.run_name == run).job.argv).train.compile is False


def test_what_a_longer_horizon_does_to_a_delta():
    lead = Stat(-0.04, 0.01, 8)  # resolved, unified ahead
    assert over_horizon(lead, Stat(-0.045, 0.01, 8)) == HOLDS
    assert over_horizon(lead, Stat(-0.08, 0.01, 8)) == GROWS
    assert over_horizon(lead, Stat(-0.015, 0.01, 8)) == SHRINKS
    assert over_horizon(lead, Stat(-0.005, 0.02, 8)) == H_FADES
    assert over_horizon(lead, Stat(+0.03, 0.01, 8)) == H_REVERSES
    assert over_horizon(Stat(-0.01, 0.05, 4), lead) == H_APPEARS
    assert over_horizon(Stat(-0.01, 0.05, 4), Stat(0.0, 0.05, 4)) == H_NONE
    # a delta that appears says which design it favours: on WikiText-2 it can be the baseline
    assert change_text(Stat(-0.01, 0.05, 4), Stat(+0.04, 0.01, 8)).endswith(
        "**the verdict appears only at the longer horizon, baseline ahead**")
    assert change_text(Stat(+0.01, 0.05, 4), lead).endswith("appears only at the longer horizon, unified ahead**")
    assert over_horizon(lead, Stat(-0.05, 0.0, 1)) == TOO_FEW and over_horizon(None, lead) == TOO_FEW
    # Welch by hand: variances of the means 0.01²/4 and 0.02²/9, Welch–Satterthwaite's df rounded down
    a, b = Stat(-0.04, 0.01, 4), Stat(-0.01, 0.02, 9)
    va, vb = 0.01 ** 2 / 4, 0.02 ** 2 / 9
    df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 8)
    d = welch(a, b)
    assert d.mean == pytest.approx(0.03) and d.half == pytest.approx(t975(math.floor(df)) * math.sqrt(va + vb))


def fake_run(path: Path, final: float, tokens: int, wiki: float = 1.0) -> None:
    """A finished run directory of the tiny config: two evaluations ending at `final` (WikiText-2 `wiki` above it)
    after `tokens` tokens."""
    path.mkdir(parents=True)
    cfg = load_config("configs/tiny_cpu.yaml", ["train.steps=10", "schedule.warmup_steps=1"])
    (path / "config.yaml").write_text(cfg.to_yaml())
    recs = [{"kind": "eval", "step": 0, "tokens": 0, "val_loss": 9.0, "val_loss/wiki": 9.0},
            {"kind": "eval", "step": 10, "tokens": tokens, "val_loss": final, "val_loss/wiki": final + wiki},
            {"kind": "train", "step": 10, "tokens": tokens, "epoch": 0.5, "loss": final}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


FINALS = {1: {"baseline lr 2e-3": 3.2, "unified lr 2e-3": 3.18, "baseline lr 4e-3": 3.1, "unified lr 4e-3": 3.06},
          10: {"baseline lr 2e-3": 2.5, "unified lr 2e-3": 2.49, "baseline lr 4e-3": 2.6, "unified lr 4e-3": 2.58}}
NOISE = (0.0, 0.002, -0.002)  # per seed; unified's twice the baseline's, so the deltas have a spread


def horizon_family(tmp_path: Path, horizons: tuple[int, ...], finals=FINALS, wiki=None, same=None):
    """The dense horizon rungs at `horizons` over a 2-lr grid, 3 seeds, runs at `finals` where it has the horizon
    (none elsewhere), WikiText-2 1 above val but where `wiki` ({(horizon, curve): gap}) says, the same-lr row at the
    paper's 4e-3 but where `same` ({horizon: lr}) says: the Results and the comparisons."""
    comps = [horizon_rung(h, "6", "0.12b", -0.0302, HORIZON_DENSE, (2e-3, 4e-3), same=(same or {}).get(h))
             for h in horizons]
    n = proxy.compute_params(load_config("configs/tiny_cpu.yaml"))
    where = {}
    for comp in comps:
        for c in comp.curves:
            for s in range(3):
                d = tmp_path / f"{comp.key}-{c.label.replace(' ', '_')}-s{s}"
                where[(f"{comp.key}/{c.label}", s)] = d
                if comp.horizon in finals:
                    fake_run(d, finals[comp.horizon][c.label] + NOISE[s] * (2 if "unified" in c.label else 1),
                             round(10.5 * comp.horizon * n), (wiki or {}).get((comp.horizon, c.label), 1.0))
    return Results(Plan(3, comparisons=comps), where, "wiki"), comps


def test_the_horizon_section_reads_each_rung(tmp_path):
    """Two horizons over a 2-lr grid, 3 seeds: unified leads by 0.04 at ×1 (both best at 4e-3) and by 0.01 at ×10
    (both best at 2e-3); the table gives each rung's tokens per compute parameter, best lrs, both deltas and the
    verdict; the sentence says the lead shrinks, with Welch's interval; ×3 has no runs and says how to train it."""
    res, comps = horizon_family(tmp_path, HORIZONS)
    text = "\n".join(horizon_section(res, tmp_path / "img"))
    assert "| 1 | 10.5 | 3 | 4e-3, 4e-3 | -0.0400 [" in text and "| 10 | 105.0 | 3 | 2e-3, 2e-3 | -0.0100 [" in text
    assert "Not run yet: 3 × (8 of 8 curves without a finished run)" not in text  # the grid here has 2 lrs
    assert "Not run yet: 3 × (4 of 4 curves without a finished run). `python -m repro.results --only " \
           "fig6-horizon_x3` trains them." in text
    a, b = res.rows_of(comps[0])[1].delta, res.rows_of(comps[2])[1].delta
    d = welch(a, b)
    assert over_horizon(a, b) == SHRINKS
    assert (f"From 10.5 to 105 tokens per compute parameter, each design at its best lr, unified − baseline goes from "
            f"-0.0400 [{a.lo:+.4f}, {a.hi:+.4f}] to -0.0100 [{b.lo:+.4f}, {b.hi:+.4f}]; the change {d.mean:+.4f} ± "
            f"{d.half:.4f} (Welch, 95 %): **the verdict shrinks (still resolved)**.") in text
    assert (tmp_path / "img" / "fig6-horizon.png").stat().st_size > 1000
    # the lead inside the longest runs (one evaluation after step 0 here, so every share reads the end)
    assert "### The lead inside the longest runs" in text and f"| dense (d32 L4) at 105 | {fmt(b, True)} |" in text
    assert [lr_text(x) for x in HORIZON_LRS[3]] == ["2e-3", "4e-3", "8e-3", "1.6e-2"]
    assert min(HORIZON_LRS[10]) == 1e-3 and max(HORIZON_LRS[1]) == 3.2e-2  # unified's edges on the pilot's 4 seeds


def test_a_path_that_moves_both_ways_and_a_wikitext_reversal_are_said(tmp_path):
    """Unified leads by 0.04 at ×1, by 0.10 at ×3 and by 0.01 at ×10, each step resolved: the ends say "shrinks",
    and the sentence adds each step and that the path moves both ways. On WikiText-2 unified's ×10 runs end 0.05
    higher: its lead there reverses, and the sentence says so with its Welch interval."""
    finals = {**FINALS, 3: {"baseline lr 2e-3": 2.9, "unified lr 2e-3": 2.85, "baseline lr 4e-3": 2.8,
                            "unified lr 4e-3": 2.7}}
    res, comps = horizon_family(tmp_path, HORIZONS, finals, {(10, "unified lr 2e-3"): 1.05})
    text = "\n".join(horizon_section(res, tmp_path / "img"))
    best = [res.rows_of(c)[1] for c in comps]
    steps = [welch(a.delta, b.delta) for a, b in zip(best, best[1:])]
    assert steps[0].mean == pytest.approx(-0.06) and steps[1].mean == pytest.approx(0.09)
    assert (f"Rung by rung (Welch, 95 %): ×1 to ×3 {steps[0].mean:+.4f} ± {steps[0].half:.4f}, ×3 to ×10 "
            f"{steps[1].mean:+.4f} ± {steps[1].half:.4f}: the path moves both ways, each way resolved") in text
    a, b = best[0].wiki, best[-1].wiki
    assert a.mean == pytest.approx(-0.04) and b.mean == pytest.approx(0.04)
    d = welch(a, b)
    assert (f"On WikiText-2 it goes from -0.0400 [{a.lo:+.4f}, {a.hi:+.4f}] to +0.0400 [{b.lo:+.4f}, {b.hi:+.4f}]; "
            f"the change {d.mean:+.4f} ± {d.half:.4f} (Welch, 95 %): **the verdict reverses**.") in text
    # two rungs: no step-by-step sentence; WikiText-2 (1 above val everywhere) shrinks as val does
    res, _ = horizon_family(tmp_path / "two", (1, 10))
    text = "\n".join(horizon_section(res, tmp_path / "img"))
    assert "Rung by rung" not in text and "On WikiText-2 it goes from -0.0400 [" in text \
        and text.count("**the verdict shrinks (still resolved)**") == 2


def test_the_plain_reading_opens_with_the_longest_horizon(tmp_path):
    """The page's first table opens with the headline at the longest horizon run, each design at its best lr, with
    its label, its Holm verdict and its WikiText-2 delta; a line under the table says what the horizon did to it."""
    from repro.first_screen import plain_reading
    res, _ = horizon_family(tmp_path, (1, 10))
    lines = plain_reading(res)
    assert lines[0].startswith("The claims the page leads with, one row each: the headline at the longest horizon run")
    head = lines[4]
    assert head.startswith("| Dense (d32 L4) at 105 tokens per compute parameter, each at its best lr | 3 | no pilot yet "
                           "| -0.0100 [")
    assert "| -0.0302 | right sign, smaller (0.33×) | survives | -0.0100 [" in head
    said = next(x for x in lines if x.startswith("- Dense (d32 L4), best lrs of 2e-3, 4e-3: unified 2e-3, baseline "
                                                 "2e-3. "))
    assert ("From 10.5 to 105 tokens per compute parameter, **the verdict shrinks (still resolved)** (-0.0400 to "
            "-0.0100).") in said and "Both designs' best lr is the grid's smallest (2e-3)" in said


def test_a_horizon_headline_short_of_power_is_named_as_not_done(tmp_path, monkeypatch):
    """The longest rung's best-vs-best row is a claim of the first screen, and the pilot rule says when it has its
    seeds: with 3 seeds it has no pilot (4), so it is short however small its MDE (spread 0.002: under the paper's
    |Δ|), and the list of what is not done names it first."""
    from repro import reading
    res, _ = horizon_family(tmp_path / "tight", (1, 10))
    (name, row), = reading.horizon_heads(res)
    assert name == "Dense (d32 L4) at 105 tokens per compute parameter, each at its best lr" and row.delta.n == 3
    assert row.delta.mde < 0.0302 and reading.row_plan(res, row) is None and reading.short_of_power(res)[0] == name
    monkeypatch.setattr(sys.modules[__name__], "NOISE", (0.0, 0.05, -0.05))
    res, _ = horizon_family(tmp_path / "loose", (1, 10))
    (_, row), = reading.horizon_heads(res)
    assert row.delta.mde > 0.0302 and reading.short_of_power(res)[0] == name


def test_a_page_with_a_horizon_run_is_v4_read_against_v3(tmp_path):
    """A horizon rung past 1 × is v4's own comparison: mixture-eval runs with one of its runs are v4's, read against
    v3's kept deltas (repro/tests/test_results_sources.py reads v3's own archive, whose 1 × rungs are its ladders'
    runs, as v3's, against v2)."""
    from repro.reading import past_page, versus_past
    res, _ = horizon_family(tmp_path, (1, 10))
    assert past_page(res)[0] == "v2"  # the tiny config evaluates a prefix of the val split, as v2's runs did
    for d in (p for p in tmp_path.iterdir() if p.is_dir()):
        cfg = load_config(d / "config.yaml", ["train.eval_sample=mixture"])
        (d / "config.yaml").write_text(cfg.to_yaml())
    res = Results(res.plan, res.where, "wiki")
    assert past_page(res)[0] == "v4" and past_page(res)[1].name == "v3"
    assert versus_past(res)[0] == "### v4 against v3"


def test_a_rung_whose_grid_leaves_out_the_papers_lr_reads_its_same_lr_row_elsewhere(tmp_path):
    """The 10 × rung's same-lr row at 2e-3 (its grid has no paper's lr to offer, as the MoE's 10 × grid has not): the
    table names each rung's same lr, the note says why, and the best-vs-best rows are as before."""
    res, comps = horizon_family(tmp_path, (1, 10), same={10: 2e-3})
    text = "\n".join(horizon_section(res, tmp_path / "img"))
    same1, same10 = res.rows_of(comps[0])[0], res.rows_of(comps[1])[0]
    assert same1.label == "same lr (4e-3)" and same10.label == "same lr (2e-3)"
    assert f"| {fmt(same1.delta, True)} at 4e-3 |" in text and f"| {fmt(same10.delta, True)} at 2e-3 |" in text
    assert "Its same-lr row is at 2e-3: the grid leaves out the paper's 4e-3" in comps[1].grid.note
    assert "| 10 | 105.0 | 3 | 2e-3, 2e-3 | -0.0100 [" in text

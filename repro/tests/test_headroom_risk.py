"""The paper-scale risk (repro/headroom_risk.py) and issue 52's page pieces (repro/collapse_page.py) on synthetic run
directories: Σlr from the schedule, the ladder's Σlr at collapse, the first steps' extrapolation and its
calibration, the headline row of the A/B, and one horizon's lr curve."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from config import load_config
from optim.schedule import lr_at
from repro import headroom_risk as risk
from repro.collapse_page import lr_curve, lr_table
from repro.comparisons import COLLAPSE_ROWS, Plan, collapse_ab, default_comparisons
from repro.runner import plan_runs
from runs import load_run

D32 = ["model.d_model=32", "model.n_heads=1", "model.n_layers=4", "model.scale.invariant_magnitude=keep"]
CONSTANT = ["train.steps=10", "schedule.warmup_steps=0", "schedule.min_lr_ratio=1", "optim.lr=1e-2"]


def fake_run(path: Path, overrides: list[str], evals: list[dict], final: float = 3.0) -> None:
    """A finished run: its config (configs/tiny_cpu.yaml + overrides) and one eval record per dict (step, then
    headroom/… and magnitude/… keys)."""
    path.mkdir(parents=True)
    cfg = load_config("configs/tiny_cpu.yaml", overrides)
    (path / "config.yaml").write_text(cfg.to_yaml())
    recs = [{"kind": "eval", "tokens": 10 * e["step"], "val_loss": final, **e} for e in evals]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_lr_sums_add_the_schedule():
    cfg = load_config("configs/tiny_cpu.yaml", ["train.steps=10", "schedule.warmup_steps=2"])
    sums = risk.lr_sums(cfg)
    assert len(sums) == 11 and sums[0] == 0.0
    assert sums[-1] == pytest.approx(sum(lr_at(s, 10, cfg.optim.lr, cfg.schedule) for s in range(10)), rel=1e-12)
    flat = risk.lr_sums(load_config("configs/tiny_cpu.yaml", CONSTANT))
    assert flat[5] == pytest.approx(0.05, rel=1e-12) and flat[10] == pytest.approx(0.1, rel=1e-12)


def test_the_ladder_reads_sum_lr_at_the_first_headroom_below_one(tmp_path):
    def evals(h5: float, with_headroom: bool = True) -> list[dict]:
        out = []
        for step, h, b in ((0, 1000.0, 1.0), (5, h5, 0.01), (10, 0.2, 0.001)):
            e = {"step": step, "magnitude/L0/attn.q_proj": b}
            if with_headroom:
                e["headroom/L0/attn.q_proj"] = h
            out.append(e)
        return out
    fake_run(tmp_path / "early", D32 + CONSTANT, evals(0.5))  # below 1 at step 5: Σlr 0.05
    fake_run(tmp_path / "late", D32 + CONSTANT, evals(3.0))  # at step 10: Σlr 0.1
    fake_run(tmp_path / "removed", D32 + CONSTANT + ["model.scale.invariant_magnitude=remove"], evals(0.5))
    fake_run(tmp_path / "old", D32 + CONSTANT + ["optim.lr=2e-2"], evals(0.5, with_headroom=False))
    groups = risk.ladder([load_run(p) for p in sorted(tmp_path.iterdir())])
    assert [(g.rung, g.lr, len(g.points)) for g in groups] == [("d32L4", 1e-2, 2), ("d32L4", 2e-2, 1)]
    assert groups[0].collapse_sums() == pytest.approx([0.05, 0.1], rel=1e-12)
    table = risk.ladder_table(groups).splitlines()
    assert table[2] == "| d32L4 | 0.01 | 10 | 0.1 | 2 | 2 | 2 | 0.1–0.1 | 0.001 |"
    assert table[3] == "| d32L4 | 0.02 | 10 | 0.2 | 1 | 0 | – | – | 0.001 |"  # no headroom: β alone


def test_the_first_steps_extrapolate_and_the_d32_rung_calibrates(tmp_path):
    # q: β 1 → 0.9 over Σlr 0.1 (rate 1.0), its branch scale (headroom / β²) 1000 → 4000; the head's 2000 → 8000
    first = {"step": 0, "magnitude/L0/attn.q_proj": 1.0, "magnitude/head/norm": 1.0,
             "headroom/L0/attn.q_proj": 1000.0, "headroom/head/lm_head": 2000.0}
    last = {"step": 10, "magnitude/L0/attn.q_proj": 0.9, "magnitude/head/norm": 0.98,
            "headroom/L0/attn.q_proj": 4000.0 * 0.81, "headroom/head/lm_head": 8000.0 * 0.98 ** 2}
    fake_run(tmp_path / "d32", D32 + CONSTANT, [first, last])
    e = risk.early(load_run(tmp_path / "d32"))
    assert (e.rung, e.h0) == ("d32L4", 1000.0)
    assert e.rate == pytest.approx(1.0, rel=1e-9) and e.growth == pytest.approx(4.0, rel=1e-9)
    assert e.beta_star == pytest.approx(1 / math.sqrt(4000), rel=1e-9)
    assert e.sum_lr_to_collapse() == pytest.approx(1 - 1 / math.sqrt(4000), rel=1e-9)
    # the d32 rung's runs at FIRST_LR collapsed at Σlr 2 and 4: the calibration is their median over the prediction
    pts = tuple(risk.Point(s, x, h, None, None) for s, x, h in ((0, 0.0, 10.0), (1, 2.0, 0.5)))
    pts4 = tuple(risk.Point(s, x, h, None, None) for s, x, h in ((0, 0.0, 10.0), (1, 4.0, 0.5)))
    groups = [risk.Group("d32L4", risk.FIRST_LR, 100, (pts, pts4))]
    assert risk.calibrate(groups, [e]) == pytest.approx(3.0 / e.sum_lr_to_collapse(), rel=1e-9)
    assert risk.calibrate([], [e]) is None
    lines = risk.early_table([e], 2.0, 41.9).splitlines()
    assert lines[2] == "| d32L4 | 1e+03 | 1.00 | 4.00 | 0.016 | 1.0 | 2.0 |"


def test_the_first_steps_run_each_rung_and_the_paper_config_alike(tmp_path):
    names = [risk.first_steps_argv(r, tmp_path)[0] for r in (*risk.FIRST_RUNGS, None)]
    assert names == ["proxy-d32L4", "proxy-d64L4", "proxy-d96L4", "dense_0.12b_unified"]
    for rung in (*risk.FIRST_RUNGS, None):
        name, argv = risk.first_steps_argv(rung, tmp_path)
        cfg = load_config([a for a, flag in zip(argv[1:], argv) if flag == "--config"],
                          [a for a in argv if "=" in a and not a.startswith("--")])
        assert (cfg.train.steps, cfg.train.global_batch, cfg.data.seq_len) == (risk.FIRST_STEPS, risk.FIRST_BATCH,
                                                                               risk.FIRST_SEQ)
        assert cfg.model.scale.invariant_magnitude == "keep" and cfg.log.run_name == name
        assert risk.lr_sums(cfg)[-1] == pytest.approx(risk.FIRST_STEPS * risk.FIRST_LR, rel=1e-12)  # constant lr
    assert cfg.model.d_model == 768  # the real config, not a proxy


def test_the_headline_row_is_the_ladder_rungs_own_run():
    comp = collapse_ab(*COLLAPSE_ROWS[COLLAPSE_ROWS.index((1, 4e-3, "headline"))])
    literal, removed = comp.curves  # no undecayed arm at the headline
    assert (literal.run, literal.suffix, literal.overrides) == ("0.12b_unified", "-d64L4", ())
    assert removed.overrides == ("model.scale.invariant_magnitude=remove",) and removed.suffix == "-d64L4-removed"
    with pytest.raises(ValueError, match="preset's lr 4e-3"):
        collapse_ab(1, 8e-3, "headline")


def test_a_horizons_lr_curve_reads_v4s_rung_and_the_ab(tmp_path):
    seeds = 2
    v4, ab = tmp_path / "v4", tmp_path / "ab"
    comps = {c.key: c for c in default_comparisons(Plan(1).lrs)}
    rung = comps["fig7-horizon_x1"]
    _, where = plan_runs(Plan(seeds, comparisons=[comps["fig7-ladder"], rung]), str(v4))
    finals = {}
    for i, lr in enumerate(rung.grid.lrs):
        for s in range(seeds):
            for j, design in enumerate(("baseline", "unified")):
                finals[(design, lr, s)] = 4.0 - 0.01 * i - 0.1 * j + 0.001 * s
                path = where[(f"{rung.key}/{design} lr {lr}", s)]
                if not path.exists():
                    fake_run(path, CONSTANT, [{"step": 10}], finals[(design, lr, s)])
    row = collapse_ab(1, 8e-3, "moe")
    _, where_ab = plan_runs(Plan(seeds, comparisons=[row]), str(ab))
    for s in range(seeds):
        fake_run(where_ab[(f"{row.key}/unified, magnitudes removed", s)], CONSTANT, [{"step": 10}], 3.5 + 0.001 * s)
    points = lr_curve(1, "moe", ab, v4, seeds)
    assert [p.lr for p in points] == list(rung.grid.lrs)
    at8 = next(p for p in points if p.lr == "8e-3")
    assert at8.seeds == 2 and at8.removed == pytest.approx(3.5005) and at8.literal == pytest.approx(
        (finals[("unified", "8e-3", 0)] + finals[("unified", "8e-3", 1)]) / 2)
    assert all(p.removed is None for p in points if p.lr != "8e-3")
    table = lr_table(points)
    assert table[0] == "| lr | seeds | baseline | unified, literal | unified, magnitudes removed |"
    assert "**3.5005**" in next(line for line in table if line.startswith("| 8e-3 |"))


def test_two_ledgers_on_one_out_dir_keep_each_others_runs(tmp_path):
    """The A/B and the first steps (repro/headroom_risk.py) may train into one out-dir at once: a ledger opened
    before the other's add must not drop that run when it adds its own."""
    from repro.runner import CpuLedger
    first, second = CpuLedger(tmp_path), CpuLedger(tmp_path)
    first.add("a", 10.0)
    second.add("b", 5.0)
    first.add("a", 1.0)
    assert CpuLedger(tmp_path).seconds == {"a": 11.0, "b": 5.0}


def test_the_pages_plain_words_follow_its_numbers(tmp_path):
    """repro/collapse_page.py, reading: the collapse counts per arm, the rows the removed form resolves, where each
    arm's best lr sits (and whether unified's moves back toward the baseline's), and the paper model's verdict."""
    from types import SimpleNamespace

    from repro.collapse import Arm
    from repro.collapse_page import LrPoint, reading

    def run(final: float, collapsed: bool):
        return SimpleNamespace(stopped_normalizing=collapsed, final_eval={"val_loss": final})
    lit = Arm("unified, literal", {0: run(3.00, True), 1: run(3.10, True)})
    rem = Arm("unified, magnitudes removed", {0: run(2.90, False), 1: run(2.95, False)})
    spared = Arm("unified, those β undecayed", {0: run(3.0, True)})
    curve = [LrPoint("2e-3", 2, 3.50, 3.40, None), LrPoint("4e-3", 2, 3.45, 3.42, 3.38),
             LrPoint("8e-3", 2, 3.47, 3.45, 3.39)]
    paper = risk.Early(risk.rung_of(load_config(risk.PAPER_CONFIG)), 3e4, 0.4, 100.0)
    lines = reading([(None, [lit, rem, spared])], {"dense at 10 ×": curve}, [paper], 3.0, 41.9)
    assert lines[0] == ("- **Collapse.** Literal unified switched a branch off in 2 of 2 runs over 1 rows. Without "
                        "those magnitudes: 0 of 2. With them undecayed: 1 of 1.")
    assert "over the 1 rows with 2 or more seeds: better in 0, worse in 0, unresolved in 1" in lines[1]
    assert lines[2] == ("- **Best lr, dense at 10 ×.** Baseline 4e-3, literal 2e-3; removed (at the lrs it ran) 4e-3, "
                        "0.0200 below literal at its best: unified's best lr moves back toward the baseline's.")
    at = paper.sum_lr_to_collapse() * 3.0
    assert f"at Σlr ≈ {at:.1f} by the calibrated estimate" in lines[3] and "It is at risk." in lines[3]
    assert "The config now removes those magnitudes" in lines[3]  # configs/scale/unified.yaml: remove

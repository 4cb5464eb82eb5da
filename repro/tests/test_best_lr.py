"""The headline at each design's best lr (repro/comparisons.py lr_headline): the dense and MoE
rungs' curves at ×½, ×1 and ×2 of the paper's lr, whose ×1 runs are the ladders' rung runs; the best lr of each
design chosen over the same seeds and paired by seed on synthetic runs; what retuning does to a lead; and the page's
text with and without those runs."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from config import load_config
from repro.comparisons import LR_FACTORS, MOE_LR_FACTORS, Comparison, Plan, lr_headline, lr_text, pair
from repro.experiments import config_of, experiment_key
from repro.figures import FIGURES
from repro.measure import Results
from repro.page import proxy_section, scope
from repro.proxy import DENSE, MOE
from repro.first_screen import plain_reading
from repro.reading import count_section, retuned_done
from repro.runner import plan_runs, select_runs
from repro.sections import lr_grid_section
from repro.stats import (APPEARS, FADES, NO_LEAD, REVERSES, SURVIVES, TOO_FEW, Stat, fmt, retuned, verdict_class)

HEADLINES = (("fig6-best_lr", "fig6-ladder", DENSE, "6", "0.12b"), ("fig7-best_lr", "fig7-ladder", MOE, "7", "0.5b"))


def comparison(plan: Plan, key: str) -> Comparison:
    return next(c for c in plan.comparisons if c.key == key)


def test_the_headline_grids_and_their_x1_runs_are_the_rungs():
    """Baseline and unified at ×½, ×1, ×2 of the figure config's lr; at ×1 the very run directories of the ladder's
    rung for every seed (the runner's dedup by config), at ×½ and ×2 runs that differ from them in optim.lr alone."""
    seeds = 2
    plan = Plan(seeds)
    uniques, where = plan_runs(plan, "runs/x")
    # after the others, so no run is renamed; only the horizon rungs and the magnitudes' A/B come after them
    assert [c.key for c in plan.comparisons[-9:]] == ["fig6-best_lr", "fig7-best_lr"] + [
        f"fig{f}-horizon_x{h}" for f in (6, 7) for h in (1, 3, 10)] + ["fig6-magnitudes"]
    by_name = {u.job.run_name: u for u in uniques}
    for key, ladder, shape, figure, run in HEADLINES:
        comp = comparison(plan, key)
        paper_lr = load_config(FIGURES[figure].config(f"{run}_baseline")).optim.lr
        assert paper_lr == load_config(FIGURES[figure].config(f"{run}_unified")).optim.lr
        factors = MOE_LR_FACTORS if key == "fig7-best_lr" else LR_FACTORS
        lrs = tuple(lr_text(f * paper_lr) for f in factors)
        assert comp.kind == "lr_grid" and comp.grid.lrs == lrs and comp.grid.same == lrs[1]
        assert [c.label for c in comp.curves] == [f"{d} lr {lr}" for lr in lrs for d in ("baseline", "unified")]
        rung = {c.label.split()[0]: c for c in comparison(plan, ladder).curves if c.shape == shape}
        assert comp.grid.paper_same == rung["unified"].paper_delta  # read against what the rung is read against
        for design in ("baseline", "unified"):
            for s in range(seeds):
                x1 = where[(f"{key}/{design} lr {lrs[1]}", s)]
                assert x1 == where[(f"{ladder}/{design} {shape.label}", s)]  # the same run directory
                x1_cfg = config_of(by_name[x1.name].job.argv)
                assert x1_cfg.optim.lr == paper_lr and x1_cfg.train.seed == s
                rest = (lrs[0], *lrs[2:])
                others = [where[(f"{key}/{design} lr {lr}", s)] for lr in rest]
                assert len({x1, *others}) == len(lrs)
                for lr, d in zip(rest, others):
                    cfg = config_of(by_name[d.name].job.argv)
                    assert cfg.optim.lr == float(lr) and cfg.model == x1_cfg.model and cfg.train == x1_cfg.train
                    assert experiment_key(cfg) != experiment_key(x1_cfg)
    # The dense baseline at ×½ and ×2 is Fig. 1's grid at 2e-3 and 8e-3: one run directory each.
    assert where[("fig6-best_lr/baseline lr 2e-3", 0)] == where[("fig1-lr_grid/baseline lr 2e-3", 0)]
    assert where[("fig6-best_lr/baseline lr 8e-3", 0)] == where[("fig1-lr_grid/baseline lr 8e-3", 0)]


def test_only_selects_the_new_runs_of_item_5(capsys):
    """The command the page names for the ×½ and ×2 runs: dense unified ×2, MoE baseline and unified ×2, per
    seed, and the dense baseline's two that are Fig. 1's."""
    from repro import results
    uniques, where = plan_runs(Plan(4), "runs/x")
    only = ["fig6-best_lr/* lr 2e-3", "fig6-best_lr/* lr 8e-3", "fig7-best_lr/* lr 1e-3", "fig7-best_lr/* lr 4e-3"]
    picked = select_runs(uniques, where, only)
    assert len(picked) == 8 * 4
    assert sum(u.job.run_name.startswith("fig1-baseline-tiny-lr") for u in picked) == 2 * 4
    # the headline grids add 6 runs per seed (dense unified ×½ ×2, MoE's four); Fig. 1's 1.6e-2, the MoE's ×4 and ×8
    # 6 more, the horizon rungs 52 (dense 5 lrs at 1 × and 10 ×, 4 at 3 ×; the MoE 4, 5, 4; 2 of the MoE's 1 × runs
    # are the ladder's), the magnitudes' A/B 2 (its IWD-as-today curve is the 10 × rung's unified run)
    assert len(uniques) == (42 + 6 + 52 + 2) * 4
    assert results.main(["--dry-run", "--out-dir", "runs/x", "--only", *only]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 32


@pytest.mark.parametrize("same, best, expected", [
    (Stat(-0.05, 0.01, 4), Stat(-0.04, 0.01, 4), SURVIVES),
    (Stat(-0.05, 0.01, 4), Stat(-0.01, 0.03, 4), FADES),
    (Stat(-0.05, 0.01, 4), Stat(+0.04, 0.01, 4), REVERSES),
    (Stat(-0.01, 0.03, 4), Stat(-0.05, 0.01, 4), APPEARS),
    (Stat(-0.01, 0.03, 4), Stat(+0.01, 0.03, 4), NO_LEAD),
    (Stat(-0.05, 0.0, 1), Stat(-0.05, 0.0, 1), TOO_FEW),
    (Stat(-0.05, 0.01, 4), None, TOO_FEW),
])
def test_what_retuning_does_to_a_lead(same, best, expected):
    assert retuned(same, best) == expected


# ------------------------------------------------------------------------------------------ synthetic runs

SEEDS = 4
OFFSET = (0.0, 0.3, -0.2, 0.5)  # per seed, shared by every run of the seed: pairing removes it, pooling would not


def fake_run(path: Path, final: float) -> None:
    """A finished run directory: config and a metrics.jsonl of two evaluations ending at `final`."""
    path.mkdir(parents=True)
    cfg = load_config("configs/tiny_cpu.yaml", ["train.steps=10", "schedule.warmup_steps=1"])
    (path / "config.yaml").write_text(cfg.to_yaml())
    recs = [{"kind": "eval", "step": 0, "tokens": 0, "val_loss": 9.0, "val_loss/wiki": 9.0},
            {"kind": "eval", "step": 5, "tokens": 50, "val_loss": final + 0.2, "val_loss/wiki": final + 1.2},
            {"kind": "eval", "step": 10, "tokens": 100, "val_loss": final, "val_loss/wiki": final + 1},
            {"kind": "train", "step": 10, "tokens": 100, "epoch": 0.5, "loss": final}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def dense_plan(tmp_path: Path, losses: dict[str, float], noise: dict[str, tuple] = None, skip=()):
    """Fig. 6's ladder (its d64 L4 rung) and the dense headline grid over synthetic runs: `losses` per grid label
    (the ×1 curves' runs are the rung's), plus OFFSET per seed and `noise` per label; (label, seed) in `skip` not run.
    The ladder's other rungs have no runs."""
    grid = lr_headline("fig6-best_lr", "Fig. 6", "6", "0.12b", -0.0302, DENSE)
    ladder = Comparison("fig6-ladder", "Fig. 6, ladder", "§4.5", pair("6", "0.12b", -0.0302, DENSE), kind="ladder")
    plan = Plan(SEEDS, (4e-3,), (), [ladder, grid])
    where = {}
    for label, loss in losses.items():
        for s in range(SEEDS):
            d = tmp_path / f"{label.replace(' ', '_')}-s{s}"
            if (label, s) not in skip:
                fake_run(d, loss + OFFSET[s] + (noise or {}).get(label, (0.0,) * SEEDS)[s])
            where[(f"fig6-best_lr/{label}", s)] = d
    for s in range(SEEDS):
        for design in ("baseline", "unified"):
            where[(f"fig6-ladder/{design} {DENSE.label}", s)] = where[(f"fig6-best_lr/{design} lr 4e-3", s)]
    return plan, where, grid


BEST_DIFFER = {"baseline lr 2e-3": 3.00, "baseline lr 4e-3": 3.05, "baseline lr 8e-3": 3.20,
               "unified lr 2e-3": 3.03, "unified lr 4e-3": 2.99, "unified lr 8e-3": 3.10}
WOBBLE = {"unified lr 4e-3": (0.004, -0.006, 0.008, -0.002), "baseline lr 2e-3": (-0.003, 0.005, -0.004, 0.006)}


def test_best_lrs_that_differ_are_chosen_per_design_and_paired_by_seed(tmp_path):
    """Unified is best at 4e-3 and the baseline at 2e-3: the same-lr delta (the rung's runs, shown once) leads by
    0.06, each at its best by 0.01 ± noise, unresolved: the lead does not survive retuning; the page and the plain
    reading say so, and the best-lr row is counted once, read against the paper's value."""
    plan, where, grid = dense_plan(tmp_path, BEST_DIFFER, WOBBLE)
    res = Results(plan, where, "wiki")
    assert (res.best_lr(grid, "unified"), res.best_lr(grid, "baseline")) == ("4e-3", "2e-3")
    same, best = res.rows_of(grid)
    assert same.same_as == f"Fig. 6, ladder: {DENSE.label}" and not same.counted  # the rung's row, counted there
    assert same.delta.mean == pytest.approx(-0.06 + sum(WOBBLE["unified lr 4e-3"]) / SEEDS)
    assert best.label == "each at its best lr (unified 4e-3, baseline 2e-3)" and best.counted
    paired = [w - b for w, b in zip(WOBBLE["unified lr 4e-3"], WOBBLE["baseline lr 2e-3"])]
    assert best.delta.mean == pytest.approx(-0.01 + sum(paired) / SEEDS)
    assert best.delta.sd < 0.02 and best.delta.n == SEEDS  # paired: the seeds' offsets (sd 0.3) cancel
    assert best.paper == -0.0302 and best.runs[0] == (where[("fig6-best_lr/unified lr 4e-3", 0)],
                                                       where[("fig6-best_lr/baseline lr 2e-3", 0)])
    assert retuned(same.delta, best.delta) == FADES
    text = "\n".join(lr_grid_section(res, grid, tmp_path / "img"))
    base = res.final(grid, grid.curves[0])  # baseline lr 2e-3: mean ± sd over seeds, the offsets in it
    assert f"| 2e-3 | {base.mean:.4f} ± {base.sd:.4f} (best) | {3.03 + sum(OFFSET) / SEEDS:.4f} ± " in text
    assert "(the same runs as *Fig. 6, ladder: d64 L4*)" in text
    assert f"| each at its best lr (unified 4e-3, baseline 2e-3) | {best.delta.mean:+.4f} [" in text
    assert (f"unified − baseline: {same.delta.mean:+.4f} [{same.delta.lo:+.4f}, {same.delta.hi:+.4f}] at the same lr "
            f"(4e-3), {best.delta.mean:+.4f} [") in text
    assert "**the lead does not survive lr retuning** (a lead at one lr can be only baseline's lr tolerance)" in text
    assert "Both deltas are read against the paper's -0.0302" in text
    assert (tmp_path / "img" / "fig6-best_lr.png").stat().st_size > 1000
    plain = "\n".join(plain_reading(res))
    line = next(x for x in plain.splitlines() if x.startswith("- Dense unified vs baseline, the 0.12B proxy, each at its best lr"))
    assert "each at its best lr (of 2e-3, 4e-3, 8e-3: unified 4e-3, baseline 2e-3): " in line
    assert "does not survive lr retuning" in line  # the change, paired by seed, is resolved here
    row = next(x for x in plain.splitlines() if x.startswith("| Dense unified vs baseline, the 0.12B proxy, each at"))
    assert f"| {verdict_class(best.delta, -0.0302)} " in row
    assert "Of 2 distinct deltas (1 more row is the same runs as another, shown once)" in "\n".join(
        count_section(res, []))
    # the plan's grid, at 4 seeds
    assert retuned_done(res) and "best lr against best lr for the headline" not in " ".join(scope(res, True))


def test_the_best_lr_is_chosen_over_the_seeds_every_lr_has(tmp_path):
    """Seed 3 of the baseline at 8e-3 has not run: the baseline's best lr is chosen over seeds 0–2 at every lr, where
    2e-3 is best, though seed 3's bad run at 2e-3 would make 4e-3 best over all of each lr's own seeds."""
    noise = {"baseline lr 2e-3": (0.0, 0.0, 0.0, 0.4)}
    plan, where, grid = dense_plan(tmp_path, BEST_DIFFER, noise, skip={("baseline lr 8e-3", 3)})
    res = Results(plan, where, "wiki")
    means = {lr: res.final(grid, next(c for c in grid.curves if c.label == f"baseline lr {lr}")).mean
             for lr in ("2e-3", "4e-3")}
    assert means["2e-3"] > means["4e-3"]  # over each lr's own seeds 4e-3 would win
    assert res.best_lr(grid, "baseline") == "2e-3"
    best = res.rows_of(grid)[1]
    assert best.delta.n == SEEDS  # the row itself pairs every seed both of its curves have


def test_seeds_past_the_pilot_never_move_the_pick(tmp_path):
    """Seeds 4 and 5 run at every lr, and at 2e-3 the baseline's are 0.4 worse: over all six seeds 4e-3 would win,
    but the pick reads the pilot (seeds 0–3, where 2e-3 is best), and the rows and the pick's contrast then pair every
    seed, the later ones included."""
    plan, where, grid = dense_plan(tmp_path, BEST_DIFFER)
    for label, loss in BEST_DIFFER.items():
        for s in (4, 5):
            where[(f"fig6-best_lr/{label}", s)] = d = tmp_path / f"{label.replace(' ', '_')}-s{s}"
            fake_run(d, loss + (0.4 if label == "baseline lr 2e-3" else 0.0))
            if label.endswith("lr 4e-3"):  # the ladder's rung reads the grid's 4e-3 runs
                where[(f"fig6-ladder/{label.split()[0]} {DENSE.label}", s)] = d
    res = Results(replace(plan, seeds=6), where, "wiki")
    runs = {lr: res.finals(grid, next(c for c in grid.curves if c.label == f"baseline lr {lr}"))
            for lr in ("2e-3", "4e-3")}
    assert sum(runs["2e-3"].values()) > sum(runs["4e-3"].values())  # over all six seeds 4e-3 would win
    assert res.best_lr(grid, "baseline") == "2e-3"
    best = res.rows_of(grid)[1]
    assert best.label == "each at its best lr (unified 4e-3, baseline 2e-3)" and best.delta.n == 6
    pick = next(r for r in res.grid_contrasts(grid) if r.label.startswith("baseline"))
    assert pick.label == "baseline at its best lr 2e-3 − at 4e-3 (the lr pick)" and pick.delta.n == 6


def test_both_best_at_the_paper_lr_is_the_rung_itself(tmp_path):
    losses = dict(BEST_DIFFER, **{"baseline lr 2e-3": 3.10})  # the baseline now best at 4e-3 too
    plan, where, grid = dense_plan(tmp_path, losses)
    res = Results(plan, where, "wiki")
    same, best = res.rows_of(grid)
    assert best.same_as == same.same_as == f"Fig. 6, ladder: {DENSE.label}" and not best.counted
    text = "\n".join(lr_grid_section(res, grid, tmp_path / "img"))
    assert ("Both designs are best at 4e-3, so the delta with each at its best lr is the same-lr one, unified − "
            "baseline -0.0600 [") in text
    said = "unified leads, resolved; both designs are best at 4e-3: **retuning moved neither design**"
    assert "(paired by seed): unified leads, resolved: **retuning moved neither design**." in text
    assert "survive" not in text  # no retuning ran, so no lead "survives" it
    plain = "\n".join(plain_reading(res))
    line = next(x for x in plain.splitlines() if x.startswith("- Dense unified vs baseline, the 0.12B proxy, each at"))
    assert "each at its best lr (of 2e-3, 4e-3, 8e-3: unified 4e-3, baseline 4e-3): " in line
    assert said in line and "survive lr" not in line


@pytest.mark.parametrize("losses, said", [
    (BEST_DIFFER, "The best lr of baseline is the grid's smallest (2e-3): an optimum may lie beyond the grid"),
    (dict(BEST_DIFFER, **{"baseline lr 8e-3": 2.90, "unified lr 8e-3": 2.95}),
     "Both designs' best lr is the grid's largest (8e-3): an optimum may lie beyond the grid"),
    (dict(BEST_DIFFER, **{"baseline lr 2e-3": 3.10}), None)])  # both best at 4e-3, inside the grid
def test_a_best_lr_at_the_grids_edge_is_named(tmp_path, losses, said):
    """A design best at the grid's smallest or largest lr may be best outside it: the section and the plain reading
    say so, once per grid; a best inside the grid says nothing."""
    plan, where, grid = dense_plan(tmp_path, losses)
    res = Results(plan, where, "wiki")
    text = "\n".join(lr_grid_section(res, grid, tmp_path / "img"))
    line = next(x for x in plain_reading(res) if x.startswith("- Dense unified vs baseline, the 0.12B proxy, each at its best lr"))
    for where_said in (text, line):
        if said is None:
            assert "grid's edge" not in where_said and "beyond the grid" not in where_said
        else:
            assert where_said.count(said) == 1


def test_the_page_says_in_one_line_what_has_not_run(tmp_path):
    """Without the unified runs at ×½ and ×2 (the v2 archive): one line naming them and the command that trains them,
    no row of the grid (nothing counted, no best-vs-best line in the reading), best lr against best lr still listed
    as not done."""
    only_x1 = {k: v for k, v in BEST_DIFFER.items() if k != "unified lr 2e-3" and k != "unified lr 8e-3"}
    plan, where, grid = dense_plan(tmp_path, only_x1)
    for lr in ("2e-3", "8e-3"):
        for s in range(SEEDS):
            where[(f"fig6-best_lr/unified lr {lr}", s)] = tmp_path / f"not-run-{lr}-{s}"
    res = Results(plan, where, "wiki")
    assert res.rows_of(grid) == [] and [r.title for r in res.rows if r.counted] == [f"Fig. 6, ladder: {DENSE.label}"]
    lines = lr_grid_section(res, grid, tmp_path / "img")
    assert lines[:2] == [f"### {grid.title}", ""] and lines[3:] == [""] and len(lines) == 4
    assert lines[2] == ("**Not run yet:** 2 of its 6 curves have no finished run (unified lr 2e-3, unified lr 8e-3), "
                        "so there is no delta with each design at its best lr; its same-lr delta is *Fig. 6, ladder: "
                        "d64 L4*. `python -m repro.results --seeds 4 --only 'fig6-best_lr/unified lr 2e-3' "
                        "'fig6-best_lr/unified lr 8e-3'` trains them.")
    assert not (tmp_path / "img").exists()
    assert ("| Dense unified vs baseline, the 0.12B proxy, each at its best lr | 0 | – | not measured yet | | | | |"
            in plain_reading(res)) and "each at its best lr (of" not in "\n".join(plain_reading(res))
    assert "Of 1 distinct deltas:" in "\n".join(count_section(res, []))
    assert res.readers(plan.comparisons[0], plan.comparisons[0].curves[0]) == []  # a grid not run reads nothing
    assert "best lr against best lr for the headline" in " ".join(scope(res, retuned_done(res)))
    # The proxy's floors are checked on every finished run, the grid's not shown yet included (the baseline at ×½
    # and ×2), so its count is the page's first line's.
    floors = next(x for x in proxy_section(res) if "finished runs" in x)
    assert f" of the {len(res.loaded)} finished runs " in floors or f"Every one of the {len(res.loaded)} " in floors
    assert len(res.loaded) == 4 * SEEDS  # baseline at three lrs and unified at the paper's


def test_the_contrasts_that_pick_each_best_lr_join_the_holm_family(tmp_path):
    """Item 3 of results v4: each design at its best lr against its runner-up (the baseline 2e-3 − 4e-3, unified
    4e-3 − 2e-3) is tested with the page's rows. The baseline's pick is the rung's row less best against best, a sum
    of rows already in the basis; unified's is a new vector, so it enters the basis and Holm's count, and the central
    rows' Holm sentence says so."""
    from repro.contrasts import contrasts
    from repro.reading import family, holm_family, is_pick
    plan, where, grid = dense_plan(tmp_path, BEST_DIFFER, WOBBLE)
    res = Results(plan, where, "wiki")
    picks = res.grid_contrasts(grid)
    assert [p.label for p in picks] == ["baseline at its best lr 2e-3 − at 4e-3 (the lr pick)",
                                        "unified at its best lr 4e-3 − at 2e-3 (the lr pick)"]
    assert picks[0].delta.mean == pytest.approx(3.00 - 3.05 + sum(WOBBLE["baseline lr 2e-3"]) / SEEDS)
    assert all(p.paper is None and is_pick(p) for p in picks)
    fam = family(res)
    assert [r.label for r in fam if is_pick(r)] == [p.label for p in picks]
    c = contrasts(fam)
    assert [r.label for r in c.basis] == [DENSE.label, "each at its best lr (unified 4e-3, baseline 2e-3)",
                                          picks[1].label]
    assert [r.label for r, _ in c.sums] == [picks[0].label]
    assert holm_family(c) == "the 3 basis rows (1 of them an lr-grid pick)"
    assert "corrected over the 3 basis rows (1 of them an lr-grid pick)" in "\n".join(plain_reading(res))


def test_a_grid_is_read_over_the_lrs_both_designs_have_run(tmp_path):
    """An lr added to a grid (v4's 1.6e-2, the MoE's ×4) does not hide the rest: with unified at 8e-3 not run, the
    grid reads 2e-3 and 4e-3, picks each best there, counts its rows, marks the lr not read and names the command
    that trains the missing curve; the edge sentence reads the lrs run (4e-3, unified's best, is their largest)."""
    partial = {k: v for k, v in BEST_DIFFER.items() if k != "unified lr 8e-3"}
    plan, where, grid = dense_plan(tmp_path, partial)
    for s in range(SEEDS):
        where[("fig6-best_lr/unified lr 8e-3", s)] = tmp_path / f"not-run-{s}"
    res = Results(plan, where, "wiki")
    assert res.ran_lrs(grid) == ("2e-3", "4e-3") and not res.unread(grid)
    assert (res.best_lr(grid, "baseline"), res.best_lr(grid, "unified")) == ("2e-3", "4e-3")
    same, best = res.rows_of(grid)
    assert best.label == "each at its best lr (unified 4e-3, baseline 2e-3)" and best.counted
    assert best.delta.mean == pytest.approx(2.99 - 3.00)
    text = "\n".join(lr_grid_section(res, grid, tmp_path / "img"))
    assert "| 8e-3 (not read: not both run) | 3.3500 ± " in text and "| – |" in text
    assert ("**Not run yet:** unified lr 8e-3. Each design's *best* lr is the best of 2e-3, 4e-3, the lrs both have "
            "run. `python -m repro.results --seeds 4 --only 'fig6-best_lr/unified lr 8e-3'` trains the rest.") in text
    assert "The best lr of unified is the grid's largest (4e-3)" in text


def test_the_not_run_line_asks_for_the_seeds_the_grid_has_run(tmp_path):
    """The plan reads 4 seeds, but the baseline at ×½ has 3: the command that completes the grid trains its missing
    curves at 3 seeds, enough to read it, not the plan's count."""
    only_x1 = {k: v for k, v in BEST_DIFFER.items() if k not in ("unified lr 2e-3", "unified lr 8e-3")}
    plan, where, grid = dense_plan(tmp_path, only_x1, skip={("baseline lr 2e-3", 3)})
    for lr in ("2e-3", "8e-3"):
        for s in range(SEEDS):
            where[(f"fig6-best_lr/unified lr {lr}", s)] = tmp_path / f"not-run-{lr}-{s}"
    line = lr_grid_section(Results(plan, where, "wiki"), grid, tmp_path / "img")[2]
    assert line.startswith("**Not run yet:** 2 of its 6 curves have no finished run")
    assert "`python -m repro.results --seeds 3 --only 'fig6-best_lr/unified lr 2e-3' " in line


def test_a_ladder_says_whether_its_rungs_lead_survives_retuning(tmp_path):
    """The ladder trains at the paper's lr. Where the headline grid shares its rung, the law's sentence adds the rung
    with each design at its best lr, and says when the lead at the paper's lr does not survive there (the multiplier
    may be lr tolerance); a ladder with no such grid adds nothing."""
    from repro.retuning import ladder_at_best_lr
    plan, where, grid = dense_plan(tmp_path / "differ", BEST_DIFFER, WOBBLE)
    res = Results(plan, where, "wiki")
    ladder = plan.comparisons[0]
    best = res.rows_of(grid)[1]
    text = ladder_at_best_lr(res, ladder)
    assert text.startswith(f" Every rung trains at the paper's lr; with each design at its best lr, unified − baseline"
                           f" is {fmt(best.delta, True)} at {DENSE.label}: the lead at the paper's lr does not survive "
                           f"retuning at {DENSE.label}, so the multiplier may be unified's tolerance")
    # both best at 4e-3, the rung's lr: the lead is the rung's, and it stands
    same = {**BEST_DIFFER, "baseline lr 2e-3": 3.10}
    plan, where, grid = dense_plan(tmp_path / "same", same, WOBBLE)
    res = Results(plan, where, "wiki")
    text = ladder_at_best_lr(res, plan.comparisons[0])
    best = res.rows_of(grid)[1]
    assert best.delta.mean == pytest.approx(-0.06 + sum(WOBBLE["unified lr 4e-3"]) / SEEDS)
    assert text.endswith(f"unified − baseline is {fmt(best.delta, True)} at {DENSE.label}.")
    plan.comparisons = plan.comparisons[:1]
    assert ladder_at_best_lr(Results(plan, where, "wiki"), plan.comparisons[0]) == ""

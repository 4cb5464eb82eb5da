"""The paper-scale plan (repro/paper.py, repro/plan.py): runs that are one experiment collapse into one run
directory that `reproduce` names for every figure; the compute adds up with shared runs counted once; every
paper-scale config reads one prepared dir that holds its budget in one pass."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from config import load_config
from data.loader import TrainLoader
from data.prepare import CFG_KEYS
from data.synthetic import synthetic_dir
from repro import paper
from repro.figures import FIGURES
from repro.jobs import jobs
from repro import plan as plan_cli
from repro import reproduce

ROOT = Path(__file__).resolve().parents[2]
BASELINE_0_12B = (("1", "baseline"), ("5", "baseline"), ("6", "0.12b_baseline"), ("10", "baseline"))
UNIFIED_0_12B = (("5", "hg_dnp_or_iwd"), ("6", "0.12b_unified"), ("10", "unified"))


@pytest.fixture(scope="module")
def the_plan() -> paper.Plan:
    return paper.plan()


def test_the_0_12b_baselines_of_figs_1_5_6_10_are_one_run(the_plan):
    by_reader = {r: e for e in the_plan.experiments for r in e.readers}
    assert by_reader[("1", "baseline")].readers == BASELINE_0_12B
    assert by_reader[("1", "baseline")].name == "fig1-baseline"
    assert by_reader[("5", "hg_dnp_or_iwd")].readers == UNIFIED_0_12B
    # Fig. 8's 0.12B baseline trains with Muon, Fig. 9's with WSD: other experiments, their own runs
    assert by_reader[("8", "0.12b_baseline")].readers == (("8", "0.12b_baseline"),)
    assert by_reader[("9", "0.12b_baseline")].readers == (("9", "0.12b_baseline"),)
    readers = [r for e in the_plan.experiments for r in e.readers]
    assert sorted(readers) == sorted(paper.readers()) and len(readers) == len(set(readers)) == 55
    assert len(the_plan.experiments) == 55 - 3 - 2 == 50
    names = [e.name for e in the_plan.experiments]
    assert len(set(names)) == len(names)
    assert paper.canonical("10", "baseline") == ("1", "baseline")
    assert paper.canonical("6", "0.12b_unified") == ("5", "hg_dnp_or_iwd")
    assert paper.canonical("7", "2b_unified") == ("7", "2b_unified")
    # an override that makes two runs differ splits them again
    assert paper.canonical("5", "baseline", ("log.run_name=x",)) == ("1", "baseline")
    with pytest.raises(KeyError, match="no run"):
        paper.canonical("5", "no_such_run")


def test_flops_are_the_models_own_count(the_plan):
    """6·N (forward + backward; N activated, without the input embedding) + 12·layers·heads·head_dim·seq_len."""
    e = next(e for e in the_plan.experiments if e.name == "fig1-baseline")
    n = 81_110_784  # Llama-0.12B without its input embedding (docs/paper.md §3.6's compute axis)
    assert e.activated_params == n and e.total_params == 119_744_256
    assert e.flops_per_token == 6 * n + 12 * 6 * 12 * 64 * 1024
    assert e.tokens == 20_000 * 512 * 1024 and e.flops == e.flops_per_token * e.tokens
    assert paper.node_hours(e.flops, 0.4) == pytest.approx(e.flops / (8 * 989e12 * 0.4) / 3600)
    moe = next(e for e in the_plan.experiments if e.name == "fig7-2b_baseline")
    assert moe.total_params == 1_996_574_720 and moe.activated_params < moe.total_params / 3


def test_totals_count_each_unique_run_once(the_plan):
    total = sum(e.flops for e in the_plan.experiments)
    assert the_plan.flops == total
    assert 4.5e21 < total < 5.5e21  # the "about 5e21 FLOPs" for all figures at one seed
    figures = the_plan.figures
    assert [f.number for f in figures] == list(FIGURES)
    for f in figures:
        assert f.flops == sum(e.flops for e in f.experiments)
        assert {r for e in f.experiments for r, _ in e.readers} >= {f.number}
        assert sum(len([r for r in e.readers if r[0] == f.number]) for e in f.experiments) == f.runs
    shared = sum((len(e.figures) - 1) * e.flops for e in the_plan.experiments)
    assert shared > 0 and sum(f.flops for f in figures) == total + shared == the_plan.flops_per_figure_sum
    assert set(figures[2].shared) == {"fig1-baseline", "fig5-hg_dnp_or_iwd"}  # Fig. 5 shares both
    assert figures[2].shared["fig1-baseline"] == ("1", "6", "10")
    three = paper.Plan(the_plan.experiments, seeds=3, mfu=0.5)
    assert three.runs == 150 and three.flops == 3 * total
    assert paper.node_hours(three.flops, 0.5) == pytest.approx(paper.node_hours(total, 0.4) * 3 * 0.4 / 0.5)


def test_every_paper_budget_fits_the_one_prepared_dir(the_plan):
    """All paper-scale configs name the same data (source, dir, tokenizer, cap) and each one's steps read at most one
    pass of it, at its own seq_len."""
    paths = [*ROOT.glob("configs/dense/*.yaml"), *ROOT.glob("configs/moe/*.yaml"),
             *ROOT.glob("configs/figures/*/*.yaml"), ROOT / "configs/dense_0.12b_unified.yaml",
             ROOT / "configs/moe_0.5b_unified.yaml"]
    assert len(paths) == 67
    datas = set()
    for path in paths:
        cfg = load_config(path)
        d = cfg.data
        datas.add((d.source, d.dir, d.tokenizer, d.max_tokens, d.val_frac, d.text_column))
        budget = cfg.train.steps * cfg.train.global_batch * d.seq_len
        assert budget <= paper.epoch_tokens(d.max_tokens, d.seq_len), path
    assert datas == {("hf:HuggingFaceFW/fineweb-edu:sample-350BT", "data_cache/fineweb-edu-gpt2-106B", "gpt2",
                      106_000_000_000, 0.02, "text")}
    [data] = the_plan.data
    assert len(data.readers) == 50 and data.largest.name == "fig6-1b_baseline"
    assert 0.98 < data.passes(data.largest) <= 1.0
    assert "--max-tokens 106000000000 --out data_cache/fineweb-edu-gpt2-106B" in data.prepare
    assert "seq_len" not in CFG_KEYS  # a prepared dir is not tied to a seq_len: windows are cut at load time


def test_epoch_tokens_is_what_the_loader_holds(tmp_path):
    """epoch_tokens against the loader's own count, on the layout prepare writes (full shards, a shorter last one);
    the same dir serves two seq_lens with one fingerprint."""
    d = synthetic_dir(tmp_path / "d", 3_500_000, shard_tokens=1_000_000)
    loaders = [TrainLoader(d, seq_len, 2) for seq_len in (1024, 4096)]
    for loader in loaders:
        assert loader.tokens_per_epoch == paper.epoch_tokens(3_500_000, loader.seq_len, 1_000_000)
    assert len(loaders[0].shards) == 4 and loaders[0].fingerprint == loaders[1].fingerprint


def test_reproduce_trains_a_shared_experiment_in_one_directory(capsys):
    names = {}
    for fig, run in BASELINE_0_12B:
        [job] = [j for j in jobs(FIGURES[fig], "paper", 1, "runs") if j.run == run]
        names[fig] = (job.run_name, tuple(job.argv[:2]))
    assert set(names.values()) == {("fig1-baseline", ("--config", "configs/figures/fig1/baseline.yaml"))}
    seeded = [j.run_name for j in jobs(FIGURES["10"], "paper", 2, "runs") if j.run == "baseline"]
    assert seeded == ["fig1-baseline-s0", "fig1-baseline-s1"]
    # the CPU proxy keeps one run per figure (its sizes differ per figure)
    tiny = [j for j in jobs(FIGURES["5"], "tiny", 1, "runs") if j.run == "baseline"]
    assert [j.run_name for j in tiny] == ["fig5-baseline-tiny"]
    assert reproduce.main(["all", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    run_names = [next(a.split("=", 1)[1] for a in shlex.split(line) if a.startswith("log.run_name=")) for line in lines]
    assert len(run_names) == len(set(run_names)) == 50 and "fig5-baseline" not in run_names


def test_plan_command(capsys):
    assert plan_cli.main(["--json", "--seeds", "2", "--mfu", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seeds"] == 2 and out["total"]["runs"] == 100 and out["peak_flops_per_gpu"] == 989e12
    assert out["total"]["flops"] == sum(r["flops"] for r in out["runs"])
    assert out["total"]["node_hours"] == pytest.approx(out["total"]["flops"] / (8 * 989e12 * 0.5) / 3600)
    assert out["runs"][0]["read_by"] == [{"figure": f, "run": r} for f, r in BASELINE_0_12B]
    assert plan_cli.main(["--markdown"]) == 0
    md = capsys.readouterr().out
    assert "| fig1-baseline | 1: baseline; 5: baseline; 6: 0.12b_baseline; 10: baseline |" in md
    assert "| all | every figure, shared runs once | 55 | 50 |" in md
    for bad in (["--mfu", "0"], ["--mfu", "40"], ["--seeds", "0"]):
        with pytest.raises(SystemExit) as e:
            plan_cli.main(bad)
        assert e.value.code == 2
    assert "--mfu must lie in (0, 1]" in capsys.readouterr().err

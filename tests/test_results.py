"""scripts.results: the whole reproduction on a 2-step, 2-seed miniature — every comparison's runs, shared runs run
once, the page's numbers equal to what the runs' metrics.jsonl say, a second invocation that runs nothing, and a
refusal to reuse a run directory of another config."""
from __future__ import annotations

import re
import sys

import pytest
from test_train import data_dir  # noqa: F401 - a fixture

from scripts import reproduce, results
from scripts.results_page import T975, stat
from scripts.runs import load_run

SEEDS = 2


@pytest.fixture(scope="module")
def miniature(data_dir, tmp_path_factory):  # noqa: F811
    """Runs the miniature once for the module's tests: (argv, out dir, page, stdout)."""
    import train

    tmp = tmp_path_factory.mktemp("results")
    wiki = tmp / "wiki.test.raw"
    wiki.write_text(" = Valkyria Chronicles = \n\n The game began development in 2010 , carrying over a large "
                    "portion of the work . \n" * 40)
    overrides = [f"data.dir={data_dir.dir}", f"data.source={data_dir.source}", "data.tokenizer=bpe:320",
                 "data.seq_len=32", "data.val_frac=0.2", "model.d_model=32", "model.n_heads=1", "model.n_layers=1",
                 "train.steps=2", "train.global_batch=4", "train.micro_batch=4", "train.eval_every=1",
                 "train.eval_tokens=256", "schedule.warmup_steps=1", "train.device=cpu", "train.compile=false",
                 "train.dtype=float32"]
    argv = ["--seeds", str(SEEDS), "--out-dir", str(tmp / "runs"), "--page", str(tmp / "docs" / "results.md"),
            "--lrs", "4e-3,8e-3", "--widths", "32,64", "--wikitext", str(wiki), "--wikitext-dir",
            str(tmp / "wikitext2"), "--", *overrides]

    def run_in_process(cmd):
        assert cmd[:2] == [sys.executable, "train.py"]
        train.main(cmd[2:])
        return 0

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reproduce, "launch", run_in_process)
        mp.setattr(results, "launch", run_in_process)
        import io
        from contextlib import redirect_stdout
        out = io.StringIO()
        with redirect_stdout(out):
            assert results.main(argv) == 0
    return argv, tmp / "runs", tmp / "docs" / "results.md", out.getvalue()


def test_every_comparison_runs_once_per_experiment(miniature):
    argv, runs, page, out = miniature
    # 11 Fig. 5 runs; the ladder's 64-wide pair (its 32-wide rung is Fig. 5's); Muon; WSD; the grid less the
    # baseline at 4e-3 (Fig. 5's): 20 experiments, each once per seed.
    assert f"[{20 * SEEDS}/{20 * SEEDS}]" in out
    dirs = sorted(p.name for p in runs.iterdir() if p.is_dir())
    assert len(dirs) == 20 * SEEDS
    assert "fig1-baseline-tiny-lr4e-3-s0" not in dirs and "fig5-baseline-tiny-s0" in dirs
    assert "fig6-0.12b_unified-tiny-d64-s1" in dirs
    for d in dirs:
        run = load_run(runs / d)
        assert run.finished and run.cfg.train.seed == int(d[-1])
        assert any(k.startswith("val_loss/wikitext2") for k in run.final_eval)  # the eval-only set, every run
    assert re.search(r"CPU time: \d+\.\d\d h in this invocation, \d+\.\d\d h for all 40 runs", out)


def test_page_numbers_come_from_the_runs(miniature):
    argv, runs, page, out = miniature
    text = page.read_text()
    for title in ("Fig. 5, heterogeneity", "Fig. 5, placement", "Fig. 5, reparameterization", "Fig. 5, weight decay",
                  "Fig. 6, unified vs baseline", "Fig. 8, Muon", "Fig. 9, WSD", "Fig. 1, with and without"):
        assert f"### {title}" in text
    # Fig. 9's delta, recomputed from the two runs of each seed: mean and its 95 % interval.
    deltas = [load_run(runs / f"fig9-0.12b_unified-tiny-s{s}").final_val_loss
              - load_run(runs / f"fig9-0.12b_baseline-tiny-s{s}").final_val_loss for s in range(SEEDS)]
    d = stat(deltas)
    half = T975[0] * d.sd / SEEDS ** 0.5
    assert "| unified | 2 | " in text
    assert f"{d.mean:+.4f} [{d.mean - half:+.4f}, {d.mean + half:+.4f}] | -0.0269 |" in text
    # The baseline's mean ± sd in Fig. 5's first table.
    finals = [load_run(runs / f"fig5-baseline-tiny-s{s}").final_val_loss for s in range(SEEDS)]
    b = stat(finals)
    assert f"| baseline | 2 | {b.mean:.4f} ± {b.sd:.4f} |" in text
    assert "Equal-loss compute multiplier of unified over baseline: **" in text  # two rungs: a law per strategy
    assert "CPU-hours" in text and "Of 18 deltas:" in text
    for image in re.findall(r"\]\((img/results/[^)]+)\)", text):
        assert (page.parent / image).stat().st_size > 1000
    assert len(re.findall(r"\]\((img/results/[^)]+)\)", text)) == 9  # 8 comparisons + the scaling law


def test_second_invocation_runs_nothing_and_refuses_another_config(miniature, capsys):
    argv, runs, page, out = miniature
    before = page.read_text()
    assert results.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("finished, skipped") == 20 * SEEDS and "0.00 h in this invocation" in out
    assert page.read_text().split("## The proxy")[1] == before.split("## The proxy")[1]
    # A finished run dir of another config than the command's: an error naming the key, nothing reused.
    assert results.main([*argv, "optim.weight_decay=0.05"]) == 2
    assert "optim.weight_decay" in capsys.readouterr().err

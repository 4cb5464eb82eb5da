"""repro.results: the whole reproduction on a 2-step, 2-seed miniature at the proxy's own shapes — every
comparison's runs (the MoE panels and both ladders included), shared runs run once, the page's numbers equal to what
the runs' metrics.jsonl say, a second invocation that runs nothing, and a refusal to reuse a run directory of another
config."""
from __future__ import annotations

import argparse
import gc
import re
import sys
from pathlib import Path

import pytest
from test_train import data_dir  # noqa: F401 - a fixture

from runs import load_run
from repro.stats import T80, T975, stat
from repro import runner
from repro import results

SEEDS = 2
# 11 Fig. 5 runs; Fig. 1's grid at 2 lrs less its baseline at 4e-3 (Fig. 5's); Fig. 6's ladder less its d64 L4
# rung (Fig. 5's baseline and hg_dnp_or_iwd); Figs. 8 and 9, dense and MoE; Fig. 7's 3 rungs; the headline lr grids
# less their ×1 runs (the rungs'): dense less its baseline at 8e-3 (Fig. 1's), MoE at ×½, ×2, ×4 and ×8; the horizon
# rungs' lrs over the three grids (dense 6, 1e-3 to 3.2e-2; MoE 5, 2e-3 to 3.2e-2), one experiment for every horizon
# here (2 steps each, eager), less the pair that is a ladder rung's (dense at 4e-3, MoE at 2e-3); the magnitudes'
# undecayed and bf16 runs: per seed.
EXPERIMENTS = 11 + 3 + 6 + 4 + 4 + 6 + 3 + 8 + 10 + 8 + 2
# Fig. 5's deltas, Fig. 1's two, Fig. 6's rungs, Figs. 8 and 9, Fig. 7's rungs, the headline grids' and the six
# horizon rungs' two each, the magnitudes' two
ROWS = 12 + 2 + 4 + 4 + 3 + 4 + 12 + 2


@pytest.fixture(scope="module")
def miniature(data_dir, tmp_path_factory):  # noqa: F811
    """Runs the miniature once for the module's tests: (argv, out dir, page, stdout). The overrides shrink the
    data, batch and steps but keep each curve's model shape, so the ladders' rungs stay distinct models; each run
    evaluates at steps 0 and 2 only (train.py always evaluates at both), on one batch of each validation set: every
    curve and delta still has its two points and every run its final eval on both sets, which is all the page and
    the tests read."""
    import train

    tmp = tmp_path_factory.mktemp("results")
    wiki = tmp / "wiki.test.raw"
    wiki.write_text(" = Valkyria Chronicles = \n\n The game began development in 2010 , carrying over a large "
                    "portion of the work . \n" * 40)
    overrides = [f"data.dir={data_dir.dir}", f"data.source={data_dir.source}", "data.tokenizer=bpe:320",
                 "data.seq_len=32", "data.val_frac=0.2", "train.steps=2", "train.global_batch=2", "train.micro_batch=2",
                 "train.eval_every=2", "train.eval_tokens=64", "train.ckpt_every=2", "schedule.warmup_steps=1",
                 "train.device=cpu", "train.compile=false", "train.dtype=float32", "log.every=1"]
    argv = ["--seeds", str(SEEDS), "--out-dir", str(tmp / "runs"), "--page", str(tmp / "docs" / "results.md"),
            "--lrs", "4e-3,8e-3", "--wikitext", str(wiki), "--wikitext-dir", str(tmp / "wikitext2"), "--", *overrides]

    def run_in_process(cmd):
        assert cmd[:2] == [sys.executable, "train.py"]
        # What is alive now (the earlier tests' and this module's objects, the plan's imports) out of the collector's
        # view, as conftest.py does after collection: train.py's teardown runs a full gc.collect() per run (68
        # here), which otherwise walks all of it. The run's own objects are collected as usual.
        gc.freeze()
        train.main(cmd[2:])
        return 0

    def measured_in_process(cmd, threads, log=None):
        assert threads >= 1 and log is None  # one run at a time
        c0 = runner.cpu_now()
        return run_in_process(cmd), runner.cpu_now() - c0

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "launch", measured_in_process)
        import io
        from contextlib import redirect_stdout
        out = io.StringIO()
        with redirect_stdout(out):
            assert results.main(argv) == 0
    return argv, tmp / "runs", tmp / "docs" / "results.md", out.getvalue()


def test_every_comparison_runs_once_per_experiment(miniature):
    argv, runs, page, out = miniature
    assert f"[{EXPERIMENTS * SEEDS}/{EXPERIMENTS * SEEDS}]" in out
    dirs = sorted(p.name for p in runs.iterdir() if p.is_dir())
    assert len(dirs) == EXPERIMENTS * SEEDS
    assert "fig1-baseline-tiny-lr4e-3-s0" not in dirs and "fig5-baseline-tiny-s0" in dirs
    assert "fig6-0.12b_unified-tiny-d64L4-s0" not in dirs and "fig6-0.12b_unified-tiny-d96L4-s1" in dirs
    assert {"fig7-0.5b_unified-tiny-d32L2E8-s1", "fig8-moe_0.5b_unified-tiny-s0", "fig9-moe_0.5b_baseline-tiny-s1"} \
        <= set(dirs)
    # The headline lr grids: new runs at ×½ and ×2, the rungs' at ×1, Fig. 1's baseline at 8e-3 (in the grid here)
    assert {"fig6-0.12b_unified-tiny-d64L4-lr2e-3-s0", "fig6-0.12b_baseline-tiny-d64L4-lr2e-3-s1",
            "fig7-0.5b_baseline-tiny-d64L2E8-lr1e-3-s0", "fig7-0.5b_unified-tiny-d64L2E8-lr4e-3-s1"} <= set(dirs)
    assert not any(d.startswith(("fig6-0.12b_baseline-tiny-d64L4-lr8e-3", "fig6-0.12b_unified-tiny-d64L4-s"))
                   for d in dirs)
    widths = {load_run(runs / f"fig7-0.5b_baseline-tiny-{s}-s0").cfg.model.d_model for s in ("d32L2E8", "d96L2E8")}
    assert widths == {32, 96}  # the rungs are distinct models
    for d in dirs:
        run = load_run(runs / d)
        assert run.finished and run.cfg.train.seed == int(d[-1])
        assert any(k.startswith("val_loss/wikitext2") for k in run.final_eval)  # the eval-only set, every run
        assert run.passes is not None and run.passes > 0
    assert re.search(rf"CPU time: \d+\.\d\d h in this invocation, \d+\.\d\d h for all {EXPERIMENTS * SEEDS} runs", out)


def test_page_numbers_come_from_the_runs(miniature):
    argv, runs, page, out = miniature
    text = page.read_text()
    for title in ("Fig. 5, heterogeneity", "Fig. 5, placement", "Fig. 5, reparameterization", "Fig. 5, weight decay",
                  "Fig. 6, unified vs baseline", "Fig. 7, unified vs baseline", "Fig. 8, Muon, dense",
                  "Fig. 8, Muon, MoE", "Fig. 9, WSD schedule, dense", "Fig. 9, WSD schedule, MoE",
                  "Fig. 1, with and without", "v4 against v3", "Fig. 6's headline rung (d64 L4), unified vs baseline",
                  "Fig. 7's headline rung (d64 L2 E8), unified vs baseline"):
        assert f"### {title}" in text
    assert "Not run yet" not in text and text.count("**the lead") + text.count("**no lead") \
        + text.count("**a lead") + text.count("**retuning moved") + text.count("**unresolved**") >= 3  # the grids' own
    # Fig. 9's dense delta, recomputed from the two runs of each seed: mean, 95 % interval, paper, ratio, MDE.
    deltas = [load_run(runs / f"fig9-0.12b_unified-tiny-s{s}").final_val_loss
              - load_run(runs / f"fig9-0.12b_baseline-tiny-s{s}").final_val_loss for s in range(SEEDS)]
    d = stat(deltas)
    half, mde = T975[0] * d.sd / SEEDS ** 0.5, (T975[0] + T80[0]) * d.sd / SEEDS ** 0.5
    assert (f"{d.mean:+.4f} [{d.mean - half:+.4f}, {d.mean + half:+.4f}] | -0.0269 | {d.mean / -0.0269:.2f} | "
            f"{mde:.4f} |") in text
    # The baseline's mean ± sd in Fig. 5's first table, marked as read by other comparisons too.
    finals = [load_run(runs / f"fig5-baseline-tiny-s{s}").final_val_loss for s in range(SEEDS)]
    b = stat(finals)
    assert f"| baseline† | 2 | {b.mean:.4f} ± {b.sd:.4f} |" in text
    heterogeneity = text.split("### Fig. 5, heterogeneity")[1].split("###")[0]
    assert re.search(r"† .*baseline: also .*Fig\. 1, .*Fig\. 6, ", heterogeneity)
    # Fig. 6's d64 L4 rung is Fig. 5's baseline against hg_dnp_or_iwd: a row of its own (no Fig. 5 row has that
    # pair), its runs marked shared.
    assert "| d64 L4† |" in text
    distinct = int(re.search(r"Of (\d+) distinct deltas", text).group(1))
    again = text.count("not counted again")
    assert distinct + again == ROWS and again == text.count("(the same runs as *")
    for ladder in ("Fig. 6", "Fig. 7"):
        section = text.split(f"### {ladder}, unified vs baseline")[1].split("\n### ")[0]
        assert "Power laws fitted to the seed means" in section and "b_unified − b_baseline = " in section
        assert ("One multiplier for the ladder" in section) != ("No single multiplier" in section)
    assert "CPU-hours" in text and "break the proxy's rules" in text  # 2 steps: every run is flagged
    assert "binomial" not in text and "within noise" not in text and "the paper's 1,000 of 20,000" not in text
    images = re.findall(r"\]\((img/results/[^)]+)\)", text)
    for image in images:
        assert (page.parent / image).stat().st_size > 1000
    assert len(images) == 25  # 20 comparisons + 2 scaling laws + the two horizon plots + the magnitudes' trajectories


def test_page_reads_first_and_counts_over_independent_rows(miniature):
    """The plain reading comes before any table; the count runs over the rows that are not sums of others, with Holm
    and BH; every label agrees with its interval and the paper's value; the laws print no multiplier or crossing
    without an interval; the page says which eval set the runs read and how it is rebuilt."""
    argv, runs, page, out = miniature
    text = page.read_text()
    plain, proxy_at, count_at = (text.index(h) for h in ("## The reading in plain words", "## The proxy",
                                                          "## The count"))
    assert plain < proxy_at < count_at and "|---" not in text[:plain]  # no table before the plain reading
    # The proxy's eval set is the training mixture (repro/configs/tiny.yaml): the page says what each evaluation read,
    # from the runs' records (this corpus names no sources; repro/tests/test_results_sources.py has one that does).
    read = load_run(runs / "fig5-baseline-tiny-s0").final_eval["val_tokens"]
    assert read == 64 and "Still the v2 runs" not in text
    assert (f"**The eval set.** Each evaluation reads {read:,} tokens of the validation split's " in text[:plain]
            and "in a fixed shuffled order, the same in every run (data/evalset.py); the data names no sources."
            in text[:plain])
    # how it is rebuilt: from the runs it read (no archive here), with the seeds and the grid it was written with
    assert (f"`python -m repro.results --page-only --out-dir {runs} --seeds {SEEDS} --lrs 4e-3,8e-3 --page {page}`"
            in text[:plain])
    # both stay listed: the central claims are short of power, and the grids have run at 2 seeds of the 4 that
    # retuning asks for
    assert "the first table gives each its seeds and the rule's n" in text[:plain] \
        and "best lr against best lr for the headline." in text[:plain]
    # Rows that are sums of others (the same plan as the page's): stated, and left out of the tests.
    independent, counted, distinct, picks, sums = (int(x or 0) for x in re.search(
        r"(\d+) of the (\d+) distinct rows(?: and lr-grid picks \((\d+) rows; (\d+) picks[^)]*\))? are linearly "
        r"independent \(the other (\d+) are sums", text).groups())
    assert independent + sums == counted == distinct + picks
    assert distinct == int(re.search(r"Of (\d+) distinct deltas", text).group(1))
    assert picks >= 1  # every grid here has 2 lrs: a pick per design, where it is not a page row already
    for row in ("- *Fig. 5, reparameterization: hg_dnp* = −*Fig. 5, placement: hg_dp* + *Fig. 5, placement: hg_dnp*",
                "- *Fig. 5, weight decay: hg_dnp_er* = −*Fig. 5, reparameterization: hg_dnp_or* + "
                "*Fig. 5, reparameterization: hg_dnp_er*",
                # the first screen's rows join the basis first: the ladder's d64 L4 (the dense claim at the paper's
                # lr) keeps its own test, and the last step of Fig. 5's chain is the sum
                "- *Fig. 5, weight decay: hg_dnp_or_iwd* = −*Fig. 5, heterogeneity: hg* − *Fig. 5, placement: hg_dp* "
                "− *Fig. 5, reparameterization: hg_dnp_or* + "
                "*Fig. 6, unified vs baseline over a ladder of dense proxy sizes: d64 L4*"):
        assert row in text
    # the first screen: one table row per claim, each with its seeds, the rule's n and its Holm verdict
    screen = text[plain:proxy_at].split("| claim | seeds | the rule's n |")[1].split("\n\n")[0]
    claims = [line.split(" | ") for line in screen.strip().splitlines()[2:]]  # past the head and its rule
    assert len(claims) >= 7 and all(c[6] in ("survives", "no", "–") for c in claims)
    assert all(c[1].isdigit() and (c[2].isdigit() or c[2] == "no pilot yet") for c in claims)
    table = text.split("| row | Δ val [95 % CI] | p | resolved | Holm 5 % | BH 5 % |")[1].split("\n\n")[0]
    cells = [line.split(" | ") for line in table.strip().splitlines()[1:]]
    assert len(cells) == independent
    holm_yes = sum(c[4] == "yes" for c in cells)
    assert all(c[3] == "yes" for c in cells if c[4] == "yes") and all(c[5] == "yes" for c in cells if c[4] == "yes")
    assert f"{holm_yes} {'survives' if holm_yes == 1 else 'survive'} Holm's" in text
    assert f"and {sum(c[5].startswith('yes') for c in cells)} Benjamini–Hochberg's" in text
    # Every delta cell's label against its own interval and the paper's value.
    cell = re.compile(r"\| ([+-]\d\.\d{4}) \[([+-]\d\.\d{4}), ([+-]\d\.\d{4})\] \| ([+-]\d\.\d{4}) \| [^|]* \| "
                      r"(\d\.\d{4}) \| [^|]* \| ([^|]+) \|")
    labels = cell.findall(text)
    assert len(labels) == distinct - 2  # the magnitudes' two rows have no paper value, so no label
    for mean, lo, hi, paper, mde, label in labels:
        lo, hi, paper, mde = float(lo), float(hi), float(paper), float(mde)
        if lo > 0 or hi < 0:
            expected = ("contradicts" if (lo > 0) != (paper > 0) else "reproduces" if lo <= paper <= hi
                        else "right sign")
        else:
            expected = ("the paper's size is ruled out here" if not lo <= paper <= hi else
                        "cannot tell at this power" if mde > abs(paper) else "undecided at this power")
        assert expected in label, (mean, lo, hi, paper, mde, label)
    power = text.split("### Power on the central claims")[1].split("###")[0]
    rows = [line for line in power.splitlines() if line.startswith("| ") and not line.startswith("| claim |")]
    reference = [line for line in rows if line.startswith("| Best lr against best lr (for reference) |")]
    secondary = [line for line in rows if "(secondary) |" in line]
    # the 7 central claims (Figs. 1, 6, 7 each at its best lr), the 3 same-lr rows, then the horizon grids' best rows
    assert len(rows) - len(reference) - len(secondary) == 7 and len(secondary) == 3
    assert len(reference) == 6 and all("each at its best lr (" in line for line in reference)
    for ladder in ("Fig. 6", "Fig. 7"):
        section = text.split(f"### {ladder}, unified vs baseline")[1].split("\n### ")[0]
        assert "95 % bootstrap over seeds" in section
        assert all("bootstrap" in line for line in section.splitlines() if "cross at" in line)
    assert "the paper does not state its warmup" in text and "tokens per compute parameter" in text


@pytest.fixture
def figures_not_drawn(monkeypatch):
    """The page's figures as empty files: the tests that use it check the page's text, the archive and the ledger;
    the miniature's own invocation draws every figure (test_page_numbers_come_from_the_runs checks them)."""
    import repro.sections

    def touch(*args, **kwargs):
        out = Path(args[-1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.touch(exist_ok=True)  # a figure drawn before stays as it was
        return out
    monkeypatch.setattr(repro.sections, "draw_deltas", touch)
    monkeypatch.setattr(repro.sections, "plot_law", touch)


def test_second_invocation_runs_nothing_and_refuses_another_config(miniature, capsys, figures_not_drawn):
    argv, runs, page, out = miniature
    before = page.read_text()
    assert results.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("finished, skipped") == EXPERIMENTS * SEEDS and "0.00 h in this invocation" in out
    assert page.read_text().split("## The proxy")[1] == before.split("## The proxy")[1]
    # A finished run dir of another config than the command's: an error naming the key, nothing reused.
    assert results.main([*argv, "optim.weight_decay=0.05"]) == 2
    assert "optim.weight_decay" in capsys.readouterr().err


def test_the_rebuild_command_names_the_archive_and_seeds():
    """The page prints the command that writes it again: the archive (written or restored from) before the out dir,
    the seeds always, the lr grid and the page only where not the defaults, repository paths relative."""
    def ns(**kw):
        base = dict(archive=None, restore=None, out_dir="runs/results", seeds=4, lrs=results.DEFAULT_LRS,
                    page=results.DEFAULT_PAGE)
        return argparse.Namespace(**{**base, **kw})
    head = "python -m repro.results --page-only --out-dir"
    assert results.rebuild_command(ns(archive=Path("repro/archives/results_runs_v3.jsonl.gz"))) == \
        f"{head} repro/archives/results_runs_v3.jsonl.gz --seeds 4"
    assert results.rebuild_command(ns(restore=results.ROOT / "repro" / "archives" / "results_runs_v2", seeds=6,
                                      page=results.ROOT / "repro" / "pages" / "results_v2.md")) == \
        f"{head} repro/archives/results_runs_v2 --seeds 6 --page repro/pages/results_v2.md"
    assert results.rebuild_command(ns(out_dir="/elsewhere/runs", lrs="1e-3,2e-3")) == \
        f"{head} /elsewhere/runs --seeds 4 --lrs 1e-3,2e-3"


def test_the_page_comes_back_from_its_archive(miniature, tmp_path, capsys, figures_not_drawn):
    """--archive keeps what the page read; --page-only from the archive writes the same page, and an archive is
    never written over a directory that holds anything else."""
    argv, runs, page, out = miniature
    keep, again = tmp_path / "archive", tmp_path / "docs" / "results.md"
    first = tmp_path / "first" / "results.md"  # the same name: a page's plots go to img/<its name>/
    (keep / "old-run").mkdir(parents=True)  # an earlier archive's run: replaced
    (keep / "old-run" / "metrics.jsonl").write_text("")
    flags = argv[argv.index("--lrs"):]
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(runs), "--page", str(first),
                         "--page-only", "--archive", str(keep), *flags]) == 0
    assert f"archived {EXPERIMENTS * SEEDS} runs" in capsys.readouterr().out
    assert sorted(p.name for p in keep.iterdir()) == sorted([*(p.name for p in runs.iterdir() if p.is_dir()
                                                               and p.name != "logs"), "cpu_seconds.json"])
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(keep), "--page", str(again), "--page-only",
                         *flags]) == 0
    written = first.read_text()
    assert f"--page-only --out-dir {keep} --seeds {SEEDS} --lrs 4e-3,8e-3 --page {first}`" in written
    assert again.read_text().replace(str(again), "PAGE") == written.replace(str(first), "PAGE")
    assert written.replace(str(keep), "RUNS").split("## The proxy")[1] == \
        page.read_text().replace(str(runs), "RUNS").split("## The proxy")[1]
    # --restore: a fresh out dir continues from the archive; nothing is retrained, the page and ledger are the same
    fresh, third = tmp_path / "fresh", tmp_path / "third" / "results.md"
    (fresh / "mine").mkdir(parents=True)  # a run already there is kept as it is
    (fresh / "mine" / "metrics.jsonl").write_text("kept")
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(fresh), "--page", str(third),
                         "--restore", str(keep), *flags]) == 0
    said = capsys.readouterr().out
    assert f"restored {EXPERIMENTS * SEEDS} runs" in said and said.count("finished, skipped") == EXPERIMENTS * SEEDS
    assert third.read_text().replace(str(third), "PAGE") == written.replace(str(first), "PAGE")
    assert (fresh / "mine" / "metrics.jsonl").read_text() == "kept"
    assert (fresh / "cpu_seconds.json").read_text() == (keep / "cpu_seconds.json").read_text()
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(fresh), "--page", str(third), "--page-only",
                         "--restore", str(keep), *flags]) == 0
    assert "restored 0 runs" in capsys.readouterr().out
    assert results.main(["--out-dir", str(fresh), "--page-only", "--restore", str(tmp_path / "none"), *flags]) == 2
    err = capsys.readouterr().err
    assert "--restore" in err and "no such directory" in err
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("mine")
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(runs), "--page", str(first),
                         "--page-only", "--archive", str(tmp_path / "elsewhere"), *flags]) == 2
    assert "holds more than run archives (notes.txt)" in capsys.readouterr().err
    assert (tmp_path / "elsewhere" / "notes.txt").read_text() == "mine"


def test_a_compact_archive_gives_the_same_page_and_continues_a_study(miniature, tmp_path, capsys,
                                                                     figures_not_drawn):
    """--archive X.jsonl.gz: one file, the same bytes for the same runs; --page-only --out-dir X.jsonl.gz writes the
    page the runs wrote (only the archive's name differs); --restore X.jsonl.gz continues from it; a compact archive
    is never trained into."""
    argv, runs, page, out = miniature
    flags = argv[argv.index("--lrs"):]
    packed, twice = tmp_path / "runs.jsonl.gz", tmp_path / "again.jsonl.gz"
    first, again, third = (tmp_path / d / "results.md" for d in ("first", "again", "third"))
    for dest in (packed, twice):
        assert results.main(["--seeds", str(SEEDS), "--out-dir", str(runs), "--page", str(first), "--page-only",
                             "--archive", str(dest), *flags]) == 0
    assert packed.read_bytes() == twice.read_bytes() and packed.stat().st_size < 10 * 2 ** 20
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(packed), "--page", str(again), "--page-only",
                         *flags]) == 0
    written = first.read_text()  # by the second --archive: it names that file
    assert f"--out-dir {twice} --seeds {SEEDS}" in written
    written = written.replace(str(first), "PAGE").replace(str(twice), "ARCHIVE")
    assert again.read_text().replace(str(again), "PAGE").replace(str(packed), "ARCHIVE") == written
    fresh = tmp_path / "fresh"
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(fresh), "--page", str(third), "--page-only",
                         "--restore", str(packed), *flags]) == 0
    assert f"restored {EXPERIMENTS * SEEDS} runs" in capsys.readouterr().out
    assert third.read_text().replace(str(third), "PAGE").replace(str(packed), "ARCHIVE") == written
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(packed), *flags]) == 2
    assert "is a compact archive" in capsys.readouterr().err


def test_the_page_names_the_runs_its_cpu_ledger_never_saw(miniature, tmp_path, figures_not_drawn):
    """The CPU-hours are the ledger's, split: the page's own runs (new here: none is v3's, whose archive the
    miniature's ledger does not descend from) and the entries of runs it does not read (discarded); a run without an
    entry (trained before the ledger, or by hand) is named, so no total is read as every run's cost."""
    import json, shutil
    argv, runs, page, out = miniature
    copy, mine = tmp_path / "runs", tmp_path / "results.md"
    shutil.copytree(runs, copy)
    names = sorted(json.loads((copy / "cpu_seconds.json").read_text()))
    assert len(names) == EXPERIMENTS * SEEDS
    ledger = {name: 3600.0 for name in names[1:]}
    ledger["a-run-this-page-does-not-read"] = 7200.0
    (copy / "cpu_seconds.json").write_text(json.dumps(ledger))
    assert results.main(["--seeds", str(SEEDS), "--out-dir", str(copy), "--page", str(mine), "--page-only",
                         *argv[argv.index("--lrs"):]]) == 0
    text = mine.read_text()
    assert f"**{len(names) + 1:.2f} CPU-hours**" in text
    assert f"No run is reused unchanged from v3's archive; {len(names) - 1:.2f} to the {len(names) - 1} runs " \
           "trained for this page." in text
    assert "2.00 went to runs discarded: 2.00 to 1 runs this page does not read." in text
    assert f"1 run ({names[0]}) has no entry in the ledger, so its time is not in it" in text
    assert "no entry in the ledger" not in page.read_text()  # the miniature's own ledger has every run


def test_launch_reports_the_exit_code_and_the_cpu_time_of_its_process(tmp_path, monkeypatch):
    """The run's own CPU seconds (os.wait4), not this process's, and its thread count in OMP_NUM_THREADS; with a log,
    its output goes there."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    busy = "import os, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n" \
           "print('threads', os.environ['OMP_NUM_THREADS'])\nraise SystemExit(3)"
    log = tmp_path / "run.log"
    code, cpu = runner.launch([sys.executable, "-c", busy], 1, log)
    assert code == 3 and 0.3 <= cpu < 5 and "threads 1" in log.read_text()


def test_jobs_run_side_by_side_in_plan_order(tmp_path, monkeypatch):
    """--jobs 2: every unfinished run once, each with cores // 2 threads and its own log, the ledger summed per run."""
    import threading
    import time
    from repro.jobs import Job
    from repro.runner import CpuLedger, Unique, run_all
    started, lock, running, most = [], threading.Lock(), [0], [0]
    both = threading.Barrier(2, timeout=10)  # the first two runs must be in flight together

    def fake(cmd, threads, log):
        name = cmd[cmd.index("--name") + 1]
        with lock:
            started.append((name, threads, log.name))
            running[0] += 1
            most[0] = max(most[0], running[0])
        if name in ("a", "b"):
            both.wait()
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return (1 if name == "b" else 0), 0.5

    monkeypatch.setattr(runner, "command", lambda job, scale, nproc: ["train.py", "--name", *job.argv])
    monkeypatch.setattr(runner, "config_of", lambda argv: None)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runner, "launch", fake)
    uniques = [Unique(Job("r", 0, name, [name]), name) for name in ("a", "b", "c")]
    ledger = CpuLedger(tmp_path)
    assert run_all(uniques, tmp_path, ledger, jobs=2) == ["b"]
    assert most[0] == 2  # side by side, never more
    assert sorted(started) == [("a", 2, "a.log"), ("b", 2, "b.log"), ("c", 2, "c.log")]
    assert ledger.seconds == {"a": 0.5, "b": 0.5, "c": 0.5}


def test_every_planned_run_is_sized_by_the_proxy_rules():
    """Before anything runs: every unique run of the page (ladder rungs and MoE included) trains ≥ 10 tokens per
    compute parameter of its own (its strategy's extra vectors counted) in ≥ 1,000 steps with a 5 % warmup, reading
    the built-in corpus at most 4 times; and the ladders keep one tokens-per-parameter ratio and span ≥ 8× (Fig. 6)
    in compute."""
    from repro import proxy
    from repro.comparisons import Plan
    from repro.experiments import config_of
    from repro.runner import plan_runs
    uniques, _ = plan_runs(Plan(4), "runs/results")
    # Fig. 1 at 1.6e-2 and the MoE headline at ×4 and ×8: 2 runs each; the horizon rungs: dense 5, 4 and 5 lrs of 2
    # designs, the MoE's 4, 5 and 4, less the MoE's ×1 pair at 2e-3 (the d32 L2 E8 rung's); the magnitudes' A/B 2
    # (its IWD-as-today curve is the 10 × rung's unified run)
    assert len(uniques) == (42 + 6 + 2 * 14 + 2 * 13 - 2 + 2) * 4
    ratios = {}
    for u in uniques:
        cfg = config_of(u.job.argv)
        tokens = cfg.train.steps * cfg.train.global_batch * cfg.data.seq_len
        n = proxy.compute_params(cfg)
        assert tokens >= proxy.MIN_TOKENS_PER_PARAM * n, u.job.run_name
        assert cfg.train.steps >= proxy.MIN_STEPS and cfg.schedule.warmup_steps == round(0.05 * cfg.train.steps)
        assert tokens <= proxy.MAX_PASSES * proxy.BUILTIN_BPE1024_TRAIN_TOKENS, u.job.run_name
        ratios[u.job.run_name] = tokens / n
    for ladder, runs in (("fig6", proxy.DENSE_LADDER), ("fig7", proxy.MOE_LADDER)):
        base = [r for name, r in ratios.items() if name.startswith(f"{ladder}-") and "baseline" in name
                and "-x" not in name]  # the horizon rungs train 1, 3 and 10 × the ratio (repro/tests/test_horizon.py)
        assert base and max(base) - min(base) < 0.05  # one ratio (10.5, to the rounding of the steps)
    sizes = [proxy.size(Path("configs/figures/fig6/0.12b_baseline.yaml"), s) for s in proxy.DENSE_LADDER]
    assert (sizes[-1].compute_params * sizes[-1].tokens) / (sizes[0].compute_params * sizes[0].tokens) >= 8


def test_a_plot_an_earlier_page_holds_is_linked_there_not_copied(tmp_path):
    """A page's plot that an earlier page of its series already holds, byte for byte, links to that copy and its own
    goes; a plot of its own stays, and an earlier page never links to a later one."""
    from repro.page import share_plots
    img = tmp_path / "img"
    for d, name, data in (("results_v2", "a.png", b"A"), ("results_v3", "a.png", b"A"), ("results_v3", "c.png", b"C"),
                          ("results", "a.png", b"A"), ("results", "b.png", b"B"), ("results", "c.png", b"C")):
        (img / d).mkdir(parents=True, exist_ok=True)
        (img / d / name).write_bytes(data)
    text = "![a](img/results/a.png)\n![b](img/results/b.png)\n![c](img/results/c.png)\n"
    assert share_plots(tmp_path / "results.md", text) == \
        "![a](img/results_v2/a.png)\n![b](img/results/b.png)\n![c](img/results_v3/c.png)\n"
    assert sorted(p.name for p in (img / "results").iterdir()) == ["b.png"]
    v3 = "![a](img/results_v3/a.png)\n![c](img/results_v3/c.png)\n"
    assert share_plots(tmp_path / "results_v3.md", v3) == "![a](img/results_v2/a.png)\n![c](img/results_v3/c.png)\n"
    assert (img / "results_v3" / "c.png").is_file() and not (img / "results_v3" / "a.png").exists()


def test_the_study_pages_link_what_is_there_and_store_each_image_once():
    """repro/pages/: every local link of every page resolves, every image is linked by a page, and no two images
    are the same bytes (repro/page.py, share_plots)."""
    pages = results.ROOT / "repro" / "pages"
    linked = set()
    for page in sorted(pages.glob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith("http"):
                continue
            path = (page.parent / target).resolve()
            assert path.exists(), f"{page.name} links {target}, which is not there"
            linked.add(path)
    images = sorted(p.resolve() for p in (pages / "img").rglob("*.png"))
    assert images and set(images) <= linked, [str(p) for p in images if p not in linked]
    seen = {}
    for image in images:
        assert seen.setdefault(image.read_bytes(), image) == image, f"{image} repeats {seen[image.read_bytes()]}"

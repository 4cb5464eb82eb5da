"""The results page's eval set (repro/sources.py): its composition as the runs read it — v2's archived runs (a prefix
of the val split, Shakespeare alone, computed from the data or from the proxy corpus's measured counts) and runs
that evaluated the mixture (from their records) — and each source's loss beside the mixture's."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import data.composition
from config import load_config
from data.shards import DataError
from repro.comparisons import Comparison, Curve, Plan
from repro.measure import Results
from repro import page
from repro.page import scope
from runs import load_run
from repro.sources import composition_lines, eval_read, source_table, sources_of
from repro.stats import fmt, stat

ARCHIVE = Path(__file__).resolve().parents[2] / "repro" / "archives" / "results_runs_v2.jsonl.gz"  # v2's runs, compact
V2_SENTENCE = ("Each evaluation reads the first 32,768 tokens of the validation split's 105,578, in stored order, where "
               "its shakespeare documents come first. By source: shakespeare 32,768 (100.0 %), kjv 0 (0.0 %), though "
               "the model trains on shakespeare 60.5 % and kjv 39.5 % of its tokens. These runs' validation loss is on "
               "shakespeare alone.")


@pytest.fixture(scope="module")
def v2_dir(tmp_path_factory) -> Path:
    """The v2 archive unpacked: its run folders and ledger, as the folder archive they came from."""
    from repro.runner import unpack
    out = tmp_path_factory.mktemp("v2")
    unpack(ARCHIVE, out)
    return out


@pytest.fixture(scope="module")
def v2_runs(v2_dir) -> list:
    runs = [load_run(p) for p in sorted(v2_dir.iterdir()) if p.is_dir()]
    assert len(runs) == 144 and all(r.cfg.train.eval_sample == "prefix" for r in runs)  # saved before the key
    return runs


@pytest.mark.parametrize("data_here", [True, False])
def test_the_v2_archive_says_it_was_evaluated_on_shakespeare_alone(v2_runs, data_here, monkeypatch):
    """From the prepared data when it is here, else from the proxy corpus's counts: the same sentence."""
    if not data_here:
        def gone(*args, **kwargs):
            raise DataError("not prepared here")
        monkeypatch.setattr(data.composition, "composition", gone)
    res = SimpleNamespace(loaded=v2_runs)
    assert composition_lines(res) == [V2_SENTENCE]
    text = " ".join(scope(res))
    assert text.startswith("**Still the v2 runs, read with today's rules.** " + V2_SENTENCE)
    assert "these runs predate it, and their deltas cannot be paired with runs that read it" in text
    assert sources_of(res) == []  # no per-source losses: the page shows no per-source table


# ------------------------------------------------------------------------------------- mixture runs

READ = {"val_tokens": 105_216, "val_tokens/shakespeare": 67_072, "val_share/shakespeare": 0.6054,
        "val_tokens/kjv": 38_144, "val_share/kjv": 0.3946}
SEEDS = 3


def mixture_run(path: Path, final: dict[str, float], sample: str = "mixture") -> None:
    """A finished run directory whose evaluations log the mixture's losses per source (data/evalset.py)."""
    path.mkdir(parents=True)
    cfg = load_config("configs/tiny_cpu.yaml", ["train.steps=10", "schedule.warmup_steps=1",
                                                f"train.eval_sample={sample}", f"data.dir={path}/no_data"])
    (path / "config.yaml").write_text(cfg.to_yaml())
    extra = READ if sample == "mixture" else {}
    recs = [{"kind": "eval", "step": 0, "tokens": 0, "val_loss": 9.0, "val_loss/wiki": 9.0, **extra},
            {"kind": "eval", "step": 10, "tokens": 100, "val_loss/wiki": 6.0, **final, **extra},
            {"kind": "train", "step": 10, "tokens": 100, "epoch": 0.5, "loss": final["val_loss"]}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def panel(tmp_path: Path, sample_of=lambda curve, seed: "mixture"):
    comp = Comparison("fig9-wsd", "Fig. 9, WSD", "§4.8", (Curve("baseline", "9", "b"),
                                                          Curve("unified", "9", "u", paper_delta=-0.0269)))
    plan = Plan(SEEDS, (4e-3,), (), [comp])
    where = {}
    for curve, (sh, kjv) in (("baseline", (3.60, 3.30)), ("unified", (3.55, 3.31))):
        for s in range(SEEDS):
            losses = {"val_loss/shakespeare": sh + 0.01 * s, "val_loss/kjv": kjv + 0.02 * s}
            losses["val_loss"] = 0.6054 * losses["val_loss/shakespeare"] + 0.3946 * losses["val_loss/kjv"]
            mixture_run(tmp_path / f"{curve}-s{s}", losses, sample_of(curve, s))
            where[(f"fig9-wsd/{curve}", s)] = tmp_path / f"{curve}-s{s}"
    res = Results(plan, where, "wiki")
    for curve in comp.curves:
        res.runs_of(comp, curve)  # read them
    return res, comp


def test_mixture_runs_state_their_composition_and_each_sources_loss(tmp_path):
    res, comp = panel(tmp_path)
    assert eval_read(res.loaded[0]).tokens == (("shakespeare", 67_072), ("kjv", 38_144))
    said = composition_lines(res)
    assert said == ["Each evaluation reads 105,216 tokens of the validation split as windows of 256, each source's "
                    "documents in a fixed shuffled order, the same in every run (data/evalset.py): shakespeare 67,072 "
                    "(63.7 %), kjv 38,144 (36.3 %). The validation loss weighs each source's loss by its share of the "
                    "training tokens (shakespeare 60.5 % and kjv 39.5 %): it is the loss of the training mixture, and "
                    "each comparison gives the loss per source beside it."]
    text = "\n".join(scope(res))
    assert text.startswith("**The eval set.** " + said[0]) and "Still the v2 runs" not in text
    # Dense WSD's 3 seeds are short of its pilot's 4, so the rule has no n for it yet (its MDE, 0 with deltas that
    # do not spread, does not count); the other 6 central claims have no runs here.
    assert "Not done yet: the seeds the pilot rule asks for 7 of the 7 claims above the tables (Dense unified vs " \
           "baseline, the 0.12B proxy, each at its best lr; MoE unified vs baseline, the 0.5B proxy, each at its best " \
           "lr; Fig. 1, without vs with scale vectors, each at its best lr; Muon, dense; WSD, dense; Muon, MoE; WSD, " \
           "MoE; the first table gives each its seeds and the rule's n" in text
    table = source_table(res, comp)
    assert "| per source | mixture (val loss) | shakespeare | kjv |" in table
    base = {m: stat([res.runs_of(comp, comp.curves[0])[s].final_eval[m] for s in range(SEEDS)])
            for m in ("val_loss", "val_loss/shakespeare", "val_loss/kjv")}
    assert f"| baseline | {fmt(base['val_loss'])} | {fmt(base['val_loss/shakespeare'])} | " \
           f"{fmt(base['val_loss/kjv'])} |" in table
    delta = [line for line in table if line.startswith("| Δ unified − baseline |")]
    assert len(delta) == 1
    cells = delta[0].split(" | ")
    assert cells[2].startswith("-0.0500 [") and cells[3].startswith("+0.0100 [")  # shakespeare better, kjv worse
    assert cells[1].startswith(f"{0.6054 * -0.05 + 0.3946 * 0.01:+.4f} [")  # the mixture: the shares' weighing


def test_runs_of_different_eval_sets_are_said_apart(tmp_path):
    res, comp = panel(tmp_path, lambda curve, seed: "prefix" if curve == "baseline" else "mixture")
    said = composition_lines(res)
    assert said[0].startswith("**The runs read different eval sets**")
    assert any(line.startswith(f"- {SEEDS} runs: Each evaluation reads the first ") for line in said)
    assert any(line.startswith(f"- {SEEDS} runs: Each evaluation reads 105,216 tokens") for line in said)
    text = "\n".join(scope(res))
    assert "The runs read different eval sets (below)." in text and "\n- 3 runs: " in text


def test_only_trains_the_curves_it_names_and_refuses_a_pattern_that_matches_none(capsys):
    """--only: the headline rungs' runs alone, each once (a run shared with another comparison included), seed by
    seed; the page still reads every run there is. A pattern that matches nothing names the curves there are."""
    from repro.runner import plan_runs, select_runs
    from repro.proxy import DENSE, MOE
    from repro import results
    uniques, where = plan_runs(Plan(3), "runs/x")
    picked = select_runs(uniques, where, [f"fig6-ladder/* {DENSE.label}", f"fig7-ladder/* {MOE.label}"])
    expected = {where[(f"{key}/{design} {shape.label}", seed)].name for key, shape in
                (("fig6-ladder", DENSE), ("fig7-ladder", MOE)) for design in ("baseline", "unified") for seed in range(3)}
    assert {u.job.run_name for u in picked} == expected and len(picked) == 12
    assert [u.job.seed for u in picked] == sorted(u.job.seed for u in picked)  # seed by seed, as the plan runs
    assert len(select_runs(uniques, where, ["fig8-muon"])) == 6  # a bare key: all its curves
    with pytest.raises(ValueError, match="'fig6-ladder/nosuch' matches no curve; the curves are: fig1-lr_grid/"):
        select_runs(uniques, where, ["fig8-muon", "fig6-ladder/nosuch"])
    assert results.main(["--dry-run", "--seeds", "2", "--only", "fig9-wsd", "--out-dir", "runs/x"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert results.main(["--dry-run", "--only", "nosuch"]) == 2
    assert "error: --only 'nosuch' matches no curve" in capsys.readouterr().err


def test_the_variance_table_measures_tail_averaging_and_pairing(tmp_path):
    """Whether pairing and tail averaging cut the sd, from the runs: the paired sd at the last eval, of the last evals
    averaged, and the unpaired sd of the same runs with the curves' correlation. In this panel both curves rise
    with the seed alike: pairing removes all of the spread (paired sd 0, ρ = +1), which unpaired would be √2 ·
    the curves' sd."""
    from repro.variance import TAIL_EVALS, correlation, variance_lines
    res, comp = panel(tmp_path)
    row = next(r for r in res.rows if r.comparison is comp)
    lines = variance_lines(res, [row])
    curve_sd = stat([0.6054 * 0.01 * s + 0.3946 * 0.02 * s for s in range(SEEDS)]).sd
    cells = [c.strip() for c in lines[-2].strip("|").split("|")]
    assert cells[1:] == [str(SEEDS), "0.0000", *["0.0000"] * len(TAIL_EVALS), f"{2 ** 0.5 * curve_sd:.4f}", "+1.00"]
    assert correlation([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert correlation([1.0, 1.0], [2.0, 3.0]) is None


def test_v2s_kept_deltas_recompute_from_its_archive(v2_dir):
    """repro/versions.py's v2 deltas, which a v3 page is read against, are the archive's counted rows to 4 decimals:
    every one of them, and no counted row left out."""
    from repro.runner import plan_runs
    from repro.versions import V2
    plan = Plan(4, (2e-3, 4e-3, 8e-3), ())
    _, where = plan_runs(plan, str(v2_dir))
    res = Results(plan, where, "wikitext2_bpe1024")
    got = {(r.comparison.key, r.label): r.delta for r in res.rows if r.counted}
    assert set(got) == set(V2.deltas) and len(got) == 24
    for key, kept in V2.deltas.items():
        d = got[key]
        assert (round(d.mean, 4), round(d.lo, 4), round(d.hi, 4)) == (kept.mean, kept.lo, kept.hi), key


def test_v3s_kept_deltas_recompute_from_its_archive(tmp_path):
    """repro/versions.py's v3 deltas, which a v4 page is read against, are v3's archive's counted rows to 4 decimals
    (a best-vs-best row keyed without its lrs); v3 has no horizon run, so its own page is still read against v2."""
    from repro.reading import past_page
    from repro.runner import plan_runs, unpack
    from repro.versions import BEST, V3
    unpack(ARCHIVE.with_name("results_runs_v3.jsonl.gz"), tmp_path)
    plan = Plan(20)
    _, where = plan_runs(plan, str(tmp_path))
    res = Results(plan, where, "wikitext2_bpe1024")
    got = {(r.comparison.key, BEST if r.label.startswith(BEST) else r.label): r.delta for r in res.rows if r.counted}
    assert set(got) == set(V3.deltas) and len(got) == 12
    for key, kept in V3.deltas.items():
        d = got[key]
        assert (round(d.mean, 4), round(d.lo, 4), round(d.hi, 4)) == (kept.mean, kept.lo, kept.hi), key
    assert past_page(res)[0] == "v3"


def test_the_wikitext_set_is_prepared_in_a_checkout_with_no_data_yet(tmp_path):
    """repro.results in a fresh checkout: the training data is prepared first (a built-in source on first use),
    then WikiText-2 in its tokenizer; before, the eval set's preparation failed on the missing training dir."""
    from data.config import DataConfig
    from data.shards import META_FILE
    from repro.runner import prepare_wikitext
    train = DataConfig(dir=str(tmp_path / "train"), tokenizer="gpt2", seq_len=256)
    wiki = tmp_path / "wiki.test.raw"
    wiki.write_text(" = Robert Boulter = \n\n Robert Boulter is an English film and television actor . \n" * 20)
    prepare_wikitext(train, tmp_path / "wiki", wiki)
    assert (tmp_path / "train" / META_FILE).is_file() and (tmp_path / "wiki" / META_FILE).is_file()
    assert json.loads((tmp_path / "wiki" / META_FILE).read_text())["tokenizer"]["name"] == "gpt2"


def test_the_scope_says_so_when_every_central_claim_is_powered(tmp_path, monkeypatch):
    # short_of_power is tested on its own (repro/tests/test_verdicts.py); here, what the page's opening says of its answer.
    res, _ = panel(tmp_path)
    monkeypatch.setattr(page, "short_of_power", lambda res: [])
    text = "\n".join(page.scope(res, retuned=True))
    assert "Every one of the 7 claims above the tables has the seeds its pilot fixes by the rule (the power " \
           "section)." in text and "Not done yet" not in text
    monkeypatch.setattr(page, "short_of_power", lambda res: ["WSD, MoE"])
    text = "\n".join(page.scope(res, retuned=True))
    assert "Every one of" not in text and "Not done yet: the seeds the pilot rule asks for 1 of the 7 claims above " \
           "the tables (WSD, MoE; the first table gives" in text

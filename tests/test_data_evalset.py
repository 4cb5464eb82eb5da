"""The eval set (data/evalset.py, data/composition.py): the mixture's windows per source in the training proportions,
fixed and document-shuffled, every window once on any number of ranks; the losses it reports; the built-in corpus's
composition as prepare records it and as it is derived for a dir prepared before; a run's eval records per source,
the same on one rank and on two."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import train
from data.composition import Composition, composition
from data.config import DataConfig
from data.evalset import EvalSet, allocate, plan_windows, prefix_composition
from data.loader import val_batches
from data.prepare import prepare
from data.shards import is_val
from data.shards import DataError, Meta, ShardInfo, SplitInfo, load_meta, open_shard, shard_name, write_meta, \
    write_shard
from repro import proxy
from train_harness import records, run_ranks

EOT = 50256
INFO = {"spec": "gpt2", "name": "gpt2", "ranks_hash": "x" * 64, "n_vocab": 50257, "eot": EOT}


def labeled_dir(root: Path, val: list[tuple[str, int]], train: dict[str, int], shard_tokens: int = 10**9) -> Path:
    """A prepared dir whose val split holds documents [EOT, ids...] of the given (source, length), in that order:
    source k's ids count up from SPAN·(k + 1) through its documents, so a token names its source and its place. The
    train split holds one document per source of the given tokens (only their counts matter here)."""
    root.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys([n for n, _ in val] + list(train)))
    docs, counter = [], {n: 0 for n in names}
    for name, n in val:
        first = SPAN * (names.index(name) + 1) + counter[name]
        docs.append(np.concatenate([[EOT], np.arange(first, first + n - 1)]).astype(np.uint16))
        counter[name] += n - 1
    stream = np.concatenate(docs)
    splits = {"val": SplitInfo(docs=len(docs)), "train": SplitInfo(docs=len(train))}
    for i, lo in enumerate(range(0, len(stream), shard_tokens)):  # documents may straddle shards
        part = stream[lo:lo + shard_tokens]
        splits["val"].shards.append(ShardInfo(shard_name("val", i), len(part), write_shard(root / shard_name("val", i),
                                                                                            part)))
        splits["val"].tokens += len(part)
    tr = np.concatenate([np.array([EOT] + [1] * (n - 1), dtype=np.uint16) for n in train.values()])
    splits["train"].shards.append(ShardInfo(shard_name("train", 0), len(tr), write_shard(root / shard_name("train", 0),
                                                                                          tr)))
    splits["train"].tokens = len(tr)
    runs: list[list] = []
    for name, n in val:
        if runs and runs[-1][0] == names.index(name):
            runs[-1][1] += 1
            runs[-1][2] += n
        else:
            runs.append([names.index(name), 1, n])
    sources = {"names": names, "train": {"docs": [1 if train.get(n) else 0 for n in names],
                                         "tokens": [train.get(n, 0) for n in names]},
               "val": {"docs": [sum(1 for m, _ in val if m == n) for n in names],
                       "tokens": [sum(t for m, t in val if m == n) for n in names], "runs": runs}}
    meta = Meta(tokenizer=INFO, source="synthetic", request={}, eval_only=False, dtype="uint16", splits=splits,
                sources=sources)
    meta.fingerprint = meta.compute_fingerprint()
    write_meta(root, meta)
    return root


SPAN = 20_000


def source_of(window: torch.Tensor) -> set[int]:
    """The sources (1, 2, …) of a window's tokens, EOTs aside."""
    return {int(t) // SPAN for t in window.tolist() if t != EOT}


# An A-heavy val split stored source by source (A first), trained 60 / 40: A's val split holds more than its share.
VAL = [("a", 300 + 7 * i) for i in range(12)] + [("b", 250 + 5 * i) for i in range(6)]
TRAIN = {"a": 6000, "b": 4000}


def test_allocate_shares_a_budget_in_proportion_and_gives_a_full_sources_rest_to_the_others():
    assert allocate(100, [1000, 1000], [0.6, 0.4]) == [60, 40]
    assert allocate(101, [1000, 1000], [0.6, 0.4]) == [61, 40]  # largest remainder: 60.6 → 61, 40.4 → 40
    assert allocate(100, [1000, 30], [0.6, 0.4]) == [70, 30]  # b has 30: a takes the rest
    assert allocate(10**6, [50, 30], [0.6, 0.4]) == [50, 30]  # above the split: every window
    assert allocate(100, [1000, 1000, 5], [0.5, 0.0, 0.5]) == [95, 0, 5]  # no training weight, no windows
    for budget in range(0, 120, 7):
        n = allocate(budget, [40, 1000, 9], [0.2, 0.5, 0.3])
        assert sum(n) == min(budget, 1049) and all(0 <= a <= b for a, b in zip(n, [40, 1000, 9]))


def test_the_mixture_reads_each_source_in_training_proportions(tmp_path):
    d = labeled_dir(tmp_path / "d", VAL, TRAIN, shard_tokens=1000)
    comp = composition(d)
    assert comp.names == ("a", "b") and comp.shares == pytest.approx((0.6, 0.4))
    L, budget = 16, 2048  # 128 windows: 77 of a, 51 of b (a's 76.8 rounds up)
    es = EvalSet.build(d, L, budget, "mixture")
    assert [(s.name, s.windows) for s in es.streams] == [("a", 77), ("b", 51)]
    assert es.targets == 128 * L
    share = es.streams[0].windows / (es.streams[0].windows + es.streams[1].windows)
    assert share == pytest.approx(0.6, abs=1 / 128)  # the windows' mix is the training mix, to one window
    seen = {0: [], 1: []}
    for k, x, y, real in es.batches(micro_batch=8):
        assert real == x.shape[0] and torch.equal(x[:, 1:], y[:, :-1])
        for row in x:
            assert source_of(row) == {k + 1}  # every window is one source's: its loss is that source's
            seen[k].append(row)
    assert [len(seen[0]), len(seen[1])] == [77, 51]
    # The whole split: a budget above it reads every window, in the split's own mix; the weights stay 60 / 40.
    every = EvalSet.build(d, L, 10**6, "mixture")
    avail = [(t - 1) // L for t in comp.val_tokens]
    assert [s.windows for s in every.streams] == avail == plan_windows(comp.val_tokens, comp.shares, L, 10**6)
    assert [s.weight for s in every.streams] == pytest.approx([0.6, 0.4])


def test_the_mixture_is_fixed_document_shuffled_and_the_same_on_any_number_of_ranks(tmp_path):
    d = labeled_dir(tmp_path / "d", VAL, TRAIN, shard_tokens=777)
    L, budget, b = 16, 1600, 3
    es = EvalSet.build(d, L, budget, "mixture")
    again = EvalSet.build(d, L, budget, "mixture")
    for s, t in zip(es.streams, again.streams):
        assert np.array_equal(s.tokens, t.tokens)  # the same tokens in every run: no seed of the run enters
    # document-shuffled: a's stream does not start with a's first stored document, and holds its documents in an
    # order that is a permutation, each document whole (its EOT first)
    a = es.streams[0].tokens
    firsts = [int(t) for t, prev in zip(a[1:], a[:-1]) if prev == EOT]  # each document's first id, as read
    assert a[0] == EOT and len(set(firsts)) == len(firsts) and firsts != sorted(firsts)  # ids count up as stored
    assert all(int(a[i + 1]) == int(a[i]) + 1 for i in range(1, len(a) - 1) if EOT not in (a[i], a[i + 1]))
    reference = None
    for ws in (1, 2, 3, 5):
        rows, counts = {}, []
        for rank in range(ws):
            batches = list(es.batches(b, rank, ws))
            counts.append([(k, x.shape[0] if real else 0) for k, x, _, real in batches])
            for k, x, _, real in batches:
                assert real in (0, x.shape[0])
                for row in x[:real]:
                    key = (k, tuple(row.tolist()))
                    assert key not in rows, "a window read twice"
                    rows[key] = True
        assert len({len(c) for c in counts}) == 1  # every rank runs the same number of forwards
        assert [[k for k, _ in c] for c in counts] == [[k for k, _ in counts[0]]] * ws  # stream by stream, in step
        if reference is None:
            reference = rows
        assert rows.keys() == reference.keys()  # the same windows on 1, 2, 3 and 5 ranks
    assert len(reference) == sum(s.windows for s in es.streams)


def test_report_weighs_the_sources_by_their_training_shares(tmp_path):
    d = labeled_dir(tmp_path / "d", VAL, TRAIN)
    es = EvalSet.build(d, 16, 10**6, "mixture")
    na, nb = es.streams[0].windows, es.streams[1].windows
    out = es.report([[3.0 * na, na], [5.0 * nb, nb]])
    assert out["val_loss/a"] == pytest.approx(3.0) and out["val_loss/b"] == pytest.approx(5.0)
    assert out["val_loss"] == pytest.approx(0.6 * 3.0 + 0.4 * 5.0)  # not the windows' own mix
    assert (out["val_tokens"], out["val_tokens/a"], out["val_tokens/b"]) == ((na + nb) * 16, na * 16, nb * 16)
    assert (out["val_share/a"], out["val_share/b"]) == pytest.approx((0.6, 0.4))
    with pytest.raises(DataError, match="named 'b'"):
        EvalSet.build(d, 16, 10**6, "mixture", reserved={"b"})


def test_prefix_is_unchanged_and_unnamed_data_is_one_shuffled_stream(tmp_path):
    d = labeled_dir(tmp_path / "d", VAL, TRAIN, shard_tokens=1000)
    es = EvalSet.build(d, 16, 640, "prefix")
    got = [(k, x, real) for k, x, _, real in es.batches(4, 0, 1)]
    want = list(val_batches(d, 16, 4, 0, 1, 640))
    assert len(got) == len(want) and all(torch.equal(g[1], w[0]) and g[2] == len(w[0]) for g, w in zip(got, want))
    assert es.report([[12.0, 4.0]]) == {"val_loss": 3.0}  # a prefix logs what it always did
    comp = composition(d)
    assert prefix_composition(comp, 16, 640) == (640, 0)  # the front of a split stored a first is a's alone
    targets = (sum(comp.val_tokens) - 1) // 16 * 16  # positions 1..targets; a holds positions 0..Ta − 1
    assert prefix_composition(comp, 16, 10**6) == (comp.val_tokens[0] - 1, targets - comp.val_tokens[0] + 1)
    meta = json.loads((d / "meta.json").read_text())
    del meta["sources"]
    (d / "meta.json").write_text(json.dumps(meta))
    assert composition(d) is None
    one = EvalSet.build(d, 16, 640, "mixture")
    assert [(s.name, s.windows) for s in one.streams] == [(None, 40)]
    assert one.report([[12.0, 4.0]]) == {"val_loss": 3.0, "val_tokens": 640}


# ------------------------------------------------------------------------------------- the built-in corpus

@pytest.fixture(scope="module")
def pd_bpe1024(tmp_path_factory) -> DataConfig:
    """The proxy's corpus (repro/configs/tiny.yaml): builtin:pd_english in a trained 1,024-token BPE."""
    cfg = DataConfig(dir=str(tmp_path_factory.mktemp("pd") / "bpe1024"), tokenizer="bpe:1024", seq_len=256)
    prepare(cfg, progress=False)
    return cfg


def test_the_builtin_corpus_records_its_sources_and_an_older_dir_derives_the_same(pd_bpe1024, tmp_path):
    from data.builtin import pd_english_labeled
    meta = load_meta(pd_bpe1024.dir)
    comp = composition(pd_bpe1024.dir)
    assert meta.sources == proxy.BUILTIN_BPE1024_SOURCES  # the page's counts for an archive without the data
    assert sum(comp.train_tokens) == meta.splits["train"].tokens and sum(comp.val_tokens) == meta.splits["val"].tokens
    labeled = list(pd_english_labeled())
    val_labels = [comp.names.index(n) for n, text in labeled if is_val(text, 0.02)]
    assert comp.val_labels().tolist() == val_labels  # each val document's source, in stored order
    assert 0.55 < comp.shares[0] < 0.65  # Shakespeare is about 60 % of the training tokens, the KJV 40 %
    # A dir prepared before meta.json recorded `sources`: derived from the source and the shards, the same numbers.
    old = tmp_path / "old"
    old.mkdir()
    for p in Path(pd_bpe1024.dir).iterdir():
        (old / p.name).symlink_to(p.resolve())
    (old / "meta.json").unlink()
    d = meta.to_dict()
    del d["sources"]
    (old / "meta.json").write_text(json.dumps(d))
    assert load_meta(old).sources is None and composition(old) == comp


def test_the_proxy_eval_set_is_the_training_mixture(pd_bpe1024):
    """The proxy's settings (repro/configs/tiny.yaml): ≥ 100k tokens of both sources, weighed as training weighs them;
    the prefix it replaces is Shakespeare's alone."""
    from config import load_config
    t = load_config(["configs/base.yaml", "repro/configs/tiny.yaml"]).train
    assert t.eval_sample == "mixture"
    es = EvalSet.build(pd_bpe1024.dir, 256, t.eval_tokens, "mixture")
    comp = composition(pd_bpe1024.dir)
    assert es.targets >= 100_000 and {s.name for s in es.streams if s.windows} == {"shakespeare", "kjv"}
    assert [s.windows for s in es.streams] == [(n - 1) // 256 for n in comp.val_tokens]  # every window of the split
    mix = [s.windows / sum(x.windows for x in es.streams) for s in es.streams]
    assert mix == pytest.approx(comp.shares, abs=0.05)  # the split's own mix is near the training mix ...
    assert [s.weight for s in es.streams] == pytest.approx(comp.shares)  # ... and val_loss weighs it to it exactly
    assert prefix_composition(comp, 256, 32768) == (32768, 0)  # v2's eval set: no King James text at all
    small = EvalSet.build(pd_bpe1024.dir, 256, 32768, "mixture")  # under the split: drawn in the training mix
    assert small.streams[0].windows / 128 == pytest.approx(comp.shares[0], abs=1 / 128)


def test_a_run_logs_each_sources_loss_the_same_on_one_rank_and_two(pd_bpe1024, tmp_path):
    def argv(name: str) -> list[str]:
        return ["--config", "configs/base.yaml", "--config", "configs/scale/unified.yaml", "model.d_model=32",
                "model.n_layers=2", "model.n_heads=2", "model.d_ffn=64", f"data.dir={pd_bpe1024.dir}",
                "data.tokenizer=bpe:1024", "data.seq_len=32", "train.steps=1", "train.global_batch=4",
                "train.micro_batch=2", "train.eval_every=1", "train.eval_tokens=2048", "train.eval_sample=mixture",
                "train.ckpt_every=100", "schedule.warmup_steps=0", "log.every=1", "log.wandb.mode=disabled",
                f"log.out_dir={tmp_path}", f"log.run_name={name}", "train.device=cpu", "train.dtype=float64",
                "train.compile=false"]
    train.main(argv("one"))
    run_ranks(2, argv("two"))
    one, two = records(tmp_path / "one", "eval"), records(tmp_path / "two", "eval")
    first = one[0]
    assert {"val_loss/shakespeare", "val_loss/kjv", "val_share/shakespeare", "val_tokens/kjv"} <= set(first)
    assert first["val_tokens"] == 2048 == first["val_tokens/shakespeare"] + first["val_tokens/kjv"]
    assert first["val_loss"] == pytest.approx(sum(first[f"val_share/{n}"] * first[f"val_loss/{n}"]
                                                  for n in ("shakespeare", "kjv")), rel=1e-12)
    # step 0: the same weights on one rank and on two, so the same windows give the same losses up to the sums' order
    for key in ("val_loss", "val_loss/shakespeare", "val_loss/kjv"):
        assert two[0][key] == pytest.approx(first[key], rel=1e-12, abs=0)
    assert two[0]["val_tokens"] == 2048

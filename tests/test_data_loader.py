"""The loader over synthetic shards holding 0..N-1: exactly-once epochs for any world size, exact resume, the
validation stream, and the errors for corrupted shards and mismatched state."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from data.loader import TrainLoader, read_meta, val_batches, val_tokens_used
from data.shards import DataError, Meta, ShardInfo, SplitInfo, shard_name, write_meta, write_shard

GPT2_INFO = {"spec": "gpt2", "name": "gpt2", "ranks_hash": "x" * 64, "n_vocab": 50257, "eot": 50256}


def make_dir(root: Path, train: list[int], val: list[int] = (), n_vocab: int = 50257, start: int = 0) -> Path:
    """A prepared dir whose shards hold consecutive integers: train shards first, then val, from `start`."""
    root.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype(np.uint16 if n_vocab <= 65536 else np.uint32)
    nxt = start
    splits: dict[str, SplitInfo] = {}
    for split, lengths in (("train", train), ("val", val)):
        if not lengths:
            continue
        info = splits[split] = SplitInfo(docs=len(lengths))
        for i, n in enumerate(lengths):
            name = shard_name(split, i)
            digest = write_shard(root / name, np.arange(nxt, nxt + n, dtype=dtype))
            info.shards.append(ShardInfo(name, n, digest))
            info.tokens += n
            nxt += n
    meta = Meta(tokenizer={**GPT2_INFO, "n_vocab": n_vocab}, source="synthetic", request={}, eval_only=not train,
                dtype=dtype.name, splits=splits)
    meta.fingerprint = meta.compute_fingerprint()
    write_meta(root, meta)
    return root


def collect(data_dir: Path, seq_len: int, b: int, ws: int, steps: int, seed: int = 0) -> dict[int, torch.Tensor]:
    """Global stream position → the window's x row, gathered from every rank's loader."""
    out = {}
    for r in range(ws):
        loader = TrainLoader(data_dir, seq_len, b, r, ws, seed)
        for k in range(steps):
            x, y = loader.next_batch()
            assert x.shape == y.shape == (b, seq_len) and x.dtype == y.dtype == torch.int64
            assert torch.equal(y[:, :-1], x[:, 1:])
            for i in range(b):
                out[(k * b + i) * ws + r] = x[i]
    return out


@pytest.mark.parametrize("ws", [1, 2, 3])
def test_every_window_exactly_once_per_epoch_across_ranks(tmp_path, ws):
    seq_len, b = 8, 2
    d = make_dir(tmp_path, train=[101, 57, 90])  # 12 + 7 + 11 = 30 windows, not a multiple of b × ws
    windows = 30
    steps = -(-2 * windows // (b * ws))  # two epochs and then some
    stream = collect(d, seq_len, b, ws, steps)
    starts = {int(s) for shard_start, n in ((0, 101), (101, 57), (158, 90))
              for s in range(shard_start, shard_start + n - seq_len, seq_len)}
    assert len(starts) == windows
    for epoch in range(2):
        rows = [stream[p] for p in range(epoch * windows, (epoch + 1) * windows)]
        firsts = sorted(int(r[0]) for r in rows)
        assert firsts == sorted(starts)  # every window once: none missing, none twice
        for r in rows:  # contiguous, never across a shard boundary (101 and 158 start new shards)
            assert torch.equal(r, torch.arange(int(r[0]), int(r[0]) + seq_len))
            assert not any(int(r[0]) < edge <= int(r[0]) + seq_len for edge in (101, 158))
    order = [[int(stream[p][0]) for p in range(e * windows, (e + 1) * windows)] for e in range(2)]
    assert order[0] != order[1]  # epochs reshuffle


def test_order_is_fixed_by_seed_and_epoch(tmp_path):
    d = make_dir(tmp_path, train=[2000])
    a, b, c = (TrainLoader(d, 16, 4, seed=s) for s in (0, 0, 1))
    assert np.array_equal(a.permutation(3), b.permutation(3))
    assert not np.array_equal(a.permutation(3), c.permutation(3))
    assert not np.array_equal(a.permutation(0), a.permutation(1))
    assert a.tokens_per_epoch == (1999 // 16) * 16


@pytest.mark.parametrize("ws", [1, 2])
def test_resume_matches_an_uninterrupted_loader(tmp_path, ws):
    d = make_dir(tmp_path, train=[300, 211])
    for r in range(ws):
        straight = TrainLoader(d, 16, 3, r, ws, seed=7)
        ref = [straight.next_batch() for _ in range(25)]  # 25·3·ws windows > 31: crosses epochs
        first = TrainLoader(d, 16, 3, r, ws, seed=7)
        for _ in range(9):
            first.next_batch()
        state = first.state_dict()
        resumed = TrainLoader(d, 16, 3, r, ws, seed=7)
        resumed.load_state_dict(state)
        assert state["step"] == 9 and state["world_size"] == ws
        for k in range(9, 25):
            x, y = resumed.next_batch()
            assert torch.equal(x, ref[k][0]) and torch.equal(y, ref[k][1])
    assert TrainLoader(d, 16, 3, 0, 1, seed=7).state_dict()["epoch"] == 0


def test_state_mismatches_are_refused(tmp_path):
    d = make_dir(tmp_path / "a", train=[500])
    other = make_dir(tmp_path / "b", train=[500], start=1)
    state = TrainLoader(d, 16, 2, 0, 2).state_dict()
    with pytest.raises(DataError, match="world_size=2, this run has world_size=1"):
        TrainLoader(d, 16, 2, 0, 1).load_state_dict(state)
    with pytest.raises(DataError, match="seq_len"):
        TrainLoader(d, 8, 2, 0, 2).load_state_dict(state)
    with pytest.raises(DataError, match="fingerprint"):
        TrainLoader(other, 16, 2, 0, 2).load_state_dict(state)


def test_uint32_shards(tmp_path):
    d = make_dir(tmp_path, train=[64], val=[64], n_vocab=100277, start=70_000)
    assert read_meta(d)["dtype"] == "uint32" and read_meta(d)["n_vocab"] == 100277
    x, y = TrainLoader(d, 8, 2).next_batch()
    assert int(x.min()) >= 70_000 and torch.equal(y, x + 1)


def test_truncated_or_corrupted_shard_names_the_file(tmp_path):
    d = make_dir(tmp_path, train=[500, 400], val=[100])
    shard = d / "train_000001.bin"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(DataError, match=r"train_000001\.bin is truncated or corrupted: its header says 400"):
        TrainLoader(d, 16, 2)
    val = d / "val_000000.bin"
    val.write_bytes(b"NOTMAGIC" + val.read_bytes()[8:])
    with pytest.raises(DataError, match=r"val_000000\.bin is corrupted or not a scalevec shard"):
        next(val_batches(d, 16, 2))


def test_missing_dir_and_missing_split(tmp_path):
    with pytest.raises(DataError, match=r"does not exist; prepare it with `python -m data.prepare"):
        TrainLoader(tmp_path / "nowhere", 16, 2)
    eval_only = make_dir(tmp_path / "eval", train=[], val=[300])
    with pytest.raises(DataError, match="no train split"):
        TrainLoader(eval_only, 16, 2)
    with pytest.raises(DataError, match="shorter than seq_len"):
        TrainLoader(make_dir(tmp_path / "tiny", train=[10], val=[10]), 16, 2)


def test_val_stream_is_fixed_and_split_evenly_across_ranks(tmp_path):
    d = make_dir(tmp_path, train=[100], val=[700, 300], start=0)  # val tokens are 100..1099
    seq_len, b, max_tokens = 16, 4, 900
    n = 900 // seq_len  # 56 windows from the first 901 tokens (crossing the val shard boundary)
    for ws in (1, 2, 3):
        per_rank = [list(val_batches(d, seq_len, b, r, ws, max_tokens)) for r in range(ws)]
        assert len({len(p) for p in per_rank}) == 1  # same number of batches on every rank
        assert len({tuple(x.shape[0] for x, _ in p) for p in per_rank}) == 1  # and the same sizes
        firsts = sorted(int(x[i, 0]) for p in per_rank for x, _ in p for i in range(x.shape[0]))
        kept = (n // ws) * ws
        assert firsts == [100 + w * seq_len for w in range(kept)]  # the first windows, each once
        for p in per_rank:
            for x, y in p:
                assert torch.equal(y, x + 1)
        assert val_tokens_used(d, seq_len, ws, max_tokens) == kept * seq_len
    again = list(val_batches(d, seq_len, b, 0, 1, max_tokens))
    assert all(torch.equal(a[0], c[0]) for a, c in zip(again, val_batches(d, seq_len, b, 0, 1, max_tokens)))
    assert sum(x.numel() for x, _ in val_batches(d, seq_len, b, 0, 1, None)) == (999 // 16) * 16
    with pytest.raises(DataError, match="fewer than the 3 rank"):
        list(val_batches(d, seq_len, b, 0, 3, max_tokens=20))

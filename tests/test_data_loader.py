"""The loader over synthetic shards holding 0..N-1: exactly-once epochs for any world size, exact resume (with and
without prefetch), the prefetch thread's lifetime and errors, the validation stream, and the errors for corrupted
shards and mismatched state. One file (about 430 lines) over the loader's one synthetic-shard fixture."""
from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

from data.loader import (TrainLoader, batch_digest, read_meta, resolve_prefetch, val_batches,
                         window_order)
from data.prefetch import PREFETCH_DEPTH
from data.shards import DataError, Meta, ShardInfo, SplitInfo, load_meta, shard_name, write_meta, write_shard

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
    ids = np.arange(a.n_windows)
    assert np.array_equal(a._order(3, ids), b._order(3, ids))
    assert not np.array_equal(a._order(3, ids), c._order(3, ids))
    assert not np.array_equal(a._order(0, ids), a._order(1, ids))
    assert a.tokens_per_epoch == (1999 // 16) * 16


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 65, 1000, 4096, 4097, 30_011])
def test_window_order_is_a_bijection(n):
    for seed, epoch in ((0, 0), (7, 3)):
        assert np.array_equal(np.sort(window_order(np.arange(n), n, seed, epoch)), np.arange(n))


def test_window_order_looks_shuffled_and_needs_no_array():
    """No structure a training run would notice: consecutive positions land on unrelated windows, and two epochs'
    orders share about 1/n of their fixed points; and the order of 103M windows (106B tokens of 1,024) is computed
    for one batch without allocating anything of the data's size (a permutation array would be 0.8 GB)."""
    n = 100_000
    order = window_order(np.arange(n), n, 0, 0)
    assert abs(np.corrcoef(order[:-1], order[1:])[0, 1]) < 5 / np.sqrt(n)  # 5 sd of a correlation of unrelated pairs
    assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 5 / np.sqrt(n)
    assert (order == window_order(np.arange(n), n, 0, 1)).sum() < 10  # expected 1 shared fixed point
    big = 103_000_000
    tracemalloc.start()
    ids = window_order(np.arange(5_000_000, 5_000_016), big, 0, 2)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 1024 and len(set(ids.tolist())) == 16 and 0 <= ids.min() and ids.max() < big


def wait_until_ahead(loader: TrainLoader) -> None:
    """Give the producer time to fill its queue, so a test sees state taken while batches wait unconsumed."""
    deadline = time.monotonic() + 5
    while loader.prefetch and time.monotonic() < deadline:
        if loader._producer is not None and loader._producer._ready.qsize() == PREFETCH_DEPTH:
            return
        time.sleep(0.01)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("TrainLoader-prefetch")]


@pytest.mark.parametrize("ws", [1, 2])
@pytest.mark.parametrize("prefetch", [False, True])
def test_resume_matches_an_uninterrupted_loader(tmp_path, ws, prefetch):
    d = make_dir(tmp_path, train=[300, 211])  # 18 + 13 = 31 windows
    for r in range(ws):
        straight = TrainLoader(d, 16, 3, r, ws, seed=7)  # the plain path is the reference
        ref = [straight.next_batch() for _ in range(25)]  # 25·3·ws windows > 31: crosses epochs
        with TrainLoader(d, 16, 3, r, ws, seed=7, prefetch=prefetch) as first:
            for _ in range(9):  # 9·3·ws ≥ 27: the save falls just before (ws 1) or after (ws 2) an epoch boundary
                first.next_batch()
            wait_until_ahead(first)
            state = first.state_dict()
            assert state["position"] == 9 * 3 * ws and state["world_size"] == ws  # consumed, not gathered ahead
            assert first.epochs_done == 9 * 3 * ws / 31
            for k in range(9, 12):  # the interrupted loader itself continues correctly after a save
                assert torch.equal(first.next_batch()[0], ref[k][0])
        with TrainLoader(d, 16, 3, r, ws, seed=7, prefetch=prefetch) as resumed:
            resumed.load_state_dict(state)
            for k in range(9, 25):
                x, y = resumed.next_batch()
                assert torch.equal(x, ref[k][0]) and torch.equal(y, ref[k][1])
    assert TrainLoader(d, 16, 3, 0, 1, seed=7).state_dict()["epoch"] == 0


@pytest.mark.parametrize("ws", [1, 3])
def test_prefetch_yields_the_same_batches(tmp_path, ws):
    d = make_dir(tmp_path, train=[101, 57, 90])  # 30 windows: every few steps a batch straddles two epochs
    for r in range(ws):
        plain = TrainLoader(d, 8, 4, r, ws, seed=3)
        with TrainLoader(d, 8, 4, r, ws, seed=3, prefetch=True) as ahead:
            for k in range(40):  # > 5 epochs
                (x0, y0), (x1, y1) = plain.next_batch(), ahead.next_batch()
                assert x1.shape == y1.shape == (4, 8) and x1.dtype == y1.dtype == torch.int64
                assert x1.is_contiguous() and y1.is_contiguous()
                assert torch.equal(x0, x1) and torch.equal(y0, y1), k
                assert ahead.step == plain.step == k + 1 and ahead.epoch == plain.epoch


def test_load_state_dict_discards_batches_gathered_ahead(tmp_path):
    d = make_dir(tmp_path, train=[1000])
    ref = TrainLoader(d, 16, 2, seed=1)
    batches = [ref.next_batch()[0] for _ in range(12)]
    with TrainLoader(d, 16, 2, seed=1, prefetch=True) as loader:
        for _ in range(6):
            loader.next_batch()
        wait_until_ahead(loader)
        loader.load_state_dict({**loader.state_dict(), "position": 4})  # back to step 2 with 6, 7… queued
        assert torch.equal(loader.next_batch()[0], batches[2])
        loader.step = 10  # moving the position by hand restarts the producer too
        assert torch.equal(loader.next_batch()[0], batches[10])


def test_prefetch_thread_ends_on_close_and_with_the_loader(tmp_path):
    d = make_dir(tmp_path, train=[1000])
    before = len(prefetch_threads())
    loader = TrainLoader(d, 16, 2, prefetch=True)
    assert len(prefetch_threads()) == before  # started lazily, so a resume does not gather the wrong batches
    loader.next_batch()
    (thread,) = [t for t in prefetch_threads() if t.is_alive()][before:]
    assert thread.daemon  # never holds up interpreter exit
    loader.close()
    assert not thread.is_alive()
    loader.next_batch()  # a closed loader starts again where it stands
    assert loader.step == 2
    (thread,) = prefetch_threads()[before:]
    del loader  # forgotten without close(): the thread sees the loader gone and ends
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_an_unclosed_prefetching_loader_exits_cleanly(tmp_path):
    # The producer is inside torch (GIL released) when the interpreter exits: without the loader's atexit close,
    # the daemon thread dies in C++ frames and the process aborts ("terminate called without an active exception").
    d = make_dir(tmp_path, train=[1000])
    code = ("import torch\nfrom data.loader import TrainLoader\n"
            "class Slow(TrainLoader):\n"
            "    def gather(self, step):\n"
            "        for _ in range(10): torch.ones(5_000_000).sum()\n"
            "        return super().gather(step)\n"
            f"a = Slow({str(d)!r}, 16, 2, prefetch=True); a.next_batch()\n"
            f"b = TrainLoader({str(d)!r}, 16, 2, prefetch=True); b.next_batch(); b.step = 5; b.next_batch()\n"
            "print('done', a.step, b.step)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "done 1 6", out.stderr


class RecordingLoader(TrainLoader):
    """A loader that notes which micro-batches it gathered, and when (the trainer's step then)."""

    def gather(self, step: int) -> torch.Tensor:
        self.gathered.append((step, self.step))
        return super().gather(step)


def test_the_producer_runs_at_most_prefetch_depth_ahead(tmp_path):
    d = make_dir(tmp_path, train=[1000])
    with RecordingLoader(d, 16, 2, prefetch=True) as loader:
        loader.gathered = []
        for _ in range(20):
            loader.next_batch()
            wait_until_ahead(loader)
        steps = [s for s, _ in loader.gathered]
        assert steps == list(range(len(steps))) and len(steps) == 20 + PREFETCH_DEPTH  # in order, each once
        assert all(s - consumed <= PREFETCH_DEPTH for s, consumed in loader.gathered)


class FailingLoader(TrainLoader):
    """A loader whose gather fails at one step, as a read of a broken file would."""

    def gather(self, step: int) -> torch.Tensor:
        if step == 3:
            raise DataError(f"cannot read micro-batch {step}: disk on fire")
        return super().gather(step)


@pytest.mark.parametrize("prefetch", [False, True])
def test_an_error_while_gathering_surfaces_in_next_batch(tmp_path, prefetch):
    d = make_dir(tmp_path, train=[1000])
    with FailingLoader(d, 16, 2, prefetch=prefetch) as loader:
        for _ in range(3):  # the batches before the failure arrive first
            loader.next_batch()
        for _ in range(2):  # and the error stays, with its type and message, at the step it happened
            with pytest.raises(DataError, match="cannot read micro-batch 3: disk on fire"):
                loader.next_batch()
            assert loader.step == 3


def test_resolve_prefetch():
    assert resolve_prefetch("auto", "cuda") and resolve_prefetch("auto", torch.device("cuda", 1))
    assert not resolve_prefetch("auto", "cpu")  # measured: no faster on 2 cores (harness/bench_loader.py)
    assert resolve_prefetch(True, "cpu") and not resolve_prefetch(False, "cuda")
    with pytest.raises(ValueError, match="auto, true or false"):
        resolve_prefetch("yes", "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [False, True])
def test_cuda_batches_arrive_on_the_device_and_match_the_cpu_ones(tmp_path, prefetch):
    d = make_dir(tmp_path, train=[5000])
    plain = TrainLoader(d, 64, 8, seed=2)
    with TrainLoader(d, 64, 8, seed=2, device="cuda", prefetch=prefetch) as loader:
        assert loader.gather(0).is_pinned()
        out = []
        for _ in range(30):  # hold the device tensors: later gathers must not overwrite copies in flight
            x, y = loader.next_batch()
            assert x.is_cuda and y.is_cuda and x.dtype == torch.int64 and x.shape == (8, 64)
            out.append((x, y))
        torch.cuda.synchronize()
        for x, y in out:
            x0, y0 = plain.next_batch()
            assert torch.equal(x.cpu(), x0) and torch.equal(y.cpu(), y0)


def test_state_mismatches_are_refused(tmp_path):
    d = make_dir(tmp_path / "a", train=[500])
    other = make_dir(tmp_path / "b", train=[500], start=1)
    loader = TrainLoader(d, 16, 2, 0, 2)
    loader.next_batch()  # position 4
    state = loader.state_dict()
    with pytest.raises(DataError, match="seq_len=16, this run has seq_len=8"):
        TrainLoader(d, 8, 2, 0, 2).load_state_dict(state)
    with pytest.raises(DataError, match="seed=0, this run has seed=1"):
        TrainLoader(d, 16, 2, 0, 2, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="fingerprint"):
        TrainLoader(other, 16, 2, 0, 2).load_state_dict(state)
    # position 4 is no micro-batch boundary of 3 ranks × 1 (train.py refuses such a layout before this)
    with pytest.raises(DataError, match=r"position \(4 windows, written by world_size=2 × micro_batch=2\) is not a "
                                        r"multiple of this run's micro_batch × world_size = 1 × 3 = 3"):
        TrainLoader(d, 16, 1, 0, 3).load_state_dict(state)
    with pytest.raises(DataError, match="version 4 is newer"):
        TrainLoader(d, 16, 2, 0, 2).load_state_dict({**state, "version": 4})
    with pytest.raises(DataError, match="window order 'zigzag'"):
        TrainLoader(d, 16, 2, 0, 2).load_state_dict({**state, "order": "zigzag"})


def global_batches(d, seq_len: int, global_batch: int, micro: int, world: int, seed: int, steps: range,
                   state: dict | None = None, order: str = "feistel") -> tuple[list[torch.Tensor], dict]:
    """Each optimizer step's global batch as the set of its rows (sorted), read by `world` loaders of `micro` rows
    with global_batch // (micro · world) micro-batches per step, resumed from `state` (any layout's) or started in
    `order`; and the state after the last step (rank 0's)."""
    loaders = [TrainLoader(d, seq_len, micro, r, world, seed) for r in range(world)]
    for loader in loaders:
        loader.order = order
        if state is not None:
            loader.load_state_dict(state)
    accum = global_batch // (micro * world)
    out = []
    for _ in steps:
        rows = torch.cat([torch.cat([loader.next_batch()[0] for _ in range(accum)]) for loader in loaders])
        out.append(rows[torch.argsort(batch_digest_rows(rows))])  # order-free: sorted by a per-row key
    return out, loaders[0].state_dict()


def batch_digest_rows(rows: torch.Tensor) -> torch.Tensor:
    return torch.stack([batch_digest(r.view(1, -1)) for r in rows])


@pytest.mark.parametrize("layouts", [[(2, 2), (1, 4), (2, 1)], [(4, 1), (1, 1), (2, 2)]])
def test_a_resume_on_another_layout_reads_the_same_global_batches(tmp_path, layouts):
    """World size and micro-batch change at two resumes (2 ranks → 1 rank with twice the micro-batch → 2 ranks …);
    every optimizer step's global batch holds exactly the windows of an uninterrupted 1-rank run's, across epochs.
    A run started by older code (state versions 1 and 2: the materialized permutation order; version 1 also counted
    the per-rank step) goes on in its own order, onto another layout, at the same position."""
    d = make_dir(tmp_path, train=[300, 211])  # 31 windows of 16: a global batch of 4 rows crosses epochs every ~8
    for order in ("feistel", "permutation"):
        ref, _ = global_batches(d, 16, 4, 4, 1, 5, range(24), order=order)
        got, state = [], None
        for (world, micro), steps in zip(layouts, (range(0, 7), range(7, 15), range(15, 24))):
            if state is not None and order == "permutation":  # the old formats of the same position
                old = {k: state[k] for k in ("epoch", "seed", "world_size", "micro_batch", "seq_len", "fingerprint")}
                state = ({"version": 1, "step": state["position"] // (state["micro_batch"] * state["world_size"]),
                          **old} if world == 1 else {"version": 2, "position": state["position"], **old})
            part, state = global_batches(d, 16, 4, micro, world, 5, steps, state, order)
            got += part
        assert len(got) == len(ref) == 24
        for k, (a, b) in enumerate(zip(ref, got)):
            assert torch.equal(a, b), f"{order}: step {k}"
        assert state["position"] == 24 * 4 and state["order"] == order


def test_batch_digest_names_the_rows_not_their_order():
    x = torch.randint(0, 50_304, (6, 32), generator=torch.Generator().manual_seed(0))
    whole = batch_digest(x)
    assert whole.dtype == torch.int64 and whole.dim() == 0
    assert batch_digest(x[:2]) + batch_digest(x[2:]) == whole == batch_digest(x.flip(0))  # any split, any order
    shifted = x.clone()
    shifted[3] = torch.roll(x[3], 1)  # one window read one token off
    assert batch_digest(shifted) != whole
    other = x.clone()
    other[0, 5] += 1
    assert batch_digest(other) != whole


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


def _poke(shard: Path, at: int, value: int) -> None:
    """Overwrite token `at` of a uint16 shard in place, its size kept (as a bad disk or a stray write would)."""
    from data.shards import HEADER_BYTES
    with open(shard, "r+b") as f:
        f.seek(HEADER_BYTES + 2 * at)
        f.write(int(value).to_bytes(2, "little"))


def test_an_id_outside_the_vocabulary_names_its_shard_and_the_command(tmp_path):
    """An id past the vocabulary (a shard edited in place) would be an IndexError deep in the model, a device-side
    assert on a GPU: the batch that reads it is refused in one line naming the shard, the token and the command."""
    d = make_dir(tmp_path / "d", train=[400, 400], val=[100], n_vocab=1000)
    _poke(d / "train_000001.bin", 37, 1000 + 5)
    loader = TrainLoader(d, 8, 100)  # 100 windows of 8: every window of both shards in the first batch
    with pytest.raises(DataError, match=r"train_000001\.bin holds token id 1005 at token 37, outside the "
                                        r"tokenizer's 1,000 ids: .* python -m data\.prepare --source synthetic "
                                        r"--tokenizer .* --out .*d --force"):
        loader.next_batch()
    _poke(d / "val_000000.bin", 3, 4000)
    with pytest.raises(DataError, match=r"holds token id 4000 at token 3"):
        next(val_batches(d, 16, 2))


def test_the_background_check_finds_an_edit_in_place_and_caches_what_passed(tmp_path, monkeypatch):
    """Ids still inside the vocabulary, but not what data.prepare wrote: meta.json's sha256 finds it. A shard that
    passed is cached in verified.json by size and time, so a later check reads it no more."""
    from data import verify
    d = make_dir(tmp_path / "d", train=[400, 400], val=[100], n_vocab=1000)
    check = verify.ShardCheck(d, load_meta(d))
    assert check.done.wait(30) and check.problem is None
    assert sorted(json.loads((d / verify.VERIFIED).read_text())) == ["train_000000.bin", "train_000001.bin",
                                                                     "val_000000.bin"]
    calls = []
    monkeypatch.setattr(verify, "check_shard", lambda *a: calls.append(a[0]) or None)
    again = verify.ShardCheck(d, load_meta(d))
    assert again.done.wait(30) and calls == []
    monkeypatch.undo()
    _poke(d / "train_000001.bin", 10, 7)  # a valid id, another time stamp
    edited = verify.ShardCheck(d, load_meta(d))
    assert edited.done.wait(30)
    assert "train_000001.bin is not what data.prepare wrote (its sha256 differs" in edited.problem
    assert "--force" in edited.problem


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
        assert sum(y.numel() for p in per_rank for _, y in p) == kept * seq_len  # targets evaluated, all ranks
    again = list(val_batches(d, seq_len, b, 0, 1, max_tokens))
    assert all(torch.equal(a[0], c[0]) for a, c in zip(again, val_batches(d, seq_len, b, 0, 1, max_tokens)))
    assert sum(x.numel() for x, _ in val_batches(d, seq_len, b, 0, 1, None)) == (999 // 16) * 16
    with pytest.raises(DataError, match="fewer than the 3 rank"):
        list(val_batches(d, seq_len, b, 0, 3, max_tokens=20))


def test_a_split_of_many_shards_raises_the_open_file_limit(tmp_path, monkeypatch):
    """Each memory-mapped shard holds a file descriptor (106B tokens: 1,060 shards, above a common default of 1,024):
    opening a split raises the soft limit up to the hard one, and past the hard one says what to do."""
    import resource

    from data import loader as loader_mod
    d = make_dir(tmp_path / "d", [40] * 30)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    now = len(list(Path("/proc/self/fd").iterdir()))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (now + 10, hard))
        loader = TrainLoader(d, 8, 2)
        assert len(loader.shards) == 30 and loader.next_batch()[0].shape == (2, 8)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= now + 30 + loader_mod.FD_HEADROOM
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    monkeypatch.setattr(resource, "getrlimit", lambda _: (now + 10, now + 20))
    with pytest.raises(DataError, match=r"30 shards hold 30 open files.*ulimit -Hn.*--shard-tokens"):
        TrainLoader(d, 8, 2)

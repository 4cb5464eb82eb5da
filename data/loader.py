"""The training loader and the validation streams, over memory-mapped token shards.

Training windows. A window is seq_len + 1 contiguous tokens starting at a multiple of seq_len inside one shard
(x = the first seq_len, y = the last seq_len, so every token but a shard's first is a target exactly once per
epoch); windows never cross a shard boundary. Number them 0..W-1 in shard order.

Order. Epoch e visits the windows in the order `permutation(W)` of numpy's PCG64 seeded with (seed, e). The
epochs are laid end to end as one global stream; global step k takes the micro_batch × world_size consecutive
positions [k·B·ws, (k+1)·B·ws), and rank r takes positions k·B·ws + i·ws + r for i < B. Hence, for any world
size: ranks are disjoint, every window appears exactly once per epoch across ranks, no window is ever dropped,
and every rank produces the same number of batches (a batch may straddle two epochs). The whole state is the
step k, the same on every rank, so rank 0's `state_dict()` can resume them all.

Validation. `val_batches` reads the first `max_tokens` tokens of a val split (shards concatenated in order) as
windows at stride seq_len, the same for every run. With n windows and ws ranks, rank r takes windows r, r+ws, …
of the first ⌊n/ws⌋·ws (the < ws leftover windows are dropped, so with ws = 1 nothing is) and yields them in
batches of micro_batch, the last one possibly smaller but of the same size on every rank: every rank runs the
same number of forwards, so collectives never hang. Average losses weighted by rows, not per batch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from data.shards import DataError, Meta, load_meta, open_shard

STATE_VERSION = 1


def read_meta(data_dir: str | Path) -> dict:
    """meta.json as a plain dict: n_vocab, tokenizer {spec, name, ranks_hash, n_vocab, eot}, source, request,
    dtype, splits {train, val: {docs, tokens, shards}}, text_bytes, seconds, fingerprint. A missing dir is an
    error that names the prepare command."""
    return load_meta(data_dir).to_dict()


def _open_split(data_dir: Path, meta: Meta, split: str) -> list[np.ndarray]:
    info = meta.splits.get(split)
    if info is None or not info.shards:
        what = "an eval-only set" if meta.eval_only else "prepared without it"
        raise DataError(f"{data_dir} has no {split} split ({what})")
    arrays = []
    for shard in info.shards:
        arr = open_shard(data_dir / shard.file)
        if len(arr) != shard.tokens:
            raise DataError(f"shard {data_dir / shard.file} holds {len(arr)} tokens but meta.json says "
                            f"{shard.tokens}; the dir is corrupted, re-run prepare with --force")
        arrays.append(arr)
    return arrays


class TrainLoader:
    """Batches (x, y) of int64 tensors (micro_batch, seq_len) for one rank; see the module docstring."""

    def __init__(self, data_dir: str | Path, seq_len: int, micro_batch: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0):
        if not (seq_len > 0 and micro_batch > 0 and world_size > 0 and 0 <= rank < world_size):
            raise ValueError(f"TrainLoader: need seq_len, micro_batch > 0 and 0 ≤ rank < world_size "
                             f"(got {seq_len}, {micro_batch}, rank {rank}, world_size {world_size})")
        self.data_dir = Path(data_dir)
        self.seq_len, self.micro_batch, self.rank, self.world_size, self.seed = (
            seq_len, micro_batch, rank, world_size, seed)
        meta = load_meta(self.data_dir)
        self.fingerprint = meta.fingerprint
        self.shards = _open_split(self.data_dir, meta, "train")
        # windows in shard s: starts 0, L, 2L, … while start + L + 1 ≤ len(shard)
        per_shard = np.array([max(0, (len(a) - 1) // seq_len) for a in self.shards], dtype=np.int64)
        self.n_windows = int(per_shard.sum())
        if self.n_windows == 0:
            raise DataError(f"{self.data_dir}: the train split's shards are shorter than seq_len + 1 = {seq_len + 1} "
                            "tokens; use a smaller seq_len or more data")
        self._first = np.concatenate([[0], np.cumsum(per_shard)])  # first global window id of each shard
        self.step = 0  # micro-batches produced so far (identical on every rank)
        self._perms: dict[int, np.ndarray] = {}

    @property
    def tokens_per_epoch(self) -> int:
        """Target tokens in one pass over all windows (across all ranks)."""
        return self.n_windows * self.seq_len

    @property
    def epochs_done(self) -> float:
        """Passes over the training windows so far, across all ranks (1.0 = every window seen once)."""
        return self.step * self.micro_batch * self.world_size / self.n_windows

    @property
    def epoch(self) -> int:
        """The epoch of the next window this rank reads."""
        return int(self._positions(self.step)[0] // self.n_windows)

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 4:  # a batch spans at most a few epochs; keep memory flat
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
        return self._perms[epoch]

    def _positions(self, step: int) -> np.ndarray:
        b, ws = self.micro_batch, self.world_size
        return step * b * ws + np.arange(b, dtype=np.int64) * ws + self.rank

    def window_ids(self, step: int) -> np.ndarray:
        """Global window ids of this rank's micro-batch number `step`."""
        pos = self._positions(step)
        epochs, idx = np.divmod(pos, self.n_windows)
        return np.array([self.permutation(int(e))[i] for e, i in zip(epochs, idx)], dtype=np.int64)

    def _window(self, wid: int) -> np.ndarray:
        s = int(np.searchsorted(self._first, wid, side="right") - 1)
        start = (wid - int(self._first[s])) * self.seq_len
        return self.shards[s][start: start + self.seq_len + 1]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.stack([self._window(int(w)) for w in self.window_ids(self.step)]).astype(np.int64)
        self.step += 1
        buf = torch.from_numpy(rows)  # (B, L + 1)
        return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "step": self.step, "epoch": self.epoch, "seed": self.seed,
                "world_size": self.world_size, "micro_batch": self.micro_batch, "seq_len": self.seq_len,
                "fingerprint": self.fingerprint}

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("fingerprint") != self.fingerprint:
            raise DataError(f"loader state is for data with fingerprint {str(sd.get('fingerprint'))[:12]}, but "
                            f"{self.data_dir} has {self.fingerprint[:12]}: the data changed since the checkpoint "
                            "(re-prepared, or another data.dir); resume with the original data or start a new run")
        for key in ("world_size", "micro_batch", "seq_len", "seed"):
            if sd.get(key) != getattr(self, key):
                raise DataError(f"loader state was saved with {key}={sd.get(key)}, this run has "
                                f"{key}={getattr(self, key)}; an exact resume needs the same {key}"
                                + (" (same number of ranks)" if key == "world_size" else ""))
        self.step = int(sd["step"])

    def __repr__(self) -> str:
        return (f"TrainLoader({self.data_dir}, seq_len={self.seq_len}, micro_batch={self.micro_batch}, rank "
                f"{self.rank}/{self.world_size}, {self.n_windows} windows, step {self.step})")


def val_batches(data_dir: str | Path, seq_len: int, micro_batch: int, rank: int = 0, world_size: int = 1,
                max_tokens: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The first max_tokens (None: all) tokens of the val split as (x, y) batches for this rank (module doc)."""
    data_dir = Path(data_dir)
    tokens = _read_prefix(_open_split(data_dir, load_meta(data_dir), "val"), max_tokens)
    n = max(0, (len(tokens) - 1) // seq_len)
    per_rank = n // world_size
    if per_rank == 0:
        raise DataError(f"{data_dir}: the val stream ({len(tokens)} tokens) makes {n} windows of {seq_len + 1}, "
                        f"fewer than the {world_size} rank(s); raise eval_tokens or lower seq_len")
    ids = np.arange(per_rank, dtype=np.int64) * world_size + rank
    for lo in range(0, per_rank, micro_batch):
        rows = np.stack([tokens[w * seq_len: w * seq_len + seq_len + 1] for w in ids[lo: lo + micro_batch]])
        buf = torch.from_numpy(rows.astype(np.int64))
        yield buf[:, :-1].contiguous(), buf[:, 1:].contiguous()


def val_tokens_used(data_dir: str | Path, seq_len: int, world_size: int = 1, max_tokens: int | None = None) -> int:
    """How many target tokens `val_batches` evaluates across all ranks (for logging)."""
    info = load_meta(data_dir).splits["val"]
    total = info.tokens if max_tokens is None else min(info.tokens, max_tokens + 1)
    return ((total - 1) // seq_len // world_size) * world_size * seq_len


def _read_prefix(shards: list[np.ndarray], max_tokens: int | None) -> np.ndarray:
    # max_tokens targets need max_tokens + 1 tokens (the last window's final target)
    want = None if max_tokens is None else max_tokens + 1
    parts, have = [], 0
    for arr in shards:
        take = len(arr) if want is None else min(len(arr), want - have)
        parts.append(np.asarray(arr[:take]))
        have += take
        if want is not None and have >= want:
            break
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

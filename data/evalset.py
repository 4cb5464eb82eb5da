"""The validation windows one evaluation reads (`train.eval_sample`), and the losses it reports from them.

prefix (the default, and what every run evaluated before the key existed): the first eval_tokens tokens of the val
split in stored order, as windows at stride seq_len (data/loader.py, val_batches). The split stores its documents in
source order, so its front may hold one source only: builtin:pd_english stores Shakespeare's works first, and its
first 32,768 bpe:1024 val tokens are all Shakespeare, though the King James Bible is about 40 % of its training tokens.

mixture: the training mixture. Each source's val documents (data/composition.py) are put in a fixed order, drawn
once from numpy's PCG64 seeded with (SHUFFLE_SEED, the source's index) — the same documents in the same order in
every run whatever train.seed, so the seeds of a paired comparison are scored on the same tokens — concatenated into
that source's stream and cut into windows of seq_len + 1 at stride seq_len. The budget of eval_tokens // seq_len
windows is shared out in proportion to each source's share of the training tokens; a source whose val split holds
fewer windows than its share gives all it has, and the rest goes to the others (`allocate`), so a budget at or
above the split's size reads every window of it. Each window is one source's, so each source's mean loss is exact
(`val_loss/<source>`), and `val_loss` weighs those means by the training shares: the loss of the training mixture,
whatever mix the windows read have (builtin:pd_english's whole val split is 64 % Shakespeare by bpe:1024 tokens, its
train split 61 %). The records also carry what was read: `val_tokens` (targets), and per source `val_tokens/<source>`
and `val_share/<source>` (its weight in val_loss). Data whose source names no sources is one stream: a
document-shuffled sample of the val split, `val_loss` and `val_tokens` only. Extra eval sets (data.val_sets) are
read as a prefix either way: an out-of-domain check, not a mixture.

Ranks (mixture). Window i of a stream goes to rank i mod world_size, and every rank runs the same number of forwards
per stream, ⌈⌈n / world_size⌉ / micro_batch⌉; a rank out of windows runs window 0 in their place with weight 0. Every
window is then read exactly once on any number of ranks: the same tokens, and the same losses up to the order of
the sums.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from data.composition import Composition, composition, document_starts
from data.loader import _open_split, val_batches
from data.shards import DataError, load_meta
from data.verify import out_of_vocab

SAMPLES = ("prefix", "mixture")
SHUFFLE_SEED = 0xE7A1  # the eval documents' order: a constant, never train.seed


def allocate(budget: int, available: Sequence[int], weights: Sequence[float]) -> list[int]:
    """Windows per source: `budget` shared in proportion to `weights`, none above its `available`; what a source
    cannot take goes to the others in proportion (water-filling), so the total is min(budget, Σ available over the
    sources of positive weight). Fractions round by largest remainder (ties to the earlier source)."""
    out = [0] * len(available)
    open_ = [i for i, (a, w) in enumerate(zip(available, weights)) if a > 0 and w > 0]
    left = min(budget, sum(available[i] for i in open_))
    while open_ and left > 0:
        total = sum(weights[i] for i in open_)
        quota = {i: left * weights[i] / total for i in open_}
        full = [i for i in open_ if available[i] <= quota[i]]
        if not full:
            floors = {i: math.floor(quota[i]) for i in open_}
            extra = left - sum(floors.values())
            for i in sorted(open_, key=lambda i: (floors[i] - quota[i], i))[:extra]:
                floors[i] += 1  # ≤ available: available > quota, an integer
            for i in open_:
                out[i] = floors[i]
            break
        for i in full:
            out[i] = available[i]
            left -= available[i]
        open_ = [i for i in open_ if i not in full]
    return out


def plan_windows(val_tokens: Sequence[int], shares: Sequence[float], seq_len: int, eval_tokens: int) -> list[int]:
    """The mixture's windows per source, from each source's val tokens and training share (module docstring)."""
    return allocate(eval_tokens // seq_len, [max(0, (t - 1) // seq_len) for t in val_tokens], shares)


@dataclass(frozen=True)
class Stream:
    """One source's windows (the whole split's, unnamed, for data without sources or a prefix)."""
    name: Optional[str]
    windows: int
    weight: float  # in val_loss (renormalized over the streams that have windows)
    tokens: Optional[np.ndarray] = None  # mixture: the stream's first windows·seq_len + 1 tokens


class EvalSet:
    """What each evaluation of one validation set reads: `build`, then `batches` on every rank, then `report` of the
    all-reduced (Σ loss·rows, Σ rows) per stream."""

    def __init__(self, data_dir: Path, sample: str, seq_len: int, eval_tokens: int, streams: list[Stream]):
        self.data_dir, self.sample, self.seq_len, self.eval_tokens = data_dir, sample, seq_len, eval_tokens
        self.streams = streams

    @classmethod
    def build(cls, data_dir: str | Path, seq_len: int, eval_tokens: int, sample: str = "prefix",
              reserved: Iterable[str] = ()) -> "EvalSet":
        """`reserved`: names a source may not have (the extra eval sets': each logs val_loss/<name> too)."""
        data_dir = Path(data_dir)
        if sample not in SAMPLES:
            raise ValueError(f"eval sample {sample!r}: expected one of {', '.join(SAMPLES)}")
        meta = load_meta(data_dir)
        if sample == "prefix":
            total = meta.splits["val"].tokens if "val" in meta.splits else 0
            return cls(data_dir, sample, seq_len, eval_tokens,
                       [Stream(None, min(eval_tokens, max(0, total - 1)) // seq_len, 1.0)])
        comp = composition(data_dir, meta)
        starts, total = document_starts(data_dir, meta, "val")
        lengths = np.diff(np.append(starts, total))
        if comp is None:
            groups, names, shares = [np.arange(len(starts))], (None,), (1.0,)
        else:
            labels = comp.val_labels()
            if len(labels) != len(starts):
                raise DataError(f"{data_dir}: meta.json's sources name {len(labels)} val documents, its shards hold "
                                f"{len(starts)}; the dir is corrupted, re-prepare it with --force")
            groups = [np.flatnonzero(labels == k) for k in range(len(comp.names))]
            names, shares = comp.names, comp.shares
            clash = sorted(set(names) & set(reserved))
            if clash:
                raise DataError(f"data.val_sets: an eval set's folder is named {clash[0]!r}, like a source of "
                                f"{data_dir}: both would log val_loss/{clash[0]}; rename the folder")
        planned = plan_windows([int(lengths[g].sum()) for g in groups], shares, seq_len, eval_tokens)
        shards = _open_split(data_dir, meta, "val")
        streams = []
        for k, (group, n, name, share) in enumerate(zip(groups, planned, names, shares)):
            order = group[np.random.default_rng([SHUFFLE_SEED, k]).permutation(len(group))]
            streams.append(Stream(name, n, share, _stream(shards, starts[order], lengths[order], n * seq_len + 1)))
            problem = out_of_vocab(data_dir / "val_*.bin", streams[-1].tokens, int(meta.tokenizer["n_vocab"]),
                                   data_dir, meta)
            if problem:
                raise DataError(problem)
        if not any(s.windows for s in streams):
            raise DataError(f"{data_dir}: the val split ({total} tokens) makes no window of {seq_len + 1} tokens "
                            f"within eval_tokens={eval_tokens}; raise eval_tokens or lower seq_len")
        return cls(data_dir, sample, seq_len, eval_tokens, streams)

    @property
    def named(self) -> bool:
        """Whether the streams are sources with names (the losses come per source)."""
        return self.streams[0].name is not None

    def batches(self, micro_batch: int, rank: int = 0,
                world_size: int = 1) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, int]]:
        """(stream index, x, y, rows that count) for this rank: x, y int64 (rows, seq_len) on the host; a padding
        batch (module docstring) counts 0 rows."""
        if self.sample == "prefix":
            for x, y in val_batches(self.data_dir, self.seq_len, micro_batch, rank, world_size, self.eval_tokens):
                yield 0, x, y, x.shape[0]
            return
        L = self.seq_len
        for k, s in enumerate(self.streams):
            if not s.windows:
                continue
            mine = np.arange(rank, s.windows, world_size)
            for j in range(-(-(-(-s.windows // world_size)) // micro_batch)):  # the same count on every rank
                ids = mine[j * micro_batch:(j + 1) * micro_batch]
                real = len(ids)
                rows = np.stack([s.tokens[w * L: w * L + L + 1] for w in (ids if real else [0])])
                buf = torch.from_numpy(rows.astype(np.int64))
                yield k, buf[:, :-1].contiguous(), buf[:, 1:].contiguous(), real

    def report(self, totals: Sequence[Sequence[float]], key: str = "val_loss") -> dict[str, float]:
        """The record's entries from each stream's all-reduced (Σ loss·rows, Σ rows): `key` (the mean, or for named
        sources the training-share-weighted mean of theirs), and for a mixture what it read (module docstring)."""
        means = [t[0] / max(t[1], 1.0) for t in totals]
        if self.sample == "prefix":
            return {key: means[0]}
        tail = key[len("val_loss"):]
        present = [k for k, s in enumerate(self.streams) if s.windows]
        out = {key: means[0], f"val_tokens{tail}": self.targets}
        if self.named:
            weight = sum(self.streams[k].weight for k in present)
            out[key] = sum(self.streams[k].weight * means[k] for k in present) / weight
            for k in present:
                s = self.streams[k]
                out.update({f"{key}/{s.name}": means[k], f"val_tokens{tail}/{s.name}": s.windows * self.seq_len,
                            f"val_share{tail}/{s.name}": s.weight / weight})
        return out

    @property
    def targets(self) -> int:
        """Target tokens one evaluation reads, over every rank (a prefix: with one rank)."""
        return sum(s.windows for s in self.streams) * self.seq_len

    def describe(self) -> str:
        """One line for the run's start: what the evaluation reads."""
        if self.sample == "prefix":
            return (f"eval set {self.data_dir}: the first {self.targets:,} target tokens of the val split, in stored "
                    "order")
        head = f"eval set {self.data_dir}: {self.targets:,} target tokens of the val split, document-shuffled"
        if not self.named:
            return head
        present = [s for s in self.streams if s.windows]
        weight = sum(s.weight for s in present)
        read = ", ".join(f"{s.name} {s.windows * self.seq_len:,} ({s.windows * self.seq_len / self.targets:.1%})"
                         for s in present)
        shares = ", ".join(f"{s.name} {s.weight / weight:.1%}" for s in present)
        return f"{head}: {read}; val_loss weighs them as the training tokens do ({shares})"


def _stream(shards: list[np.ndarray], starts: np.ndarray, lengths: np.ndarray, need: int) -> np.ndarray:
    """The first `need` tokens of the documents at `starts` (positions in the split's stream) taken in that order."""
    if need <= 1:
        return np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in shards])])
    parts, have = [], 0
    for start, n in zip(starts.tolist(), lengths.tolist()):
        take = min(n, need - have)
        parts.append(_read(shards, offsets, start, start + take))
        have += take
        if have >= need:
            break
    return np.concatenate(parts)


def _read(shards: list[np.ndarray], offsets: np.ndarray, a: int, b: int) -> np.ndarray:
    """Positions [a, b) of the split's stream (a document may straddle shards)."""
    out = []
    i = int(np.searchsorted(offsets, a, side="right")) - 1
    while a < b:
        lo, hi = a - offsets[i], min(b, offsets[i + 1]) - offsets[i]
        out.append(np.asarray(shards[i][lo:hi]))
        a = int(offsets[i] + hi)
        i += 1
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def prefix_composition(comp: Composition, seq_len: int, eval_tokens: int) -> tuple[int, ...]:
    """Target tokens per source that a prefix evaluation of eval_tokens reads (with one rank)."""
    total = sum(comp.val_tokens)
    return comp.prefix_targets(min(eval_tokens, max(0, total - 1)) // seq_len * seq_len)

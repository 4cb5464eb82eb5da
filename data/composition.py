"""Which source each document of a prepared dir came from, and how many tokens each source holds in each split.

A source that names the source of each document (the built-in corpus: Shakespeare's works and the King James Bible,
data/builtin.py) gets `sources` in meta.json, written by data/prepare.py:

    {"names": ["shakespeare", "kjv"],
     "train": {"docs": [766, 1160], "tokens": [2113207, 1377138]},
     "val": {"docs": [23, 29], "tokens": [67181, 38397], "runs": [[0, 23, 67181], [1, 29, 38397]]}}

docs and tokens per source (a document's tokens count its leading EOT); `runs` lists the val split's documents in
stored order as runs of consecutive documents of one source, [source index, documents, tokens]. Other sources have no
`sources` (one source, unnamed). A dir prepared before meta.json recorded `sources` gets the same numbers from
`composition` when its source is built in: which documents went to the val split is a function of their text
(data/shards.py, is_val), so the source's documents are read again (no tokenizing), and each document's tokens are
found from its leading EOT in the shards.

What the evaluation reads of it, and how it weighs the sources: data/evalset.py.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from data.shards import DataError, Meta, is_val, load_meta, open_shard


@dataclass(frozen=True)
class Composition:
    """A prepared dir's documents and tokens per source (the meta.json `sources` above)."""
    names: tuple[str, ...]
    train_docs: tuple[int, ...]
    train_tokens: tuple[int, ...]
    val_docs: tuple[int, ...]
    val_tokens: tuple[int, ...]
    val_runs: tuple[tuple[int, int, int], ...]  # (source index, documents, tokens) in the val split's stored order

    @property
    def shares(self) -> tuple[float, ...]:
        """Each source's share of the training tokens: the training mixture's proportions (an eval-only dir's val
        tokens stand in)."""
        counts = self.train_tokens if sum(self.train_tokens) else self.val_tokens
        total = sum(counts)
        return tuple(c / total for c in counts) if total else tuple(0.0 for _ in counts)

    def val_labels(self) -> np.ndarray:
        """(val documents,) int64: the source index of each val document, in stored order."""
        return np.repeat([r[0] for r in self.val_runs], [r[1] for r in self.val_runs]).astype(np.int64)

    def prefix_targets(self, n_targets: int) -> tuple[int, ...]:
        """Target tokens per source among the val stream's positions 1..n_targets: what the windows of the split's
        first n_targets + 1 tokens predict (a target belongs to the document that holds it; the EOT that opens a
        document is that document's)."""
        out = [0] * len(self.names)
        start = 0
        for source, _, tokens in self.val_runs:
            lo, hi = max(start, 1), min(start + tokens, n_targets + 1)  # positions [lo, hi) of this run
            out[source] += max(0, hi - lo)
            start += tokens
        return tuple(out)

    def to_dict(self) -> dict:
        return {"names": list(self.names),
                "train": {"docs": list(self.train_docs), "tokens": list(self.train_tokens)},
                "val": {"docs": list(self.val_docs), "tokens": list(self.val_tokens),
                        "runs": [list(r) for r in self.val_runs]}}

    @classmethod
    def from_dict(cls, d: dict) -> "Composition":
        n = len(d["names"])
        train = d.get("train") or {"docs": [0] * n, "tokens": [0] * n}
        return cls(tuple(d["names"]), tuple(train["docs"]), tuple(train["tokens"]), tuple(d["val"]["docs"]),
                   tuple(d["val"]["tokens"]), tuple(tuple(r) for r in d["val"]["runs"]))


class SourceCounter:
    """Counts what data/prepare.py writes, per split and source, into meta.json's `sources` (None when a document
    names no source)."""

    def __init__(self):
        self.names: list[str] = []
        self.docs: dict[str, dict[str, int]] = {"train": {}, "val": {}}
        self.tokens: dict[str, dict[str, int]] = {"train": {}, "val": {}}
        self.runs: list[list] = []  # [name, documents, tokens] of the val split, in order
        self.unnamed = False

    def add(self, split: str, name: Optional[str], n_tokens: int) -> None:
        if name is None:
            self.unnamed = True
            return
        if name not in self.names:
            self.names.append(name)
        self.docs[split][name] = self.docs[split].get(name, 0) + 1
        self.tokens[split][name] = self.tokens[split].get(name, 0) + n_tokens
        if split == "val":
            if self.runs and self.runs[-1][0] == name:
                self.runs[-1][1] += 1
                self.runs[-1][2] += n_tokens
            else:
                self.runs.append([name, 1, n_tokens])

    def result(self) -> Optional[dict]:
        if self.unnamed or not self.names:
            return None
        index = {n: i for i, n in enumerate(self.names)}
        per = {s: {"docs": [self.docs[s].get(n, 0) for n in self.names],
                   "tokens": [self.tokens[s].get(n, 0) for n in self.names]} for s in ("train", "val")}
        per["val"]["runs"] = [[index[n], d, t] for n, d, t in self.runs]
        return {"names": list(self.names), **per}


def composition(data_dir: str | Path, meta: Optional[Meta] = None) -> Optional[Composition]:
    """The dir's composition by source: meta.json's `sources`, or for a built-in source prepared before meta.json
    recorded it, derived (module docstring); None for data whose source names no sources."""
    meta = meta or load_meta(data_dir)
    if meta.sources is not None:
        return Composition.from_dict(meta.sources)
    if not meta.source.startswith("builtin:"):
        return None
    return _derived(str(Path(data_dir).resolve()), meta.fingerprint)


@functools.lru_cache(maxsize=8)
def _derived(data_dir: str, fingerprint: str) -> Composition:
    """A built-in dir's composition from its source's documents and its shards (cached per dir and tokens)."""
    from data.builtin import SOURCES, builtin_labeled
    meta = load_meta(data_dir)
    name = meta.source[len("builtin:"):]
    names = SOURCES[name]
    index = {n: i for i, n in enumerate(names)}
    want = {s: info.docs for s, info in meta.splits.items()}
    labels: dict[str, list[int]] = {s: [] for s in want}
    frac = meta.request.get("val_frac")
    for label, text in builtin_labeled(name):  # prepare wrote them in this order, each to the split is_val says
        split = "val" if meta.eval_only or is_val(text, frac) else "train"
        if len(labels[split]) < want[split]:
            labels[split].append(index[label])
        if all(len(labels[s]) == want[s] for s in want):
            break
    per: dict[str, tuple[list[int], list[int]]] = {}
    val_lengths = np.zeros(0, dtype=np.int64)
    for split in want:
        lengths = document_lengths(Path(data_dir), meta, split)
        if len(lengths) != len(labels[split]):
            raise DataError(f"{data_dir}: its {split} split holds {len(lengths)} documents, but the built-in source "
                            f"{meta.source} puts {len(labels[split])} there now: re-prepare it with --force")
        lab = np.asarray(labels[split], dtype=np.int64)
        per[split] = (np.bincount(lab, minlength=len(names)).tolist(),
                      np.bincount(lab, weights=lengths, minlength=len(names)).astype(np.int64).tolist())
        if split == "val":
            val_lengths = lengths
    runs = _runs(labels.get("val", []), val_lengths)
    zeros = [0] * len(names)
    train_docs, train_tokens = per.get("train", (zeros, zeros))
    return Composition(tuple(names), tuple(train_docs), tuple(train_tokens), tuple(per["val"][0]),
                       tuple(per["val"][1]), runs)


def _runs(labels: Iterable[int], lengths: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    out: list[list[int]] = []
    for label, n in zip(labels, lengths.tolist()):
        if out and out[-1][0] == label:
            out[-1][1] += 1
            out[-1][2] += n
        else:
            out.append([label, 1, n])
    return tuple(tuple(r) for r in out)


def document_starts(data_dir: Path, meta: Meta, split: str) -> tuple[np.ndarray, int]:
    """(starts, total): each document's first position in the split's token stream (its EOT: data/prepare.py writes
    [EOT] + tokens, and the tokenizer never emits EOT inside a document), and the stream's length. One pass over the
    split's shards, a shard at a time."""
    eot = meta.tokenizer["eot"]
    starts, offset = [], 0
    for shard in meta.splits[split].shards:
        arr = open_shard(Path(data_dir) / shard.file)
        starts.append(np.flatnonzero(arr == eot) + offset)
        offset += len(arr)
    out = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    if offset and (len(out) == 0 or out[0] != 0):
        raise DataError(f"{data_dir}: the {split} split does not start with an EOT: not a split data/prepare.py "
                        "wrote; re-prepare it with --force")
    return out.astype(np.int64), offset


def document_lengths(data_dir: Path, meta: Meta, split: str) -> np.ndarray:
    """(documents,) int64: each document's tokens in the split, its EOT included."""
    starts, total = document_starts(data_dir, meta, split)
    return np.diff(np.append(starts, total))

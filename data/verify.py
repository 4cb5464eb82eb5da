"""Whether a prepared data dir still holds what data.prepare wrote: each shard's token ids against the tokenizer's
vocabulary, and its sha256 against the one meta.json recorded.

A run checks in a background thread (`ShardCheck`, started by the trainer on rank 0), so the first step does not
wait for it: at paper scale the shards hold about 200 GB, which one core hashes in about 3.5 minutes (sha256 at
1.0 GiB/s, docs/benchmarks.md). A shard that passed is recorded in `<data dir>/verified.json` by its size and time,
so a later run pays nothing for it; a data dir that cannot be written is checked again each time. Each batch is
also checked against the vocabulary as it is read (data/loader.py), so no id outside it reaches the model before
the background check gets there.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Optional

import numpy as np

from data.shards import Meta, open_shard

VERIFIED = "verified.json"  # {shard file: [size, mtime_ns, sha256]} of the shards that passed
_CHUNK_TOKENS = 1 << 22


def reprepare_command(data_dir: Path, meta: Meta) -> str:
    """The command that prepares `data_dir` again from its source."""
    return (f"python -m data.prepare --source {meta.source} --tokenizer {meta.tokenizer['spec']} --out {data_dir} "
            "--force")


def out_of_vocab(path: Path, tokens: np.ndarray, n_vocab: int, data_dir: Path, meta: Meta,
                 offset: int = 0) -> Optional[str]:
    """The problem with `tokens` (read from shard `path` from token `offset` on), if an id lies outside the
    vocabulary."""
    if tokens.size == 0 or int(tokens.max()) < n_vocab:
        return None
    at = int(np.argmax(tokens >= n_vocab))
    return (f"shard {path} holds token id {int(tokens[at])} at token {offset + at:,}, outside the tokenizer's "
            f"{n_vocab:,} ids: it was changed after it was prepared. Prepare it again: "
            f"{reprepare_command(data_dir, meta)}")


def check_shard(path: Path, sha256: Optional[str], n_vocab: int, data_dir: Path, meta: Meta) -> Optional[str]:
    """One pass over a shard: its ids against the vocabulary and its token bytes against meta.json's sha256."""
    tokens = open_shard(path)
    digest = hashlib.sha256()
    for start in range(0, len(tokens), _CHUNK_TOKENS):
        chunk = np.asarray(tokens[start:start + _CHUNK_TOKENS])
        problem = out_of_vocab(path, chunk, n_vocab, data_dir, meta, start)
        if problem:
            return problem
        digest.update(chunk.tobytes())
    if sha256 is not None and digest.hexdigest() != sha256:
        return (f"shard {path} is not what data.prepare wrote (its sha256 differs from meta.json's): it was changed "
                f"after it was prepared. Prepare it again: {reprepare_command(data_dir, meta)}")
    return None


class ShardCheck:
    """Checks every shard of a data dir in a background thread (daemon: it never holds up exit). `problem` is the
    first one found (None while none is); `done` is set when every shard was checked."""

    def __init__(self, data_dir: str | Path, meta: Meta):
        self.data_dir, self.meta = Path(data_dir), meta
        self.problem: Optional[str] = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="shard-check", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            cache = self._read_cache()
            n_vocab = int(self.meta.tokenizer["n_vocab"])
            for info in (s for split in self.meta.splits.values() for s in split.shards):
                path = self.data_dir / info.file
                stat = path.stat()
                key = [stat.st_size, stat.st_mtime_ns, info.sha256]
                if cache.get(info.file) == key:
                    continue
                self.problem = check_shard(path, info.sha256, n_vocab, self.data_dir, self.meta)
                if self.problem:
                    return
                cache[info.file] = key
                self._write_cache(cache)
        except OSError as e:  # a shard gone or unreadable: the loader's own checks name it
            self.problem = f"{self.data_dir}: a shard cannot be read ({e}); prepare it again: " + \
                reprepare_command(self.data_dir, self.meta)
        finally:
            self.done.set()

    def _read_cache(self) -> dict:
        try:
            return json.loads((self.data_dir / VERIFIED).read_text())
        except (OSError, ValueError):
            return {}

    def _write_cache(self, cache: dict) -> None:
        path = self.data_dir / VERIFIED
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(cache, sort_keys=True))
            os.replace(tmp, path)  # a reader sees the old cache or the new one
        except OSError:
            pass  # a read-only data dir: checked again next time

"""On-disk format of a prepared data dir: token shards with a small header, and meta.json.

A shard `{split}_{index:06d}.bin` is a 32-byte header followed by the tokens:

    offset 0   8 bytes  magic b"SCVTOKEN"
    offset 8   uint32   format version (1)
    offset 12  uint32   bytes per token: 2 (uint16, when the vocabulary fits) or 4 (uint32)
    offset 16  uint64   number of tokens
    offset 24  8 bytes  reserved (zero)

all little-endian. The file size must equal 32 + n_tokens × bytes per token; anything else is a truncated or
corrupted shard, reported with its path. meta.json is written last, so its presence marks a complete dir.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

MAGIC = b"SCVTOKEN"
VERSION = 1
HEADER = struct.Struct("<8sIIQ8x")
HEADER_BYTES = HEADER.size  # 32: keeps the token array aligned for uint16 and uint32 memmaps
META_FILE = "meta.json"
META_VERSION = 1
SPLITS = ("train", "val")


class DataError(RuntimeError):
    """A missing, incomplete or corrupted data dir, or data that does not fit the run; the message says what to do."""


def dtype_for(n_vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if n_vocab <= 1 << 16 else np.dtype(np.uint32)


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def write_shard(path: Path, tokens: np.ndarray) -> str:
    """Write one shard atomically (tmp + rename); returns the sha256 of the token bytes."""
    assert tokens.dtype in (np.uint16, np.uint32), tokens.dtype
    data = np.ascontiguousarray(tokens).astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(HEADER.pack(MAGIC, VERSION, tokens.dtype.itemsize, len(tokens)))
        f.write(data)
        f.flush()
        os.fsync(f.fileno())  # on disk before meta.json (written last) declares the dir prepared
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def read_header(path: Path) -> tuple[np.dtype, int]:
    """(dtype, n_tokens) after checking the magic, version and that the file size matches the header."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except FileNotFoundError:
        raise DataError(f"shard {path} is missing; re-run the prepare command for {path.parent}") from None
    if len(head) < HEADER_BYTES:
        raise DataError(f"shard {path} is truncated or corrupted: {size} bytes, shorter than its "
                        f"{HEADER_BYTES}-byte header; re-run prepare for {path.parent} with --force")
    magic, version, itemsize, n = HEADER.unpack(head)
    if magic != MAGIC or version != VERSION or itemsize not in (2, 4):
        raise DataError(f"shard {path} is corrupted or not a scalevec shard (magic {magic!r}, version {version}, "
                        f"{itemsize} bytes/token); re-run prepare for {path.parent} with --force")
    if size != HEADER_BYTES + n * itemsize:
        raise DataError(f"shard {path} is truncated or corrupted: its header says {n} tokens "
                        f"({HEADER_BYTES + n * itemsize} bytes) but the file holds {size} bytes; "
                        f"re-run prepare for {path.parent} with --force")
    return np.dtype(np.uint16 if itemsize == 2 else np.uint32).newbyteorder("<"), n


def open_shard(path: Path) -> np.ndarray:
    """The shard's tokens as a read-only memory map (no copy: a 10B-token dataset costs no RAM)."""
    dtype, n = read_header(path)
    if n == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n,))


@dataclass
class ShardInfo:
    file: str
    tokens: int
    sha256: str


@dataclass
class SplitInfo:
    docs: int = 0
    tokens: int = 0
    shards: list[ShardInfo] = field(default_factory=list)


def is_val(text: str, val_frac: float) -> bool:
    """The split rule (data/prepare.py): a document goes to the val split when the first 8 bytes of the sha256 of its
    text, read as a fraction of 2^64, fall below `val_frac`. data/composition.py replays it."""
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return h < val_frac * 2.0 ** 64


@dataclass
class Meta:
    """Everything meta.json holds. `request` is what was asked for (idempotence compares it); `fingerprint`
    identifies the tokens themselves (the loader's resume check compares it)."""

    tokenizer: dict  # Tokenizer.info(): spec, name, ranks_hash, n_vocab, eot
    source: str
    request: dict
    eval_only: bool
    dtype: str
    splits: dict[str, SplitInfo]
    text_bytes: int = 0
    seconds: float = 0.0
    fingerprint: str = ""
    version: int = META_VERSION
    # True: the source was read to its end (no max_tokens cap cut it short); None: not recorded (a meta.json
    # written before this field existed; `holds_whole_source` infers what it safely can)
    source_complete: Optional[bool] = None
    # documents and tokens per source (data/composition.py) where the source names them (the built-in corpus); None
    # for one unnamed source, and in a meta.json written before this field existed
    sources: Optional[dict] = None
    # a local source's files as they were prepared (data/sources.py, source_files): names, sizes, times, maybe a
    # sha256; None for the built-in corpus, a Hub stream, and a meta.json written before this field existed
    source_files: Optional[dict] = None

    def compute_fingerprint(self) -> str:
        ident = {"version": self.version, "ranks_hash": self.tokenizer["ranks_hash"], "eot": self.tokenizer["eot"],
                 "splits": {s: [(i.file, i.tokens, i.sha256) for i in info.shards] for s, info in self.splits.items()}}
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("version", "fingerprint", "source", "eval_only", "tokenizer", "dtype",
                                           "text_bytes", "seconds", "request", "source_complete")}
        d["n_vocab"] = self.tokenizer["n_vocab"]  # top level too: what the model's vocab is sized from
        d["splits"] = {s: {"docs": i.docs, "tokens": i.tokens, "shards": [vars(x) for x in i.shards]}
                       for s, i in self.splits.items()}
        if self.sources is not None:  # absent, not null, for unnamed sources: their meta.json stays as it was
            d["sources"] = self.sources
        if self.source_files is not None:
            d["source_files"] = self.source_files
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Meta":
        splits = {s: SplitInfo(i["docs"], i["tokens"], [ShardInfo(**x) for x in i["shards"]])
                  for s, i in d["splits"].items()}
        return cls(tokenizer=d["tokenizer"], source=d["source"], request=d["request"], eval_only=d["eval_only"],
                   dtype=d["dtype"], splits=splits, text_bytes=d.get("text_bytes", 0), seconds=d.get("seconds", 0.0),
                   fingerprint=d["fingerprint"], version=d["version"], source_complete=d.get("source_complete"),
                   sources=d.get("sources"), source_files=d.get("source_files"))

    def holds_whole_source(self) -> bool:
        """Whether the dir holds every document of its source, i.e. no max_tokens cap stopped the prepare early.
        Without the recorded field (an older meta.json): yes without a cap or with one its train tokens stay
        under (the cap never fired); otherwise unknown, answered no."""
        if self.source_complete is not None:
            return self.source_complete
        cap = self.request.get("max_tokens")
        return self.eval_only or cap is None or self.splits["train"].tokens < cap


def write_meta(data_dir: Path, meta: Meta) -> None:
    tmp = data_dir / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta.to_dict(), indent=1) + "\n")
    os.replace(tmp, data_dir / META_FILE)


def load_meta(data_dir: str | Path, hint: Optional[str] = None) -> Meta:
    """Parse meta.json; a missing one means the dir was never prepared (or preparation was interrupted)."""
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        what = "does not exist" if not Path(data_dir).exists() else "has no meta.json (never prepared, or interrupted)"
        how = hint or f"python -m data.prepare --source SOURCE --tokenizer TOKENIZER --out {data_dir}"
        raise DataError(f"data dir {data_dir} {what}; prepare it with `{how}`")
    try:
        meta = Meta.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path} is corrupted ({type(e).__name__}: {e}); re-run prepare with --force") from None
    if meta.version != META_VERSION:
        raise DataError(f"{path} has format version {meta.version}, this code reads {META_VERSION}; re-prepare")
    return meta


class SplitWriter:
    """Accumulates one split's tokens and cuts them into shards of `shard_tokens` (documents may straddle)."""

    def __init__(self, data_dir: Path, split: str, dtype: np.dtype, shard_tokens: int):
        if shard_tokens < 1:  # else every add() would cut empty shards forever
            raise ValueError(f"shard_tokens must be at least 1, got {shard_tokens}")
        self.data_dir, self.split, self.dtype, self.shard_tokens = data_dir, split, dtype, shard_tokens
        self.info = SplitInfo()
        self._pending: list[np.ndarray] = []
        self._pending_n = 0

    def add(self, docs: list[list[int]]) -> None:
        for ids in docs:
            self._pending.append(np.asarray(ids, dtype=self.dtype))
            self._pending_n += len(ids)
        self.info.docs += len(docs)
        while self._pending_n >= self.shard_tokens:
            flat = np.concatenate(self._pending)
            self._write(flat[: self.shard_tokens])
            rest = flat[self.shard_tokens:]
            self._pending, self._pending_n = ([rest] if len(rest) else []), len(rest)

    @property
    def n_tokens(self) -> int:
        """Tokens added so far, written or not."""
        return self.info.tokens + self._pending_n

    def close(self) -> SplitInfo:
        if self._pending_n:
            self._write(np.concatenate(self._pending))
            self._pending, self._pending_n = [], 0
        return self.info

    def _write(self, tokens: np.ndarray) -> None:
        name = shard_name(self.split, len(self.info.shards))
        digest = write_shard(self.data_dir / name, tokens)
        self.info.shards.append(ShardInfo(name, len(tokens), digest))
        self.info.tokens += len(tokens)

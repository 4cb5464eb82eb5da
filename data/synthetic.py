"""A synthetic prepared data dir, for measuring and testing the loader at sizes no disk holds: shards whose tokens
are holes in sparse files (harness/bench_loader.py --scale-check: the paper-scale plan's 106B tokens; the tests)."""
from __future__ import annotations

import os
from pathlib import Path

from data.prepare import DEFAULT_SHARD_TOKENS
from data.shards import HEADER, HEADER_BYTES, MAGIC, VERSION, Meta, ShardInfo, SplitInfo, shard_name, write_meta

SYNTHETIC_TOKENIZER = {"spec": "gpt2", "name": "synthetic", "ranks_hash": "0" * 64, "n_vocab": 50257, "eot": 50256}


def synthetic_dir(root: Path, n_tokens: int, shard_tokens: int = DEFAULT_SHARD_TOKENS) -> Path:
    """A prepared dir the loader accepts, as data/prepare.py lays it out: n_tokens train tokens (and a val shard of
    2 % of one shard) in shards of shard_tokens uint16 tokens, each a header and a hole (os.truncate): zeros that
    take no disk blocks. The sha256 in meta.json is a placeholder: the loader never hashes the tokens."""
    root.mkdir(parents=True)
    splits = {}
    for split, total in (("train", n_tokens), ("val", min(n_tokens, shard_tokens) // 50)):
        info = splits[split] = SplitInfo(docs=1)
        for i, start in enumerate(range(0, total, shard_tokens)):
            n = min(shard_tokens, total - start)
            path = root / shard_name(split, i)
            with open(path, "wb") as f:
                f.write(HEADER.pack(MAGIC, VERSION, 2, n))
            os.truncate(path, HEADER_BYTES + 2 * n)
            info.shards.append(ShardInfo(path.name, n, "0" * 64))
            info.tokens += n
    meta = Meta(tokenizer=SYNTHETIC_TOKENIZER, source="synthetic", request={}, eval_only=False, dtype="uint16",
                splits=splits)
    meta.fingerprint = meta.compute_fingerprint()
    write_meta(root, meta)
    return root

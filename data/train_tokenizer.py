"""Train a byte-level BPE and write it in tiktoken's format:

    python -m data.train_tokenizer --input builtin:pd_english --vocab-size 8192 --out tokenizers/pd8192.tiktoken
    python -m data.train_tokenizer --input corpus/ notes.txt --vocab-size 4096 --out my.tiktoken

The file loads through the same path as gpt2's ranks (`data.tokenizer: PATH` in a config, or `load_tokenizer(PATH)`):
GPT-2's split pattern, EOT = vocab_size - 1. Training is deterministic (data/bpe.py). `data.prepare --tokenizer
bpe:N` does the same on the train split of its source and keeps the file in the data dir.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from typing import Optional

from data.bpe import count_words, train_bpe
from data.sources import SourceError, iter_documents, parse_source
from data.tokenizer import load_ranks_file, write_ranks


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data.train_tokenizer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="sources: files, folders, builtin:NAME, hf:ORG/NAME")
    p.add_argument("--vocab-size", type=int, default=8192, help="tokens in all, the EOT included")
    p.add_argument("--out", required=True, help="the ranks file to write")
    p.add_argument("--text-column", default="text", help="column holding the text (jsonl / parquet / Hub)")
    p.add_argument("--max-mb", type=float, default=200.0, help="learn from at most this much text")
    a = p.parse_args(argv)
    t0 = time.time()
    try:
        docs = itertools.chain.from_iterable(iter_documents(parse_source(s), a.text_column) for s in a.input)
        counts = count_words(docs, max_bytes=int(a.max_mb * 1e6))
        ranks = train_bpe(counts, a.vocab_size)
    except (SourceError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_ranks(ranks, a.out)
    tok = load_ranks_file(a.out)
    print(f"wrote {a.out}: {tok.n_vocab} tokens (EOT {tok.eot}), ranks sha256 {tok.ranks_hash[:16]}…, "
          f"{len(counts):,} distinct words, {time.time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

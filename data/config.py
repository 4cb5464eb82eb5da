"""Typed data configuration (the `data:` section of a run config).

Pure data: no tokenizer or torch imports, so config loading stays cheap. `data/prepare.py` turns one of these into
token shards; the same object tells the trainer where they are.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

from strictconfig.config import resumable

NAMED_TOKENIZERS = ("gpt2", "r50k_base", "cl100k_base", "o200k_base")
_BPE_SPEC = re.compile(r"bpe:(\d+)")


@dataclass
class DataConfig:
    # builtin:pd_english | hf:ORG/NAME[:SUBSET] (streamed from the Hub) | a local file or folder (txt/jsonl/parquet)
    source: str = "builtin:pd_english"
    dir: str = "data_cache/pd_english"  # where prepare writes {train,val}_*.bin + meta.json
    # gpt2 | r50k_base | cl100k_base | o200k_base | bpe:N (byte-level BPE with N tokens, EOT included, trained on
    # the train split at prepare time and stored in `dir`) | a path to a tiktoken-format ranks file
    tokenizer: str = "gpt2"
    seq_len: int = 1024
    # extra eval-only sets: prepared data dirs (resumable: a resumed run may evaluate on more or other sets)
    val_sets: list[str] = resumable(default_factory=list)
    # Fraction of documents held out for validation, chosen by a hash of each document's text (so the split is
    # the same on every machine and duplicates of a document land on the same side).
    val_frac: float = 0.02
    text_column: str = "text"  # column holding the text in jsonl / parquet / Hub datasets
    # What one document is in a .txt source: the whole file, each blank-line-separated paragraph, or each line.
    # A single huge .txt file wants "paragraph": one document is read into memory and tokenized by one thread.
    txt_document: Literal["file", "paragraph", "line"] = "file"
    # Stop after this many train tokens (a streamed Hub dataset has no end). Resumable: a cap is checked against the
    # prepared dir by what it keeps (data.prepare.caps_agree), and the loader refuses a dir whose tokens differ from
    # the checkpoint's (its fingerprint)
    max_tokens: Optional[int] = resumable(None)

    def invariants(self) -> list[tuple[str, str]]:
        bad = []
        if self.seq_len <= 0:
            bad.append(("seq_len", "must be positive"))
        if not 0.0 < self.val_frac < 0.5:
            bad.append(("val_frac", f"{self.val_frac} must lie in (0, 0.5)"))
        if self.max_tokens is not None and self.max_tokens <= 0:
            bad.append(("max_tokens", "must be positive (or null for the whole source)"))
        if not self.source.strip():
            bad.append(("source", "must not be empty"))
        if not self.dir.strip():
            bad.append(("dir", "must not be empty"))
        if not self.text_column:
            bad.append(("text_column", "must not be empty"))
        problem = tokenizer_spec_problem(self.tokenizer)
        if problem:
            bad.append(("tokenizer", problem))
        return bad


def tokenizer_spec_problem(spec: str) -> Optional[str]:
    """Why `spec` cannot name a tokenizer, or None. Paths are checked when loaded, not here."""
    if spec.startswith("bpe:"):
        m = _BPE_SPEC.fullmatch(spec)
        if not m:
            return f"{spec!r}: expected bpe:N with N the vocabulary size, e.g. bpe:8192"
        if not 258 <= int(m.group(1)) <= 1 << 20:  # 256 bytes + EOT + at least one merge
            return f"{spec!r}: N must lie in [258, {1 << 20}]"
        return None
    if not spec.strip():
        return f"must be one of {', '.join(NAMED_TOKENIZERS)}, bpe:N or a path to a .tiktoken ranks file"
    return None

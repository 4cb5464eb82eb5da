"""Typed data configuration (the `data:` section of a run config)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataConfig:
    source: str = "builtin:pd_english"  # builtin:NAME | hf:NAME[:subset] | local file/dir paths
    dir: str = "data_cache/pd_english"  # where prepare writes {train,val}_*.bin + meta.json
    tokenizer: str = "gpt2"  # tiktoken name | path to a tiktoken ranks file | bpe:PATH
    seq_len: int = 1024
    val_sets: list[str] = field(default_factory=list)  # extra eval-only sets: prepared data dirs

    def invariants(self) -> list[tuple[str, str]]:
        bad = []
        if self.seq_len <= 0:
            bad.append(("seq_len", "must be positive"))
        return bad

"""Tokenizers: one spec string → a tiktoken `Encoding` wrapped with the few things training needs.

Specs (see `load_tokenizer`):
  gpt2 | r50k_base | cl100k_base | o200k_base   tiktoken's encodings; found offline in $SCALEVEC_TOKENIZER_DIR or
                                                $TIKTOKEN_CACHE_DIR, else downloaded by tiktoken itself
  bpe:N                                         the byte-level BPE with N tokens (EOT included) that
                                                `data.prepare` trained on the corpus and stored in the data dir
  PATH                                          a tiktoken-format ranks file (`data.train_tokenizer` writes them)

`ranks_hash` (sha256 of the ranks in tiktoken's file format) identifies a vocabulary: prepared data records it and
the trainer refuses data whose hash differs from the config's tokenizer. For tiktoken's own files it equals the
hash tiktoken pins (gpt2: 306cd27f…).
"""
from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import tiktoken
import tiktoken.load

from data.config import NAMED_TOKENIZERS, tokenizer_spec_problem

TRAINED_FILE = "tokenizer.tiktoken"  # where prepare stores a bpe:N tokenizer inside the data dir
ENDOFTEXT = "<|endoftext|>"
_BLOB = "https://openaipublic.blob.core.windows.net/encodings/"

# Patterns copied from tiktoken_ext/openai_public.py (tiktoken 0.x): the split regex is part of the tokenizer.
R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K_PAT = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"""
              r"""\s*[\r\n]|\s+(?!\S)|\s""")
O200K_PAT = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
])


@dataclass(frozen=True)
class KnownEncoding:
    file: str  # tiktoken's ranks file name (also looked for under this name in $SCALEVEC_TOKENIZER_DIR)
    sha256: str  # the hash tiktoken pins for that file
    pat_str: str
    special_tokens: dict[str, int]


_GPT2 = KnownEncoding("r50k_base.tiktoken", "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
                      R50K_PAT, {ENDOFTEXT: 50256})
KNOWN: dict[str, KnownEncoding] = {
    "gpt2": _GPT2,  # tiktoken's "gpt2" reads two other files, but the ranks, pattern and EOT are r50k_base's
    "r50k_base": _GPT2,
    "cl100k_base": KnownEncoding(
        "cl100k_base.tiktoken", "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7", CL100K_PAT,
        {ENDOFTEXT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
         "<|endofprompt|>": 100276}),
    "o200k_base": KnownEncoding(
        "o200k_base.tiktoken", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d", O200K_PAT,
        {ENDOFTEXT: 199999, "<|endofprompt|>": 200018}),
}
assert set(KNOWN) == set(NAMED_TOKENIZERS)


class TokenizerError(ValueError):
    """A tokenizer spec that cannot be resolved; the message says what to do."""


class Tokenizer:
    """A tiktoken Encoding plus its identity. `encode` treats special-token text as ordinary text."""

    def __init__(self, name: str, spec: str, ranks: dict[bytes, int], pat_str: str, special_tokens: dict[str, int]):
        self.name = name
        self.spec = spec
        self.ranks_hash = ranks_sha256(ranks)
        self.encoding = tiktoken.Encoding(name=name, pat_str=pat_str, mergeable_ranks=ranks,
                                          special_tokens=special_tokens)
        self.n_vocab: int = self.encoding.n_vocab
        self.eot: int = special_tokens[ENDOFTEXT]  # the document separator

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str], num_threads: Optional[int] = None) -> list[list[int]]:
        # tiktoken's Rust core releases the GIL, so threads give real parallelism without pickling text.
        return self.encoding.encode_ordinary_batch(list(texts), num_threads=num_threads or os.cpu_count() or 1)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))

    def info(self) -> dict:
        """What meta.json records about the tokenizer."""
        return {"spec": self.spec, "name": self.name, "ranks_hash": self.ranks_hash, "n_vocab": self.n_vocab,
                "eot": self.eot}

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, n_vocab={self.n_vocab}, eot={self.eot}, ranks={self.ranks_hash[:12]})"


def padded_vocab(n_vocab: int, multiple: int = 64) -> int:
    """The model's vocab size: n_vocab rounded up to a multiple (GPT-2's 50,257 → 50,304)."""
    if n_vocab <= 0 or multiple <= 0:
        raise ValueError(f"padded_vocab({n_vocab}, {multiple}): both must be positive")
    return -(-n_vocab // multiple) * multiple


# ----------------------------------------------------------------------------------------------------- ranks I/O


def dump_ranks(ranks: dict[bytes, int]) -> bytes:
    """tiktoken's file format: one `base64(token) rank` line per token, in rank order."""
    return b"".join(base64.b64encode(tok) + b" " + str(r).encode() + b"\n"
                    for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]))


def parse_ranks(data: bytes, where: str) -> dict[bytes, int]:
    # Parsed here rather than with tiktoken.load.load_tiktoken_bpe, which copies local files into its cache.
    ranks: dict[bytes, int] = {}
    for i, line in enumerate(data.splitlines()):
        if not line:
            continue
        try:
            tok, rank = line.split()
            ranks[base64.b64decode(tok, validate=True)] = int(rank)
        except ValueError:
            raise TokenizerError(f"{where}: line {i + 1} is not `base64-token rank`; not a tiktoken ranks file")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerError(f"{where}: ranks are not 0..{len(ranks) - 1} without gaps or repeats")
    return ranks


def ranks_sha256(ranks: dict[bytes, int]) -> str:
    return hashlib.sha256(dump_ranks(ranks)).hexdigest()


def write_ranks(ranks: dict[bytes, int], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(dump_ranks(ranks))
    os.replace(tmp, path)  # atomic: a reader never sees half a vocabulary


# ------------------------------------------------------------------------------------------------------- loading


def load_tokenizer(spec: str = "gpt2", data_dir: str | Path | None = None) -> Tokenizer:
    """Resolve a tokenizer spec (module docstring). `data_dir` is needed for bpe:N only."""
    problem = tokenizer_spec_problem(spec)
    if problem:
        raise TokenizerError(f"tokenizer {problem}")
    if spec in KNOWN:
        return _load_named(spec)
    if spec.startswith("bpe:"):
        n = int(spec[4:])
        if data_dir is None:
            raise TokenizerError(f"tokenizer {spec} is trained at prepare time and lives in the data dir; "
                                 "pass data_dir to load_tokenizer")
        path = Path(data_dir) / TRAINED_FILE
        if not path.is_file():
            raise TokenizerError(f"tokenizer {spec}: {path} does not exist; it is written by "
                                 f"`python -m data.prepare --tokenizer {spec} --out {data_dir} ...`")
        tok = load_ranks_file(path, spec=spec, name=f"bpe{n}")
        if tok.n_vocab != n:
            raise TokenizerError(f"tokenizer {spec}: {path} holds {tok.n_vocab} tokens, not {n}")
        return tok
    path = Path(spec).expanduser()
    if not path.is_file():
        raise TokenizerError(f"tokenizer {spec!r}: no such file, and not one of {', '.join(KNOWN)} or bpe:N")
    return load_ranks_file(path, spec=spec)


def load_ranks_file(path: str | Path, spec: Optional[str] = None, name: Optional[str] = None) -> Tokenizer:
    """A tiktoken ranks file. tiktoken's own files (recognized by hash) keep their pattern and special tokens;
    any other file is a byte-level BPE with GPT-2's split pattern and EOT = the next id after the ranks."""
    path = Path(path)
    ranks = parse_ranks(path.read_bytes(), str(path))
    digest = ranks_sha256(ranks)
    for known_name, known in KNOWN.items():
        if known.sha256 == digest:
            return Tokenizer(name or known_name, spec or str(path), ranks, known.pat_str, known.special_tokens)
    return Tokenizer(name or path.stem, spec or str(path), ranks, R50K_PAT, {ENDOFTEXT: len(ranks)})


def tokenizer_dirs() -> list[Path]:
    """Folders searched for tiktoken's ranks files before tiktoken tries the network."""
    dirs = [os.environ.get("SCALEVEC_TOKENIZER_DIR"), os.environ.get("TIKTOKEN_CACHE_DIR"),
            os.environ.get("DATA_GYM_CACHE_DIR")]
    return [Path(d) for d in dirs if d]


def _load_named(name: str) -> Tokenizer:
    known = KNOWN[name]
    return Tokenizer(name, name, named_ranks(name), known.pat_str, known.special_tokens)


def named_ranks(name: str) -> dict[bytes, int]:
    """The ranks of one of tiktoken's encodings: from a local copy ($SCALEVEC_TOKENIZER_DIR, tiktoken's cache),
    else downloaded by tiktoken as on any machine with internet (and cached there)."""
    known = KNOWN[name]
    url = _BLOB + known.file
    # tiktoken caches a download under the sha1 of its URL; we also accept a plain `<name>.tiktoken` copy, under
    # any name of the same ranks (gpt2.tiktoken serves r50k_base too).
    aliases = [f"{n}.tiktoken" for n, k in KNOWN.items() if k is known]
    names = [f"{name}.tiktoken", *aliases, known.file, hashlib.sha1(url.encode()).hexdigest()]
    for folder in tokenizer_dirs():
        for candidate in dict.fromkeys(names):
            path = folder / candidate
            if path.is_file():
                data = path.read_bytes()
                if hashlib.sha256(data).hexdigest() != known.sha256:
                    raise TokenizerError(f"{path} is not tiktoken's {name} ranks file (sha256 differs from "
                                         f"{known.sha256}); remove it or replace it with the right file")
                return parse_ranks(data, str(path))
    try:  # tiktoken's own cache and download (machines with internet need nothing else)
        return tiktoken.load.load_tiktoken_bpe(url, expected_hash=known.sha256)
    except Exception as e:  # requests' ConnectionError, a hash mismatch, a read-only cache…
        searched = ", ".join(str(d) for d in tokenizer_dirs()) or "none set"
        raise TokenizerError(
            f"cannot load tokenizer {name!r}: tiktoken could not fetch {url} ({type(e).__name__}: "
            f"{str(e)[:160]}). Offline, put the ranks file ({known.file}, sha256 {known.sha256[:12]}…) at "
            f"$SCALEVEC_TOKENIZER_DIR/{name}.tiktoken or set the "
            f"tokenizer to the file's path. Folders searched: {searched}") from None

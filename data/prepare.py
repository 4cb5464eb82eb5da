"""Tokenize a source into token shards: `python -m data.prepare --source SRC --tokenizer SPEC --out DIR`.

    python -m data.prepare --source builtin:pd_english --tokenizer gpt2 --out data_cache/pd_english
    python -m data.prepare --source builtin:pd_english --tokenizer bpe:8192 --out data_cache/pd_english_bpe8192
    python -m data.prepare --source hf:HuggingFaceFW/fineweb-edu:sample-10BT --max-tokens 1e9 --out data_cache/fwe
    python -m data.prepare --eval-only --source path/to/wiki.test.raw \\
        --like data_cache/pd_english --out data_cache/wikitext2_test          # an eval set, same tokenizer

Each document becomes [EOT] + its tokens (EOT first, as in llm.c: the first token of every document is
predicted from the separator). A document goes to the val split when the first 8 bytes of the sha256 of its text,
read as a fraction of 2^64, fall below `val_frac`: deterministic, streaming, and duplicates never straddle the
split. An eval-only dir holds a val split only. A source that names each document's source (the built-in corpus)
gets its documents and tokens per source, and the val split's order of sources, in meta.json's `sources`
(data/composition.py). meta.json is written last; re-running a finished prepare with
the same settings does nothing, a dir without meta.json (interrupted) is cleaned and redone. --max-tokens counts
only where it changes the tokens: meta.json records whether the source was read to its end (source_complete), and a
cap above the train tokens of such a dir, or none, is the same setting as its own (caps_agree).
"""
from __future__ import annotations

import argparse
import errno
import math
import shlex
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator, Optional

from tqdm import tqdm

from data.bpe import count_words, train_bpe
from data.composition import SourceCounter
from data.config import DataConfig
from data.shards import META_FILE, DataError, Meta, SplitWriter, dtype_for, is_val, load_meta, write_meta
from data.sources import (Source, iter_documents, iter_labeled_documents, parse_source, source_bytes,
                          source_changes, source_files)
from data.tokenizer import TRAINED_FILE, Tokenizer, load_tokenizer, write_ranks

DEFAULT_SHARD_TOKENS = 100_000_000  # 200 MB of uint16 per shard
BATCH_CHARS = 4 << 20  # text handed to tiktoken per batch call: big enough to keep every thread busy
BPE_TRAIN_CHARS = 200 << 20  # a trained BPE learns from at most this much train text
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO)  # the disk refused a write
CFG_KEYS = ("source", "tokenizer", "val_frac", "text_column", "txt_document", "max_tokens")  # set by a DataConfig


def prepare_command(cfg: DataConfig, eval_only: bool = False, like: Optional[str] = None) -> str:
    """The exact command that prepares `cfg` (for error messages and docs)."""
    parts = ["python", "-m", "data.prepare"] + (["--eval-only"] if eval_only else [])
    parts += ["--source", cfg.source]
    parts += ["--like", like] if like else ["--tokenizer", cfg.tokenizer]
    if not eval_only and cfg.val_frac != DataConfig.val_frac:
        parts += ["--val-frac", str(cfg.val_frac)]
    if cfg.text_column != DataConfig.text_column:
        parts += ["--text-column", cfg.text_column]
    if cfg.txt_document != DataConfig.txt_document:
        parts += ["--txt-document", cfg.txt_document]
    if cfg.max_tokens is not None:
        parts += ["--max-tokens", str(cfg.max_tokens)]
    return " ".join(shlex.quote(p) for p in parts + ["--out", cfg.dir])


def _request(cfg: DataConfig, eval_only: bool, like_hash: Optional[str], shard_tokens: int) -> dict:
    src = parse_source(cfg.source, must_exist=False)
    return {"source": str(Path(src.name).resolve()) if src.kind == "local" else str(src),
            "tokenizer": cfg.tokenizer, "val_frac": None if eval_only else cfg.val_frac,
            "text_column": cfg.text_column, "txt_document": cfg.txt_document, "max_tokens": cfg.max_tokens,
            "eval_only": eval_only, "like_ranks_hash": like_hash, "shard_tokens": shard_tokens}


def prepare(cfg: DataConfig, *, eval_only: bool = False, like: str | Path | None = None,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, num_threads: Optional[int] = None, progress: bool = True,
            force: bool = False, bpe_train_chars: int = BPE_TRAIN_CHARS) -> Path:
    """Tokenize cfg.source into cfg.dir; returns cfg.dir. With `like` (a prepared dir), use its tokenizer."""
    out = Path(cfg.dir)
    like_meta = load_meta(like) if like is not None else None
    if like_meta is not None:
        cfg = replace(cfg, tokenizer=like_meta.tokenizer["spec"])
    request = _request(cfg, eval_only, like_meta.tokenizer["ranks_hash"] if like_meta else None, shard_tokens)
    if (out / META_FILE).is_file() and not force:
        meta = load_meta(out)
        differ = _differing(meta, request, list(request))
        if not differ:
            _refuse_a_changed_source(meta, cfg, out, eval_only, like)
            _say(progress, f"{out} is already prepared ({_summary(meta)}){_same_tokens_note(meta, request)}; "
                           "nothing to do")
            return out
        diff = ", ".join(f"{k}: {meta.request.get(k)!r} → {request[k]!r}" for k in differ)
        raise DataError(f"{out} was prepared with other settings ({diff}); choose another --out or pass --force")
    parse_source(cfg.source)  # a source that is not there fails before anything is written
    out.mkdir(parents=True, exist_ok=True)
    _clean(out)  # leftovers of an interrupted run, or the old output under --force
    try:
        return _prepare_into(out, cfg, request, eval_only, like, like_meta, shard_tokens, num_threads, progress,
                             bpe_train_chars)
    except OSError as e:  # a full disk, a quota, a read-only mount: keep nothing that could pass for prepared data
        if e.errno not in WRITE_ERRNOS:  # not a write failure (e.g. a dropped connection to the Hub)
            raise
        _clean(out)
        raise DataError(f"writing {out} failed ({e}); nothing was kept (a dir without meta.json is never read): "
                        "free space and run the same command again") from e


def _prepare_into(out: Path, cfg: DataConfig, request: dict, eval_only: bool, like, like_meta,
                  shard_tokens: int, num_threads: Optional[int], progress: bool, bpe_train_chars: int) -> Path:
    t0 = time.time()
    src = parse_source(cfg.source)
    tok = _resolve_tokenizer(cfg, src, out, eval_only, like, like_meta, bpe_train_chars, progress)
    dtype = dtype_for(tok.n_vocab)
    writers = {s: SplitWriter(out, s, dtype, shard_tokens) for s in (("val",) if eval_only else ("train", "val"))}
    files = source_files(src)  # before reading: a file changed while it is read shows as a change next time
    docs = iter_labeled_documents(src, cfg.text_column, cfg.txt_document)
    counter = SourceCounter()  # per source, where the source names them (data/composition.py)
    text_bytes, complete = _tokenize(docs, tok, writers, counter, cfg, eval_only, num_threads,
                                     total=source_bytes(src), progress=progress, desc=f"tokenizing {src}")
    splits = {s: w.close() for s, w in writers.items()}
    if not splits["val"].tokens:
        raise DataError(f"no document of {src} fell in the val split ({splits['train'].docs} documents, "
                        f"val_frac={cfg.val_frac}); raise --val-frac or add documents")
    if not eval_only and not splits["train"].tokens:
        raise DataError(f"every document of {src} fell in the val split; lower --val-frac or add documents")
    meta = Meta(tokenizer=tok.info(), source=cfg.source, request=request, eval_only=eval_only,
                dtype=dtype.name, splits=splits, text_bytes=text_bytes, seconds=round(time.time() - t0, 3),
                source_complete=complete, sources=counter.result(), source_files=files)
    meta.fingerprint = meta.compute_fingerprint()
    write_meta(out, meta)
    _say(progress, f"wrote {out}: {_summary(meta)}")
    return out


def _refuse_a_changed_source(meta: Meta, cfg: DataConfig, out: Path, eval_only: bool = False,
                             like: str | Path | None = None) -> None:
    """A DataError when the local source's files differ from those `out` was prepared from: its tokens are the old
    text's. The message names what changed and the command that prepares it again."""
    changes = (source_changes(meta.source_files, parse_source(cfg.source, must_exist=False)) if meta.source_files
               else [])
    if changes:
        again = prepare_command(cfg, eval_only, str(like) if like else None) + " --force"
        raise DataError(f"{out} was prepared from {cfg.source} as it was then; since, {'; '.join(changes)}. Its "
                        f"tokens are the old text's: prepare it again with `{again}`, or point data.source at the "
                        "old files")


def _summary(meta: Meta) -> str:
    parts = [f"{s} {i.tokens:,} tokens / {i.docs:,} docs / {len(i.shards)} shard(s)" for s, i in meta.splits.items()]
    rate = meta.text_bytes / 1e6 / meta.seconds if meta.seconds else 0.0
    return (f"{'; '.join(parts)}; tokenizer {meta.tokenizer['name']}; {meta.text_bytes / 1e6:.2f} MB of text in "
            f"{meta.seconds:.1f} s ({rate:.2f} MB/s)")


def caps_agree(meta: Meta, cap: Optional[int]) -> bool:
    """Whether preparing with a cap of `cap` train tokens (None: no cap) writes the very tokens `meta`'s dir holds.
    A cap stops after the first document that reaches it, so a cap other than the dir's agrees only when neither
    fires before the source ends: the dir holds its whole source and `cap` stays above its train tokens (a cap equal
    to them stops at the last train document and would drop any val documents after it)."""
    if cap == meta.request.get("max_tokens") or meta.eval_only:  # an eval-only set is never capped
        return True
    return meta.holds_whole_source() and (cap is None or cap > meta.splits["train"].tokens)


def _differing(meta: Meta, request: dict, keys: Iterable[str]) -> list[str]:
    """The keys of `request` whose value would make other tokens than `meta`'s dir holds (max_tokens: see
    caps_agree)."""
    return [k for k in keys if meta.request.get(k) != request[k]
            and not (k == "max_tokens" and caps_agree(meta, request[k]))]


def _same_tokens_note(meta: Meta, request: dict) -> str:
    cap = request.get("max_tokens")
    if cap == meta.request.get("max_tokens") or meta.eval_only:
        return ""
    return (f"; it holds the whole source, {meta.splits['train'].tokens:,} train tokens, so max_tokens "
            f"{_override_value(cap)} changes nothing")


def _override_value(v) -> str:
    """`v` as a dotted override's value (YAML): None → null."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _cap_there(meta: Meta) -> str:
    """What the dir's cap did, for a max_tokens mismatch message."""
    n = meta.splits["train"].tokens
    if meta.holds_whole_source():
        return f"the whole source: {n:,} train tokens"
    return f"cut short by it at {n:,} train tokens"


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr)


def _clean(out: Path) -> None:
    """Remove only files that prepare writes, so a mistaken --out never deletes a user's own files."""
    for pattern in ("train_*.bin", "val_*.bin", "*.tmp", TRAINED_FILE, META_FILE):
        for p in out.glob(pattern):
            p.unlink()


def _resolve_tokenizer(cfg: DataConfig, src: Source, out: Path, eval_only: bool, like: str | Path | None,
                       like_meta: Optional[Meta], bpe_train_chars: int, progress: bool) -> Tokenizer:
    if like_meta is not None:
        if cfg.tokenizer.startswith("bpe:"):
            shutil.copyfile(Path(like) / TRAINED_FILE, out / TRAINED_FILE)  # type: ignore[arg-type]
        tok = load_tokenizer(cfg.tokenizer, out)
        if tok.ranks_hash != like_meta.tokenizer["ranks_hash"]:
            raise DataError(f"tokenizer {cfg.tokenizer} resolves to other ranks here than in {like}; "
                            "refusing to prepare an eval set with a different tokenizer")
        return tok
    if cfg.tokenizer.startswith("bpe:"):
        if eval_only:
            raise DataError(f"an eval-only set must use its training data's tokenizer; {cfg.tokenizer} is trained "
                            "per data dir, so pass --like TRAIN_DIR instead of --tokenizer")
        # A first pass over the source: count words of the train documents only (the val split stays unseen).
        n = int(cfg.tokenizer[4:])
        t0 = time.time()
        train_docs = (d for d in iter_documents(src, cfg.text_column, cfg.txt_document)
                      if not is_val(d, cfg.val_frac))
        counts = count_words(tqdm(train_docs, desc="counting words for BPE", unit=" docs", disable=not progress),
                             max_bytes=bpe_train_chars)
        write_ranks(train_bpe(counts, n), out / TRAINED_FILE)
        _say(progress, f"trained {cfg.tokenizer} on {len(counts):,} distinct words in {time.time() - t0:.1f} s")
    return load_tokenizer(cfg.tokenizer, out)


def _batches(docs: Iterable[tuple[Optional[str], str]], chars: int) -> Iterator[list[tuple[Optional[str], str]]]:
    """(source, text) documents in batches of about `chars` characters of text."""
    batch, n = [], 0
    for d in docs:
        batch.append(d)
        n += len(d[1])
        if n >= chars:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def _tokenize(docs: Iterable[tuple[Optional[str], str]], tok: Tokenizer, writers: dict[str, SplitWriter],
              counter: SourceCounter, cfg: DataConfig, eval_only: bool, num_threads: Optional[int],
              total: Optional[int], progress: bool, desc: str) -> tuple[int, bool]:
    """Write every (source, text) document (up to the cap) to its split, counted per source; returns (text bytes
    read, whether the source was read to its end: meta.json's source_complete)."""
    text_bytes = 0
    cap = None if eval_only else cfg.max_tokens
    docs = iter(docs)  # one iterator, so that the cap below can ask it whether anything follows
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not progress) as bar:
        for batch in _batches(docs, BATCH_CHARS):
            texts = [text for _, text in batch]
            for i, ((name, text), ids) in enumerate(zip(batch, tok.encode_batch(texts, num_threads=num_threads))):
                split = "val" if eval_only or is_val(text, cfg.val_frac) else "train"
                writers[split].add([[tok.eot] + ids])
                counter.add(split, name, len(ids) + 1)
                n_bytes = len(text.encode("utf-8"))
                text_bytes += n_bytes
                bar.update(n_bytes)
                if cap is not None and writers["train"].n_tokens >= cap:
                    # the cap counts whole documents: the last one may cross it. The source is complete anyway if
                    # no document follows (one more is read from the source to know, never written)
                    return text_bytes, i == len(batch) - 1 and next(docs, None) is None
    return text_bytes, True


# ------------------------------------------------------------------------------------------------ for the trainer


def ensure_prepared(cfg: DataConfig) -> Path:
    """Called on rank 0 before training. Prepares a built-in source on first use; for other sources a missing
    dir is an error naming the command. Refuses a dir whose settings or tokenizer differ from `cfg`, and val
    sets tokenized differently from the training data. Returns the training data dir."""
    out = Path(cfg.dir)
    prepared = (out / META_FILE).is_file()
    src = parse_source(cfg.source, must_exist=not prepared)  # prepared tokens outlive their text
    if not prepared:
        if src.kind != "builtin":
            raise DataError(f"data dir {out} is not prepared; run `{prepare_command(cfg)}`")
        prepare(cfg)
    meta = load_meta(out, hint=prepare_command(cfg))
    if meta.eval_only:
        raise DataError(f"data dir {out} is an eval-only set (no train split); point data.dir at a training dir")
    expected = _request(cfg, False, None, meta.request.get("shard_tokens", DEFAULT_SHARD_TOKENS))
    diff = _differing(meta, expected, CFG_KEYS)  # a cap that changes no token is no difference (caps_agree)
    if diff:
        there = {k: f"{meta.request.get(k)!r} there" + (f" ({_cap_there(meta)})" if k == "max_tokens" else "")
                 for k in diff}
        match = " ".join(shlex.quote(f"data.{k}={_override_value(meta.request.get(k))}") for k in diff)
        raise DataError(f"data dir {out} was prepared with other settings than the config's data section ("
                        + ", ".join(f"{k}: {there[k]}, {expected[k]!r} in the config" for k in diff)
                        + f"); to train on it as prepared, override {match}; or set data.dir to another folder, or "
                        f"redo it with `{prepare_command(cfg)} --force`")
    _refuse_a_changed_source(meta, cfg, out)
    check_tokenizer(out, load_tokenizer(cfg.tokenizer, out))
    for vs in cfg.val_sets:
        vmeta = load_meta(vs, hint=prepare_command(replace(cfg, source="PATH/TO/TEXT", dir=vs), True, cfg.dir))
        if not vmeta.splits.get("val") or not vmeta.splits["val"].tokens:
            raise DataError(f"val set {vs} has no val split")
        if vmeta.tokenizer["ranks_hash"] != meta.tokenizer["ranks_hash"]:
            raise DataError(f"val set {vs} was tokenized with {vmeta.tokenizer['name']} (ranks "
                            f"{vmeta.tokenizer['ranks_hash'][:12]}), the training data {out} with "
                            f"{meta.tokenizer['name']} ({meta.tokenizer['ranks_hash'][:12]}); re-prepare it with "
                            f"--like {cfg.dir} --force")
    return out


def check_tokenizer(data_dir: str | Path, tok: Tokenizer) -> None:
    """Refuse data tokenized with another vocabulary than `tok`."""
    info = load_meta(data_dir).tokenizer
    if (info["ranks_hash"], info["eot"], info["n_vocab"]) != (tok.ranks_hash, tok.eot, tok.n_vocab):
        raise DataError(f"{data_dir} was tokenized with {info['name']} (n_vocab {info['n_vocab']}, ranks "
                        f"{info['ranks_hash'][:12]}) but the config's tokenizer is {tok.name} (n_vocab "
                        f"{tok.n_vocab}, ranks {tok.ranks_hash[:12]}); re-prepare into another data.dir")


# --------------------------------------------------------------------------------------------------------- CLI


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--source", help="builtin:pd_english | hf:ORG/NAME[:SUBSET] | a file or folder")
    p.add_argument("--out", help="output data dir")
    p.add_argument("--tokenizer", help="gpt2 | r50k_base | cl100k_base | o200k_base | bpe:N | ranks-file path")
    p.add_argument("--val-frac", type=float, help=f"fraction of documents held out (default {DataConfig.val_frac})")
    p.add_argument("--text-column", help="column holding the text (jsonl / parquet / Hub)")
    p.add_argument("--txt-document", choices=("file", "paragraph", "line"),
                   help="what one document is in .txt sources (default: the whole file)")
    p.add_argument("--max-tokens", type=float, help="stop after this many train tokens (e.g. 1e9)")
    p.add_argument("--eval-only", action="store_true", help="write a val split only: an extra eval set")
    p.add_argument("--like", help="a prepared training dir whose tokenizer to use (for --eval-only sets)")
    p.add_argument("--shard-tokens", type=float, default=DEFAULT_SHARD_TOKENS, help="tokens per shard")
    p.add_argument("--threads", type=int, help="tokenizer threads (default: all cores)")
    p.add_argument("--force", action="store_true", help="redo a finished dir even if its settings differ")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    a = p.parse_args(argv)
    cfg = DataConfig()  # a run config's data: `python train.py --config C --prepare-only`
    for key in ("source", "tokenizer", "val_frac", "text_column", "txt_document"):
        if getattr(a, key) is not None:
            cfg = replace(cfg, **{key: getattr(a, key)})
    for flag, value in (("--max-tokens", a.max_tokens), ("--shard-tokens", a.shard_tokens), ("--threads", a.threads)):
        if value is not None and not 1 <= value < math.inf:  # also refuses nan
            p.error(f"{flag} {value}: give a finite number ≥ 1")
    if a.max_tokens is not None:
        cfg = replace(cfg, max_tokens=int(a.max_tokens))
    if a.out:
        cfg = replace(cfg, dir=a.out)
    else:
        p.error("--out is required (a run config's data: python train.py --config C --prepare-only)")
    if a.source is None:
        p.error("--source is required (a run config's data: python train.py --config C --prepare-only)")
    bad = cfg.invariants()
    if Path(cfg.dir).exists() and not Path(cfg.dir).is_dir():
        bad.append(("--out" if a.out else "data.dir", f"{cfg.dir} is a file; name a folder for the shards"))
    if a.like and a.tokenizer:
        bad.append(("tokenizer", "give --like or --tokenizer, not both (--like takes the tokenizer of that dir)"))
    if bad:
        p.error("; ".join(f"{k}: {v}" for k, v in bad))
    try:
        prepare(cfg, eval_only=a.eval_only, like=a.like, shard_tokens=int(a.shard_tokens), num_threads=a.threads,
                progress=not a.quiet, force=a.force)
    except (DataError, OSError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

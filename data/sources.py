"""Where documents come from: the built-in corpus, local files (through `datasets`), or a Hub dataset, streamed.

Source strings:
  builtin:pd_english              data/builtin.py
  hf:ORG/NAME[:SUBSET]            split "train" of a Hugging Face Hub dataset, streamed (needs internet);
                                  e.g. hf:HuggingFaceFW/fineweb-edu:sample-10BT
  PATH                            a file or a folder of files: .txt/.raw/.md/.text (one document per file,
                                  or per paragraph / line: `txt_document`), .jsonl/.json and .parquet (one
                                  document per row, text in `text_column`)

Every source yields plain strings, one per document, in a fixed order. A built-in corpus also names the source of
each document (`iter_labeled_documents`: Shakespeare or the King James Bible), which prepare counts per split and the
mixture eval set weighs (data/evalset.py); other sources name none.
"""
from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Optional

from data.builtin import (BuiltinCorpusError, builtin_documents, builtin_labeled, pd_english_bytes,
                          pd_english_files)

TEXT_SUFFIXES = (".txt", ".raw", ".md", ".text")
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", **{s: "text" for s in TEXT_SUFFIXES}}
HF_PROBE_TIMEOUT_S = 8.0
HASH_BYTES = 256 << 20  # a local source this small also records its contents' sha256


class SourceError(RuntimeError):
    """A source that cannot be read; the message says why and what to do."""


@dataclass(frozen=True)
class Source:
    kind: Literal["builtin", "hf", "local"]
    name: str  # builtin name, Hub dataset name, or the path
    subset: Optional[str] = None

    def __str__(self) -> str:
        if self.kind == "local":
            return self.name
        return f"{self.kind}:{self.name}" + (f":{self.subset}" if self.subset else "")


def parse_source(text: str, must_exist: bool = True) -> Source:
    """`must_exist=False`: a local path that is gone is still a local source (a prepared dir whose text was moved
    or deleted keeps its tokens)."""
    if text.startswith("builtin:"):
        return Source("builtin", text[len("builtin:"):])
    if text.startswith("hf:"):
        name, _, subset = text[len("hf:"):].partition(":")
        if name.count("/") != 1:
            raise SourceError(f"source {text!r}: expected hf:ORG/NAME[:SUBSET], e.g. "
                              "hf:HuggingFaceFW/fineweb-edu:sample-10BT")
        return Source("hf", name, subset or None)
    if must_exist and not Path(text).exists():
        raise SourceError(f"source {text!r}: no such file or folder (Hub datasets are written hf:ORG/NAME[:SUBSET], "
                          "the built-in corpus builtin:pd_english)")
    return Source("local", text)


def source_bytes(src: Source) -> Optional[int]:
    """Approximate input size for the progress bar; None when unknown (a stream)."""
    if src.kind == "builtin":
        return pd_english_bytes()
    if src.kind == "local":
        return sum(p.stat().st_size for p in local_files(Path(src.name)))
    return None


def iter_documents(src: Source, text_column: str = "text", txt_document: str = "file") -> Iterator[str]:
    if src.kind == "builtin":
        return builtin_documents(src.name)
    if src.kind == "local":
        return _iter_local(Path(src.name), text_column, txt_document)
    check_hub_reachable(src.name)
    return iter_hf(src.name, src.subset, text_column)


def iter_labeled_documents(src: Source, text_column: str = "text",
                           txt_document: str = "file") -> Iterator[tuple[Optional[str], str]]:
    """(source name, document) in iter_documents' order; the name is None for a source that names none."""
    if src.kind == "builtin":
        return builtin_labeled(src.name)
    return ((None, text) for text in iter_documents(src, text_column, txt_document))


def local_files(path: Path) -> list[Path]:
    """The file itself, or the supported files under a folder (recursively, sorted), all of one kind."""
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in BUILDERS)
        if not files:
            raise SourceError(f"source {path}: no {', '.join(BUILDERS)} files in this folder")
    kinds = {BUILDERS.get(p.suffix.lower(), "text") for p in files}  # unknown suffixes are read as text
    if len(kinds) > 1:
        raise SourceError(f"source {path}: mixes {' and '.join(sorted(kinds))} files; prepare each kind separately")
    return files


def source_files(src: Source, content_hash: bool = True) -> Optional[dict]:
    """What a source's files are now, as meta.json records it (`source_files`): each file's name (relative to a
    folder source), size and modification time, and the sha256 of their contents when they total at most HASH_BYTES
    (cheap: one more read of a small corpus). The built-in corpus's files are its packages' (a package upgraded
    under a prepared dir shows); a Hub stream has none to look at: None."""
    if src.kind == "hf":
        return None
    if src.kind == "builtin":
        texts, kjv = pd_english_files()
        files, root = [*texts, kjv], None
    else:
        root = Path(src.name)
        files = local_files(root)
    entries = [[_name(f, root), st.st_size, st.st_mtime_ns] for f, st in ((f, f.stat()) for f in files)]
    cheap = content_hash and sum(size for _, size, _ in entries) <= HASH_BYTES
    return {"files": entries, "sha256": _content_hash(files) if cheap else None}


def source_changes(recorded: Optional[dict], src: Source) -> list[str]:
    """How a source differs from what `recorded` (source_files' dict) saw: files added, removed or changed, empty
    when it is the same. Names, sizes and times first (no file is read); where those differ but a content hash was
    recorded, the hash decides (a copied or touched file with the same bytes is no change)."""
    try:
        now = source_files(src, content_hash=False)
    except (SourceError, BuiltinCorpusError):
        return []  # the source is not on this machine (prepared tokens carried here): nothing to compare
    if now is None or recorded is None:
        return []
    then_files = {name: (size, mtime) for name, size, mtime in recorded["files"]}
    now_files = {name: (size, mtime) for name, size, mtime in now["files"]}
    if then_files == now_files:
        return []
    if recorded.get("sha256") is not None and recorded["sha256"] == source_files(src)["sha256"]:
        return []
    added, removed = sorted(now_files.keys() - then_files.keys()), sorted(then_files.keys() - now_files.keys())
    changed = sorted(n for n in then_files.keys() & now_files.keys() if then_files[n] != now_files[n])
    out = [f"{what} {_few(names)}" for what, names in (("added", added), ("removed", removed), ("changed", changed))
           if names]
    return out or ["its contents changed"]


def _name(f: Path, root: Optional[Path]) -> str:
    """A file's name as recorded: relative to a folder source; a package file with its folder."""
    if root is None:
        return f"{f.parent.name}/{f.name}"
    return str(f.relative_to(root)) if root.is_dir() else f.name


def _content_hash(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _few(names: list[str], show: int = 3) -> str:
    more = f" and {len(names) - show} more" if len(names) > show else ""
    return ", ".join(names[:show]) + more


def _iter_local(path: Path, text_column: str, txt_document: str) -> Iterator[str]:
    files = local_files(path)
    builder = BUILDERS.get(files[0].suffix.lower(), "text")
    import datasets  # imported here: `datasets` is slow to import and only prepare needs it

    sample_by = {"file": "document", "paragraph": "paragraph", "line": "line"}[txt_document]
    kwargs = {"sample_by": sample_by} if builder == "text" else {}
    # Streaming: rows come straight from the files, nothing is copied into the datasets cache.
    ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train", streaming=True, **kwargs)
    yield from _texts(ds, "text" if builder == "text" else text_column, str(path))


def check_hub_reachable(name: str) -> None:
    """Fail in seconds, with a clear message, where `datasets` would retry a Hub name for ~20 s offline."""
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes", "on"):
            raise SourceError(f"cannot stream hf:{name}: {var} is set (offline mode). Streaming a Hub dataset "
                              "needs internet; offline, download the files elsewhere and pass --source PATH "
                              "(txt, jsonl or parquet), or use --source builtin:pd_english")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/api/datasets/{name}"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HF_PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise SourceError(f"hf:{name}: the Hub has no dataset of that name ({url} → 404)") from None
        if e.code not in (401, 403):  # gated/private datasets: `datasets` uses the user's token, let it try
            raise SourceError(f"hf:{name}: the Hub answered {e.code} for {url}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise SourceError(f"cannot reach the Hugging Face Hub ({endpoint}: {reason}); streaming hf:{name} needs "
                          "internet. Offline, download the files elsewhere and pass --source PATH (txt, jsonl "
                          "or parquet), or use --source builtin:pd_english") from None


def iter_hf(name: str, subset: Optional[str], text_column: str) -> Iterator[str]:
    """Stream split "train" of a dataset (a Hub name, or anything else `datasets.load_dataset` accepts)."""
    import datasets

    try:
        ds = datasets.load_dataset(name, subset, split="train", streaming=True)
    except Exception as e:  # noqa: BLE001 - datasets raises many types; the user needs the name and the reason
        raise SourceError(f"cannot open dataset {name}" + (f" (subset {subset})" if subset else "")
                          + f": {type(e).__name__}: {str(e)[:300]}") from None
    yield from _texts(ds, text_column, name)


def _texts(ds, column: str, where: str) -> Iterator[str]:
    for i, row in enumerate(ds):
        if column not in row:
            raise SourceError(f"{where}: rows have no column {column!r} (columns: {', '.join(row)}); "
                              "pass --text-column NAME (data.text_column in a config)")
        text = row[column]
        if not isinstance(text, str):
            raise SourceError(f"{where}: row {i} column {column!r} holds {type(text).__name__}, not text")
        if text:
            # Universal newlines: `datasets` already reads .txt that way; rows from jsonl/parquet may keep "\r\n".
            yield text.replace("\r\n", "\n")

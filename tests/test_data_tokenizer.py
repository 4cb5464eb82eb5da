"""Tokenizer specs, GPT-2 by name (a local ranks file or tiktoken's download) and the deterministic BPE trainer."""
from __future__ import annotations

import hashlib
import shutil
import time

import pytest

from data.bpe import count_words, train_bpe
from data.tokenizer import (KNOWN, TokenizerError, dump_ranks, load_ranks_file, load_tokenizer, padded_vocab,
                            write_ranks)
from data.train_tokenizer import main as train_tokenizer_main

GPT2_SHA = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def test_gpt2_by_name_and_from_a_ranks_file(gpt2_ranks_file):
    tok = load_tokenizer("gpt2")  # $SCALEVEC_TOKENIZER_DIR (conftest.py), else tiktoken's download
    assert tok.encode("Hello world") == [15496, 995]
    assert (tok.name, tok.n_vocab, tok.eot, tok.ranks_hash) == ("gpt2", 50257, 50256, GPT2_SHA)
    assert tok.decode([15496, 995]) == "Hello world"
    assert tok.encode("<|endoftext|>") != [tok.eot]  # special-token text is ordinary text
    by_path = load_tokenizer(str(gpt2_ranks_file))
    assert (by_path.name, by_path.ranks_hash, by_path.eot) == ("gpt2", GPT2_SHA, 50256)
    assert load_tokenizer("r50k_base").encode_batch(["Hello world", " a"]) == [[15496, 995], [257]]


def test_gpt2_from_tiktokens_own_cache_layout(gpt2_ranks_file, tmp_path, monkeypatch):
    url = "https://openaipublic.blob.core.windows.net/encodings/" + KNOWN["gpt2"].file
    shutil.copy(gpt2_ranks_file, tmp_path / hashlib.sha1(url.encode()).hexdigest())
    monkeypatch.delenv("SCALEVEC_TOKENIZER_DIR", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert load_tokenizer("gpt2").encode("Hello world") == [15496, 995]


def test_offline_without_the_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("SCALEVEC_TOKENIZER_DIR", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    # Force "offline" even on a machine with internet: requests goes through a proxy on a closed local port.
    for var in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    t0 = time.time()
    with pytest.raises(TokenizerError, match=r"SCALEVEC_TOKENIZER_DIR/gpt2\.tiktoken") as e:
        load_tokenizer("gpt2")
    assert "shared" not in str(e.value)  # the message names no folder outside this repository
    assert time.time() - t0 < 10


def test_a_wrong_file_under_a_known_name_is_refused(tmp_path, monkeypatch):
    (tmp_path / "gpt2.tiktoken").write_bytes(dump_ranks({bytes([i]): i for i in range(256)}))
    monkeypatch.setenv("SCALEVEC_TOKENIZER_DIR", str(tmp_path))
    with pytest.raises(TokenizerError, match="gpt2.tiktoken is not tiktoken's gpt2"):
        load_tokenizer("gpt2")


@pytest.mark.parametrize("spec, match", [
    ("no/such/file.tiktoken", "no such file"),
    ("bpe:12x", "expected bpe:N"),
    ("bpe:100", r"N must lie in"),
    ("bpe:512", "pass data_dir"),
])
def test_bad_specs(spec, match):
    with pytest.raises(TokenizerError, match=match):
        load_tokenizer(spec)


def test_trained_spec_without_its_file_names_the_prepare_command(tmp_path):
    with pytest.raises(TokenizerError, match=r"python -m data.prepare --tokenizer bpe:512"):
        load_tokenizer("bpe:512", tmp_path)


def test_padded_vocab():
    assert padded_vocab(50257) == 50304
    assert padded_vocab(8192) == 8192
    assert padded_vocab(1) == 64
    assert padded_vocab(100277, 128) == 100352


def test_bpe_merges_most_frequent_pair_with_a_fixed_tie_rule():
    # ("a","b") and ("c","d") tie at 3: the smaller (left id, right id) wins; then ("ab","c") at 2.
    counts = {"abc": 2, "ab": 1, "cd": 3}
    ranks = train_bpe(counts, vocab_size=260)  # 256 bytes + 3 merges + EOT
    order = sorted(ranks, key=ranks.get)[256:]
    assert order == [b"ab", b"cd", b"abc"]
    assert train_bpe(dict(reversed(list(counts.items()))), 260) == ranks  # input order does not matter
    with pytest.raises(ValueError, match="allows only"):
        train_bpe({"ab": 1}, vocab_size=300)


def test_trained_bpe_is_deterministic_and_round_trips(shakespeare_text, tmp_path):
    text = shakespeare_text
    ranks = train_bpe(count_words([text]), 512)
    assert ranks == train_bpe(count_words([text]), 512)
    write_ranks(ranks, tmp_path / "ts512.tiktoken")
    tok = load_tokenizer(str(tmp_path / "ts512.tiktoken"))
    assert (tok.name, tok.n_vocab, tok.eot) == ("ts512", 512, 511)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < 0.6 * len(text.encode())  # it learned something: ~1.9 bytes per token at 512
    assert max(ids) < tok.eot


def test_train_tokenizer_cli(shakespeare_text, tmp_path):
    out = tmp_path / "tok.tiktoken"
    src = str(tmp_path / "input.txt")
    (tmp_path / "input.txt").write_text(shakespeare_text)
    assert train_tokenizer_main(["--input", src, "--vocab-size", "300", "--out", str(out)]) == 0
    tok = load_ranks_file(out)
    assert tok.n_vocab == 300 and tok.decode(tok.encode("To be, or not to be")) == "To be, or not to be"
    assert train_tokenizer_main(["--input", str(tmp_path / "missing.txt"), "--vocab-size", "300",
                                 "--out", str(out)]) == 1

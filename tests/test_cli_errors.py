"""A user's mistake at any command (not train.py: tests/test_config_fuzz.py) gets a one-line `error: ...` naming what
is wrong and what to do, with exit status 2, before any work: never a traceback, never a silent wrong result
(docs/design.md principle 10)."""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from config import load_config, resolve_vocab
from data import prepare
from data.shards import SplitWriter
from data.synthetic import synthetic_dir
from data.tokenizer import write_ranks
from harness import bench_loader
from model.llama import build_model
from runtime.checkpoint import save_checkpoint
from scripts import bench, export_hf, inspect_model, plot, sample, summarize

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ffn=64", "data.seq_len=16"]


def usage_error(main, argv: list[str], capsys, *words: str) -> str:
    """main(argv) stops in argparse (exit 2) with a message holding `words`; returns the message."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and all(w in err for w in words), err
    return err


def error(main, argv: list[str], capsys, *words: str) -> str:
    """main(argv) returns 2 after one `error: ...` line holding `words`."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: " in err and all(w in err for w in words) and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory with one complete checkpoint of a 1-layer baseline model over a 257-token byte vocabulary."""
    root = tmp_path_factory.mktemp("cli_errors")
    ranks = root / "bytes.tiktoken"
    write_ranks({bytes([i]): i for i in range(256)}, ranks)
    cfg = load_config(["configs/base.yaml", "configs/scale/baseline.yaml"], [*TINY, f"data.tokenizer={ranks}"])
    cfg = replace(cfg, model=resolve_vocab(cfg))
    run = root / "run"
    run.mkdir()
    (run / "config.yaml").write_text(cfg.to_yaml())
    save_checkpoint(run / "checkpoints", 1, build_model(cfg.model), None, extra={}, keep=1)
    return run


def copy_config(run: Path, dest: Path, **changes: str) -> Path:
    """A run directory with `run`'s config.yaml (lines `key: old` → `key: new`) and no checkpoint."""
    dest.mkdir()
    text = (run / "config.yaml").read_text()
    for key, value in changes.items():
        text = "\n".join(f"{line.split(':')[0]}: {value}" if line.strip().startswith(f"{key}:") else line
                         for line in text.splitlines())
    (dest / "config.yaml").write_text(text)
    return dest


# ------------------------------------------------------------------------------------------------------ sample

@pytest.mark.parametrize("flags, words", [
    (["--top-k", "-1"], ["--top-k (-1)"]),
    (["--max-new-tokens", "-1"], ["--max-new-tokens (-1)"]),  # was: nothing printed, exit 0
    (["--num-samples", "0"], ["--num-samples (0)"]),  # was: nothing printed, exit 0
    (["--temperature", "nan"], ["--temperature nan"]),
    (["--temperature", "-1"], ["--temperature -1.0"]),  # was: greedy, silently
])
def test_sample_refuses_bad_numbers(run_dir, capsys, flags, words):
    usage_error(sample.main, ["--run", str(run_dir), *flags], capsys, *words)


@pytest.mark.parametrize("flags", [["--top-k", "0"], ["--temperature", "0"]])
def test_sample_top_k_zero_and_greedy(run_dir, capsys, flags):
    """--top-k 0: every token (was: an IndexError). Greedy from an untrained model: its likeliest id may lie in the
    vocabulary's padding, which has no token to decode (was: a KeyError from the tokenizer)."""
    assert sample.main(["--run", str(run_dir), *flags, "--max-new-tokens", "32"]) == 0


def test_sample_names_what_is_missing(run_dir, tmp_path, capsys):
    usage_error(sample.main, ["--run", str(run_dir / "config.yaml")], capsys, "is not a directory")
    error(sample.main, ["--run", str(copy_config(run_dir, tmp_path / "none"))], capsys, "no complete checkpoint")
    no_data = copy_config(run_dir, tmp_path / "no_data", tokenizer="bpe:320", dir=str(tmp_path / "gone"))
    error(sample.main, ["--run", str(no_data)], capsys, "tokenizer bpe:320", "python -m data.prepare")
    half = run_dir.parent / "half"
    (half / "step_00000002").mkdir(parents=True)  # a save that did not finish
    error(sample.main, ["--run", str(run_dir), "--checkpoint", str(half / "step_00000002")], capsys,
          "is incomplete", "none beside it is complete")


def test_sample_a_damaged_checkpoint(run_dir, tmp_path, capsys):
    """A checkpoint whose shard file was cut short (a partial copy): CheckpointError, not DCP's traceback."""
    ckpt = tmp_path / "step_00000001"
    ckpt.mkdir()
    for f in (run_dir / "checkpoints" / "step_00000001").iterdir():
        ckpt.joinpath(f.name).write_bytes(f.read_bytes())
    shard = next(ckpt.glob("*.distcp"))
    whole = shard.read_bytes()
    shard.write_bytes(whole[:200])
    error(sample.main, ["--run", str(run_dir), "--checkpoint", str(ckpt)], capsys, "truncated or damaged",
          "move", "aside")
    # changed in place, its size kept: the checksum its saving rank wrote finds it, and nothing is sampled
    shard.write_bytes(whole[:100] + bytes(b ^ 0xFF for b in whole[100:164]) + whole[164:])
    error(sample.main, ["--run", str(run_dir), "--checkpoint", str(ckpt)], capsys, "changed in place: CRC-32")
    error(export_hf.main, ["--config", str(run_dir / "config.yaml"), "--checkpoint", str(ckpt), "--out",
                           str(tmp_path / "hf")], capsys, "changed in place: CRC-32")
    shard.write_bytes(whole)
    (ckpt / "extra.pt").write_bytes(b"")  # an empty extra.pt: one line, not torch.load's EOFError traceback
    error(sample.main, ["--run", str(run_dir), "--checkpoint", str(ckpt)], capsys, "extra.pt (unreadable: EOFError)")


# -------------------------------------------------------------------------------------- export_hf, inspect_model

def test_export_hf_checks_paths_before_work(run_dir, tmp_path, capsys):
    config = str(run_dir / "config.yaml")
    usage_error(export_hf.main, ["--config", config, "--out", config], capsys, "is a file; name a folder")
    usage_error(export_hf.main, ["--config", config, "--out", f"{config}/hf"], capsys, "cannot be made under it")
    error(export_hf.main, ["--config", config, "--checkpoint", str(tmp_path), "--out", str(tmp_path / "hf")], capsys,
          "no complete checkpoint")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("main", [inspect_model.main, export_hf.main])
def test_an_unknown_tokenizer_is_an_error(main, tmp_path, capsys):
    """The vocabulary size comes from the tokenizer when the config sets none."""
    argv = ["--config", "configs/tiny_cpu.yaml", "data.tokenizer=nosuch", "model.vocab_size=null"]
    error(main, argv + (["--out", str(tmp_path / "hf")] if main is export_hf.main else []), capsys,
          "tokenizer 'nosuch'")


# ------------------------------------------------------------------------------------- plot, summarize, metrics

def metrics_run(root: Path, name: str, text: str) -> Path:
    run = root / name
    run.mkdir()
    (run / "metrics.jsonl").write_text(text)
    return run


RECORDS = "".join(json.dumps({"kind": "train", "step": s, "tokens": 64 * s, "loss": 5.0 - s / 10}) + "\n"
                  for s in (1, 2))


def test_plot_skips_the_line_a_running_run_is_writing(tmp_path, capsys):
    run = metrics_run(tmp_path, "r", RECORDS + '{"kind": "train", "step": 3, "tok')
    assert plot.main([str(run), "--out", str(tmp_path / "a.png")]) == 0
    damaged = metrics_run(tmp_path, "d", RECORDS.replace("\n", "\n{oops\n", 1))
    error(plot.main, [str(damaged), "--out", str(tmp_path / "b.png")], capsys, "line 2", "is not a JSON record")
    assert summarize.main(["--check-finished", str(damaged)]) == 1


def test_summarize_reads_a_cut_eval_line_and_refuses_a_hand_edited_one(tmp_path, capsys):
    """The last eval line cut mid-write: the progress column still shows the last train step, not 0. A val_loss
    written as a string (a hand edit): one line naming the line and the key, not a format traceback."""
    from config import load_config
    cfg = load_config("configs/tiny_cpu.yaml", ["train.steps=2", "schedule.warmup_steps=0"]).to_yaml()
    evals = json.dumps({"kind": "eval", "step": 0, "tokens": 0, "val_loss": 6.0}) + "\n"
    cut = metrics_run(tmp_path, "cut", evals + RECORDS + '{"kind": "eval", "step": 2, "tok')
    (cut / "config.yaml").write_text(cfg)
    assert summarize.main([str(cut)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("cut"))
    assert " 2/2 " in row and "(unfinished)" in row
    edited = metrics_run(tmp_path, "edited", evals.replace("6.0", '"6.0"') + RECORDS)
    (edited / "config.yaml").write_text(cfg)
    error(plot.main, [str(edited), "--out", str(tmp_path / "e.png")], capsys, "line 1: val_loss is '6.0', not a number")


@pytest.mark.parametrize("args, words", [
    (["MISSING"], ["does not exist", "run directory"]),
    (["RUN", "--metric", "nosuch"], ["has nosuch", "metrics found: loss"]),  # was: an empty plot, exit 0
    (["EMPTY"], ["no records yet"]),  # was: an empty plot, exit 0
])
def test_plot_says_what_it_cannot_draw(tmp_path, capsys, args, words):
    paths = {"RUN": metrics_run(tmp_path, "run", RECORDS), "EMPTY": metrics_run(tmp_path, "empty", ""),
             "MISSING": tmp_path / "missing"}
    error(plot.main, [str(paths.get(a, a)) for a in args] + ["--out", str(tmp_path / "x.png")], capsys, *words)
    assert not (tmp_path / "x.png").exists()


OUT_PROBLEMS = [
    ("FOLDER", ["is a folder"]),  # was: wrote FOLDER.png and said "wrote FOLDER"
    ("FILE/x.png", ["cannot be made under it"]),
    ("x.xyz", [".png, .pdf or .svg"]),
]


@pytest.mark.parametrize("out, words", OUT_PROBLEMS)
def test_plot_checks_out_first(tmp_path, capsys, out, words):
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "FILE").write_text("")
    usage_error(plot.main, [str(metrics_run(tmp_path, "run", RECORDS)), "--out", str(tmp_path / out)], capsys, *words)


# ---------------------------------------------------------------------------------------------- bench, bench_loader

@pytest.mark.parametrize("flags, words", [
    (["--steps", "0"], ["--steps 0"]),  # was: every design ran, then a TypeError
    (["--micro-batch", "0"], ["--micro-batch 0"]),  # was: the config's micro_batch, silently
    (["--presets", "nosuch"], ["no preset nosuch", "unified"]),
    (["--models", ""], ["--models"]),
    (["--json", "FOLDER"], ["is a folder"]),  # was: a traceback after the first timed round
    (["--profile", "FOLDER"], ["--profile", "is a folder"]),  # would fail only after every design had run
    (["--profile", "p.md", "--profile-steps", "0"], ["--profile-steps 0"]),
])
def test_bench_checks_flags_before_it_builds(tmp_path, capsys, flags, words):
    argv = ["--no-memory", "--no-hf-reference", "--device", "cpu", "--steps", "1", "--warmup", "0", "--vocab-size",
            "64", "--micro-batch", "2", "--seq-len", "16", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
            "train.compile=false"]
    usage_error(bench.main, argv + [str(tmp_path) if f == "FOLDER" else f for f in flags], capsys, *words)


def test_bench_config_error(capsys):
    error(bench.main, ["--config", "configs/nosuch.yaml", "--no-memory", "--device", "cpu"], capsys, "does not exist")


@pytest.mark.parametrize("flags, words", [
    (["--shapes", "16by256"], ["--shapes '16by256'"]),
    (["--shapes", "0x16"], ["--shapes '0x16'"]),
    (["--repeats", "0"], ["--repeats (0)"]),
    (["--sim-ms", "nan"], ["--sim-ms (nan)"]),
    (["--sim-steps", "0"], ["--sim-steps (0)"]),
    (["--d-model", "30"], ["--d-model: 30 is not divisible"]),
    (["--scale-check", "--scale-dir", "FILE"], ["is not a folder"]),
])
def test_bench_loader_checks_flags(tmp_path, capsys, flags, words):
    (tmp_path / "FILE").write_text("")
    data = synthetic_dir(tmp_path / "data", 200_000, shard_tokens=100_000)  # sparse: no disk blocks
    argv = ["--data-dir", str(data), "--repeats", "1", "--batches", "2", "--sim-steps", "2", "--steps", "1",
            *[str(tmp_path / f) if f == "FILE" else f for f in flags]]
    usage_error(bench_loader.main, argv, capsys, *words)


def test_bench_loader_unprepared_data(tmp_path, capsys):
    error(bench_loader.main, ["--data-dir", str(tmp_path / "none"), "--repeats", "1"], capsys, "python -m data.prepare")


# ---------------------------------------------------------------------------------------------------- data.prepare

@pytest.mark.parametrize("flags, words", [
    (["--shard-tokens", "0"], ["--shard-tokens 0"]),  # was: empty shards written until the disk was full
    (["--max-tokens", "nan"], ["--max-tokens nan"]),
    (["--threads", "-2"], ["--threads -2"]),
    (["--out", "FILE"], ["is a file; name a folder"]),
])
def test_prepare_checks_flags(tmp_path, capsys, flags, words):
    (tmp_path / "FILE").write_text("")
    argv = ["--source", str(tmp_path / "nosuch"), "--tokenizer", "bpe:300", "--out", str(tmp_path / "out"), "--quiet",
            *[str(tmp_path / f) if f == "FILE" else f for f in flags]]
    usage_error(prepare.main, argv, capsys, *words)


def test_shard_writer_refuses_empty_shards(tmp_path):
    import numpy as np
    with pytest.raises(ValueError, match="shard_tokens"):
        SplitWriter(tmp_path, "train", np.dtype(np.uint16), 0)


# ------------------------------------------------------------------------------------------------------- sweep_lr.sh

@pytest.mark.parametrize("lrs, env, words", [
    (["1e-3", "3e-3x"], {}, "lr 3e-3x is not a positive number"),  # was: trained 1e-3, then failed on 3e-3x
    (["0"], {}, "lr 0 is not a positive number"),
    (["1e-3"], {"NPROC": "two"}, "NPROC=two"),  # was: bash's "two: unbound variable"
])
def test_sweep_checks_before_the_first_run(tmp_path, lrs, env, words):
    """PYTHON=false: the script must stop before it starts any Python (a check, a run, the summary)."""
    cmd = ["bash", "scripts/sweep_lr.sh", "configs/tiny_cpu.yaml", *lrs, "--", f"log.out_dir={tmp_path}"]
    out = subprocess.run(cmd, env={**os.environ, "NPROC": "1", "PYTHON": "false", **env}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and words in out.stderr and not list(tmp_path.iterdir()), out.stderr

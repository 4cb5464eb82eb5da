"""repro.reproduce: every figure's paper-scale commands load; a tiny-scale figure runs end to end, resumes by
skipping what is done, and draws its panels and terminal table."""
from __future__ import annotations

import shlex

import pytest

from config import load_config
from repro import proxy
from repro.figures import FIGURES
from repro.jobs import command, jobs, shown
from repro import reproduce
from test_train import data_dir  # noqa: F401 - a fixture


@pytest.mark.parametrize("scale", ["paper", "tiny"])
@pytest.mark.parametrize("fig", ["1", "3", "5", "6", "7", "8", "9", "10"])
def test_dry_run_prints_loadable_commands(fig, scale, capsys, monkeypatch):
    monkeypatch.setenv("NPROC", "8")
    assert reproduce.main([fig, "--scale", scale, "--dry-run"]) == 0
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert len(commands) == len(FIGURES[fig].runs)
    names = set()
    for cmd in commands:
        launcher = ["torchrun", "--nproc_per_node=8", "train.py"] if scale == "paper" else ["python", "train.py"]
        assert cmd[:len(launcher)] == launcher
        cfg = load_config([b for a, b in zip(cmd, cmd[1:]) if a == "--config"], [a for a in cmd if "=" in a[1:]
                                                                                   and not a.startswith("--")])
        names.add(cfg.log.run_name)
        if scale == "tiny":  # the built-in corpus, a proxy width with heads of 32, ≥ 10 tokens per parameter
            assert cfg.data.source == "builtin:pd_english" and cfg.data.max_tokens is None
            assert 32 <= cfg.model.d_model <= 160 and cfg.model.d_model == 32 * cfg.model.n_heads
            assert cfg.log.wandb.group.endswith("-tiny")
            tokens = cfg.train.steps * cfg.train.global_batch * cfg.data.seq_len
            assert tokens >= 10 * proxy.compute_params(cfg) and cfg.train.steps >= 1000
            assert tokens <= 4 * proxy.BUILTIN_BPE1024_TRAIN_TOKENS  # ≤ 4 passes over the corpus
            # warmup 5 % of the steps; Fig. 1's longer runs (1.2×, 1.4×) keep their reference's warmup
            assert 0.035 * cfg.train.steps <= cfg.schedule.warmup_steps <= 0.055 * cfg.train.steps
            assert cfg.model.ffn_dim - int(8 * cfg.model.d_model / 3) in (0, 8)  # Fig. 10's Llama-large: + 8
    assert len(names) == len(commands)


def test_runs_launch_this_interpreter():
    """What runs is sys.executable (torchrun as its torch.distributed.run module); the printed form stays the one users
    type."""
    import sys
    job = jobs(FIGURES["5"], "paper", 1, "runs", [])[0]
    run = command(job, "paper", 8)
    assert run[:4] == [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=8"] and run[4] == "train.py"
    assert shown(run).startswith("torchrun --nproc_per_node=8 train.py --config ")
    assert command(job, "paper", 1)[:2] == command(job, "tiny", 8)[:2] == [sys.executable, "train.py"]
    assert shown(command(job, "tiny", 8)).startswith("python train.py ")


def test_tiny_figure_end_to_end(data_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    """Each run as `python train.py …`, here called in-process (a subprocess per run costs seconds of imports;
    tests/test_sweep.py runs train.py as a subprocess)."""
    import sys

    import train

    def run_in_process(cmd):
        assert cmd[:2] == [sys.executable, "train.py"]
        train.main(cmd[2:])
        return 0

    monkeypatch.setattr("repro.jobs.launch", run_in_process)
    overrides = [f"data.dir={data_dir.dir}", f"data.source={data_dir.source}", "data.tokenizer=bpe:320",
                 "data.seq_len=32", "data.val_frac=0.2", "model.d_model=32", "model.n_heads=2", "model.n_layers=1",
                 "train.steps=2", "train.global_batch=4", "train.micro_batch=4", "train.eval_every=1",
                 "train.eval_tokens=256", "schedule.warmup_steps=1", "log.wandb.mode=disabled", "train.device=cpu", "train.dtype=float32"]
    argv = ["10", "--scale", "tiny", "--seeds", "2", "--out-dir", str(tmp_path), "--", *overrides]
    assert reproduce.main(argv) == 0
    out = capsys.readouterr().out
    assert "[6/6] fig10-unified-tiny-s1" in out and "| parameter count | unified | 2 |" in out  # progress, table
    for run in ("baseline", "llama_large", "unified"):
        for seed in (0, 1):
            assert (tmp_path / f"fig10-{run}-tiny-s{seed}" / "metrics.jsonl").exists()
    plots = tmp_path / "fig10-tiny"
    assert (plots / "fig10.png").stat().st_size > 1000 and (plots / "fig10.svg").exists()
    table = (plots / "fig10_terminal.md").read_text()
    assert "| parameter count | unified | 2 |" in table and "(reference)" in table and " ± " in table
    assert reproduce.main(argv) == 0  # the same command again: everything is done
    assert capsys.readouterr().out.count("finished, skipped") == 6
    assert reproduce.main([*argv[:-len(overrides) - 1], "--plot-only", "--log-x", "--", *overrides]) == 0
    assert "finished, skipped" not in capsys.readouterr().out
    assert reproduce.main(["10", "--plot-only", "--out-dir", str(tmp_path / "none")]) == 2  # nothing has run
    assert "without --plot-only first" in capsys.readouterr().err

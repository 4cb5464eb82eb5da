"""scripts/sweep_lr.sh and scripts.summarize: a 2-point sweep of a few steps, its summary, and a re-run that skips
the finished runs; log.out_dir as an override, and the overrides the script refuses because it sets them per run."""
from __future__ import annotations

import os
import subprocess
import sys

from scripts import summarize
from test_train import data_dir  # noqa: F401 - a fixture


def tiny_overrides(data_dir) -> list[str]:  # noqa: F811
    return ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ffn=64",
            f"data.dir={data_dir.dir}", f"data.source={data_dir.source}", "data.tokenizer=bpe:320",
            "data.seq_len=32", "data.val_frac=0.2", "train.steps=3", "train.global_batch=4",
            "train.micro_batch=4", "train.eval_every=3", "train.eval_tokens=256", "schedule.warmup_steps=1",
            "log.wandb.mode=disabled", "train.device=cpu", "train.dtype=float32", "train.compile=false"]


def sweep_env(**extra: str) -> dict:
    """The environment of a CPU sweep; OUT_DIR only where `extra` sets it."""
    env = {k: v for k, v in os.environ.items() if k != "OUT_DIR"}
    return {**env, "NPROC": "1", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **extra}


def test_two_point_sweep_then_summary(data_dir, tmp_path):  # noqa: F811
    """The sweep's folder given as log.out_dir=DIR (the part OUT_DIR plays): both runs train into DIR/<sweep>/<run>,
    the summary reads them there, and a re-run that names the folder both ways finds them finished.
    log.wandb.group=G is every run's group; the folder keeps the sweep's name."""
    cmd = ["bash", "scripts/sweep_lr.sh", "configs/tiny_cpu.yaml", "1e-3", "3e-2", "--", *tiny_overrides(data_dir),
           f"log.out_dir={tmp_path}", "log.wandb.group=my-group"]
    out = subprocess.run(cmd, env=sweep_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    sweep = tmp_path / "sweep-tiny_cpu"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep-tiny_cpu"]
    assert sorted(p.name for p in sweep.iterdir()) == ["tiny_cpu-lr1e-3", "tiny_cpu-lr3e-2"]
    assert "group: my-group" in (sweep / "tiny_cpu-lr1e-3" / "config.yaml").read_text()
    rows = [line for line in out.stdout.splitlines() if line.startswith("tiny_cpu-lr")]
    assert len(rows) == 2 and sum("← best" in r for r in rows) == 1
    assert all("3/3" in r and "unified" in r for r in rows)
    assert summarize.main(["--check-finished", str(sweep / "tiny_cpu-lr1e-3")]) == 0
    again = subprocess.run(cmd, env=sweep_env(OUT_DIR=str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("finished, skipped") == 2, again.stderr[-2000:]
    assert [line for line in again.stdout.splitlines() if line.startswith("tiny_cpu-lr")] == rows


def test_summarize_marks_unfinished_runs(tmp_path, capsys):
    from test_scaling_law import _fake_run
    done = _fake_run(tmp_path, "a", "baseline", 64, tokens=1000, loss=3.0)
    partial = _fake_run(tmp_path, "b", "hg", 64, tokens=1000, loss=2.0)
    lines = (partial / "metrics.jsonl").read_text().splitlines()
    (partial / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1].replace('"step": 10', '"step": 5') + "\n")
    assert summarize.main([str(done), str(partial), str(tmp_path / "missing")]) == 0
    out = capsys.readouterr().out
    assert "a " in out and "← best" in out.splitlines()[1] and "(unfinished)" in out.splitlines()[2]
    assert summarize.main(["--check-finished", str(partial)]) == 1


def test_slurm_script_launches_torchrun_per_node_and_requeues_an_unfinished_run(tmp_path):
    """scripts/slurm.sbatch against stand-in srun/scontrol/python: one `python -m torch.distributed.run` per node with
    the c10d rendezvous on the first node, the config and overrides passed through, and a requeue because the run has
    not reached train.steps. Every launch goes through $PYTHON (here its default, the `python` on PATH): the stand-in
    logs torchrun's launch and runs the rest (--print-run-dir, summarize) with this interpreter, and a `torchrun` on
    PATH fails the test if anything calls it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.txt"
    stubs = {
        "srun": 'shift; exec "$@"',  # drop --kill-on-bad-exit, run the command on "this node"
        "torchrun": 'echo "torchrun from PATH was called" >&2; exit 3',
        "scontrol": f'if [[ $1 == show ]]; then printf "node7\\nnode8\\n"; else echo "scontrol $*" >> {log}; fi',
        "python": f'if [[ $1 == -m && $2 == torch.distributed.run ]]; then shift 2; echo "torchrun $*" >> {log}; '
                  f'else exec {sys.executable} "$@"; fi',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[7-8]",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": os.getcwd()}
    env.pop("PYTHON", None)
    out = subprocess.run(["bash", "scripts/slurm.sbatch", "configs/figures/fig5/hg.yaml", f"log.out_dir={tmp_path}"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == ("torchrun --nnodes=2 --nproc_per_node=8 --rdzv-id=42 --rdzv-backend=c10d "
                        f"--rdzv-endpoint=node7:29500 train.py --config configs/figures/fig5/hg.yaml "
                        f"log.out_dir={tmp_path}")
    assert calls[1] == "scontrol requeue 42" and f"{tmp_path}/fig5-hg has not reached" in out.stdout


def test_overrides_the_script_sets_itself_are_refused_before_any_run(tmp_path):
    """optim.lr and log.run_name are set per run by the script: refused up front, each with what to do instead, as is
    an OUT_DIR that names another folder than log.out_dir. Nothing is trained or written."""
    def sweep(*overrides: str, **env: str) -> subprocess.CompletedProcess:
        cmd = ["bash", "scripts/sweep_lr.sh", "configs/tiny_cpu.yaml", "1e-3", "3e-3", "--", "train.steps=3",
               *overrides]
        return subprocess.run(cmd, env=sweep_env(PYTHON="false", **env), capture_output=True, text=True, timeout=30)

    out = sweep("log.run_name=mine", OUT_DIR=str(tmp_path))
    assert out.returncode == 2 and out.stderr == (
        "error: override log.run_name=mine: the sweep names each run <config>-lr<LR> itself (here "
        f"{tmp_path}/sweep-tiny_cpu/tiny_cpu-lr1e-3 ...); set SWEEP=NAME to name the sweep's folder, OUT_DIR=DIR or "
        "log.out_dir=DIR for where it goes\n")
    out = sweep("optim.lr=5e-3")
    assert out.returncode == 2 and out.stderr == (
        "error: override optim.lr=5e-3: the sweep sets optim.lr per run; give the lrs as arguments before --, e.g. "
        "scripts/sweep_lr.sh configs/tiny_cpu.yaml 5e-3 -- ...\n")
    out = sweep(f"log.out_dir={tmp_path / 'b'}", OUT_DIR=str(tmp_path / "a"))
    assert out.returncode == 2 and out.stderr == (
        f"error: OUT_DIR={tmp_path / 'a'} and override log.out_dir={tmp_path / 'b'} name two places for the sweep; "
        "give one of them\n")
    assert list(tmp_path.iterdir()) == []

"""A run stopped from outside: SIGTERM checkpoints the current step and the same command resumes; a signal one rank
sees stops every rank at the same step; the launcher's death ends its workers with a checkpoint; a bad config under
torchrun is said once. Each test launches train.py itself (a subprocess, torchrun or spawned ranks)."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

import train
from multiproc import Rendezvous, free_port, spawn
from runtime.checkpoint import latest_checkpoint
from test_train import _worker, args_for, data_dir, records  # noqa: F401 - data_dir is a fixture


def test_sigterm_checkpoints_and_resumes(data_dir, tmp_path):
    """SIGTERM (preemption) finishes the current step, checkpoints it and exits 0; the same command resumes."""
    import signal
    import subprocess
    import sys
    import time
    argv = args_for(data_dir, tmp_path, "term", "train.steps=400", "train.eval_every=1000", "train.ckpt_every=1000")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "train.py", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "term" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(records(tmp_path / "term", "train")) >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    stopped = records(tmp_path / "term", "train")[-1]["step"]
    assert 2 <= stopped < 400 and f"checkpointed step {stopped}" in out
    assert latest_checkpoint(tmp_path / "term" / "checkpoints").name == f"step_{stopped:08d}"
    summary = train.main([*argv, "--stop-at-step", str(stopped + 1)])  # the same command continues
    assert summary["step"] == stopped + 1


def _term_worker(rank: int, world: int, rdzv: Rendezvous, argv: list[str]) -> None:
    if rank == 0:  # only rank 0 is asked to stop, during the forward of step 3
        from fast.head import FusedHeadLoss
        real, calls = FusedHeadLoss.__call__, {"n": 0}

        def terminating(self, *args, **kwargs):
            if torch.is_grad_enabled():  # training forwards only, not evaluation's
                calls["n"] += 1
                if calls["n"] == 5:  # 2 micro-batches per step on each of 2 ranks: step 3's first forward
                    signal.raise_signal(signal.SIGTERM)
            return real(self, *args, **kwargs)

        FusedHeadLoss.__call__ = terminating
    _worker(rank, world, rdzv, [argv])


def test_a_stop_seen_by_one_rank_stops_every_rank_at_the_same_step(data_dir, tmp_path):
    """SIGTERM reaches rank 0 alone: the stop request crosses to rank 1 through the host-side consensus
    (runtime/dist.py, StopConsensus), both finish step 3, checkpoint it together and exit cleanly."""
    argv = args_for(data_dir, tmp_path, "term2", "train.micro_batch=2", "train.ckpt_every=100", "train.eval_every=100")
    spawn(_term_worker, (2, Rendezvous.new(), argv), nprocs=2)
    assert records(tmp_path / "term2", "train")[-1]["step"] == 3
    assert latest_checkpoint(tmp_path / "term2" / "checkpoints").name == "step_00000003"


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: no psutil)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_workers_end_with_their_launcher(data_dir, tmp_path):  # noqa: F811
    """torchrun starts each worker in a session of its own: a SIGKILL to the agent alone used to leave both workers
    training, holding the lock. Now each gets a signal as the agent dies (runtime/dist.py, end_with_launcher): they
    checkpoint the same step, release the lock and exit, and the same command continues the run."""
    import subprocess
    import time
    from runtime.rundir import lock_run_dir
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    argv = args_for(data_dir, tmp_path, "orphan", "train.steps=400", "train.micro_batch=2", "train.eval_every=1000",
                    "train.ckpt_every=1000")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port", str(free_port()),
           "train.py", *argv]
    agent = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    metrics = tmp_path / "orphan" / "metrics.jsonl"
    deadline = time.time() + 180
    while not (metrics.exists() and '"kind": "train"' in metrics.read_text()):
        assert agent.poll() is None and time.time() < deadline, "the run did not start training"
        time.sleep(0.2)
    workers = _children(agent.pid)
    assert len(workers) == 2
    agent.kill()  # the agent alone, as a scheduler's SIGKILL to the launcher
    agent.wait()
    deadline = time.time() + 120
    while any(Path(f"/proc/{w}").exists() and "zombie" not in Path(f"/proc/{w}/status").read_text() for w in workers):
        assert time.time() < deadline, "the workers went on without their launcher"
        time.sleep(0.2)
    step = records(tmp_path / "orphan", "train")[-1]["step"]
    assert 0 < step < 400 and latest_checkpoint(tmp_path / "orphan" / "checkpoints").name == f"step_{step:08d}"
    lock_run_dir(tmp_path / "orphan").release()  # free: the same command would continue


def test_a_config_error_under_torchrun_is_said_once(tmp_path):
    """Every rank refuses a bad config with exit code 2; only rank 0 prints the message (not once per GPU)."""
    import subprocess
    import sys
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}  # torchrun's torchelastic_* go there
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
                           str(free_port()), "train.py", "train.steps=many"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("error: train.steps") == 1, proc.stderr

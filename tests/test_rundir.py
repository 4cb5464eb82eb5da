"""A run directory that defends itself (docs/reliability.md): one writer at a time, a damaged checkpoint set aside for
the intact one before it, a chosen older checkpoint, no flag that deletes progress, one-line errors for an out dir
that cannot be written."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import train
from strictconfig.config import ConfigError
from multiproc import Rendezvous, spawn
from data.shards import DataError
from runtime.checkpoint import CheckpointError
from runtime.rundir import LOCK_FILE, RunDirError, lock_run_dir
from test_train import _error_worker, args_for, data_dir, final_params, records  # noqa: F401 - data_dir is a fixture

HOLD = ("import sys, time; from runtime.rundir import lock_run_dir; lock_run_dir(sys.argv[1]); print('held', "
        "flush=True); time.sleep(600)")


@pytest.fixture
def held(tmp_path):
    """A run directory whose lock another process holds: (its path, that process)."""
    run_dir = tmp_path / "busy"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout.readline().strip() == "held"
    yield run_dir, proc
    proc.kill()
    proc.wait()


def test_a_second_process_is_refused_at_once_naming_the_holder(held):
    run_dir, proc = held
    with pytest.raises(RunDirError, match=f"in use by pid {proc.pid} on host"):
        lock_run_dir(run_dir)


def test_a_lock_left_by_a_killed_process_is_taken_over(held):
    run_dir, proc = held
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lock = lock_run_dir(run_dir)
    assert f"took over the lock of pid {proc.pid}" in lock.note
    assert json.loads((run_dir / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert (run_dir / LOCK_FILE).read_text() == ""  # released cleanly: the next run finds nothing to take over
    again = lock_run_dir(run_dir)
    assert again.note is None
    again.release()


def test_train_py_refuses_a_busy_run_directory_before_touching_it(data_dir, tmp_path, held):  # noqa: F811
    run_dir, proc = held
    before = sorted(p.name for p in run_dir.iterdir())
    with pytest.raises(RunDirError, match=f"pid {proc.pid}"):
        train.main(args_for(data_dir, tmp_path, "busy"))
    assert sorted(p.name for p in run_dir.iterdir()) == before == [LOCK_FILE]


def test_every_rank_of_a_launch_is_refused(data_dir, tmp_path, held):  # noqa: F811
    run_dir, proc = held
    spawn(_error_worker, (2, Rendezvous.new(), args_for(data_dir, tmp_path, "busy"), tmp_path), nprocs=2, timeout=120)
    for rank in range(2):
        assert (tmp_path / f"rank{rank}.txt").read_text().startswith(f"RunDirError: {run_dir} is in use by pid")


def test_an_out_dir_that_cannot_be_made_is_one_line(data_dir, tmp_path):  # noqa: F811
    (tmp_path / "a_file").write_text("")
    with pytest.raises(RunDirError, match="cannot create or write the run directory .* choose a writable") as e:
        train.main(args_for(data_dir, tmp_path / "a_file", "run"))
    assert "\n" not in str(e.value)


def test_a_start_refused_before_it_writes_leaves_no_run_directory(data_dir, tmp_path):  # noqa: F811
    """A fresh run stopped by a bad setting after taking its lock: no empty directory with a lock file is left."""
    with pytest.raises(ConfigError, match="global_batch"):
        train.main(args_for(data_dir, tmp_path, "never", "train.global_batch=6"))
    assert not (tmp_path / "never").exists()


def test_stop_at_step_at_or_below_the_runs_step_trains_and_prunes_nothing(data_dir, tmp_path):  # noqa: F811
    argv = args_for(data_dir, tmp_path, "stop", "train.ckpt_every=2", "train.keep_ckpts=1")
    train.main(argv + ["--stop-at-step", "4"])
    run = tmp_path / "stop"
    metrics = (run / "metrics.jsonl").read_text()
    for k in ("4", "2"):
        with pytest.raises(ConfigError, match=f"--stop-at-step {k} is at or below this run's step 4"):
            train.main(argv + ["--stop-at-step", k])
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000004"]
    assert (run / "metrics.jsonl").read_text() == metrics


def _damage(ckpt: Path, how: str) -> None:
    if how == "shard":
        shard = next(ckpt.glob("*.distcp"))
        shard.write_bytes(shard.read_bytes()[:100])
    elif how == "marker":
        (ckpt / "COMPLETE").write_text("{not json")
    elif how == "rng":
        (ckpt / "rng_rank0.pt").unlink()
    elif how == "4 KiB flipped in place":  # the size kept: only the checksum sees it
        shard = next(ckpt.glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        mid = len(data) // 2
        data[mid:mid + 4096] = bytes(b ^ 0xFF for b in data[mid:mid + 4096])
        shard.write_bytes(bytes(data))
    elif how == "extra.pt of step 2":  # whole and readable, but it would restore another step
        (ckpt / "extra.pt").write_bytes((ckpt.parent / "step_00000002" / "extra.pt").read_bytes())
    elif how == "marker of step 2":
        marker = json.loads((ckpt / "COMPLETE").read_text())
        (ckpt / "COMPLETE").write_text(json.dumps({**marker, "step": 2}))
    else:
        (ckpt / how).write_bytes(b"garbage")


@pytest.mark.parametrize("how", ["shard", "marker", "rng", "extra.pt", ".metadata", "4 KiB flipped in place",
                                 "extra.pt of step 2", "marker of step 2"])
def test_a_damaged_checkpoint_is_set_aside_for_the_one_before(data_dir, tmp_path, capsys, how):  # noqa: F811
    """The newest checkpoint damaged in any of its files, or whose folder name, marker and saved step disagree:
    moved into checkpoints/set_aside/ with a WHY, the one before it loaded, metrics.jsonl trimmed to it, and the run
    ends where an uninterrupted run ends."""
    argv = args_for(data_dir, tmp_path, "dmg", "train.ckpt_every=2", "train.eval_every=100")
    train.main(argv + ["--stop-at-step", "4"])
    ckpts = tmp_path / "dmg" / "checkpoints"
    _damage(ckpts / "step_00000004", how)
    capsys.readouterr()
    train.main(argv)
    err = capsys.readouterr().err
    aside = ckpts / "set_aside" / "step_00000004"
    assert f"checkpoint step_00000004 is damaged" in err and f"moved to {aside}" in err
    assert (aside / "WHY").read_text().startswith("damaged: ")
    if how.endswith("of step 2"):
        assert "steps disagree (folder name 4, " in (aside / "WHY").read_text()
    if how == "4 KiB flipped in place":
        assert ".distcp (changed in place: CRC-32 " in (aside / "WHY").read_text()
    assert [r["step"] for r in records(tmp_path / "dmg", "train")] == list(range(1, 7))
    reference = args_for(data_dir, tmp_path, "ref", "train.ckpt_every=2", "train.eval_every=100")
    train.main(reference)
    a, b = final_params(tmp_path / "dmg", argv), final_params(tmp_path / "ref", reference)
    assert all(a[n].equal(b[n]) for n in a)


def test_with_every_checkpoint_damaged_the_run_stops_and_the_next_starts_over(data_dir, tmp_path):  # noqa: F811
    argv = args_for(data_dir, tmp_path, "all", "train.ckpt_every=2", "train.eval_every=100", "train.keep_ckpts=1")
    train.main(argv + ["--stop-at-step", "4"])
    ckpts = tmp_path / "all" / "checkpoints"
    _damage(ckpts / "step_00000004", "shard")
    metrics = (tmp_path / "all" / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match="no checkpoint of .* can be read: checkpoint step_00000004 is damaged"):
        train.main(argv)
    assert (tmp_path / "all" / "metrics.jsonl").read_text() == metrics  # nothing trimmed
    assert [p.name for p in (ckpts / "set_aside").iterdir()] == ["step_00000004"]
    train.main(argv)  # the same command again: from step 0
    assert [r["step"] for r in records(tmp_path / "all", "train")] == list(range(1, 7))


def test_resume_step_sets_newer_checkpoints_aside(data_dir, tmp_path, capsys):  # noqa: F811
    argv = args_for(data_dir, tmp_path, "back", "train.ckpt_every=2", "train.eval_every=100", "train.keep_ckpts=5")
    train.main(argv)
    ckpts = tmp_path / "back" / "checkpoints"
    with pytest.raises(CheckpointError, match=r"--resume-step 3: .* no complete checkpoint of step 3 "
                                              r"\(complete: 2, 4, 6\)"):
        train.main(argv + ["--resume-step", "3"])
    capsys.readouterr()
    train.main(argv + ["--resume-step", "2"])
    assert "set step_00000006 aside (newer than --resume-step 2)" in capsys.readouterr().err
    assert sorted(p.name for p in (ckpts / "set_aside").iterdir()) == ["step_00000004", "step_00000006"]
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_00000002", "step_00000004", "step_00000006"]
    assert [r["step"] for r in records(tmp_path / "back", "train")] == list(range(1, 7))
    # A requeued job that keeps the flag: the run went back to 2 once and trained on, so it continues, setting
    # nothing more aside and training nothing again.
    train.main(argv + ["--resume-step", "2"])
    assert "this run went back to step 2 once already" in capsys.readouterr().err
    assert sorted(p.name for p in (ckpts / "set_aside").iterdir()) == ["step_00000004", "step_00000006"]
    assert [r["step"] for r in records(tmp_path / "back", "train")] == list(range(1, 7))
    # Another step is a new rollback, and the record follows it.
    train.main(argv + ["--resume-step", "4"])
    assert "set step_00000006 aside (newer than --resume-step 4)" in capsys.readouterr().err
    assert json.loads((ckpts / "rolled_back.json").read_text()) == {"step": 4}


@pytest.mark.parametrize("cut", ["to step 2", "mid eval line"])
def test_metrics_lost_behind_a_checkpoint_are_said_and_its_eval_redone(data_dir, tmp_path, capsys, cut):  # noqa: F811
    """metrics.jsonl is synced before each checkpoint; if it still loses its tail (a power loss, simulated by
    cutting it back), the resume says which steps are gone and evaluates the checkpoint's step again: the file
    then holds every evaluation an uninterrupted run has, with the same values."""
    argv = args_for(data_dir, tmp_path, "cut", "train.ckpt_every=2", "train.eval_every=2")
    train.main(argv + ["--stop-at-step", "4"])
    metrics = tmp_path / "cut" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    if cut == "to step 2":
        metrics.write_text("".join(line for line in lines if json.loads(line)["step"] <= 2))
    else:
        assert json.loads(lines[-1])["kind"] == "eval" and json.loads(lines[-1])["step"] == 4
        metrics.write_text("".join(lines[:-1]) + lines[-1][:40])
    capsys.readouterr()
    train.main(argv)
    err = capsys.readouterr().err
    assert ("ends at step 2, before the checkpoint's step 4: the records of steps 3..4 are lost" in err) == (
        cut == "to step 2")
    reference = args_for(data_dir, tmp_path, "whole", "train.ckpt_every=2", "train.eval_every=2")
    train.main(reference)
    evals = {r["step"]: r["val_loss"] for r in records(tmp_path / "cut", "eval")}
    assert evals == {r["step"]: r["val_loss"] for r in records(tmp_path / "whole", "eval")}


def test_a_shard_changed_in_place_stops_the_run_at_a_checkpoint(data_dir, tmp_path):  # noqa: F811
    """A train shard edited in place with ids still inside the vocabulary: the background check (data/verify.py)
    finds it against meta.json's sha256, and every rank checkpoints one step and stops with the shard named and the
    command that prepares it again."""
    import shutil
    from data.shards import HEADER_BYTES
    data = tmp_path / "prepared"
    shutil.copytree(data_dir.dir, data)
    shard = next(data.glob("train_*.bin"))
    raw = bytearray(shard.read_bytes())
    raw[HEADER_BYTES:HEADER_BYTES + 4] = raw[HEADER_BYTES + 2:HEADER_BYTES + 4] + raw[HEADER_BYTES:HEADER_BYTES + 2]
    shard.write_bytes(bytes(raw))  # two tokens swapped: every id valid, the bytes not what was prepared
    argv = args_for(data_dir, tmp_path, "edited", "train.steps=400", "train.eval_every=1000", "train.ckpt_every=1000",
                    f"data.dir={data}")
    with pytest.raises(DataError, match=r"train_000000\.bin is not what data\.prepare wrote .* --force \(the run "
                                        r"checkpointed step (\d+) and stopped; once the data is prepared again"):
        train.main(argv)
    step = records(tmp_path / "edited", "train")[-1]["step"]
    assert step < 400 and (tmp_path / "edited" / "checkpoints" / f"step_{step:08d}").is_dir()


@pytest.mark.parametrize("what", ["a directory", "a dangling link", "a link to /dev/null"])
def test_a_lock_path_that_is_not_a_file_is_named_as_such(tmp_path, what):
    run = tmp_path / "r"
    run.mkdir()
    lock = run / LOCK_FILE
    if what == "a directory":
        lock.mkdir()
    else:
        lock.symlink_to("/nonexistent" if what == "a dangling link" else "/dev/null")
    with pytest.raises(RunDirError, match=rf"run\.lock is {what.replace('dangling link', 'link to /nonexistent')}"
                                          r", not the run's lock file: remove it"):
        lock_run_dir(run)


def test_a_failed_prune_warns_and_the_run_goes_on(data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Removing old checkpoints failed (a permission, a busy file): the new checkpoint is complete, so the run says
    so and trains on; it used to report a failed save, name the wrong resume step, and stop."""
    import runtime.checkpoint as ckpt

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(ckpt, "_prune", refuse)
    argv = args_for(data_dir, tmp_path, "prune", "train.ckpt_every=2", "train.eval_every=100", "train.keep_ckpts=1")
    train.main(argv)
    err = capsys.readouterr().err
    assert "the checkpoint of step 2 is saved, but removing older ones" in err and "(Permission denied)" in err
    assert [r["step"] for r in records(tmp_path / "prune", "train")] == list(range(1, 7))


def test_a_damaged_checkpoint_that_cannot_be_set_aside_is_one_line(data_dir, tmp_path, monkeypatch):  # noqa: F811
    import runtime.resume_point as rp
    argv = args_for(data_dir, tmp_path, "stuck", "train.ckpt_every=2", "train.eval_every=100")
    train.main(argv + ["--stop-at-step", "4"])
    _damage(tmp_path / "stuck" / "checkpoints" / "step_00000004", "shard")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(rp, "set_aside", refuse)
    with pytest.raises(CheckpointError, match=r"checkpoint step_00000004 is damaged .* and cannot be set aside "
                                              r"\(Permission denied\): make .* writable"):
        train.main(argv)


def test_a_ctrl_c_while_resuming_is_one_line(data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    from runtime.trainer import Trainer

    def interrupted(self, step=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(Trainer, "resume", interrupted)
    assert train.cli(args_for(data_dir, tmp_path, "ctrlc")) == 130
    err = capsys.readouterr().err
    assert "error: interrupted; nothing half-written is trusted" in err and "Traceback" not in err


def test_a_full_disk_under_the_metrics_is_one_line_and_resumes(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """A write the disk refuses outside a checkpoint (here metrics.jsonl at step 5): one RunDirError line, the
    traceback in <run>/errors.log, and the same command resumes from the newest checkpoint."""
    import errno

    from runtime.logging import RunLogger
    real = RunLogger.log_train

    def log_train(self, step, record):
        if step == 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.run_dir / "metrics.jsonl"))
        return real(self, step, record)
    monkeypatch.setattr(RunLogger, "log_train", log_train)
    argv = args_for(data_dir, tmp_path, "full", "train.ckpt_every=2", "train.eval_every=100")
    with pytest.raises(RunDirError, match=r"a write failed \(No space left on device: .*metrics\.jsonl\); the "
                                          r"traceback is in .*errors\.log\. The newest checkpoint is intact") as e:
        train.main(argv)
    assert "\n" not in str(e.value) and "Traceback" in (tmp_path / "full" / "errors.log").read_text()
    monkeypatch.undo()
    train.main(argv)
    assert [r["step"] for r in records(tmp_path / "full", "train")] == list(range(1, 7))


@pytest.mark.parametrize("flags,says", [(["--resume-step", "0"], "--resume-step 0: K must be ≥ 1"),
                                        (["--resume-step", "4", "--stop-at-step", "4"],
                                         "--stop-at-step 4 is at or below --resume-step 4")])
def test_resume_and_stop_flags_that_cannot_work_are_usage_errors(flags, says, capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(flags)
    assert e.value.code == 2 and says in capsys.readouterr().err

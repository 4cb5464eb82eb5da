"""Faults nobody plans for: a disk that fills up while a checkpoint is written (on one rank or on all), and data
shards that cannot be written. The previous checkpoint stays whole and loadable, every rank stops with the same
message saying what failed and how to resume, and the same command resumes to the uninterrupted run's numbers."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

import train
from multiproc import Rendezvous, spawn
from runtime.checkpoint import CheckpointError, latest_checkpoint
from test_train import _worker, args_for, data_dir, final_params, records  # noqa: F401 - data_dir is a fixture


def fill_disk_at(marker: str) -> None:
    """From now on, fsync of any file whose path contains `marker` fails with ENOSPC — where a full disk shows up
    for buffered writes (DCP's shard files, our atomic writes)."""
    real = os.fsync

    def fsync(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if marker in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    os.fsync = fsync


def _full_disk_worker(rank: int, world: int, rdzv: Rendezvous, argv: list[str], out: Path, failing_rank: int) -> None:
    if rank == failing_rank:
        fill_disk_at(".tmp-step_00000004")
    try:
        _worker(rank, world, rdzv, [argv])
        (out / f"rank{rank}.txt").write_text("finished")
    except CheckpointError as e:
        (out / f"rank{rank}.txt").write_text(str(e))


@pytest.mark.parametrize("world,failing_rank", [(1, 0), (2, 1)])
def test_full_disk_during_a_checkpoint_keeps_the_previous_one(data_dir, tmp_path, monkeypatch, world,  # noqa: F811
                                                              failing_rank):
    monkeypatch.setattr(os, "fsync", os.fsync)  # restored after the test
    argv = args_for(data_dir, tmp_path, "full", "train.ckpt_every=2", "train.eval_every=100")
    if world == 1:
        fill_disk_at(".tmp-step_00000004")
        with pytest.raises(CheckpointError) as e:
            train.main(argv)
        messages = [str(e.value)]
    else:
        spawn(_full_disk_worker, (world, Rendezvous.new(), argv, tmp_path, failing_rank), nprocs=world, timeout=120)
        messages = [(tmp_path / f"rank{r}.txt").read_text() for r in range(world)]
    ckpts = tmp_path / "full" / "checkpoints"
    for m in messages:  # every rank stopped, each saying what failed and how to resume
        assert "writing the checkpoint of step 4" in m and "resume from step 2" in m and str(ckpts) in m
    assert "No space left on device" in messages[failing_rank]
    assert latest_checkpoint(ckpts).name == "step_00000002"
    assert "\n" not in messages[failing_rank]  # one line: the traceback went to a file beside the checkpoints
    assert f"the traceback is in {ckpts / 'errors.log'}" in messages[failing_rank]
    assert "Traceback" in (ckpts / "errors.log").read_text() and "No space left" in (ckpts / "errors.log").read_text()
    assert sorted(p.name for p in ckpts.iterdir()) == ["errors.log", "step_00000002"]  # the partial save is gone
    assert [r["step"] for r in records(tmp_path / "full", "train")][-1] == 4  # the steps it did are logged

    # The disk has room again: the same command resumes from step 2 and ends where an uninterrupted run ends.
    monkeypatch.undo()
    if world == 1:
        train.main(argv)
        reference = args_for(data_dir, tmp_path, "reference", "train.ckpt_every=2", "train.eval_every=100")
        train.main(reference)
        a, b = final_params(tmp_path / "full", argv), final_params(tmp_path / "reference", reference)
        assert all(torch.equal(a[n], b[n]) for n in a)
        assert [r["loss"] for r in records(tmp_path / "full", "train")][-2:] == \
            [r["loss"] for r in records(tmp_path / "reference", "train")][-2:]


def test_full_disk_while_preparing_data_names_the_dir(tmp_path, monkeypatch):
    from data.config import DataConfig
    from data.prepare import prepare
    from data.shards import DataError
    docs = tmp_path / "docs"
    docs.mkdir()
    words = [f"w{a}{b}" for a in "abcdefghij" for b in "klmnopqrst"]
    for i in range(6):
        (docs / f"d{i}.txt").write_text(" ".join(words[(i * 7 + j * j) % 100] for j in range(2000)))
    cfg = DataConfig(source=str(docs), dir=str(tmp_path / "prepared"), tokenizer="bpe:300", val_frac=0.3)
    monkeypatch.setattr(os, "fsync", os.fsync)
    fill_disk_at(str(tmp_path / "prepared"))
    with pytest.raises(DataError, match=r"No space left on device.*run the same command again"):
        prepare(cfg, progress=False)
    assert not (tmp_path / "prepared" / "meta.json").exists()  # never mistaken for a prepared dir
    monkeypatch.undo()
    prepare(cfg, progress=False)
    assert (tmp_path / "prepared" / "meta.json").exists()

"""Single-process checkpoint behaviour: round trip, crash debris, pruning, mismatch errors, path forms."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runtime.checkpoint import (
    MARKER,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    load_model_weights,
    read_marker,
    resolve_checkpoint,
    save_checkpoint,
)


class Net(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 8, extra_layer: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.proj = nn.Linear(d, d)
        self.drop = nn.Dropout(0.3)
        self.out = nn.Linear(d, vocab)
        self.extra = nn.Linear(d, d) if extra_layer else None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(torch.tanh(self.proj(self.embed(idx)))))


def _model(seed: int = 0, **kw) -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Net(**kw)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> float:
    # Data from the global RNGs on purpose: a resume is only identical if torch, numpy and python RNGs all return.
    idx = torch.randint(0, 11, (3, 5))
    scale = float(np.random.rand()) + random.random()
    loss = scale * F.cross_entropy(model(idx).reshape(-1, 11), idx.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _save(ckpt_dir: Path, step: int, keep: int = 3) -> Path:
    model, opt = _model()
    return save_checkpoint(ckpt_dir, step, model, opt, {"step": step}, keep=keep)


def test_round_trip_is_bit_identical_including_rng(tmp_path: Path) -> None:
    model, opt = _model()
    for _ in range(2):
        _step(model, opt)
    extra = {"step": 2, "tokens": 30, "loader": {"pos": [3, 4]}, "config": "model: {}\n", "git": None}
    path = save_checkpoint(tmp_path / "checkpoints", 2, model, opt, extra, keep=2)
    ref = [_step(model, opt) for _ in range(3)]

    for rng in (torch.manual_seed, np.random.seed, random.seed):
        rng(99)
    model2, opt2 = _model(seed=7)
    assert load_checkpoint(path, model2, opt2) == extra
    assert [_step(model2, opt2) for _ in range(3)] == ref
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert read_marker(path) == {"step": 2, "world_size": 1, "torch": torch.__version__, "checksums": True}


def test_layout_on_disk(tmp_path: Path) -> None:
    path = _save(tmp_path, 12)
    assert path == tmp_path / "step_00000012"
    assert {".metadata", "__0_0.distcp", "extra.pt", "rng_rank0.pt", MARKER} <= {p.name for p in path.iterdir()}
    assert not any(p.name.endswith(".partial") or p.name.startswith(".tmp") for p in tmp_path.rglob("*"))


def test_latest_ignores_tmp_and_unmarked_dirs(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "nothing_here") is None
    good = _save(tmp_path, 1)
    (tmp_path / ".tmp-step_00000009").mkdir()  # a save that crashed before the rename
    (tmp_path / ".tmp-step_00000009" / ".metadata").write_bytes(b"x")
    crashed = tmp_path / "step_00000005"  # a save that crashed between rename and marker
    crashed.mkdir()
    (crashed / "extra.pt").write_bytes(b"x")
    (tmp_path / "step_00000007").write_text("not a directory")
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_checkpoint(crashed)
    # The next save clears the debris and still keeps the complete checkpoint.
    newest = _save(tmp_path, 2)
    assert latest_checkpoint(tmp_path) == newest
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_00000001", "step_00000002"]


def test_pruning_keeps_newest_and_the_one_just_written(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000004"]
    _save(tmp_path, 2, keep=1)  # older than the newest (e.g. a manual re-save): never deleted by its own save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000004"]
    _save(tmp_path, 4, keep=1)  # re-saving an existing step replaces it whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004"]
    with pytest.raises(ValueError, match="keep"):
        _save(tmp_path, 5, keep=0)


def test_mismatched_model_gives_a_clear_error(tmp_path: Path) -> None:
    path = _save(tmp_path, 1)
    wrong_shape, _ = _model(vocab=13)
    with pytest.raises(CheckpointError) as e:
        load_model_weights(wrong_shape, path)
    assert "shape mismatch" in str(e.value) and "model.embed.weight: checkpoint [11, 8] vs model [13, 8]" in str(e.value)

    more, opt = _model(extra_layer=True)
    with pytest.raises(CheckpointError, match=r"missing from checkpoint: model\.extra\.bias, model\.extra\.weight"):
        load_checkpoint(path, more, opt)


def test_mismatched_optimizer_gives_a_clear_error(tmp_path: Path) -> None:
    path = _save(tmp_path, 1)
    model = Net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError, match=r"optim\.state\.embed\.weight\.momentum_buffer"):
        load_checkpoint(path, model, sgd)
    two_groups = torch.optim.AdamW([{"params": [model.embed.weight]},
                                    {"params": [p for n, p in model.named_parameters() if n != "embed.weight"]}])
    with pytest.raises(CheckpointError, match="param groups"):
        load_checkpoint(path, model, two_groups)


def test_extra_must_load_with_weights_only(tmp_path: Path) -> None:
    model, opt = _model()
    with pytest.raises(TypeError, match="weights_only"):
        save_checkpoint(tmp_path, 1, model, opt, {"data_dir": Path("data")}, keep=1)
    assert latest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 1, model, opt, {"t": torch.arange(3), "tup": (1, "a"), "x": None}, keep=1)


def test_path_forms(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _save(run / "checkpoints", 1)
    newest = _save(run / "checkpoints", 3)
    for form in (run, run / "checkpoints", newest):
        model = Net()
        assert load_model_weights(model, form) == {"step": 3}
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_model_weights(Net(), tmp_path / "elsewhere")


@pytest.mark.parametrize("crash_at", ["dcp", "rng", "extra", "rename", "marker"])
def test_a_crash_mid_save_never_looks_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               crash_at: str) -> None:
    import runtime.checkpoint as ck

    good = _save(tmp_path, 1)

    def boom(*a, **k):
        raise KeyboardInterrupt("killed")

    real_write, real_replace = ck.atomic_write, ck.os.replace
    if crash_at == "dcp":
        monkeypatch.setattr(ck.dcp, "save", boom)
    elif crash_at == "rename":  # the tmp dir → step dir rename; file renames inside still work
        monkeypatch.setattr(ck.os, "replace", lambda src, dst: boom() if Path(dst).name == "step_00000002"
                            else real_replace(src, dst))
    else:
        name = {"rng": "rng_rank0.pt", "extra": "extra.pt", "marker": MARKER}[crash_at]
        monkeypatch.setattr(ck, "atomic_write", lambda path, data: boom() if path.name == name
                            else real_write(path, data))
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 2)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == good
    assert _save(tmp_path, 2) == latest_checkpoint(tmp_path)  # the next save cleans up and succeeds
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001", "step_00000002"]


def test_a_files_crc32_is_zlibs_over_its_chunks_and_the_cost_harness_prints_it(tmp_path, monkeypatch, capsys):
    """file_crc32 streams the file in chunks: the same CRC-32 as zlib's over the whole bytes, across chunk edges."""
    import zlib

    import runtime.checkpoint_files as ckpt
    from harness import checksum_cost
    monkeypatch.setattr(ckpt, "_CHUNK", 1000)
    data = bytes(range(256)) * 20  # 5,120 bytes: 5 full chunks and a partial one
    (tmp_path / "f").write_bytes(data)
    assert ckpt.file_crc32(tmp_path / "f") == zlib.crc32(data)
    assert checksum_cost.main(["--gib", "0.001", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "read + CRC-32: " in out and "CRC-32 adds " in out and "sha256 adds " in out

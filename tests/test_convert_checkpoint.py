"""A checkpoint of the older format (scale-vector banks on disk) is refused by the load path in one line that names
the converter; `python -m scripts.convert_checkpoint` rewrites it under the reference's names, keeps the original in
set_aside/, and the same command then resumes with every tensor as it was saved."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import train
from config import load_saved_config
from model.llama import Llama
from runtime.checkpoint import checkpoint_tensors, complete_checkpoints, damaged_files, read_marker
from runtime.checkpoint_files import CHECKSUMS, file_crc32
from runtime.checkpoint_convert import legacy_banks
from scripts import convert_checkpoint
from train_harness import args_for, data_dir, records  # noqa: F401


def _to_banks(step_dir: Path, model: Llama) -> None:
    """Rewrite a checkpoint's DCP files as the older format laid them out: each block's vectors joined into one bank
    per role and kind, the optimizer's state and groups alike (the checksums then rewritten to match)."""
    state = torch.load(_flat(step_dir), weights_only=False)
    for bank, members in legacy_banks(model).items():
        names = [n for n, _, _ in members]
        state["model"][bank] = torch.cat([state["model"].pop(n).reshape(-1) for n in names])
        per = [state["optim"]["state"].pop(n) for n in names]
        state["optim"]["state"][bank] = {k: torch.cat([p[k].reshape(-1) for p in per]) if v.ndim else v
                                         for k, v in per[0].items()}
        for g in state["optim"]["param_groups"]:
            if names[0] in g["params"]:
                g["params"] = [p for p in g["params"] if p not in names] + [bank]
    for f in [*step_dir.glob("*.distcp"), step_dir / ".metadata"]:
        f.unlink()
    dcp.save(state, checkpoint_id=step_dir, no_dist=True)
    names = [p.name for p in step_dir.glob("__*.distcp")] + [".metadata", "extra.pt", "rng_rank0.pt"]
    sums = {n: [(step_dir / n).stat().st_size, file_crc32(step_dir / n)] for n in names}
    (step_dir / CHECKSUMS.format(0)).write_text(json.dumps({"crc32": sums}))


def _flat(step_dir: Path) -> Path:
    checkpoint_tensors(step_dir)  # writes <step dir>.pt beside it
    return step_dir.parent / f"{step_dir.name}.pt"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_banked_checkpoint_is_converted_once_and_resumes(data_dir, tmp_path, capsys):
    argv = args_for(data_dir, tmp_path, "old", "train.ckpt_every=2", "train.keep_ckpts=5")
    train.main(["--stop-at-step", "2", *argv])
    run = tmp_path / "old"
    (_, step_dir), = complete_checkpoints(run / "checkpoints")
    saved = checkpoint_tensors(step_dir)
    _flat(step_dir).unlink()
    cfg = load_saved_config(run / "config.yaml")
    with torch.device("meta"):
        model = Llama(cfg.model)
    _to_banks(step_dir, model)
    _flat(step_dir).unlink()
    assert not damaged_files(step_dir)
    capsys.readouterr()
    assert train.cli(argv) == 2  # refused in one line, before any step
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "scripts.convert_checkpoint" in err and "banks" in err, err
    assert len(records(run, "train")) == 2

    assert convert_checkpoint.main([str(run)]) == 0
    assert (run / "checkpoints" / "set_aside" / f"{step_dir.name}.banks").is_dir()
    assert not damaged_files(step_dir) and read_marker(step_dir)["step"] == 2
    converted = checkpoint_tensors(step_dir)
    assert converted.keys() == saved.keys()
    assert all(torch.equal(converted[k], saved[k]) for k in saved)  # weights, moments and steps, bit for bit
    assert convert_checkpoint.main([str(step_dir)]) == 0 and "already" in capsys.readouterr().out

    train.main(argv)  # the same command resumes
    assert [r["step"] for r in records(run, "train")] == [1, 2, 3, 4, 5, 6]


def test_the_masked_decay_group_of_the_older_format_is_split_by_the_mask():
    """An older run with optim.scale_wd_invariant=false held a bank of β partly spared in adamw/decay_masked: its
    vectors join adamw/no_decay (the spared β) or adamw/decay (the router's), and the group goes."""
    from runtime.checkpoint_convert import _split
    banks = {"layers.0.scales.input.beta": [("layers.0.mlp.router.in_scale.beta", (0, 1), (1,)),
                                            ("layers.0.attn.q_proj.in_scale.beta", (1, 2), (1,))]}
    state = {"model": {"layers.0.scales.input.beta": torch.tensor([1.0, 2.0])},
             "optim": {"state": {"layers.0.scales.input.beta": {"exp_avg": torch.tensor([3.0, 4.0]),
                                                                "step": torch.tensor(5.0)}},
                       "param_groups": [{"name": "adamw/decay", "params": ["w"]},
                                        {"name": "adamw/no_decay", "params": ["norm.scale.beta"]},
                                        {"name": "adamw/decay_masked", "params": ["layers.0.scales.input.beta"]}]}}
    _split(state, banks, {"layers.0.attn.q_proj.in_scale.beta", "norm.scale.beta"})
    groups = {g["name"]: g["params"] for g in state["optim"]["param_groups"]}
    assert groups == {"adamw/decay": ["w", "layers.0.mlp.router.in_scale.beta"],
                      "adamw/no_decay": ["norm.scale.beta", "layers.0.attn.q_proj.in_scale.beta"]}
    assert state["model"]["layers.0.attn.q_proj.in_scale.beta"].item() == 2.0
    assert state["optim"]["state"]["layers.0.mlp.router.in_scale.beta"]["exp_avg"].item() == 3.0

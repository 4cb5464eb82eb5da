"""A design of its own, written in the reference model alone (model/), trains through train.py with the fast path off,
and is refused in one line with it on: the fast package is not touched (docs/design.md, "The fast path")."""
from __future__ import annotations

import torch

import train
from model.scaling import GroupLayout
from test_fast import ToyVector, toy_input_vector  # noqa: F401
from train_harness import args_for, data_dir, final_params, records  # noqa: F401


def test_a_new_design_in_the_reference_alone_trains_with_the_fast_path_off(data_dir, tmp_path, monkeypatch,
                                                                           capsys):
    """A toy vector design added to the reference model (model/) only: train.py trains it with train.fast_path=false,
    its vectors learn and land on disk under its own names; with the fast path on, the run stops before any work
    with one line naming the module and the switch."""
    monkeypatch.setattr(GroupLayout, "input_vector", toy_input_vector)
    dp = ("model.scale.placement=dp", "model.scale.reparam=direct", "model.scale.invariant_magnitude=keep")
    argv = args_for(data_dir, tmp_path, "toy", *dp, "train.fast_path=false", "train.steps=4", "train.eval_every=4")
    train.main(argv)
    recs = records(tmp_path / "toy", "train")
    assert len(recs) == 4 and all(torch.isfinite(torch.tensor(r["loss"])) for r in recs)
    toy = final_params(tmp_path / "toy", argv)["layers.0.attn.q_proj.in_scale.weight"]  # the toy model reads it
    assert not torch.equal(toy, torch.ones_like(toy))  # it learned
    capsys.readouterr()
    assert train.cli(args_for(data_dir, tmp_path, "toy-fast", *dp, "train.steps=4")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "ToyVector" in err and "train.fast_path=false" in err, err
    assert not (tmp_path / "toy-fast" / "metrics.jsonl").exists()



"""repro.magnitudes on a 3-step unified run: every input-side vector under an inner Norm is listed (each branch's
v, the LM head's γ), Adam's ratio is the checkpoint's bias-corrected moments, and the Norm input's mean square is
what a forward gives."""
from __future__ import annotations

import re

import torch
from test_train import data_dir  # noqa: F401 - a fixture
from train_harness import args_for

import train
from repro import magnitudes


def test_magnitudes_of_a_unified_run(data_dir, tmp_path, capsys):  # noqa: F811
    train.main(args_for(data_dir, tmp_path, "u", "train.steps=3", "schedule.warmup_steps=1", "train.eval_every=100",
                        "train.ckpt_every=3"))
    capsys.readouterr()
    assert magnitudes.main([str(tmp_path / "u"), "--tokens", "256"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| layers.") or line.startswith("| norm |")]
    names = [r.split(" | ")[0][2:] for r in rows]
    assert names == [f"layers.{i}.{b}" for i in range(2) for b in ("attn.q_proj", "attn.k_proj", "attn.v_proj",
                                                                   "mlp.gate_proj", "mlp.up_proj")] + ["norm"]
    # Adam's ratio for layer 0's q_proj β, from the checkpoint by hand: 3 steps, betas (0.9, 0.95)
    from runtime.checkpoint import checkpoint_tensors, latest_checkpoint
    flat = checkpoint_tensors(latest_checkpoint(tmp_path / "u" / "checkpoints"))
    state = ".optim.state.layers.0.scales.input.beta."
    m = flat[state + "exp_avg"].double()[0] / (1 - 0.9 ** 3)
    v = flat[state + "exp_avg_sq"].double()[0] / (1 - 0.95 ** 3)
    assert f"| {(m / (v.sqrt() + 1e-8)).item():+.2f} |" in rows[0]
    for r in rows:
        med, low, eps, frac = (float(x) for x in re.search(r"\| ([\d.e+-]+), ([\d.e+-]+) \| ([\d.e+-]+) \| "
                                                            r"([\d.e+-]+) \|$", r).groups())
        assert 0 < low <= med and eps == 1e-5 and abs(frac - eps / med) <= 1e-2 * frac  # 3 digits each
    assert torch.isfinite(torch.tensor(float(rows[-1].split(" | ")[1])))

"""repro.magnitudes on a 3-step unified run: every input-side vector under an inner Norm is listed (each branch's
v, the LM head's γ), Adam's ratio is the checkpoint's bias-corrected moments, and the Norm input's mean square is
what a forward gives."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from test_train import data_dir  # noqa: F401 - a fixture
from train_harness import args_for

import train
from repro import magnitudes


@pytest.fixture(scope="module")
def unified_run(data_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("magnitudes")
    train.main(args_for(data_dir, out, "u", "train.steps=3", "schedule.warmup_steps=1", "train.eval_every=100",
                        "train.ckpt_every=3", "model.scale.invariant_magnitude=keep"))  # the paper's magnitudes
    return out


def test_magnitudes_of_a_unified_run(unified_run, capsys):
    tmp_path = unified_run
    capsys.readouterr()
    assert magnitudes.main([str(tmp_path / "u"), "--tokens", "256", "--batches", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| layers.") or line.startswith("| norm |")]
    names = [r.split(" | ")[0][2:] for r in rows]
    assert names == [f"layers.{i}.{b}" for i in range(2) for b in ("attn.q_proj", "attn.k_proj", "attn.v_proj",
                                                                   "mlp.gate_proj", "mlp.up_proj")] + ["norm"]
    # Adam's ratio for layer 0's q_proj β, from the checkpoint by hand: 3 steps, betas (0.9, 0.95)
    from runtime.checkpoint import checkpoint_tensors, latest_checkpoint
    flat = checkpoint_tensors(latest_checkpoint(tmp_path / "u" / "checkpoints"))
    state = ".optim.state.layers.0.attn.q_proj.in_scale.beta."
    m = flat[state + "exp_avg"].double()[0] / (1 - 0.9 ** 3)
    v = flat[state + "exp_avg_sq"].double()[0] / (1 - 0.95 ** 3)
    assert f"| {(m / (v.sqrt() + 1e-8)).item():+.2f} |" in rows[0]
    for r in rows:
        med, low, eps, frac, ratio, rms, err32, err16 = (float(x) for x in re.search(
            r"\| ([\d.e+-]+), ([\d.e+-]+) \| ([\d.e+-]+) \| ([\d.e+-]+) \| ([\d.e+-]+) \| ([\d.e+-]+) \| "
            r"([\d.e+-]+) \| ([\d.e+-]+) \|$", r).groups())
        assert 0 < low <= med and eps == 1e-5 and abs(frac - eps / med) <= 1e-2 * frac  # 3 digits each
        assert -1 <= ratio <= 1 and rms > 0 and 0 <= err32 < err16  # bf16 rounds 2¹⁶ times coarser than fp32
    assert torch.isfinite(torch.tensor(float(rows[-1].split(" | ")[1])))


def test_the_gradient_columns_are_the_loss_gradient_in_float64(unified_run):
    """beta_grads in float64 is ∂L/∂β of the next-token loss: a central difference in the LM head's β agrees. Its
    error: truncation h²·|L‴|/6, which measured a relative 2e-6 at h = 1e-3 (so about 2e-8 at h = 1e-4), and rounding
    u₆₄·L/h ≈ 1e-16 · 6 / 1e-4 = 6e-12 absolute, against a gradient near 2e-4. A wrong entry, dtype or loss misses
    the 1e-5 relative bound by orders of magnitude."""
    from config import resolve_vocab
    from data.shards import load_meta
    from runs import load_run
    from runtime.checkpoint import latest_checkpoint, load_model_weights
    run_dir = Path(unified_run) / "u"
    cfg = load_run(run_dir).cfg
    model = magnitudes.Llama(resolve_vocab(cfg, n_vocab=load_meta(cfg.data.dir).tokenizer["n_vocab"])).double()
    load_model_weights(model, latest_checkpoint(run_dir / "checkpoints"))
    batch = magnitudes.training_batches(cfg, 1)[0]
    grad = magnitudes.beta_grads(model, [batch])["norm"][0, 0].item()
    beta, entries = magnitudes.beta_entries(next(s for s in magnitudes.sites(model) if s.name == "norm").vector)
    first = entries.start or 0  # the entry beta_grads reports first

    def loss_at(shift: float) -> float:
        with torch.no_grad():
            beta.view(-1)[first] += shift
            logits = model(batch[:, :-1])
            value = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()
            beta.view(-1)[first] -= shift
        return value

    h = 1e-4
    fd = (loss_at(h) - loss_at(-h)) / (2 * h)
    assert grad != 0 and abs(fd - grad) <= 1e-5 * abs(grad) + 1e-11, (fd, grad)

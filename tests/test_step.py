"""The training step itself (runtime/trainer.py, `Trainer.step`), built on fixed batches in this process: no run
directory, no subprocess. Held to a step written out here with torch's own pieces: the model's loss over the whole
global batch, its gradient, the norm and clip, and torch.optim.AdamW with the groups IWD gives."""
from __future__ import annotations

import pytest
import torch

from config import load_config
from fast.banks import reference_parameters
from model.llama import build_model
from optim import decays
from optim.schedule import lr_at
from runtime.dist import init_distributed, shutdown
from runtime.trainer import FixedBatches, Trainer

VOCAB, SEQ, STEPS = 64, 16, 3


@pytest.fixture(scope="module")
def dist_info():
    """A one-rank process group in this process (FSDP2 needs one), torn down after the module."""
    di = init_distributed("cpu")
    yield di
    shutdown(di)


def tiny(preset: str, *extra: str):
    cfg = load_config(["configs/base.yaml", f"configs/scale/{preset}.yaml"], [
        "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.d_ffn=64", f"model.vocab_size={VOCAB}",
        f"data.seq_len={SEQ}", "train.global_batch=8", "train.micro_batch=4", f"train.steps={STEPS + 2}",
        "schedule.warmup_steps=1", "optim.lr=3e-3", "optim.grad_clip=0.5", "train.dtype=float64",
        "train.compile=false", "train.device=cpu", "train.loss_chunk_tokens=24", *extra])
    return cfg


def batches(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = torch.randint(0, VOCAB, (4, SEQ + 1), generator=gen)
        out.append((t[:, :-1], t[:, 1:]))
    return out


def reference_steps(cfg, data: list, steps: int) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """The step written out: mean loss over the global batch (both micro-batches at once, full logits), backward,
    clip as torch's clip_grad_norm_ does (norm in fp32, coef = min(1, c / (norm + 1e-6))), AdamW with each
    parameter's decay by role (docs/paper.md §1.7) and the schedule's lr."""
    model = build_model(cfg.model, seed=cfg.train.seed, dtype=torch.float64)
    roles, o = model.param_roles(), cfg.optim
    groups = {True: [], False: []}
    for name, p in model.named_parameters():
        groups[decays(name, roles[name], o.scale_weight_decay, o.scale_wd_alpha)].append(p)
    opt = torch.optim.AdamW([{"params": groups[True], "weight_decay": o.weight_decay},
                             {"params": groups[False], "weight_decay": 0.0}],
                            lr=o.lr, betas=tuple(o.betas), eps=o.eps, foreach=False)
    losses, norms = [], []
    for step in range(steps):
        (x0, y0), (x1, y1) = data[2 * step % len(data)], data[(2 * step + 1) % len(data)]
        loss = model(torch.cat([x0, x1]), torch.cat([y0, y1]), loss_chunk=0)
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).float()
        coef = torch.clamp(o.grad_clip / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.train.steps, o.lr, cfg.schedule)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        norms.append(norm.item())
    return losses, norms, {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("fast_path", [True, False])
@pytest.mark.parametrize("preset", ["baseline", "unified"])
def test_the_step_is_the_written_out_step(dist_info, preset, fast_path):
    """Two micro-batches accumulated, the chunked head (the fast path's fused one, or the reference's), FSDP2's one
    shard, the fused AdamW and the clip: the same numbers as the plain step to float64 rounding. Tolerance: sums of ≤ 10³ terms at u₆₄ ≈ 1e-16 differ in
    order (chunks, accumulation, fused vs per-parameter AdamW) by ~1e-13 relative, which Adam's normalized update
    does not amplify over 3 steps; 1e-9 leaves room, and a wrong lr, decay or clip moves these by ≥ 1e-4."""
    cfg = tiny(preset, f"train.fast_path={str(fast_path).lower()}")
    data = batches(4)
    trainer = Trainer(cfg, dist_info, FixedBatches(data))
    assert ("scales" in dict(trainer.model.layers[0].named_children())) == fast_path  # banks: the fast path
    got_losses, got_norms = [], []
    for _ in range(STEPS):
        out = trainer.step()
        got_losses.append(out.losses[0].item())
        got_norms.append(out.grad_norm.item())
    losses, norms, params = reference_steps(cfg, data, STEPS)
    assert got_losses == pytest.approx(losses, rel=1e-9, abs=0)
    assert got_norms == pytest.approx(norms, rel=1e-6, abs=0)  # the norm is reported in fp32, as torch's
    assert norms[0] > cfg.optim.grad_clip  # the clip acted
    mine = reference_parameters(trainer.model)  # the fast path's banks by their vectors' names
    assert mine.keys() == params.keys()
    for name, p in mine.items():
        torch.testing.assert_close(p, params[name], rtol=1e-9, atol=1e-12, msg=name)


def test_grad_reduce_each_micro_batch_is_the_same_step(dist_info):
    """train.grad_reduce: micro_batch reduce-scatters after every micro-batch instead of once per step: on one rank
    the same gradients, so the same step."""
    data = batches(4, seed=1)
    outs = {}
    for how in ("step", "micro_batch"):
        trainer = Trainer(tiny("hg_dp", f"train.grad_reduce={how}"), dist_info, FixedBatches(data))
        outs[how] = [trainer.step().losses[0].item() for _ in range(STEPS)]
    assert outs["step"] == pytest.approx(outs["micro_batch"], rel=1e-12, abs=0)

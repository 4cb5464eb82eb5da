"""Optimizers and lr schedules: parameter roles → groups (IWD, docs/paper.md §1.7) → AdamW + Muon (docs/paper.md §3.1–3.2),
with lr schedules as pure functions (docs/paper.md §3.1, §3.3).

The trainer's whole use:
    opt = build_optimizer(model, model.param_roles(), cfg.optim, fused=True)
    ...
    set_lr(opt, lr_at(step, cfg.train.steps, cfg.optim.lr, cfg.schedule))
    norm = clip_grad_norm(model.parameters(), cfg.optim.grad_clip)
    opt.step(); opt.zero_grad(set_to_none=True)
and DCP's get_/set_optimizer_state_dict(model, opt) for checkpoints (see optim/hybrid.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

import torch

from model.config import Role
from optim.clip import clip_grad_norm, grad_norm
from optim.groups import decays, group_summary, param_groups
from optim.hybrid import HybridOptimizer
from optim.muon import Muon, zeropower_via_newtonschulz
from optim.schedule import lr_at

if TYPE_CHECKING:
    from optim.config import OptimConfig

__all__ = [
    "HybridOptimizer", "Muon", "build_optimizer", "clip_grad_norm", "decays", "grad_norm", "group_summary",
    "lr_at", "param_groups", "set_lr", "zeropower_via_newtonschulz",
]


def build_optimizer(
    model: torch.nn.Module, roles: Mapping[str, Role | str], cfg: OptimConfig, fused: bool = False,
    invariant: Optional[set[str]] = None,
) -> HybridOptimizer:
    """One optimizer for the whole model: Muon on the block matrices when cfg.name == "muon", AdamW elsewhere.

    Call after FSDP2 wrapping (parameters must be the DTensors the forward uses; names are unchanged by
    fully_shard). `fused=True` selects torch's fused AdamW kernel (CUDA and CPU; the trainer always asks for
    it, for its device-side `found_inf` skip); numerics match the foreach path to rounding. Each group has "name",
    "kind", "lr", "initial_lr" (the peak, cfg.lr) and "lr_scale" (1.0): `set_lr` writes lr · lr_scale. A model
    with zero-padded weights (Llama's `logical_shapes`) gives Muon their unpadded shapes for its update scale.
    `invariant`: the parameters that hold only magnitudes no gradient reaches (param_groups); None: the model's
    own `invariant_magnitudes()`, where it has them.
    """
    logical = model.logical_shapes() if hasattr(model, "logical_shapes") else {}
    if invariant is None and hasattr(model, "invariant_magnitudes"):
        invariant = model.invariant_magnitudes()
    groups = param_groups(model.named_parameters(), roles, cfg, logical, invariant)
    supported = all(p.device.type in ("cuda", "cpu") for g in groups if g["kind"] == "adamw" for p in g["params"])
    return HybridOptimizer(groups, fused=fused and supported)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Write the scheduled lr into every group (times the group's lr_scale, 1.0 unless a caller changed it)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)

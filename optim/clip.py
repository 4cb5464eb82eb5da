"""Global gradient-norm clipping that is correct under FSDP2 (docs/paper.md §3.1: clip at 1.0).

Under FSDP2 every gradient is a DTensor sharded on dim 0. `torch.nn.utils.get_total_norm` over DTensors returns
a DTensor holding a *partial* norm; `full_tensor()` all-reduces it into the true global norm, the same on every
rank, and `clip_grads_with_norm_` then scales each local shard by the same factor (torchtitan does the same).
Plain tensors (one process, or parameters FSDP2 did not wrap, which every rank holds whole) are normed
separately and combined, so a model may mix the two.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor


def grad_norm(params: Iterable[Tensor]) -> Tensor:
    """The global L2 norm of the gradients of `params` (None grads skipped): a plain 0-dim fp32 tensor."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    sharded = [g for g in grads if isinstance(g, DTensor)]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    squares = []
    if sharded:
        norm = torch.nn.utils.get_total_norm(sharded, norm_type=2.0)
        squares.append(norm.full_tensor().float().square() if isinstance(norm, DTensor) else norm.float().square())
    if plain:
        squares.append(torch.nn.utils.get_total_norm(plain, norm_type=2.0).float().square())
    device = grads[0].device
    return torch.stack([s.to(device) for s in squares]).sum().sqrt()


def clip_grad_norm(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale all gradients so their global L2 norm is at most `max_norm` (0 disables); return the norm before
    clipping as a plain 0-dim tensor, the same on every rank. A tensor, not a float, so the caller decides when
    to synchronize with the device (`float(norm)` for logging and the non-finite check)."""
    params = [p for p in params if p.grad is not None]
    total = grad_norm(params)
    if max_norm > 0 and params:
        # clip_grads_with_norm_ computes clamp(max_norm / (total + 1e-6), max=1) and multiplies each grad in
        # place; a non-finite total makes every grad non-finite, which the trainer's guard then catches.
        sharded = [p for p in params if isinstance(p.grad, DTensor)]
        plain = [p for p in params if not isinstance(p.grad, DTensor)]
        for group in (sharded, plain):
            if group:
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total.to(group[0].grad.device))
    return total

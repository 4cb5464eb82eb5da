"""Global gradient-norm clipping that is correct under FSDP2 (docs/paper.md §3.1: clip at 1.0), over local shards.

Under FSDP2 every gradient is a DTensor sharded on dim 0 of a 1-D mesh. The global norm is the square root of the
sum, over ranks, of each rank's sum of squares of its shards: each rank takes the norm of its local shards in one
multi-tensor call (`torch.nn.utils.get_total_norm` on plain tensors: `torch._foreach_norm` per device and dtype),
squares it, and one all-reduce over the mesh's process group adds the ranks. Clipping scales the local shards in
place, one `torch._foreach_mul_` per device and dtype — the arithmetic of `torch.nn.utils.clip_grads_with_norm_`.
The DTensor route (get_total_norm on DTensors, then `full_tensor()`, which torchtitan takes) computes the same sums
but dispatches each tensor through DTensor, which a design with many small tensors (OR's α and β) pays per tensor. Plain tensors (one process, or parameters FSDP2 did not wrap, which every rank holds whole) are normed
separately and not reduced; a DTensor with any other layout takes the DTensor route.
"""
from __future__ import annotations

import functools
from typing import Iterable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor


def _sharded_on_one_dim(g: Tensor) -> bool:
    """A DTensor whose shards add up to the whole: a 1-D mesh and a Shard placement (FSDP2's layout)."""
    return isinstance(g, DTensor) and g.device_mesh.ndim == 1 and g.placements[0].is_shard()


def _local_grads(params: Iterable[Tensor]) -> tuple[dict, list[Tensor], list[Tensor]]:
    """The gradients of `params` (None skipped): {mesh: local shards} for FSDP2's layout, the plain tensors, and the
    parameters whose gradient is a DTensor of any other layout."""
    sharded: dict = {}
    plain, other = [], []
    for p in params:
        g = p.grad
        if g is None:
            continue
        if _sharded_on_one_dim(g):
            sharded.setdefault(g.device_mesh, []).append(g.to_local())
        elif isinstance(g, DTensor):
            other.append(p)
        else:
            plain.append(g)
    return sharded, plain, other


def _squared(norm: Tensor) -> Tensor:
    """norm², in its dtype but at least fp32: an fp64 run's ranks add fp64 partial sums, so the norm on 1 rank and
    on 2 differs by fp64 rounding, not by an fp32 rounding of each rank's part."""
    return norm.to(torch.promote_types(norm.dtype, torch.float32)).square()


def _total(sharded: dict, plain: list[Tensor], other: list[Tensor]) -> Tensor:
    squares = []
    for mesh, local in sharded.items():
        sq = _squared(torch.nn.utils.get_total_norm(local, norm_type=2.0))
        dist.all_reduce(sq, group=mesh.get_group())  # Σ over ranks of each rank's Σ of squares
        squares.append(sq)
    if plain:
        squares.append(_squared(torch.nn.utils.get_total_norm(plain, norm_type=2.0)))
    if other:
        norm = torch.nn.utils.get_total_norm([p.grad for p in other], norm_type=2.0)
        squares.append(_squared(norm.full_tensor() if isinstance(norm, DTensor) else norm))
    if not squares:
        return torch.zeros(())
    device, dtype = squares[0].device, functools.reduce(torch.promote_types, (s.dtype for s in squares))
    return torch.stack([s.to(device, dtype) for s in squares]).sum().sqrt().float()


def grad_norm(params: Iterable[Tensor]) -> Tensor:
    """The global L2 norm of the gradients of `params` (None grads skipped): a plain 0-dim fp32 tensor, the same on
    every rank, summed in the gradients' dtype (at least fp32)."""
    return _total(*_local_grads(params))


def clip_grad_norm(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale all gradients so their global L2 norm is at most `max_norm` (0 disables); return the norm before
    clipping as a plain 0-dim tensor, the same on every rank. A tensor, not a float, so the caller decides when
    to synchronize with the device (`float(norm)` for logging and the non-finite check)."""
    sharded, plain, other = _local_grads(params)
    total = _total(sharded, plain, other)
    if max_norm > 0:
        # clamp(max_norm / (total + 1e-6), max=1), as clip_grads_with_norm_ computes it, multiplied into every
        # gradient in place; a non-finite total makes every grad non-finite, which the trainer's guard then catches.
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        by_kind: dict[tuple, list[Tensor]] = {}
        for g in [g for local in sharded.values() for g in local] + plain:
            by_kind.setdefault((g.device, g.dtype), []).append(g)
        for (device, _), grads in by_kind.items():
            torch._foreach_mul_(grads, coef.to(device))
        if other:
            torch.nn.utils.clip_grads_with_norm_(other, max_norm, total)
    return total

"""Muon for the matrices inside the blocks (docs/paper.md §3.2), with FSDP2 (DTensor) support.

Per matrix W ∈ R^{m×n} with gradient G, each step (Keller Jordan's Muon + Moonlight's scaling):
    B ← μ·B + (1 − μ)·G                          momentum, μ = 0.95
    U ← (1 − μ)·G + μ·B  (Nesterov)  or  B       docs/paper.md §3.2: "Nesterov momentum 0.95"
    O ← NS₅(U)                                    5 quintic Newton–Schulz steps in bf16,
                                                  (a, b, c) = (3.4445, −4.7750, 2.0315)
    W ← W·(1 − lr·wd)                             decoupled weight decay, wd 0.1 (docs/paper.md §3.2)
    W ← W − lr·s(m, n)·O                          s = 0.2·√max(m, n) (Moonlight: update RMS ≈ AdamW's, so AdamW's
                                                  lr and wd carry over) or √max(1, m/n) (Keller Jordan's)
(m, n) is the LOGICAL shape (the group's "logical_shapes", parallel to "params"): a matrix stored zero-padded (an FFN
hidden, model.ffn_pad_multiple) is scaled as its unpadded self; its zero gradient rows/columns stay exactly zero
through Newton–Schulz (each iterate p(XXᵀ)·X keeps X's zero rows and columns), so its update is the unpadded one's.
`lr` is read from the param group at every step, so the schedule works by writing group["lr"].

Why not just torch.optim.Muon: torch ≥ 2.9 has exactly this math (the same EMA-form momentum, `adjust_lr_fn`
"match_rms_adamw" = Moonlight, "original" = Jordan) and tests/test_muon.py proves ours equal to it, but it runs
Newton–Schulz on whatever tensor it is handed. Under FSDP2 that is a DTensor whose local part is a row shard; an
orthogonalized shard is not the shard of the orthogonalized matrix. Here a DTensor update is gathered whole
(`full_tensor()`), orthogonalized, and each rank keeps its own rows (`distribute_tensor(..., src_data_rank=None)`
slices locally, no communication). It also takes stacked 3-D weights (MoE experts), orthogonalized per matrix,
and never writes into a bf16 gradient (torch's `div_` would when the gradient already is bf16).

Cost under FSDP2 with N ranks, `distributed: false` (the reference path): one all-gather of U per matrix per step
(full fp32 matrices to every rank) and N-fold redundant Newton–Schulz work (every rank orthogonalizes every matrix).
Distributed Muon (`distributed: true`, the default) gives each matrix one owner rank instead: optim/muon_dist.py.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

from optim.muon_dist import (EXCHANGE_BUCKET_ELEMENTS, orthogonalize_exchange, orthogonalize_local, plan_buckets,
                             split_dims)

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's / Moonlight's quintic (docs/paper.md §3.2)
UPDATE_SCALES = ("moonlight", "jordan")


def zeropower_via_newtonschulz(
    grad: Tensor, coefficients: tuple[float, float, float] = NS_COEFFICIENTS, steps: int = 5, eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """≈ U·Vᵀ for grad = U·S·Vᵀ, in bf16; [..., m, n] → [..., m, n]. The quintic trades exactness for speed: it
    maps singular values to roughly 0.7–1.2 rather than exactly 1, which Keller Jordan found harmless.

    The same operations, in the same order, as torch.optim.Muon's, so 2-D results agree bit for bit; leading
    dimensions are a batch of independent matrices (stacked MoE experts).
    """
    if grad.ndim < 2:
        raise ValueError(f"Newton–Schulz needs a matrix, got shape {tuple(grad.shape)}")
    a, b, c = coefficients
    shape = grad.shape
    x = grad.to(dtype)  # bf16 by default; float32 for reference runs
    if x.ndim > 3:
        x = x.reshape(-1, *shape[-2:])
    transposed = shape[-2] > shape[-1]  # iterate on the wide side: the Gram matrix is min(m, n)²
    if transposed:
        x = x.mT
    # Frobenius norm ≥ spectral norm, so this puts every singular value in [0, 1].
    norm = x.norm() if x.ndim == 2 else x.norm(dim=(-2, -1), keepdim=True)
    x = x / norm.clamp(min=eps)
    mm = torch.addmm if x.ndim == 2 else torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT  # [.., k, k], k = min(m, n)
        x = mm(x, mm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # a·X + (b·A + c·A²)·X
    if transposed:
        x = x.mT
    return x.reshape(shape)


def update_scale(shape: torch.Size | tuple[int, ...], kind: str) -> float:
    """The per-matrix lr multiplier for a (stack of) m×n matrices; `shape` is the GLOBAL shape."""
    m, n = shape[-2], shape[-1]
    if kind == "moonlight":
        return 0.2 * math.sqrt(max(m, n))
    if kind == "jordan":
        return math.sqrt(max(1.0, m / n))
    raise ValueError(f"unknown Muon update_scale {kind!r}; expected one of {UPDATE_SCALES}")


class NSSpec(NamedTuple):
    """One param group's Newton–Schulz settings."""
    coefficients: tuple[float, float, float]
    steps: int
    eps: float
    dtype: torch.dtype

    def __call__(self, x: Tensor, log: Optional[list[tuple[int, ...]]] = None) -> Tensor:
        if log is not None:
            log.append(tuple(x.shape))
        return zeropower_via_newtonschulz(x, self.coefficients, self.steps, self.eps, self.dtype)


def orthogonalize(update: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.bfloat16, log: Optional[list[tuple[int, ...]]] = None) -> Tensor:
    """Newton–Schulz on the whole matrix, also when `update` is a sharded DTensor: the reference path (see the module
    docstring); `log` collects the shapes this rank orthogonalizes."""
    spec = NSSpec(coefficients, steps, eps, dtype)
    if isinstance(update, DTensor):
        # all-gather: [m, n] on every rank. Contiguous: torch 2.11 returns a column-sharded (Shard(1)) matrix with
        # uneven shards as a strided view of its padded gather, and NS on a strided input reduces in another order
        # (1 ulp apart from the exchange path, which concatenates into a contiguous matrix).
        full = update.full_tensor().contiguous()
        ortho = spec(full, log)
        # src_data_rank=None: every rank slices its own shard from its own copy, no scatter. Each row lives on
        # one rank only, so the copies need not even agree bit for bit (they do: same kernels, same input); with a
        # Replicate mesh dimension (HSDP) they must, which the same-kernels argument gives.
        return distribute_tensor(ortho, update.device_mesh, update.placements, src_data_rank=None)
    return spec(update, log)


# ---------------------------------------------------------------------------------------------- the optimizer


def momentum_update(grad: Tensor, momentum_buffer: Tensor, momentum: float, nesterov: bool,
                    keep: Optional[Tensor] = None) -> Tensor:
    """B ← μB + (1−μ)G in place; returns U = (1−μ)G + μB (Nesterov) or B.

    `keep` (a 0-dim float tensor on the device, 1 or 0): 0 makes this a no-op on B without reading the flag on the
    host — G is replaced by 0 (it may be NaN) and the lerp weight is 0·(1−μ), so B + 0·(0 − B) = B exactly. With 1
    the values are those of the path without `keep`, bit for bit (tests/test_optim_hybrid.py): the weight is the
    same fp32 number and the lerp kernel the same formula."""
    if keep is None:
        momentum_buffer.lerp_(grad, 1 - momentum)
        return grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer
    grad = torch.where(keep > 0, grad, 0.0)
    momentum_buffer.lerp_(grad, keep * (1 - momentum))
    return grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer


def apply_update(param: Tensor, ortho: Tensor, lr: float, weight_decay: float, update_scale_kind: str,
                 shape: Optional[Sequence[int]] = None, keep: Optional[Tensor] = None) -> None:
    """W ← W·(1 − lr·wd) − lr·s(m, n)·O, in place; (m, n) from `shape` (the logical one) or else param.shape.

    `keep` (0-dim, 1 or 0, on the device): 0 leaves W exactly as it is — the decay factor is 1 − 0·lr·wd = 1 and O·0 = 0
    (O is finite: momentum_update zeroed the gradient) — with no host read. With 1 the numbers are the plain path's:
    the factor is computed in float64 as Python computes 1 − lr·wd, and O·1 = O."""
    alpha = -lr * update_scale(param.shape if shape is None else shape, update_scale_kind)
    if keep is None:
        param.mul_(1 - lr * weight_decay)
        param.add_(ortho, alpha=alpha)
        return
    param.mul_(1 - keep.double() * (lr * weight_decay))
    param.add_(ortho * keep.to(ortho.dtype), alpha=alpha)


def logical_shape(group: dict[str, Any], param: Tensor) -> tuple[int, ...]:
    """The global shape whose update scale `param` takes: the group's "logical_shapes" entry for it (a zero-padded
    matrix's unpadded shape), else its own."""
    for q, shape in zip(group["params"], group.get("logical_shapes") or ()):
        if q is param:
            return tuple(shape)
    return tuple(param.shape)


class Muon(torch.optim.Optimizer):
    """Muon over ≥2-D parameters; state per parameter is {"momentum_buffer"}, as in torch.optim.Muon.

    Defaults follow docs/paper.md §3.2 (Nesterov 0.95, wd 0.1, 5 NS steps, Moonlight scaling). Param groups may carry
    extra keys (name, kind, lr_scale, initial_lr); HybridOptimizer (optim/hybrid.py) drives this class as its Muon
    engine over its own groups and state. `distributed` (per group) turns on distributed Muon for DTensors
    (optim/muon_dist.py); `ns_shapes` lists the shapes this rank orthogonalized in the last step (telemetry, tests).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        ns_steps: int = 5,
        eps: float = 1e-7,
        update_scale: str = "moonlight",
        ns_dtype: str = "bfloat16",
        distributed: bool = True,
    ) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1:
            raise ValueError(f"Muon: need lr ≥ 0, weight_decay ≥ 0, momentum in [0, 1); got {lr}, "
                             f"{weight_decay}, {momentum}")
        if update_scale not in UPDATE_SCALES or len(ns_coefficients) != 3 or not 0 < ns_steps < 100:
            raise ValueError(f"Muon: bad update_scale {update_scale!r}, ns_coefficients {ns_coefficients} or "
                             f"ns_steps {ns_steps}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), ns_steps=ns_steps, eps=eps, update_scale=update_scale,
                        ns_dtype=ns_dtype, distributed=distributed)
        super().__init__(params, defaults)
        self.ns_shapes: list[tuple[int, ...]] = []
        self.bucket_elements = EXCHANGE_BUCKET_ELEMENTS  # per rank and exchange bucket (plan_buckets)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(f"Muon takes matrices (≥ 2-D); got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None, found_inf: Optional[Tensor] = None
             ) -> Optional[float]:
        """`found_inf`: a 0-dim float tensor on the device; nonzero makes the whole step a no-op (momentum and
        weights untouched) without a host read — the contract of fused AdamW's found_inf, which train.py passes to
        both engines (optim/hybrid.py)."""
        keep = None if found_inf is None else 1.0 - found_inf.float().clamp(0, 1)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [(p, g) for g in self.param_groups for p in g["params"] if p.grad is not None]
        specs = [NSSpec(tuple(g["ns_coefficients"]), g["ns_steps"], g["eps"], getattr(torch, g.get("ns_dtype",
                 "bfloat16"))) for _, g in work]
        flags = [bool(g.get("distributed", True)) for _, g in work]
        self.ns_shapes = []
        # Per batch: momentum → orthogonalize → apply; each parameter's arithmetic is its own, so batching changes
        # no bits, and only one batch's updates are alive at a time.
        for batch, mesh_dim in plan_buckets([p.grad for p, _ in work], specs, flags, self.bucket_elements):
            updates = [self._update(*work[i], keep) for i in batch]
            if mesh_dim is not None:
                orthos = orthogonalize_exchange(updates, [specs[i] for i in batch], mesh_dim, self.ns_shapes)
            else:
                orthos = [self._orthogonalize_one(u, specs[i], flags[i]) for u, i in zip(updates, batch)]
            for i, ortho in zip(batch, orthos):
                p, g = work[i]
                apply_update(p, ortho, float(g["lr"]), g["weight_decay"], g["update_scale"], logical_shape(g, p),
                             keep=keep)
        return loss

    def _update(self, p: Tensor, group: dict[str, Any], keep: Optional[Tensor] = None) -> Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        return momentum_update(p.grad, state["momentum_buffer"], group["momentum"], group["nesterov"], keep)

    def _orthogonalize_one(self, update: Tensor, spec: NSSpec, distributed: bool) -> Tensor:
        where = split_dims(update) if distributed else None
        if where is not None and where[1] < update.ndim - 2:
            return orthogonalize_local(update, spec, self.ns_shapes)
        return orthogonalize(update, *spec, log=self.ns_shapes)

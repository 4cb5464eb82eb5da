"""Muon for the matrices inside the blocks (PAPER.md §3.2), with FSDP2 (DTensor) support.

Per matrix W ∈ R^{m×n} with gradient G, each step (Keller Jordan's Muon + Moonlight's scaling):
    B ← μ·B + (1 − μ)·G                          momentum, μ = 0.95
    U ← (1 − μ)·G + μ·B  (Nesterov)  or  B       PAPER.md §3.2: "Nesterov momentum 0.95"
    O ← NS₅(U)                                    5 quintic Newton–Schulz steps in bf16, (a, b, c) = (3.4445, −4.7750, 2.0315)
    W ← W·(1 − lr·wd)                             decoupled weight decay, wd 0.1 (PAPER.md §3.2)
    W ← W − lr·s(m, n)·O                          s = 0.2·√max(m, n) (Moonlight: update RMS ≈ AdamW's, so AdamW's
                                                  lr and wd carry over) or √max(1, m/n) (Keller Jordan's)
`lr` is read from the param group at every step, so the schedule works by writing group["lr"].

Why not just torch.optim.Muon: torch ≥ 2.9 has exactly this math (the same EMA-form momentum, `adjust_lr_fn`
"match_rms_adamw" = Moonlight, "original" = Jordan) and tests/test_muon.py proves ours equal to it, but it runs
Newton–Schulz on whatever tensor it is handed. Under FSDP2 that is a DTensor whose local part is a row shard; an
orthogonalized shard is not the shard of the orthogonalized matrix. Here a DTensor update is gathered whole
(`full_tensor()`), orthogonalized, and each rank keeps its own rows (`distribute_tensor(..., src_data_rank=None)`
slices locally, no communication). It also takes stacked 3-D weights (MoE experts), orthogonalized per matrix,
and never writes into a bf16 gradient (torch's `div_` would when the gradient already is bf16).

Cost under FSDP2 with N ranks: one all-gather of U per matrix per step (the volume FSDP2 already moves for the
forward) and N-fold redundant Newton–Schulz work (every rank orthogonalizes every matrix). A later speed-up,
behind a flag and with a parity test (DESIGN.md principle 9): assign matrices round-robin to ranks, let the
owner orthogonalize, and scatter the shards back (as in Moonlight's distributed Muon), or batch equal shapes
into one gather and one batched NS.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's / Moonlight's quintic (PAPER.md §3.2)
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


def orthogonalize(update: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """Newton–Schulz on the whole matrix, also when `update` is a sharded DTensor (see the module docstring)."""
    if isinstance(update, DTensor):
        full = update.full_tensor()  # all-gather: [m, n] on every rank
        ortho = zeropower_via_newtonschulz(full, coefficients, steps, eps, dtype)
        # src_data_rank=None: every rank slices its own shard from its own copy, no scatter. Each row lives on
        # one rank only, so the copies need not even agree bit for bit (they do: same kernels, same input); with a
        # Replicate mesh dimension (HSDP) they must, which the same-kernels argument gives.
        return distribute_tensor(ortho, update.device_mesh, update.placements, src_data_rank=None)
    return zeropower_via_newtonschulz(update, coefficients, steps, eps, dtype)


@torch.no_grad()
def muon_update(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor,
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    nesterov: bool,
    ns_coefficients: tuple[float, float, float],
    ns_steps: int,
    eps: float,
    update_scale_kind: str,
    ns_dtype: str = "bfloat16",
) -> None:
    """One Muon step for one parameter, in place (param, momentum_buffer); plain tensors or DTensors alike."""
    momentum_buffer.lerp_(grad, 1 - momentum)  # B ← μB + (1−μ)G
    update = grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer  # (1−μ)G + μB
    ortho = orthogonalize(update, ns_coefficients, ns_steps, eps, getattr(torch, ns_dtype))
    param.mul_(1 - lr * weight_decay)
    param.add_(ortho, alpha=-lr * update_scale(param.shape, update_scale_kind))


class Muon(torch.optim.Optimizer):
    """Muon over ≥2-D parameters; state per parameter is {"momentum_buffer"}, as in torch.optim.Muon.

    Defaults follow PAPER.md §3.2 (Nesterov 0.95, wd 0.1, 5 NS steps, Moonlight scaling). Param groups may carry
    extra keys (name, kind, lr_scale, initial_lr); HybridOptimizer (optim/hybrid.py) drives this class as its Muon
    engine over its own groups and state.
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
    ) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1:
            raise ValueError(f"Muon: need lr ≥ 0, weight_decay ≥ 0, momentum in [0, 1); got {lr}, "
                             f"{weight_decay}, {momentum}")
        if update_scale not in UPDATE_SCALES or len(ns_coefficients) != 3 or not 0 < ns_steps < 100:
            raise ValueError(f"Muon: bad update_scale {update_scale!r}, ns_coefficients {ns_coefficients} or "
                             f"ns_steps {ns_steps}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), ns_steps=ns_steps, eps=eps, update_scale=update_scale,
                        ns_dtype=ns_dtype)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(f"Muon takes matrices (≥ 2-D); got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                muon_update(
                    p, p.grad, state["momentum_buffer"], lr=float(group["lr"]),
                    weight_decay=group["weight_decay"], momentum=group["momentum"], nesterov=group["nesterov"],
                    ns_coefficients=tuple(group["ns_coefficients"]), ns_steps=group["ns_steps"], eps=group["eps"],
                    update_scale_kind=group["update_scale"], ns_dtype=group.get("ns_dtype", "bfloat16"),
                )
        return loss

"""A scale vector and its parameterization (docs/paper.md §1.6). Where vectors sit and what they multiply is
model/scaling.py's.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from model.config import Role


class ScaleVector(nn.Module):
    """One learnable vector γ ∈ R^dim in one of three parameterizations (docs/paper.md §1.6):

    direct: γ = weight,                            weight₀ = 1
    or:     γ = β · Norm(α) = β·√d·α/‖α‖,           α₀ = 1, β₀ = 1   (Thm 3.2)
    er:     γ = e^β · e^(α − mean α),               α₀ = 0, β₀ = 0   (init [I]: gives γ₀ = 1)

    `magnitude=False` drops the vector's scale, for a vector that only DNP's inner Norm reads
    (model.scale.invariant_magnitude: remove; docs/paper.md §1.7): OR γ = Norm(α), ER γ = e^(α − mean α), and a
    direct vector becomes γ = Norm(α) as well. No β exists to decay or multiply, and γ₀ = 1 as before.

    `count` makes it a stack of independent vectors, one per routed expert: γ has shape (count, dim), and OR/ER keep
    one β and one Norm/mean per row. β has shape (1,) (or (count, 1)) rather than (), so FSDP2 shards it like any
    other parameter.
    """

    def __init__(self, dim: int, reparam: str, role: Role, count: Optional[int] = None, magnitude: bool = True):
        super().__init__()
        if reparam not in ("direct", "or", "er"):
            raise ValueError(f"unknown scale reparameterization {reparam!r}; expected direct, or or er")
        self.dim, self.reparam, self.role, self.count, self.has_magnitude = dim, reparam, role, count, magnitude
        for kind, shape in self.shapes().items():
            self.register_parameter(kind, nn.Parameter(torch.empty(shape)))

    @property
    def kinds(self) -> tuple[str, ...]:
        """Its parameters' names: ("weight",), ("alpha", "beta"), or ("alpha",) without a magnitude."""
        if not self.has_magnitude:
            return ("alpha",)
        return ("weight",) if self.reparam == "direct" else ("alpha", "beta")

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each parameter's shape: (…, dim) for weight or α, (…, 1) for β; … is (count,) for a stack."""
        lead = () if self.count is None else (self.count,)
        return {kind: (*lead, 1 if kind == "beta" else self.dim) for kind in self.kinds}

    def numel(self) -> int:
        return sum(int(torch.Size(s).numel()) for s in self.shapes().values())

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for kind in self.kinds:
            self.part(kind).fill_(gamma_one(self.reparam))

    def part(self, kind: str) -> torch.Tensor:
        """Its weight, α or β, in the shape `shapes` gives."""
        return getattr(self, kind)

    def forward(self) -> torch.Tensor:
        """The effective vector γ, shape (dim,), or (count, dim) for a stack."""
        if self.reparam == "direct" and self.has_magnitude:
            return self.part("weight")
        a = self.part("alpha")
        beta = self.part("beta") if self.has_magnitude else None
        if self.reparam == "er":
            log_gamma = a - a.mean(-1, keepdim=True)
            return torch.exp(log_gamma if beta is None else beta + log_gamma)
        # No eps inside Norm(α): ‖α‖ stays √d under gradient flow (docs/paper.md §5.5), far from 0.
        direction = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True))
        return direction if beta is None else beta * direction

    @torch.no_grad()
    def magnitude(self) -> torch.Tensor:
        """The vector's scale apart from its direction, (1,) or (count, 1): OR's β, signed (γ = β·Norm(α)); ER's e^β;
        direct, the RMS of γ (no sign of its own). Under DNP an input-side vector's magnitude meets a Norm and gets
        no gradient but weight decay's (docs/paper.md §1.7). A vector without one has none to read."""
        if not self.has_magnitude:
            raise ValueError(f"this vector ({self.extra_repr()}) has no magnitude: it is Norm(α) or e^(α − mean α)")
        if self.reparam == "or":
            return self.part("beta").detach().clone()
        if self.reparam == "er":
            return self.part("beta").detach().exp()
        return self.part("weight").detach().float().pow(2).mean(-1, keepdim=True).sqrt()

    def extra_repr(self) -> str:
        count = "" if self.count is None else f"count={self.count}, "
        magnitude = "" if self.has_magnitude else ", no magnitude"
        return f"{count}dim={self.dim}, reparam={self.reparam}, role={self.role.value}{magnitude}"


def gamma_one(reparam: str) -> float:
    """The value of every entry (weight, α, β) that makes γ = 1: 1 for direct and OR (Norm(1) = 1), 0 for ER."""
    return 0.0 if reparam == "er" else 1.0

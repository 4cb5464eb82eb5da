"""A scale vector's parameterization and storage (docs/paper.md §1.6): ScaleVector (direct / OR / ER) and ScaleBank,
which stores a block's vectors as one tensor per role and kind. Where vectors sit and what they multiply is
model/scaling.py's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from model.config import Role


class ScaleVector(nn.Module):
    """One learnable vector γ ∈ R^dim in one of three parameterizations (docs/paper.md §1.6):

    direct: γ = weight,                            weight₀ = 1
    or:     γ = β · Norm(α) = β·√d·α/‖α‖,           α₀ = 1, β₀ = 1   (Thm 3.2)
    er:     γ = e^β · e^(α − mean α),               α₀ = 0, β₀ = 0   (init [I]: gives γ₀ = 1)

    `magnitude=False` drops the vector's scale by construction, for a vector that only DNP's inner Norm reads
    (model.scale.invariant_magnitude: remove; docs/paper.md §1.7): OR γ = Norm(α), ER γ = e^(α − mean α), and a
    direct vector becomes γ = Norm(α) as well. No β exists to decay or multiply, and γ₀ = 1 as before.

    `count` makes it a stack of independent vectors, one per routed expert: γ has shape (count, dim), and OR/ER keep
    one β and one Norm/mean per row. β is stored with shape (1,) (or (count, 1)) rather than () so FSDP2 can shard it
    like any other parameter.

    A vector owns its parameters until `ScaleBank` takes them: then it owns none and reads its slices of the bank's.
    Every block banks its vectors (`bank_scale_vectors`); the final norm's and the LM head's keep their own.
    """

    def __init__(self, dim: int, reparam: str, role: Role, count: Optional[int] = None, magnitude: bool = True):
        super().__init__()
        if reparam not in ("direct", "or", "er"):
            raise ValueError(f"unknown scale reparameterization {reparam!r}; expected direct, or or er")
        self.dim, self.reparam, self.role, self.count, self.has_magnitude = dim, reparam, role, count, magnitude
        self.slot: Optional[BankSlot] = None
        lead = () if count is None else (count,)
        for kind in self.kinds:
            self.register_parameter(kind, nn.Parameter(torch.empty(*lead, 1 if kind == "beta" else dim)))

    @property
    def kinds(self) -> tuple[str, ...]:
        """Its parameters' names: ("weight",), ("alpha", "beta"), or ("alpha",) without a magnitude."""
        if not self.has_magnitude:
            return ("alpha",)
        return ("weight",) if self.reparam == "direct" else ("alpha", "beta")

    def sizes(self) -> dict[str, int]:
        """Scalars per kind: dim·count for weight or α, count for β."""
        rows = self.count or 1
        return {kind: rows * (1 if kind == "beta" else self.dim) for kind in self.kinds}

    def numel(self) -> int:
        """Its logical parameters, banked or not."""
        return sum(self.sizes().values())

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.slot is not None:
            return  # the bank resets its tensors
        for kind in self.kinds:
            getattr(self, kind).fill_(gamma_one(self.reparam))

    def part(self, kind: str) -> torch.Tensor:
        """Its weight, α or β in γ's shape (…, dim) or (…, 1): its own parameter, or its slice of the bank's. Outside
        FSDP2's forward a bank is a sharded DTensor: it is gathered whole first (telemetry, export), on every rank."""
        if self.slot is None:
            return getattr(self, kind)
        flat = getattr(self.slot.bank, kind)
        if isinstance(flat, DTensor):
            flat = flat.full_tensor()
        start, stop = self.slot.ranges[kind]
        lead = () if self.count is None else (self.count,)
        return flat[start:stop].view(*lead, 1 if kind == "beta" else self.dim)

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
        direct, the RMS of γ (no sign of its own). Telemetry reads it: under DNP an input-side vector's magnitude
        meets a Norm and gets no gradient but weight decay's (docs/paper.md §1.7). A vector built without one
        (`has_magnitude` false) has none to read."""
        if not self.has_magnitude:
            raise ValueError(f"this vector ({self.extra_repr()}) has no magnitude: it is Norm(α) or e^(α − mean α)")
        if self.reparam == "or":
            return self.part("beta").detach().clone()
        if self.reparam == "er":
            return self.part("beta").detach().exp()
        return self.part("weight").detach().float().pow(2).mean(-1, keepdim=True).sqrt()

    def extra_repr(self) -> str:
        count = "" if self.count is None else f"count={self.count}, "
        banked = "" if self.slot is None else ", banked"
        magnitude = "" if self.has_magnitude else ", no magnitude"
        return f"{count}dim={self.dim}, reparam={self.reparam}, role={self.role.value}{magnitude}{banked}"


def gamma_one(reparam: str) -> float:
    """The value of every entry (weight, α, β) that makes γ = 1: 1 for direct and OR (Norm(1) = 1), 0 for ER."""
    return 0.0 if reparam == "er" else 1.0


@dataclass(frozen=True, eq=False)
class BankSlot:
    """Where a banked vector's entries lie: `ranges[kind]` = (start, stop) in the bank's flat tensor of that kind. The
    bank is referenced, not registered: it is a module of the block, once."""

    bank: "ScaleBank"
    ranges: dict[str, tuple[int, int]]


class ScaleBank(nn.Module):
    """The scale vectors of one block and one role as one flat tensor per kind (`weight`, or `alpha` and `beta`), each
    vector a slice. OR gives every vector two tensors; a unified block has 20. As banks FSDP2's gathers, gradient
    clipping and the optimizer see 2 per role, about the baseline's count, and pay their per-tensor host work once.
    Nothing changes in the math: a slice's gradient is the vector's, AdamW is elementwise, and decay follows the
    kind and the role as before (optim/groups.py reads `…alpha`)."""

    def __init__(self, vectors: list[ScaleVector]):
        super().__init__()
        if not vectors or len({(v.role, v.reparam) for v in vectors}) != 1:
            raise ValueError("a bank holds one or more vectors of one role and one reparameterization")
        self.role, self.reparam, self.n_vectors = vectors[0].role, vectors[0].reparam, len(vectors)
        # Kinds in order of first appearance: vectors without a magnitude have α alone beside others' α and β
        offsets = dict.fromkeys((k for v in vectors for k in v.kinds), 0)
        device = getattr(vectors[0], vectors[0].kinds[0]).device
        for v in vectors:
            if v.slot is not None:
                raise ValueError("a scale vector is already in a bank")
            ranges = {}
            for kind, n in v.sizes().items():
                ranges[kind] = (offsets[kind], offsets[kind] + n)
                offsets[kind] += n
                delattr(v, kind)
            v.slot = BankSlot(self, ranges)
        for kind, n in offsets.items():
            self.register_parameter(kind, nn.Parameter(torch.empty(n, device=device)))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """γ = 1 for every vector: α = β = 1 (OR, direct's weight) or 0 (ER), as ScaleVector.reset_parameters."""
        for p in self.parameters(recurse=False):
            p.fill_(gamma_one(self.reparam))

    def extra_repr(self) -> str:
        return f"vectors={self.n_vectors}, reparam={self.reparam}, role={self.role.value}"


def bank_scale_vectors(module: nn.Module) -> nn.ModuleDict:
    """One ScaleBank per role for every vector under `module` not yet banked, keyed "input" / "output", in module
    order; empty when it has none."""
    by_role: dict[Role, list[ScaleVector]] = {}
    for m in module.modules():
        if isinstance(m, ScaleVector) and m.slot is None:
            by_role.setdefault(m.role, []).append(m)
    return nn.ModuleDict({role.value.removeprefix("scale_"): ScaleBank(vs) for role, vs in by_role.items()})

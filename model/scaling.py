"""Where scale vectors sit and what they multiply (docs/design.md): Norm, ScaledLinear, ExpertBranch, and the rule
that turns a ScaleConfig into structure. A vector itself, its parameterization and its storage, is model/vectors.py's;
the two files are the only place scale vectors exist.

Every linear map W_c that reads a Pre-Norm output is a branch c. A branch computes (docs/paper.md §1.8, eq. 13)

    y = u_c ⊙ post(W_c (v_c ⊙ Norm x)),   post = identity, or Norm (per head on q/k/v) for DNP,

where v_c is an Input-Norm vector (shared by the branches of one norm unless HG) and u_c an Output-Norm vector.
Structure is decided here at construction: a missing vector is None, and a forward does one multiply per
present vector — never a diag() matrix or the product u vᵀ ⊙ W.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.config import Role, ScaleConfig
from model.vectors import ScaleVector


def rms_normalize(x: torch.Tensor, eps: float, n: Optional[int] = None) -> torch.Tensor:
    """Norm(x) = √d · x / ‖x‖ over the last dim (docs/paper.md §1.1), with the usual RMSNorm eps. Computed in float32 (as
    transformers' LlamaRMSNorm does) and cast back, so bf16 activations keep an fp32 reduction.

    `n`: the logical width when the last dim carries zero padding (MoE experts): the mean square is Σx²/n, so the
    padded units (zeros) change nothing and the result equals the unpadded Norm."""
    x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    sq = x32.pow(2).mean(-1, keepdim=True) if n is None else x32.pow(2).sum(-1, keepdim=True) / n
    y = x32 * torch.rsqrt(sq + eps)
    return y if y.dtype == x.dtype else y.to(x.dtype)


class Norm(nn.Module):
    """γ ⊙ Norm(x) over groups of `group` channels of the last dim (the whole dim by default; head_dim for a per-head
    norm, then γ ∈ R^group). `scale` None is a pure Norm (the "w/o scale vectors" model of Fig. 1). `logical`: the
    unpadded width when the last dim carries zero padding (routed experts; whole-dim groups only)."""

    def __init__(self, dim: int, eps: float, scale: Optional[ScaleVector], group: Optional[int] = None,
                 logical: Optional[int] = None):
        super().__init__()
        self.dim, self.eps, self.group = dim, eps, group or dim
        self.logical = logical if logical is not None and logical != dim else None
        if self.logical is not None and self.group != dim:
            raise ValueError("a padded Norm normalizes the whole vector; per-group padding is not supported")
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group == self.dim:
            y = rms_normalize(x, self.eps, self.logical)
            return y if self.scale is None else y * self.scale()
        # (..., dim) → (..., dim/group, group): normalize each head separately; a γ of size `group` is shared by
        # the heads (Gemma's Q/K-Norm)
        y = rms_normalize(x.unflatten(-1, (-1, self.group)), self.eps)
        return (y if self.scale is None else y * self.scale()).flatten(-2)

    def extra_repr(self) -> str:
        logical = "" if self.logical is None else f", logical={self.logical}"
        return f"dim={self.dim}, group={self.group}, eps={self.eps}{logical}"


class ScaledLinear(nn.Module):
    """A bias-free linear map with its optional branch vectors: y = u ⊙ post(W (v ⊙ x)), x already Norm'd.

    in_scale = v (Input-Norm), out_scale = u (Output-Norm), inner = DNP's inner Norm (`post`).

    d_in/d_out are logical; W is stored (d_out_padded, d_in_padded), the extra rows/columns zero (an FFN hidden padded
    to model.ffn_pad_multiple): the input's padded units are zeros, the padded outputs are zeros, u keeps the logical
    width (zero-padded on the fly: no parameter is padding), and the inner Norm divides by the logical d_out.
    """

    def __init__(self, d_in: int, d_out: int, *, in_scale: Optional[ScaleVector] = None,
                 inner: Optional[Norm] = None, out_scale: Optional[ScaleVector] = None, role: Role = Role.MATRIX,
                 d_in_padded: Optional[int] = None, d_out_padded: Optional[int] = None):
        super().__init__()
        self.d_in, self.d_out, self.role = d_in, d_out, role
        self.d_in_padded, self.d_out_padded = d_in_padded or d_in, d_out_padded or d_out
        if in_scale is not None and self.d_in_padded != d_in:
            raise ValueError("an input-side vector needs an unpadded input (only FFN hidden sizes are padded)")
        self.in_scale = in_scale
        self.weight = nn.Parameter(torch.empty(self.d_out_padded, self.d_in_padded))
        self.inner = inner
        self.out_scale = out_scale

    @property
    def logical_shape(self) -> tuple[int, int]:
        return self.d_out, self.d_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., d_in_padded) → (..., d_out_padded), y = u ⊙ post(W (v ⊙ x)) as docs/paper.md §1.8 writes it."""
        if self.in_scale is not None:
            x = x * self.in_scale()  # v ⊙ x
        y = F.linear(x, self.weight.to(x.dtype))  # .to: a no-op except for the MoE router (fp32 on bf16 weights)
        if self.inner is not None:
            y = self.inner(y)  # DNP's post = Norm
        if self.out_scale is not None:
            y = y * pad_last(self.out_scale(), self.d_out_padded)  # u ⊙ …
        return y

    @torch.no_grad()
    def folded_weight(self, extra_in: Optional[torch.Tensor] = None) -> torch.Tensor:
        """diag(u) W diag(v ⊙ extra_in): the plain weight with identical outputs (docs/paper.md §1.8). `extra_in` is a
        shared pre-norm vector being folded in as well. Refuses a branch with an inner Norm (DNP)."""
        if self.inner is not None:
            raise ValueError("a branch with DNP's inner Norm does not fold into a plain linear map")
        w = self.weight.detach().clone()  # (d_out_padded, d_in_padded)
        v = self.in_scale() if self.in_scale is not None else None
        if extra_in is not None:
            v = extra_in if v is None else v * extra_in
        if v is not None:
            w = w * v[None, :]
        if self.out_scale is not None:
            w = w * pad_last(self.out_scale(), self.d_out_padded)[:, None]
        return w

    def extra_repr(self) -> str:
        padded = "" if self.weight.shape == self.logical_shape else f", stored={tuple(self.weight.shape)}"
        return f"d_in={self.d_in}, d_out={self.d_out}{padded}, role={self.role.value}"


def pad_last(u: torch.Tensor, width: int) -> torch.Tensor:
    """u (..., n) → (..., width), zeros appended: a logical-width vector against a padded matrix's rows."""
    return F.pad(u, (0, width - u.shape[-1])) if width != u.shape[-1] else u


class ExpertBranch(nn.Module):
    """One branch (gate or up) of every routed expert, stacked: for a row r routed to expert e,

        y_r = u_e ⊙ post(W_e (v ⊙ x_r)),   W: (E, d_out_padded, d_in_padded),

    with v shared by the experts (it acts on the token, in R^d_in, the same space for every expert) and u_e, W_e per
    expert (an expert's hidden units are its own). Rows (gate/up) or columns (down) of W past the logical size are
    zero padding (model.ffn_pad_multiple); they stay zero in training (model/moe.py), u_e keeps the logical width and
    the inner Norm divides by the logical d_out, as in ScaledLinear.
    """

    def __init__(self, n_experts: int, d_in: int, d_out: int, d_out_padded: Optional[int] = None, *,
                 in_scale: Optional[ScaleVector] = None, inner: Optional[Norm] = None,
                 out_scale: Optional[ScaleVector] = None, d_in_padded: Optional[int] = None):
        super().__init__()
        self.n_experts, self.d_in, self.d_out = n_experts, d_in, d_out
        self.d_in_padded, self.d_out_padded = d_in_padded or d_in, d_out_padded or d_out
        if in_scale is not None and self.d_in_padded != d_in:
            raise ValueError("an input-side vector needs an unpadded input (only FFN hidden sizes are padded)")
        self.role = Role.EXPERT_MATRIX
        self.in_scale = in_scale
        self.weight = nn.Parameter(torch.empty(n_experts, self.d_out_padded, self.d_in_padded))
        self.inner = inner
        self.out_scale = out_scale

    @property
    def logical_shape(self) -> tuple[int, int, int]:
        return self.n_experts, self.d_out, self.d_in

    def forward(self, x: torch.Tensor, expert_of_row: torch.Tensor, matmul: Callable) -> torch.Tensor:
        """x: (N, d_in_padded) rows sorted by expert; expert_of_row: (N,) int64; matmul(x, W) → (N, d_out_padded),
        the grouped GEMM or the per-expert loop of model/moe.py."""
        if self.in_scale is not None:
            x = x * self.in_scale()  # v ⊙ x: one v for every expert
        y = matmul(x, self.weight)  # W_e (v ⊙ x) for each row's expert e
        if self.inner is not None:
            y = self.inner(y)
        if self.out_scale is not None:  # (E, d_out_padded) → the row's own expert's u_e
            y = y * pad_last(self.out_scale(), self.d_out_padded)[expert_of_row]
        return y

    @torch.no_grad()
    def folded_weight(self, extra_in: Optional[torch.Tensor] = None) -> torch.Tensor:
        """diag(u_e) W_e diag(v ⊙ extra_in) for every expert: (E, d_out_padded, d_in_padded). Refuses DNP's inner
        Norm."""
        if self.inner is not None:
            raise ValueError("a branch with DNP's inner Norm does not fold into a plain linear map")
        w = self.weight.detach().clone()
        v = self.in_scale() if self.in_scale is not None else None
        if extra_in is not None:
            v = extra_in if v is None else v * extra_in
        if v is not None:
            w = w * v[None, None, :]
        if self.out_scale is not None:
            w = w * pad_last(self.out_scale(), self.d_out_padded)[:, :, None]
        return w

    def extra_repr(self) -> str:
        padded = "" if self.weight.shape == self.logical_shape else f", stored={tuple(self.weight.shape)}"
        return f"n_experts={self.n_experts}, d_in={self.d_in}, d_out={self.d_out}{padded}, role={self.role.value}"


@dataclass(frozen=True)
class GroupLayout:
    """The resolved structure of one Pre-Norm group (the branches reading one norm)."""

    shared_input: bool  # one input-side γ on the norm itself (baseline Llama)
    branch_input: bool  # one input-side v_c per branch (HG)
    output: bool  # an output-side u_c per branch (AP, DP, DNP)
    inner_norm: bool  # DNP's Norm between W_c and u_c
    reparam: str
    # model.scale.invariant_magnitude: remove. An input-side vector that only inner Norms read has no magnitude.
    remove_invariant: bool = False

    def input_vector(self, dim: int, only_norms_read: bool) -> ScaleVector:
        """An input-side vector; `only_norms_read`: every map reading it normalizes its output first (DNP's inner
        Norm), so its magnitude reaches the loss only through eps (docs/paper.md §1.7)."""
        magnitude = not (self.remove_invariant and only_norms_read)
        return ScaleVector(dim, self.reparam, Role.SCALE_INPUT, magnitude=magnitude)

    def norm(self, dim: int, eps: float, only_norms_read: bool = True) -> Norm:
        """The group's Pre-Norm. `only_norms_read`: whether each branch of the group has an inner Norm (false for an
        MoE FFN whose router keeps only its input side)."""
        return Norm(dim, eps, self.input_vector(dim, only_norms_read and self.inner_norm) if self.shared_input
                    else None)

    def branch(self, d_in: int, d_out: int, eps: float, inner_group: Optional[int] = None,
               role: Role = Role.MATRIX, output_side: bool = True,
               d_out_padded: Optional[int] = None) -> ScaledLinear:
        """`inner_group`: DNP normalizes over groups of this size (head_dim on q/k/v; None = whole vector).
        `output_side=False`: the branch keeps only the input side (the MoE router unless `scale.router`).
        `d_out_padded`: the stored width of a padded FFN hidden (gate/up); the inner Norm still divides by d_out."""
        output = self.output and output_side
        stored = d_out_padded or d_out
        inner = self.inner_norm and output
        return ScaledLinear(
            d_in, d_out,
            in_scale=self.input_vector(d_in, inner) if self.branch_input else None,
            inner=Norm(stored, eps, None, inner_group, logical=d_out) if inner else None,
            out_scale=ScaleVector(d_out, self.reparam, Role.SCALE_OUTPUT) if output else None,
            role=role, d_out_padded=stored,
        )

    def experts(self, n_experts: int, d_in: int, d_out: int, d_out_padded: int, eps: float) -> ExpertBranch:
        """One branch of the routed experts: an input-side v shared by the experts (HG: one per branch kind, not per
        expert), and per-expert output-side vectors u_e and inner Norm (model/moe.py explains the choice)."""
        return ExpertBranch(
            n_experts, d_in, d_out, d_out_padded,
            in_scale=self.input_vector(d_in, self.inner_norm) if self.branch_input else None,
            inner=Norm(d_out_padded, eps, None, logical=d_out) if self.inner_norm else None,
            out_scale=ScaleVector(d_out, self.reparam, Role.SCALE_OUTPUT, count=n_experts) if self.output else None,
        )


def group_layout(cfg: ScaleConfig, n_branches: int, takes_placement: bool = True) -> GroupLayout:
    """Turn the knobs into structure for a group of `n_branches` branches.

    A group that does not take the placement (the LM head unless `scale.lm_head`) keeps the standard input-side γ.
    Output-side vectors are always per branch: with GQA, q and k/v differ in width, so one shared u cannot serve all.
    """
    placement = cfg.placement if takes_placement or not cfg.has_vectors else "input"
    input_side = placement in ("input", "dp", "dnp")
    hetero = cfg.heterogeneous and n_branches > 1  # HG does not change a single-branch norm (docs/paper.md §1.4)
    return GroupLayout(
        shared_input=input_side and not hetero,
        branch_input=input_side and hetero,
        output=placement in ("ap", "dp", "dnp"),
        inner_norm=placement == "dnp",
        reparam=cfg.reparam,
        remove_invariant=cfg.invariant_magnitude == "remove",
    )


def extra_norm(cfg: ScaleConfig, dim: int, eps: float, group: Optional[int] = None) -> Norm:
    """A Gemma-style Output-Norm (Q/K-Norm, attention/FFN output norm; docs/paper.md §3.4): γ ⊙ Norm(x), γ ∈ R^group."""
    scale = ScaleVector(group or dim, cfg.reparam, Role.SCALE_OUTPUT) if cfg.has_vectors else None
    return Norm(dim, eps, scale, group)

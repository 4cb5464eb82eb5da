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

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from model.config import Role, ScaleConfig
from model.vectors import ScaleVector


def rms_normalize(x: torch.Tensor, eps: float, n: Optional[int] = None) -> torch.Tensor:
    """Norm(x) = √d · x / ‖x‖ over the last dim (docs/paper.md §1.1), with the usual RMSNorm eps. Computed in float32 (as
    transformers' LlamaRMSNorm does) and cast back, so bf16 activations keep an fp32 reduction.

    `n`: the logical width when the last dim carries zero padding (MoE experts): the mean square is Σx²/n, so the
    padded units (zeros) change nothing and the result equals the unpadded Norm."""
    return _Norm.apply(x, eps, n)


class _Norm(torch.autograd.Function):
    """y = x·r, r = (Σx²/n + eps)^(-1/2), with the backward written through the output:

        ∂L/∂x = r · (g − y · Σ(g ⊙ y)/n),    g = ∂L/∂y,

    exact (eps included), so backward keeps y and r instead of x. y is what the next op keeps anyway (the linear map
    that reads a pre-norm, the vector multiply after DNP's inner Norm), so a Norm adds only r, (…, 1), to the saved
    activations — where autograd's own formula would keep its input x as well. The forward is the plain formula op
    for op (tests/test_model.py: bit-identical to F.rms_norm on CPU, values and gradients to the formula in fp64)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float, n: Optional[int]) -> torch.Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        sq = x32.pow(2).mean(-1, keepdim=True) if n is None else x32.pow(2).sum(-1, keepdim=True) / n
        r = torch.rsqrt(sq + eps)  # (…, 1), at least fp32
        y = x32 * r
        if y.dtype != x.dtype:
            # Cast only when the dtypes differ: under torch 2.11's dynamo, a same-dtype `.to()` (which returns its
            # input) on a tensor saved for backward made every gradient through this Function exactly 0 in compiled
            # graphs (tests/test_compile.py checks compiled gradients against eager). Same numbers either way.
            y = y.to(x.dtype)
        ctx.save_for_backward(y, r)
        ctx.n = x.shape[-1] if n is None else n
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        y, r = ctx.saved_tensors
        g32, y32 = g.to(r.dtype), y.to(r.dtype)
        dx = r * (g32 - y32 * ((g32 * y32).sum(-1, keepdim=True) / ctx.n))
        return dx.to(g.dtype), None, None


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

    def forward(self, x: torch.Tensor, matmul: Optional[Callable] = None,
                then: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, hand_on: bool = False,
                handed: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (..., d_in) → (..., d_out), then `then` applied to it (RoPE on q/k: the caller's next elementwise ops).

        A vector multiplies whichever side is smaller: u ⊙ (W (v ⊙ x)) = (diag(u) W diag(v)) x exactly, and for a
        block matrix W (d_out × d_in) is far smaller than a micro-batch's rows x (N × d_in), so v and u (without an
        inner Norm) scale W's columns and rows instead of N rows of activations — fewer FLOPs, and backward keeps
        the one shared normalized input rather than one scaled copy per branch (HG). The LM head (W: vocab × d)
        scales its activations. docs/design.md's rule stands: no diag() matrices, no u vᵀ outer product.

        `hand_on`: leave DNP's u off the output; the caller hands `handed_on()` to the next linear map, which scales
        its columns (`handed`): exact where the ops between act on each channel linearly (attention's weighted sum
        over v, the SwiGLU product over up). u then costs a weight-sized multiply, and its gradient comes from
        that weight's, where on the activations it needs a pass over every row for the column sum ∂/∂u.

        Compiled, the folded weight and the chain after the matmul (inner Norm → u → `then`) are `recomputed` in
        backward, so a branch saves what the baseline's saves (its input, its matmul's output) plus the Norm's
        statistic r: not W ⊙ v, not the Norm's output beside RoPE's.

        `matmul(x, W)` → x Wᵀ stands in for F.linear, for a caller that forms W's gradient itself (the fused LM
        head + loss, model/loss.py, accumulates it in place): then no vector folds into W, so `matmul` gets the
        stored weight and W's gradient is exactly Gᵀ (v ⊙ x), G the gradient of the matmul's output."""
        w = self.weight.to(x.dtype)  # .to: a no-op except for the MoE router, which runs in fp32 on bf16 weights
        fold_in, fold_out = self.folds(x.numel() // self.d_in_padded) if matmul is None else (False, False)
        v = self.in_scale() if self.in_scale is not None else None
        if handed is not None:  # (d_in_padded,): a vector an earlier branch handed on
            v = handed if v is None else v * handed
            fold_in = matmul is None and x.numel() // self.d_in_padded >= self.d_out_padded
        u = None
        if self.out_scale is not None and not (hand_on and self.inner is not None):
            u = pad_last(self.out_scale(), self.d_out_padded)  # (d_out_padded,)
        if fold_in or (fold_out and u is not None):
            w = recomputed(_fold, w, v if fold_in else None, u if fold_out else None)
        if v is not None and not fold_in:
            x = x * v
        y = F.linear(x, w) if matmul is None else matmul(x, w)  # (..., d_out_padded)
        u = None if fold_out else u
        if self.inner is None and u is None:
            return y if then is None else then(y)
        return recomputed(self._post, y, u, then)

    def handed_on(self) -> Optional[torch.Tensor]:
        """The u that `forward(hand_on=True)` left off, zero-padded to the stored width (d_out_padded,), or None
        where the branch applies its own (no u, or no inner Norm: then u folds into this branch's W)."""
        if self.out_scale is None or self.inner is None:
            return None
        return pad_last(self.out_scale(), self.d_out_padded)

    def _post(self, y: torch.Tensor, u: Optional[torch.Tensor], then: Optional[Callable]) -> torch.Tensor:
        """What follows the matmul: DNP's inner Norm, u, then the caller's `then`."""
        if self.inner is not None:
            y = self.inner(y)
        if u is not None:
            y = y * u
        return y if then is None else then(y)

    def folds(self, rows: int) -> tuple[bool, bool]:
        """Whether a forward over `rows` rows scales W by v (its columns) and by u (its rows) rather than the
        activations: the smaller side, as forward explains. Where it does, W's gradient passes through the fold."""
        fold_in = self.in_scale is not None and rows >= self.d_out_padded
        fold_out = self.out_scale is not None and self.inner is None and rows >= self.d_in_padded
        return fold_in, fold_out

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


def recomputed(fn: Callable, *args):
    """fn(*args); inside a compiled graph, with fn's intermediate results recomputed in backward from its inputs
    instead of saved (a non-reentrant activation checkpoint: the partitioner then saves the inputs). For cheap
    elementwise chains only, never a matmul or attention: the weight fold and a branch's Norm → u → RoPE
    (docs/design.md, "The scale-vector model"). Eager, fn(*args): there the chain's output is saved by the next op
    anyway, so recomputing would cost time and save nothing. The same ops either way, so the same numbers."""
    if torch.compiler.is_compiling():
        return checkpoint(fn, *args, use_reentrant=False,
                          context_fn=functools.partial(create_selective_checkpoint_contexts, _save_statistics))
    return fn(*args)


def _save_statistics(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """`recomputed`'s policy: keep each Norm's r = (mean x² + eps)^(-1/2), one fp32 number per normalized row, so
    backward does not read the row again to recompute it; recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.rsqrt.default else CheckpointPolicy.PREFER_RECOMPUTE


def _fold(w: torch.Tensor, v: Optional[torch.Tensor], u: Optional[torch.Tensor]) -> torch.Tensor:
    """diag(u) W diag(v), either vector None: W (d_out_padded, d_in), v (d_in,), u (d_out_padded,)."""
    if v is not None:
        w = w * v  # W diag(v)
    if u is not None:
        w = w * u[:, None]  # diag(u) W
    return w


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

    def forward(self, x: torch.Tensor, expert_of_row: torch.Tensor, matmul, hand_on: bool = False,
                handed: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (N, d_in_padded) rows sorted by expert; expert_of_row: (N,) int64; matmul(x, W) → (N, d_out_padded),
        the grouped GEMM or the per-expert loop of model/moe.py. `hand_on` and `handed` (E, d_in_padded): DNP's u_e
        handed on to the next expert map's columns, as ScaledLinear.forward explains; here it also spares a gather
        of u_e per row."""
        w = self.weight  # (E, d_out_padded, d_in_padded)
        if self.in_scale is not None:  # the smaller side, as in ScaledLinear.forward
            if x.shape[0] >= w.shape[0] * w.shape[1]:
                w = w * self.in_scale()
            else:
                x = x * self.in_scale()
        if handed is not None:
            w = w * handed[:, None, :]  # W_e diag(u_e)
        if self.out_scale is not None and self.inner is None:
            w = w * pad_last(self.out_scale(), self.d_out_padded)[:, :, None]  # diag(u_e) W_e: no per-row gather
        y = matmul(x, w)
        if self.inner is not None:
            y = self.inner(y)
            if self.out_scale is not None and not hand_on:  # (E, d_out_padded) → one row per token slot
                y = y * pad_last(self.out_scale(), self.d_out_padded)[expert_of_row]
        return y

    def handed_on(self) -> Optional[torch.Tensor]:
        """The u_e that `forward(hand_on=True)` left off, (E, d_out_padded), or None where the branch applies its
        own (ScaledLinear.handed_on)."""
        if self.out_scale is None or self.inner is None:
            return None
        return pad_last(self.out_scale(), self.d_out_padded)

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

"""The fast path's branches: the reference modules of model/ with a faster forward that computes the same function
(tests/test_fast.py holds each to its reference). Each class subclasses its reference and adds no state, so names,
roles and checkpoints are the reference's.

- `FastNorm`: the Norm's backward written through its output, so it saves r (…, 1) instead of its input.
- `FastScaledLinear`: a vector multiplies whichever side is smaller, W or the rows; DNP's u can be handed on to the
  next map's columns; compiled, the folded weight and the chain after the matmul are recomputed in backward.
- `FastExpertBranch`: the same for the routed experts' stacked weights.
- `FastAttention`, `FastMLP`, `FastMoE`: hand u on where it commutes, and end q/k's chain in RoPE inside the
  recomputed region (docs/design.md, "The fast path").
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from model.llama import MLP, Attention
from model.moe import MoE
from model.rope import apply_rope
from model.scaling import ExpertBranch, Norm, ScaledLinear, pad_last


# ------------------------------------------------------------------------------------------------------ Norm

class _Norm(torch.autograd.Function):
    """y = x·r, r = (Σx²/n + eps)^(-1/2), with the backward written through the output:

        ∂L/∂x = r · (g − y · Σ(g ⊙ y)/n),    g = ∂L/∂y,

    exact (eps included), so backward keeps y and r instead of x. y is what the next op keeps anyway (the linear map
    that reads a pre-norm, the vector multiply after DNP's inner Norm), so a Norm adds only r, (…, 1), to the saved
    activations. The forward is model/scaling.py's `rms_normalize` op for op (tests/test_fast.py: bit-identical)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float, n: Optional[int]) -> torch.Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        sq = x32.pow(2).mean(-1, keepdim=True) if n is None else x32.pow(2).sum(-1, keepdim=True) / n
        r = torch.rsqrt(sq + eps)  # (…, 1), at least fp32
        y = x32 * r
        if y.dtype != x.dtype:
            # Cast only when the dtypes differ: under torch 2.11's dynamo, a same-dtype `.to()` (which returns its
            # input) on a tensor saved for backward made every gradient through this Function exactly 0 in compiled
            # graphs (tests/test_compile.py checks compiled gradients against eager).
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


class FastNorm(Norm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Norm.forward's function, through `_Norm`."""
        if self.group == self.dim:
            y = _Norm.apply(x, self.eps, self.logical)
            return y if self.scale is None else y * self.scale()
        y = _Norm.apply(x.unflatten(-1, (-1, self.group)), self.eps, None)  # (..., dim/group, group)
        return (y if self.scale is None else y * self.scale()).flatten(-2)


# ------------------------------------------------------------------------------------------------ recompute

def recomputed(fn: Callable, *args):
    """fn(*args); inside a compiled graph, with fn's intermediate results recomputed in backward from its inputs
    instead of saved (a non-reentrant activation checkpoint: the partitioner then saves the inputs). For cheap
    elementwise chains only, never a matmul or attention: the weight fold and a branch's Norm → u → RoPE. Eager,
    fn(*args): there the chain's output is saved by the next op anyway, so recomputing would cost time and save
    nothing. The same ops either way, so the same numbers."""
    if torch.compiler.is_compiling():
        return checkpoint(fn, *args, use_reentrant=False,
                          context_fn=functools.partial(create_selective_checkpoint_contexts, _save_statistics))
    return fn(*args)


class _NoInPlaceCaution(logging.Filter):
    """Drops torch's one caution that a compiled checkpoint with a context_fn must hold no in-place op: the regions
    `recomputed` marks are elementwise chains with none (tests/test_compile.py checks their gradients against
    eager's), so the four lines would only alarm a first run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "context_fn is passed to torch.utils.checkpoint under torch.compile" not in record.getMessage()


def quiet_recompute_caution() -> None:
    """Install `_NoInPlaceCaution` once on the logger torch warns through (at build time: never on import)."""
    logger = logging.getLogger("torch._higher_order_ops.wrap")
    if not any(isinstance(f, _NoInPlaceCaution) for f in logger.filters):
        logger.addFilter(_NoInPlaceCaution())


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


# -------------------------------------------------------------------------------------------------- branches

class FastScaledLinear(ScaledLinear):
    def forward(self, x: torch.Tensor, matmul: Optional[Callable] = None,
                then: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, hand_on: bool = False,
                handed: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (..., d_in) → (..., d_out), then `then` applied to it (RoPE on q/k: the caller's next elementwise ops).

        A vector multiplies whichever side is smaller: u ⊙ (W (v ⊙ x)) = (diag(u) W diag(v)) x exactly, and for a
        block matrix W (d_out × d_in) is far smaller than a micro-batch's rows x (N × d_in), so v and u (without an
        inner Norm) scale W's columns and rows instead of N rows of activations: fewer FLOPs, and backward keeps
        the one shared normalized input rather than one scaled copy per branch (HG). The LM head (W: vocab × d)
        scales its activations.

        `hand_on`: leave DNP's u off the output; the caller hands `handed_on()` to the next linear map, which scales
        its columns (`handed`): exact where the ops between act on each channel linearly (attention's weighted sum
        over v, the SwiGLU product over up). u then costs a weight-sized multiply, and its gradient comes from
        that weight's, where on the activations it needs a pass over every row for the column sum ∂/∂u.

        Compiled, the folded weight and the chain after the matmul (inner Norm → u → `then`) are `recomputed` in
        backward, so a branch saves what the baseline's saves (its input, its matmul's output) plus the Norm's
        statistic r.

        `matmul(x, W)` → x Wᵀ stands in for F.linear, for a caller that forms W's gradient itself (the fused LM
        head, fast/head.py, accumulates it in place): then no vector folds into W, so `matmul` gets the stored
        weight and W's gradient is exactly Gᵀ (v ⊙ x), G the gradient of the matmul's output."""
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


class FastExpertBranch(ExpertBranch):
    def forward(self, x: torch.Tensor, expert_of_row: torch.Tensor, matmul: Callable, hand_on: bool = False,
                handed: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (N, d_in_padded) rows sorted by expert; expert_of_row: (N,) int64; matmul(x, W) → (N, d_out_padded).
        v multiplies the smaller side, and u without an inner Norm folds into W_e's rows (no gather of u_e per row).
        `hand_on` and `handed` (E, d_in_padded): DNP's u_e handed on to the next expert map's columns, as
        FastScaledLinear.forward explains; here it also spares a gather of u_e per row."""
        w = self.weight  # (E, d_out_padded, d_in_padded)
        if self.in_scale is not None:  # the smaller side
            if x.shape[0] >= w.shape[0] * w.shape[1]:
                w = w * self.in_scale()
            else:
                x = x * self.in_scale()
        if handed is not None:
            w = w * handed[:, None, :]  # W_e diag(u_e)
        if self.out_scale is not None and self.inner is None:
            w = w * pad_last(self.out_scale(), self.d_out_padded)[:, :, None]  # diag(u_e) W_e
        y = matmul(x, w)
        if self.inner is not None:
            y = self.inner(y)
            if self.out_scale is not None and not hand_on:  # (E, d_out_padded) → one row per token slot
                y = y * pad_last(self.out_scale(), self.d_out_padded)[expert_of_row]
        return y

    def handed_on(self) -> Optional[torch.Tensor]:
        """The u_e that `forward(hand_on=True)` left off, (E, d_out_padded), or None where the branch applies its
        own (FastScaledLinear.handed_on)."""
        if self.out_scale is None or self.inner is None:
            return None
        return pad_last(self.out_scale(), self.d_out_padded)


# ---------------------------------------------------------------------------------------- attention, FFN

class FastAttention(Attention):
    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """h: (B, T, d) normalized input → (B, T, d), Attention.forward's function."""
        B, T, _ = h.shape
        # Each branch's chain after its matmul (DNP's Norm, u, the Gemma Q/K-Norm, RoPE) ends in one `then`, which
        # FastScaledLinear recomputes in backward when compiled: the block saves what the baseline's saves
        q = self.q_proj(h, then=functools.partial(_heads, shape=(B, T, self.n_heads, self.head_dim), norm=self.q_norm,
                                                  rope=(cos, sin)))  # (B, T, H, hd)
        k = self.k_proj(h, then=functools.partial(_heads, shape=(B, T, self.n_kv_heads, self.head_dim),
                                                  norm=self.k_norm, rope=(cos, sin)))  # (B, T, KV, hd)
        # DNP's u_v goes on to o_proj's columns: attention sums v's rows with weights, channel by channel, so
        # P (V diag(u)) = (P V) diag(u) exactly
        v = self.v_proj(h, then=functools.partial(_heads, shape=(B, T, self.n_kv_heads, self.head_dim)),
                        hand_on=True)
        y = F.scaled_dot_product_attention(  # (B, H, T, hd)
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=self.n_kv_heads != self.n_heads)
        u_v = self.v_proj.handed_on()  # (KV·hd,) or None
        if u_v is not None and self.n_kv_heads != self.n_heads:  # query head j reads kv head j // (H / KV)
            u_v = u_v.view(self.n_kv_heads, -1).repeat_interleave(self.n_heads // self.n_kv_heads, 0).flatten()
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1), handed=u_v)


def _heads(t: torch.Tensor, shape: tuple[int, int, int, int], norm: Optional[Norm] = None,
           rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """A q/k/v branch's output (B, T, n·hd) → (B, T, n, hd): the Gemma Q/K-Norm if any, then RoPE with (cos, sin)."""
    t = (t if norm is None else norm(t)).view(shape)
    return t if rope is None else apply_rope(t, *rope)


class FastMLP(MLP):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (..., d) normalized input → (..., d), MLP.forward's function."""
        # DNP's u_up goes on to down_proj's columns: SiLU(gate) ⊙ (u ⊙ n) = (SiLU(gate) ⊙ n) ⊙ u exactly
        hidden = F.silu(self.gate_proj(h)) * self.up_proj(h, hand_on=True)  # (..., f_padded)
        return self.down_proj(hidden, handed=self.up_proj.handed_on())


class FastMoE(MoE):
    def experts(self, rows: torch.Tensor, expert_of_row: torch.Tensor, matmul: Callable) -> torch.Tensor:
        """MoE.experts' function, DNP's u_e on up handed on to down_proj's columns."""
        g = self.gate_proj(rows, expert_of_row, matmul)  # (N, fp)
        u = self.up_proj(rows, expert_of_row, matmul, hand_on=True)  # (N, fp)
        return self.down_proj(F.silu(g) * u, expert_of_row, matmul, handed=self.up_proj.handed_on())  # (N, d)

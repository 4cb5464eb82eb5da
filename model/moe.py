"""Llama-MoE's FFN (docs/paper.md §2.2): a router, `n_experts` routed SwiGLU experts (top-k, token choice, dropless) and
one always-on shared SwiGLU expert, in place of the dense MLP inside the same Block.

    out = Σ_{e ∈ topk(x)} w_e(x) · E_e(x)  +  S(x)           w = softmax(router(x)) at the chosen experts

Routing [U, our choices, each a MoEConfig field]: router logits and softmax in fp32; top-k after the softmax; no
renormalization of the top-k weights (Qwen1.5/2-MoE); no shared-expert gate (the paper's counts have none, §2.3);
balancing by the Switch auxiliary loss E·Σᵢ fᵢ·Pᵢ (per layer, per micro-batch, coefficient 0.01), or by DeepSeek-V3's
aux-loss-free bias (it only chooses the top-k; updated after each optimizer step from the loads of all ranks), or none.

Where the scale vectors sit [U, our reading of the paper's rule]. Every linear map that reads the FFN's Pre-Norm output
is a branch of that norm (docs/paper.md §1.8): the router, the shared expert's gate and up, and the routed experts' gate and
up. So the baseline shares one γ among all of them (as Qwen-MoE's post_attention_layernorm does), and
- input side (HG, DP, DNP): one v per branch *kind* — router, shared gate, shared up, routed gate, routed up. A routed
  expert's input lives in R^d like every other expert's, so one v_gate serves all routed gate matrices; it keeps the
  paper's ≈ 0.01 % budget (5·d per layer instead of 2·E·d) and acts on the token (N, d) by broadcast.
- output side (AP, DP, DNP) and DNP's inner Norm: per routed expert, since an expert's hidden units are its own:
  u_e ∈ R^{F} for each expert's gate and up. The shared expert is an ordinary SwiGLU branch pair.
- the router keeps only the input side unless `scale.router` (then an output vector over the E logits, and DNP's Norm
  of the logits); down projections take no vectors, as in the dense model (docs/paper.md §1.9).
model/scaling.py builds every vector; this file only routes.

Compute: slots (token, choice) are sorted by expert (a stable argsort), the tokens gathered once, and each expert
matrix applied to its contiguous rows — by the grouped GEMM (`torch.nn.functional.grouped_mm`, CUDA bf16, no host
sync, no Python loop over experts) or by an exact per-expert loop (CPU, fp32, float64). The routed hidden size, like
every FFN's, is zero-padded to a multiple of `model.ffn_pad_multiple` (the grouped GEMM needs 16-byte strides,
cuBLAS prefers 128): padded units of gate/up output 0, SiLU(0)·0 = 0, and every gradient into a padded row or column
is exactly 0, so AdamW (m = v = 0) and Muon (zero rows stay zero through Newton–Schulz; its scale reads the logical
shape) never move them; parameter counts use the logical size. The combine gathers the slots back into token order
and sums the k weighted outputs — no atomic scatter-add.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F

from model.config import MoEConfig, Role
from model.scaling import ExpertBranch, GroupLayout

_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _sum_over_ranks(counts: torch.Tensor) -> torch.Tensor:
    """Σ over the data-parallel ranks (the whole world: FSDP2 on a 1-D mesh). A functional collective, so a compiled
    block keeps one graph."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return funcol.all_reduce(counts, "sum", dist.group.WORLD)
    return counts


class _Gather(torch.autograd.Function):
    """y = x[index] where every row of x appears exactly k times in y, and row r of x's copies sit at y[back[r·k + j]],
    j < k. The gradient is then a gather and a sum over the k copies, grad_x = grad_y[back].view(-1, k, ...).sum(1):
    no index accumulation (autograd's own indexing backward is an index_put with accumulate: atomic on CUDA, serial
    on CPU)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, back: torch.Tensor, k: int) -> torch.Tensor:
        ctx.save_for_backward(back)
        ctx.k = k
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (back,) = ctx.saved_tensors
        g = grad.index_select(0, back)
        return (g if ctx.k == 1 else g.view(-1, ctx.k, *g.shape[1:]).sum(1)), None, None, None


def dispatch(x: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, k: int) -> torch.Tensor:
    """Tokens x (n, d) → their n·k slots in expert order (N, d): row i is token order[i] // k."""
    return _Gather.apply(x, order // k, inverse, k)


def undispatch(y: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Rows in expert order (N, d) → slot order (N, d), slot s = token·k + choice."""
    return _Gather.apply(y, inverse, order, 1)


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x: (N, d_in) rows sorted by expert; weight: (E, d_out, d_in); offsets: (E,) int32 end row of each expert →
    (N, d_out). One kernel for all experts; nothing leaves the device."""
    return _grouped_mm(x, weight.transpose(-2, -1), offs=offsets)


def loop_matmul(x: torch.Tensor, weight: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """The exact reference: one matmul per expert over its rows (`counts` rows each, in order)."""
    return torch.cat([F.linear(rows, weight[e]) for e, rows in enumerate(x.split(counts))])


class MoE(nn.Module):
    """`shared_expert`: the always-on SwiGLU (llama.MLP over the same norm's layout), or None. `expert_dim_padded`:
    the stored routed hidden size (ModelConfig.padded_ffn), ≥ the logical cfg.expert_dim(d)."""

    def __init__(self, d: int, eps: float, layout: GroupLayout, cfg: MoEConfig, router_output: bool,
                 shared_expert: Optional[nn.Module], expert_dim_padded: Optional[int] = None):
        super().__init__()
        self.cfg, self.d = cfg, d
        E, f = cfg.n_experts, cfg.expert_dim(d)
        fp = expert_dim_padded or f
        self.n_experts, self.top_k, self.expert_dim, self.expert_dim_padded = E, cfg.top_k, f, fp
        self.router = layout.branch(d, E, eps, role=Role.ROUTER, output_side=router_output)
        self.gate_proj = layout.experts(E, d, f, fp, eps)  # (E, fp, d)
        self.up_proj = layout.experts(E, d, f, fp, eps)  # (E, fp, d)
        self.down_proj = ExpertBranch(E, f, d, d_in_padded=fp)  # (E, d, fp): no vectors
        self.shared_expert = shared_expert
        self.shared_expert_gate = (layout.branch(d, 1, eps, role=Role.ROUTER, output_side=False)
                                   if cfg.shared_gate else None)
        # Aux-loss-free balancing: chooses the top-k only, never weights an output; not a parameter (no gradient, no
        # optimizer) but checkpointed with the model, like the load counters of the current step.
        self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32))
        self.register_buffer("tokens_per_expert", torch.zeros(E, dtype=torch.int64))
        # Σ over this step's micro-batches of (aux, z, 1), unscaled, for metrics only.
        self.register_buffer("stat_sums", torch.zeros(3, dtype=torch.float32), persistent=False)
        self.balance_loss: Optional[torch.Tensor] = None  # this forward's weighted aux + z terms, for the trainer

    # ------------------------------------------------------------------------------------------------ forward

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (B, T, d) normalized input → (B, T, d)."""
        shape = h.shape
        x = h.reshape(-1, self.d)  # (n, d), n = B·T tokens
        n, k, E = x.shape[0], self.top_k, self.n_experts
        x_router = x.to(torch.promote_types(x.dtype, torch.float32))  # fp32 at least, also under bf16
        logits = self.router(x_router)  # (n, E)
        probs = logits.softmax(dim=-1)
        choice = probs + self.expert_bias if self.cfg.balance == "bias" else probs
        experts = choice.topk(k, dim=-1).indices  # (n, k)
        weights = probs.gather(-1, experts)  # (n, k): the bias never weights an output
        if self.cfg.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)

        # Sort the n·k slots by expert; slot s = token·k + choice.
        flat = experts.flatten()  # (N,), N = n·k
        order = flat.argsort(stable=True)  # (N,)
        expert_of_row = flat[order]  # (N,) non-decreasing
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        counts = torch.zeros(E, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        rows = dispatch(x, order, inverse, k)  # (N, d): the tokens of expert 0, then of expert 1, …

        y = self.experts(rows, expert_of_row, self._matmul(rows, counts))  # (N, d)

        # Combine: back to slot order (the inverse permutation), then the weighted sum over k.
        y = undispatch(y, order, inverse).view(n, k, self.d)
        out = (y * weights.unsqueeze(-1).to(y.dtype)).sum(dim=1)  # (n, d)
        if self.shared_expert is not None:
            s = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                s = s * torch.sigmoid(self.shared_expert_gate(x_router)).to(s.dtype)
            out = out + s

        self._balance(logits, probs, counts)
        return out.view(shape)

    def experts(self, rows: torch.Tensor, expert_of_row: torch.Tensor, matmul: Callable) -> torch.Tensor:
        """Each row's expert, SwiGLU: rows (N, d) sorted by expert → (N, d)."""
        g = self.gate_proj(rows, expert_of_row, matmul)  # (N, fp)
        u = self.up_proj(rows, expert_of_row, matmul)  # (N, fp)
        return self.down_proj(F.silu(g) * u, expert_of_row, matmul)

    def _matmul(self, rows: torch.Tensor, counts: torch.Tensor) -> Callable:
        if self.uses_grouped(rows):
            offsets = counts.cumsum(0).to(torch.int32)
            return lambda x, w: grouped_matmul(x, w, offsets)
        sizes = counts.tolist()  # the loop needs the sizes on the host
        return lambda x, w: loop_matmul(x, w, sizes)

    def uses_grouped(self, x: torch.Tensor) -> bool:
        """auto: the grouped GEMM where it is fast and supported (CUDA, bf16, 16-byte-aligned widths)."""
        impl = self.cfg.impl
        aligned = self.d % 8 == 0 and self.expert_dim_padded % 8 == 0  # bf16 rows of whole 16-byte units
        if impl == "auto":
            return _grouped_mm is not None and x.is_cuda and x.dtype == torch.bfloat16 and aligned
        if impl == "grouped" and not aligned:
            raise RuntimeError(f"model.moe.impl=grouped needs d_model ({self.d}) and the stored expert width "
                               f"({self.expert_dim_padded}) to be multiples of 8 (16-byte bf16 rows): set "
                               "model.moe.pad_multiple to a multiple of 8, or model.moe.impl=auto (the loop there)")
        if impl == "grouped" and _grouped_mm is None:
            raise RuntimeError("model.moe.impl=grouped needs torch.nn.functional.grouped_mm (torch ≥ 2.8)")
        if impl == "grouped" and x.is_cuda and x.dtype != torch.bfloat16:
            raise RuntimeError(f"model.moe.impl=grouped runs in bf16 on CUDA, but the experts see {x.dtype}: use "
                               "train.dtype=auto or bfloat16, or model.moe.impl=auto (the loop for other dtypes)")
        return impl == "grouped"

    def _balance(self, logits: torch.Tensor, probs: torch.Tensor, counts: torch.Tensor) -> None:
        """Auxiliary terms of this forward. aux = E·Σᵢ fᵢ·Pᵢ (Switch Transformer, with top-k: fᵢ = the share of the
        n·k slots routed to expert i, Pᵢ = its mean router probability): 1 at perfect balance, E at collapse.
        z = mean (logsumexp logits)² (ST-MoE).

        In training, fᵢ counts the micro-batch of every data-parallel rank (one all-reduce of E integers): the ranks'
        averaged gradient is then that of E·Σ fᵢ·Pᵢ over the global micro-batch, so the loss does not depend on how
        the tokens of one forward are split across ranks (global-batch balancing, Qiu et al. 2025, "Demons in the
        Detail"); across gradient-accumulation micro-batches it stays per micro-batch."""
        E = self.n_experts
        if self.cfg.balance == "aux" and self.training and torch.is_grad_enabled():
            counts_all = _sum_over_ranks(counts)
        else:
            counts_all = counts
        share = counts_all.to(probs.dtype) / counts_all.sum()
        aux = E * (share * probs.mean(0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        loss = None
        if self.cfg.balance == "aux" and self.cfg.aux_coef > 0:
            loss = self.cfg.aux_coef * aux
        if self.cfg.z_coef > 0:
            loss = self.cfg.z_coef * z if loss is None else loss + self.cfg.z_coef * z
        self.balance_loss = loss
        if self.training:
            with torch.no_grad():
                self.tokens_per_expert += counts
                self.stat_sums += torch.stack([aux.detach(), z.detach(), torch.ones_like(z)]).to(self.stat_sums)

    # ------------------------------------------------------------------------------------------- bookkeeping

    @torch.no_grad()
    def reset_buffers(self) -> None:
        self.expert_bias.zero_()
        self.reset_step_stats()

    @torch.no_grad()
    def reset_step_stats(self) -> None:
        self.tokens_per_expert.zero_()
        self.stat_sums.zero_()

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor, keep: Optional[torch.Tensor] = None) -> None:
        """Aux-loss-free balancing (Wang et al. 2024; DeepSeek-V3): b ← b + rate·sign(mean load − load), from the
        step's loads summed over every rank, so every rank applies the same update. `keep` (0-dim, 1 or 0, on the
        device): 0 for a step that makes no update (a skipped non-finite step), decided without a host read; the
        bias then stays where it is, like the weights."""
        load = load.to(self.expert_bias)
        delta = self.cfg.bias_rate * torch.sign(load.mean() - load)  # (E,)
        self.expert_bias += delta if keep is None else delta * keep.to(delta.dtype)

    # ---------------------------------------------------------------------------------------------- counting

    def inactive_params(self) -> int:
        """Parameters one token does not use: the (E − k) routed experts it is not sent to (their matrices and their
        own vectors). Logical sizes."""
        per_expert = 3 * self.expert_dim * self.d
        for branch in (self.gate_proj, self.up_proj):
            if branch.out_scale is not None:
                per_expert += branch.out_scale.numel() // self.n_experts
        return (self.n_experts - self.top_k) * per_expert

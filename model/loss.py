"""The fused LM head + cross-entropy: final norm → LM head (its scale vectors, DNP's vocabulary Norm and OR included)
→ mean next-token loss, over chunks of tokens, so the (tokens, vocab) fp32 logits of a whole micro-batch never exist.

At paper scale (vocab 50,304, 16 × 1024 tokens per micro-batch) the plain path's fp32 logits are 3.3 GB, kept for
backward together with their softmax: the largest tensors of the step. Here each chunk's forward and backward run at
once, inside the forward of one autograd Function:

    for each chunk c of rows:  ℓ_c = Σ_rows CE(head(h_c), y_c) / N      (N = all rows)
                               ∂ℓ_c/∂h_c → grad_h[c],  Σ_c ∂ℓ_c/∂θ → grad_θ   (θ: the norm's and the head's params)
    loss = Σ_c ℓ_c;  backward: grad_h · g,  grad_θ · g                    (g: the incoming gradient, a scalar)

so the step holds one chunk's logits plus grad_h (N, d) and one fp32 gradient per head parameter, and computes the
head's matmuls exactly once each (no recomputation). The chunk runs the real modules (`torch.func.functional_call`
with detached leaves), so every design's head is covered by the code that defines it in model/scaling.py.
Rows are whole vocabulary rows: DNP's inner Norm over the vocabulary needs all of a row's logits.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call


# The chunk rule (train.loss_chunk_tokens: null). CPU: 1024 tokens, as before the rule existed. CUDA: as many
# tokens as keep one chunk's fp32 logits and their gradient (2 · tokens · V · 4 B) within 4 GiB, in multiples of
# 1024, between 1024 and 16384 — 10240 at the paper's V = 50,304 (a 0.12B micro-batch of 32 × 1024 tokens: 4 chunks
# instead of 32), 16384 for V ≤ 32,768. Fewer chunks mean fewer launches, fewer autograd.grad calls and fewer passes
# over the fp32 head-gradient accumulator.
CPU_CHUNK_TOKENS = 1024
CUDA_CHUNK_BYTES = 4 << 30
CUDA_CHUNK_RANGE = (1024, 16384)


def default_chunk_tokens(device: torch.device, vocab: int) -> int:
    """The fused head's chunk size when train.loss_chunk_tokens is null (the rule above)."""
    if device.type != "cuda":
        return CPU_CHUNK_TOKENS
    lo, hi = CUDA_CHUNK_RANGE
    fit = CUDA_CHUNK_BYTES // (2 * vocab * 4) // 1024 * 1024
    return max(lo, min(hi, fit))


def head_loss(norm: nn.Module, lm_head: nn.Module, h: torch.Tensor, targets: torch.Tensor,
              chunk: Optional[int], compiled: Optional[str] = None) -> torch.Tensor:
    """Mean cross-entropy of lm_head(norm(h)) against targets, in fp32. h: (B, T, d), targets: (B, T) int64.
    `chunk` > 0: the fused path over chunks of that many tokens; None: the same with the device's chunk
    (`default_chunk_tokens`); 0: the plain path (full logits). `compiled`: a torch.compile backend ("inductor") for
    each chunk's forward and backward, one graph each (fullgraph: a break fails loudly), so the Norms and the
    softmax fuse into few passes over the chunk's logits."""
    if chunk is None:
        chunk = default_chunk_tokens(h.device, lm_head.weight.shape[0])
    h, targets = h.flatten(0, 1), targets.flatten()  # (N, d), (N,)
    if chunk <= 0:
        return _cross_entropy_sum(lm_head(norm(h)), targets) / targets.numel()
    modules = (norm, lm_head)
    names = [[n for n, _ in m.named_parameters()] for m in modules]
    params = [p for m in modules for p in m.parameters()]
    if torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in params)):
        fn = _compiled_chunk_loss(compiled) if compiled else _chunk_loss_sum
        return _FusedHeadLoss.apply(h, targets, chunk, fn, modules, names, *params)
    with torch.no_grad():  # eval: chunks without gradients
        total = sum(_cross_entropy_sum(lm_head(norm(h[s:s + chunk])), targets[s:s + chunk])
                    for s in range(0, h.shape[0], chunk))
    return total / targets.numel()


def _cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Σ over rows of the next-token loss in at least fp32. logits: (n, V), targets: (n,)."""
    return F.cross_entropy(logits.to(_acc(logits.dtype)), targets, reduction="sum")


def _chunk_loss_sum(modules: tuple[nn.Module, nn.Module], params: tuple[dict, dict], h_c: torch.Tensor,
                    targets_c: torch.Tensor) -> torch.Tensor:
    """Σ CE over one chunk, through the real modules with `params` (detached leaves) in place of theirs."""
    x_c = functional_call(modules[0], params[0], (h_c,))
    logits = functional_call(modules[1], params[1], (x_c,))  # (n, V): one chunk's logits only
    return _cross_entropy_sum(logits, targets_c)


_COMPILED: dict[str, Callable] = {}


def _compiled_chunk_loss(backend: str) -> Callable:
    if backend not in _COMPILED:  # built on first use: no import-time side effects (DESIGN.md principle 4)
        _COMPILED[backend] = torch.compile(_chunk_loss_sum, fullgraph=True, dynamic=False, backend=backend)
    return _COMPILED[backend]


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulate in at least fp32 (fp64 stays fp64 for reference runs)."""
    return torch.promote_types(dtype, torch.float32)


class _FusedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, targets: torch.Tensor, chunk: int, fn: Callable,
                modules: tuple[nn.Module, nn.Module], names: Sequence[Sequence[str]],
                *params: torch.Tensor) -> torch.Tensor:
        n_rows = h.shape[0]
        inv_rows = torch.full((), 1.0 / n_rows, dtype=_acc(h.dtype), device=h.device)  # d loss / d Σ_chunk CE
        wants = [ctx.needs_input_grad[6 + i] for i in range(len(params))]
        leaves = [p.detach().requires_grad_(w) for p, w in zip(params, wants)]
        rest = iter(leaves)  # params are the modules' parameters in order: hand each module its own
        by_module = [{n: next(rest) for n in module_names} for module_names in names]
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None  # (N, d)
        grad_params = [torch.zeros_like(p, dtype=_acc(p.dtype)) if w else None for p, w in zip(params, wants)]
        wrt_params = [leaf for leaf, w in zip(leaves, wants) if w]
        loss = torch.zeros((), dtype=_acc(h.dtype), device=h.device)
        for s in range(0, n_rows, chunk):
            h_c = h[s:s + chunk].detach().requires_grad_(grad_h is not None)  # (n, d)
            with torch.enable_grad():
                sum_c = fn(modules, by_module, h_c, targets[s:s + chunk])  # Σ CE over the chunk's rows
            inputs = ([h_c] if grad_h is not None else []) + wrt_params
            grads = list(torch.autograd.grad(sum_c, inputs, grad_outputs=inv_rows)) if inputs else []
            if grad_h is not None:
                grad_h[s:s + chunk] = grads.pop(0)
            for acc, g in zip((a for a in grad_params if a is not None), grads):
                acc += g  # fp32 accumulation over chunks
            loss += sum_c.detach() * inv_rows
        ctx.save_for_backward(grad_h, *[g for g in grad_params if g is not None])
        ctx.has_grad_h, ctx.wants = grad_h is not None, wants
        ctx.param_dtypes = [p.dtype for p in params]
        return loss

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        saved = list(ctx.saved_tensors)
        grad_h = saved.pop(0)
        grad_h = grad_h * grad_out.to(grad_h.dtype) if ctx.has_grad_h else None
        grad_params = []
        for wants, dtype in zip(ctx.wants, ctx.param_dtypes):
            grad_params.append((saved.pop(0) * grad_out).to(dtype) if wants else None)
        return (grad_h, None, None, None, None, None, *grad_params)

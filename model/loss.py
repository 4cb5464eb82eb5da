"""The LM head and the loss: final norm → LM head (with its scale vectors, DNP's vocabulary Norm included) → mean
next-token cross-entropy, over chunks of tokens, so the (tokens, vocab) fp32 logits of a whole micro-batch never
exist at once. A chunk's logits are recomputed in backward rather than kept (torch.utils.checkpoint). Rows are whole
vocabulary rows: DNP's inner Norm over the vocabulary needs all of a row's logits (docs/paper.md §1.9).

At paper scale (vocab 50,304, 16 × 1024 tokens per micro-batch) full fp32 logits are 3.3 GB, kept for backward with
their softmax. The fast path's fused head (fast/head.py) computes the same loss with fewer passes over the logits.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# (norm, lm_head, h (B, T, d), targets (B, T), chunk) → the mean next-token loss: Llama.loss_fn
HeadLoss = Callable[[nn.Module, nn.Module, torch.Tensor, torch.Tensor, Optional[int]], torch.Tensor]


# The chunk rule (train.loss_chunk_tokens: null). CPU: 1024 tokens, as before the rule existed. CUDA: at most `fit`
# tokens a chunk, the largest multiple of 1024 in 1024–16384 whose fp32 logits and their gradient (2 · tokens · V ·
# 4 B) stay within 4 GiB (10240 at the paper's V = 50,304; 16384 for V ≤ 32,768), and chunks of equal size: the
# fewest n ≥ ceil(N / fit) that divide the micro-batch's N tokens (searched up to 2·ceil(N / fit); failing that,
# ceil(N / n) with a smaller last chunk). A 0.12B micro-batch (32 × 1024 tokens) runs 4 chunks of 8192, not 32 of
# 1024, and not 3 of 10240 plus a tail of 2048, which would compile a second head graph (the chunk graph has static
# shapes) and run a fourth pass for a sixteenth of the tokens. Fewer chunks mean fewer launches, fewer autograd.grad
# calls and fewer passes over the fp32 head-gradient accumulator.
CPU_CHUNK_TOKENS = 1024
CUDA_CHUNK_BYTES = 4 << 30
CUDA_CHUNK_RANGE = (1024, 16384)


def default_chunk_tokens(device: torch.device, vocab: int, n_tokens: int) -> int:
    """The fused head's chunk size for a micro-batch of `n_tokens` tokens when train.loss_chunk_tokens is null (the
    rule above)."""
    if device.type != "cuda":
        return CPU_CHUNK_TOKENS
    lo, hi = CUDA_CHUNK_RANGE
    fit = max(lo, min(hi, CUDA_CHUNK_BYTES // (2 * vocab * 4) // 1024 * 1024))
    fewest = max(1, -(-n_tokens // fit))
    for n in range(fewest, 2 * fewest + 1):
        if n_tokens % n == 0:
            return n_tokens // n
    return -(-n_tokens // fewest)


def chunked_cross_entropy(norm: nn.Module, lm_head: nn.Module, h: torch.Tensor, targets: torch.Tensor,
                          chunk: Optional[int]) -> torch.Tensor:
    """Mean cross-entropy of lm_head(norm(h)) against targets, in at least fp32. h: (B, T, d), targets: (B, T) int64.
    `chunk` > 0: over chunks of that many tokens; None: the device's chunk (`default_chunk_tokens`); 0: full
    logits at once."""
    h, targets = h.flatten(0, 1), targets.flatten()  # (N, d), (N,)
    if chunk is None:
        chunk = default_chunk_tokens(h.device, lm_head.weight.shape[0], targets.numel())
    if chunk <= 0 or chunk >= targets.numel():
        return cross_entropy_sum(lm_head(norm(h)), targets) / targets.numel()
    total = torch.zeros((), dtype=accumulation_dtype(h.dtype), device=h.device)
    for s in range(0, h.shape[0], chunk):
        h_c, t_c = h[s:s + chunk], targets[s:s + chunk]
        if torch.is_grad_enabled():  # the chunk's (n, V) logits are recomputed in backward, not kept
            total = total + checkpoint(_chunk_loss, norm, lm_head, h_c, t_c, use_reentrant=False)
        else:
            total = total + _chunk_loss(norm, lm_head, h_c, t_c)
    return total / targets.numel()


def _chunk_loss(norm: nn.Module, lm_head: nn.Module, h_c: torch.Tensor, targets_c: torch.Tensor) -> torch.Tensor:
    return cross_entropy_sum(lm_head(norm(h_c)), targets_c)


def cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Σ over rows of the next-token loss in at least fp32. logits: (n, V), targets: (n,)."""
    return F.cross_entropy(logits.to(accumulation_dtype(logits.dtype)), targets, reduction="sum")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulate in at least fp32 (fp64 stays fp64 for reference runs)."""
    return torch.promote_types(dtype, torch.float32)

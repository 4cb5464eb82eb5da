"""Rotary position embeddings in the rotate-half convention of Hugging Face's Llama, so exported q/k weights need
no permutation."""
from __future__ import annotations

import torch


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device, dtype: torch.dtype):
    """cos, sin of shape (seq_len, head_dim). Computed in float32 as transformers does (float64 for float64 runs,
    so the float64 reference tests stay exact)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.int64).to(work) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=work), inv_freq)  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, H, hd); cos, sin: (T, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]

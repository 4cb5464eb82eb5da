"""Typed model configuration: sizes, the scale-vector knobs (PAPER.md §1) and parameter roles.

Pure data: no torch imports, so config loading stays cheap and the training side can reuse these types.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, Optional

Placement = Literal["none", "input", "ap", "dp", "dnp"]
Reparam = Literal["direct", "or", "er"]


class Role(str, enum.Enum):
    """Every parameter has exactly one role; weight decay, Muon vs AdamW and telemetry key off it."""

    EMBED = "embed"
    LM_HEAD = "lm_head"
    MATRIX = "matrix"  # 2-D weights inside the blocks (q/k/v/o, gate/up/down)
    SCALE_INPUT = "scale_input"  # Input-Norm vectors: read directly by a linear map (PAPER.md §1.7)
    SCALE_OUTPUT = "scale_output"  # Output-Norm vectors: DNP/AP/DP output side, Q/K-Norm, Gemma output norms


@dataclass
class ScaleConfig:
    """Where the scale vectors sit and how they are parameterized (PAPER.md §1.4–1.6, DESIGN.md).

    For every linear map W_c that reads a Pre-Norm output: y = u_c ⊙ post(W_c (v_c ⊙ Norm x)).
    """

    heterogeneous: bool = False  # HG: one input-side v per branch (q, k, v, gate, up) instead of one per norm
    placement: Placement = "input"  # none | input (Llama) | ap (u only) | dp (u and v) | dnp (u, inner Norm, v)
    reparam: Reparam = "direct"  # direct γ | or: γ = β·Norm(α) | er: γ = e^β · e^(α − mean α)
    lm_head: bool = False  # the final-norm → LM-head branch takes `placement` too (PAPER.md §2.4)

    @property
    def has_vectors(self) -> bool:
        return self.placement != "none"

    @property
    def input_side(self) -> bool:
        return self.placement in ("input", "dp", "dnp")

    @property
    def output_side(self) -> bool:
        return self.placement in ("ap", "dp", "dnp")

    @property
    def inner_norm(self) -> bool:
        return self.placement == "dnp"

    @property
    def foldable(self) -> bool:
        """True when every vector folds exactly into the adjacent weights (no inner Norm)."""
        return self.placement != "dnp"


@dataclass
class ModelConfig:
    d_model: int = 768
    n_layers: int = 6
    n_heads: int = 12
    n_kv_heads: Optional[int] = None  # None: multi-head attention (= n_heads); fewer: GQA
    d_ffn: Optional[int] = None  # None: int(8·d_model/3) (PAPER.md §1.2)
    vocab_size: Optional[int] = None  # None: the tokenizer's n_vocab rounded up to vocab_multiple
    vocab_multiple: int = 64  # GPT-2's 50,257 → 50,304, as nanoGPT and PAPER.md §2.3
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    gemma_norms: bool = False  # Fig. 3 layout: Q/K-Norm + attention-output and FFN-output norms (PAPER.md §3.4)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.d_ffn if self.d_ffn is not None else int(8 * self.d_model / 3)

    @property
    def padded_vocab(self) -> int:
        if self.vocab_size is None:
            raise ValueError("model.vocab_size is unresolved; resolve it from the tokenizer first")
        return self.vocab_size

    def invariants(self) -> list[tuple[str, str]]:
        """(dotted key, problem) for every violated invariant; config.py turns these into ConfigErrors."""
        bad = []
        for key in ("d_model", "n_layers", "n_heads", "vocab_multiple"):
            if getattr(self, key) <= 0:
                bad.append((key, "must be positive"))
        if self.n_heads > 0 and self.d_model % self.n_heads:
            bad.append(("d_model", f"{self.d_model} is not divisible by n_heads={self.n_heads}"))
        elif self.n_heads > 0 and self.head_dim % 2:
            bad.append(("n_heads", f"head_dim={self.head_dim} must be even for RoPE"))
        if self.n_kv_heads is not None and (self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads):
            bad.append(("n_kv_heads", f"{self.n_kv_heads} must be positive and divide n_heads={self.n_heads}"))
        if self.d_ffn is not None and self.d_ffn <= 0:
            bad.append(("d_ffn", "must be positive"))
        if self.vocab_size is not None and self.vocab_size <= 0:
            bad.append(("vocab_size", "must be positive"))
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_theta <= 0:
            bad.append(("norm_eps", "norm_eps, init_std and rope_theta must be positive"))
        if self.gemma_norms and self.scale.inner_norm:
            bad.append(("gemma_norms", "with scale.placement=dnp, q/k would be normalized twice "
                        "(DNP on q/k already is Q/K-Norm); use one or the other"))
        if self.scale.lm_head and not self.scale.has_vectors:
            bad.append(("scale.lm_head", "has no effect with scale.placement=none; set it to false"))
        return bad

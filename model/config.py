"""Typed model configuration: sizes, the scale-vector knobs (docs/paper.md §1) and parameter roles.

Pure data: no torch imports, so config loading stays cheap and the training side can reuse these types.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Literal, Optional

from strictconfig.config import resumable

Placement = Literal["none", "input", "ap", "dp", "dnp"]
Reparam = Literal["direct", "or", "er"]
InvariantMagnitude = Literal["keep", "remove"]


class Role(str, enum.Enum):
    """Every parameter has exactly one role; weight decay, Muon vs AdamW and telemetry key off it."""

    EMBED = "embed"
    LM_HEAD = "lm_head"
    MATRIX = "matrix"  # 2-D weights inside the blocks (q/k/v/o, gate/up/down, the shared expert's)
    EXPERT_MATRIX = "expert_matrix"  # stacked routed-expert weights (E, out, in): Muon per expert
    ROUTER = "router"  # the MoE router (and the optional shared-expert gate): Muon unless optim.muon.router false
    SCALE_INPUT = "scale_input"  # Input-Norm vectors: read directly by a linear map (docs/paper.md §1.7)
    SCALE_OUTPUT = "scale_output"  # Output-Norm vectors: DNP/AP/DP output side, Q/K-Norm, Gemma output norms


@dataclass
class ScaleConfig:
    """Where the scale vectors sit and how they are parameterized (docs/paper.md §1.4–1.6, docs/design.md).

    For every linear map W_c that reads a Pre-Norm output: y = u_c ⊙ post(W_c (v_c ⊙ Norm x)).
    """

    heterogeneous: bool = False  # HG: one input-side v per branch (q, k, v, gate, up) instead of one per norm
    placement: Placement = "input"  # none | input (Llama) | ap (u only) | dp (u and v) | dnp (u, inner Norm, v)
    reparam: Reparam = "direct"  # direct γ | or: γ = β·Norm(α) | er: γ = e^β · e^(α − mean α)
    lm_head: bool = False  # the final-norm → LM-head branch takes `placement` too (docs/paper.md §2.4)
    # MoE only: the router branch takes the output side of `placement` too (a vector over the expert logits, and
    # DNP's Norm of the logits). Its input side always follows its norm, like every branch. [U] off by default.
    router: bool = False
    # An input-side vector that only DNP's inner Norm reads reaches the loss through its direction alone; its
    # magnitude (OR's β, ER's e^β, a direct vector's scale) only through the Norm's eps, so decay can walk it to 0
    # and switch the branch off (docs/paper.md §1.7). keep: the paper's literal form. remove: that vector has no
    # magnitude (OR γ = Norm(α), ER γ = e^(α − mean α), direct γ = Norm(α)), the same function at init.
    invariant_magnitude: InvariantMagnitude = "keep"

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


Balance = Literal["aux", "bias", "none"]
ExpertImpl = Literal["auto", "grouped", "loop"]


@dataclass
class MoEConfig:
    """Llama-MoE's FFN (docs/paper.md §2.2): `n_experts` routed SwiGLU experts, `top_k` per token (token choice,
    dropless), plus `n_shared` always-on experts. Everything the paper leaves open is a choice here ([U])."""

    n_experts: int = 32  # [P]
    top_k: int = 4  # [P]
    n_shared: int = 1  # 0 or 1 [P: 1, "following QwenMoE"]
    expert_ffn: Optional[int] = None  # routed expert hidden size; None: int(2·d_model/3) [P]
    shared_ffn: Optional[int] = None  # shared expert hidden size; None: int(8·d_model/3) [P]
    renormalize: bool = False  # top-k weights renormalized to sum 1 [U: off, as Qwen1.5/2-MoE]
    shared_gate: bool = False  # Qwen-style sigmoid gate on the shared expert [U: off; the counts have none]
    balance: Balance = "aux"  # aux: Switch loss | bias: aux-loss-free (DeepSeek-V3) | none [U]
    aux_coef: float = 0.01  # per MoE layer, on E·Σ fᵢ·Pᵢ (1 at perfect balance) [U]
    bias_rate: float = 1.0e-3  # balance=bias: bias step per optimizer step, b ← b + rate·sign(mean load − load)
    z_coef: float = 0.0  # router z-loss, mean (logsumexp logits)² (ST-MoE) [U: off]
    # Routed hidden zero-padded to a multiple of this; None: model.ffn_pad_multiple, like every FFN. Configs written
    # before that key existed say 8 here (the grouped GEMM's 16-byte bf16 strides), which keeps meaning 8.
    pad_multiple: Optional[int] = resumable(None)  # storage only, as below
    impl: ExpertImpl = "auto"  # auto: grouped GEMM on CUDA in bf16, else the exact per-expert loop

    def expert_dim(self, d_model: int) -> int:
        return self.expert_ffn if self.expert_ffn is not None else int(2 * d_model / 3)

    def shared_dim(self, d_model: int) -> int:
        return self.shared_ffn if self.shared_ffn is not None else int(8 * d_model / 3)

    def invariants(self) -> list[tuple[str, str]]:
        bad = []
        if self.n_experts <= 0:
            bad.append(("n_experts", "must be positive"))
        if not 0 < self.top_k <= max(self.n_experts, 1):
            bad.append(("top_k", f"{self.top_k} must lie in [1, n_experts={self.n_experts}]"))
        if self.n_shared not in (0, 1):
            bad.append(("n_shared", f"{self.n_shared}: 0 or 1 shared expert (widen it with shared_ffn)"))
        for key in ("expert_ffn", "shared_ffn"):
            if getattr(self, key) is not None and getattr(self, key) <= 0:
                bad.append((key, "must be positive (or null for the paper's size)"))
        if self.shared_gate and self.n_shared == 0:
            bad.append(("shared_gate", "gates the shared expert, but n_shared is 0"))
        for key in ("aux_coef", "bias_rate", "z_coef"):
            value = getattr(self, key)
            if not (value >= 0 and value < float("inf")):
                bad.append((key, f"{value} must be a finite number ≥ 0"))
        if self.pad_multiple is not None and self.pad_multiple <= 0:
            bad.append(("pad_multiple", "must be positive (1: no padding; null: model.ffn_pad_multiple)"))
        return bad


@dataclass
class ModelConfig:
    d_model: int = 768
    n_layers: int = 6
    n_heads: int = 12
    n_kv_heads: Optional[int] = None  # None: multi-head attention (= n_heads); fewer: GQA
    d_ffn: Optional[int] = None  # None: int(8·d_model/3) (docs/paper.md §1.2)
    vocab_size: Optional[int] = None  # None: the tokenizer's n_vocab rounded up to vocab_multiple
    vocab_multiple: int = 64  # GPT-2's 50,257 → 50,304, as nanoGPT and docs/paper.md §2.3
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    gemma_norms: bool = False  # Fig. 3 layout: Q/K-Norm + attention-output and FFN-output norms (docs/paper.md §3.4)
    moe: Optional[MoEConfig] = None  # None: dense SwiGLU FFN; set: Llama-MoE (docs/paper.md §2.2)
    # Storage only: every FFN hidden size (the dense MLP, the MoE's shared and routed experts) is zero-padded to a
    # multiple of this, so bf16 rows stay 128-byte aligned (int(8d/3) = 2730 at d 1024 is not even 16-byte aligned,
    # and cuBLAS then leaves its fastest kernels). The padding is exact zeros that no gradient reaches; parameter
    # counts, FLOPs, init and export use the logical size. 1: no padding. Checkpoints load across any value, so a
    # resume may change it.
    ffn_pad_multiple: int = resumable(64)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.d_ffn if self.d_ffn is not None else int(8 * self.d_model / 3)

    def padded_ffn(self, hidden: int, routed: bool = False) -> int:
        """The stored width of an FFN hidden size `hidden`: rounded up to ffn_pad_multiple (routed experts: to
        moe.pad_multiple where a config sets it)."""
        m = self.ffn_pad_multiple
        if routed and self.moe is not None and self.moe.pad_multiple is not None:
            m = self.moe.pad_multiple
        return -(-hidden // m) * m

    @property
    def padded_vocab(self) -> int:
        if self.vocab_size is None:
            raise ValueError("model.vocab_size is unresolved; resolve it from the tokenizer first")
        return self.vocab_size

    def with_vocab(self, n_vocab: int, tokenizer: str = "the tokenizer") -> "ModelConfig":
        """This config with vocab_size filled in for a tokenizer of `n_vocab` tokens: as set (which must hold them
        all), else n_vocab rounded up to vocab_multiple (GPT-2: 50,257 → 50,304). A ValueError names the key."""
        if self.vocab_size is not None:
            if self.vocab_size < n_vocab:
                raise ValueError(f"model.vocab_size: {self.vocab_size} is smaller than the tokenizer's {n_vocab} "
                                 f"tokens ({tokenizer!r}); set it to null to derive it")
            return self
        m = self.vocab_multiple
        return dataclasses.replace(self, vocab_size=-(-n_vocab // m) * m)

    def invariants(self) -> list[tuple[str, str]]:
        """(dotted key, problem) for every violated invariant; config.py turns these into ConfigErrors."""
        bad = []
        for key in ("d_model", "n_layers", "n_heads", "vocab_multiple", "ffn_pad_multiple"):
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
        for key in ("norm_eps", "init_std", "rope_theta"):
            if getattr(self, key) <= 0:
                bad.append((key, f"{getattr(self, key)} must be positive"))
        if self.gemma_norms and self.scale.inner_norm:
            bad.append(("gemma_norms", "with scale.placement=dnp, q/k would be normalized twice "
                        "(DNP on q/k already is Q/K-Norm); use one or the other"))
        if self.scale.lm_head and not self.scale.has_vectors:
            bad.append(("scale.lm_head", "has no effect with scale.placement=none; set it to false"))
        if self.scale.router and (self.moe is None or not self.scale.output_side):
            bad.append(("scale.router", "gives the MoE router the output side of placement ap | dp | dnp; "
                                        "it has no effect on a dense model or another placement: set it to false"))
        if self.moe is not None:
            bad += [(f"moe.{k}", p) for k, p in self.moe.invariants()]
        return bad

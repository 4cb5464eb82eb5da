"""Llama (docs/paper.md §1.2, §2): token embedding, n_layers Pre-Norm blocks (RoPE attention with SDPA, SwiGLU MLP — or the
MoE FFN of model/moe.py when `model.moe` is set), a final norm and an untied LM head; no biases. Where the scale vectors
sit is decided by model/scaling.py.

Names follow Hugging Face's Llama (q_proj, gate_proj, …) so export is a renaming.
"""
from __future__ import annotations

import math
import zlib
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, distribute_tensor

from model.config import ModelConfig, Role
from model.loss import HeadLoss, chunked_cross_entropy
from model.moe import MoE
from model.rope import apply_rope, rope_tables
from model.scaling import ExpertBranch, GroupLayout, Norm, ScaledLinear, extra_norm, group_layout
from model.vectors import ScaleVector, gamma_one


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd, eps = cfg.d_model, cfg.head_dim, cfg.norm_eps
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, hd
        lay = group_layout(cfg.scale, n_branches=3)
        # DNP's inner Norm is per head on q/k/v (docs/paper.md §1.5); on q/k it is Q/K-Norm, applied before RoPE [I §1.9].
        self.q_proj = lay.branch(d, cfg.n_heads * hd, eps, inner_group=hd)
        self.k_proj = lay.branch(d, cfg.kv_heads * hd, eps, inner_group=hd)
        self.v_proj = lay.branch(d, cfg.kv_heads * hd, eps, inner_group=hd)
        self.o_proj = ScaledLinear(cfg.n_heads * hd, d)  # no vectors: it reads no Pre-Norm (docs/paper.md §1.9)
        # Gemma layout (Fig. 3): Q/K-Norm with one γ ∈ R^head_dim shared across heads, as in Gemma3.
        self.q_norm = extra_norm(cfg.scale, cfg.n_heads * hd, eps, group=hd) if cfg.gemma_norms else None
        self.k_norm = extra_norm(cfg.scale, cfg.kv_heads * hd, eps, group=hd) if cfg.gemma_norms else None

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """h: (B, T, d) normalized input → (B, T, d)."""
        B, T, _ = h.shape
        q = self.q_proj(h)  # (B, T, H·hd): u_q ⊙ Norm_head(W_q (v_q ⊙ h)) under DNP
        k = self.k_proj(h)  # (B, T, KV·hd)
        v = self.v_proj(h)  # (B, T, KV·hd)
        if self.q_norm is not None:  # the Gemma layout's Q/K-Norm
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.view(B, T, self.n_heads, self.head_dim), cos, sin)  # (B, T, H, hd)
        k = apply_rope(k.view(B, T, self.n_kv_heads, self.head_dim), cos, sin)  # (B, T, KV, hd)
        v = v.view(B, T, self.n_kv_heads, self.head_dim)
        y = F.scaled_dot_product_attention(  # (B, H, T, hd)
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
            enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: W_down(SiLU(gate) ⊙ up), each of gate/up a branch of the FFN pre-norm (the dense FFN, and the MoE's
    shared expert). The hidden size f is stored as `f_padded` (≥ f, model.ffn_pad_multiple): gate/up's extra rows and
    down's extra columns are zeros, so the extra hidden units are SiLU(0)·0 = 0 and no gradient reaches them."""

    def __init__(self, d: int, f: int, eps: float, layout: GroupLayout, f_padded: Optional[int] = None):
        super().__init__()
        self.gate_proj = layout.branch(d, f, eps, d_out_padded=f_padded)  # W: (f_padded, d)
        self.up_proj = layout.branch(d, f, eps, d_out_padded=f_padded)  # W: (f_padded, d)
        self.down_proj = ScaledLinear(f, d, d_in_padded=f_padded)  # W: (d, f_padded)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (..., d) normalized input → (..., d)."""
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))  # (..., f_padded) inside


def ffn(cfg: ModelConfig, layout: GroupLayout) -> nn.Module:
    """The FFN of a block: the dense SwiGLU, or the MoE (routed experts + the shared expert, docs/paper.md §2.2)."""
    d, eps = cfg.d_model, cfg.norm_eps
    if cfg.moe is None:
        return MLP(d, cfg.ffn_dim, eps, layout, cfg.padded_ffn(cfg.ffn_dim))
    fs, fe = cfg.moe.shared_dim(d), cfg.moe.expert_dim(d)
    shared = MLP(d, fs, eps, layout, cfg.padded_ffn(fs)) if cfg.moe.n_shared else None
    return MoE(d, eps, layout, cfg.moe, router_output=cfg.scale.router, shared_expert=shared,
               expert_dim_padded=cfg.padded_ffn(fe, routed=True))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, eps = cfg.d_model, cfg.norm_eps
        self.attn_norm = group_layout(cfg.scale, 3).norm(d, eps)
        self.attn = Attention(cfg)
        ffn_layout = group_layout(cfg.scale, 2)  # gate, up (and with MoE: router, experts, shared expert)
        # With MoE, the router normalizes its logits only under scale.router, and the shared-expert gate never does
        every_branch_normalizes = cfg.moe is None or (cfg.scale.router and not cfg.moe.shared_gate)
        self.ffn_norm = ffn_layout.norm(d, eps, only_norms_read=every_branch_normalizes)
        self.mlp = ffn(cfg, ffn_layout)
        self.attn_out_norm = extra_norm(cfg.scale, d, eps) if cfg.gemma_norms else None
        self.ffn_out_norm = extra_norm(cfg.scale, d, eps) if cfg.gemma_norms else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a = self.attn(self.attn_norm(x), cos, sin)
        x = x + (a if self.attn_out_norm is None else self.attn_out_norm(a))
        m = self.mlp(self.ffn_norm(x))
        return x + (m if self.ffn_out_norm is None else self.ffn_out_norm(m))


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        V, d = cfg.padded_vocab, cfg.d_model
        self.tok_embeddings = nn.Embedding(V, d)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        head = group_layout(cfg.scale, n_branches=1, takes_placement=cfg.scale.lm_head)
        self.norm = head.norm(d, cfg.norm_eps)
        # With DNP on the head, the inner Norm runs over the whole vocabulary of logits (docs/paper.md §1.9 [I]).
        self.lm_head = head.branch(d, V, cfg.norm_eps, role=Role.LM_HEAD)
        # The head and loss: the plain chunked cross-entropy; the fast path (fast/) puts its fused head here
        self.loss_fn: HeadLoss = chunked_cross_entropy

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None,
                loss_chunk: Optional[int] = 0) -> torch.Tensor:
        """tokens: (B, T) int64 → logits (B, T, V); with targets (B, T): the mean next-token loss (fp32) instead,
        over chunks of `loss_chunk` tokens (model/loss.py; 0: full logits, None: by device)."""
        x = self.tok_embeddings(tokens)  # (B, T, d)
        cos, sin = rope_tables(tokens.shape[1], self.cfg.head_dim, self.cfg.rope_theta, x.device, x.dtype)
        for block in self.layers:
            x = block(x, cos, sin)
        if targets is not None:
            return self.loss_fn(self.norm, self.lm_head, x, targets, loss_chunk)
        return self.lm_head(self.norm(x))

    # ------------------------------------------------------------------------------------------ initialization

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """The one init scheme. Every matrix and the embedding ~ N(0, init_std²); o_proj and down_proj (the experts'
        too), which write into the residual stream, use init_std/√(2·n_layers) (GPT-2's depth scaling); every scale
        vector starts at γ = 1 (docs/paper.md §1.1); MoE balancing buffers start at 0. Each parameter is drawn whole from a
        generator seeded by (seed, its name), then sharded if it is a DTensor, so the model is identical for any world
        size and any module order. A padded FFN weight (model.ffn_pad_multiple) draws its logical shape and pads it
        with zeros, so the padding never changes a value: the logical weights are those of the unpadded model."""
        depth_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for module in self.modules():
            if isinstance(module, MoE):
                module.reset_buffers()
        logical, roles = self.logical_shapes(), self.param_roles()
        for mname, module in self.named_modules():
            for pname, p in module.named_parameters(recurse=False):
                if roles[f"{mname}.{pname}" if mname else pname] in (Role.SCALE_INPUT, Role.SCALE_OUTPUT):
                    p.fill_(gamma_one(module.reparam))  # γ = 1; by role, not by shape: the experts' u_e are (E, d)
        for name, p in self.named_parameters():
            if roles[name] in (Role.SCALE_INPUT, Role.SCALE_OUTPUT):
                continue
            std = depth_std if name.endswith(("o_proj.weight", "down_proj.weight")) else self.cfg.init_std
            gen = torch.Generator(device=p.device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            shape = logical.get(name, tuple(p.shape))
            full = torch.empty(shape, device=p.device, dtype=torch.float32).normal_(0.0, std, generator=gen)
            if shape != tuple(p.shape):
                full = torch.nn.functional.pad(full, [x for n, m in zip(reversed(shape), reversed(p.shape))
                                                      for x in (0, m - n)])
            _copy_full(p, full)

    def moe_layers(self) -> Iterator[tuple[int, MoE]]:
        for i, block in enumerate(self.layers):
            if isinstance(block.mlp, MoE):
                yield i, block.mlp

    def aux_loss(self) -> torch.Tensor:
        """The MoE balancing terms of the last forward (aux and z, already weighted), summed over layers; 0 for a
        dense model. The trainer adds it to the LM loss and scales both alike under gradient accumulation."""
        terms = [m.balance_loss for _, m in self.moe_layers() if m.balance_loss is not None]
        if not terms:
            return torch.zeros((), device=self.tok_embeddings.weight.device)
        return torch.stack(terms).sum()

    def logical_shapes(self) -> dict[str, tuple[int, ...]]:
        """{parameter name: unpadded shape} of every FFN weight (dense MLP, shared and routed experts), whose hidden
        size may be stored zero-padded (model.ffn_pad_multiple): what init draws, counts count, Muon's update scale
        reads, export writes and a checkpoint re-pads across."""
        out = {}
        for name, module in self.named_modules():
            if isinstance(module, (MLP, MoE)):
                out.update({f"{name}.{n}.weight": getattr(module, n).logical_shape
                            for n in ("gate_proj", "up_proj", "down_proj")})
        return out

    # --------------------------------------------------------------------------------------------------- roles

    def param_roles(self) -> dict[str, Role]:
        """The role of every parameter, keyed by named_parameters() name. Asserts the roles cover each parameter once."""
        roles: dict[str, Role] = {}
        for mname, module in self.named_modules():
            prefix = f"{mname}." if mname else ""
            if isinstance(module, nn.Embedding):
                local = {"weight": Role.EMBED}
            else:  # a ScaleVector's parameters, a linear map's weight: the module's role (none: must own none)
                local = {n: getattr(module, "role", None) for n, _ in module.named_parameters(recurse=False)}
            for n, role in local.items():
                assert role is not None, f"parameter {prefix}{n} has no role"
                assert f"{prefix}{n}" not in roles, f"parameter {prefix}{n} has two roles"
                roles[f"{prefix}{n}"] = role
        names = [n for n, _ in self.named_parameters()]
        assert sorted(names) == sorted(roles), f"roles do not cover the parameters: {set(names) ^ set(roles)}"
        return roles

    def norm_groups(self) -> list[tuple[Norm, list[ScaledLinear | ExpertBranch]]]:
        """Each Pre-Norm and the linear maps that read its output (docs/paper.md §1.4): attention's q/k/v, the FFN's
        branches (with MoE the router and the experts too), the final norm's LM head."""
        out: list[tuple[Norm, list[ScaledLinear | ExpertBranch]]] = []
        for blk in self.layers:
            out.append((blk.attn_norm, [blk.attn.q_proj, blk.attn.k_proj, blk.attn.v_proj]))
            out.append((blk.ffn_norm, [b for _, b in ffn_branches(blk.mlp)]))
        out.append((self.norm, [self.lm_head]))
        return out

    def invariant_magnitudes(self) -> set[str]:
        """The names of the magnitudes β (OR, ER) of every input-side vector whose every reader normalizes its
        output first (DNP's inner Norm), as this reference model names them (`layers.0.attn.q_proj.in_scale.beta`):
        the loss does not depend on such a β but through the Norm's eps, so it gets almost no gradient, only weight
        decay (docs/paper.md §1.7; optim.scale_wd_invariant). A branch's own v counts when its branch has an inner
        Norm; a norm's shared γ when each of its branches has one (the MoE router has none unless
        model.scale.router). Direct vectors have no separate magnitude, and vectors built without one
        (model.scale.invariant_magnitude: remove) have none to mark."""
        vectors = []
        for norm, branches in self.norm_groups():
            if norm.scale is not None and all(b.inner is not None for b in branches):
                vectors.append(norm.scale)
            vectors += [b.in_scale for b in branches if b.in_scale is not None and b.inner is not None]
        names = {id(m): n for n, m in self.named_modules()}
        return {f"{names[id(v)]}.beta" for v in vectors if v.reparam != "direct" and v.has_magnitude}

    def scale_vectors(self) -> Iterator[tuple[str, ScaleVector]]:
        for name, module in self.named_modules():
            if isinstance(module, ScaleVector):
                yield name, module


def ffn_branches(mlp: nn.Module) -> list[tuple[str, ScaledLinear | ExpertBranch]]:
    """The linear maps that read the FFN pre-norm's output, by name under the block's `mlp`."""
    if not isinstance(mlp, MoE):
        return [("gate_proj", mlp.gate_proj), ("up_proj", mlp.up_proj)]
    out = [("router", mlp.router), ("gate_proj", mlp.gate_proj), ("up_proj", mlp.up_proj)]
    if mlp.shared_expert is not None:
        out += [("shared_expert.gate_proj", mlp.shared_expert.gate_proj),
                ("shared_expert.up_proj", mlp.shared_expert.up_proj)]
    if mlp.shared_expert_gate is not None:
        out.append(("shared_expert_gate", mlp.shared_expert_gate))
    return out


def _copy_full(p: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full-size tensor into p, taking only the local shard when p is an FSDP2 DTensor."""
    if isinstance(p, DTensor):
        # Every rank drew the same full tensor, so each slices its own shard: no communication.
        p.copy_(distribute_tensor(full.to(p.dtype), p.device_mesh, p.placements, src_data_rank=None))
    else:
        p.copy_(full)


def build_model(cfg: ModelConfig, device: Optional[torch.device | str] = None, seed: int = 0,
                dtype: torch.dtype = torch.float32) -> Llama:
    """Construct on the meta device, materialize on `device`, then init: the single-process path (the trainer does
    the same with fully_shard between construction and init)."""
    with torch.device("meta"):
        model = Llama(cfg)
    model.to_empty(device=device or "cpu")
    model.init_weights(seed)
    return model.to(dtype)

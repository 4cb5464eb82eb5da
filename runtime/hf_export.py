"""Our Llama as transformers' LlamaForCausalLM: its config, the folded weights under its names, and a directory
`LlamaForCausalLM.from_pretrained` loads (config.json + model.safetensors).

Every scale-vector design without an inner Norm folds exactly into a plain Llama (docs/paper.md §1.8), so the export
gives the same logits; the FFN weights are written at their logical size, without model.ffn_pad_multiple's storage
padding. The benchmark's reference row (bench/steps.py) builds transformers' Llama from the same config.
transformers and safetensors are imported only when a function needs them, so training never needs them.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from model.config import ModelConfig, ScaleConfig
from model.llama import Llama, ffn_branches
from model.scaling import Norm, ScaledLinear


_LAYER_NAMES = {  # ours → transformers', inside layers.{i}
    "attn_norm.scale.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "ffn_norm.scale.weight": "post_attention_layernorm.weight",  # HF's name for Llama's pre-FFN norm
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}


@torch.no_grad()
def folded_state_dict(model: Llama) -> dict[str, torch.Tensor]:
    """Fold every vector into the adjacent weights: the state dict of a plain Llama (`plain_config`) with identical
    outputs, in logical (unpadded) shapes. A shared pre-norm γ that is its group's only vector stays on the norm, so
    the baseline exports unchanged. Refuses designs with an inner Norm (DNP) or Gemma norms."""
    if not model.cfg.scale.foldable or model.cfg.gemma_norms:
        raise ValueError("only designs without an inner Norm fold into a plain Llama: "
                         "DNP and the Gemma norms add normalizations a plain Llama does not have")
    out: dict[str, torch.Tensor] = {"tok_embeddings.weight": model.tok_embeddings.weight.detach().clone()}
    dtype = model.tok_embeddings.weight.dtype

    def fold_group(norm: Norm, branches: dict[str, ScaledLinear], norm_key: str) -> None:
        gamma = norm.scale() if norm.scale is not None else None
        keep_on_norm = gamma is not None and all(b.in_scale is None and b.out_scale is None
                                                 for b in branches.values())
        out[norm_key] = gamma.detach().clone() if keep_on_norm else torch.ones(norm.dim, dtype=dtype)
        for key, branch in branches.items():
            out[key] = branch.folded_weight(None if keep_on_norm else gamma)

    for i, blk in enumerate(model.layers):
        p = f"layers.{i}."
        fold_group(blk.attn_norm, {f"{p}attn.{n}.weight": getattr(blk.attn, n) for n in ("q_proj", "k_proj", "v_proj")},
                   f"{p}attn_norm.scale.weight")
        fold_group(blk.ffn_norm, {f"{p}mlp.{n}.weight": b for n, b in ffn_branches(blk.mlp)}, f"{p}ffn_norm.scale.weight")
        out[f"{p}attn.o_proj.weight"] = blk.attn.o_proj.weight.detach().clone()
        for name, t in blk.mlp.state_dict().items():  # down projections, MoE buffers: unchanged
            if not {"in_scale", "out_scale"} & set(name.split(".")):
                out.setdefault(f"{p}mlp.{name}", t.detach().clone())
    fold_group(model.norm, {"lm_head.weight": model.lm_head}, "norm.scale.weight")
    for name, shape in model.logical_shapes().items():  # drop the FFN padding (zeros: nothing folds into it)
        out[name] = out[name][tuple(slice(0, n) for n in shape)].contiguous()
    return out


def plain_config(cfg: ModelConfig) -> ModelConfig:
    """The plain Llama (or Llama-MoE) that `folded_state_dict` fills: same sizes, one direct γ per norm, nothing else,
    and no FFN padding (the folded weights are logical)."""
    moe = None if cfg.moe is None else replace(cfg.moe, pad_multiple=None)
    return replace(cfg, scale=ScaleConfig(), gemma_norms=False, ffn_pad_multiple=1, moe=moe)


def hf_state_dict(model: Llama) -> dict[str, torch.Tensor]:
    """The folded, unpadded weights under transformers' LlamaForCausalLM names."""
    out = {}
    for key, value in folded_state_dict(model).items():
        if key.startswith("layers."):
            _, i, rest = key.split(".", 2)
            out[f"model.layers.{i}.{_LAYER_NAMES[rest]}"] = value
        else:
            out[{"tok_embeddings.weight": "model.embed_tokens.weight", "norm.scale.weight": "model.norm.weight",
                 "lm_head.weight": "lm_head.weight"}[key]] = value
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig, max_positions: int):
    """transformers' LlamaConfig of `cfg`'s shapes: the padded vocabulary, untied embeddings, no biases, the same rope
    theta and eps (the export's config, and the benchmark's reference row's)."""
    from transformers import LlamaConfig  # lazy: transformers is needed only to export and for that row
    return LlamaConfig(
        vocab_size=cfg.padded_vocab, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=max_positions, rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        initializer_range=cfg.init_std, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def export(model: Llama, out_dir: Path, max_positions: int = 2048, dtype: torch.dtype = torch.float32) -> Path:
    """Write `out_dir`/{config.json, model.safetensors} loadable by LlamaForCausalLM.from_pretrained."""
    from safetensors.torch import save_file
    config = hf_config(model.cfg, max_positions)
    config.torch_dtype = dtype
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    save_file({k: v.to(dtype) for k, v in hf_state_dict(model).items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    return out_dir

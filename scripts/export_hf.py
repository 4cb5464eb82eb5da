"""Export a checkpoint as a Hugging Face `transformers` LlamaForCausalLM directory (config.json + safetensors).

Every scale-vector design without an inner Norm folds exactly into a plain Llama (docs/paper.md §1.8): the vectors are
multiplied into the adjacent weights, so `LlamaForCausalLM.from_pretrained(DIR)` gives the same logits. The FFN weights
are written at their logical size (intermediate_size = int(8d/3) or model.d_ffn), without the storage padding of
model.ffn_pad_multiple.

    python -m scripts.export_hf --config runs/NAME/config.yaml --checkpoint runs/NAME --out hf/NAME
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from config import ConfigError, load_config, resolve_vocab
from data.tokenizer import TokenizerError
from model.config import ModelConfig
from model.llama import Llama, build_model
from runtime.checkpoint import CheckpointError, load_model_weights
from runtime.files import out_path_problem

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


def hf_state_dict(model: Llama) -> dict[str, torch.Tensor]:
    """The folded, unpadded weights under transformers' LlamaForCausalLM names."""
    out = {}
    for key, value in model.folded_state_dict().items():
        if key.startswith("layers."):
            _, i, rest = key.split(".", 2)
            out[f"model.layers.{i}.{_LAYER_NAMES[rest]}"] = value
        else:
            out[{"tok_embeddings.weight": "model.embed_tokens.weight", "norm.scale.weight": "model.norm.weight",
                 "lm_head.weight": "lm_head.weight"}[key]] = value
    return {k: v.contiguous() for k, v in out.items()}


def hf_config(cfg: ModelConfig, max_positions: int):
    from transformers import LlamaConfig  # lazy: transformers is needed only to export
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", required=True, help="the run's YAML config (repeat to layer)")
    parser.add_argument("--checkpoint", help="a checkpoint dir, a run's checkpoints/ dir or a run dir (its newest); "
                                             "omit to export the freshly initialized model")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_args(argv)
    problem = out_path_problem(args.out, "folder")
    if problem:
        parser.error(f"--out {problem}")
    try:
        cfg = load_config(args.config, args.overrides)
        model_cfg = resolve_vocab(cfg)
        if model_cfg.moe is not None:
            raise ConfigError("model.moe is set: transformers has no Llama-MoE without a shared-expert gate "
                              "(Qwen2-MoE always gates it), so an MoE model cannot be exported as LlamaForCausalLM; "
                              "its checkpoint loads in scalevec (scripts.sample)")
        if not model_cfg.scale.foldable or model_cfg.gemma_norms:
            raise ConfigError(f"model.scale.placement={model_cfg.scale.placement!r}"
                              f"{' with gemma_norms' if model_cfg.gemma_norms else ''} has normalizations a plain "
                              "Llama lacks, so it cannot be exported as LlamaForCausalLM")
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except TokenizerError as e:  # resolve_vocab reads the config's tokenizer when it sets no vocab_size
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = build_model(model_cfg, seed=cfg.train.seed)
    if args.checkpoint:
        try:
            load_model_weights(model, Path(args.checkpoint))
        except CheckpointError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    out = export(model, args.out, max_positions=max(cfg.data.seq_len, 2048), dtype=getattr(torch, args.dtype))
    print(f"wrote {out}/config.json and model.safetensors ({model.num_params():,} parameters before folding)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

from config import load_config, resolve_vocab

from strictconfig.config import ConfigError
from data.tokenizer import TokenizerError
from runtime.hf_export import export
from model.llama import build_model
from model.summary import num_params
from runtime.checkpoint import CheckpointError, load_model_weights
from runtime.files import out_path_problem


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
    print(f"wrote {out}/config.json and model.safetensors ({num_params(model):,} parameters before folding)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

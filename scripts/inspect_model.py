"""Parameter and FLOP breakdown of a config's model, built on the meta device (no memory, no weights).

    python -m scripts.inspect_model --config configs/dense_0.12b_unified.yaml [--json] [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from config import ConfigError, load_config, resolve_vocab
from model.llama import Llama


def breakdown(model: Llama, seq_len: int) -> dict:
    by_role = model.params_by_role()
    scale = by_role["scale_input"] + by_role["scale_output"]
    return {
        "total_params": model.num_params(),
        "non_embedding_params": model.num_params(exclude_embedding=True),
        "activated_params": model.activated_params(),  # one token's parameters (MoE: top-k routed experts)
        "scale_params": scale,
        "scale_fraction": scale / model.num_params(),
        "by_role": by_role,
        "n_scale_vectors": sum(1 for _ in model.scale_vectors()),
        "vocab_size": model.cfg.vocab_size,
        "seq_len": seq_len,
        "flops_per_token": model.flops_per_token(seq_len),
        "scale": vars(model.cfg.scale) | {"gemma_norms": model.cfg.gemma_norms},
        "moe": None if model.cfg.moe is None else vars(model.cfg.moe),
    }


def print_breakdown(model: Llama, seq_len: int) -> None:
    info = breakdown(model, seq_len)
    print(f"total params          {info['total_params']:>15,}")
    print(f"non-embedding params  {info['non_embedding_params']:>15,}")
    if info["moe"] is not None:
        print(f"activated params      {info['activated_params']:>15,}  (one token: shared expert + top-"
              f"{info['moe']['top_k']} of {info['moe']['n_experts']} routed experts + the rest)")
    print(f"scale-vector params   {info['scale_params']:>15,}  ({info['scale_fraction']:.3e} of total, "
          f"{info['n_scale_vectors']} vectors)")
    for role, n in info["by_role"].items():
        print(f"  {role:<20}{n:>15,}")
    print(f"training FLOPs/token  {info['flops_per_token']:>15,}  (6N + attention at seq_len {info['seq_len']}; "
          "N = activated non-embedding params)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", required=True, help="YAML config (repeat to layer)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        with torch.device("meta"):
            model = Llama(resolve_vocab(cfg))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(breakdown(model, cfg.data.seq_len), indent=2))
    else:
        print_breakdown(model, cfg.data.seq_len)
    return 0


if __name__ == "__main__":
    sys.exit(main())

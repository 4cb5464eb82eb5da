"""Generate text from a run's newest checkpoint.

    python -m scripts.sample --run runs/tiny_cpu --prompt "ROMEO:" --max-new-tokens 200
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from config import load_saved_config

from strictconfig.config import ConfigError
from data.tokenizer import TokenizerError, load_tokenizer
from runtime.generate import generate
from model.llama import build_model
from runtime.checkpoint import CheckpointError, load_model_weights


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, type=Path, help="a run directory (config.yaml + checkpoints/)")
    p.add_argument("--checkpoint", type=Path, help="a specific checkpoint dir (default: the run's newest)")
    p.add_argument("--prompt", default="", help="text to continue (default: start of a document)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens (0 = all of them)")
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.max_new_tokens < 0 or args.num_samples < 1 or args.top_k < 0:
        p.error(f"--max-new-tokens ({args.max_new_tokens}) and --top-k ({args.top_k}) must be ≥ 0, "
                f"--num-samples ({args.num_samples}) ≥ 1")
    if not 0 <= args.temperature < float("inf"):  # also refuses nan
        p.error(f"--temperature {args.temperature}: give a finite number ≥ 0 (0 = greedy)")
    if not args.run.is_dir():
        p.error(f"--run {args.run} is not a directory: give a run directory (the folder with config.yaml and "
                "checkpoints/)")
    try:
        cfg = load_saved_config(args.run / "config.yaml")
    except ConfigError as e:
        print(f"error: {args.run} has no usable config.yaml ({e})", file=sys.stderr)
        return 2
    try:
        tok = load_tokenizer(cfg.data.tokenizer, cfg.data.dir)
        model = build_model(cfg.model)  # the saved config is resolved: vocab_size is set
        load_model_weights(model, args.checkpoint or args.run)
    except (TokenizerError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prompt = [tok.eot] + tok.encode(args.prompt)  # documents start with EOT in the prepared data
    gen = torch.Generator().manual_seed(args.seed)
    for i in range(args.num_samples):
        out = generate(model, prompt, args.max_new_tokens, cfg.data.seq_len, args.temperature, args.top_k, gen,
                       n_vocab=tok.n_vocab)
        if i:
            print("\n" + "-" * 60)
        print(args.prompt + tok.decode(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Parameter and FLOP breakdown of a config's model, built on the meta device (no memory, no weights).

    python -m scripts.inspect_model --config configs/dense_0.12b_unified.yaml [--json] [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from config import load_config, resolve_vocab

from strictconfig.config import ConfigError
from data.tokenizer import TokenizerError
from model.llama import Llama
from model.summary import breakdown, format_breakdown


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
    except TokenizerError as e:  # the vocabulary size comes from the config's tokenizer when it does not set one
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(breakdown(model, cfg.data.seq_len), indent=2))
    else:
        print(format_breakdown(model, cfg.data.seq_len))
    return 0


if __name__ == "__main__":
    sys.exit(main())

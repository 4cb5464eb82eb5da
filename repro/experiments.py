"""What makes two runs the same experiment: their resolved configs, apart from where and how they log.

A run is a train.py command line (`--config` files, then key=value overrides). Two command lines whose resolved
configs agree on everything but `log.*` (run name, output dir, wandb group and tags) train the same model on the
same tokens, so they share one run directory; the figures' plans (repro/runner.py at proxy scale, the
paper-scale plan) run each such experiment once and let every figure read it.
"""
from __future__ import annotations

import dataclasses
import json

from config import RunConfig, load_config, resolve_vocab


def config_of(argv: list[str]) -> RunConfig:
    """The config train.py would resolve and save for `argv` (the vocabulary size filled in)."""
    cfg = load_config([b for a, b in zip(argv, argv[1:]) if a == "--config"],
                      [a for a in argv if "=" in a and not a.startswith("--")])
    return dataclasses.replace(cfg, model=resolve_vocab(cfg))


def experiment_key(cfg: RunConfig) -> str:
    """Everything but where and how the run logs: equal keys are the same experiment."""
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k != "log"}, sort_keys=True)

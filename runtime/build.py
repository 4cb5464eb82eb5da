"""The one place a training model is built: meta → FSDP2 shard → materialize → init → compile → optimizer.

`train.py`, `scripts/bench.py` and `scripts/gpu_check.sh` (through the bench) all call `build_training_model`, so a
speed path added for training is the path the benchmark measures.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from config import RunConfig
from model.config import Role
from model.llama import Llama
from optim import HybridOptimizer, build_optimizer
from runtime.parallel import resolve_dtype, shard_model


@dataclass
class TrainingModel:
    model: Llama  # FSDP2-sharded (one rank: a one-shard DTensor per parameter), initialized, maybe compiled
    optimizer: HybridOptimizer
    roles: dict[str, Role]  # parameter name → role (weight decay, Muon vs AdamW, telemetry)
    compute_dtype: torch.dtype  # the forward/backward dtype (bf16 under FSDP2 mixed precision)


def build_training_model(cfg: RunConfig, device: torch.device) -> TrainingModel:
    """Build `cfg.model` for training on `device` in the current process group. `cfg.model.vocab_size` must be
    resolved (config.resolve_vocab). The initialization depends only on `cfg.train.seed`, never on the world size."""
    with torch.device("meta"):
        model = Llama(cfg.model)
    roles = model.param_roles()
    compute_dtype = resolve_dtype(cfg.train.dtype, device)
    shard_model(model, compute_dtype, device)
    model.to_empty(device=device)
    model.init_weights(cfg.train.seed)
    if cfg.train.compile:
        for block in model.layers:
            block.compile()  # in place: parameter names (and so roles, checkpoints) are unchanged
    optimizer = build_optimizer(model, roles, cfg.optim, fused=device.type == "cuda")
    return TrainingModel(model, optimizer, roles, compute_dtype)

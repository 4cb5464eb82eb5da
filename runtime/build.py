"""The one place a training model is built: meta → activation checkpointing → the fast path → FSDP2 shard →
materialize → init → compile → optimizer.

`train.py`, the benchmark (`bench/steps.py`) and `harness/gpu_check.sh` (through the bench) all call
`build_training_model`, so a speed path added for training is the path the benchmark measures.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
import torch

from config import RunConfig
from fast import apply_fast_path
from fast.banks import parameter_names
from model.llama import Llama
from optim import HybridOptimizer, build_optimizer
from runtime.parallel import apply_activation_checkpointing, compile_blocks, compile_checkpointed_state, shard_model
from runtime.precision import Precision, resolve_precision


@dataclass
class TrainingModel:
    model: Llama  # FSDP2-sharded (one rank: a one-shard DTensor per parameter), initialized, maybe compiled
    optimizer: HybridOptimizer  # parameter groups by role (weight decay, Muon vs AdamW)
    precision: Precision  # train.dtype and train.compile as resolved on this device (runtime/precision.py)


def build_training_model(cfg: RunConfig, device: torch.device) -> TrainingModel:
    """Build `cfg.model` for training on `device` in the current process group. `cfg.model.vocab_size` must be
    resolved (config.resolve_vocab). The initialization depends only on `cfg.train.seed`, never on the world size."""
    precision = resolve_precision(cfg.train.dtype, cfg.train.compile, device)
    compute_dtype = precision.dtype
    with torch.device("meta"):
        model = Llama(cfg.model)
    # Before sharding: FSDP2 must wrap the final block modules. The names are unchanged, so the roles are too.
    apply_activation_checkpointing(model, cfg.train.activation_checkpointing)
    if cfg.train.fast_path:  # the same function, faster (fast/); names on disk stay the reference's
        apply_fast_path(model, compile_backend="inductor" if precision.compile else None)
    roles = model.param_roles()
    shard_model(model, compute_dtype, device, reshard_after_forward=cfg.train.reshard_after_forward,
                prefetch=cfg.train.fsdp_prefetch)
    model.to_empty(device=device)
    model.init_weights(cfg.train.seed)
    if precision.compile:
        traceable = True
        if cfg.train.activation_checkpointing != "none":
            traceable = compile_checkpointed_state() or cfg.model.moe is None
            if not traceable:
                warnings.warn("train.activation_checkpointing with train.compile: this torch cannot trace a "
                              "checkpointed MoE block (its counters are side effects), so those blocks run eagerly; "
                              "the numbers are unchanged")
        # Blocks in place: parameter names, and so roles and checkpoints, are unchanged
        compile_blocks(model, device, compute_dtype, fullgraph=None if traceable else False)
    # Fused AdamW on every device: its found_inf makes a non-finite step a no-op decided on the device (train.py)
    invariant = None if cfg.optim.scale_wd_invariant else parameter_names(model, model.invariant_magnitudes())
    optimizer = build_optimizer(model, roles, cfg.optim, fused=True, invariant=invariant)
    return TrainingModel(model, optimizer, precision)

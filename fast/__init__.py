"""The fast path: speed applied to a built reference model (model/) at build time, the way torchtitan applies
parallelism. runtime/build.py calls `apply_fast_path` once, on the meta device, before FSDP2; `train.fast_path:
false` leaves the reference as it is. Every layer here computes the reference's function (tests/test_fast.py, the
golden curves on both paths) and keeps its parameter names on disk:

- branches.py: the Norm's hand-written backward; vectors on the smaller side of W; DNP's u handed on across
  attention and SwiGLU; compiled, each branch's chain after its matmul recomputed in backward;
- banks.py: a block's vectors as one tensor per kind, translated to the reference's names in checkpoints;
- head.py: the fused LM head + loss, each chunk's forward and backward at once, DNP's vocabulary Norm written out.

It knows the designs of model/ as they are written today. A model holding a module it does not know, or a
ScaleConfig value it was not written for, is refused in one line (`FastPathError`) rather than trained wrong.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn as nn

from fast.banks import bank_blocks
from fast.branches import (FastAttention, FastExpertBranch, FastMLP, FastMoE, FastNorm, FastScaledLinear,
                           quiet_recompute_caution)
from fast.head import FusedHeadLoss
from strictconfig.config import ConfigError
from model.config import ModelConfig, ScaleConfig
from model.llama import MLP, Attention, Block, Llama
from model.moe import MoE
from model.scaling import ExpertBranch, Norm, ScaledLinear
from model.vectors import ScaleVector

# Each reference class and its fast form; a subclass of a reference class is a design of its own: refused.
FAST = {Norm: FastNorm, ScaledLinear: FastScaledLinear, ExpertBranch: FastExpertBranch, Attention: FastAttention,
        MLP: FastMLP, MoE: FastMoE}
# Modules the fast path leaves as they are: containers, the embedding, the vectors (banked or kept); by exact type
KEPT = {Llama, nn.ModuleList, nn.ModuleDict, nn.Embedding, ScaleVector}
# The ScaleConfig this fast path was written for: every field and the values it takes.
KNOWN_SCALE = {"heterogeneous": {False, True}, "placement": {"none", "input", "ap", "dp", "dnp"},
               "reparam": {"direct", "or", "er"}, "lm_head": {False, True}, "router": {False, True},
               "invariant_magnitude": {"keep", "remove"}}


class FastPathError(ConfigError):
    """The model holds a design the fast path does not know: a config problem (train.fast_path), said in one line."""


def apply_fast_path(model: Llama, compile_backend: Optional[str] = None) -> Llama:
    """Put the fast form of each module in place, bank every block's vectors, and use the fused head, in place. On
    the meta device before FSDP2 and init (parameter names are unchanged but for the banks). `compile_backend`: the
    torch.compile backend of the fused head's chunks (None: eager)."""
    built = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if not t.is_meta]
    if built or any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules()):
        raise ValueError("the fast path rebuilds a model on the meta device, before materialization, init and "
                         f"compile ({(built or ['a compiled module'])[0]} is already built): apply it right after "
                         "construction, as runtime/build.py and build_fast_model do")
    _check_known(model)
    # Leaves first, so a rebuilt parent holds its children's fast forms
    for name, module in sorted(model.named_modules(), key=lambda nm: -nm[0].count(".")):
        fast = FAST.get(type(module))
        if fast is not None and name:
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, _as(fast, module))
    bank_blocks(model)
    model.loss_fn = FusedHeadLoss(compile_backend)
    quiet_recompute_caution()
    return model


def _as(cls: type, module: nn.Module) -> nn.Module:
    """An instance of `cls`, a subclass of type(module) that only adds a faster forward, holding module's state:
    its parameters, buffers, submodules and settings, under the same names. The reference module is dropped from
    the tree at once (a meta module nothing else holds), so nothing runs it afterwards."""
    fast = cls.__new__(cls)
    fast.__dict__.update(module.__dict__)
    return fast


def _check_known(model: Llama) -> None:
    cfg = model.cfg.scale
    for f in dataclasses.fields(ScaleConfig):
        value = getattr(cfg, f.name)
        if f.name not in KNOWN_SCALE or value not in KNOWN_SCALE[f.name]:
            raise FastPathError(f"the fast path does not know model.scale.{f.name}={value!r}: run it with "
                                "train.fast_path=false (the reference model), or teach fast/ the design")
    for name, module in model.named_modules():
        if type(module) in FAST or type(module) in KEPT or isinstance(module, Block):  # a Block only composes
            continue
        raise FastPathError(f"the fast path does not know {type(module).__name__} at {name or 'the root'}: run it "
                            "with train.fast_path=false (the reference model), or teach fast/ the design")


def build_fast_model(cfg: ModelConfig, device: Optional[torch.device | str] = None, seed: int = 0,
                     dtype: torch.dtype = torch.float32, compile_backend: Optional[str] = None) -> Llama:
    """model.llama.build_model with the fast path: constructed on the meta device, the fast path applied,
    materialized on `device`, then initialized (the same weights as the reference's for the same seed)."""
    with torch.device("meta"):
        model = apply_fast_path(Llama(cfg), compile_backend)
    model.to_empty(device=device or "cpu")
    model.init_weights(seed)
    return model.to(dtype)

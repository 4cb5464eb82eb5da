"""A checkpoint written with another storage layout than this model's, loaded across the difference
(runtime/checkpoint.py calls `stage_layouts` before DCP reads and `finish_layouts` after):

- **FFN padding** (model.ffn_pad_multiple; a checkpoint from before it has unpadded dense FFNs): an FFN weight's
  logical block is the same tensor whatever zeros pad it.
- **Scale-vector banks** (model/scaling.py, ScaleBank): a checkpoint from before them holds each block vector's
  weight, α or β as its own tensor, under the vector's name (`layers.0.attn.q_proj.in_scale.alpha`); the bank is
  those tensors flattened and joined in `Llama.bank_members` order.

Both work the same way. `state` gets a plain, whole tensor of the checkpoint's shape under the checkpoint's name for
DCP to fill, on every rank, for the parameter and for each optimizer state of it (AdamW's moments, Muon's momentum);
afterwards the values move into this model's tensors, and a DTensor takes its own shard (every rank holds the whole
tensor: no communication). Anything else that differs stays for the caller's check to report.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor


# One tensor (or one parameter's optimizer state) read in the checkpoint's layout: called after DCP's read, it builds
# ours from what DCP read.
Staged = Callable[[], None]


def stage_layouts(model: nn.Module, state: dict, metadata: dict) -> list[Staged]:
    """Stage every FFN weight padded otherwise and every bank stored as vectors in `state` ({"model": …, "optim": …},
    as torch.distributed.checkpoint.state_dict gives it), against the checkpoint's `metadata`."""
    staged = _stage_banks(state, metadata, model.bank_members()) if hasattr(model, "bank_members") else []
    logical = model.logical_shapes() if hasattr(model, "logical_shapes") else {}
    return staged + _stage_repadding(state, metadata, logical)


def finish_layouts(staged: list[Staged]) -> None:
    """After DCP has read into `state`: every staged tensor into this model's layout. Raises ValueError for values
    the layout cannot hold."""
    for finish in staged:
        finish()


def _like(full: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
    """`full` as `ours` is held: its device and dtype, and its shard when it is a DTensor."""
    full = full.to(device=ours.device, dtype=ours.dtype)
    if isinstance(ours, DTensor):
        return distribute_tensor(full, ours.device_mesh, ours.placements, src_data_rank=None)
    return full


# --------------------------------------------------------------------------------------------------- FFN padding

def _stage_repadding(state: dict, metadata: dict, logical: dict[str, tuple[int, ...]]) -> list[Staged]:
    """An FFN weight stored with other zero padding than the checkpoint's, and each optimizer state of its shape (zero
    in the padding too): read at the checkpoint's shape, its logical block moved into ours."""
    places = [(f"model.{fqn}", fqn, state["model"], fqn) for fqn in state["model"]]
    for fqn, per_param in state.get("optim", {}).get("state", {}).items():
        places += [(f"optim.state.{fqn}.{name}", fqn, per_param, name) for name in per_param]
    staged = []
    for key, fqn, holder, name in places:
        ours, meta, shape = holder[name], metadata.get(key), logical.get(fqn)
        if (shape is not None and isinstance(ours, torch.Tensor) and isinstance(meta, TensorStorageMetadata)
                and tuple(meta.size) != tuple(ours.shape) and len(meta.size) == ours.ndim == len(shape)
                and all(n <= min(a, b) for n, a, b in zip(shape, meta.size, ours.shape))):
            holder[name] = torch.zeros(tuple(meta.size), dtype=ours.dtype)  # whole on every rank: DCP reads it all
            staged.append(lambda key=key, holder=holder, name=name, ours=ours, shape=shape:
                          _repad(key, holder, name, ours, shape))
    return staged


def _repad(key: str, holder: dict, name: str, ours: torch.Tensor, shape: tuple[int, ...]) -> None:
    theirs = holder[name]
    if any(theirs.narrow(i, n, theirs.shape[i] - n).any() for i, n in enumerate(shape)):
        raise ValueError(f"{key} of shape {list(theirs.shape)} has non-zero entries outside its logical "
                         f"{list(shape)}: not a zero-padded FFN weight")
    logical = tuple(slice(0, n) for n in shape)
    full = torch.zeros(tuple(ours.shape), dtype=ours.dtype)
    full[logical] = theirs[logical]
    holder[name] = _like(full, ours)


# ------------------------------------------------------------------------------------------- scale-vector banks

def _stage_banks(state: dict, metadata: dict, members: dict[str, list[tuple[str, tuple[int, int], tuple[int, ...]]]]
                 ) -> list[Staged]:
    """Each bank the checkpoint lacks but whose every member it holds: the members read by their own names, for the
    parameter and for its optimizer state."""
    staged = []
    optim = state.get("optim", {}).get("state", {})
    for bank, ms in members.items():
        names = [name for name, _, _ in ms]
        if f"model.{bank}" in metadata or not all(f"model.{name}" in metadata for name in names):
            continue
        ours = state["model"].pop(bank)
        state["model"].update({name: torch.zeros(shape, dtype=ours.dtype) for name, _, shape in ms})
        staged.append(lambda bank=bank, names=names, ours=ours: _join(state["model"], bank, names, ours))
        if bank in optim:
            per_param = optim.pop(bank)  # {"exp_avg": …, "exp_avg_sq": …, "step": …}
            for name, _, shape in ms:
                optim[name] = {k: torch.zeros(shape if v.ndim else (), dtype=v.dtype) for k, v in per_param.items()}
            staged.append(lambda bank=bank, names=names, per_param=per_param:
                          _join_state(optim, bank, names, per_param))
    return staged


def _join(holder: dict, bank: str, names: list[str], ours: torch.Tensor) -> None:
    holder[bank] = _like(torch.cat([holder.pop(name).reshape(-1) for name in names]), ours)


def _join_state(optim: dict, bank: str, names: list[str], ours: dict[str, torch.Tensor]) -> None:
    """A bank's optimizer state from its members': per-entry tensors joined, and a scalar (AdamW's step count) that
    every member must share: one tensor has one."""
    parts = [optim.pop(name) for name in names]
    joined = {}
    for key, v in ours.items():
        values = [p[key] for p in parts]
        if v.ndim:
            joined[key] = _like(torch.cat([x.reshape(-1) for x in values]), v)
        elif all(torch.equal(values[0], x) for x in values[1:]):
            joined[key] = values[0].to(device=v.device, dtype=v.dtype)
        else:
            raise ValueError(f"the vectors of bank {bank} have different optimizer {key!r} values "
                             f"({sorted({x.item() for x in values})}), which one bank cannot hold; resume this run "
                             "with the scalevec that wrote it (one tensor per vector)")
    optim[bank] = joined

"""A checkpoint written with another FFN padding than this model's (model.ffn_pad_multiple; a checkpoint from before
it has unpadded dense FFNs), loaded across the difference: an FFN weight's logical block is the same tensor whatever
zeros pad it. runtime/checkpoint.py calls `stage_layouts` before DCP reads and `finish_layouts` after.

`state` gets a plain, whole tensor of the checkpoint's shape under the checkpoint's name for DCP to fill, on every
rank, for the parameter and for each optimizer state of it (AdamW's moments, Muon's momentum); afterwards the values
move into this model's tensors, and a DTensor takes its own shard (every rank holds the whole tensor: no
communication). Anything else that differs stays for the caller's check to report.
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
    """Stage every FFN weight padded otherwise in `state` ({"model": …, "optim": …}, as
    torch.distributed.checkpoint.state_dict gives it), against the checkpoint's `metadata`."""
    logical = model.logical_shapes() if hasattr(model, "logical_shapes") else {}
    return _stage_repadding(state, metadata, logical)


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

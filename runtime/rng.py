"""A rank's random-number states (torch CPU and CUDA, python `random`, numpy), as a checkpoint saves and restores them
(runtime/checkpoint.py: `rng_rank<r>.pt`)."""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict:
    np_state = np.random.get_state(legacy=False)  # {"bit_generator", "state": {"key", "pos"}, "has_gauss", "gauss"}
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        # weights_only loading refuses numpy arrays: keep the MT19937 key as a tensor.
        "numpy": {**np_state, "state": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                                        "pos": int(np_state["state"]["pos"])}},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device: one GPU per rank
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": state["numpy"]["state"]["key"].numpy().astype(np.uint32),
                         "pos": state["numpy"]["state"]["pos"]}
    np.random.set_state(np_state)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def rng_equal(a: Any, b: Any) -> bool:
    """Structural equality of two RNG state objects (tensors compared by value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(rng_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(rng_equal(x, y) for x, y in zip(a, b))
    return a == b

"""What a design keeps and launches, beside its time (`python -m scripts.bench`; docs/benchmarks.md, "Footprint"):

- **saved activations**: the bytes autograd keeps for backward, counted in each block and in the LM head through
  `torch.autograd.graph.saved_tensors_hooks`, on the model as training builds it (FSDP2, the precision and the
  compiled blocks of runtime/build.py). Parameters, the token ids and the rotary tables (inputs shared by every
  block) are not counted; a storage saved twice counts once. A block's bytes are what it holds once its forward is
  done (all of it lives until backward). The head runs each chunk's forward and backward inside its own forward
  (fast/head.py), so its figure is the peak of what it holds at once: one chunk's saves plus what it keeps for the
  outer backward.
- **parameter tensors**: what FSDP2's gathers, gradient clipping and the optimizer iterate over, one by one.
- **host ops per step**: the aten operators dispatched on the host in one training step (torch.profiler), and on
  CUDA the kernels launched. Compiled graphs count as their kernels (CUDA) or as one call each (CPU, where
  inductor's C++ kernels are not operators).

Which of these transfer to a GPU: the saved bytes do (the partitioner decides them the same way on either device);
the host ops outside compiled graphs do (FSDP2, clipping, the optimizer); the CPU's count of compiled calls does not.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
from torch import nn

HEAD = "head"


@dataclasses.dataclass
class Footprint:
    saved_block_bytes: list[int]  # per block, in order
    saved_head_peak_bytes: int
    param_tensors: int
    host_ops_per_step: Optional[float] = None  # aten operators (None: not measured)
    kernels_per_step: Optional[float] = None  # CUDA kernels launched (None on CPU)

    @property
    def saved_block_mean_bytes(self) -> float:
        return sum(self.saved_block_bytes) / max(1, len(self.saved_block_bytes))


class _Saved:
    """A tensor autograd saved, as the pack hook hands it back: it tells the ledger when autograd lets it go."""

    def __init__(self, ledger: "_Ledger", tensor: torch.Tensor, key: Optional[int]):
        self.tensor, self.ledger, self.key = tensor, ledger, key

    def __del__(self):
        if self.key is not None:
            self.ledger.release(self.key)


class _Ledger:
    """Which region (a block's index, or HEAD) saved which storage, and how many bytes each region holds now and
    held at most. The region is set by `_Tagged` as each block is called and after the last one (the head)."""

    def __init__(self):
        self.region: Optional[object] = None
        self.refs: dict[int, int] = {}  # storage → saves alive
        self.owner: dict[int, tuple[object, int]] = {}  # storage → (region, bytes)
        self.held: dict[object, int] = {}
        self.peak: dict[object, int] = {}
        self.shared: set[int] = set()  # storages saved by two regions: inputs such as the rotary tables
        self.params: set[int] = set()

    def pack(self, t: torch.Tensor) -> _Saved:
        key = _storage(t)
        if (self.region is None or isinstance(t, nn.Parameter) or key in self.params
                or t.dtype in (torch.int64, torch.int32)):
            return _Saved(self, t, None)  # the embedding's saves; parameters (FSDP2's unsharded ones too); ids
        if key in self.owner and self.owner[key][0] != self.region:
            self.shared.add(key)
        if key not in self.refs:
            size = t.untyped_storage().nbytes()
            self.owner[key] = (self.region, size)
            self.held[self.region] = self.held.get(self.region, 0) + size
            self.peak[self.region] = max(self.peak.get(self.region, 0), self.held[self.region])
        self.refs[key] = self.refs.get(key, 0) + 1
        return _Saved(self, t, key)

    def release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            region, size = self.owner.pop(key)
            self.held[region] -= size

    def block_bytes(self, n_blocks: int) -> list[int]:
        """What each block holds after the forward, less the storages that several regions saved (shared inputs)."""
        shared = {k: 0 for k in range(n_blocks)}
        for key in self.shared & set(self.owner):
            region, size = self.owner[key]
            if region in shared:
                shared[region] += size
        return [self.held.get(i, 0) - shared[i] for i in range(n_blocks)]


class _Tagged(nn.Module):
    """Block `index` as the forward calls it, telling the ledger whose saves follow: this block's, then (after the
    last block) the head's. Eager, around the (maybe compiled, FSDP2-wrapped) block itself."""

    def __init__(self, block: nn.Module, index: int, last: bool, ledger: _Ledger):
        super().__init__()
        self.block, self.index, self.last, self.ledger = block, index, last, ledger

    def forward(self, *args):
        self.ledger.region = self.index
        out = self.block(*args)
        self.ledger.region = HEAD if self.last else None
        # Parameters gathered for this block (FSDP2's unsharded storages) are known once it ran
        self.ledger.params.update(_storage(p) for p in self.block.parameters())
        return out


def _storage(t: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor
    t = t.to_local() if isinstance(t, DTensor) else t
    return t.untyped_storage().data_ptr()


def saved_activations(model: nn.Module, forward: Callable[[], torch.Tensor]) -> tuple[list[int], int]:
    """Run `forward()` (one micro-batch's loss through `model`, a training model) under the ledger, then its backward;
    return the bytes saved per block and the head's peak."""
    ledger = _Ledger()
    blocks = list(model.layers)
    ledger.params.update(_storage(p) for p in model.parameters())
    for i, block in enumerate(blocks):
        model.layers[i] = _Tagged(block, i, i == len(blocks) - 1, ledger)
    try:
        with torch.autograd.graph.saved_tensors_hooks(ledger.pack, lambda saved: saved.tensor):
            loss = forward()
    finally:
        for i, block in enumerate(blocks):
            model.layers[i] = block
    saved = ledger.block_bytes(len(blocks))
    head = ledger.peak.get(HEAD, 0)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return saved, head


def ops_per_step(step: Callable[[], object], device: torch.device, steps: int = 2) -> tuple[float, Optional[float]]:
    """(aten operators on the host, CUDA kernels or None) per call of `step`, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    host = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) / steps
    if device.type != "cuda":
        return host, None
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)  # type: ignore[attr-defined]
    return host, kernels / steps


def footprint(model: nn.Module, forward: Callable[[], torch.Tensor], step: Optional[Callable[[], object]],
              device: torch.device) -> Footprint:
    """Every figure above for one built design. `step`: one training step (None: no op count)."""
    blocks, head = saved_activations(model, forward)
    host, kernels = ops_per_step(step, device) if step is not None else (None, None)
    return Footprint(blocks, head, sum(1 for _ in model.parameters()), host, kernels)

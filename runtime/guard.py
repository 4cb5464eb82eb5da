"""The non-finite guard (train.on_nonfinite), decided on the device so that a step which does not log reads nothing
on the host.

Every step, from the all-reduced losses and the global gradient norm (the same on every rank, so every rank decides
alike), the guard computes `found_inf`, a 0-dim float tensor: 1 makes the optimizer step a no-op on the device (fused
AdamW's `found_inf`, Muon's own; optim/hybrid.py), and the MoE balancing bias stays put too. The trainer reads the
guard's few numbers only where it reads anyway — log, eval and checkpoint steps, a stop, the last step — through
`report()`, before any of those uses the state:

    stop: the first non-finite step halts the run: that step and every later one make no update, and `report()`
          raises at the next read, so the state in memory and on disk is the one before that step, as if the run had
          stopped at once (it did no update since).
    skip: a non-finite step makes no update and is counted (`skipped`); more than `max_consecutive_skips` in a row
          halt the run as `stop` does.

A checkpoint is written only after `report()` returned, so a halted state is never saved."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Halt:
    """Why the run must stop: the step that halted it and its values."""
    step: int
    loss: float
    aux: float
    grad_norm: float
    streak: int  # non-finite steps in a row up to it (skip mode)


@dataclass
class Report:
    skipped: int  # steps skipped so far (no update), this run and the ones it resumed
    new_skips: int  # of which since the previous report
    last_skip: Optional[Halt]  # the latest skipped step's values, when new_skips > 0
    halt: Optional[Halt]


class NonFiniteGuard:
    def __init__(self, mode: str, max_consecutive_skips: int, device: torch.device, step: int = 0, skipped: int = 0):
        self.mode, self.max_skips = mode, max_consecutive_skips
        i64 = dict(dtype=torch.int64, device=device)
        self._step = torch.full((), step, **i64)  # the device's own step counter: no host value enters a step
        self._skipped = torch.full((), skipped, **i64)
        self._streak = torch.zeros((), **i64)
        self._halted = torch.zeros((), dtype=torch.bool, device=device)
        # (step, loss, aux, grad norm, streak) of the step that halted the run, and of the latest skipped step
        self._halt_info = torch.zeros(5, dtype=torch.float64, device=device)
        self._skip_info = torch.zeros(5, dtype=torch.float64, device=device)
        self._reported_skips = skipped

    @torch.no_grad()
    def check(self, loss: torch.Tensor, aux: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """Record one step (0-dim device tensors, identical on every rank); returns its found_inf (float32, 0 or 1)."""
        self._step += 1
        bad = ~(torch.isfinite(loss) & torch.isfinite(aux) & torch.isfinite(grad_norm))
        self._streak = torch.where(bad, self._streak + 1, 0)
        stops = bad if self.mode == "stop" else self._streak > self.max_skips
        info = torch.stack([self._step.double(), loss.double(), aux.double(), grad_norm.double(),
                            self._streak.double()])
        self._halt_info = torch.where(stops & ~self._halted, info, self._halt_info)
        self._halted |= stops
        skipped_now = bad & ~self._halted
        self._skip_info = torch.where(skipped_now, info, self._skip_info)
        self._skipped += skipped_now.long()
        return (bad | self._halted).float()

    def report(self) -> Report:
        """The guard's state, in one host read."""
        halted, skipped, *halt_info = torch.cat([torch.stack([self._halted.double(), self._skipped.double()]),
                                                 self._halt_info, self._skip_info]).tolist()
        skipped = int(skipped)
        new, self._reported_skips = skipped - self._reported_skips, skipped
        return Report(skipped, new, _halt(halt_info[5:]) if new else None, _halt(halt_info[:5]) if halted else None)


def _halt(values: list[float]) -> Halt:
    step, loss, aux, grad_norm, streak = values
    return Halt(int(step), loss, aux, grad_norm, int(streak))


def describe(h: Halt) -> str:
    what = "loss" if not math.isfinite(h.loss + h.aux) else "gradient norm"
    return f"non-finite {what} at step {h.step} (loss {h.loss}, aux {h.aux}, grad norm {h.grad_norm})"


def state_is_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Whether every parameter and floating optimizer-state tensor, on every rank, is finite: the largest |value|
    of each (this rank's shard of a DTensor) in one fused reduction, then one all-reduce. A save calls it, so that
    state poisoned without a non-finite loss (a damaged checkpoint loaded in place) never reaches the disk."""
    import torch.distributed as dist

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t
    tensors = [local(p.detach()) for p in model.parameters()]
    tensors += [local(v) for st in optimizer.state.values() for v in st.values()
                if isinstance(v, torch.Tensor) and v.is_floating_point()]
    tensors = [t for t in tensors if t.numel() > 0]  # the ∞-norm has no identity for an empty shard
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    device = next(iter(by_device), torch.device("cpu"))
    bad = torch.zeros((), device=device)
    for group in by_device.values():
        largest = torch._foreach_norm(group, ord=math.inf)  # NaN and ±inf propagate through the max
        bad = bad + torch.stack([n.float() for n in largest]).isfinite().logical_not().sum().to(device)
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() != "nccl":
            bad = bad.cpu()
        dist.all_reduce(bad)
    return bool(bad.item() == 0)

"""Process-group setup and teardown: nccl on CUDA, gloo on CPU, under torchrun or as a plain `python train.py`.

A single process still gets a (one-rank) process group so that FSDP2, DCP and the collectives run the same code
for 1 and N ranks; it uses an in-memory HashStore, so no port is needed.
"""
from __future__ import annotations

import gc
import os
import signal
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from strictconfig.config import ConfigError


class LaunchError(RuntimeError):
    """The launch does not fit this machine (more processes per node than GPUs). Each rank's own to report: the
    ranks that fit it see no error, so unlike a ConfigError it cannot be said by rank 0 alone."""


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool  # we created the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# The signal a torchrun worker gets when its launcher dies (end_with_launcher): a real-time signal of its own, since
# Linux sends it again when the orphan is handed to its new parent, and a second SIGTERM means "stop at once".
LAUNCHER_GONE = signal.SIGRTMIN + 1 if sys.platform.startswith("linux") else None


def end_with_launcher() -> bool:
    """Under torchrun, ask Linux to signal this worker (LAUNCHER_GONE) when its launcher (the elastic agent, its
    parent) dies. torchrun starts each worker in a session of its own, so a SIGKILL to the agent or its process
    group would leave the workers training, holding the run's lock. The trainer takes the signal as a preemption:
    it checkpoints the current step, releases the lock and exits (runtime/trainer.py, _stop_on_signals). Returns
    whether it was armed (Linux, under torchrun)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or LAUNCHER_GONE is None:
        return False
    import ctypes
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(1, int(LAUNCHER_GONE), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG = 1
        return False
    if os.getppid() != parent or parent == 1:  # the launcher died before the request took hold
        os.kill(os.getpid(), LAUNCHER_GONE)
    return True


def init_distributed(device_pref: str = "auto") -> DistInfo:
    """Initialize (or join) the default process group and pick this rank's device."""
    use_cuda = torch.cuda.is_available() if device_pref == "auto" else device_pref == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("train.device: cuda, but CUDA is not available here (torch "
                          f"{torch.__version__}); use train.device=auto or cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda and local_rank >= torch.cuda.device_count():  # e.g. --nproc_per_node=8 on a machine with fewer GPUs
        raise LaunchError(f"this process is LOCAL_RANK={local_rank} but the machine has {torch.cuda.device_count()} "
                          "visible CUDA device(s): launch at most one process per GPU (torchrun --nproc_per_node), "
                          "or check CUDA_VISIBLE_DEVICES")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    if dist.is_initialized():  # a caller (a test harness) made the group already
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device, owns_group=False)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group(backend, device_id=device if use_cuda else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device, owns_group=True)


def shutdown(info: DistInfo, clean: bool = True) -> None:
    """Tear down. After a clean run, gc + barrier before destroy avoids the FSDP2 exit-time abort (docs/design.md trap
    1). After an error there is no barrier: the other ranks may be stuck elsewhere, and waiting would hang."""
    if not info.owns_group or not dist.is_initialized():
        return
    gc.collect()
    if clean:
        dist.barrier()
    dist.destroy_process_group()


class StopConsensus:
    """A stop request (SIGTERM/SIGINT, seen by any rank) that every rank acts on at the same step, without reading
    the device: one rank needs no communication; several all-reduce one host integer per step over gloo — the
    default group on CPU, a gloo group beside nccl on CUDA — so the check never waits for the GPU's stream."""

    def __init__(self, info: DistInfo):
        self.requested = False
        self._group = None
        if info.world_size > 1:
            self._group = dist.new_group(backend="gloo") if info.device.type == "cuda" else dist.group.WORLD
        self._flag = torch.zeros(1, dtype=torch.int32)  # on the host, always

    def any_rank(self) -> bool:
        """True on every rank when any rank has `requested`; a collective when there are several ranks."""
        if self._group is None:
            return self.requested
        self._flag.fill_(int(self.requested))
        dist.all_reduce(self._flag, group=self._group)
        return bool(self._flag.item())  # a host tensor: no device sync

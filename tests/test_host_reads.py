"""A training step that does not log reads nothing on the host (train.py, runtime/guard.py, runtime/moe.py): on a
GPU each such read drains the stream, and the GPU idles while the CPU then dispatches the rest of the step.

The counter is a TorchFunctionMode that sees every Python-level way of bringing a tensor's value to the host
(`.item()`, `.tolist()`, `float()`, `bool()`, `int()`, `.numpy()`, `.cpu()`, `torch.equal`, …). Whatever a run reads
once (setup, the first evaluation) or at its log, eval and checkpoint steps is the same in a run of K steps and a run
of 2K steps that log, evaluate and checkpoint only at their last step; so their difference is K times the reads of a
step that does not log, and must be 0. A run that logs every step is the positive control: the counter sees those
reads."""
from __future__ import annotations

import traceback
from collections import Counter

import pytest
import torch
from torch.overrides import TorchFunctionMode

import train
from test_train import args_for, data_dir  # noqa: F401 - data_dir is a fixture

T = torch.Tensor
READS = {T.item, T.tolist, T.__bool__, T.__float__, T.__int__, T.__index__, T.numpy, T.cpu, torch.equal,
         torch.allclose, torch.is_nonzero}


# The loader builds each micro-batch on the host (numpy writes into a host tensor, pinned on CUDA, then one copy
# goes to the device): its `.numpy()` views are of host memory it made itself, never of a device result.
HOST_SIDE = ("loader.py:",)


class HostReads(TorchFunctionMode):
    """Counts host reads of tensor values, with the line of this repository that made each."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS or (func is T.to and _to_host(args, kwargs)):
            site = _site()
            if not site.startswith(HOST_SIDE):
                self.sites[site] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.sites.values())


def _to_host(args, kwargs) -> bool:
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return str(target).startswith("cpu") and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu"


def _site() -> str:
    """The innermost frame in this repository's code (not torch's, not this file)."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("test_host_reads.py"):
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


def count_reads(argv: list[str]) -> HostReads:
    with HostReads() as reads:
        train.main(argv)
    return reads


MOE = ("--config", "configs/tiny_moe.yaml", "model.moe.n_experts=4", "model.moe.top_k=2",
       # the grouped GEMM, as on a GPU: the CPU's exact per-expert loop needs the row counts on the host
       "model.moe.impl=grouped", "train.dtype=bfloat16", "train.compile=false", "model.moe.balance=bias", "model.moe.bias_rate=0.01")


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_step_that_does_not_log_reads_nothing_on_the_host(data_dir, tmp_path, kind, optimizer):  # noqa: F811
    extra = [f"optim.name={optimizer}", "optim.muon.ns_dtype=float32", "train.on_nonfinite=skip",
             "train.micro_batch=2"]  # 2 micro-batches per step: one gradient reduction for both
    if kind == "moe":
        extra[:0] = MOE[2:]

    def run(name: str, steps: int, every: int) -> HostReads:
        argv = args_for(data_dir, tmp_path, name, *extra, f"train.steps={steps}", f"log.every={every}",
                        f"train.eval_every={every}", f"train.ckpt_every={every}")
        if kind == "moe":
            argv[2:2] = list(MOE[:2])  # layered after base.yaml, before the scale preset
        return count_reads(argv)

    short, long = run("short", 3, 3), run("long", 6, 6)
    assert long.sites == short.sites, (
        f"{(long.total - short.total) / 3:.1f} host reads per step that does not log: {long.sites - short.sites}")
    logging = run("every", 3, 1)  # positive control: log, eval and checkpoint at every step
    assert logging.total > short.total, (logging.sites, short.sites)

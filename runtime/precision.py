"""The run's precision and compilation, chosen from the hardware: `train.dtype: auto` and `train.compile: auto`.

bf16 is fast on a CPU only where the CPU has bf16 arithmetic — AMX tiles (Intel Sapphire Rapids and later) or
AVX512-BF16 (Intel Cooper Lake, AMD Zen 4 and later). Elsewhere (an AVX2-only EPYC, an AVX-512 CPU without BF16)
oneDNN emulates it: the built-in default's step ran 14–22× slower in bf16 than in fp32 on 2-core AVX2 EPYCs
(docs/benchmarks.md, "Precision by CPU"). So:

    train.dtype: auto    CUDA → bf16 mixed precision; CPU with bf16 arithmetic → bf16 mixed precision; else fp32
    train.compile: auto  CUDA → compiled; CPU → compiled only in bf16, where the default's step ran 1.9× eager fp32
                         (1.4× eager bf16); in fp32 on CPU compiling gained 1.09× per step (docs/benchmarks.md), less
                         than the 20–40 s of compilation costs a run of a few minutes

Mixed precision keeps fp32 master weights, optimizer state and gradient reduction (runtime/parallel.py), so a
checkpoint is the same whichever of fp32 and bf16 wrote it: a run whose `auto` resolves differently after a resume on
another machine continues, and the resume line says so (train.py). An explicit `train.dtype` is always obeyed.

What the CPU has comes from torch, not from /proc/cpuinfo: `torch.backends.cpu.get_cpu_capability()` (the vector ISA
ATen dispatches to; it honours ATEN_CPU_CAPABILITY, so `ATEN_CPU_CAPABILITY=avx2` makes a bf16 CPU resolve to fp32)
and torch.cpu's cpuinfo probes for AMX tiles and AVX512-BF16.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import torch

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float64: "fp64"}


@dataclass(frozen=True)
class CpuArithmetic:
    """What this CPU can do in bf16, as torch sees it."""
    capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX2", "AVX512", "DEFAULT", …
    amx: bool  # AMX tiles
    avx512_bf16: bool

    @property
    def has_bf16(self) -> bool:
        """bf16 arithmetic in hardware that ATen's kernels may use (a capability capped below AVX-512, by the CPU or
        by ATEN_CPU_CAPABILITY, runs AVX2 kernels, which have no bf16 instructions)."""
        return (self.amx or self.avx512_bf16) and self.capability.upper().startswith("AVX512")

    @property
    def name(self) -> str:
        """The words the run's first line uses: "AMX", "AVX512 with AVX512-BF16", "AVX2", …"""
        if self.has_bf16:
            return "AMX" if self.amx else f"{self.capability} with AVX512-BF16"
        return self.capability


def cpu_arithmetic() -> CpuArithmetic:
    def probe(name: str) -> bool:  # private cpuinfo probes of torch.cpu (torch ≥ 2.3); absent: assume no
        fn = getattr(torch.cpu, name, None)
        return bool(fn()) if callable(fn) else False
    return CpuArithmetic(torch.backends.cpu.get_cpu_capability(), probe("_is_amx_tile_supported"),
                         probe("_is_avx512_bf16_supported"))


@dataclass(frozen=True)
class Precision:
    """The resolved `train.dtype` and `train.compile` of a run, and why."""
    dtype: torch.dtype  # the compute dtype: fp32, bf16 (fp32 master weights) or fp64
    compile: bool
    reason: str  # why this dtype, in words

    @property
    def dtype_name(self) -> str:  # the config's spelling: float32 | bfloat16 | float64
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        """The run's first line about it, e.g. `precision: fp32, eager (this CPU has no bf16 arithmetic: AVX2)`."""
        mixed = " mixed (fp32 master weights)" if self.dtype == torch.bfloat16 else ""
        return f"precision: {DTYPE_NAMES[self.dtype]}{mixed}, {'compiled' if self.compile else 'eager'} ({self.reason})"


def resolve_precision(dtype: str, compile: Union[Literal["auto"], bool], device: torch.device,
                      cpu: CpuArithmetic | None = None) -> Precision:
    """`train.dtype` and `train.compile` → what the run does on `device`. `cpu`: what the CPU can do (default: this
    one's, from torch)."""
    if dtype != "auto":
        chosen, reason = getattr(torch, dtype), f"train.dtype={dtype}"
    elif device.type == "cuda":
        chosen, reason = torch.bfloat16, "auto on CUDA"
    else:
        cpu = cpu or cpu_arithmetic()
        if cpu.has_bf16:
            chosen, reason = torch.bfloat16, f"auto: this CPU has bf16 arithmetic: {cpu.name}"
        else:
            chosen, reason = torch.float32, f"auto: this CPU has no bf16 arithmetic: {cpu.name}"
    if compile == "auto":
        compiled = device.type == "cuda" or chosen == torch.bfloat16
    else:
        compiled = bool(compile)
    return Precision(chosen, compiled, reason)

"""Where a training step's time goes (`python -m scripts.bench --profile PATH`): each design's step under
torch.profiler, its kernels' self time summed by category, and what one design spends beyond the first.

The bench's table says *that* a design is slower; this says *where*: matmuls, attention, the compiled fused kernels
(norms, scale multiplies, activations), the optimizer, copies — and, on a GPU, how much of the wall time the device
was busy at all (a step whose kernels are small is bound by their launches, not by their arithmetic).

Times are self times (a kernel's own, not its children's), from the device's clock on CUDA and the host's on CPU,
divided by the profiled steps. The designs are profiled one after another, after the bench's timed rounds (warm:
compiled, allocator settled), on the same batches.
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Callable

import torch

# (category, lower-case substrings of the kernel or op name), first match wins. cuBLAS/CUTLASS GEMMs are named
# *gemm*/*xmma*/nvjet*; inductor's kernels triton_* on CUDA and cpp_fused_* on CPU.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "wgmma", "aten::mm", "aten::addmm", "aten::bmm",
                "aten::_grouped_mm", "aten::matmul", "aten::linear")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "newton", "muon")),
    ("compiled fused", ("triton_", "cpp_fused", "compiledfxgraph", "compiled graphs", "compiledfunction", "torch-compiled region")),
    ("reduction", ("reduce", "norm", "sum", "mean", "max", "softmax", "cross_entropy", "nll_loss")),
    ("copy / fill", ("memcpy", "memset", "copy", "fill", "cat", "to_copy", "zero_")),
)
OTHER = "other elementwise"


def category(name: str) -> str:
    low = name.lower()
    return next((cat for cat, keys in CATEGORIES if any(k in low for k in keys)), OTHER)


@dataclasses.dataclass
class OpTime:
    name: str
    category: str
    ms_per_step: float  # self time per step
    calls_per_step: float


@dataclasses.dataclass
class StepProfile:
    design: str
    clock: str  # "device" (CUDA kernels) or "host" (CPU ops)
    steps: int
    wall_ms_per_step: float  # the profiled steps' own wall time, profiler overhead included
    ops: list[OpTime]  # every kernel (CUDA) or op (CPU) with self time, largest first

    @property
    def busy_ms_per_step(self) -> float:
        return sum(o.ms_per_step for o in self.ops)

    def by_category(self) -> dict[str, float]:
        out = {cat: 0.0 for cat, _ in CATEGORIES} | {OTHER: 0.0}
        for o in self.ops:
            out[o.category] += o.ms_per_step
        return out


def profile_step(name: str, step: Callable[[], object], steps: int, device: torch.device) -> StepProfile:
    """`steps` calls of `step` under torch.profiler; each call must finish its work before it returns (the bench's
    step reads its loss)."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - t0
    from torch.autograd import DeviceType
    ops = []
    for ev in prof.key_averages():
        # CUDA: the device's own events (kernels, copies, fills), as the profiler's table totals them; a host op
        # also reports the time of the kernels it launched, and a user annotation (FSDP::pre_forward,
        # Optimizer.step#AdamW.step) spans the kernels inside it, so counting either would count kernels twice.
        # CPU: self CPU time of each op (children excluded), the host's clock.
        if cuda and (ev.device_type != DeviceType.CUDA or ev.is_user_annotation):
            continue
        us = ev.self_device_time_total if cuda else ev.self_cpu_time_total
        if us > 0:
            ops.append(OpTime(ev.key, category(ev.key), us / 1000 / steps, ev.count / steps))
    ops = _merge_graphs(ops)
    ops.sort(key=lambda o: -o.ms_per_step)
    return StepProfile(name, "device" if cuda else "host", steps, 1000 * wall / steps, ops)


def format_profiles(profiles: list[StepProfile], top: int = 15) -> str:
    """Markdown: the categories of every design beside the first's, then the ops that differ most from the first
    design's, then each design's largest ops."""
    base = profiles[0]
    cats = [cat for cat, _ in CATEGORIES] + [OTHER]
    clock = base.clock
    lines = [f"Self {clock} time per step, ms (torch.profiler, {base.steps} steps per design, after the timed ones); "
             f"Δ is to {base.design}.", ""]
    head = "| category | " + " | ".join(p.design + (" (Δ)" if p is not base else "") for p in profiles) + " |"
    lines += [head, "|---|" + "---:|" * len(profiles)]

    def cell(p: StepProfile, v: float, v0: float) -> str:
        return f"{v:.2f}" if p is base else f"{v:.2f} ({v - v0:+.2f})"
    for cat in cats + ["busy (sum)", "wall"]:
        vals = [(p.by_category()[cat] if cat in cats else p.busy_ms_per_step if cat == "busy (sum)"
                 else p.wall_ms_per_step) for p in profiles]
        if cat in cats and not any(vals):
            continue
        lines.append(f"| {cat} | " + " | ".join(cell(p, v, vals[0]) for p, v in zip(profiles, vals)) + " |")
    for p in profiles[1:]:
        mine, theirs = _per_name(p), _per_name(base)
        diff = sorted(set(mine) | set(theirs), key=lambda k: -abs(mine.get(k, 0.0) - theirs.get(k, 0.0)))[:top]
        lines += ["", f"Ops whose time differs most, {p.design} − {base.design} (ms per step):", "",
                  f"| op | category | {base.design} | {p.design} | Δ |", "|---|---|---:|---:|---:|"]
        for k in diff:
            a, b = theirs.get(k, 0.0), mine.get(k, 0.0)
            lines.append(f"| `{_short(k)}` | {category(k)} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
    for p in profiles:
        lines += ["", f"Largest ops of {p.design} (ms per step, calls per step):", "",
                  "| op | category | ms | calls |", "|---|---|---:|---:|"]
        lines += [f"| `{_short(o.name)}` | {o.category} | {o.ms_per_step:.3f} | {o.calls_per_step:g} |"
                  for o in p.ops[:top]]
    return "\n".join(lines) + "\n"


def _merge_graphs(ops: list[OpTime]) -> list[OpTime]:
    """CPU: inductor's compiled graphs are named by a content hash ("## Call CompiledFxGraph f2b7… ##"), different in
    every design; one row for them all makes designs comparable op by op."""
    merged: dict[str, OpTime] = {}
    for o in ops:
        name = re.sub(r"## Call CompiledFxGraph \w+ ##", "compiled graphs (inductor, CPU)", o.name)
        m = merged.setdefault(name, OpTime(name, category(name), 0.0, 0.0))
        m.ms_per_step += o.ms_per_step
        m.calls_per_step += o.calls_per_step
    return list(merged.values())


def _per_name(p: StepProfile) -> dict[str, float]:
    return {o.name: o.ms_per_step for o in p.ops}


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def write_profiles(path: Path, profiles: list[StepProfile]) -> None:
    """The markdown to `path`, and every op of every design to the same name with .json (for sums of one's own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_profiles(profiles))
    path.with_suffix(".json").write_text(json.dumps(
        [{**dataclasses.asdict(p), "busy_ms_per_step": p.busy_ms_per_step, "by_category": p.by_category()}
         for p in profiles], indent=1) + "\n")

"""The bench's memory on CPU (`python -m scripts.bench`, bench/steps.py): a process's resident set cannot be
split between designs that share it, so each design is measured alone, in a child process of its own
(`--memory-probe K`), two ways:

- tensors: what the design holds between steps (parameters, optimizer state) plus the peak of the tensors one step
  allocates over that, from torch.profiler's memory events: what max_memory_allocated measures on CUDA, so the
  same quantity on either device;
- RSS: the growth of its peak resident set over building and stepping it, as the operating system sees it. It also
  counts what the compiler keeps resident (graphs, guards, generated code), which grows with a graph's size and
  is no tensor of the step."""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from bench.steps import REPO, Design, build, make_batches


def max_rss_mib() -> float:
    """This process's peak resident set so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def proc_status_mib(field: str) -> Optional[float]:
    """A `VmRSS`/`VmHWM` line of Linux's /proc/self/status in MiB, or None where there is none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1]) / 1024  # "VmHWM:   13508 kB"
    except OSError:
        pass
    return None


def reset_peak_rss() -> Optional[float]:
    """Start a fresh peak: hand the heap's free memory back (the training process keeps it, runtime/cpu.py, and a
    design would reuse it unseen), reset Linux's resident high-water mark (`5` to /proc/self/clear_refs) and return
    the resident set now, which the new peak is measured from; None where the kernel offers no reset (then the peak
    is the process's whole-life one, and a design smaller than an earlier transient would read as 0)."""
    from runtime.cpu import release_free_heap
    gc.collect()
    release_free_heap()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return proc_status_mib("VmRSS")


def memory_probe(design: Design, di, batches, seq_len: int, n_steps: int, warmup: int = 0) -> dict:
    """Run in a child process of its own: the growth of peak RSS over building and stepping this one design, from
    the resident set before it was built. With `warmup` > 0 the peak is that of the steps after the first `warmup`
    (the high-water mark reset there, the heap's free memory handed back first): what a step holds once compiled,
    as max_memory_allocated measures it on CUDA, and not the compiler's transients, which vary by 10-20 % of a tiny
    model's peak from one run to the next."""
    # A miniature of the same design first (1 layer, width 8 per head, vocab 64, no compile): the lazy imports and
    # one-time setup of the first build and step (thread pools, kernel tables, the modeling modules transformers
    # loads on first use) happen there, so they are not counted as this design's memory.
    mini = dataclasses.replace(design, cfg=dataclasses.replace(
        design.cfg, model=dataclasses.replace(design.cfg.model, d_model=8 * design.cfg.model.n_heads, n_layers=1,
                                              vocab_size=64),
        train=dataclasses.replace(design.cfg.train, compile=False)))
    mini = dataclasses.replace(mini, cfg=dataclasses.replace(
        mini.cfg, train=dataclasses.replace(mini.cfg.train, micro_batch=2, global_batch=2),
        data=dataclasses.replace(mini.cfg.data, seq_len=8)))
    warm = build(mini, di, 8, make_batches(1, 2, 8, 64, di.device))
    warm.step()
    del warm
    gc.collect()
    # The peak is measured from the resident set after the warmup, not from the process's earlier peak: a transient
    # of the setup (reading the corpus, importing transformers) could otherwise hide a small design entirely.
    reset = reset_peak_rss()
    before = reset if reset is not None else max_rss_mib()
    runner = build(design, di, seq_len, batches)
    for i in range(n_steps):
        if i == warmup and warmup > 0 and reset is not None:
            reset_peak_rss()  # the peak from here on; still measured from `before`
        runner.step()
    after = (proc_status_mib("VmHWM") if reset is not None else None) or max_rss_mib()
    from bench.steps import resident_bytes
    held = resident_bytes(runner.model, runner.optimizer)
    return {"design": design.name, "peak_mib": max(0.0, after - before), "baseline_mib": before,
            "tensor_peak_mib": (held + step_tensor_peak(runner.step)) / 2**20}


def step_tensor_peak(step) -> int:
    """The peak bytes of tensors one call of `step` allocates over what was live when it started, from
    torch.profiler's memory events (each op's own allocations less its frees, in time order). A step run after
    others returns what it allocated (net 0), so the running sum starts and ends at what the design holds. An op
    that frees a temporary before it returns shows only its net: workspaces inside one kernel are not seen."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    changes = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
                     if e.self_cpu_memory_usage != 0)
    live = peak = 0
    for _, nbytes in changes:
        live += nbytes
        peak = max(peak, live)
    return peak


def run_probes(argv: list[str], designs: list[Design], jobs: int) -> "list":
    """Start one child per design (`--memory-probe K`); returns futures of its `memory_probe` dict, or None."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    def probe(k: int) -> Optional[dict]:
        cmd = [sys.executable, "-m", "scripts.bench", "--memory-probe", str(k), *argv]  # options before a "--"
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        try:
            found = json.loads(done.stdout.strip().splitlines()[-1])
            return {key: float(found[key]) for key in ("peak_mib", "tensor_peak_mib")}
        except (ValueError, IndexError, KeyError, TypeError):
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            print(f"memory probe of {designs[k].name} failed (exit {done.returncode}): {' | '.join(tail)}",
                  file=sys.stderr)
            return None
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    futures = [pool.submit(probe, k) for k in range(len(designs))]
    pool.shutdown(wait=False)
    return futures

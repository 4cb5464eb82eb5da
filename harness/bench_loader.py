"""The loader's time per micro-batch with and without prefetch, alone and next to a training step.

    python -m harness.bench_loader                      # built-in corpus, bpe:8192; shapes 16×256 and 16×1024
    python -m harness.bench_loader --data-dir data_cache/pd_english --shapes 8x1024 --repeats 5 --cold

Without --data-dir it prepares (once) the built-in corpus with the CPU default tokenizer, like `python train.py`.
For each shape (micro_batch × seq_len; 16×256 is configs/tiny_cpu.yaml's, 16×1024 a paper-like one) it reports,
as median [min–max] over --repeats rounds that alternate the order of the two modes:

  loader alone     ms per next_batch() called back to back (prefetch: the thread gathers, the caller waits on it)
  simulated step   a compute-bound step of ~--sim-ms ms (fp32 matmuls on torch's threads) after each next_batch():
                   ms waiting in next_batch, ms in the step, their sum, and the process's CPU ms (all threads);
                   and, as the floor, the same with one fixed batch instead of a loader. With --cold, also with
                   the data evicted from the page cache before every batch (the first epoch of a large dataset).
                   On CPU the question is whether a background gather slows the step, since the thread shares
                   the cores with the step's compute.
  val stream       the first 65,536 val tokens, as train.py's eval reads them.
  model step       the tiny Llama (d_model 256, 4 layers, fp32, fwd+bwd+AdamW) on the first shape, the same way.

    python -m harness.bench_loader --scale-check        # the loader at the paper-scale plan's 106B tokens

--scale-check builds a synthetic prepared dir of --scale-tokens train tokens (default 106e9, the one dir every
paper-scale config reads) in shards of 100M uint16 tokens as sparse files (headers and holes: no disk blocks), and
measures, per rank (rank 0 of 8) in a fresh process for each case, at 32×1,024 (the 0.12B configs) and 4×4,096 (the
1B): start-up (TrainLoader constructed + first batch), RSS growth and peak, open file descriptors, and ms per batch
after it, for the loader's Feistel order and for the materialized order of old checkpoints (`permutation`). It
removes the dir afterwards.
"""
from __future__ import annotations

import argparse
import gc
import math
import mmap
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from data.config import DataConfig
from data.loader import TrainLoader, read_meta, val_batches
from data.prepare import DEFAULT_SHARD_TOKENS, ensure_prepared
from data.shards import DataError
from data.synthetic import synthetic_dir
from data.tokenizer import padded_vocab
from model.config import ModelConfig
from model.llama import Llama

MODES = {"off": False, "on": True}


def time_loader(data_dir: str, seq_len: int, micro_batch: int, world_size: int, n: int, prefetch: bool) -> float:
    """Mean ms per next_batch() over n calls back to back, after one warm-up batch (opening, first pages)."""
    with TrainLoader(data_dir, seq_len, micro_batch, rank=world_size - 1, world_size=world_size,
                     prefetch=prefetch) as loader:
        loader.next_batch()
        t0 = time.perf_counter()
        for _ in range(n):
            loader.next_batch()
        return (time.perf_counter() - t0) / n * 1e3


Batch = tuple[torch.Tensor, torch.Tensor]


def evict(loader: TrainLoader) -> None:
    """Drop the shards' pages from this process's mapping and from the page cache (Linux), so that the next reads
    go to the disk, as in the first epoch of a dataset larger than RAM."""
    for shard in loader.shards:
        mapping = getattr(shard, "_mmap", None)  # np.memmap's mmap.mmap; a mapped page stays cached otherwise
        if mapping is not None:
            mapping.madvise(mmap.MADV_DONTNEED)
        fd = os.open(shard.filename, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def time_with_step(next_batch: Callable[[], Batch], step: Callable[[torch.Tensor, torch.Tensor], None], n: int,
                   warmup: int, before: Callable[[], None] = lambda: None) -> tuple[float, float, float, float]:
    """(ms waiting in next_batch, ms in `step`, ms for both, CPU ms of the whole process incl. the prefetch
    thread) per iteration, means over n after warmup; `before` runs untimed before each next_batch."""
    wait = work = 0.0
    cpu = 0.0
    for i in range(warmup + n):
        before()
        c0 = time.process_time()
        t0 = time.perf_counter()
        x, y = next_batch()  # (B, L) int64 each
        t1 = time.perf_counter()
        step(x, y)
        t2 = time.perf_counter()
        if i >= warmup:
            wait, work, cpu = wait + (t1 - t0), work + (t2 - t1), cpu + (time.process_time() - c0)
    return wait / n * 1e3, work / n * 1e3, (wait + work) / n * 1e3, cpu / n * 1e3


def simulated_step(target_ms: float) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A compute-bound stand-in for a training step: enough 256×256 fp32 matmuls for about target_ms."""
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    best = float("inf")
    for _ in range(5):  # the fastest of 5 tries: a busy moment must not shrink the step
        t0 = time.perf_counter()
        for _ in range(20):
            a @ b
        best = min(best, (time.perf_counter() - t0) / 20 * 1e3)
    reps = max(1, round(target_ms / best))

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        for _ in range(reps):
            a @ b
    return step


def model_step(data_dir: str, args: argparse.Namespace) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One optimizer step (forward, backward, AdamW) of the tiny model."""
    cfg = ModelConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                      vocab_size=padded_vocab(read_meta(data_dir)["n_vocab"]))
    model = Llama(cfg)
    model.init_weights(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def rounds(repeats: int, measure: Callable[[bool], float | tuple[float, ...]]) -> dict[str, list]:
    """measure(prefetch) for both modes, `repeats` times, alternating which goes first (machines drift)."""
    out: dict[str, list] = {m: [] for m in MODES}
    for r in range(repeats):
        for mode in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
            out[mode].append(measure(MODES[mode]))
    return out


def span(values: list[float], digits: int) -> str:
    """median [min–max]: other work on a shared 2-core machine inflates single rounds, never shrinks them"""
    v = sorted(values)
    return f"{statistics.median(v):.{digits}f} [{v[0]:.{digits}f}–{v[-1]:.{digits}f}]"


def report_step(label: str, results: dict[str, list[tuple[float, float, float, float]]], digits: int,
                what: str = "prefetch") -> None:
    for mode, rows in results.items():
        wait, work, total, cpu = (list(v) for v in zip(*rows))
        print(f"  {label}, {what} {mode:3s}: wait {span(wait, 3)} + step {span(work, digits)} = "
              f"{span(total, digits)} ms/iteration; CPU {span(cpu, digits)} ms")


def bench_shape(data_dir: str, b: int, seq_len: int, sim: Callable[[torch.Tensor, torch.Tensor], None],
                args: argparse.Namespace) -> None:
    """The loader alone, next to the simulated step (warm and, with --cold, cold), and the val stream."""
    print(f"batch {b}×{seq_len}:")
    for ws in (1, 8):
        res = rounds(args.repeats, lambda pf: time_loader(data_dir, seq_len, b, ws, args.batches, pf))
        print(f"  loader alone, world size {ws}: " + ", ".join(
            f"prefetch {m} {span(v, 3)} ms/batch" for m, v in res.items()))

    def with_sim(pf: bool, cold: bool = False) -> tuple[float, float, float, float]:
        with TrainLoader(data_dir, seq_len, b, prefetch=pf) as loader:
            return time_with_step(loader.next_batch, sim, args.sim_steps, 5,
                                  before=(lambda: evict(loader)) if cold else (lambda: None))
    label = f"simulated {args.sim_ms:g} ms step"
    report_step(label, rounds(args.repeats, with_sim), 3)
    # The floor: the same batch every time, no loader at all (what any Python costs right after a step).
    fixed = TrainLoader(data_dir, seq_len, b).next_batch()
    floor = [time_with_step(lambda: fixed, sim, args.sim_steps, 5) for _ in range(args.repeats)]
    report_step(label, {"n/a": floor}, 3, what="no loader (one fixed batch)")
    if args.cold:
        report_step(label + ", cold page cache", rounds(args.repeats, lambda pf: with_sim(pf, cold=True)), 3)
    t0 = time.perf_counter()
    n_val = sum(1 for _ in val_batches(data_dir, seq_len, b, max_tokens=65536))
    print(f"  val stream, 65,536 tokens: {n_val} batches in {(time.perf_counter() - t0) * 1e3:.1f} ms")


def bench_model(data_dir: str, b: int, seq_len: int, args: argparse.Namespace) -> None:
    step = model_step(data_dir, args)

    def with_model(pf: bool) -> tuple[float, float, float, float]:
        with TrainLoader(data_dir, seq_len, b, prefetch=pf) as loader:
            return time_with_step(loader.next_batch, step, args.steps, args.warmup)
    with TrainLoader(data_dir, seq_len, b) as loader:  # the first steps are slow (allocator, AdamW state): keep
        time_with_step(loader.next_batch, step, 1, 2)  # them out of round 0's first mode (they made it ~4 % slower)
    print(f"batch {b}×{seq_len}, model d={args.d_model}, {args.n_layers} layers, fp32, fwd+bwd+AdamW:")
    report_step("model step", rounds(args.repeats, with_model), 1)


# ------------------------------------------------------------------------------------ --scale-check: 106B tokens

SCALE_SHAPES = ((32, 1024), (4, 4096))  # micro_batch × seq_len of configs/dense/0.12b.yaml and configs/dense/1b.yaml
SCALE_RANK, SCALE_WORLD = 0, 8  # one rank of an 8-GPU node: each rank builds its own loader
def _rss_kb() -> tuple[int, int]:
    """(current, peak) resident set size of this process in kB (Linux: /proc/self/status VmRSS, VmHWM)."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]), int(status["VmHWM"].split()[0])


def scale_case(data_dir: str, micro_batch: int, seq_len: int, order: str, batches: int,
               fd_limit: Optional[int] = None) -> dict:
    """One rank's loader in this (fresh) process. Start-up = the constructor + the first next_batch(), which holds
    the order's first use (`order_ms`, window_ids of batch 0: the Feistel keys, or drawing the permutation) and the
    reads; then the order's ms per batch (window_ids) and next_batch's, reads included (on sparse files every read
    is a first touch of a hole: the storage's cost, the same for both orders). Memory: RSS growth once the first
    batch is out and its peak. `order` "permutation" is the materialized order of a state version 1–2 checkpoint, as
    load_state_dict sets it. `fd_limit` lowers this process's soft limit of open files first (`ulimit -n`)."""
    if fd_limit is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    except OSError:
        pass
    rss0, _ = _rss_kb()
    fds0 = len(os.listdir("/proc/self/fd"))
    t0 = time.perf_counter()
    try:
        loader = TrainLoader(data_dir, seq_len, micro_batch, rank=SCALE_RANK, world_size=SCALE_WORLD)
    except OSError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    t1 = time.perf_counter()
    loader.order = order
    loader.window_ids(0)
    t2 = time.perf_counter()
    loader.next_batch()
    t3 = time.perf_counter()
    rss1, peak = _rss_kb()
    fds = len(os.listdir("/proc/self/fd")) - fds0
    for k in range(1, batches + 1):
        loader.window_ids(k)
    t4 = time.perf_counter()
    for _ in range(batches):
        loader.next_batch()
    t5 = time.perf_counter()
    return {"windows": loader.n_windows, "init_ms": (t1 - t0) * 1e3, "order_ms": (t2 - t1) * 1e3,
            "startup_ms": (t3 - t0) * 1e3, "rss_mib": (rss1 - rss0) / 1024,
            "peak_mib": (peak - rss0) / 1024, "fds": fds, "ids_ms": (t4 - t3) / batches * 1e3,
            "batch_ms": (t5 - t4) / batches * 1e3, "fd_soft_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}


def _in_fresh_process(*args) -> dict:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(scale_case, *args).result()


def scale_check(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="scalevec-loader-", dir=args.scale_dir)) / "data"
    try:
        t0 = time.perf_counter()
        synthetic_dir(root, int(args.scale_tokens))
        meta = read_meta(root)
        used = sum(p.stat().st_blocks * 512 for p in root.iterdir())
        print(f"synthetic dir: {meta['splits']['train']['tokens']:,} train tokens in "
              f"{len(meta['splits']['train']['shards']):,} shards of {DEFAULT_SHARD_TOKENS:,} uint16 tokens "
              f"(sparse: {used / 1e6:.1f} MB on disk), written in {time.perf_counter() - t0:.1f} s; rank "
              f"{SCALE_RANK} of {SCALE_WORLD}, a fresh process per case, median [min–max] of {args.repeats}; "
              f"torch {torch.__version__}, numpy {np.__version__}")
        for b, seq_len in SCALE_SHAPES:
            for order in ("feistel", "permutation"):
                runs = [_in_fresh_process(str(root), b, seq_len, order, args.batches) for _ in range(args.repeats)]
                r = {k: [x[k] for x in runs] for k in runs[0]}
                print(f"  {b}×{seq_len} ({r['windows'][0]:,} windows), {order}: start-up "
                      f"{span(r['startup_ms'], 0)} ms (constructor {span(r['init_ms'], 0)}, the order's first use "
                      f"{span(r['order_ms'], 1)}); RSS +{span(r['rss_mib'], 1)} MiB (peak +{span(r['peak_mib'], 1)}); "
                      f"{r['fds'][0]:,} files open; per batch: order {span(r['ids_ms'], 3)} ms, next_batch "
                      f"{span(r['batch_ms'], 1)} ms")
        soft = 1024
        res = _in_fresh_process(str(root), *SCALE_SHAPES[0], "feistel", 1, soft)
        print(f"  with a soft limit of {soft} open files (`ulimit -n {soft}`, a common default): "
              + (res["error"] if "error" in res else f"fine ({res['fds']:,} files held open, the soft limit "
                                                     f"then {res['fd_soft_limit']:,})"))
    finally:
        shutil.rmtree(root.parent)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench_loader", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", help="a prepared data dir (default: the built-in corpus with bpe:8192)")
    p.add_argument("--shapes", default="16x256,16x1024", help="micro_batch×seq_len pairs, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="rounds per measurement (median [min–max])")
    p.add_argument("--batches", type=int, default=500, help="loader batches to time per round")
    p.add_argument("--sim-ms", type=float, default=5.0, help="the simulated step's compute, ms")
    p.add_argument("--sim-steps", type=int, default=100, help="simulated steps per round")
    p.add_argument("--cold", action="store_true", help="also time the simulated step with the shards evicted from "
                   "the page cache before every batch (Linux; slows other readers of the data dir a little)")
    p.add_argument("--steps", type=int, default=4, help="model steps per round (after --warmup); 0 skips them")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--scale-check", action="store_true", help="measure the loader on a synthetic dir of "
                   "--scale-tokens tokens (sparse files, removed afterwards) instead; see above")
    p.add_argument("--scale-tokens", type=float, default=106e9, help="train tokens of the --scale-check dir")
    p.add_argument("--scale-dir", help="where the --scale-check dir goes (default: the system's temp dir)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.batches < 1:
        p.error(f"--repeats ({args.repeats}) and --batches ({args.batches}) must be ≥ 1")
    if args.scale_check:
        if not args.scale_tokens >= DEFAULT_SHARD_TOKENS / 50:  # also refuses nan
            p.error("--scale-check needs --scale-tokens ≥ 2e6")
        if args.scale_dir and not Path(args.scale_dir).is_dir():
            p.error(f"--scale-dir {args.scale_dir} is not a folder: give an existing one (default: the temp dir)")
        scale_check(args)
        return 0
    shapes = parse_shapes(p, args.shapes)
    if args.sim_steps < 1 or not 0 < args.sim_ms < math.inf or args.steps < 0 or args.warmup < 0:
        p.error(f"--sim-steps ({args.sim_steps}) must be ≥ 1, --sim-ms ({args.sim_ms}) a positive number, "
                f"--steps ({args.steps}) and --warmup ({args.warmup}) ≥ 0")
    bad = ModelConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads).invariants()
    if args.steps and bad:
        p.error("; ".join(f"--{key.replace('_', '-')}: {problem}" for key, problem in bad))
    try:
        data_dir = args.data_dir or str(ensure_prepared(DataConfig(
            dir="data_cache/pd_english_bpe8192", tokenizer="bpe:8192", seq_len=max(L for _, L in shapes))))
        meta = read_meta(data_dir)
        print(f"data: {data_dir} ({meta['tokenizer']['name']}, {meta['splits']['train']['tokens']:,} train tokens); "
              f"torch {torch.__version__}, threads {torch.get_num_threads()}; median [min–max] of {args.repeats} "
              "rounds")
        sim = simulated_step(args.sim_ms)
        for b, seq_len in shapes:
            bench_shape(data_dir, b, seq_len, sim, args)
    except DataError as e:  # the data dir is not prepared, or its shards are shorter than a shape's seq_len
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.steps > 0:
        bench_model(data_dir, *shapes[0], args)
    return 0


def parse_shapes(p: argparse.ArgumentParser, text: str) -> list[tuple[int, int]]:
    """"16x256,16x1024" → [(16, 256), (16, 1024)]; anything else is a usage error."""
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        p.error(f"--shapes {text!r}: give micro_batch×seq_len pairs of whole numbers ≥ 1, comma-separated "
                "(16x256,8x1024)")
    return shapes


if __name__ == "__main__":
    sys.exit(main())

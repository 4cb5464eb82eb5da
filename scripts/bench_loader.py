"""The loader's time per micro-batch with and without prefetch, alone and next to a training step.

    python -m scripts.bench_loader                      # built-in corpus, bpe:8192; shapes 16×256 and 16×1024
    python -m scripts.bench_loader --data-dir data_cache/pd_english --shapes 8x1024 --repeats 5 --cold

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
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from data.config import DataConfig
from data.loader import TrainLoader, read_meta, val_batches
from data.prepare import ensure_prepared
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_loader", description=__doc__,
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
    args = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    data_dir = args.data_dir or str(ensure_prepared(
        DataConfig(dir="data_cache/pd_english_bpe8192", tokenizer="bpe:8192", seq_len=max(L for _, L in shapes))))
    meta = read_meta(data_dir)
    print(f"data: {data_dir} ({meta['tokenizer']['name']}, {meta['splits']['train']['tokens']:,} train tokens); "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}; median [min–max] of {args.repeats} rounds")
    sim = simulated_step(args.sim_ms)
    for b, seq_len in shapes:
        bench_shape(data_dir, b, seq_len, sim, args)
    if args.steps > 0:
        bench_model(data_dir, *shapes[0], args)


if __name__ == "__main__":
    main()

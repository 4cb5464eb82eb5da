"""The loader's time per batch next to a tiny model's training step: the loader must be noise.

    python -m scripts.bench_loader                      # built-in corpus, bpe:8192, the tiny CPU model's shapes
    python -m scripts.bench_loader --data-dir data_cache/pd_english --seq-len 1024 --micro-batch 8

Without --data-dir it prepares (once) the built-in corpus with the CPU default tokenizer, like `python train.py`.
The model is model.llama.Llama (d_model 256, 4 layers, 4 heads by default), trained in fp32 with AdamW.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from data.config import DataConfig
from data.loader import TrainLoader, read_meta, val_batches
from data.prepare import ensure_prepared
from data.tokenizer import padded_vocab
from model.config import ModelConfig
from model.llama import Llama


def time_loader(data_dir: str, seq_len: int, micro_batch: int, world_size: int, n: int) -> tuple[float, float]:
    """(ms for the first batch of a fresh loader, mean ms per batch over n batches after it)."""
    t0 = time.perf_counter()
    loader = TrainLoader(data_dir, seq_len, micro_batch, rank=world_size - 1, world_size=world_size, seed=0)
    loader.next_batch()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        loader.next_batch()
    return first * 1e3, (time.perf_counter() - t0) / n * 1e3


def time_model(data_dir: str, args: argparse.Namespace) -> float:
    """Mean ms per optimizer step (forward, backward, AdamW) of the tiny model on real batches."""
    cfg = ModelConfig(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads,
                      vocab_size=padded_vocab(read_meta(data_dir)["n_vocab"]))
    model = Llama(cfg)
    model.init_weights(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = TrainLoader(data_dir, args.seq_len, args.micro_batch)
    times = []
    for i in range(args.warmup + args.steps):
        x, y = loader.next_batch()
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return sum(times) / len(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m scripts.bench_loader", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", help="a prepared data dir (default: the built-in corpus with bpe:8192)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=500, help="loader batches to time")
    p.add_argument("--steps", type=int, default=5, help="model steps to time (after --warmup)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--n-heads", type=int, default=4)
    args = p.parse_args(argv)
    data_dir = args.data_dir or str(ensure_prepared(
        DataConfig(dir="data_cache/pd_english_bpe8192", tokenizer="bpe:8192", seq_len=args.seq_len)))
    meta = read_meta(data_dir)
    print(f"data: {data_dir} ({meta['tokenizer']['name']}, {meta['splits']['train']['tokens']:,} train tokens); "
          f"batch {args.micro_batch}×{args.seq_len}; torch threads {torch.get_num_threads()}")
    for ws in (1, 8):
        first, per = time_loader(data_dir, args.seq_len, args.micro_batch, ws, args.batches)
        print(f"loader, world size {ws}: {per:.3f} ms/batch (first batch incl. opening {first:.1f} ms)")
    t0 = time.perf_counter()
    n_val = sum(1 for _ in val_batches(data_dir, args.seq_len, args.micro_batch, max_tokens=65536))
    print(f"val stream, 65,536 tokens: {n_val} batches in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    _, per = time_loader(data_dir, args.seq_len, args.micro_batch, 1, args.batches)
    step = time_model(data_dir, args)
    print(f"model step (d={args.d_model}, {args.n_layers} layers, fp32, fwd+bwd+AdamW): {step:.1f} ms")
    print(f"loader / step = {per / step * 100:.3f} %")


if __name__ == "__main__":
    main()

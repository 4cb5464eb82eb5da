"""Training-step speed and memory of scale-vector designs, measured side by side in one process (PAPER.md Table 3).

    python -m scripts.bench                                            # tiny CPU shapes, baseline vs unified
    python -m scripts.bench --config configs/dense/1b.yaml --presets baseline unified --compile \\
        --micro-batch 4 --steps 10 --warmup 3                          # Table 3's setting, on a GPU
    python -m scripts.bench --models configs/tiny_moe.yaml "configs/tiny_cpu.yaml model.d_ffn=1367" \\
        --presets baseline                                             # MoE vs the dense model of equal activated size

Each design gets the same random batches; designs are interleaved round by round, so drift in machine load hits all
of them alike. Prints ms/step, tokens/s, MFU (on known GPUs), peak memory (CUDA) and the ratio to the first design.
The step is the trainer's: FSDP2-wrapped (one rank) forward + backward + clip + optimizer step.
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from config import load_config


def resident_bytes(model, optimizer) -> int:
    """Bytes a design holds between steps: its parameters and optimizer state (local shards)."""
    from torch.distributed.tensor import DTensor

    def nbytes(t):
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()
    total = sum(nbytes(p) for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(nbytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def step_fn(model, optimizer, batch, grad_clip: float, loss_chunk: int):
    from optim import clip_grad_norm
    from runtime.moe import moe_step_end
    x, y = batch
    loss = model(x, y, loss_chunk=loss_chunk)  # the trainer's loss: the fused LM head + loss
    (loss + model.aux_loss()).backward()
    clip_grad_norm(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    moe_step_end(model)  # MoE: loads → balancing bias, as in train.py
    return loss.item()  # waits for the device


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="model size config (default: configs/tiny_cpu.yaml shapes)")
    p.add_argument("--models", nargs="+", metavar='"CONFIG [key=value ...]"',
                   help="compare several models instead of one --config: each a config file and its own overrides, "
                        "in one quoted string; every model is run with every preset")
    p.add_argument("--presets", nargs="+", default=["baseline", "unified"], help="configs/scale/<name>.yaml")
    p.add_argument("--micro-batch", type=int, help="sequences per step (default: the config's micro_batch)")
    p.add_argument("--seq-len", type=int, help="default: the config's data.seq_len")
    p.add_argument("--vocab-size", type=int, default=None, help="default: the config's, else 8192")
    p.add_argument("--steps", type=int, default=10, help="timed steps per design")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per design (compile, allocator)")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--no-malloc-tuning", action="store_true", help="CPU: keep glibc's default allocator policy")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides applied to every design")
    args = p.parse_args(argv)

    from model.llama import Llama
    from runtime.build import build_training_model
    from runtime.dist import init_distributed, shutdown
    from runtime.metrics import mfu, peak_flops
    di = init_distributed(args.device)
    if di.device.type == "cpu" and not args.no_malloc_tuning:
        from runtime.cpu import tune_glibc_malloc
        tune_glibc_malloc()
    if args.models:
        models = [(Path(words[0]).stem + "".join(f"[{o.split('.')[-1]}]" for o in words[1:]), [words[0]], words[1:])
                  for words in map(shlex.split, args.models)]
    else:
        models = [("", args.config or ["configs/tiny_cpu.yaml"], [])]
    try:
        runs = []
        for label, paths, model_overrides in models:
            for preset in args.presets:
                cfg = load_config([*paths, f"configs/scale/{preset}.yaml"], [*model_overrides, *args.overrides])
                vocab = args.vocab_size or cfg.model.vocab_size or 8192
                cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab),
                                          train=dataclasses.replace(cfg.train, compile=args.compile, seed=0))
                built = build_training_model(cfg, di.device)
                model, opt = built.model, built.optimizer
                runs.append((f"{label}/{preset}" if label else preset, cfg, model, opt))
        B = args.micro_batch or runs[0][1].train.micro_batch
        T = args.seq_len or runs[0][1].data.seq_len
        gen = torch.Generator().manual_seed(0)
        V = runs[0][1].model.vocab_size
        batches = [tuple(torch.randint(0, V, (B, T), generator=gen).to(di.device) for _ in range(2))
                   for _ in range(args.warmup + args.steps)]
        times: dict[str, list[float]] = {name: [] for name, *_ in runs}
        peak_mem: dict[str, float] = {}
        for i, batch in enumerate(batches):  # interleaved: step i of every design, then step i + 1
            for name, cfg, model, opt in runs:
                if di.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                    others = torch.cuda.memory_allocated() - resident_bytes(model, opt)
                t0 = time.perf_counter()
                step_fn(model, opt, batch, cfg.optim.grad_clip, cfg.train.loss_chunk_tokens)
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
                if di.device.type == "cuda":  # this design's peak: the process peak minus what the others hold
                    mine = (torch.cuda.max_memory_allocated() - others) / 2**20
                    peak_mem[name] = max(peak_mem.get(name, 0.0), mine)
        peak = peak_flops(di.device)
        dev = torch.cuda.get_device_name(di.device) if di.device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
        print(f"device {dev} | torch {torch.__version__} | batch {B}×{T} | vocab {V} | compile {args.compile} | "
              f"dtype {runs[0][1].train.dtype} | {args.steps} timed steps after {args.warmup}")
        w = max(12, *(len(name) + 2 for name, *_ in runs))
        print(f"{'design':<{w}}{'params':>14}{'activated':>14}{'ms/step':>10}{'± sd':>8}{'tok/s':>10}{'MFU':>7}"
              f"{'mem MiB':>10}{'ratio':>7}")
        ref = None
        for name, cfg, model, _ in runs:
            ms = 1000 * statistics.median(times[name])
            sd = 1000 * statistics.stdev(times[name]) if len(times[name]) > 1 else 0.0
            tok_s = B * T / (ms / 1000)
            with torch.device("meta"):
                flops = Llama(cfg.model).flops_per_token(T)
            u = mfu(flops, tok_s, 1, peak)
            ref = ref or ms
            mem = f"{peak_mem[name]:.0f}" if name in peak_mem else "-"
            print(f"{name:<{w}}{model.num_params():>14,}{model.activated_params():>14,}{ms:>10.1f}{sd:>8.1f}"
                  f"{tok_s:>10.0f}"
                  f"{(f'{100 * u:.1f}%' if u else '-'):>7}{mem:>10}{ms / ref:>7.3f}")
    finally:
        shutdown(di)
    return 0


if __name__ == "__main__":
    sys.exit(main())

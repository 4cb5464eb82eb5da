"""Training-step speed and memory of scale-vector designs, measured side by side (docs/paper.md Table 3).

    python -m scripts.bench                                            # tiny CPU shapes, baseline vs unified
    python -m scripts.bench --config configs/dense/1b.yaml --presets baseline unified --compile \\
        --micro-batch 4 --steps 10 --warmup 3                          # Table 3's setting, on a GPU
    python -m scripts.bench --models configs/tiny_moe.yaml "configs/tiny_cpu.yaml model.d_ffn=1367" \\
        --presets baseline                                             # MoE vs the dense model of equal activated size

Time. Every design gets the same batches (random tokens; with --data, the config's training data in train.py's
order), and the designs are interleaved in one process round by round (step i of every design, then step i + 1), so
drift in machine load hits all of them alike. The step is train.py's: runtime/trainer.py's `Trainer.step` on a model
built as train.py builds it (runtime/build.py) — one optimizer step of one micro-batch (--micro-batch; accumulation 1,
one rank): FSDP2-wrapped forward with the fused LM head + loss, backward, the global gradient norm and clipping, the
all-reduce of the losses and batch digest, the non-finite guard, the update, the MoE bookkeeping. The loss is read
after each step (the wait for the device is in the time). ms/step is the median over the timed steps; tok/s follows
from it. The schedule is the config's (train.steps), so the steps are the run's first ones: with --data and the same
config and seed, their losses are train.py's.

Memory. CUDA: per design in the timing process, torch.cuda.max_memory_allocated over its steps minus what the other
designs hold (their parameters and optimizer state) — the caching allocator counts only live tensors, so the designs
do not blur each other. CPU: the process's resident set cannot be split between designs that share it, so each
design also runs alone in a child process of its own (`--memory-probe`; all at once by default, which changes no
process's own peak, and done before the timing process builds its models). There `peak MiB` is CUDA's quantity:
what the design holds between steps (parameters, optimizer state) plus the peak of the tensors one more step
allocates over it, from torch.profiler's memory events (bench/memory_probe.py). `RSS MiB` is the operating
system's view: the peak RSS over the same warmup + timed steps on the same batches, the high-water mark reset after
the warmup steps (/proc/self/clear_refs; else resource.getrusage ru_maxrss over all steps), minus the RSS it had
after its imports and one step of a miniature of itself (which takes the lazy imports and one-time setup out of the
count), before building the model. That growth is the parameters, gradients, optimizer state, activations,
compiled code, what the compiler keeps (graphs, guards) and what the allocator keeps, under the same glibc setting
as training (runtime/cpu.py); the compiler's transients during the warmup are not in it.

Reference row `hf-llama` (--hf-reference; on by default when transformers is installed and the first model is dense):
transformers' LlamaForCausalLM with the first model's shapes (runtime/hf_export.py's config: padded vocab, untied
embeddings, no biases, same rope theta and eps), attn_implementation="sdpa", fp32 parameters sharded by FSDP2 as ours
(one fully_shard per decoder layer with the same reshard-after-forward rule, one at the root; with bf16 on CUDA the
same mixed-precision policy: bf16 compute, fp32 gradient reduction; train.activation_checkpointing applies to ours
only), its decoder layers compiled under --compile. Its step: forward to full logits, fp32 cross-entropy against the
same targets, backward, clip, torch.optim.AdamW with the config's lr, betas, eps and weight decay on every parameter
(fused on CUDA, foreach on CPU), zero_grad.

Ratios are to the first design: time (ms/step), memory (peak MiB) and on CPU the RSS. MFU is printed on GPUs
whose peak is known.

Footprint (a second table; --no-footprint skips it), after the timed rounds, per design of ours (bench/footprint.py):
the bytes autograd saves for backward per block (mean over blocks) and at most at once in the LM head, through
saved-tensor hooks on the model as it trains (parameters and shared inputs excluded); the parameter tensors (what
FSDP2, clipping and the optimizer loop over); the aten operators dispatched per step, nested ones included, and on
CUDA the kernels launched (torch.profiler, two steps).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Optional

import torch

from config import SCALE_PRESETS, load_config

from strictconfig.config import ConfigError
from bench.steps import (build_parser, format_footprint, format_header, format_table, make_batches, plan,
                               time_designs, with_data)
from bench.memory_probe import memory_probe, run_probes
from runtime.files import out_path_problem


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse numbers that would fail only after the designs have run (or be taken as "the default"), up front."""
    sizes = {"--steps": args.steps, "--micro-batch": args.micro_batch, "--seq-len": args.seq_len,
             "--vocab-size": args.vocab_size}
    small = [f"{flag} {value}" for flag, value in sizes.items() if value is not None and value < 1]
    small += [f"{flag} {value}" for flag, value in (("--warmup", args.warmup), ("--memory-jobs", args.memory_jobs))
              if value < 0]
    if small:
        p.error(f"{', '.join(small)}: --steps and the shapes must be ≥ 1, --warmup and --memory-jobs ≥ 0")
    if any(not shlex.split(model) for model in args.models or ()):
        p.error('--models: each model is a quoted "CONFIG [key=value ...]", not an empty string')
    unknown = [name for name in args.presets if not (SCALE_PRESETS / f"{name}.yaml").is_file()]
    if unknown:
        p.error(f"--presets: no preset {', '.join(unknown)}; choose from "
                f"{' '.join(sorted(f.stem for f in SCALE_PRESETS.glob('*.yaml')))}")
    for flag, path in (("--json", args.json), ("--profile", args.profile)):
        problem = out_path_problem(path) if path else None
        if problem:
            p.error(f"{flag} {problem}")
    if args.profile_steps < 1:
        p.error(f"--profile-steps {args.profile_steps}: must be ≥ 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda, but CUDA is not available here (torch {torch.__version__}); use --device auto or cpu")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(__doc__)
    args = parser.parse_args(argv)
    check_args(parser, args)

    from runtime.dist import init_distributed, shutdown
    try:
        designs, notes = plan(args)
        di = init_distributed(args.device)
        if args.data:
            designs = with_data(designs)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if di.device.type == "cpu" and not args.no_malloc_tuning:
        from runtime.cpu import tune_glibc_malloc
        tune_glibc_malloc()
    cfg0 = designs[0].cfg
    B, T = cfg0.train.micro_batch, cfg0.data.seq_len
    n_steps = args.warmup + args.steps
    try:
        batches = None if args.data else make_batches(n_steps, B, T, cfg0.model.vocab_size, di.device)
        if args.memory_probe is not None:
            print(json.dumps(memory_probe(designs[args.memory_probe], di, batches, T, n_steps, args.warmup)))
            return 0
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        peak_mem: dict[str, Optional[float]] = {}  # tensors (as max_memory_allocated on CUDA)
        rss_mem: dict[str, Optional[float]] = {}  # CPU: the peak resident set's growth
        probed = di.device.type == "cpu" and not args.no_memory
        if probed:
            # The probes finish before this process builds its models: at no time does the machine hold more than
            # all designs once (what this process holds anyway), and no probe loads the timed steps.
            probes = run_probes(argv, designs, args.memory_jobs or len(designs))
            if any(d.hf for d in designs):
                import transformers  # noqa: F401  (slow; meanwhile)
            found = {d.name: f.result() for d, f in zip(designs, probes)}
            peak_mem = {name: m and m["tensor_peak_mib"] for name, m in found.items()}
            rss_mem = {name: m and m["peak_mib"] for name, m in found.items()}
        header, rows = time_designs(designs, di, batches, args.steps, args.warmup, peak_mem, probed, notes,
                                    args.json, (args.profile, args.profile_steps) if args.profile else None,
                                    measure_footprint=not args.no_footprint, rss_mem=rss_mem)
        print(format_header(header))
        print(format_table(rows), end="")
        print(format_footprint(rows), end="")
    finally:
        shutdown(di)
    return 0


if __name__ == "__main__":
    sys.exit(main())

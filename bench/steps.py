"""The benchmark of scale-vector designs (`python -m scripts.bench`, whose help says what is measured and how;
results in docs/benchmarks.md): designs planned from the command's options, built as train.py builds its model (or
as transformers' Llama, the reference row), timed side by side round by round, their memory measured, the table.

Every design steps through runtime/trainer.py's `Trainer.step`, the one training step (docs/design.md principle 12),
so what is timed is what trains.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import shlex
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from config import RunConfig, load_config, resolve_vocab
from model.summary import activated_params, num_params
from runtime.precision import DTYPE_NAMES, Precision, cpu_arithmetic, resolve_precision

# --precisions: train.dtype and train.compile of each column (auto: runtime/precision.py's choice for this machine)
PRECISIONS = {"auto": ("auto", "auto"), "eager-fp32": ("float32", False), "compiled-fp32": ("float32", True),
              "eager-bf16": ("bfloat16", False), "compiled-bf16": ("bfloat16", True)}

HF_NAME = "hf-llama"
REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class Design:
    name: str
    cfg: RunConfig
    hf: bool = False  # transformers' LlamaForCausalLM with cfg.model's shapes instead of our Llama


@dataclasses.dataclass
class Runner:
    """A built design: one training step on its next batch (returning the loss, read after the step), and what the
    table reports about it."""
    step: Callable[[], float]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: int
    activated: int
    precision: "Precision"  # the resolved train.dtype and train.compile (runtime/precision.py)
    forward: Optional[Callable[[], torch.Tensor]] = None  # one micro-batch's loss, for the footprint (ours only)


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


def hf_step_fn(model, optimizer, batches, grad_clip: float):
    """transformers' own training step, the reference row (not ours: ours is runtime/trainer.py's)."""
    x, y = batches.next_batch()
    logits = model(input_ids=x, use_cache=False).logits  # (B, T, V) in the compute dtype; no KV cache in training
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    loss.backward()
    # Ours always computes the norm and clips when grad_clip > 0; an infinite max_norm computes it and scales by 1.
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def build_ours(cfg: RunConfig, di, batches) -> Runner:
    """The trainer train.py runs (runtime/trainer.py), on `batches`."""
    from runtime.trainer import Trainer
    trainer = Trainer(cfg, di, batches)
    model = trainer.model

    def forward() -> torch.Tensor:  # the step's forward on the source's next batch (bench/footprint.py)
        x, y = batches.next_batch()
        return model(x, y, loss_chunk=cfg.train.loss_chunk_tokens)
    return Runner(lambda: trainer.step().losses[0].item(), model, trainer.optimizer, num_params(model),
                  activated_params(model), trainer.precision, forward)


def build_hf_reference(cfg: RunConfig, device: torch.device, seq_len: int, batches) -> Runner:
    """transformers' Llama with cfg.model's shapes, wrapped, cast and compiled as runtime/build.py does ours."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaForCausalLM

    from runtime.hf_export import hf_config
    hf_cfg = hf_config(cfg.model, max_positions=max(seq_len, 2048))
    hf_cfg._attn_implementation = "sdpa"  # torch's fused attention, the kernel family ours calls
    hf_cfg.use_cache = False
    torch.manual_seed(cfg.train.seed)
    with torch.device(device):
        model = LlamaForCausalLM(hf_cfg).to(torch.float32)  # fp32 master parameters, as ours
    precision = resolve_precision(cfg.train.dtype, cfg.train.compile, device)  # as runtime/build.py resolves ours
    compute = precision.dtype
    kwargs = {"mesh": init_device_mesh(device.type, (dist.get_world_size(),))}
    if compute == torch.float64:
        model.double()
    elif compute != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    layers = list(model.model.layers)
    reshard = getattr(cfg.train, "reshard_after_forward", "auto")
    for i, layer in enumerate(layers):  # runtime/parallel.py's rule: under auto the last block stays gathered
        fully_shard(layer, reshard_after_forward=i < len(layers) - 1 if reshard == "auto" else bool(reshard), **kwargs)
    fully_shard(model, **kwargs)
    if precision.compile:
        for layer in layers:
            layer.compile()
    on_cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                            weight_decay=cfg.optim.weight_decay, **({"fused": True} if on_cuda else {"foreach": True}))
    n = sum(p.numel() for p in model.parameters())
    return Runner(lambda: hf_step_fn(model, opt, batches, cfg.optim.grad_clip), model, opt, n, n, precision)


def build(design: Design, di, seq_len: int, batches=None) -> Runner:
    """`batches`: a list of (x, y) every design steps through in turn, or None for the design's training data as
    train.py reads it (--data; prepared, and the vocabulary resolved, by with_data)."""
    from runtime.trainer import FixedBatches
    if batches is None:
        from data.loader import TrainLoader
        t = design.cfg.train
        source = TrainLoader(design.cfg.data.dir, design.cfg.data.seq_len, t.micro_batch, di.rank, di.world_size,
                             t.seed, device=di.device, prefetch=False)
    else:
        source = FixedBatches(batches)
    if design.hf:
        return build_hf_reference(design.cfg, di.device, seq_len, source)
    return build_ours(design.cfg, di, source)


def with_data(designs: list[Design]) -> list[Design]:
    """--data: each design's training data prepared (on first use, as train.py does) and its vocabulary resolved."""
    from data.prepare import ensure_prepared
    from data.shards import load_meta
    out = []
    for d in designs:
        ensure_prepared(d.cfg.data)
        n_vocab = load_meta(d.cfg.data.dir).tokenizer["n_vocab"]
        model = resolve_vocab(d.cfg, n_vocab=n_vocab)  # as runtime/trainer.py resolves it
        out.append(dataclasses.replace(d, cfg=dataclasses.replace(d.cfg, model=model)))
    return out


def plan(args) -> tuple[list[Design], list[str]]:
    """The designs to run (cheap: configs only) and notes for the user."""
    if args.models:
        models = [(Path(words[0]).stem + "".join(f"[{o.split('.')[-1]}]" for o in words[1:]), [words[0]], words[1:])
                  for words in map(shlex.split, args.models)]
    else:
        models = [("", args.config or ["configs/tiny_cpu.yaml"], [])]
    designs = []
    for label, paths, model_overrides in models:
        for preset in args.presets:
            cfg = load_config([*paths, f"configs/scale/{preset}.yaml"], [*model_overrides, *args.overrides])
            vocab = args.vocab_size or cfg.model.vocab_size or (None if args.data else 8192)  # --data: its own
            micro = args.micro_batch or cfg.train.micro_batch  # one micro-batch per step: accumulation 1, one rank
            train = dataclasses.replace(cfg.train, compile=True if args.compile else cfg.train.compile,
                                        micro_batch=micro, global_batch=micro)
            cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab), train=train,
                                      data=dataclasses.replace(cfg.data, seq_len=args.seq_len or cfg.data.seq_len))
            name = f"{label}/{preset}" if label else preset
            if not args.precisions:
                designs.append(Design(name, cfg))
            for column in args.precisions or ():  # the same design in each precision, side by side
                dtype, compiled = PRECISIONS[column]
                if column == "auto":  # named by what it resolves to here: auto=eager-fp32, auto=compiled-bf16, …
                    p = resolve_precision(dtype, compiled, _device(args.device))
                    column += f"={'compiled' if p.compile else 'eager'}-{DTYPE_NAMES[p.dtype]}"
                designs.append(Design(f"{name}/{column}", dataclasses.replace(
                    cfg, train=dataclasses.replace(cfg.train, dtype=dtype, compile=compiled))))
    notes = []
    first = designs[0]
    have_hf = importlib.util.find_spec("transformers") is not None
    if args.hf_reference is not False:
        if not have_hf:
            notes.append("no hf-llama reference row: transformers is not installed (pip install transformers)")
        elif first.cfg.model.moe is not None:
            notes.append("no hf-llama reference row: the first model is an MoE, and LlamaForCausalLM is dense")
        else:
            label = models[0][0]
            designs.append(Design(f"{label}/{HF_NAME}" if label else HF_NAME, first.cfg, hf=True))
    if args.hf_reference and not any(d.hf for d in designs):
        raise SystemExit(f"error: --hf-reference: {notes[-1]}")
    return designs, notes


def _device(setting: str) -> torch.device:
    """--device as runtime/dist.py resolves it (one process)."""
    return torch.device("cuda" if setting == "cuda" or (setting == "auto" and torch.cuda.is_available()) else "cpu")


def make_batches(n: int, B: int, T: int, V: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)  # the same batches in every process: the timing one and each probe
    return [tuple(torch.randint(0, V, (B, T), generator=gen).to(device) for _ in range(2)) for _ in range(n)]


def build_parser(description: Optional[str] = None) -> argparse.ArgumentParser:
    """The options of `python -m scripts.bench` (its docstring is the `description`), read by `plan` and
    `time_designs`; the memory probes pass them on to their child processes unchanged."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--compile", action="store_true", help="torch.compile each block (and each HF decoder layer)")
    p.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), metavar="PRECISION",
                   help="time every design in each of these (train.dtype and train.compile), side by side: "
                        f"{', '.join(PRECISIONS)}; auto is what train.py chooses on this machine")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--data", action="store_true",
                   help="train on each config's data (prepared on first use) in train.py's order, instead of random "
                        "tokens: the same losses as `python train.py` with that config for these steps")
    p.add_argument("--no-malloc-tuning", action="store_true", help="CPU: keep glibc's default allocator policy")
    p.add_argument("--hf-reference", action=argparse.BooleanOptionalAction, default=None,
                   help="add the transformers LlamaForCausalLM row (default: on when transformers is installed)")
    p.add_argument("--no-memory", action="store_true", help="CPU: skip the per-design memory processes")
    p.add_argument("--no-footprint", action="store_true",
                   help="skip the footprint table (saved activations, parameter tensors, ops per step)")
    p.add_argument("--memory-jobs", type=int, default=0,
                   help="CPU: memory processes run at once (default 0: all designs; 1 for models near the RAM size)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the table as JSON")
    p.add_argument("--profile", type=Path, metavar="PATH",
                   help="after the timed rounds, profile --profile-steps more steps of each design (torch.profiler) "
                        "and write where the time goes, by category and by op, beside the first design, to PATH "
                        "(markdown; bench/profile.py)")
    p.add_argument("--profile-steps", type=int, default=3, help="steps per design under the profiler")
    p.add_argument("--memory-probe", type=int, help=argparse.SUPPRESS)  # internal: a child measuring one design
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides applied to every design")
    return p


def time_designs(designs: list[Design], di, batches, steps: int, warmup: int,
                 peak_mem: dict[str, Optional[float]], probed: bool, notes: list[str],
                 json_path: Optional[Path] = None, profile: Optional[tuple[Path, int]] = None,
                 measure_footprint: bool = True, rss_mem: Optional[dict[str, Optional[float]]] = None
                 ) -> tuple[dict, list[dict]]:
    """Build every design and step them interleaved, round by round (step i of every design, then step i + 1), so
    that drift in machine load hits all of them alike: `warmup` untimed rounds, then `steps` timed ones. `peak_mem`:
    the memory probes' tensor peaks on CPU (`probed`; none with --no-memory), and `rss_mem` their peak resident sets'
    growth (bench/memory_probe.py); on CUDA each design's peak is measured here.
    After every timed round the table so far goes to `json_path`, so a run cut by a timeout keeps it. `profile`:
    (path, steps) — then each design steps that many more times under torch.profiler (bench/profile.py), and
    where its time goes is written to path. `measure_footprint`: after the timed rounds, each design's saved
    activations, parameter tensors and ops per step (bench/footprint.py) join its row. Returns the table's header
    and rows."""
    from model.llama import Llama
    from model.summary import flops_per_token
    from runtime.metrics import peak_flops
    cfg0 = designs[0].cfg
    B, T = cfg0.train.micro_batch, cfg0.data.seq_len
    V = cfg0.model.vocab_size
    cpu = di.device.type == "cpu"
    peak_mem = dict(peak_mem)
    runners = {d.name: build(d, di, T, batches) for d in designs}
    times: dict[str, list[float]] = {d.name: [] for d in designs}
    losses: dict[str, list[float]] = {d.name: [] for d in designs}
    footprints: dict = {}
    peak = peak_flops(di.device)
    with torch.device("meta"):
        flops = {d.name: flops_per_token(Llama(d.cfg.model), T) for d in designs}  # hf-llama: its source's
    dev = (torch.cuda.get_device_name(di.device) if not cpu else
           f"cpu ({torch.get_num_threads()} threads, {cpu_arithmetic().name}"
           f"{', bf16 arithmetic' if cpu_arithmetic().has_bf16 else ', no bf16 arithmetic'})")
    mem_how = ("max_memory_allocated per design" if not cpu else
               "tensors held + a step's peak (torch.profiler), and peak RSS growth; one process per design" if probed
               else "-")
    header = {"device": dev, "torch": torch.__version__, "batch": [B, T], "vocab": V,
              "compile": _one_or_mixed(r.precision.compile for r in runners.values()),
              "dtype": _one_or_mixed(r.precision.dtype_name for r in runners.values()), "steps": steps,
              "warmup": warmup, "memory": mem_how, "batches": "random" if batches is not None else "data"}
    rows: list[dict] = []
    for i in range(warmup + steps):
        for d in designs:
            r = runners[d.name]
            if not cpu:
                torch.cuda.reset_peak_memory_stats()
                others = torch.cuda.memory_allocated() - resident_bytes(r.model, r.optimizer)
            t0 = time.perf_counter()
            losses[d.name].append(r.step())
            if i >= warmup:
                times[d.name].append(time.perf_counter() - t0)
            if not cpu:  # this design's peak: the process peak minus what the others hold
                mine = (torch.cuda.max_memory_allocated() - others) / 2**20
                peak_mem[d.name] = max(peak_mem.get(d.name) or 0.0, mine)
        if i >= warmup:
            rows = table_rows(designs, runners, times, peak_mem, B * T, flops, peak, rss_mem=rss_mem)
            if json_path:
                json_path.parent.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps({**header, "steps": i + 1 - warmup, "notes": notes, "rows": rows,
                                                 "losses": losses}, indent=1) + "\n")
    if measure_footprint:
        from bench.footprint import footprint
        for d in designs:
            r = runners[d.name]
            if r.forward is not None:
                footprints[d.name] = footprint(r.model, r.forward, r.step, di.device)
        rows = table_rows(designs, runners, times, peak_mem, B * T, flops, peak, footprints, rss_mem)
        if json_path:
            json_path.write_text(json.dumps({**header, "notes": notes, "rows": rows, "losses": losses}, indent=1)
                                 + "\n")
    if profile:
        from bench.profile import profile_step, write_profiles
        path, n = profile
        write_profiles(path, [profile_step(d.name, runners[d.name].step, n, di.device) for d in designs])
    return header, rows


def table_rows(designs, runners: dict, times: dict[str, list[float]], peak_mem: dict[str, Optional[float]],
               tokens: int, flops: dict[str, float], peak: Optional[float], footprints: Optional[dict] = None,
               rss_mem: Optional[dict[str, Optional[float]]] = None) -> list[dict]:
    """One row per design from its timed steps so far: median ms/step, tok/s (`tokens` per step), MFU, peak memory
    (tensors), and the time and memory ratios to the first design; with `rss_mem` (CPU) the peak resident set's
    growth and its ratio; with `footprints` (bench/footprint.py) also the saved activations (MiB per block, the
    head's peak), the parameter tensors and the ops per step."""
    from runtime.metrics import mfu
    rows = []
    for d in designs:
        ts = times[d.name]
        ms = 1000 * statistics.median(ts)
        tok_s = tokens / (ms / 1000)
        rows.append({"design": d.name, "params": runners[d.name].params, "activated": runners[d.name].activated,
                     "ms_per_step": ms, "ms_sd": 1000 * statistics.stdev(ts) if len(ts) > 1 else 0.0,
                     "tok_per_s": tok_s, "mfu": mfu(flops[d.name], tok_s, 1, peak),
                     "peak_mem_mib": peak_mem.get(d.name), "dtype": runners[d.name].precision.dtype_name,
                     "compile": runners[d.name].precision.compile})
    for r in rows:
        r["time_ratio"] = r["ms_per_step"] / rows[0]["ms_per_step"]
        m0, m = rows[0]["peak_mem_mib"], r["peak_mem_mib"]
        r["mem_ratio"] = m / m0 if m is not None and m0 else None
        if rss_mem:
            r0, rr = rss_mem.get(rows[0]["design"]), rss_mem.get(r["design"])
            r["rss_mib"], r["rss_ratio"] = rr, (rr / r0 if rr is not None and r0 else None)
    for r in rows:
        f = (footprints or {}).get(r["design"])
        if f is None:
            continue
        r.update({"saved_block_mib": f.saved_block_mean_bytes / 2**20, "saved_head_mib": f.saved_head_peak_bytes / 2**20,
                  "param_tensors": f.param_tensors, "host_ops": f.host_ops_per_step, "kernels": f.kernels_per_step})
        first = rows[0].get("saved_block_mib")
        r["saved_block_ratio"] = r["saved_block_mib"] / first if first else None
    return rows


def format_header(h: dict) -> str:
    """The line printed above the table: the machine, the shapes, the precision and how memory was measured."""
    return (f"device {h['device']} | torch {h['torch']} | batch {h['batch'][0]}×{h['batch'][1]} | "
            f"vocab {h['vocab']} | compile {h['compile']} | dtype {h['dtype']} | {h['steps']} timed steps after "
            f"{h['warmup']} | mem: {h['memory']}")


def format_table(rows: list[dict]) -> str:
    """The printed table: one header line, then one line per design (scripts and tests split it on whitespace)."""
    num = _num
    w = max(12, *(len(r["design"]) + 2 for r in rows))
    rss = any("rss_mib" in r for r in rows)
    lines = [f"{'design':<{w}}{'params':>14}{'activated':>14}{'ms/step':>10}{'± sd':>8}{'tok/s':>10}{'MFU':>7}"
             f"{'peak MiB':>10}" + (f"{'RSS MiB':>9}{'RSS ×':>7}" if rss else "") + f"{'time ×':>8}{'mem ×':>8}"]
    for r in rows:
        mfu_text = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        rss_text = f"{num(r.get('rss_mib'), '.0f'):>9}{num(r.get('rss_ratio'), '.3f'):>7}" if rss else ""
        lines.append(f"{r['design']:<{w}}{r['params']:>14,}{r['activated']:>14,}{r['ms_per_step']:>10.1f}"
                     f"{r['ms_sd']:>8.1f}{r['tok_per_s']:>10.0f}{mfu_text:>7}{num(r['peak_mem_mib'], '.0f'):>10}"
                     f"{rss_text}{r['time_ratio']:>8.3f}{num(r['mem_ratio'], '.3f'):>8}")
    return "\n".join(lines) + "\n"


def format_footprint(rows: list[dict]) -> str:
    """The footprint table (bench/footprint.py), one line per design that has one; "" when none has."""
    rows = [r for r in rows if "saved_block_mib" in r]
    if not rows:
        return ""
    num = _num
    w = max(12, *(len(r["design"]) + 2 for r in rows))
    lines = [f"{'design':<{w}}{'saved MiB/block':>16}{'× first':>9}{'head peak MiB':>15}{'param tensors':>15}"
             f"{'host ops/step':>15}{'kernels/step':>14}"]
    for r in rows:
        lines.append(f"{r['design']:<{w}}{r['saved_block_mib']:>16.2f}{num(r['saved_block_ratio'], '.3f'):>9}"
                     f"{r['saved_head_mib']:>15.2f}{r['param_tensors']:>15,}{num(r['host_ops'], ',.0f'):>15}"
                     f"{num(r['kernels'], ',.0f'):>14}")
    return "\n".join(lines) + "\n"


def _num(value: Optional[float], fmt: str) -> str:
    """A table cell: the value formatted, or "-" where it was not measured."""
    return "-" if value is None else format(value, fmt)


def _one_or_mixed(values) -> object:
    """The designs' common setting, or "per design" (the labels of --models say which)."""
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else "per design"

"""The training run's own config sections: train and log (with wandb). The root `config.py` composes them with the
model's, the data's and the optimizer's and schedule's into a RunConfig; a field a resumed run may change says so
with strictconfig/config.py's `resumable`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, Optional

from strictconfig.config import resumable as _resumable


MAX_COUNT = 10**12  # the largest step count, batch or token count a train. field accepts


@dataclass
class TrainConfig:
    steps: int = 1000
    global_batch: int = 32  # sequences per optimizer step, across all ranks and accumulation
    # sequences per forward per rank. Resumable: the loader's position is global (data/loader.py), DCP reshards the
    # rest, so a resume may change the layout
    micro_batch: int = _resumable(8)
    eval_every: int = _resumable(200)
    eval_tokens: int = _resumable(262144)  # tokens of each validation stream per evaluation
    # What an evaluation of the training data's val split reads (data/evalset.py): prefix (its first eval_tokens, in
    # stored order: the built-in corpus's front is all Shakespeare) | mixture (a fixed document-shuffled sample per
    # source, val_loss weighing each source's loss by its share of the training tokens, val_loss/<source> beside
    # it). Not resumable: one run's curve is read on one eval set. Extra val_sets are read as a prefix either way.
    eval_sample: Literal["prefix", "mixture"] = "prefix"
    extra_eval_tokens: Optional[int] = _resumable(None)  # tokens of each extra val_set per evaluation; null: eval_tokens
    ckpt_every: int = _resumable(1000)
    keep_ckpts: int = _resumable(2)
    seed: int = 0
    # Chosen from the hardware (runtime/precision.py). compile auto: on CUDA, and on CPU in bf16 (where it pays).
    # dtype auto: bf16 mixed precision on CUDA and on a CPU with bf16 arithmetic (AMX, AVX512-BF16), else fp32;
    # float64 runs everything in double (reference tests). An explicit dtype change is refused on resume; a change of
    # what auto resolves to is allowed and said (runtime/trainer.py, precision_change).
    compile: Literal["auto", True, False] = _resumable("auto")
    dtype: Literal["auto", "float32", "bfloat16", "float64"] = "auto"
    # A step whose loss or gradient norm is NaN/inf: stop (before any checkpoint sees that state) | skip (no update on
    # any rank, optimizer state untouched, counted as `skipped_steps` in metrics.jsonl; the run still stops after
    # max_consecutive_skips of them in a row: a diverged run does not skip its way to the end)
    on_nonfinite: Literal["stop", "skip"] = _resumable("stop")
    max_consecutive_skips: int = _resumable(5)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # On CPU, keep freed activations in glibc's heap instead of unmapping them every step (runtime/cpu.py): the
    # same numbers, fewer page faults. Off: the allocator's defaults.
    cpu_malloc_tuning: bool = _resumable(True)
    # Recompute block activations in backward instead of keeping them (runtime/parallel.py): none | full (every
    # block, ≈ one more forward) | selective (keep matmul and attention outputs, recompute the rest). Same numbers.
    activation_checkpointing: Literal["none", "full", "selective"] = _resumable("none")
    # FSDP2, per block: auto (every block but the last frees its gathered parameters after forward) | true | false
    # (keep them gathered until backward: fewer all-gathers, more memory). Same numbers.
    reshard_after_forward: Literal["auto", True, False] = _resumable("auto")
    fsdp_prefetch: int = _resumable(0)  # blocks whose all-gathers a block issues ahead; 0: FSDP2's implicit prefetch
    # The fast path (fast/): the reference model's function computed faster (vectors on the smaller side, DNP's u
    # handed on, banks, the fused LM head). Same numbers to rounding, the same names on disk; false trains the
    # reference model (model/) as written, e.g. a design of your own the fast path does not know.
    fast_path: bool = _resumable(True)
    # The LM head + loss (model/loss.py; fast/head.py) runs over chunks of this many tokens, so the (tokens, vocab) fp32
    # logits of a whole micro-batch never exist at once; 0 = the plain path (full logits, then cross-entropy).
    # None (auto): by device — 1024 on CPU; on CUDA the fewest equal chunks within a 4 GiB budget for a chunk's fp32
    # logits and their gradient (a 0.12B micro-batch at V = 50,304: 4 × 8192): model/loss.py, default_chunk_tokens.
    loss_chunk_tokens: Optional[int] = _resumable(None)
    # Under gradient accumulation, FSDP2 reduce-scatters the gradients once per optimizer step (step: every micro-batch
    # but the last accumulates unsharded gradients locally) or after every micro-batch (micro_batch: less memory).
    grad_reduce: Literal["step", "micro_batch"] = _resumable("step")
    # The loader gathers the next micro-batch in a background thread into pinned host memory while the current one
    # trains: auto (on with CUDA, off on CPU, where the thread competes with the step for the cores) | true | false.
    loader_prefetch: Literal["auto", True, False] = _resumable("auto")

    def invariants(self) -> list[tuple[str, str]]:
        """(key within train., problem) for every violated invariant."""
        bad = [(key, "must be positive") for key in ("steps", "global_batch", "micro_batch", "eval_every",
                                                     "eval_tokens", "ckpt_every", "keep_ckpts", "max_consecutive_skips")
               if getattr(self, key) <= 0]
        # A count beyond 1e12 is a typo (1e20 steps), not a run: the paper's longest is 40,000 steps of 512 sequences.
        bad += [(key, f"{getattr(self, key)} must lie in [1, 1e12]") for key in
                ("steps", "global_batch", "micro_batch", "eval_every", "eval_tokens", "ckpt_every")
                if getattr(self, key) > MAX_COUNT]
        if not 0 <= self.seed < 2**32:  # numpy's seeding range (the data order and init draw from it)
            bad.append(("seed", f"{self.seed} must lie in [0, 2**32)"))
        if self.extra_eval_tokens is not None and self.extra_eval_tokens <= 0:
            bad.append(("extra_eval_tokens", "must be positive (or null: eval_tokens)"))
        if self.loss_chunk_tokens is not None and self.loss_chunk_tokens < 0:
            bad.append(("loss_chunk_tokens", "must be ≥ 0 (0 = the plain, unfused LM head + loss; null = by device)"))
        for key in ("loader_prefetch", "compile", "reshard_after_forward"):
            value = getattr(self, key)
            if not (value == "auto" or isinstance(value, bool)):
                bad.append((key, f"{value!r} must be auto, true or false"))
        if self.fsdp_prefetch < 0:
            bad.append(("fsdp_prefetch", f"{self.fsdp_prefetch} must be ≥ 0 (0: FSDP2's implicit prefetch)"))
        if self.micro_batch > 0 and self.global_batch % self.micro_batch:
            bad.append(("global_batch", f"{self.global_batch} is not a multiple of micro_batch={self.micro_batch}"))
        return bad


@dataclass
class WandbConfig:
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    project: str = "scalevec"
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)


@dataclass
class LogConfig:
    out_dir: str = "runs"
    run_name: Optional[str] = None  # None: derived from the config file name
    every: int = 10  # steps between train records in metrics.jsonl
    # A DNP inner Norm whose input mean square falls below this many eps no longer normalizes: at 1 its output RMS
    # is √(1/2). An evaluation warns once per site below it (runtime/telemetry.py); summarize marks the run.
    headroom_warn: float = 1.0
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self):
        self.out_dir = os.path.expanduser(self.out_dir)  # "~/runs" as a shell would read it, not a folder named ~

    def invariants(self) -> list[tuple[str, str]]:
        bad = [("every", f"{self.every} must be positive")] if self.every <= 0 else []
        name = self.run_name
        if name is not None and (name in ("", ".", "..") or "/" in name or os.sep in name or name.startswith("~")):
            bad.append(("run_name", f"{name!r} must be one folder name inside log.out_dir (no '/', not '.' or "
                                    "'..'); put the path in log.out_dir"))
        if not (self.headroom_warn >= 0 and self.headroom_warn < float("inf")):
            bad.append(("headroom_warn", f"{self.headroom_warn} must be a finite number ≥ 0 (0: never warn)"))
        return bad

"""The run configuration, composed: each package's section (model/config.py, data/config.py, optim/config.py) and the
run's own (train and log, here) in one RunConfig, loaded by the strict loader (strictconfig/config.py: YAML with
`base:` chains, dotted overrides such as `optim.lr=3e-3`, ConfigError), with what spans sections: their joint
invariants, the vocabulary from the tokenizer, run names, strategy names and wandb tags. It imports no training code,
so the training side (runtime/, bench/, scripts/) imports it directly.

Strictness is the point: an unknown key names the closest valid key, a wrong type names the expected one, and a
violated invariant names the dotted key — one `ConfigError`, never a traceback from deep inside torch.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from data.config import DataConfig
from strictconfig.config import ConfigError, build, fill_absent, read_files, resumable
from model.config import ModelConfig
from optim.config import OptimConfig, ScheduleConfig


# ---------------------------------------------------------------------------------------- the train and log sections

MAX_COUNT = 10**12  # the largest step count, batch or token count a train. field accepts


@dataclass
class TrainConfig:
    steps: int = 1000
    global_batch: int = 32  # sequences per optimizer step, across all ranks and accumulation
    # sequences per forward per rank. Resumable: the loader's position is global (data/loader.py), DCP reshards the
    # rest, so a resume may change the layout
    micro_batch: int = resumable(8)
    eval_every: int = resumable(200)
    eval_tokens: int = resumable(262144)  # tokens of each validation stream per evaluation
    # What an evaluation of the training data's val split reads (data/evalset.py): prefix (its first eval_tokens, in
    # stored order: the built-in corpus's front is all Shakespeare) | mixture (a fixed document-shuffled sample per
    # source, val_loss weighing each source's loss by its share of the training tokens, val_loss/<source> beside
    # it). Not resumable: one run's curve is read on one eval set. Extra val_sets are read as a prefix either way.
    eval_sample: Literal["prefix", "mixture"] = "prefix"
    extra_eval_tokens: Optional[int] = resumable(None)  # tokens of each extra val_set per evaluation; null: eval_tokens
    ckpt_every: int = resumable(1000)
    keep_ckpts: int = resumable(2)
    seed: int = 0
    # Chosen from the hardware (runtime/precision.py). compile auto: on CUDA, and on CPU in bf16 (where it pays).
    # dtype auto: bf16 mixed precision on CUDA and on a CPU with bf16 arithmetic (AMX, AVX512-BF16), else fp32;
    # float64 runs everything in double (reference tests). An explicit dtype change is refused on resume; a change of
    # what auto resolves to is allowed and said (runtime/elastic.py, precision_change).
    compile: Literal["auto", True, False] = resumable("auto")
    dtype: Literal["auto", "float32", "bfloat16", "float64"] = "auto"
    # A step whose loss or gradient norm is NaN/inf: stop (before any checkpoint sees that state) | skip (no update on
    # any rank, optimizer state untouched, counted as `skipped_steps` in metrics.jsonl; the run still stops after
    # max_consecutive_skips of them in a row: a diverged run does not skip its way to the end)
    on_nonfinite: Literal["stop", "skip"] = resumable("stop")
    max_consecutive_skips: int = resumable(5)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # On CPU, keep freed activations in glibc's heap instead of unmapping them every step (runtime/cpu.py): the
    # same numbers, fewer page faults. Off: the allocator's defaults.
    cpu_malloc_tuning: bool = resumable(True)
    # Recompute block activations in backward instead of keeping them (runtime/parallel.py): none | full (every
    # block, ≈ one more forward) | selective (keep matmul and attention outputs, recompute the rest). Same numbers.
    activation_checkpointing: Literal["none", "full", "selective"] = resumable("none")
    # FSDP2, per block: auto (every block but the last frees its gathered parameters after forward) | true | false
    # (keep them gathered until backward: fewer all-gathers, more memory). Same numbers.
    reshard_after_forward: Literal["auto", True, False] = resumable("auto")
    fsdp_prefetch: int = resumable(0)  # blocks whose all-gathers a block issues ahead; 0: FSDP2's implicit prefetch
    # The fast path (fast/): the reference model's function computed faster (vectors on the smaller side, DNP's u
    # handed on, banks, the fused LM head). Same numbers to rounding, the same names on disk; false trains the
    # reference model (model/) as written, e.g. a design of your own the fast path does not know.
    fast_path: bool = resumable(True)
    # The LM head + loss (model/loss.py; fast/head.py) runs over chunks of this many tokens, so the (tokens, vocab) fp32
    # logits of a whole micro-batch never exist at once; 0 = the plain path (full logits, then cross-entropy).
    # None (auto): by device — 1024 on CPU; on CUDA the fewest equal chunks within a 4 GiB budget for a chunk's fp32
    # logits and their gradient (a 0.12B micro-batch at V = 50,304: 4 × 8192): model/loss.py, default_chunk_tokens.
    loss_chunk_tokens: Optional[int] = resumable(None)
    # Under gradient accumulation, FSDP2 reduce-scatters the gradients once per optimizer step (step: every micro-batch
    # but the last accumulates unsharded gradients locally) or after every micro-batch (micro_batch: less memory).
    grad_reduce: Literal["step", "micro_batch"] = resumable("step")
    # The loader gathers the next micro-batch in a background thread into pinned host memory while the current one
    # trains: auto (on with CUDA, off on CPU, where the thread competes with the step for the cores) | true | false.
    loader_prefetch: Literal["auto", True, False] = resumable("auto")

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


# ------------------------------------------------------------------------------------------------- the run config

@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = resumable(default_factory=LogConfig)  # where and how often a run logs

    def invariants(self) -> list[tuple[str, str]]:
        """Each section's own invariants under its prefix, then the ones that span sections."""
        bad = [(f"{name}.{k}", p) for name in ("model", "data", "train", "optim", "log")
               for k, p in getattr(self, name).invariants()]
        names = [Path(p).name for p in self.data.val_sets]
        if "val" in names or len(set(names)) != len(names):
            bad.append(("data.val_sets", f"folder names {names} must be unique and not 'val' (they name the "
                                         "val_loss/<name> metrics)"))
        sc = self.model.scale
        if not self.optim.scale_wd_invariant and (sc.placement != "dnp" or sc.reparam == "direct"):
            bad.append(("optim.scale_wd_invariant", "false leaves undecayed the magnitude β of an input-side vector "
                        "under DNP's inner Norm, and this model has none (model.scale.placement="
                        f"{sc.placement}, model.scale.reparam={sc.reparam}): set it true, or use placement dnp "
                        "with reparam or or er"))
        if sc.invariant_magnitude == "remove" and sc.placement != "dnp":
            bad.append(("model.scale.invariant_magnitude", "remove drops the magnitude of input-side vectors that "
                        f"only DNP's inner Norm reads, and placement {sc.placement} has no inner Norm: set it to keep"))
        elif sc.invariant_magnitude == "remove" and not self.optim.scale_wd_invariant:
            bad.append(("optim.scale_wd_invariant", "false spares the invariant magnitudes from decay, and "
                        "model.scale.invariant_magnitude=remove leaves none: set it true"))
        s, t = self.schedule, self.train
        if not 0 <= s.warmup_steps < t.steps:
            bad.append(("schedule.warmup_steps", f"{s.warmup_steps} must lie in [0, train.steps={t.steps})"))
        return bad + [(f"schedule.{k}", p) for k, p in s.invariants()]

    def to_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _plain(value: Any) -> Any:
    """Tuples → lists so the resolved YAML is plain and round-trips through the strict loader."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def resolve_vocab(cfg: RunConfig, n_vocab: Optional[int] = None) -> ModelConfig:
    """The model config with vocab_size filled in: as set, else the tokenizer's n_vocab rounded up to
    model.vocab_multiple (GPT-2: 50,257 → 50,304). `n_vocab` (known from the prepared data) skips loading the
    tokenizer; when given, a set vocab_size smaller than it is an error."""
    if cfg.model.vocab_size is not None and n_vocab is None:
        return cfg.model
    trained = re.fullmatch(r"bpe:(\d+)", cfg.data.tokenizer)
    if n_vocab is None and trained:  # a trained BPE's size is in its spec: no need for the prepared data
        n_vocab = int(trained.group(1))
    if n_vocab is None:
        from data.tokenizer import load_tokenizer  # lazy: reading ranks is slow
        n_vocab = load_tokenizer(cfg.data.tokenizer, cfg.data.dir).n_vocab
    try:
        return cfg.model.with_vocab(n_vocab, cfg.data.tokenizer)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def default_run_name(config_paths: list, overrides: list[str]) -> str:
    """`0.12b+hg_dp` for `--config dense/0.12b.yaml --config scale/hg_dp.yaml`, plus a short hash of the overrides
    (other than log.*), so runs that differ in settings never share a run directory by accident."""
    name = "+".join(Path(p).stem for p in config_paths)
    relevant = sorted(o for o in overrides if not o.startswith("log."))
    if relevant:
        name += "-" + hashlib.sha1(" ".join(relevant).encode()).hexdigest()[:6]
    return name


# ------------------------------------------------------------------------------------------------ strategies

SCALE_PRESETS = Path(__file__).resolve().parent / "configs" / "scale"


def strategy_of(cfg: RunConfig) -> tuple:
    """What a scale-vector preset decides (configs/scale/*.yaml state all of it)."""
    o = cfg.optim
    return cfg.model.scale, cfg.model.gemma_norms, o.scale_weight_decay, o.scale_wd_alpha, o.scale_wd_invariant


@lru_cache(maxsize=1)
def _presets() -> dict[tuple, str]:
    base = SCALE_PRESETS.parent / "base.yaml"
    out: dict[tuple, str] = {}
    for path in sorted(SCALE_PRESETS.glob("*.yaml")):
        out.setdefault(_key(strategy_of(load_config([base, path]))), path.stem)
    return out


def _key(strategy: tuple) -> str:
    return repr(strategy)  # dataclasses of plain values: their repr is a faithful, hashable key


def strategy_name(cfg: RunConfig) -> str:
    """The preset whose strategy the run used (`unified`, `baseline`, …), or "custom"."""
    return _presets().get(_key(strategy_of(cfg)), "custom")


def run_tags(cfg: RunConfig) -> list[str]:
    """wandb tags of a run: the config's own (figure, size, …) and what sets its curve apart — the strategy, the
    optimizer, the schedule, the peak lr and the seed — so a sweep or a seed of a figure needs no hand-written tags."""
    derived = [strategy_name(cfg), f"optim:{cfg.optim.name}", f"schedule:{cfg.schedule.name}",
               f"lr:{cfg.optim.lr:g}", f"seed:{cfg.train.seed}"] + (["moe"] if cfg.model.moe is not None else [])
    return list(dict.fromkeys([*cfg.log.wandb.tags, *derived]))


# ----------------------------------------------------------------------------------------------------- loading


def load_config(path: Optional[str | Path | list[str | Path]] = None,
                overrides: Optional[list[str]] = None) -> RunConfig:
    """Read YAML (following its `base:` chain), apply `a.b.c=value` overrides, build and check a RunConfig
    (strictconfig/config.py's strict loader).

    `path` may be a list of files, merged left to right (`--config dense/0.12b.yaml --config scale/hg.yaml`)."""
    paths = [] if path is None else [path] if isinstance(path, (str, Path)) else list(path)
    return build_config(read_files(paths, overrides))


def load_saved_config(path: str | Path) -> RunConfig:
    """A run's saved config.yaml, as that run trained: a key added since it was written reads as the value runs
    used before the key existed (strictconfig/config.py, `since`), not as today's default."""
    return build_config(fill_absent(RunConfig, read_files([path])))


def build_config(raw: dict) -> RunConfig:
    cfg = build(RunConfig, raw)
    bad = cfg.invariants()
    if bad:
        raise ConfigError("; ".join(f"{key}: {problem}" for key, problem in bad))
    return cfg

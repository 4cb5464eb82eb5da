"""Typed run configuration: dataclasses per section, a strict YAML loader with `base:` inheritance, and dotted
command-line overrides (`optim.lr=3e-3`).

Strictness is the point: an unknown key names the closest valid key, a wrong type names the expected one, and a
violated invariant names the dotted key — one `ConfigError`, never a traceback from deep inside torch.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

from data.config import DataConfig
from model.config import ModelConfig

WeightDecayMode = Literal["all", "iwd", "none", "no_input", "no_output"]


# libyaml's parser when PyYAML has it (10× faster; the same safe constructor and resolver, so the same values)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigError(ValueError):
    """A bad config: names the dotted key, the problem and, for typos, the closest valid key."""


@dataclass
class MuonConfig:
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)  # Keller Jordan / Moonlight
    # moonlight: update × 0.2·sqrt(max(m, n)) so its RMS matches AdamW's (docs/paper.md §3.2);
    # jordan: update × sqrt(max(1, m/n)) as in Keller Jordan's Muon.
    update_scale: Literal["moonlight", "jordan"] = "moonlight"
    eps: float = 1e-7
    # Newton–Schulz precision: bf16 as Keller Jordan / Moonlight; float32 or float64 for reference runs (bf16 rounding
    # makes runs that differ only in fp32 summation order, e.g. 1 vs 2 ranks, drift apart by ~1e-4 in loss).
    ns_dtype: Literal["bfloat16", "float32", "float64"] = "bfloat16"
    # Under FSDP2, each matrix's Newton–Schulz runs on one owner rank and the rows go back by all-to-all
    # (optim/muon_dist.py) instead of every rank gathering and orthogonalizing every matrix; the same numbers
    # (tests/test_optim_dist.py).
    distributed: bool = True


@dataclass
class OptimConfig:
    name: Literal["adamw", "muon"] = "adamw"
    lr: float = 4e-3  # peak lr; the schedule scales it
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    # Which scale vectors decay (docs/paper.md §1.7, Fig. 3): all | iwd (Input-Norm yes, Output-Norm no) | none |
    # no_input | no_output (= iwd). Every other parameter decays by `weight_decay`.
    scale_weight_decay: WeightDecayMode = "all"
    # Under OR/ER a decayed vector decays its scalar β; set true to decay α as well (docs/paper.md §1.7 leaves it open).
    # Note: under OR, β → 0 pulls γ = β·Norm(α) toward 0 like direct decay; under ER, β → 0 pulls the scale e^β
    # toward 1, so ER's "decay" is a pull toward γ = 1, not toward 0.
    scale_wd_alpha: bool = False
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables
    muon: MuonConfig = field(default_factory=MuonConfig)


@dataclass
class ScheduleConfig:
    name: Literal["cosine", "wsd"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.05  # cosine ends at lr × min_lr_ratio (1/20, docs/paper.md §3.1)
    decay_frac: float = 0.2  # wsd: the last 20 % of steps decay (docs/paper.md §3.3)
    decay_shape: Literal["linear", "cosine", "sqrt"] = "linear"  # wsd decay shape, to 0


@dataclass
class TrainConfig:
    steps: int = 1000
    global_batch: int = 32  # sequences per optimizer step, across all ranks and accumulation
    micro_batch: int = 8  # sequences per forward per rank
    eval_every: int = 200
    eval_tokens: int = 262144  # tokens of each validation stream per evaluation
    ckpt_every: int = 1000
    keep_ckpts: int = 2
    seed: int = 0
    # Chosen from the hardware (runtime/precision.py). compile auto: on CUDA, and on CPU in bf16 (where it pays).
    # dtype auto: bf16 mixed precision on CUDA and on a CPU with bf16 arithmetic (AMX, AVX512-BF16), else fp32;
    # float64 runs everything in double (reference tests).
    compile: Literal["auto", True, False] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float64"] = "auto"
    # A step whose loss or gradient norm is NaN/inf: stop (before any checkpoint sees that state) | skip (no update on
    # any rank, optimizer state untouched, counted as `skipped_steps` in metrics.jsonl; the run still stops after
    # max_consecutive_skips of them in a row: a diverged run does not skip its way to the end)
    on_nonfinite: Literal["stop", "skip"] = "stop"
    max_consecutive_skips: int = 5
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # On CPU, keep freed activations in glibc's heap instead of unmapping them every step (runtime/cpu.py): the
    # same numbers, fewer page faults. Off: the allocator's defaults.
    cpu_malloc_tuning: bool = True
    # Recompute block activations in backward instead of keeping them (runtime/parallel.py): none | full (every
    # block, ≈ one more forward) | selective (keep matmul and attention outputs, recompute the rest). Same numbers.
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    # FSDP2, per block: auto (every block but the last frees its gathered parameters after forward) | true | false
    # (keep them gathered until backward: fewer all-gathers, more memory). Same numbers.
    reshard_after_forward: Literal["auto", True, False] = "auto"
    fsdp_prefetch: int = 0  # blocks whose all-gathers a block issues explicitly ahead; 0: FSDP2's implicit prefetch
    # The fused LM head + loss (model/loss.py) runs over chunks of this many tokens, so the (tokens, vocab) fp32
    # logits of a whole micro-batch never exist at once; 0 = the plain path (full logits, then cross-entropy).
    # None (auto): by device — 1024 on CPU; on CUDA the fewest equal chunks within a 4 GiB budget for a chunk's fp32
    # logits and their gradient (a 0.12B micro-batch at V = 50,304: 4 × 8192): model/loss.py, default_chunk_tokens.
    loss_chunk_tokens: Optional[int] = None
    # Under gradient accumulation, FSDP2 reduce-scatters the gradients once per optimizer step (step: every micro-batch
    # but the last accumulates unsharded gradients locally) or after every micro-batch (micro_batch: less memory).
    grad_reduce: Literal["step", "micro_batch"] = "step"
    # The loader gathers the next micro-batch in a background thread into pinned host memory while the current one
    # trains: auto (on with CUDA, off on CPU, where the thread competes with the step for the cores) | true | false.
    loader_prefetch: Literal["auto", True, False] = "auto"


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
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def invariants(self) -> list[tuple[str, str]]:
        bad = [(f"model.{k}", p) for k, p in self.model.invariants()]
        bad += [(f"data.{k}", p) for k, p in self.data.invariants()]
        t = self.train
        for key in ("steps", "global_batch", "micro_batch", "eval_every", "eval_tokens", "ckpt_every", "keep_ckpts",
                    "max_consecutive_skips"):
            if getattr(t, key) <= 0:
                bad.append((f"train.{key}", "must be positive"))
        if not 0 <= t.seed < 2**32:  # numpy's seeding range (the data order and init draw from it)
            bad.append(("train.seed", f"{t.seed} must lie in [0, 2**32)"))
        if t.loss_chunk_tokens is not None and t.loss_chunk_tokens < 0:
            bad.append(("train.loss_chunk_tokens", "must be ≥ 0 (0 = the plain, unfused LM head + loss; null = by "
                                                   "device)"))
        if not (t.loader_prefetch == "auto" or isinstance(t.loader_prefetch, bool)):
            bad.append(("train.loader_prefetch", f"{t.loader_prefetch!r} must be auto, true or false"))
        if not (t.compile == "auto" or isinstance(t.compile, bool)):
            bad.append(("train.compile", f"{t.compile!r} must be auto, true or false"))
        if not (t.reshard_after_forward == "auto" or isinstance(t.reshard_after_forward, bool)):
            bad.append(("train.reshard_after_forward", f"{t.reshard_after_forward!r} must be auto, true or false"))
        if t.fsdp_prefetch < 0:
            bad.append(("train.fsdp_prefetch", f"{t.fsdp_prefetch} must be ≥ 0 (0: FSDP2's implicit prefetch)"))
        if t.micro_batch > 0 and t.global_batch % t.micro_batch:
            bad.append(("train.global_batch", f"{t.global_batch} is not a multiple of micro_batch={t.micro_batch}"))
        o, s = self.optim, self.schedule
        if not (math.isfinite(o.lr) and o.lr > 0):
            bad.append(("optim.lr", f"{o.lr} must be a positive finite number"))
        if o.weight_decay < 0:
            bad.append(("optim.weight_decay", f"{o.weight_decay} must be ≥ 0"))
        if o.grad_clip < 0:
            bad.append(("optim.grad_clip", f"{o.grad_clip} must be ≥ 0 (0 disables clipping)"))
        if o.eps <= 0:
            bad.append(("optim.eps", f"{o.eps} must be positive"))
        if o.muon.eps <= 0:
            bad.append(("optim.muon.eps", f"{o.muon.eps} must be positive"))
        if not all(0 <= b < 1 for b in o.betas):
            bad.append(("optim.betas", f"{o.betas} must lie in [0, 1)"))
        if not 0 <= o.muon.momentum < 1:
            bad.append(("optim.muon.momentum", f"{o.muon.momentum} must lie in [0, 1)"))
        if not 0 < o.muon.ns_steps < 100:
            bad.append(("optim.muon.ns_steps", f"{o.muon.ns_steps} must lie in [1, 99]"))
        if self.log.every <= 0:
            bad.append(("log.every", f"{self.log.every} must be positive"))
        names = [Path(p).name for p in self.data.val_sets]
        if "val" in names or len(set(names)) != len(names):
            bad.append(("data.val_sets", f"folder names {names} must be unique and not 'val' (they name the "
                                         "val_loss/<name> metrics)"))
        if not 0 <= s.warmup_steps < t.steps:
            bad.append(("schedule.warmup_steps", f"{s.warmup_steps} must lie in [0, train.steps={t.steps})"))
        if not 0 <= s.min_lr_ratio <= 1:
            bad.append(("schedule.min_lr_ratio", "must lie in [0, 1]"))
        if not 0 < s.decay_frac <= 1:
            bad.append(("schedule.decay_frac", "must lie in (0, 1]"))
        return bad

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
    if cfg.model.vocab_size is not None:
        if n_vocab is not None and cfg.model.vocab_size < n_vocab:
            raise ConfigError(f"model.vocab_size: {cfg.model.vocab_size} is smaller than the tokenizer's {n_vocab} "
                              f"tokens ({cfg.data.tokenizer!r}); set it to null to derive it")
        return cfg.model
    trained = re.fullmatch(r"bpe:(\d+)", cfg.data.tokenizer)
    if n_vocab is None and trained:  # a trained BPE's size is in its spec: no need for the prepared data
        n_vocab = int(trained.group(1))
    if n_vocab is None:
        from data.tokenizer import load_tokenizer  # lazy: reading ranks is slow
        n_vocab = load_tokenizer(cfg.data.tokenizer, cfg.data.dir).n_vocab
    m = cfg.model.vocab_multiple
    return dataclasses.replace(cfg.model, vocab_size=-(-n_vocab // m) * m)


# Keys a resumed run may change: where and how often it logs, evaluates and checkpoints, and how it runs.
RESUMABLE_CHANGES = ("log.", "train.eval_every", "train.eval_tokens", "train.ckpt_every", "train.keep_ckpts",
                     "train.on_nonfinite", "train.max_consecutive_skips",
                     "train.compile", "train.cpu_malloc_tuning", "train.loss_chunk_tokens",
                     "train.grad_reduce", "train.loader_prefetch",
                     # the layout: the loader's position is global (data/loader.py), DCP reshards the rest
                     "train.micro_batch",
                     # a cap is checked against the prepared dir by what it keeps (data.prepare.caps_agree), and the
                     # loader refuses a dir whose tokens differ from the checkpoint's (its fingerprint)
                     "data.max_tokens",
                     "train.activation_checkpointing", "train.reshard_after_forward", "train.fsdp_prefetch",
                     "optim.muon.distributed", "data.val_sets",
                     # storage only: the checkpoint loader moves the logical FFN weights across any padding
                     "model.ffn_pad_multiple", "model.moe.pad_multiple")


def resume_conflicts(saved_yaml: str, cfg: RunConfig) -> list[str]:
    """Dotted keys whose value differs between a checkpoint's config and `cfg`, other than RESUMABLE_CHANGES:
    resuming across such a change would silently continue a different experiment. A key the checkpoint's config
    lacks (written before the key existed) counts as its default, which is what that run used."""
    defaults = _flat(RunConfig().to_dict())
    saved = {**defaults, **_flat(yaml.safe_load(saved_yaml))}
    current = _flat(cfg.to_dict())
    keys = sorted(set(saved) | set(current))
    return [f"{k}: {saved.get(k)!r} in the checkpoint, {current.get(k)!r} now" for k in keys
            if saved.get(k) != current.get(k) and not k.startswith(RESUMABLE_CHANGES)]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


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
    return cfg.model.scale, cfg.model.gemma_norms, cfg.optim.scale_weight_decay, cfg.optim.scale_wd_alpha


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
    """Read YAML (following its `base:` chain), apply `a.b.c=value` overrides, build and check a RunConfig.

    `path` may be a list of files, merged left to right (`--config dense/0.12b.yaml --config scale/hg.yaml`)."""
    paths = [] if path is None else [path] if isinstance(path, (str, Path)) else list(path)
    raw: dict = {}
    for p in paths:
        raw = _merge(raw, _read_chain(Path(p), seen=()))
    for item in overrides or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected dotted.key=value, e.g. optim.lr=3e-3")
        _set_dotted(raw, key.strip(), yaml.safe_load(text) if text.strip() else None)
    return build_config(raw)


def build_config(raw: dict) -> RunConfig:
    cfg = _build(RunConfig, raw, prefix="")
    bad = cfg.invariants()
    if bad:
        raise ConfigError("; ".join(f"{key}: {problem}" for key, problem in bad))
    return cfg


def _read_chain(path: Path, seen: tuple[Path, ...]) -> dict:
    path = path.resolve()
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder; give a YAML file (e.g. {path / 'base.yaml'})")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if path in seen:
        raise ConfigError(f"config {path}: `base:` chain loops back to itself ({' → '.join(map(str, seen))})")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {path} is not UTF-8 text ({e.reason} at byte {e.start}): is it a YAML file?") \
            from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {e}") from None
    if data is None:  # an empty file (or only comments) is a mistake, not a request for every default
        raise ConfigError(f"config {path} is empty; give a mapping of settings (see configs/base.yaml)")
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}: expected a mapping at the top level, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    bases = [base] if isinstance(base, str) else base
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"config {path}: `base` must be a path or a list of paths, relative to this file")
    merged: dict = {}
    for b in bases:  # later bases override earlier ones; this file overrides them all
        merged = _merge(merged, _read_chain(path.parent / b, seen + (path,)))
    return _merge(merged, data)


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _set_dotted(raw: dict, key: str, value: Any) -> None:
    node = raw
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


@lru_cache(maxsize=None)
def _fields_of(cls: type) -> tuple[dict[str, Any], list[str]]:
    """A config dataclass's field types and names: resolving the annotations (typing.get_type_hints) is most of a
    config load's time, and the classes do not change while the program runs (a results page loads hundreds)."""
    return typing.get_type_hints(cls), [f.name for f in dataclasses.fields(cls)]


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "config"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__} {raw!r}")
    hints, names = _fields_of(cls)
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.5)
            hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key {prefix}{key}{hint}")
        kwargs[key] = _coerce(hints[key], value, f"{prefix}{key}")
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key)
    if origin is Literal:
        if value not in args:
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}{hint}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}: {value!r}")
            return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        return origin(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        number = _as_float(value)  # `2e4` steps: PyYAML reads it as a string, or as a float with a dot
        if number is not None and number.is_integer():
            return int(number)
        raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
    if tp is float:
        number = _as_float(value)  # PyYAML reads `1e-3` (no dot) as a string
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(number):  # no setting means NaN or ±inf; one would poison the run silently
            raise ConfigError(f"{key}: {value!r} is not a finite number")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported config type {tp}")  # a programming error in a dataclass


def _as_float(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None

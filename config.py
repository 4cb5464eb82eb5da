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
from optim.config import MuonConfig, OptimConfig, ScheduleConfig, WeightDecayMode  # noqa: F401 - composed here
from runtime.config import (RESUMABLE, ConfigError, LogConfig, TrainConfig, WandbConfig,  # noqa: F401
                            flat as _flat, resume_conflicts)

# libyaml's parser when PyYAML has it (10× faster; the same safe constructor and resolver, so the same values)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig, metadata=RESUMABLE)  # where and how often a run logs

    def invariants(self) -> list[tuple[str, str]]:
        """Each section's own invariants under its prefix, then the ones that span sections."""
        bad = [(f"{name}.{k}", p) for name in ("model", "data", "train", "optim", "log")
               for k, p in getattr(self, name).invariants()]
        names = [Path(p).name for p in self.data.val_sets]
        if "val" in names or len(set(names)) != len(names):
            bad.append(("data.val_sets", f"folder names {names} must be unique and not 'val' (they name the "
                                         "val_loss/<name> metrics)"))
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

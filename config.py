"""The run configuration, composed: each package's section (model/config.py, data/config.py, optim/config.py,
runtime/config.py) in one RunConfig, loaded by the strict config loader's strict loader (strictconfig/config.py: YAML with `base:`
chains, dotted overrides such as `optim.lr=3e-3`, ConfigError), with what spans sections: their joint invariants, the
vocabulary from the tokenizer, run names, strategy names and wandb tags.

Strictness is the point: an unknown key names the closest valid key, a wrong type names the expected one, and a
violated invariant names the dotted key — one `ConfigError`, never a traceback from deep inside torch.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import yaml

from data.config import DataConfig
from strictconfig.config import ConfigError, build, fill_absent, read_files, resumable
from model.config import ModelConfig
from optim.config import OptimConfig, ScheduleConfig
from runtime.config import LogConfig, TrainConfig


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

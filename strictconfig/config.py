"""The strict config loader: what every package's config section is built on, and nothing of ours below it.

- `ConfigError`: a bad config, naming the dotted key, the problem and, for typos, the closest valid key.
- `resumable(...)`: a field a resumed run may change (how often it logs or checkpoints, how it runs: the numbers of
  the experiment stay the same). On a dataclass-typed field it covers the whole section. `resume_conflicts` refuses
  every other change.
- `since(...)`: a field added after runs were saved, whose default changed what a run does; a saved config (a run's
  config.yaml, a checkpoint's) that lacks it reads as the value those runs used (`fill_absent`, `resume_conflicts`).
- The strict loader: YAML files with `base:` chains, `a.b.c=value` overrides, and `build`, which makes a config
  dataclass from plain data and checks every value against its field's type (a Union tries its members in order;
  a Literal matches by value and type, so `1` is not `true`).

The root `config.py` composes the sections (model/config.py, data/config.py, optim/config.py, and its own train and
log) into a RunConfig with these.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

import yaml

# libyaml's parser when PyYAML has it (10× faster; the same safe constructor and resolver, so the same values)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKey(Exception):
    """A mapping that gives one key twice: YAML would keep the last silently (a second `train:` section replacing
    the first)."""

    def __init__(self, key: Any, first: int, second: int):
        where = f"lines {first} and {second}" if first != second else f"line {first}"
        super().__init__(f"key {key!r} is given twice in one mapping, at {where}; keep one")
        self.key, self.first, self.second = key, first, second


class _StrictLoader(_YAML_LOADER):
    """The safe loader, refusing a key given twice in one mapping at any depth."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges another mapping: not a key
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise DuplicateKey(key, seen[key], key_node.start_mark.line + 1)
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:  # an unhashable key: the safe constructor says so itself
                    continue
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """Plain data from YAML text, a repeated key refused (DuplicateKey)."""
    return yaml.load(text, Loader=_StrictLoader)

# metadata of a field a resumed run may change
RESUMABLE = {"resumable": True}


class ConfigError(ValueError):
    """A bad config: names the dotted key, the problem and, for typos, the closest valid key."""


def resumable(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that a resumed run may change (`resume_conflicts` lets it differ)."""
    return field(default=default, default_factory=default_factory, metadata=RESUMABLE)


def since(default: Any, *, before: Any) -> Any:
    """A dataclass field new configs get as `default`, and a saved config without it as `before`: what runs saved
    before the field existed did."""
    return field(default=default, metadata={"absent": before})


# ----------------------------------------------------------------------------------------------------- loading

def read_files(paths: list[str | Path], overrides: Optional[list[str]] = None) -> dict:
    """Plain data from YAML files (each following its `base:` chain), merged left to right, then `a.b.c=value`
    overrides applied."""
    raw: dict = {}
    for p in paths:
        raw = _merge(raw, _read_chain(Path(p), seen=()))
    for item in overrides or []:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected dotted.key=value, e.g. optim.lr=3e-3")
        try:
            value = load_yaml(text) if text.strip() else None
        except DuplicateKey as e:
            raise ConfigError(f"override {item!r}: {e}") from None
        _set_dotted(raw, key.strip(), value)
    return raw


def build(cls: type, raw: Any, prefix: str = "") -> Any:
    """A `cls` config dataclass from plain data, every value checked against its field's type."""
    return _build(cls, raw, prefix)


def _read_chain(path: Path, seen: tuple[Path, ...]) -> dict:
    path = path.resolve()
    if path.is_dir():
        raise ConfigError(f"config {path} is a folder; give a YAML file (e.g. {path / 'base.yaml'})")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if path in seen:
        raise ConfigError(f"config {path}: `base:` chain loops back to itself ({' → '.join(map(str, seen))})")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except DuplicateKey as e:
        raise ConfigError(f"config {path}: {e}") from None
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
        errors = []
        for member in inner:  # in order: the first member the value fits
            try:
                return _coerce(member, value, key)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{key}: {value!r} fits none of {' | '.join(_type_name(a) for a in inner)}")
    if origin is Literal:
        # by value and type: `1 == True` in Python, but a setting of 1 is not the setting true
        for choice in args:
            if value == choice and type(value) is type(choice):
                return choice
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{key}: {value!r} is not one of {list(args)}{hint}")
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


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp)


# ----------------------------------------------------------------------------------------------------- resume

def resumable_keys(cls: type, prefix: str = "") -> tuple[str, ...]:
    """The dotted keys of `cls`'s fields marked RESUMABLE, in its nested config sections too; a marked section is
    given as its prefix ("log.")."""
    hints = typing.get_type_hints(cls)  # the annotations are strings (from __future__ import annotations)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        section = _section(hints[f.name])
        if f.metadata.get("resumable"):
            out.append(f"{prefix}{f.name}." if section is not None else f"{prefix}{f.name}")
        elif section is not None:
            out.extend(resumable_keys(section, f"{prefix}{f.name}."))
    return tuple(out)


def absent_values(cls: type, prefix: str = "") -> dict[str, Any]:
    """{dotted key: the value a saved config without it meant} for every `since` field of `cls`, nested sections
    included."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if "absent" in f.metadata:
            out[f"{prefix}{f.name}"] = f.metadata["absent"]
        section = _section(hints[f.name])
        if section is not None:
            out.update(absent_values(section, f"{prefix}{f.name}."))
    return out


def fill_absent(cls: type, saved: dict) -> dict:
    """A saved config's plain data with each `since` field it lacks set to the value it meant; a field whose section
    the config lacks (model.moe null) stays absent."""
    out = yaml.safe_load(yaml.safe_dump(saved))  # a deep copy of plain data
    for key, value in absent_values(cls).items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.setdefault(leaf, value)
    return out


def _section(tp: Any) -> Optional[type]:
    """The config dataclass a field holds (Optional[X] → X), or None for a plain value."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return next((a for a in args if dataclasses.is_dataclass(a)), None)


def resume_conflicts(saved_yaml: str, cfg: Any) -> list[str]:
    """Dotted keys whose value differs between a checkpoint's config and `cfg` (a run config dataclass), other than
    the RESUMABLE fields: resuming across such a change would silently continue a different experiment. A key the
    checkpoint's config lacks (written before the key existed) counts as its default, or as its `since` value: what
    that run used."""
    resumable = resumable_keys(type(cfg))
    defaults = flat(type(cfg)().to_dict())
    saved = {**defaults, **flat(fill_absent(type(cfg), yaml.safe_load(saved_yaml)))}
    current = flat(cfg.to_dict())
    keys = sorted(set(saved) | set(current))
    sections = tuple(r for r in resumable if r.endswith("."))
    return [f"{k}: {saved.get(k)!r} in the checkpoint, {current.get(k)!r} now" for k in keys
            if saved.get(k) != current.get(k) and k not in resumable and not k.startswith(sections)]


def flat(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} → {"a.b": 1}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out

"""Config fuzz: hundreds of mutated copies of the shipped configs, each either refused with one ConfigError that names
the dotted key at fault, or accepted because the mutation is valid — never a traceback from yaml, torch or the data
code. The mutations: unknown keys at every depth (typos among them), wrong types, out-of-range and non-finite
numbers, lists where maps belong, bad enum values, inconsistent batch and head sizes, and empty or broken files."""
from __future__ import annotations

import dataclasses
import random
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import yaml

import train
from config import RunConfig, load_config
from strictconfig.config import ConfigError

CONFIGS = sorted(p for p in Path("configs").rglob("*.yaml"))
N_RANDOM = 160  # random mutations on top of the exhaustive ones below


@dataclass(frozen=True)
class Mutation:
    what: str
    text: str  # the YAML file's content
    key: Optional[str]  # the dotted key the error must name; None: the mutation is valid and must load
    valid: Optional[tuple[str, Any]] = None  # a valid mutation's (dotted key, value), read back after loading


def leaf_types(cls: type = RunConfig, prefix: str = "") -> dict[str, Any]:
    """Every dotted leaf key of the config and its declared type (sections recursed into, MoE's included)."""
    out = {}
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        target = inner[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) else tp
        if dataclasses.is_dataclass(target):
            out.update(leaf_types(target, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = tp
    return out


LEAVES = leaf_types()
SECTIONS = sorted({k.rsplit(".", 1)[0] for k in LEAVES if "." in k})


def resolved(path: Path) -> dict:
    return load_config(path).to_dict()


def put(raw: dict, key: str, value: Any) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(raw))  # a deep copy
    node = raw
    for part in key.split(".")[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[key.split(".")[-1]] = value
    return raw


def dump(raw: dict) -> str:
    return yaml.safe_dump(raw, sort_keys=False)


def wrong_values(tp: Any) -> list[Any]:
    """Values of the wrong type for a field of type `tp` (None only where the field is not Optional)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    optional = type(None) in args
    if optional:
        tp = [a for a in args if a is not type(None)][0]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    out = [] if optional else [None]
    if origin is Literal:
        return out + ["not-a-" + str(args[0]), [args[0]], {"x": args[0]}]
    if origin in (list, tuple):
        return out + ["a string", {"x": 1}, 3]
    if tp is bool:
        return out + ["yes", 1, [True]]
    if tp is int:
        return out + ["twelve", 2.5, [1], {"x": 1}, True]
    if tp is float:
        return out + ["fast", [0.1], {"x": 1.0}, False]
    if tp is str:
        return out + [12, [1], {"x": "y"}]
    raise AssertionError(f"no wrong values for {tp}")


# Values outside each numeric field's valid range (the invariants of config.py, model/config.py, data/config.py).
OUT_OF_RANGE = {
    "model.d_model": [0, -768], "model.n_layers": [0, -1], "model.n_heads": [0, -2], "model.vocab_multiple": [0],
    "model.d_ffn": [0, -8], "model.vocab_size": [0, -5], "model.norm_eps": [0.0, -1e-5], "model.init_std": [0.0],
    "model.rope_theta": [0.0, -1.0], "model.n_kv_heads": [0, -1], "model.ffn_pad_multiple": [0, -64],
    "model.moe.n_experts": [0, -32], "model.moe.top_k": [0, 64], "model.moe.n_shared": [-1, 2],
    "model.moe.expert_ffn": [0, -8], "model.moe.shared_ffn": [0, -8], "model.moe.aux_coef": [-0.01],
    "model.moe.bias_rate": [-1e-3], "model.moe.z_coef": [-1e-3], "model.moe.pad_multiple": [0, -8],
    "optim.lr": [0.0, -3e-3], "optim.eps": [0.0, -1e-8], "optim.weight_decay": [-0.1], "optim.grad_clip": [-1.0],
    "optim.betas": [[1.0, 0.95], [0.9, -0.1], [-0.5, 0.9]], "optim.muon.momentum": [1.0, -0.1],
    "optim.muon.ns_steps": [0, -5], "optim.muon.eps": [0.0, -1e-7],
    "schedule.warmup_steps": [-1], "schedule.min_lr_ratio": [-0.1, 1.5], "schedule.decay_frac": [0.0, 1.5],
    "data.seq_len": [0, -1024], "data.val_frac": [0.0, 0.5, 1.2], "data.max_tokens": [0, -1],
    "data.tokenizer": ["bpe:12", "bpe:x", ""], "data.source": ["", "  "], "data.dir": [""],
    "train.steps": [0, -1], "train.global_batch": [0, -32], "train.micro_batch": [0, -8], "train.eval_every": [0],
    "train.eval_tokens": [0, -1], "train.extra_eval_tokens": [0, -1], "train.ckpt_every": [0], "train.keep_ckpts": [0],
    "train.loss_chunk_tokens": [-1],
    "train.fsdp_prefetch": [-1], "train.max_consecutive_skips": [0, -3], "train.seed": [-1, 2**32],
    "log.every": [0, -10], "log.headroom_warn": [-1.0, float("inf"), float("nan")],
}
# Numeric fields whose every finite value is valid (non-finite ones are refused for every float field below).
UNBOUNDED = {"optim.muon.ns_coefficients"}
NON_FINITE = [float("nan"), float("inf"), float("-inf")]


def moe_base() -> dict:
    return resolved(Path("configs/moe/0.25b.yaml"))


def exhaustive() -> list[Mutation]:
    dense = resolved(Path("configs/dense/0.12b.yaml"))
    out = []
    for key, values in OUT_OF_RANGE.items():
        base = moe_base() if key.startswith("model.moe.") else dense
        for v in values:
            out.append(Mutation(f"{key}={v!r}", dump(put(base, key, v)), key))
    for key, tp in LEAVES.items():  # every float field refuses NaN and ±inf
        base = moe_base() if key.startswith("model.moe.") else dense
        if tp is float or float in typing.get_args(tp):
            for v in NON_FINITE:
                out.append(Mutation(f"{key}={v}", dump(put(base, key, v)), key))
    for section in SECTIONS:  # a list where a map belongs
        base = moe_base() if section.startswith("model.moe") else dense
        out.append(Mutation(f"{section}: a list", dump(put(base, section, [1, 2])), section))
    out += [
        Mutation("empty file", "", "config"),
        Mutation("only a comment", "# nothing here\n", "config"),
        Mutation("broken YAML", "model: {d_model: 768\ntrain: [", "config"),
        Mutation("a list at the top", "- model\n- train\n", "config"),
        Mutation("tabs", "model:\n\td_model: 768\n", "config"),
        Mutation("not UTF-8", "model: {d_model: 768}  # caf\udce9\n", "config"),
        Mutation("batch not a multiple of micro_batch", dump(put(put(dense, "train.global_batch", 30),
                                                               "train.micro_batch", 8)), "train.global_batch"),
        Mutation("heads do not divide d_model", dump(put(dense, "model.n_heads", 7)), "model.d_model"),
        Mutation("odd head_dim", dump(put(put(dense, "model.d_model", 120), "model.n_heads", 8)), "model.n_heads"),
        Mutation("kv heads do not divide heads", dump(put(dense, "model.n_kv_heads", 5)), "model.n_kv_heads"),
        Mutation("router vectors on a dense model", dump(put(put(dense, "model.scale.router", True),
                                                           "model.scale.placement", "dp")), "model.scale.router"),
        Mutation("lm_head vectors without vectors", dump(put(put(dense, "model.scale.lm_head", True),
                                                           "model.scale.placement", "none")), "model.scale.lm_head"),
        Mutation("gemma norms under DNP", dump(put(put(dense, "model.gemma_norms", True),
                                                 "model.scale.placement", "dnp")), "model.gemma_norms"),
    ]
    return out


def typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(len(word))
    return word[:i] + rng.choice("xqz") + word[i + 1:] if rng.random() < 0.5 else word + "s"


def random_mutations(n: int, seed: int = 0) -> list[Mutation]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        path = rng.choice(CONFIGS)
        raw = resolved(path)
        kind = rng.choice(["unknown", "typo", "type", "enum", "valid"])
        keys = [k for k in LEAVES if not k.startswith("model.moe.") or raw["model"]["moe"] is not None]
        if kind == "unknown":
            section = rng.choice(["", *(s for s in SECTIONS if not s.startswith("model.moe")
                                       or raw["model"]["moe"] is not None)])
            key = f"{section}.zz_{rng.randrange(1000)}".lstrip(".")
            out.append(Mutation(f"{path}: unknown {key}", dump(put(raw, key, 1)), key))
        elif kind == "typo":
            key = rng.choice(keys)
            parts = key.split(".")
            bad = ".".join([*parts[:-1], typo(parts[-1], rng)])
            if bad in LEAVES or bad in SECTIONS:  # the typo made another valid key
                continue
            out.append(Mutation(f"{path}: {bad} (typo)", dump(put(raw, bad, 1)), bad))
        elif kind == "type":
            key = rng.choice(keys)
            value = rng.choice(wrong_values(LEAVES[key]))
            out.append(Mutation(f"{path}: {key}={value!r}", dump(put(raw, key, value)), key))
        elif kind == "enum":
            enums = [k for k in keys if typing.get_origin(LEAVES[k]) is Literal]
            key = rng.choice(enums)
            good = [a for a in typing.get_args(LEAVES[key]) if isinstance(a, str)]
            value = typo(rng.choice(good), rng)
            if value in good:
                continue
            out.append(Mutation(f"{path}: {key}={value!r}", dump(put(raw, key, value)), key))
        else:  # a valid change of a key without cross-field rules
            key, value = rng.choice([("train.steps", rng.randrange(1, 10**6)), ("train.seed", rng.randrange(10**4)),
                                     ("train.eval_every", rng.randrange(1, 500)), ("log.every", rng.randrange(1, 50)),
                                     ("optim.lr", 10 ** rng.uniform(-5, -1)), ("train.dtype", "bfloat16"),
                                     ("train.on_nonfinite", "skip"), ("schedule.name", "wsd"),
                                     ("train.keep_ckpts", rng.randrange(1, 9)), ("log.wandb.mode", "disabled"),
                                     ("optim.scale_weight_decay", rng.choice(["all", "iwd", "none"]))])
            out.append(Mutation(f"{path}: {key}={value!r} (valid)", dump(put(raw, key, value)), None, (key, value)))
    return out


def check(m: Mutation, tmp_path: Path) -> Optional[str]:
    """None when the mutation was handled as it must be, else what went wrong."""
    path = tmp_path / "mutated.yaml"
    path.write_bytes(m.text.encode("utf-8", "surrogateescape"))  # "not UTF-8": a Latin-1 byte
    try:
        cfg = load_config(path)
    except ConfigError as e:
        if m.key is None:
            return f"{m.what}: a valid change was refused: {e}"
        if m.key == "config":
            return None if str(path.resolve()) in str(e) or str(path) in str(e) else f"{m.what}: {e} names no file"
        return None if m.key in str(e) else f"{m.what}: the error does not name {m.key}: {e}"
    except Exception as e:  # noqa: BLE001 - any other exception is the bug this test exists to find
        return f"{m.what}: {type(e).__name__}: {e}"
    if m.key is not None:
        return f"{m.what}: accepted, but {m.key} is invalid"
    key, value = m.valid
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return None if node == value else f"{m.what}: loaded as {node!r}"


def test_fuzzed_configs_give_one_config_error_naming_the_key(tmp_path, capsys):
    mutations = exhaustive() + random_mutations(N_RANDOM)
    assert len(mutations) >= 200
    problems = [p for p in (check(m, tmp_path) for m in mutations) if p]
    with capsys.disabled():
        print(f"\nconfig fuzz: {len(mutations)} mutations, {sum(m.key is None for m in mutations)} valid, "
              f"{len(problems)} mishandled")
    assert not problems, "\n".join(problems[:30])


def test_every_numeric_field_has_out_of_range_values():
    """A numeric config field added without an entry in OUT_OF_RANGE (or UNBOUNDED) fails here: its range is then
    checked by nothing, as train.seed's was not (a negative seed reached numpy as a traceback)."""
    def numeric(tp: Any) -> bool:
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        return any(a in (int, float) for a in args)
    missing = sorted(k for k, tp in LEAVES.items() if numeric(tp) and k not in OUT_OF_RANGE and k not in UNBOUNDED)
    assert not missing, f"numeric fields without out-of-range values in the fuzz: {missing}"
    assert not (set(OUT_OF_RANGE) | UNBOUNDED) - set(LEAVES), "fuzz entries for keys the config no longer has"


@pytest.mark.parametrize("argv", [["--print-config"], ["--dry-run"]])
def test_a_fuzzed_config_on_the_command_line_is_one_message(tmp_path, capsys, argv):
    """train.py itself: a bad config file or override prints one ConfigError, no traceback, nothing written."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {d_model: 768, n_heads: 7}\n")
    with pytest.raises(ConfigError, match="model.d_model"):
        train.main([*argv, "--config", str(bad)])
    with pytest.raises(ConfigError, match="train.steps"):
        train.main([*argv, "--config", "configs/tiny_cpu.yaml", "train.steps=nan"])
    assert not any(tmp_path.glob("runs*"))

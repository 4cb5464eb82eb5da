"""The strict config loader: typos, types, YAML floats, inheritance, overrides, invariants, documented defaults."""
import dataclasses
from pathlib import Path

import pytest
import yaml

from config import RunConfig, build_config, load_config

from strictconfig.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_unknown_key_names_closest():
    with pytest.raises(ConfigError, match=r"unknown config key optim\.lrr; did you mean optim\.lr\?"):
        load_config(overrides=["optim.lrr=3e-3"])


def test_unknown_nested_key_in_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  scale:\n    placment: dnp\n")
    with pytest.raises(ConfigError, match=r"model\.scale\.placment; did you mean model\.scale\.placement"):
        load_config(path)


@pytest.mark.parametrize("override, key", [
    ("optim.lr=fast", "optim.lr"), ("train.steps=1.5", "train.steps"), ("train.compile=yes please", "train.compile"),
    ("model.scale.placement=dnpp", "model.scale.placement"), ("optim.betas=[0.9]", "optim.betas"),
    ("model=3", "model"),
])
def test_wrong_type_names_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert str(err.value).startswith(key)


def test_yaml_scientific_notation_is_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1e-3\ntrain:\n  steps: 2e4\n")
    assert yaml.safe_load(path.read_text())["optim"]["lr"] == "1e-3"  # the PyYAML quirk being fixed
    cfg = load_config(path)
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float) and cfg.train.steps == 20000


def test_base_chain_and_overrides(tmp_path):
    (tmp_path / "a.yaml").write_text("optim: {lr: 1.0e-3, weight_decay: 0.2}\nmodel: {d_model: 64, n_heads: 4}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\noptim: {lr: 2.0e-3}\n")
    cfg = load_config(tmp_path / "b.yaml", ["model.n_layers=3", "optim.betas=[0.8, 0.9]"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.model.d_model, cfg.model.n_layers) == (2e-3, 0.2, 64, 3)
    assert cfg.optim.betas == (0.8, 0.9)


def test_base_loop_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="loops"):
        load_config(tmp_path / "a.yaml")


@pytest.mark.parametrize("override, key", [
    ("model.d_model=100", "model.d_model"), ("model.n_kv_heads=5", "model.n_kv_heads"),
    ("train.micro_batch=5", "train.global_batch"), ("schedule.warmup_steps=5000", "schedule.warmup_steps"),
    ("model.gemma_norms=true", "model.gemma_norms"),
])
def test_invariants(override, key):
    extra = ["model.scale.placement=dnp"] if key == "model.gemma_norms" else []
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=[override] + extra)


def test_a_key_given_twice_is_refused_at_any_depth_naming_both_lines(tmp_path):
    """YAML keeps the last of two equal keys: a second `train:` section would silently replace the first."""
    base = tmp_path / "base.yaml"
    base.write_text("train:\n  steps: 7\n  global_batch: 8\noptim: {lr: 1.0e-3}\ntrain:\n  eval_every: 2\n")
    with pytest.raises(ConfigError, match=r"base\.yaml: key 'train' is given twice in one mapping, at lines 1 and 5"):
        load_config(base)
    child = tmp_path / "child.yaml"
    base.write_text("model:\n  scale:\n    placement: dnp\n    reparam: or\n    placement: dp\n")
    child.write_text("base: base.yaml\n")
    with pytest.raises(ConfigError, match=r"base\.yaml: key 'placement' .* at lines 3 and 5"):
        load_config(child)  # found through the base chain, the file named
    base.write_text("data:\n  val_sets: [a, b]\ntrain: {steps: 7, steps: 8}\n")
    with pytest.raises(ConfigError, match=r"key 'steps' is given twice in one mapping, at line 3"):
        load_config(base)
    with pytest.raises(ConfigError, match=r"override 'model\.scale=\{placement: dnp, placement: dp\}': key 'placement'"):
        load_config(overrides=["model.scale={placement: dnp, placement: dp}"])
    base.write_text("train: {steps: 7}\noptim: {lr: 1.0e-3}\n")  # the same key in two mappings is fine
    assert load_config(base, ["train.steps=9"]).train.steps == 9  # and an override is not a repeat


@pytest.mark.parametrize("override, message", [
    ("optim.lr=1e308", r"optim\.lr: 1e\+308 must lie in \(0, 1\]"), ("optim.lr=3", r"optim\.lr: 3.0 must lie in"),
    ("optim.lr=0", r"optim\.lr: 0.0 must lie in"),
    ("train.steps=1e20", r"train\.steps: 100000000000000000000 must lie in \[1, 1e12\]"),
    ("train.eval_tokens=1e13", r"train\.eval_tokens: .* must lie in \[1, 1e12\]"),
    ("optim.weight_decay=inf", r"optim\.weight_decay"),
])
def test_a_number_outside_its_fields_range_is_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/tiny_cpu.yaml", [override])


@pytest.mark.parametrize("name", [".", "..", "../..", "/abs/run", "a/b", "~run", ""])
def test_a_run_name_is_one_folder_inside_the_out_dir(name):
    with pytest.raises(ConfigError, match=r"log\.run_name: .* must be one folder name inside log\.out_dir"):
        load_config("configs/tiny_cpu.yaml", [f"log.run_name={name!r}"])


def test_a_tilde_in_the_out_dir_is_the_home_folder():
    assert load_config("configs/tiny_cpu.yaml", ["log.out_dir=~/runs"]).log.out_dir == str(Path.home() / "runs")


def test_missing_file_is_clear():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("configs/nope.yaml")


def fields_of(cls, prefix=""):
    for f in dataclasses.fields(cls):
        typ = cls.__dataclass_fields__[f.name].default_factory if f.default_factory is not dataclasses.MISSING else None
        sub = typ() if typ is not None and dataclasses.is_dataclass(typ()) else None
        if sub is not None:
            yield from fields_of(type(sub), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def test_base_yaml_documents_every_field_with_its_default():
    raw = yaml.safe_load((ROOT / "configs/base.yaml").read_text())

    def has(key):
        node = raw
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    missing = [k for k in fields_of(RunConfig) if not has(k)]
    assert not missing, f"configs/base.yaml does not document {missing}"
    assert load_config(ROOT / "configs/base.yaml") == RunConfig()


def test_every_shipped_config_loads():
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        load_config(path)


def test_resolved_yaml_round_trips():
    cfg = load_config(ROOT / "configs/dense_0.12b_unified.yaml")
    assert build_config(yaml.safe_load(cfg.to_yaml())) == cfg


def test_resume_treats_keys_added_later_as_their_defaults():
    """A run saved before a key existed (here model.scale.router and model.moe) resumes under the new code; a real
    difference is still a conflict."""
    from strictconfig.config import resume_conflicts
    cfg = load_config(ROOT / "configs/tiny_cpu.yaml")
    saved = yaml.safe_load(cfg.to_yaml())
    del saved["model"]["scale"]["router"], saved["model"]["moe"]
    assert resume_conflicts(yaml.safe_dump(saved), cfg) == []
    moe = load_config(ROOT / "configs/tiny_moe.yaml")
    assert any(c.startswith("model.moe.n_experts: None in the checkpoint, 16 now")
               for c in resume_conflicts(yaml.safe_dump(saved), moe))



def test_which_keys_a_resume_may_change_is_stated_on_the_fields():
    """Each section marks its own resumable fields (metadata RESUMABLE); a marked section (log) covers every key in
    it. A marked key may change on resume, an unmarked one is a conflict, in every section."""
    from dataclasses import replace

    from config import RunConfig

    from strictconfig.config import resume_conflicts
    from strictconfig.config import resumable_keys
    keys = resumable_keys(RunConfig)
    assert "log." in keys and "train.micro_batch" in keys and "model.ffn_pad_multiple" in keys
    assert "model.moe.pad_multiple" in keys and "optim.muon.distributed" in keys and "data.max_tokens" in keys
    assert not {"train.dtype", "train.seed", "train.global_batch", "optim.lr", "data.seq_len"} & set(keys)
    cfg = load_config(ROOT / "configs/tiny_cpu.yaml")
    saved = cfg.to_yaml()
    allowed = replace(cfg, train=replace(cfg.train, micro_batch=4, eval_every=7), log=replace(
        cfg.log, every=3, wandb=replace(cfg.log.wandb, project="other")),
        model=replace(cfg.model, ffn_pad_multiple=8), data=replace(cfg.data, max_tokens=10**6))
    assert resume_conflicts(saved, allowed) == []
    refused = replace(cfg, train=replace(cfg.train, dtype="float64"), optim=replace(
        cfg.optim, muon=replace(cfg.optim.muon, ns_steps=3)), schedule=replace(cfg.schedule, warmup_steps=5))
    assert [c.split(":")[0] for c in resume_conflicts(saved, refused)] == [
        "optim.muon.ns_steps", "schedule.warmup_steps", "train.dtype"]

def test_presets_state_their_whole_strategy_over_every_base():
    """A preset layered over any shipped config resolves to the same strategy as over base.yaml: a base config's
    own scale settings (tiny_cpu's unified IWD, say) never leak into a preset."""
    from config import strategy_of
    presets = sorted((ROOT / "configs/scale").glob("*.yaml"))
    bases = [p for p in sorted((ROOT / "configs").rglob("*.yaml")) if p.parent.name not in ("scale", "figures")]
    assert len(presets) >= 12 and len(bases) >= 12
    for preset in presets:
        expected = strategy_of(load_config([ROOT / "configs/base.yaml", preset]))
        for base in bases:
            assert strategy_of(load_config([base, preset])) == expected, (base.name, preset.name)
    hg_dnp_or = load_config([ROOT / "configs/tiny_cpu.yaml", ROOT / "configs/scale/hg_dnp_or.yaml"])
    assert hg_dnp_or.optim.scale_weight_decay == "all"  # Fig. 5's HG+DNP+OR, not the unified strategy


def test_run_tags_name_what_sets_a_curve_apart():
    from config import run_tags
    cfg = load_config([ROOT / "configs/figures/fig5/hg_dp.yaml"], ["optim.lr=2e-3", "train.seed=3"])
    tags = run_tags(cfg)
    assert tags[0] == "fig5" and {"hg_dp", "optim:adamw", "schedule:cosine", "lr:0.002", "seed:3"} <= set(tags)
    assert "moe" in run_tags(load_config(ROOT / "configs/figures/fig7/0.5b_unified.yaml"))
    assert "custom" in run_tags(load_config(ROOT / "configs/tiny_cpu.yaml", ["model.scale.reparam=er"]))


def test_a_literal_matches_by_type_and_a_union_tries_each_member():
    """`1 == True` in Python, but `train.compile=1` is not the setting true; a Union's later members are reachable
    (the loader once coerced every value to a Union's first member)."""
    from dataclasses import dataclass
    from typing import Literal, Optional, Union

    from strictconfig.config import build
    with pytest.raises(ConfigError, match=r"train\.compile: 1 is not one of \['auto', True, False\]"):
        load_config(overrides=["train.compile=1"])
    assert load_config(overrides=["train.compile=true"]).train.compile is True
    assert load_config(overrides=["train.compile=auto"]).train.compile == "auto"

    @dataclass
    class Section:
        either: Union[int, str] = 0
        maybe: Optional[int] = None
        flag: Literal[0, "0"] = 0
    assert build(Section, {"either": "abc"}).either == "abc"
    assert build(Section, {"either": 7}).either == 7
    assert build(Section, {"flag": "0"}).flag == "0" and build(Section, {"flag": 0}).flag == 0
    with pytest.raises(ConfigError, match=r"either: \[1\] fits none of int \| str"):
        build(Section, {"either": [1]})
    with pytest.raises(ConfigError, match=r"maybe: expected an integer, got str 'x'"):
        build(Section, {"maybe": "x"})

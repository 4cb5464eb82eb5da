"""configs/figures: every run of every figure loads, has the paper's parameter count where the paper gives one, and
the curves of each panel differ only in what the panel varies."""
from __future__ import annotations

import pytest
import torch

from config import load_config, resolve_vocab

from strictconfig.config import flat as _flat
from model.llama import Llama
from model.summary import activated_params, num_params
from repro.figures import FIGURES, FIGURES_DIR
from test_model import PAPER_DENSE
from test_moe import PAPER_MOE


def cfg_of(fig: str, run: str):
    return load_config(FIGURES[fig].config(run))


def params(cfg) -> int:
    with torch.device("meta"):
        return num_params(Llama(resolve_vocab(cfg)))


def test_every_file_is_a_registered_run_and_back():
    on_disk = {p.relative_to(FIGURES_DIR).with_suffix("").as_posix() for p in FIGURES_DIR.rglob("*.yaml")}
    registered = {f"fig{f.number}/{run}" for f in FIGURES.values() for run in f.runs}
    assert on_disk == registered
    assert sorted(FIGURES, key=int) == ["1", "3", "5", "6", "7", "8", "9", "10"]


@pytest.mark.parametrize("fig", sorted(FIGURES, key=int))
def test_panel_curves_differ_only_in_what_the_panel_varies(fig):
    names = set()
    for panel in FIGURES[fig].panels:
        ref = _flat(cfg_of(fig, panel.curves[0]).to_dict())
        for run in panel.curves:
            cfg = cfg_of(fig, run)
            names.add(cfg.log.run_name)
            assert cfg.log.wandb.group == f"fig{fig}" and f"fig{fig}" in cfg.log.wandb.tags
            diff = {k for k, v in _flat(cfg.to_dict()).items() if ref.get(k) != v}
            allowed = panel.varies + ("log.",)
            stray = sorted(k for k in diff if not k.startswith(allowed))
            assert not stray, f"fig {fig}, panel {panel.title!r}: {run} also differs in {stray}"
            if run != panel.curves[0]:
                assert diff - {k for k in diff if k.startswith("log.")}, f"{run} equals the reference"
    assert len(names) == len(FIGURES[fig].runs)  # every run has its own run directory


def test_parameter_counts_match_the_paper():
    for size, (baseline, unified) in PAPER_DENSE.items():
        assert params(cfg_of("6", f"{size}_baseline")) == baseline
        assert params(cfg_of("6", f"{size}_unified")) == unified
    for size, (total, activated) in PAPER_MOE.items():
        cfg = cfg_of("7", f"{size}_baseline")
        with torch.device("meta"):
            model = Llama(resolve_vocab(cfg))
        assert (num_params(model), activated_params(model)) == (total, activated)
    assert params(cfg_of("1", "baseline")) == params(cfg_of("10", "baseline")) == 119_744_256
    assert params(cfg_of("10", "llama_large")) == 119_854_848  # 0.11985B, docs/paper.md §2.4
    assert params(cfg_of("10", "unified")) == 119_846_846


def test_settings_the_paper_states():
    none_best = cfg_of("1", "none_lr2e-3_1.2x")
    assert none_best.model.scale.placement == "none" and none_best.optim.lr == 2e-3 and none_best.train.steps == 24000
    assert cfg_of("1", "none_lr4e-3_1.4x").train.steps == 28000
    fig3 = cfg_of("3", "50b_no_output")
    assert fig3.model.gemma_norms and fig3.optim.name == "muon" and fig3.optim.lr == 4e-3 and fig3.train.steps == 25000
    assert fig3.optim.scale_weight_decay == "no_output" and cfg_of("3", "10b_wd_all").train.steps == 5000
    assert cfg_of("5", "hg_dnp_or").optim.scale_weight_decay == "all"  # not the unified strategy's iwd
    assert cfg_of("5", "hg_dnp_or_iwd").optim.scale_weight_decay == "iwd"
    assert [cfg_of("8", r).optim.lr for r in ("0.12b_unified", "moe_0.5b_unified")] == [5e-3, 4e-3]
    assert all(cfg_of("8", r).optim.name == "muon" for r in FIGURES["8"].runs)
    wsd = cfg_of("9", "moe_0.5b_baseline")
    assert wsd.schedule.name == "wsd" and wsd.schedule.decay_frac == 0.2 and wsd.optim.lr == 2e-3
    assert cfg_of("9", "0.12b_unified").optim.lr == 3e-3
    assert cfg_of("7", "0.5b_unified").model.d_model == 768  # Table 5's 748 is a typo


SAMPLE_TOKENS = {"sample-10BT": 10e9, "sample-100BT": 100e9, "sample-350BT": 350e9}  # GPT-2 tokens (dataset card)


def test_paper_scale_runs_read_their_data_once():
    """Every paper-scale config prepares enough tokens for its steps (with 1 % to spare: shard ends cost a few
    windows), from a fineweb-edu sample that holds them."""
    root = FIGURES_DIR.parent
    paths = [*root.glob("dense/*.yaml"), *root.glob("moe/*.yaml"), *FIGURES_DIR.rglob("*.yaml")]
    assert len(paths) == 65
    for path in paths:
        cfg = load_config(path)
        planned = cfg.train.steps * cfg.train.global_batch * cfg.data.seq_len
        sample = cfg.data.source.rsplit(":", 1)[-1]
        assert 1.01 * planned <= cfg.data.max_tokens <= SAMPLE_TOKENS[sample], path

"""Which runs make up each figure of the paper, and what each panel compares (docs/paper.md §4).

Every run is one YAML file, `configs/figures/fig<N>/<run>.yaml`, layered over a model size (configs/dense/,
configs/moe/) and a scale preset (configs/scale/). A panel lists its curves, the first being the reference of its
Δ-loss plot, and the dotted config keys its curves may differ in: repro/tests/test_figures.py holds every panel to that.

The first stage of the reproduction (repro/): what each figure runs. repro/proxy.py sizes a run for the CPU,
repro/comparisons.py says which deltas the results page reads from these runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FIGURES_DIR = Path(__file__).resolve().parent.parent / "configs" / "figures"
STRATEGY = ("model.scale.", "model.gemma_norms", "optim.scale_weight_decay", "optim.scale_wd_alpha",
            "optim.scale_wd_invariant")


@dataclass(frozen=True)
class Panel:
    title: str
    curves: tuple[str, ...]  # run names in configs/figures/fig<N>/; curves[0] is the reference
    varies: tuple[str, ...]  # dotted keys (or prefixes ending in ".") the curves may differ in


@dataclass(frozen=True)
class Figure:
    number: str
    title: str
    panels: tuple[Panel, ...]

    @property
    def runs(self) -> list[str]:
        """Every run of the figure, once, in panel order."""
        return list(dict.fromkeys(c for p in self.panels for c in p.curves))

    def config(self, run: str) -> Path:
        return FIGURES_DIR / f"fig{self.number}" / f"{run}.yaml"


def _pairs(sizes: tuple[str, ...]) -> tuple[Panel, ...]:
    return tuple(Panel(size, (f"{size}_baseline", f"{size}_unified"), STRATEGY) for size in sizes)


FIGURES: dict[str, Figure] = {f.number: f for f in (
    Figure("1", "Removing the scale vectors of Llama-0.12B", (
        Panel("same lr (4e-3)", ("baseline", "none_lr4e-3", "none_lr4e-3_1.4x"), (*STRATEGY, "train.steps")),
        Panel("best lr (2e-3 without vectors)", ("baseline", "none_lr2e-3", "none_lr2e-3_1.2x"),
              (*STRATEGY, "optim.lr", "train.steps")),
    )),
    Figure("3", "Weight-decay groups on Gemma-0.5B, Muon", (
        Panel("10B tokens", ("10b_wd_all", "10b_no_input", "10b_no_output"), ("optim.scale_weight_decay",)),
        Panel("50B tokens", ("50b_wd_all", "50b_no_input", "50b_no_output"), ("optim.scale_weight_decay",)),
    )),
    Figure("5", "Step-by-step validation on Llama-0.12B", (
        Panel("heterogeneity", ("baseline", "hg"), STRATEGY),
        Panel("placement", ("hg", "hg_ap", "hg_dp", "hg_dnp"), STRATEGY),
        Panel("reparameterization", ("hg_dp", "hg_dnp", "hg_dp_or", "hg_dp_er", "hg_dnp_or", "hg_dnp_er"),
              STRATEGY),
        Panel("weight decay", ("hg_dnp_or", "hg_dnp_er", "hg_dnp_or_iwd", "hg_dnp_er_iwd"), STRATEGY),
    )),
    Figure("6", "Dense models: the unified strategy vs tuned Llama (AdamW, cosine)",
           _pairs(("0.12b", "0.25b", "0.5b", "0.75b", "1b"))),
    Figure("7", "MoE models: the unified strategy vs tuned Llama-MoE", _pairs(("0.25b", "0.5b", "0.8b", "1b", "2b"))),
    Figure("8", "Muon", _pairs(("0.12b", "0.5b", "moe_0.5b"))),
    Figure("9", "WSD schedule (AdamW)", _pairs(("0.12b", "moe_0.5b"))),
    Figure("10", "Controlling for parameter count on Llama-0.12B", (
        Panel("parameter count", ("baseline", "llama_large", "unified"), (*STRATEGY, "model.d_ffn")),
    )),
)}

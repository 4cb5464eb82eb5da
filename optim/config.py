"""The optimizer's and the schedule's config sections, with their invariants (the root config.py composes them)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from strictconfig.config import resumable, since

WeightDecayMode = Literal["all", "iwd", "none", "no_input", "no_output"]


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
    # (tests/test_optim_dist.py), so a resume may change it.
    distributed: bool = resumable(True)
    # The MoE router's weight (and the optional shared-expert gate's) is a 2-D matrix inside a Transformer layer, which
    # is where the paper puts Muon (docs/paper.md §3.2); false keeps it on AdamW. Runs saved before this key trained
    # it with AdamW.
    router: bool = since(True, before=False)

    def invariants(self) -> list[tuple[str, str]]:
        bad = []
        if self.eps <= 0:
            bad.append(("eps", f"{self.eps} must be positive"))
        if not 0 <= self.momentum < 1:
            bad.append(("momentum", f"{self.momentum} must lie in [0, 1)"))
        if not 0 < self.ns_steps < 100:
            bad.append(("ns_steps", f"{self.ns_steps} must lie in [1, 99]"))
        return bad


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
    # Under DNP an input-side vector feeds an inner Norm, so its magnitude β (OR, ER) gets almost no gradient: only
    # weight decay moves it, toward the Norm's eps (results v4). false leaves those β undecayed (Llama.
    # invariant_magnitudes says which); it needs model.scale.placement dnp with reparam or / er. [U: an A/B knob]
    scale_wd_invariant: bool = True
    grad_clip: float = 1.0  # global gradient-norm clip; 0 disables
    muon: MuonConfig = field(default_factory=MuonConfig)

    def invariants(self) -> list[tuple[str, str]]:
        """(key within optim., problem) for every violated invariant."""
        bad = []
        if not 0 < self.lr <= 1:  # AdamW and Muon train at 1e-4 to 5e-2; above 1 is a typo (1e308, 3e3)
            bad.append(("lr", f"{self.lr} must lie in (0, 1]"))
        if not 0 <= self.weight_decay < math.inf:
            bad.append(("weight_decay", f"{self.weight_decay} must be a finite number ≥ 0"))
        if self.grad_clip < 0:
            bad.append(("grad_clip", f"{self.grad_clip} must be ≥ 0 (0 disables clipping)"))
        if self.eps <= 0:
            bad.append(("eps", f"{self.eps} must be positive"))
        if not all(0 <= b < 1 for b in self.betas):
            bad.append(("betas", f"{self.betas} must lie in [0, 1)"))
        return bad + [(f"muon.{k}", p) for k, p in self.muon.invariants()]


@dataclass
class ScheduleConfig:
    name: Literal["cosine", "wsd"] = "cosine"
    warmup_steps: int = 0  # must lie in [0, train.steps): checked where both are known (config.RunConfig)
    min_lr_ratio: float = 0.05  # cosine ends at lr × min_lr_ratio (1/20, docs/paper.md §3.1)
    decay_frac: float = 0.2  # wsd: the last 20 % of steps decay (docs/paper.md §3.3)
    decay_shape: Literal["linear", "cosine", "sqrt"] = "linear"  # wsd decay shape, to 0

    def invariants(self) -> list[tuple[str, str]]:
        bad = []  # warmup_steps: with train.steps, in config.RunConfig
        if not 0 <= self.min_lr_ratio <= 1:
            bad.append(("min_lr_ratio", "must lie in [0, 1]"))
        if not 0 < self.decay_frac <= 1:
            bad.append(("decay_frac", "must lie in (0, 1]"))
        return bad

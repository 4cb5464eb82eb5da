"""The first results page (proxy v1), kept as measured so the page can say which of its deltas persist when the
runs train past the start and which fade.

Copied verbatim from docs/results.md as committed in 79287b1 ("Results at six seeds: 144 runs, the page, its
archive"): 144 runs at 6 seeds, 5.04 CPU-hours, on an 8,192-token BPE at d_model 64 / 96 / 128 (4 layers) trained
47 / 80 / 120 steps of 16 × 256 tokens: 0.15–0.17 tokens per parameter. Each delta is ours − reference in the final
validation loss, paired by seed, with its 95 % Student-t interval (mean, low, high).
"""
from __future__ import annotations

from dataclasses import dataclass

from repro.proxy import DENSE


@dataclass(frozen=True)
class V1Delta:
    mean: float
    lo: float
    hi: float

    @property
    def resolved(self) -> bool:
        return self.lo > 0 or self.hi < 0


# (comparison key, row label in today's plan) → v1's delta. v1's d_model 128 rung was its Llama-0.12B proxy, as
# today's DENSE rung is; its smaller rungs have no counterpart. v1's Fig. 1 "each at its best lr" row was the same
# runs as "same lr (4e-3)" (both best lrs were 4e-3) and is left out here.
V1_DELTAS: dict[tuple[str, str], V1Delta] = {
    ("fig5-heterogeneity", "hg"): V1Delta(+0.0002, -0.0156, +0.0161),
    ("fig5-placement", "hg_ap"): V1Delta(+0.0176, -0.0005, +0.0357),
    ("fig5-placement", "hg_dp"): V1Delta(+0.0308, -0.0185, +0.0801),
    ("fig5-placement", "hg_dnp"): V1Delta(-0.0089, -0.0542, +0.0364),
    ("fig5-reparameterization", "hg_dnp"): V1Delta(-0.0398, -0.1008, +0.0213),
    ("fig5-reparameterization", "hg_dp_or"): V1Delta(-0.0418, -0.0805, -0.0031),
    ("fig5-reparameterization", "hg_dp_er"): V1Delta(-0.0574, -0.0930, -0.0218),
    ("fig5-reparameterization", "hg_dnp_or"): V1Delta(-0.0729, -0.1343, -0.0115),
    ("fig5-reparameterization", "hg_dnp_er"): V1Delta(-0.0832, -0.1376, -0.0288),
    ("fig5-weight_decay", "hg_dnp_er"): V1Delta(-0.0103, -0.0206, +0.0001),
    ("fig5-weight_decay", "hg_dnp_or_iwd"): V1Delta(-0.0003, -0.0177, +0.0171),
    ("fig5-weight_decay", "hg_dnp_er_iwd"): V1Delta(-0.0087, -0.0208, +0.0035),
    ("fig6-ladder", DENSE.label): V1Delta(-0.0422, -0.0753, -0.0090),
    ("fig8-muon", "unified"): V1Delta(-0.0348, -0.0530, -0.0167),
    ("fig9-wsd", "unified"): V1Delta(-0.0515, -0.0924, -0.0106),
    ("fig1-lr_grid", "same lr (4e-3)"): V1Delta(+0.0258, +0.0020, +0.0496),
}

V1_SUMMARY = (
    "The first version of this page (proxy v1) trained every model on 0.15–0.17 tokens per parameter in 47–120 "
    "steps (an 8,192-token BPE, d_model 64 / 96 / 128, 6 seeds, 144 runs, 5.04 CPU-hours): it measured how fast a "
    "design leaves the starting line. Of its 19 deltas, 10 had the paper's sign and an interval excluding 0 "
    "(among them Fig. 6's rungs at −0.3971, −0.2192 and −0.0422 and Fig. 5's "
    "hg_dnp_or at −0.0729 against −0.0245), 1 was of the opposite sign (hg_dp_er, −0.0574 against +0.0027) and 8 "
    "were within seed noise; Fig. 1's two rows were the same runs, counted twice. Its laws, L = 1.4375·C^-0.0795 "
    "(baseline) and 2.3686·C^-0.0487 (unified), gave an equal-loss multiplier from 3.95× at the smallest rung to "
    "1.21× at the largest, 2.16× as their geometric mean, from laws that are not parallel."
)

"""What the results page compares: each comparison's curves (figure runs at a proxy shape, under overrides), the
first curve the reference of every delta, and the paper's numbers each delta is read against (docs/paper.md §4).

The plan's order is the order the runs go in (repro/runner.py runs the unique runs seed by seed): changing a
curve's label, suffix or order renames or reorders run directories of a reproduction in progress.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from config import load_config
from repro.figures import FIGURES
from repro.proxy import DENSE, DENSE_LADDER, MOE, MOE_LADDER, Shape


@dataclass(frozen=True)
class Curve:
    label: str  # the name in the page
    figure: str  # configs/figures/fig<figure>/<run>.yaml
    run: str
    overrides: tuple[str, ...] = ()  # on top of the proxy's sizes (an lr of the grid)
    suffix: str = ""  # tells apart the run directories of one figure run under different overrides or shapes
    paper_delta: Optional[float] = None  # the paper's terminal Δ to the comparison's reference (docs/paper.md §4)
    shape: Optional[Shape] = None  # the proxy shape (repro/proxy.py); None: the run's own (paper_shape)
    horizon: float = 1.0  # × the proxy's tokens per compute parameter, by more steps (repro/proxy.py, size)
    defaults: tuple[str, ...] = ()  # under the plan's overrides, which may change them (an eager miniature)


@dataclass(frozen=True)
class LrGrid:
    """What a comparison of kind "lr_grid" reads: two designs over one lr grid (curve labels "<design> lr <lr>"), their
    delta at one lr and with each design at its own best lr (docs/paper.md §4.1: Fig. 1's two panels)."""
    reference: str  # the design each delta is against ("baseline")
    ours: str  # "none" (Fig. 1), "unified" (the headline)
    lrs: tuple[str, ...]  # as lr_text writes them, ascending
    same: str  # the lr of the same-lr row
    paper_same: Optional[float]  # the paper's Δ at the same lr
    paper_best: Optional[float]  # the paper's Δ with each design at its best lr
    heads: tuple[str, str, str, str]  # the grid table's columns: reference and ours, then each on WikiText-2
    delta: str  # what its deltas are: "without − with", "unified − baseline"
    note: str = ""  # said under its deltas: what the paper's values are


@dataclass(frozen=True)
class Comparison:
    key: str  # names the plot: img/results/<key>.png
    title: str
    cite: str  # where the paper's numbers come from
    curves: tuple[Curve, ...]  # curves[0] is the reference of every Δ
    kind: str = "panel"  # panel | lr_grid (Fig. 1, the headline) | ladder (Figs. 6, 7: baseline, unified per rung)
    paper_sizes: tuple[tuple[str, float], ...] = ()  # a ladder: the paper's Δ per model size
    paper_multiplier: Optional[float] = None  # a ladder: the paper's equal-loss compute multiplier
    grid: Optional[LrGrid] = None  # an lr_grid: its designs, lrs and the paper's two deltas
    horizon: Optional[int] = None  # a horizon rung: × the proxy's tokens (HORIZONS); its family is `figure`

    @property
    def rungs(self) -> list[tuple[Curve, Curve]]:
        """A ladder's (baseline, unified) pairs, smallest first."""
        return [(self.curves[i], self.curves[i + 1]) for i in range(0, len(self.curves), 2)]


# The paper's terminal deltas (docs/paper.md §4.4, Fig. 5), each against its panel's first curve.
FIG5_DELTAS = {
    "heterogeneity": {"hg": -0.0044},
    "placement": {"hg_ap": +0.0099, "hg_dp": -0.0032, "hg_dnp": +0.0341},
    "reparameterization": {"hg_dnp": +0.037, "hg_dp_or": -0.0063, "hg_dp_er": +0.0027, "hg_dnp_or": -0.0245,
                           "hg_dnp_er": -0.0238},
    "weight decay": {"hg_dnp_er": +0.0008, "hg_dnp_or_iwd": -0.0009, "hg_dnp_er_iwd": -0.0004},
}
FIG6_DELTAS = {"0.12b": -0.0331, "0.25b": -0.0244, "0.5b": -0.0416, "0.75b": -0.0373, "1b": -0.0148}  # docs/paper.md §4.5
FIG7_DELTAS = {"0.25b": -0.0305, "0.5b": -0.0209, "0.8b": -0.0499, "1b": -0.0236, "2b": -0.0207}  # docs/paper.md §4.6
FIG6_MULTIPLIER, FIG7_MULTIPLIER = 1.22, 1.25  # docs/paper.md §4.5, §4.6: equal-loss compute ratio of the fitted laws
FIG1_SAME_LR, FIG1_BEST_LR = +0.0285, +0.0149  # docs/paper.md §4.1: without − with scale vectors
FIG8_DELTA, FIG8_MOE_DELTA = -0.0156, -0.0188  # docs/paper.md §4.7: Dense-0.12B, MoE-0.5B, unified − baseline
FIG9_DELTA, FIG9_MOE_DELTA = -0.0269, -0.0186  # docs/paper.md §4.8
LR_FACTORS = (0.5, 1.0, 2.0)  # the headline at ×½, ×1 and ×2 of the paper's lr
MOE_LR_FACTORS = (0.5, 1.0, 2.0, 4.0, 8.0)  # the MoE's: both designs were best at the edge, ×2 (v3), then ×4 (v4)


@dataclass
class Plan:
    """What the page needs, in the order the runs go."""
    seeds: int
    lrs: tuple[float, ...] = (2e-3, 4e-3, 8e-3, 1.6e-2)  # Fig. 1's grid (repro.results --lrs)
    overrides: tuple[str, ...] = ()  # for every run, under each curve's own (an lr of the grid)
    comparisons: list[Comparison] = field(default_factory=list)

    def __post_init__(self):
        if not self.comparisons:
            self.comparisons = default_comparisons(self.lrs)


def pair(figure: str, run: str, paper_delta: Optional[float], shape: Optional[Shape] = None) -> tuple[Curve, Curve]:
    """A figure's baseline and unified runs of one size (`run` is their common prefix, e.g. "0.12b")."""
    suffix = f"-{shape.label.replace(' ', '')}" if shape else ""
    label = f" {shape.label}" if shape else ""
    return (Curve(f"baseline{label}", figure, f"{run}_baseline", suffix=suffix, shape=shape),
            Curve(f"unified{label}", figure, f"{run}_unified", suffix=suffix, paper_delta=paper_delta, shape=shape))


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def default_comparisons(lrs: tuple[float, ...]) -> list[Comparison]:
    out = [Comparison(f"fig5-{p.title.replace(' ', '_')}", f"Fig. 5, {p.title}", "docs/paper.md §4.4",
                      tuple(Curve(c, "5", c, paper_delta=FIG5_DELTAS[p.title].get(c)) for c in p.curves))
           for p in FIGURES["5"].panels]
    out.append(Comparison("fig1-lr_grid", "Fig. 1, with and without scale vectors over an lr grid", "docs/paper.md §4.1",
                          tuple(Curve(f"{name} lr {lr_text(lr)}", "1", run, (f"optim.lr={lr_text(lr)}",), f"-lr{lr_text(lr)}")
                                for lr in lrs for name, run in (("baseline", "baseline"), ("none", "none_lr4e-3"))),
                          kind="lr_grid", grid=fig1_grid(lrs)))
    # A ladder rung has no paper size of its own: its Δ is compared with the mean of the paper's sizes.
    out.append(Comparison("fig6-ladder", "Fig. 6, unified vs baseline over a ladder of dense proxy sizes",
                          "docs/paper.md §4.5",
                          tuple(c for shape in DENSE_LADDER for c in pair("6", "0.12b", mean(FIG6_DELTAS.values()), shape)),
                          kind="ladder", paper_sizes=tuple(FIG6_DELTAS.items()), paper_multiplier=FIG6_MULTIPLIER))
    out.append(Comparison("fig8-muon", "Fig. 8, Muon, dense (lr 5e-3)", "docs/paper.md §4.7", pair("8", "0.12b", FIG8_DELTA)))
    out.append(Comparison("fig9-wsd", "Fig. 9, WSD schedule, dense (AdamW, lr 3e-3)", "docs/paper.md §4.8",
                          pair("9", "0.12b", FIG9_DELTA)))
    out.append(Comparison("fig8-muon_moe", "Fig. 8, Muon, MoE (lr 4e-3)", "docs/paper.md §4.7",
                          pair("8", "moe_0.5b", FIG8_MOE_DELTA)))
    out.append(Comparison("fig9-wsd_moe", "Fig. 9, WSD schedule, MoE (AdamW, lr 2e-3)", "docs/paper.md §4.8",
                          pair("9", "moe_0.5b", FIG9_MOE_DELTA)))
    out.append(Comparison("fig7-ladder", "Fig. 7, unified vs baseline over a ladder of Llama-MoE proxy sizes",
                          "docs/paper.md §4.6",
                          tuple(c for shape in MOE_LADDER for c in pair("7", "0.5b", mean(FIG7_DELTAS.values()), shape)),
                          kind="ladder", paper_sizes=tuple(FIG7_DELTAS.items()), paper_multiplier=FIG7_MULTIPLIER))
    # The headline rungs over ×½, ×1, ×2 of the paper's lr, appended so that no run directory of
    # the comparisons above is renamed or reordered; the ×1 curves are the ladders' rungs, the same run directories.
    out.append(lr_headline("fig6-best_lr", "Fig. 6", "6", "0.12b", mean(FIG6_DELTAS.values()), DENSE))
    # The MoE's grid goes to ×8: both designs were best at the grid's edge, at ×2 (results v3), then at ×4 (v4).
    out.append(lr_headline("fig7-best_lr", "Fig. 7", "7", "0.5b", mean(FIG7_DELTAS.values()), MOE, MOE_LR_FACTORS))
    # The horizon (results v4): the dense headline at HORIZONS × the proxy's tokens, each with its own lr grid.
    out += [horizon_rung(h, "6", "0.12b", mean(FIG6_DELTAS.values()), HORIZON_DENSE) for h in HORIZONS]
    out += [horizon_rung(h, "7", "0.5b", mean(FIG7_DELTAS.values()), HORIZON_MOE, MOE_HORIZON_LRS[h],
                         compiled=h == max(HORIZONS)) for h in HORIZONS]
    out.append(magnitudes_ab(max(HORIZONS), MAGNITUDES_LR, HORIZON_DENSE))
    return out


# The horizon: the paper trains 100–129 tokens per compute parameter (docs/paper.md §3.1, §3.6), the proxy 10.5, and
# the paper's curves reorder late (Fig. 1). The headline comparison runs at 1, 3 and 10 × the proxy's tokens (10.5,
# 31.5 and 105 per compute parameter) by more steps of the same batch, on the ladder's smallest rung: d32 L4 (82k
# compute parameters) reads 2.5 passes of the corpus at 105, where the d64 L4 headline would read 7.5 (MAX_PASSES is
# 4). Its runs are compiled fp32: unified at d32 L4 trained 34k tokens/s compiled against 11–22k eager (one thread
# each, side by side, 400 steps, on a 2-core Xeon; the compile costs about 45 CPU-s a run), so the 10 × run
# takes half the time. The MoE's runs are on Fig. 7's smallest rung (d32 L2 E8, 2.7 passes at 105). Its unified
# trained 13k tokens/s eager and 23k compiled, and the compile cost about 100 CPU-s a run (600 steps each, one thread):
# eager is cheaper at 1 × (about 120 CPU-s a run), even at 3 ×, and compiled saves about 30 % at 10 × (about 730
# CPU-s eager), so only the 10 × rung compiles.
# Each horizon has its own lr grid: the best lr moves with the horizon. Each dense grid started at 2e-3..1.6e-2; on 4
# seeds unified was best at the edge at 1 × (1.6e-2) and at 10 × (2e-3), so those grids go one lr further (results
# v4). Dense, the best lrs moved down with the horizon (unified 1.6e-2, 4e-3, 2e-3). The MoE's grids are 3 lrs
# where its pilots put the optimum, a third of the cost of 5 at the 10 × rung, which holds 80 % of the MoE horizon's
# CPU time; a grid whose best lr is its edge is extended before its seeds are planned. On the pilots' 4 seeds the
# MoE's best lrs moved up, not down: 8e-3 (baseline) and 4e-3 (unified) at 1 ×; at 3 × both 8e-3 over 2e-3..8e-3,
# then the baseline 1.6e-2 once the grid went there. So the 3 × grid goes to 3.2e-2. The 10 × grid started at
# 4e-3..1.6e-2 around both optima; on its pilot's 4 seeds unified was best at 4e-3, that grid's edge, so it goes
# down to the paper's 2e-3 (a grid without the paper's lr would read its same-lr row elsewhere: horizon_rung's `same`).
HORIZONS = (1, 3, 10)
HORIZON_LRS = {1: (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2), 3: (2e-3, 4e-3, 8e-3, 1.6e-2),
               10: (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)}
MOE_HORIZON_LRS = {1: (2e-3, 4e-3, 8e-3, 1.6e-2), 3: (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2),
                   10: (2e-3, 4e-3, 8e-3, 1.6e-2)}
HORIZON_DENSE, HORIZON_MOE = DENSE_LADDER[0], MOE_LADDER[0]


def horizon_rung(horizon: int, figure: str, run: str, paper: float, shape: Shape,
                 lrs: Optional[tuple[float, ...]] = None, compiled: bool = True,
                 same: Optional[float] = None) -> Comparison:
    """unified − baseline at `shape` over an lr grid (HORIZON_LRS[horizon] unless `lrs`), trained `horizon` × the
    proxy's tokens (compiled fp32 unless `compiled` is false), at the paper's lr (or `same`, for a grid without it)
    and with each at its best; read against the paper's `paper` as lr_headline's rows are."""
    base, uni = pair(figure, run, None, shape)
    paper_lr = lr_text(load_config(FIGURES[figure].config(base.run)).optim.lr)
    texts = tuple(lr_text(lr) for lr in sorted(lrs or HORIZON_LRS[horizon]))
    same_lr = lr_text(same) if same is not None else paper_lr
    if same_lr not in texts:
        raise ValueError(f"the horizon rung's same-lr row at {same_lr} is not in its grid {texts}")
    curves = tuple(Curve(f"{design} lr {lr}", figure, c.run, (f"optim.lr={lr}",), f"{c.suffix}-x{horizon}-lr{lr}",
                         shape=shape, horizon=horizon, defaults=("train.compile=true",) if compiled else ())
                   for lr in texts for design, c in (("baseline", base), ("unified", uni)))
    note = (f"Both deltas are read against the paper's {paper:+.4f}, the mean of its sizes, as the headline rung's are. "
            f"The runs train {horizon} × the proxy's tokens (repro/comparisons.py, HORIZONS), "
            f"{'compiled' if compiled else 'eager'} fp32."
            + (f" Its same-lr row is at {same_lr}: the grid leaves out the paper's {paper_lr} (repro/comparisons.py, "
               "horizon_rung)." if same_lr != paper_lr else ""))
    return Comparison(f"fig{figure}-horizon_x{horizon}", f"The horizon, {'MoE' if shape.n_experts else 'dense'} ({shape.label}) at {horizon} × the "
                      f"proxy's tokens, unified vs baseline over an lr grid", "docs/paper.md §3.1, §3.6, §4.5", curves,
                      kind="lr_grid", grid=LrGrid("baseline", "unified", texts, same_lr, paper, paper,
                                                  ("baseline", "unified", "WikiText-2 baseline", "WikiText-2 unified"),
                                                  "unified − baseline", note), horizon=horizon)


# The magnitudes only a Norm reads (results v4, item 7). Under DNP an input-side vector feeds its branch's inner Norm,
# so its magnitude β gets gradient only through the Norm's eps, while IWD decays it (docs/paper.md §1.5–§1.7). The
# A/B: unified at the longest horizon and at its best lr on the pilot's 4 seeds, with IWD as today against IWD that
# leaves those β undecayed (optim.scale_wd_invariant=false); and the same run in bf16, whose telemetry shows the
# magnitudes under bf16 rounding (runtime/telemetry.py logs every β at each evaluation).
MAGNITUDES_KEY = "fig6-magnitudes"
MAGNITUDES_LR = 2e-3


def magnitudes_ab(horizon: int, lr: float, shape: Shape) -> Comparison:
    """unified at `horizon` × the proxy's tokens and `lr`: IWD as today (the horizon rung's own runs), the
    magnitudes only a Norm reads undecayed, and bf16."""
    _, uni = pair("6", "0.12b", None, shape)
    lr_t = lr_text(lr)
    today = Curve("unified, IWD as today", "6", uni.run, (f"optim.lr={lr_t}",), f"{uni.suffix}-x{horizon}-lr{lr_t}",
                  shape=shape, horizon=horizon, defaults=("train.compile=true",))
    spared = replace(today, label="unified, those β undecayed",
                     overrides=today.overrides + ("optim.scale_wd_invariant=false",), suffix=today.suffix + "-spared")
    bf16 = replace(today, label="unified, bf16", overrides=today.overrides + ("train.dtype=bfloat16",),
                   suffix=today.suffix + "-bf16")
    return Comparison(MAGNITUDES_KEY, f"The magnitudes only a Norm reads, dense ({shape.label}) at {horizon} × the "
                      f"proxy's tokens, unified at lr {lr_t}", "docs/paper.md §1.5–§1.7 (no paper value)",
                      (today, spared, bf16))


# Issue 52's A/B: where the literal form's magnitudes collapsed in results v4 (β below 1e-3 in some runs), unified
# as the paper reads it, without those magnitudes (model.scale.invariant_magnitude=remove), and with them undecayed
# (optim.scale_wd_invariant=false). The literal arm is the horizon rung's own experiment; rerun in a fresh out-dir,
# it logs each inner Norm's headroom, which v4's runs predate. The last row is the d64 L4 headline at the paper's lr
# (Fig. 6's rung, whose v3 runs predate the telemetry too). Not yet on the page: its runs come first.
COLLAPSE_ROWS = ((10, 4e-3, "dense"), (3, 4e-3, "dense"), (1, 8e-3, "moe"), (10, 8e-3, "dense"), (3, 8e-3, "dense"),
                 (10, 4e-3, "moe"), (1, 4e-3, "headline"))


def collapse_ab(horizon: int, lr: float, kind: str) -> Comparison:
    """unified at `horizon` × the proxy's tokens and `lr` on the horizon's dense or MoE shape, or on the d64 L4
    headline ("headline": the ladder rung's own run, at the preset's lr): literal, the magnitudes only a Norm reads
    removed, and those magnitudes undecayed. The headline reruns literal for its telemetry beside removed, without
    the undecayed arm: its question is whether it collapses there, not how decay moves it."""
    lr_t = lr_text(lr)
    if kind == "headline":
        _, uni = pair("6", "0.12b", None, DENSE)
        preset_lr = lr_text(load_config(FIGURES["6"].config(uni.run)).optim.lr)
        if (horizon, lr_t) != (1, preset_lr):
            raise ValueError(f"the headline row runs at 1 × and the preset's lr {preset_lr}, not {horizon} × {lr_t}")
        figure, shape, literal = "6", DENSE, replace(uni, label="unified, literal")
    else:
        figure, run, shape = ("6", "0.12b", HORIZON_DENSE) if kind == "dense" else ("7", "0.5b", HORIZON_MOE)
        _, uni = pair(figure, run, None, shape)
        compiled = kind == "dense" or horizon == max(HORIZONS)  # as horizon_rung's runs
        literal = Curve("unified, literal", figure, uni.run, (f"optim.lr={lr_t}",), f"{uni.suffix}-x{horizon}-lr{lr_t}",
                        shape=shape, horizon=horizon, defaults=("train.compile=true",) if compiled else ())
    removed = replace(literal, label="unified, magnitudes removed",
                      overrides=literal.overrides + ("model.scale.invariant_magnitude=remove",),
                      suffix=literal.suffix + "-removed")
    spared = replace(literal, label="unified, those β undecayed",
                     overrides=literal.overrides + ("optim.scale_wd_invariant=false",), suffix=literal.suffix + "-spared")
    name = "MoE" if kind == "moe" else "dense"
    arms = (literal, removed) if kind == "headline" else (literal, removed, spared)
    return Comparison(f"fig{figure}-collapse_x{horizon}_lr{lr_t}" + ("_headline" if kind == "headline" else ""),
                      f"The magnitudes only a Norm reads, {name} ({shape.label}) at {horizon} × the proxy's tokens, "
                      f"unified at lr {lr_t}", "docs/paper.md §1.7 (no paper value)", arms)


def fig1_grid(lrs: tuple[float, ...]) -> LrGrid:
    """Fig. 1's grid (the plan's --lrs): without − with scale vectors at the paper's 4e-3 when the grid has it (else
    its middle lr) and each at its best (docs/paper.md §4.1)."""
    texts = tuple(lr_text(lr) for lr in sorted(lrs))
    same = lr_text(4e-3) if lr_text(4e-3) in texts else texts[len(texts) // 2]
    return LrGrid("baseline", "none", texts, same, FIG1_SAME_LR, FIG1_BEST_LR,
                  ("with scale vectors (baseline)", "without (none)", "WikiText-2 with", "WikiText-2 without"),
                  "without − with")


def lr_headline(key: str, fig: str, figure: str, run: str, paper: float, shape: Shape,
                factors: tuple[float, ...] = LR_FACTORS) -> Comparison:
    """A headline rung (`pair(figure, run, ..., shape)`, a ladder's) at `factors` × the paper's lr, unified
    − baseline at the paper's lr and with each at its best. The paper's lr is the figure config's
    baseline lr (docs/paper.md §2.1, §2.2: one lr per size), which the paper tuned for the baseline and used for the
    improved model too (§2.1): its Δ is the baseline at its best lr, so both rows are read against it, as the rung
    is. The ×1 curves keep the rung's suffix: with their lr equal to the config's they are the rung's experiments,
    so the runner (repro/runner.py, plan_runs) gives them the rung's run directories; the others add "-lr<lr>"."""
    base, uni = pair(figure, run, None, shape)
    paper_lr = load_config(FIGURES[figure].config(base.run)).optim.lr
    lrs = tuple(lr_text(f * paper_lr) for f in factors)
    curves = tuple(Curve(f"{design} lr {lr}", figure, c.run, (f"optim.lr={lr}",),
                         c.suffix + ("" if f == 1 else f"-lr{lr}"), shape=shape)
                   for f, lr in zip(factors, lrs) for design, c in (("baseline", base), ("unified", uni)))
    named = ", ".join("×½" if f == 0.5 else f"×{f:g}" for f in factors)
    note = (f"Both deltas are read against the paper's {paper:+.4f}, the mean of its sizes as for the ladder's rung: "
            "the paper tuned the lr for the baseline and used it for the unified model (docs/paper.md §2.1), so its Δ "
            "is already the baseline at its best lr.")
    same = lrs[factors.index(1)]
    return Comparison(key, f"{fig}'s headline rung ({shape.label}), unified vs baseline at {named} the paper's "
                      f"lr ({same})", "docs/paper.md §2.1, §4.5, §4.6", curves, kind="lr_grid",
                      grid=LrGrid("baseline", "unified", lrs, same, paper, paper,
                                  ("baseline", "unified", "WikiText-2 baseline", "WikiText-2 unified"),
                                  "unified − baseline", note))


def lr_text(lr: float) -> str:
    """2e-3, not 0.002: as the paper and the configs write an lr, with as few digits as give back the same float
    (1.5e-3 for ×½ of 3e-3)."""
    for digits in range(16):
        text = f"{lr:.{digits}e}"
        if float(text) == lr:
            break
    return text.replace("e-0", "e-").replace("e+0", "e")

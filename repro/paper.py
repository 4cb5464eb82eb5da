"""The paper-scale plan: every unique run of the paper's figures once, the data it reads, and what it costs.

Runs of different figures are one experiment when their resolved configs agree outside `log.*`
(repro/experiments.py): Figs. 1, 5, 6 and 10's Llama-0.12B baselines are one run, Figs. 5, 6 and 10's unified
0.12B another. Each experiment is trained once, in one run directory that every figure's plot reads, named after its
first reader in figure order (1, 3, 5, 6, …, 10; a figure's runs in panel order): `fig1-baseline` is also Fig. 5's,
6's and 10's baseline. `canonical` gives that reader; repro/jobs.py builds a paper-scale job from it.

Compute. FLOPs = the model's own training FLOPs per token × the tokens its steps read (steps × global_batch ×
seq_len). model.summary.flops_per_token counts forward and backward: 6·N, N the activated parameters without the input
embedding (the LM head included), plus attention's scores and values, 12·n_layers·n_heads·head_dim·seq_len (PaLM's
count, the causal mask not halved). Node-hours of 8 H100s at a stated MFU: FLOPs / (8 × 989 TFLOP/s × MFU), 989
TFLOP/s being the H100 SXM's dense bf16 tensor-core peak (no sparsity).

Data. Every paper-scale config reads one prepared dir, the largest budget's (configs/dense/1b.yaml: 50k steps ×
512 × 4,096 = 104.9B tokens); the loader draws each run's windows from all of it (data/loader.py), so a smaller run
reads a part of it once and a larger seq_len cuts the same shards into longer windows. `epoch_tokens` is the
least a dir prepared with a cap holds in windows of a seq_len (a window never crosses a 100M-token shard's end).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from config import RunConfig, strategy_name
from data.prepare import DEFAULT_SHARD_TOKENS, prepare_command
from model.llama import Llama
from model.summary import activated_params, flops_per_token, num_params
from repro.experiments import config_of, experiment_key
from repro.figures import FIGURES

ROOT = Path(__file__).resolve().parent.parent
H100_BF16_PEAK = 989e12  # FLOP/s: H100 SXM, dense bf16 (the 1,979 of the data sheet assume 2:4 sparsity)
GPUS = 8  # one node
DEFAULT_MFU = 0.40

Reader = tuple[str, str]  # (figure number, run name in configs/figures/fig<N>/)


def config_path(figure: str, run: str) -> str:
    """The run's config as a user types it from the repository root."""
    return FIGURES[figure].config(run).relative_to(ROOT).as_posix()


def readers() -> list[Reader]:
    """Every (figure, run) of every figure, in figure order and each figure's panel order."""
    return [(n, run) for n, fig in FIGURES.items() for run in fig.runs]


@functools.lru_cache(maxsize=8)
def _groups(overrides: tuple[str, ...]) -> dict[str, tuple[Reader, ...]]:
    """experiment_key → the readers of that experiment, first reader first (dicts keep insertion order)."""
    groups: dict[str, list[Reader]] = {}
    for figure, run in readers():
        cfg = config_of(["--config", config_path(figure, run), *overrides])
        groups.setdefault(experiment_key(cfg), []).append((figure, run))
    return {k: tuple(v) for k, v in groups.items()}


def canonical(figure: str, run: str, overrides: tuple[str, ...] = ()) -> Reader:
    """The (figure, run) whose config and run directory stand for `run` of `figure` at paper scale: the first reader
    of its experiment (itself when no earlier figure trains the same config). `overrides` are the key=value
    overrides every run gets; runs are compared with them applied."""
    for group in _groups(tuple(overrides)).values():
        if (figure, run) in group:
            return group[0]
    raise KeyError(f"Fig. {figure} has no run {run!r} (configs/figures/fig{figure}/)")


@dataclass(frozen=True)
class Experiment:
    """One unique paper-scale run: trained once, read by every figure in `readers`."""

    readers: tuple[Reader, ...]
    cfg: RunConfig
    flops_per_token: int
    total_params: int
    activated_params: int  # without the input embedding

    @property
    def name(self) -> str:
        """Its run directory's name: the first reader's log.run_name (fig<N>-<run>)."""
        return self.cfg.log.run_name

    @property
    def config(self) -> str:
        return config_path(*self.readers[0])

    @property
    def figures(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for f, _ in self.readers))

    @property
    def tokens(self) -> int:
        t = self.cfg.train
        return t.steps * t.global_batch * self.cfg.data.seq_len

    @property
    def flops(self) -> int:
        return self.flops_per_token * self.tokens

    @property
    def prepare(self) -> str:
        return prepare_command(self.cfg.data)

    @property
    def model(self) -> str:
        """'Dense 0.12B (d768 L6)', 'MoE 0.48B, 0.15B active (d768 L12)'."""
        m = self.cfg.model
        kind = "MoE" if m.moe is not None else "Dense"
        active = f", {self.activated_params / 1e9:.2f}B active" if m.moe is not None else ""
        return f"{kind} {self.total_params / 1e9:.2f}B{active} (d{m.d_model} L{m.n_layers})"

    @property
    def strategy(self) -> str:
        """The preset's name; a preset with another scale weight decay (Fig. 3's groups, Fig. 5's ER + IWD) as
        'gemma, wd no_input'."""
        name = strategy_name(self.cfg)
        wd = self.cfg.optim.scale_weight_decay
        if name == "custom":
            for other in ("all", "iwd"):
                alt = strategy_name(replace(self.cfg, optim=replace(self.cfg.optim, scale_weight_decay=other)))
                if alt != "custom":
                    return f"{alt}, wd {wd}"
        return name

    @property
    def optimizer(self) -> str:
        return f"{self.cfg.optim.name} {self.cfg.optim.lr:g}"

    @property
    def schedule(self) -> str:
        return self.cfg.schedule.name


def experiment(group: tuple[Reader, ...], overrides: tuple[str, ...] = ()) -> Experiment:
    cfg = config_of(["--config", config_path(*group[0]), *overrides])
    with torch.device("meta"):  # shapes only: no memory, no weights
        model = Llama(cfg.model)
    return Experiment(group, cfg, flops_per_token(model, cfg.data.seq_len), num_params(model),
                      activated_params(model, exclude_embedding=True))


def experiments(overrides: tuple[str, ...] = ()) -> list[Experiment]:
    """Every unique paper-scale run, in the order of its first reader."""
    return [experiment(g, tuple(overrides)) for g in _groups(tuple(overrides)).values()]


def node_hours(flops: float, mfu: float = DEFAULT_MFU) -> float:
    """Hours of one node of GPUS H100s at `mfu` of the bf16 dense peak."""
    return flops / (GPUS * H100_BF16_PEAK * mfu) / 3600


def epoch_tokens(max_tokens: int, seq_len: int, shard_tokens: int = DEFAULT_SHARD_TOKENS) -> int:
    """The fewest target tokens one pass over a dir capped at `max_tokens` train tokens holds in windows of seq_len
    + 1 (the cap stops after the document that reaches it, so the dir holds at least that many; shards are full but
    the last; a shard of n tokens holds ⌊(n − 1)/seq_len⌋ windows)."""
    full, rest = divmod(max_tokens, shard_tokens)
    windows = full * ((shard_tokens - 1) // seq_len) + max(0, (rest - 1) // seq_len)
    return windows * seq_len


@dataclass(frozen=True)
class FigureCost:
    number: str
    title: str
    runs: int  # the figure's runs (curves)
    experiments: tuple[Experiment, ...]  # its unique runs
    shared: dict[str, tuple[str, ...]]  # run directory → the other figures that read it

    @property
    def flops(self) -> int:
        """What the figure costs on its own (its unique runs, shared ones included)."""
        return sum(e.flops for e in self.experiments)

    @property
    def shared_flops(self) -> int:
        return sum(e.flops for e in self.experiments if e.name in self.shared)


@dataclass(frozen=True)
class DataDir:
    dir: str
    prepare: str
    max_tokens: int
    readers: tuple[Experiment, ...]

    @property
    def largest(self) -> Experiment:
        """The reader that needs the most passes over the dir."""
        return max(self.readers, key=self.passes)

    def passes(self, e: Experiment) -> float:
        """Passes over the dir the run's steps make (at most this many: the dir holds at least epoch_tokens)."""
        return e.tokens / epoch_tokens(self.max_tokens, e.cfg.data.seq_len)


@dataclass(frozen=True)
class Plan:
    experiments: tuple[Experiment, ...]
    seeds: int = 1
    mfu: float = DEFAULT_MFU

    @property
    def runs(self) -> int:
        return len(self.experiments) * self.seeds

    @property
    def flops(self) -> int:
        return sum(e.flops for e in self.experiments) * self.seeds

    @property
    def flops_per_figure_sum(self) -> int:
        """Σ over figures of what each costs alone: what running every figure separately would cost."""
        return sum(f.flops for f in self.figures) * self.seeds

    @property
    def figures(self) -> list[FigureCost]:
        out = []
        for number, fig in FIGURES.items():
            mine = tuple(e for e in self.experiments if number in e.figures)
            shared = {e.name: tuple(f for f in e.figures if f != number) for e in mine if len(e.figures) > 1}
            out.append(FigureCost(number, fig.title, len(fig.runs), mine, shared))
        return out

    @property
    def data(self) -> list[DataDir]:
        dirs: dict[str, list[Experiment]] = {}
        for e in self.experiments:
            dirs.setdefault(e.cfg.data.dir, []).append(e)
        out = []
        for d, es in dirs.items():
            caps = {e.cfg.data.max_tokens for e in es}
            if len(caps) != 1 or None in caps:  # the paper's configs all cap: a streamed Hub source has no end
                raise ValueError(f"data dir {d} is read with data.max_tokens {sorted(caps, key=str)}: one dir needs "
                                 "one cap (set the same data.max_tokens in every config that reads it)")
            out.append(DataDir(d, es[0].prepare, caps.pop(), tuple(es)))
        return out


def plan(seeds: int = 1, mfu: float = DEFAULT_MFU, overrides: tuple[str, ...] = ()) -> Plan:
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1 (got {seeds})")
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must lie in (0, 1] (got {mfu}); 0.4 is 40 % of the bf16 peak")
    return Plan(tuple(experiments(tuple(overrides))), seeds, mfu)


# ------------------------------------------------------------------------------------------------------ rendering


def _sci(x: float) -> str:
    return f"{x:.2e}".replace("e+", "e")


def _hours(flops: float, mfu: float) -> str:
    return f"{node_hours(flops, mfu):,.1f}"


def _tokens(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _read_by(e: Experiment) -> str:
    if len(e.readers) == 1:
        return e.readers[0][0]
    return "; ".join(f"{f}: {r}" for f, r in e.readers)


def table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    """Rows under a header: a Markdown table, or columns aligned with two spaces between them."""
    if markdown:
        lines = [header, ["---"] * len(header), *rows]
        return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows])


def render(p: Plan, markdown: bool = False) -> str:
    """The plan as the command prints it: the unique runs, the figures, the total and the data."""
    s, mfu = p.seeds, p.mfu
    per = f" × {s} seeds (train.seed 0…{s - 1}, run dirs <run>-s<seed>)" if s > 1 else ""
    n_readers = sum(len(e.readers) for e in p.experiments)
    head = (f"{len(p.experiments)} unique paper-scale runs for the {n_readers} runs of Figs. "
            f"{', '.join(FIGURES)}{per}. Compute: the model's training FLOPs per token × tokens; node-hours of "
            f"{GPUS}×H100 at {mfu:.0%} MFU of {H100_BF16_PEAK / 1e12:.0f} TFLOP/s (dense bf16 peak).")
    runs = table(["run", "read by (figure: run)", "model", "strategy", "optimizer", "schedule",
                  "steps × tokens/step = tokens", "FLOPs", f"{GPUS}×H100 h"],
                 [[e.name, _read_by(e), e.model, e.strategy, e.optimizer, e.schedule,
                   f"{e.cfg.train.steps:,} × {_tokens(e.tokens / e.cfg.train.steps)} = {_tokens(e.tokens)}",
                   _sci(e.flops * s), _hours(e.flops * s, mfu)] for e in p.experiments], markdown)
    figs = p.figures
    rows = [[f"Fig. {f.number}", f.title, str(f.runs), str(len(f.experiments)),
             ", ".join(f"{n} ({', '.join(o)})" for n, o in f.shared.items()) or "—",
             _sci(f.flops * s), _hours(f.flops * s, mfu)] for f in figs]
    rows.append(["all", "every figure, shared runs once", str(n_readers), str(len(p.experiments)), "—",
                 _sci(p.flops), _hours(p.flops, mfu)])
    figures = table(["figure", "title", "runs", "unique runs", "shares (run: other figures)", "FLOPs",
                     f"{GPUS}×H100 h"], rows, markdown)
    saved = p.flops_per_figure_sum - p.flops
    total = (f"Total: {p.runs} runs, {_sci(p.flops)} FLOPs, {_hours(p.flops, mfu)} node-hours of {GPUS}×H100 "
             f"({node_hours(p.flops, mfu) * GPUS:,.0f} GPU-hours) at {mfu:.0%} MFU. Each figure run on its own "
             f"would cost {_sci(p.flops_per_figure_sum)} FLOPs; the shared runs save {_sci(saved)} "
             f"({_hours(saved, mfu)} node-hours).")
    data = table(["data dir", "runs", "train tokens (cap)", "uint16 shards", "most passes (run)", "prepare"],
                 [[d.dir, str(len(d.readers)), f"{d.max_tokens:,}", f"≈ {d.max_tokens * 2 / 1e9:.0f} GB",
                   f"{d.passes(d.largest):.3f} ({d.largest.name})", f"`{d.prepare}`" if markdown else d.prepare]
                  for d in p.data], markdown)
    how = ("Every run reads its windows from the whole dir (data/loader.py); prepare it once, then "
           "`python -m repro.reproduce all` trains each unique run once (a finished one is skipped) and draws "
           "every figure.")
    sections = [("Runs", runs), ("Figures", figures), ("Data", data)]
    if markdown:
        return "\n\n".join([head, *[f"**{t}**\n\n{body}" for t, body in sections], total, how]) + "\n"
    return "\n\n".join([head, *[f"{t}\n{body}" for t, body in sections], total, how]) + "\n"


def to_json(p: Plan) -> dict:
    """The plan for tools: every number unrounded (FLOPs and hours for all seeds)."""
    s = p.seeds
    return {
        "seeds": s, "mfu": p.mfu, "gpus": GPUS, "peak_flops_per_gpu": H100_BF16_PEAK,
        "runs": [{"name": e.name, "config": e.config, "read_by": [{"figure": f, "run": r} for f, r in e.readers],
                  "model": e.model, "total_params": e.total_params, "activated_params": e.activated_params,
                  "strategy": e.strategy, "optimizer": e.cfg.optim.name, "lr": e.cfg.optim.lr,
                  "schedule": e.schedule, "steps": e.cfg.train.steps, "global_batch": e.cfg.train.global_batch,
                  "seq_len": e.cfg.data.seq_len, "tokens": e.tokens, "data_dir": e.cfg.data.dir,
                  "prepare": e.prepare, "flops_per_token": e.flops_per_token, "flops": e.flops * s,
                  "node_hours": node_hours(e.flops * s, p.mfu)} for e in p.experiments],
        "figures": [{"figure": f.number, "title": f.title, "runs": f.runs,
                     "unique_runs": [e.name for e in f.experiments], "shared": {k: list(v) for k, v in f.shared.items()},
                     "flops": f.flops * s, "shared_flops": f.shared_flops * s, "node_hours": node_hours(f.flops * s, p.mfu)}
                    for f in p.figures],
        "data": [{"dir": d.dir, "prepare": d.prepare, "max_tokens": d.max_tokens, "runs": [e.name for e in d.readers],
                  "most_passes": d.passes(d.largest), "most_passes_run": d.largest.name} for d in p.data],
        "total": {"runs": p.runs, "flops": p.flops, "node_hours": node_hours(p.flops, p.mfu),
                  "gpu_hours": node_hours(p.flops, p.mfu) * GPUS, "flops_figures_separately": p.flops_per_figure_sum},
    }

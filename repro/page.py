"""repro/pages/results.md, written from the runs' config.yaml and metrics.jsonl by `python -m repro.results`.

Every number in the page is computed here from the runs; the paper's numbers beside them are docs/paper.md §4's, v1's
are repro/versions.py's. A difference is "ours − reference" at the last evaluation (the final weights), paired by seed,
with a 95 % Student-t interval over seeds and the MDE of its seeds (repro/stats.py); the verdict sets sign and size
beside the paper's. The page: what it reads and what it does not yet, the reading in plain words (repro/reading.py),
the proxy (per comparison: tokens per parameter, steps, passes, seeds), the count behind the reading (independent
rows, multiple-comparison corrections, power, v1 against v2), then each comparison's section (repro/sections.py).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from config import load_config
from repro import proxy
from repro.comparisons import Comparison, Plan
from repro.figures import FIGURES
from repro.measure import Results
from repro.budget import budget_sentences
from repro.first_screen import plain_reading
from repro.over_training import wiki_methods
from repro.reading import CENTRAL, count_section, horizon_heads, past_page, plan_labels, retuned_done, short_of_power
from runs import Run
from repro.horizon_section import horizon_families, horizon_section
from repro.magnitude_section import magnitudes_section
from repro.sections import ladder_section, lr_grid_section, panel_section
from repro.sources import all_prefix, composition_lines, eval_read, source_table

class Sizes:
    """Compute parameters (repro.proxy.compute_params: without the input embedding) and every parameter
    (repro.proxy.total_params) of each model config, built once on the meta device."""

    def __init__(self):
        self._n: dict[str, tuple[int, int]] = {}

    def both(self, run: Run) -> tuple[int, int]:
        key = json.dumps(run.cfg.to_dict()["model"], sort_keys=True)
        if key not in self._n:
            self._n[key] = proxy.compute_params(run.cfg), proxy.total_params(run.cfg)
        return self._n[key]

    def __call__(self, run: Run) -> int:
        return self.both(run)[0]


def problems(run: Run, n: int) -> list[str]:
    """What keeps a finished run from the proxy's rules (repro/proxy.py), from what it logged."""
    out, tpp = [], run.final_tokens / n
    if tpp < proxy.MIN_TOKENS_PER_PARAM:
        out.append(f"{tpp:.2f} tokens per parameter")
    if run.final_eval["step"] < proxy.MIN_STEPS:
        out.append(f"{run.final_eval['step']} steps")
    if run.passes is not None and run.passes > proxy.MAX_PASSES:
        out.append(f"{run.passes:.2f} passes")
    return out


def span(values: list[float], spec: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, spec) if format(lo, spec) == format(hi, spec) else f"{format(lo, spec)}–{format(hi, spec)}"


def proxy_section(res: Results) -> list[str]:
    sizes = Sizes()
    out = ["| comparison | seeds | runs | tokens per compute parameter | tokens per parameter, all counted | steps | "
           "passes over the data |", "|---|---|---|---|---|---|---|"]
    for comp in res.plan.comparisons:
        if res.unread(comp):  # not run yet: its section says so, in one line
            continue
        per_curve = [res.runs_of(comp, c) for c in comp.curves]
        runs = list({r.path: r for rs in per_curve for r in rs.values()}.values())
        if not runs:
            out.append(f"| {comp.title} | 0 of {res.plan.seeds} | 0 | – | – | – | – |")
            continue
        passes = [r.passes for r in runs if r.passes is not None]
        unrun = sum(not rs for rs in per_curve)  # a grid read over part of its lrs: its other curves, said apart
        seeds = f"{min(len(rs) for rs in per_curve if rs)} of {res.plan.seeds}" + (
            f" ({unrun} curve{'s' if unrun > 1 else ''} not run)" if unrun else "")
        out.append(f"| {comp.title} | {seeds} | {len(runs)} | "
                   f"{span([r.final_tokens / sizes(r) for r in runs], '.1f')} | "
                   f"{span([r.final_tokens / sizes.both(r)[1] for r in runs], '.1f')} | "
                   f"{span([r.final_eval['step'] for r in runs], ',')} | "
                   f"{span(passes, '.2f') if passes else '–'} |")
    rules = (f"≥ {proxy.MIN_TOKENS_PER_PARAM:g} tokens per compute parameter, ≥ {proxy.MIN_STEPS:,} steps and "
             f"≤ {proxy.MAX_PASSES} passes over the training data")
    # The floors are checked on every finished run, a comparison not shown yet (Fig. 1's grid before its last
    # curve has a run) included, so the count matches the page's first line.
    every = list({r.path: r for rs in (res.runs_of(c, k) for c in res.plan.comparisons for k in c.curves)
                  for r in rs.values()}.values())
    if not every:
        return ["No run has finished yet.", ""]
    flagged = {r.path.name: p for r in every if (p := problems(r, sizes(r)))}
    out += ["", "Tokens per compute parameter: the tokens of the final evaluation over N, the run's compute parameters "
            "(without the input embedding; for MoE all experts; docs/paper.md §3.6); the next column counts every "
            f"parameter, the input embedding too ({span([r.final_tokens / sizes.both(r)[1] for r in every], '.1f')} "
            "over every run): the floor of 10 holds for the first count only. Passes: the loader's count at the "
            "last logged train step (metrics.jsonl's `epoch`). Seeds: finished, for the curve with the fewest of those "
            "that have run.", ""]
    if not flagged:
        out.append(f"Every one of the {len(every)} finished runs ends at {rules}.")
    else:
        shown = "; ".join(f"{k} ({', '.join(v)})" for k, v in list(flagged.items())[:12])
        more = f"; and {len(flagged) - 12} more" if len(flagged) > 12 else ""
        out.append(f"**{len(flagged)} of the {len(every)} finished runs break the proxy's rules** ({rules}): "
                   f"{shown}{more}.")
    out += corpus_lines(res.loaded[0])
    paper = load_config(FIGURES["5"].config("baseline"))
    tokens = paper.train.steps * paper.train.global_batch * paper.data.seq_len
    out += ["", f"The paper's Llama-0.12B sees {tokens / proxy.compute_params(paper):.0f} tokens per compute parameter "
            f"({tokens / 1e9:.1f}B tokens; docs/paper.md §3.1, §3.6).", ""]
    return out


def corpus_lines(run: Run) -> list[str]:
    counts = proxy.corpus_split_tokens(run.cfg)
    if counts is None:  # another corpus, not prepared here
        return []
    train, val = counts
    read = eval_read(run)
    how = "the first " if read.sample == "prefix" else ""
    return ["", f"The training corpus holds {train:,} tokens ({run.cfg.data.dir}), its validation split {val:,}, of "
            f"which each evaluation reads {how}{read.targets:,} (the eval set above)."]


def write_page(plan: Plan, where: dict, page: Path, cpu: dict[str, float], wiki: str, rebuild: str) -> None:
    """`cpu`: CPU seconds per run directory name (repro/runner.py, CpuLedger). `rebuild`: the command that writes this
    page again from its runs' archive (repro/results.py, rebuild_command).
    The plots go to img/<the page's name>/ beside it, so two pages (v3's and v2's) keep their own."""
    page = Path(page)
    img_dir = page.parent / "img" / page.stem
    res = Results(plan, where, wiki)
    body, orderings = [], []
    for comp in plan.comparisons:
        body += section(res, comp, img_dir, orderings)
        if not res.unread(comp):  # a grid not run yet is its one line
            body += source_table(res, comp)
    text = [
        "# Results: a measured small-scale reproduction of Figures 1 and 5–9",
        "",
        "<!-- Written by `python -m repro.results` from the runs' config.yaml and metrics.jsonl, and rebuilt from "
        f"the archive by `{rebuild}`; edit repro/page.py, repro/first_screen.py, repro/reading.py and repro/sections.py, not this file. -->",
        "",
        *intro(res, cpu, rebuild),
        "",
        *scope(res, retuned_done(res)),
        "",
        *([*labels, ""] if (labels := plan_labels(res)) else []),
        *([*wiki, ""] if (wiki := wiki_methods(res)) else []),
        "## The reading in plain words",
        "",
        *plain_reading(res),
        "## The proxy",
        "",
        *proxy_why(),
        "",
        *proxy_section(res),
        "## The count",
        "",
        *count_section(res, orderings),
        *(["## The horizon", "", *horizon_why(), "", *horizon_section(res, img_dir)] if horizon_families(res) else []),
        *(["## The magnitudes only a Norm reads", "", *magnitudes] if (magnitudes := magnitudes_section(res, img_dir))
          else []),
        "## The comparisons",
        "",
        *body,
    ]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(share_plots(page, "\n".join(text).rstrip() + "\n"))


def page_version(stem: str) -> tuple[str, float]:
    """(its series, its version): results_v3 is (results, 3); a page without _v<N> is its series' newest."""
    m = re.fullmatch(r"(.+)_v(\d+)", stem)
    return (m.group(1), int(m.group(2))) if m else (stem, float("inf"))


def share_plots(page: Path, text: str) -> str:
    """`text` with each plot that an earlier page of the series already holds, byte for byte, linked there and
    its own copy removed, so two pages never store the same image. An earlier page is frozen, so its plots stay."""
    series, version = page_version(page.stem)
    earlier = sorted((d for d in (page.parent / "img").glob(f"{series}_v*")
                      if d.is_dir() and page_version(d.name)[0] == series and page_version(d.name)[1] < version),
                     key=lambda d: page_version(d.name)[1])
    held = {}
    for d in reversed(earlier):  # the oldest copy wins
        held.update({f.read_bytes(): f"img/{d.name}/{f.name}" for f in sorted(d.glob("*.png"))})

    def link(m: re.Match) -> str:
        own = page.parent / m.group(1)
        shared = held.get(own.read_bytes()) if own.is_file() else None
        if shared is None:
            return m.group(0)
        own.unlink()
        return f"]({shared})"

    return re.sub(rf"\]\((img/{re.escape(page.stem)}/[^)]+\.png)\)", link, text)


def intro(res: Results, cpu: dict[str, float], rebuild: str) -> list[str]:
    # The budget is split by where each run came from (repro/budget.py): a total alone would count runs this page
    # reuses, or no longer reads, as if trained for it.
    _, past = past_page(res)
    return [
        f"Every number below comes from {len(res.loaded)} finished runs ({seeds_per_curve(res)} per curve) of the "
        f"CPU proxy, written by `python -m repro.results`. {budget_sentences(res, cpu, past.name, past.archive)} "
        f"This page is rebuilt from the runs' archive by `{rebuild}`. Deltas are *ours − reference* in the final validation loss (the eval set "
        "below), paired by seed, with a 95 % Student-t interval; WikiText-2 is its test set, never trained on, "
        "evaluated with the same final weights. The MDE is the smallest true delta these seeds resolve with 80 % "
        "power at 95 %: (t₀.₉₇₅ + t₀.₈₀, n − 1 degrees of freedom) · sd / √n of the paired deltas. A delta is "
        "*resolved* when its interval excludes 0. Each verdict says what the interval can say about the paper's "
        "value: resolved with the paper's sign, a delta whose interval holds the paper's value *reproduces the size* "
        "only when the interval's half-width is at most half the paper's |Δ|, and is *consistent with the paper* "
        "when it is wider (ours/paper printed for both); it is *right sign, larger* or *right sign, smaller* when the "
        "interval does not hold the paper's value; "
        "resolved with the opposite sign it *contradicts* the paper. Unresolved, an interval that excludes the "
        "paper's value means *the paper's size is ruled out here*; one that holds it *cannot tell at this power "
        "(uninformative)* when the MDE exceeds the paper's |Δ| (not evidence of no effect), and is *undecided at "
        "this power* when it does not. A row that is the same runs as another is shown once; runs shared between "
        "comparisons are marked †.",
    ]


def seeds_per_curve(res: Results) -> str:
    """"4 seeds", or "6–20 seeds" where curves were trained to different seed counts (the central claims' more)."""
    counts = [n for comp in res.plan.comparisons for c in comp.curves if (n := len(res.runs_of(comp, c)))]
    if not counts:
        return f"{res.plan.seeds} seeds"
    return f"{span(counts, 'd')} seed{'' if max(counts) == 1 else 's'}"


def scope(res: Results, retuned: bool = False) -> list[str]:
    """The eval set the runs read (repro/sources.py: from the runs), and what of today's reading the runs cannot do
    yet (what needs new runs; best lr against best lr until `retuned`, the headline's lr grids all run); v2's runs
    read the val split's first tokens (one source)."""
    rules = ("each design of an lr grid at its best lr, picked on the pilot's seeds; labels that say when an interval "
             "fixes the paper's size (a half-width at most half its |Δ|), excludes its value or cannot tell; a count "
             "over linearly independent rows and lr picks with Holm and Benjamini–Hochberg corrections; bootstrap "
             "intervals on every multiplier and crossing; each row's seeds fixed from its pilot; WikiText-2 beside "
             "every claim")
    lines = composition_lines(res)
    item5 = "" if retuned else " and best lr against best lr for the headline"
    said, apart = (lines[0], []) if len(lines) == 1 else ("The runs read different eval sets (below).", ["", *lines])
    if res.loaded and all_prefix(res):
        return [f"**Still the v2 runs, read with today's rules.** {said} What is new is how the same runs are read: "
                f"{rules}. The proxy now evaluates on the training mixture "
                "(`train.eval_sample: mixture` in repro/configs/tiny.yaml: the whole validation split, a loss per "
                "source); these runs predate it, and their deltas cannot be paired with runs that read it. Not run "
                "yet: the runs on that eval set, the seeds that would power the central claims (the count below "
                f"says how many){item5}.", *apart]
    todo = []
    short = short_of_power(res)
    if short:
        todo.append(f"the seeds the pilot rule asks for {len(short)} of the {len(CENTRAL) + len(horizon_heads(res))} "
                    f"claims above the tables ({'; '.join(short)}; the first table gives each its seeds and the "
                    "rule's n)")
    if not retuned:
        todo.append("best lr against best lr for the headline")
    powered = ("" if short else f" Every one of the {len(CENTRAL) + len(horizon_heads(res))} claims above the tables "
               "has the seeds its pilot fixes by the rule (the power section).")
    return [f"**The eval set.** {said}", *apart, "",
            f"Read with today's rules (every page is rebuilt with them): {rules}." + powered
            + (f" Not done yet: {' and '.join(todo)}." if todo else "")]


def section(res: Results, comp: Comparison, img_dir: Path, orderings: list[bool]) -> list[str]:
    if comp.kind == "lr_grid":
        return lr_grid_section(res, comp, img_dir)
    if comp.kind == "ladder":
        return ladder_section(res, comp, img_dir)
    lines, same = panel_section(res, comp, img_dir)
    if same is not None:
        orderings.append(same)
    return lines


def proxy_why() -> list[str]:
    dense, moe = proxy.DENSE, proxy.MOE
    return [
        "Each run is a figure's own config (its strategy, optimizer, schedule, lr and weight decay) with "
        "[repro/configs/tiny.yaml](../configs/tiny.yaml) layered over it by `repro.reproduce --scale tiny`: "
        "the built-in public-domain English corpus (Shakespeare and the King James Bible, offline) in a trained "
        f"BPE, sequences of {proxy.SEQ_LEN}, heads of {proxy.HEAD_DIM}. Llama-0.12B's proxy is {dense.label} "
        f"and MoE-0.5B's {moe.label} with top-{max(1, moe.n_experts // 4)} routing, both eager fp32. "
        f"Every run's batch and steps are sized by its tokens per parameter (repro/proxy.py): "
        f"{proxy.TOKENS_PER_PARAM:g} × N tokens, N the baseline strategy's compute parameters (without the input "
        "embedding) at the run's shape, "
        f"in ≥ {proxy.MIN_STEPS:,} steps with a warmup of {proxy.WARMUP_FRAC:.0%} of them (the paper does not "
        "state its warmup, docs/paper.md §3.1; this repository's paper-size configs use 1,000 of 20,000 steps), so "
        "every strategy of a comparison sees the same tokens. The paper's lr, schedule shape and weight "
        "decay are kept; only Fig. 1's grid retunes the lr. Fig. 6's ladder is "
        + ", ".join(s.label for s in proxy.DENSE_LADDER) + "; Fig. 7's is "
        + ", ".join(s.label for s in proxy.MOE_LADDER) + ", each rung at the same tokens per parameter.",
    ]


def horizon_why() -> list[str]:
    from repro.comparisons import HORIZONS
    return [
        "The paper trains 100–129 tokens per compute parameter (docs/paper.md §3.1, §3.6), the proxy 10.5, and the "
        "paper's own curves reorder late. The horizon rungs train the headline comparison at "
        + ", ".join(f"{h}" for h in HORIZONS) + " × the proxy's tokens, by more steps of the same batch (the warmup, "
        "evaluations and checkpoints keep their share of the steps), each horizon with its own lr grid. They run on "
        "the ladders' smallest rungs, dense d32 L4 compiled fp32 and MoE d32 L2 E8 eager, which read the corpus 2.5 "
        "and 2.7 times at the longest horizon (the dense headline rung would read it 7.5 times; repro/comparisons.py, "
        "HORIZONS, says why). A verdict *holds* "
        "when the longest horizon's delta is resolved with the shortest's sign and the two differ by less than "
        "Welch's 95 % interval; it *grows* or *shrinks* when they differ by more, *fades* when the longest is "
        "unresolved and *reverses* when it is resolved with the other sign.",
    ]

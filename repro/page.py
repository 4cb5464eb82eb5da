"""docs/results.md, written from the runs' config.yaml and metrics.jsonl by `python -m scripts.results`.

Every number in the page is computed here from the runs; the paper's numbers beside them are docs/paper.md §4's, v1's
are repro/v1.py's. A difference is "ours − reference" at the last evaluation (the final weights), paired by seed,
with a 95 % Student-t interval over seeds and the MDE of its seeds (repro/stats.py); the verdict sets sign and size
beside the paper's. The page: the proxy (per comparison: tokens per parameter, steps, passes, seeds), the reading
(tally, chance, v1 against v2), then each comparison's section (repro/sections.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from config import load_config
from repro import proxy
from repro.comparisons import Comparison, Plan
from repro.figures import FIGURES
from repro.measure import Results, Row
from repro.runs import Run
from repro.sections import ladder_section, lr_grid_section, panel_section
from repro.stats import ALPHA, FACTOR, NOISE, VERDICTS, at_least, fmt, verdict_class
from repro.v1 import V1_DELTAS, V1_SUMMARY


class Sizes:
    """Compute parameters (repro.proxy.compute_params) of each model config, built once on the meta device."""

    def __init__(self):
        self._n: dict[str, int] = {}

    def __call__(self, run: Run) -> int:
        key = json.dumps(run.cfg.to_dict()["model"], sort_keys=True)
        if key not in self._n:
            self._n[key] = proxy.compute_params(run.cfg)
        return self._n[key]


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
    sizes, flagged, seen = Sizes(), {}, set()
    out = ["| comparison | seeds | runs | tokens per parameter | steps | passes over the data |", "|---|---|---|---|---|---|"]
    for comp in res.plan.comparisons:
        per_curve = [res.runs_of(comp, c) for c in comp.curves]
        runs = list({r.path: r for rs in per_curve for r in rs.values()}.values())
        if not runs:
            out.append(f"| {comp.title} | 0 of {res.plan.seeds} | 0 | – | – | – |")
            continue
        passes = [r.passes for r in runs if r.passes is not None]
        out.append(f"| {comp.title} | {min(len(rs) for rs in per_curve)} of {res.plan.seeds} | {len(runs)} | "
                   f"{span([r.final_tokens / sizes(r) for r in runs], '.1f')} | "
                   f"{span([r.final_eval['step'] for r in runs], ',')} | "
                   f"{span(passes, '.2f') if passes else '–'} |")
        for r in runs:
            if r.path not in seen:
                seen.add(r.path)
                if p := problems(r, sizes(r)):
                    flagged[r.path.name] = p
    rules = (f"≥ {proxy.MIN_TOKENS_PER_PARAM:g} tokens per parameter, ≥ {proxy.MIN_STEPS:,} steps and "
             f"≤ {proxy.MAX_PASSES} passes over the training data")
    if not seen:
        return ["No run has finished yet.", ""]
    out += ["", "Tokens per parameter: the tokens of the final evaluation over N, the run's compute parameters "
            "(without the input embedding; for MoE all experts; docs/paper.md §3.6). Passes: the loader's count at the "
            "last logged train step (metrics.jsonl's `epoch`). Seeds: finished, for the curve with the fewest.", ""]
    if not flagged:
        out.append(f"Every one of the {len(seen)} finished runs ends at {rules}.")
    else:
        shown = "; ".join(f"{k} ({', '.join(v)})" for k, v in list(flagged.items())[:12])
        more = f"; and {len(flagged) - 12} more" if len(flagged) > 12 else ""
        out.append(f"**{len(flagged)} of the {len(seen)} finished runs break the proxy's rules** ({rules}): "
                   f"{shown}{more}.")
    out += corpus_lines(res.loaded[0])
    paper = load_config(FIGURES["5"].config("baseline"))
    tokens = paper.train.steps * paper.train.global_batch * paper.data.seq_len
    out += ["", f"The paper's Llama-0.12B sees {tokens / proxy.compute_params(paper):.0f} tokens per compute parameter "
            f"({tokens / 1e9:.1f}B tokens; docs/paper.md §3.1, §3.6).", ""]
    return out


def corpus_lines(run: Run) -> list[str]:
    from data.shards import DataError, load_meta
    try:
        meta = load_meta(run.cfg.data.dir)
    except (DataError, FileNotFoundError):  # the runs' data is not prepared here (a page rewritten from archived runs)
        return []
    return ["", f"The training corpus holds {meta.splits['train'].tokens:,} tokens ({run.cfg.data.dir}), its "
            f"validation split {meta.splits['val'].tokens:,}, of which each evaluation reads the first "
            f"{min(run.cfg.train.eval_tokens, meta.splits['val'].tokens):,}."]


def reading(res: Results, orderings: list[bool]) -> list[str]:
    rows = [r for r in res.rows if r.same_as is None]
    counted = [r for r in rows if r.counted]
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(verdict_class(r.delta, r.paper), []).append(r)
    dupes = len(res.rows) - len(rows)
    again = f" ({dupes} more {'row is' if dupes == 1 else 'rows are'} the same runs as another, shown once)"
    out = [f"Of {len(rows)} distinct deltas" + (again if dupes else "") + ": "
           + "; ".join(f"{len(groups[k])} {k}" for k in VERDICTS if k in groups) + ".", ""]
    for k in VERDICTS[:6]:
        if k in groups:
            out.append(f"- **{k}**: " + "; ".join(
                f"{r.title} ({fmt(r.delta, True).split(' [')[0]}" + (f", MDE {r.delta.mde:.4f}" if k == NOISE else "")
                + (f", paper {r.paper:+.4f}" if r.paper is not None else "") + ")" for r in groups[k]))
    resolved = sum(r.delta.resolved for r in counted)
    m = len(counted)
    if m:
        out += ["", f"Chance alone: with {m} distinct deltas tested at 95 %, {ALPHA * m:.2f} would come out resolved "
                f"if every true delta were 0; {resolved} did, which {m} independent zero deltas would give with "
                f"probability {at_least(resolved, m):.2g} (binomial). The deltas share reference runs and are not "
                "independent, so read that as a scale, not a test."]
    if not counted:  # every curve has one seed so far: no delta has an interval, and a tally of 0 of 0 says nothing
        return out + ["", "No delta has two seeds yet: there is nothing to tally against the paper's signs.", ""]
    signed = [r for r in counted if r.paper is not None]
    both = [r for r in counted if r.delta.resolved and r.wiki is not None]
    agree = [r for r in both if (r.delta.mean > 0) == (r.wiki.mean > 0)]
    out += ["", f"Resolved or not, {sum((r.delta.mean > 0) == (r.paper > 0) for r in signed)} of the {len(signed)} "
            f"mean deltas have the paper's sign. On WikiText-2, {len(agree)} of the {len(both)} resolved deltas keep "
            f"their sign ({sum(r.wiki.resolved for r in agree)} of them resolved there too), and {sum(orderings)} of "
            f"the {len(orderings)} comparisons of three or more curves order them as the validation loss does.", ""]
    return out + versus_v1(res)


def versus_v1(res: Results) -> list[str]:
    """v1's summary as it was, then which of its deltas persist here (same sign, resolved in both) and which fade."""
    kinds: dict[str, list[str]] = {}
    for r in res.rows:
        old = V1_DELTAS.get((r.comparison.key, r.label))
        if old is None or not r.counted:
            continue
        now = r.delta
        if old.resolved and now.resolved:
            kind = "persist" if (old.mean > 0) == (now.mean > 0) else "reverse"
        elif old.resolved:
            kind = "fade"
        else:
            kind = "appear" if now.resolved else "stay within noise"
        kinds.setdefault(kind, []).append(f"{r.title} ({old.mean:+.4f} → {now.mean:+.4f})")
    out = ["### v2 against v1", "", V1_SUMMARY, ""]
    if not kinds:
        return out + ["No comparison of v1 has finished runs here yet.", ""]
    text = {"persist": "resolved in both with the same sign", "fade": "resolved in v1, within noise now",
            "reverse": "resolved in both with opposite signs", "appear": "within noise in v1, resolved now",
            "stay within noise": "within noise in both"}
    n = sum(map(len, kinds.values()))
    out.append(f"Of the {n} deltas measured in both (v1 → v2):")
    out += [f"- **{k}** ({text[k]}): " + "; ".join(kinds[k]) for k in text if k in kinds]
    return out + [""]


def write_page(plan: Plan, where: dict, page: Path, cpu_seconds: float, wiki: str) -> None:
    page = Path(page)
    img_dir = page.parent / "img" / "results"
    res = Results(plan, where, wiki)
    body, orderings = [], []
    for comp in plan.comparisons:
        body += section(res, comp, img_dir, orderings)
    text = [
        "# Results: a measured small-scale reproduction of Figures 1 and 5–9",
        "",
        "<!-- Written by `python -m scripts.results` from the runs' metrics.jsonl; edit repro/page.py and "
        "repro/sections.py, not this file. -->",
        "",
        f"Every number below comes from {len(res.loaded)} finished runs ({plan.seeds} seeds per curve) of the CPU "
        f"proxy, written by `python -m scripts.results`, which ran them in **{cpu_seconds / 3600:.2f} CPU-hours** "
        "(user + system time of every run's process, summed over every invocation). Deltas are *ours − reference* "
        "in the final validation loss (held-out documents of the training corpus), paired by seed, with a 95 % "
        "Student-t interval; WikiText-2 is its test set, never trained on, evaluated with the same final weights. "
        "The MDE is the smallest true delta these seeds resolve with 80 % power at 95 %: (t₀.₉₇₅ + t₀.₈₀, n − 1 "
        "degrees of freedom) · sd / √n of the paired deltas. A delta is *resolved* when its interval excludes 0. "
        f"A resolved delta of the paper's sign *reproduces* it when the paper's value lies inside the interval or "
        f"ours/paper is within [{1 / FACTOR:g}, {FACTOR:g}]; outside both it is *right sign, larger* or *right sign, "
        "smaller*. A row that is the same runs as another is shown once; runs shared between comparisons are "
        "marked †.",
        "",
        "## The proxy",
        "",
        *proxy_why(),
        "",
        *proxy_section(res),
        "## Reading",
        "",
        *reading(res, orderings),
        "## The comparisons",
        "",
        *body,
    ]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(text).rstrip() + "\n")


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
        "[configs/proxy/tiny.yaml](../configs/proxy/tiny.yaml) layered over it by `scripts.reproduce --scale tiny`: "
        "the built-in public-domain English corpus (Shakespeare and the King James Bible, offline) in a trained "
        f"BPE, sequences of {proxy.SEQ_LEN}, heads of {proxy.HEAD_DIM}. Llama-0.12B's proxy is {dense.label} "
        f"and MoE-0.5B's {moe.label} with top-{max(1, moe.n_experts // 4)} routing, both eager fp32. "
        f"Every run's batch and steps are sized by its tokens per parameter (repro/proxy.py): "
        f"{proxy.TOKENS_PER_PARAM:g} × N tokens, N the baseline strategy's compute parameters at the run's shape, "
        f"in ≥ {proxy.MIN_STEPS:,} steps with a warmup of {proxy.WARMUP_FRAC:.0%} of them (the paper's 1,000 of "
        "20,000), so every strategy of a comparison sees the same tokens. The paper's lr, schedule shape and weight "
        "decay are kept; only Fig. 1's grid retunes the lr. Fig. 6's ladder is "
        + ", ".join(s.label for s in proxy.DENSE_LADDER) + "; Fig. 7's is "
        + ", ".join(s.label for s in proxy.MOE_LADDER) + ", each rung at the same tokens per parameter.",
    ]

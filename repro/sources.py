"""What the runs' evaluations read, and the loss per source, for repro/pages/results.md.

The eval set's composition comes from the runs. A run with train.eval_sample=mixture logs in every eval record the
target tokens it read (`val_tokens`; per source `val_tokens/<source>`) and each source's weight in its val_loss
(`val_share/<source>`: the source's share of the training tokens), beside `val_loss/<source>` (data/evalset.py). A run
that evaluated a prefix of the val split (v2's runs) logs none of them: what it read is computed the way its
evaluation read it, the first eval_tokens of the val split in stored order, per source from data/composition.py (the
prepared dir, or the proxy corpus's counts measured when its runs were made: repro/proxy.py, corpus_composition).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from repro import proxy
from repro.comparisons import Comparison
from repro.measure import Results
from runs import Run
from repro.stats import fmt


@dataclass(frozen=True)
class EvalRead:
    """What one evaluation of a run reads of its training data's val split."""
    sample: str  # train.eval_sample: prefix | mixture
    seq_len: int
    targets: int  # target tokens
    tokens: tuple[tuple[str, int], ...]  # per source (empty: the data names no sources, or they are not known here)
    shares: tuple[tuple[str, float], ...]  # per source: its share of the training tokens (a mixture's weights)
    split: Optional[int]  # the val split's tokens (None: not known here)
    first: Optional[str] = None  # a prefix: the source whose documents the split stores first
    every_window: bool = False  # a mixture: it reads every window of every source's val documents


def eval_read(run: Run) -> EvalRead:
    cfg, last = run.cfg, run.final_eval or {}
    L, budget, sample = cfg.data.seq_len, cfg.train.eval_tokens, cfg.train.eval_sample
    split = (proxy.corpus_split_tokens(cfg) or (None, None))[1]
    comp = proxy.corpus_composition(cfg)
    if sample == "mixture":
        names = [k.split("/", 1)[1] for k in last if k.startswith("val_share/")]
        tokens = tuple((n, int(last[f"val_tokens/{n}"])) for n in names)
        every = comp is not None and dict(tokens) == {n: max(0, (t - 1) // L) * L
                                                      for n, t in zip(comp.names, comp.val_tokens)}
        return EvalRead(sample, L, int(last.get("val_tokens", 0)), tokens,
                        tuple((n, float(last[f"val_share/{n}"])) for n in names), split, every_window=every)
    from data.evalset import prefix_composition
    targets = min(budget, split - 1) // L * L if split else budget // L * L
    if comp is None:
        return EvalRead(sample, L, targets, (), (), split)
    return EvalRead(sample, L, targets, tuple(zip(comp.names, prefix_composition(comp, L, budget))),
                    tuple(zip(comp.names, comp.shares)), split, first=comp.names[comp.val_runs[0][0]])


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _per_source(pairs, total: int) -> str:
    return ", ".join(f"{n} {t:,} ({pct(t / total)})" for n, t in pairs) if total else ""


def read_sentence(r: EvalRead) -> str:
    """What each evaluation reads, in a sentence or two of the page."""
    of = f" of the validation split's {r.split:,}" if r.split else " of the validation split"
    shares = " and ".join(f"{n} {pct(s)}" for n, s in r.shares)
    if r.sample == "prefix":
        text = (f"Each evaluation reads the first {r.targets:,} tokens{of}, in stored order"
                + (f", where its {r.first} documents come first" if r.first else "") + ".")
        if not r.tokens:
            return text
        text += f" By source: {_per_source(r.tokens, r.targets)}, though the model trains on {shares} of its tokens."
        alone = [n for n, t in r.tokens if t == r.targets]
        if alone and len(r.tokens) > 1:
            text += f" These runs' validation loss is on {alone[0]} alone."
        return text
    whole = " (every window of it)" if r.every_window else ""
    text = (f"Each evaluation reads {r.targets:,} tokens{of}{whole} as windows of {r.seq_len}, each source's documents "
            "in a fixed shuffled order, the same in every run (data/evalset.py)")
    if not r.tokens:
        return text + "; the data names no sources."
    return (text + f": {_per_source(r.tokens, r.targets)}. The validation loss weighs each source's loss by its share "
            f"of the training tokens ({shares}): it is the loss of the training mixture, and each comparison gives "
            "the loss per source beside it.")


def composition_lines(res: Results) -> list[str]:
    """The page's statement of the eval set, read from the runs; runs that read different sets are listed apart."""
    reads: dict[EvalRead, int] = {}
    for run in res.loaded:
        r = eval_read(run)
        reads[r] = reads.get(r, 0) + 1
    if len(reads) <= 1:
        return [read_sentence(r) for r in reads]
    return (["**The runs read different eval sets**, and a delta between runs of different eval sets is not a "
             "comparison:", ""] + [f"- {n} runs: {read_sentence(r)}" for r, n in reads.items()] + [""])


def all_prefix(res: Results) -> bool:
    """Whether every run evaluated a prefix of the val split (v2's runs)."""
    return all(r.cfg.train.eval_sample == "prefix" for r in res.loaded)


def sources_of(res: Results) -> list[str]:
    """The sources the runs give a loss for (val_share/<source> in their final evals), in the order first logged."""
    out: list[str] = []
    for run in res.loaded:
        out += [k.split("/", 1)[1] for k in (run.final_eval or {}) if k.startswith("val_share/")
                and k.split("/", 1)[1] not in out]
    return out


def source_table(res: Results, comp: Comparison) -> list[str]:
    """The comparison's final losses per source beside the mixture's (mean ± sd over seeds), then its deltas per
    source (paired by seed, 95 % interval); nothing when no run logged per-source losses."""
    names = sources_of(res)
    if not names:
        return []
    metrics = ["val_loss", *(f"val_loss/{n}" for n in names)]
    out = ["| per source | mixture (val loss) | " + " | ".join(names) + " |", "|---" * (2 + len(names)) + "|"]
    for c in comp.curves:
        out.append(f"| {c.label} | " + " | ".join(fmt(res.final(comp, c, m)) for m in metrics) + " |")
    for row in res.rows_of(comp):
        if row.same_as:
            continue
        out.append(f"| Δ {row.ours.label} − {row.ref.label} | "
                   + " | ".join(fmt(res.delta(comp, row.ours, row.ref, m), True) for m in metrics) + " |")
    return ["Each source's loss beside the mixture's (final evaluation; losses mean ± sd over seeds, deltas paired by "
            "seed with their 95 % interval):", "", *out, ""]

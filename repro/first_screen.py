"""The results page's first screen, "The reading in plain words" (issue 52, item 7): one table of the claims the page
leads with — the horizon headlines, the paper's central claims, then the same-lr rows — each with its seeds and the n
the pilot rule asks for, its delta and interval, the paper's value, its label, whether it survives Holm and its
WikiText-2 delta; then short lines on what retuning and the horizon did, WikiText-2 over training, the tally by
label (a sign and a size apart), the count and the laws.
"""
from __future__ import annotations

from repro.horizon_section import families_read, horizon_brief
from repro.measure import Results, Row
from repro.over_training import lead_sentence, wiki_cells, wiki_course
from repro.proxy import TOKENS_PER_PARAM
from repro.reading import (CENTRAL, MDE_FLOOR, central_rows, count_sentence, distinct, family_contrasts, first,
                           holm_family, horizon_heads, horizon_name, row_plan, screen_claims, short_of_power,
                           survives_holm)
from repro.retuning import grid_edge, ladder_at_best_lr, retuning_words
from repro.sections import law_of, law_sentence
from repro.stats import (CONSISTENT, CONTRADICTS, FAR, LARGER, REPRODUCES, RULED_OUT, SMALLER, SUPPORTS, UNDECIDED,
                         UNINFORMATIVE, far, fmt, ratio, verdict_class)


def delta_text(r: Row) -> str:
    """"-0.0430 [-0.0847, -0.0013] against the paper's -0.0063" and what the label adds."""
    v, base = verdict_class(r.delta, r.paper), fmt(r.delta, True)
    if r.paper is None:
        return base
    base += f" against the paper's {r.paper:+.4f}"
    if v in (REPRODUCES, CONSISTENT):
        return base + f", ours/paper {ratio(r.delta, r.paper):.2f}" + (" (far from it)" if far(r.delta, r.paper)
                                                                        else "")
    if v in (LARGER, SMALLER):
        return base + f", {ratio(r.delta, r.paper):.2f}× the paper's, its value outside the interval"
    if v in (UNINFORMATIVE, UNDECIDED):
        return base + f", MDE {r.delta.mde:.4f}"
    return base


def label_cell(r: Row) -> str:
    """The label, with ours/paper where the interval holds the paper's value or sits wholly beyond it."""
    v = verdict_class(r.delta, r.paper)
    return f"{v} ({ratio(r.delta, r.paper):.2f}×)" if v in SUPPORTS else v


def wiki_cell(r: Row) -> str:
    """The WikiText-2 delta at the end, marked where a resolved delta flips its sign there, resolved too."""
    if r.wiki is None or r.wiki.n < 2:
        return "–"
    flips = r.delta.resolved and r.wiki.resolved and (r.delta.mean > 0) != (r.wiki.mean > 0)
    return fmt(r.wiki, True) + (", flips" if flips else "")


def claims_table(res: Results, kept: dict[int, bool]) -> list[str]:
    """One claim per row: its seeds and the rule's n, Δ [95 % CI], the paper's value, the label, Holm, WikiText-2."""
    out = ["| claim | seeds | the rule's n | Δ val [95 % CI] | paper | label | Holm | WikiText-2 Δ at the end |",
           "|---" * 8 + "|"]
    for name, r in screen_claims(res):
        if r is None or r.delta is None:
            out.append(f"| {name} | 0 | – | not measured yet | | | | |")
            continue
        plan = row_plan(res, r)
        holm = kept.get(id(first(res, r)))
        paper = f"{r.paper:+.4f}" if r.paper is not None else "–"
        out.append(f"| {name} | {r.delta.n} | {plan if plan is not None else 'no pilot yet'} | {fmt(r.delta, True)} | "
                   f"{paper} | {label_cell(r)} | {'–' if holm is None else 'survives' if holm else 'no'} | "
                   f"{wiki_cell(r)} |")
    return out


def retuning_lines(res: Results) -> list[str]:
    """For each central claim an lr grid measures: the lrs it picked, the same-lr delta and what retuning did."""
    out = []
    for name, r in central_rows(res):
        comp = r.comparison
        if comp.kind != "lr_grid" or not r.label.startswith("each at its best lr"):
            continue
        same = res.rows_of(comp)[0]
        out.append(f"- {name} ({picked(res, comp)}): at the same lr ({comp.grid.same}) {fmt(same.delta, True)}; "
                   f"{retuning_words(res, comp)}.{grid_edge(res, comp)}")
    return out


def picked(res: Results, comp) -> str:
    """An lr grid's lrs and each design's pick: "of 2e-3, 4e-3: unified 2e-3, baseline 4e-3"."""
    g = comp.grid
    return (f"of {', '.join(res.ran_lrs(comp))}: {g.ours} {res.best_lr(comp, g.ours)}, {g.reference} "
            f"{res.best_lr(comp, g.reference)}")


def horizon_lines(res: Results) -> list[str]:
    """For each horizon family: what the horizon did to the headline, and the lead inside its longest runs."""
    out = []
    for points in families_read(res):
        p = points[-1]
        inside = lead_sentence(res, f"at {p.tokens_per_param:.3g} tokens per compute parameter", p.best)
        said = " ".join(x for x in (horizon_brief(points), grid_edge(res, p.comp).strip(), inside) if x)
        if said:
            out.append(f"- {horizon_name(p.comp)}, best lrs {picked(res, p.comp)}. {said}")
    return out


def wiki_table(res: Results) -> list[str]:
    """WikiText-2 over training for each claim: at the end, at each run's minimum, where the minima fall, one pass."""
    rows = [(name, r) for name, r in screen_claims(res) if r is not None and r.delta is not None]
    if not rows:
        return []
    out = ["| claim | WikiText-2 Δ at the end | at each run's minimum | where the minima fall | at one pass |",
           "|---" * 5 + "|"]
    return out + [f"| {name} | {wiki_cells(wiki_course(res, r))} |" for name, r in rows]


# The tally's groups after the supported rows: (heading, what it holds, its labels).
GROUPS = (("Contradicted", "resolved, with the opposite sign", (CONTRADICTS,)),
          ("The paper's size ruled out", "unresolved, but the interval excludes the paper's value", (RULED_OUT,)),
          ("Not resolved at this scale", "the interval holds both 0 and the paper's value; an MDE above the paper's "
           "|Δ| means these seeds could not have seen its effect (uninformative, not a null)",
           (UNINFORMATIVE, UNDECIDED)))
SIZE_WORDS = {REPRODUCES: "reproduce the size", CONSISTENT: "consistent with the paper's value, too wide to fix its "
              "size", LARGER: "right sign, larger", SMALLER: "right sign, smaller"}


def ratio_span(rows: list[Row]) -> str:
    """The range of ours/paper over rows: "1.46× to 28.08×", or one value."""
    rs = sorted(ratio(r.delta, r.paper) for r in rows)
    return f"{rs[0]:.2f}×" if len(rs) == 1 else f"{rs[0]:.2f}× to {rs[-1]:.2f}×"


def supported_lines(rows: list[Row]) -> list[str]:
    """The supported rows count a sign: the line says how many of them are larger, smaller or only consistent with
    the paper's value, and how many reproduce its size, each with its ours/paper range, then lists them."""
    group = [r for r in rows if verdict_class(r.delta, r.paper) in SUPPORTS]
    if not group:
        return []
    by = {k: [r for r in group if verdict_class(r.delta, r.paper) == k] for k in SUPPORTS}
    split = "; ".join(f"{len(by[k])} {SIZE_WORDS[k]} ({ratio_span(by[k])} the paper's)" for k in SUPPORTS if by[k])
    out = [f"- **Supported** (resolved, with the paper's sign; {len(group)} of {len(rows)}). This counts a sign, not "
           f"a size. Of the {len(group)}: {split}" + ("." if by[REPRODUCES] else "; none reproduces the size.")]
    out += [f"  - *{k}* ({len(by[k])}): " + "; ".join(f"{r.title} ({delta_text(r)})" for r in by[k]) + "."
            for k in SUPPORTS if by[k]]
    return out


def tally_lines(rows: list[Row]) -> list[str]:
    out = supported_lines(rows)
    for head, what, classes in GROUPS:
        group = [r for r in rows if verdict_class(r.delta, r.paper) in classes]
        if group:
            out.append(f"- **{head}** ({what}; {len(group)} of {len(rows)}): "
                       + "; ".join(f"{r.title} ({delta_text(r)})" for r in group) + ".")
    farther = [r for r in rows if far(r.delta, r.paper)]
    if farther:
        out.append(f"- **Far from the paper's value** (a point estimate of the opposite sign, or more than {FAR:g}× "
                   f"or under 1/{FAR:g} of the paper's; {len(farther)} of {len(rows)}): "
                   + "; ".join(f"{r.title} ({ratio(r.delta, r.paper):.2f}×)" for r in farther) + ".")
    return out


def seeds_line(res: Results) -> str:
    """How many of the first screen's claims are short of the n their pilot fixes."""
    short, total = short_of_power(res), len(horizon_heads(res)) + len(CENTRAL)
    return (f"Seeds: each claim's finished seeds, and the n its pilot fixes by the rule: the fewest seeds, at least 4, "
            f"whose MDE at the pilot's paired sd is at most the larger of the paper's |Δ| and {MDE_FLOOR:g} (the power "
            f"section). {len(short)} of the {total} claims (the secondary rows aside) have fewer seeds than that n.")


def plain_reading(res: Results) -> list[str]:
    """Before any other table: what the proxy says of each of the paper's claims, in one table and short lines."""
    rows = distinct(res)
    if not rows:
        return ["No delta has two seeds yet: the proxy says nothing about the paper's claims so far.", ""]
    c = family_contrasts(res)
    out = [f"The claims the page leads with, one row each: the headline at the longest horizon run (the paper trains "
           f"100–129 tokens per compute parameter), the paper's central claims at the proxy's {TOKENS_PER_PARAM:g} "
           "tokens per compute parameter (each design at its best lr where an lr grid measures it), then the same "
           "claims at the paper's lr (secondary: the paper tuned its lr for the baseline).", "",
           *claims_table(res, survives_holm(c)), "",
           seeds_line(res) + f" Holm: the claim's own paired t test, corrected over {holm_family(c)} at 5 % "
           "family-wise (the count below).", ""]
    retuned = retuning_lines(res)
    if retuned:
        out += ["What retuning the lr did (each change paired by seed: best against best minus the same lr):", "",
                *retuned, ""]
    horizon = horizon_lines(res)
    if horizon:
        out += ["What the horizon did (the horizon section below):", "", *horizon, ""]
    wiki = wiki_table(res)
    if wiki:
        out += ["WikiText-2 over training for the same claims (the methods above say why):", "", *wiki, ""]
    out += tally_lines(rows) + ["", count_sentence(res, c)]
    for comp in res.plan.comparisons:
        law = law_of(res, comp) if comp.kind == "ladder" else None
        if law is not None and law.boot is not None:
            out += ["", law_sentence(comp, law) + ladder_at_best_lr(res, comp)]
    return out + [""]

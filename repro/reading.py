"""The results page's reading: first in plain words (which of the paper's claims the proxy supports, contradicts,
rules out in size, or cannot resolve, with the numbers, and the headline with each design at its best lr once those
runs exist), then the count behind it — the rows that are sums of others, each independent row's paired t test with
the Holm and Benjamini–Hochberg corrections, the seeds each central claim needs — and the previous page against this
one (v2 against v1, v3 against v2). Labels are repro/stats.py's, the basis repro/contrasts.py's, the tests
repro/significance.py's, the laws repro/laws.py's through repro/sections.py.
"""
from __future__ import annotations

from typing import Optional

from repro.comparisons import Comparison
from repro.contrasts import Contrasts, combination_text, contrasts
from repro.measure import PILOT_SEEDS, Results, Row
from repro.proxy import DENSE, MOE, TOKENS_PER_PARAM
from repro.horizon_section import horizon_families, horizon_points, horizon_trend
from repro.sections import (grid_edge, ladder_at_best_lr, law_of, law_sentence, lead_after_retuning, lead_at_shared_best,
                            shared_best)
from repro.sources import all_prefix
from repro.significance import benjamini_hochberg, holm, p_value, seeds_for
from repro.stats import (ALPHA, CONSISTENT, CONTRADICTS, FAR, LARGER, REPRODUCES, RULED_OUT, SMALLER, UNDECIDED,
                         UNINFORMATIVE, VERDICTS, far, fmt, ratio, stat, verdict_class)
from repro.variance import variance_lines
from repro.versions import BEST, V1, V2, V3, PastPage

# The paper's central claims: (what it is, comparison key, row label or its start). The paper compares designs each
# at a tuned lr (docs/paper.md §2.1; Fig. 1's second panel, §4.1), so where an lr grid measures a claim its central
# row is each design at its best lr; the same-lr rows follow it as SECONDARY.
CENTRAL = (("Dense unified vs baseline, the 0.12B proxy, each at its best lr", "fig6-best_lr", "each at its best lr"),
           ("MoE unified vs baseline, the 0.5B proxy, each at its best lr", "fig7-best_lr", "each at its best lr"),
           ("Fig. 1, without vs with scale vectors, each at its best lr", "fig1-lr_grid", "each at its best lr"),
           ("Muon, dense", "fig8-muon", "unified"), ("WSD, dense", "fig9-wsd", "unified"),
           ("Muon, MoE", "fig8-muon_moe", "unified"), ("WSD, MoE", "fig9-wsd_moe", "unified"))
SECONDARY = (("Dense unified vs baseline, the 0.12B proxy, at the paper's lr", "fig6-ladder", DENSE.label),
             ("MoE unified vs baseline, the 0.5B proxy, at the paper's lr", "fig7-ladder", MOE.label),
             ("Fig. 1, without vs with scale vectors at the same lr", "fig1-lr_grid", "same lr"))
MDE_FLOOR = 0.02  # a central claim's seeds aim at an MDE at or below the larger of the paper's |Δ| and this
# The headline at each design's best lr: (what it is, the lr grid's comparison key).
RETUNED = (("Dense unified vs baseline, each at its best lr", "fig6-best_lr"),
           ("MoE unified vs baseline, each at its best lr", "fig7-best_lr"))
RETUNED_SEEDS = 4  # the headline retuned: each design at three lrs at ≥ 4 seeds


def distinct(res: Results) -> list[Row]:
    """The rows measured over two or more seeds, each pair of runs once."""
    return [r for r in res.rows if r.counted]


def family(res: Results) -> list[Row]:
    """The multiple-comparison family: the distinct rows, and after each lr grid's rows the contrasts that pick its
    best lrs (repro/measure.py, grid_contrasts) where they are not a page row already; rows and contrasts whose
    vectors are sums of earlier ones leave the basis (repro/contrasts.py)."""
    rows = distinct(res)
    seen = {r.runs for r in rows} | {tuple((b, a) for a, b in r.runs) for r in rows}
    out = []
    for comp in res.plan.comparisons:
        out += [r for r in rows if r.comparison is comp]
        for r in res.grid_contrasts(comp):
            if r.runs not in seen and r.delta is not None and r.delta.n >= 2:
                out.append(r)
                seen.add(r.runs)
    return out


def family_contrasts(res: Results) -> Contrasts:
    """The family's basis and sums, the first screen's rows (the horizon headlines, CENTRAL and SECONDARY) tried
    first: a claim the page leads with gets a test of its own, where a chain of smaller rows could stand for it."""
    heads = horizon_heads(res) + central_rows(res, CENTRAL + SECONDARY)
    return contrasts(family(res), first=tuple(first(res, r) for _, r in heads))


def is_pick(r: Row) -> bool:
    """A contrast that picks an lr grid's best lr, not a page row (`family`)."""
    return r.label.endswith("(the lr pick)")


def central_rows(res: Results, claims=CENTRAL) -> list[tuple[str, Row]]:
    """Each claim that has its row, with that row (one that reads an earlier row's runs, as a grid's best-vs-best row
    does when both designs are best at the same lr, stands for it)."""
    out = []
    for name, key, label in claims:
        row = next((r for r in res.rows if r.comparison.key == key
                    and (r.label == label or r.label.startswith(label + " ("))), None)
        if row is not None:
            out.append((name, row))
    return out


def first(res: Results, r: Row) -> Row:
    """The page's first row with r's runs: the one the count and Holm's correction hold."""
    return r if r.same_as is None else next(x for x in res.rows if x.title == r.same_as)


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


def wiki_text(r: Row) -> str:
    """The same delta on WikiText-2 (never trained on), and whether a resolved delta keeps its sign there."""
    if r.wiki is None or r.delta is None or r.wiki.n < 2:
        return ""
    text = f"; on WikiText-2 {fmt(r.wiki, True)}"
    if r.delta.resolved and r.wiki.resolved and (r.delta.mean > 0) != (r.wiki.mean > 0):
        return text + ", **the sign flips, resolved both ways**"
    return text


def sign_flips(rows: list[Row]) -> list[Row]:
    """The rows resolved on the eval set and on WikiText-2 with opposite signs."""
    return [r for r in rows if r.delta is not None and r.wiki is not None and r.delta.resolved and r.wiki.resolved
            and (r.delta.mean > 0) != (r.wiki.mean > 0)]


# The plain reading's groups: (heading, the verdict classes it holds).
GROUPS = (("Supported", "resolved, with the paper's sign", (REPRODUCES, CONSISTENT, LARGER, SMALLER)),
          ("Contradicted", "resolved, with the opposite sign", (CONTRADICTS,)),
          ("The paper's size ruled out", "unresolved, but the interval excludes the paper's value", (RULED_OUT,)),
          ("Not resolved at this scale", "the interval holds both 0 and the paper's value; an MDE above the paper's "
           "|Δ| means these seeds could not have seen its effect (uninformative, not a null)",
           (UNINFORMATIVE, UNDECIDED)))


def plain_reading(res: Results) -> list[str]:
    """Before any table: what the proxy says of each of the paper's claims, in words and numbers."""
    rows = distinct(res)
    if not rows:
        return ["No delta has two seeds yet: the proxy says nothing about the paper's claims so far.", ""]
    holm_of = holm_verdicts(family_contrasts(res))
    out = horizon_lines(res, holm_of)
    out += ["The paper's central claims" + (f" at the proxy's {TOKENS_PER_PARAM:g} tokens per compute parameter"
                                            if out else "") + ", each one row of the tables below, each design at "
            "its best lr where an lr grid measures it:", ""]
    rows_of = dict(central_rows(res))
    planned = {c.key for c in res.plan.comparisons}
    out += [claim_line(res, name, rows_of.get(name), holm_of) for name, key, _ in CENTRAL if key in planned]
    secondary = central_rows(res, SECONDARY)
    if secondary:
        out += ["", "At the paper's lr, for each grid's claim (secondary: the paper tuned its lr for the baseline):",
                ""]
        out += [f"- {name}: {delta_text(r)}: **{verdict_class(r.delta, r.paper)}**"
                f"{holm_of.get(id(first(res, r)), '')}{wiki_text(r)}." for name, r in secondary]
    out.append("")
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
    out += ["", count_sentence(res, family_contrasts(res))]
    for comp in res.plan.comparisons:
        law = law_of(res, comp) if comp.kind == "ladder" else None
        if law is not None and law.boot is not None:
            out += ["", law_sentence(comp, law) + ladder_at_best_lr(res, comp)]
    return out + [""]


def horizon_lines(res: Results, holm_of: dict[int, str]) -> list[str]:
    """The headline at the longest horizon that has run, each design at its best lr (repro/horizon_section.py,
    horizon_section): its delta, label, Holm verdict and WikiText-2 delta, and what the horizon did to it; nothing
    before a horizon rung has run."""
    out = []
    for comps in horizon_families(res).values():
        points = [p for p in horizon_points(res, comps) if p.best is not None and p.best.delta is not None]
        if not points:
            continue
        p, g = points[-1], points[-1].comp.grid
        name = horizon_name(p.comp)
        lrs = (f"of {', '.join(res.ran_lrs(p.comp))}: {g.ours} {res.best_lr(p.comp, g.ours)}, {g.reference} "
               f"{res.best_lr(p.comp, g.reference)}")
        trend = horizon_trend(points)
        # Holm's verdict is the first row with these runs (best against best can be the same-lr row)
        shown = p.best if p.best.same_as is None else next(r for r in res.rows if r.title == p.best.same_as)
        out.append(f"- {name} unified vs baseline at {p.tokens_per_param:.3g} tokens per compute "
                   f"parameter, each at its best lr ({lrs}): {delta_text(p.best)}: "
                   f"**{verdict_class(p.best.delta, p.best.paper)}**{holm_of.get(id(shown), '')}{wiki_text(p.best)}."
                   + grid_edge(res, p.comp) + (f" {trend}" if trend else ""))
    if not out:
        return []
    return ["The headline at the longest horizon run (the paper trains 100–129 tokens per compute parameter; "
            "the horizon section below):", "", *out, ""]


def retuned_grids(res: Results) -> list[tuple[str, Comparison]]:
    """RETUNED's comparisons that the plan has."""
    comps = {c.key: c for c in res.plan.comparisons}
    return [(name, comps[key]) for name, key in RETUNED if key in comps]


def retuned_done(res: Results) -> bool:
    """Whether every RETUNED grid has its delta with each design at its best lr over RETUNED_SEEDS paired seeds."""
    rows = [res.rows_of(comp) for _, comp in retuned_grids(res)]
    return bool(rows) and all(len(r) == 2 and r[1].delta is not None and r[1].delta.n >= RETUNED_SEEDS for r in rows)


def claim_line(res: Results, name: str, r: Optional[Row], holm_of: dict[int, str]) -> str:
    """A central claim in one line: its delta, label, Holm verdict and WikiText-2 delta; a grid's best-vs-best row
    adds the lrs it picked, the same-lr delta and what retuning did to the lead."""
    if r is None:
        return f"- {name}: not measured yet (its runs have not finished)."
    head = f"- {name}"
    tail = ""
    comp = r.comparison
    if comp.kind == "lr_grid" and r.label.startswith("each at its best lr"):
        g, same = comp.grid, res.rows_of(comp)[0]
        head += (f" (of {', '.join(res.ran_lrs(comp))}: {g.ours} {res.best_lr(comp, g.ours)}, {g.reference} "
                 f"{res.best_lr(comp, g.reference)})")
        words = (lead_at_shared_best(g, same.delta) if shared_best(res, comp)
                 else lead_after_retuning(g, same.delta, r.delta))
        tail = f"; at the same lr ({g.same}) {fmt(same.delta, True)}: {words}.{grid_edge(res, comp)}"
    return (f"{head}: {delta_text(r)}: **{verdict_class(r.delta, r.paper)}**{holm_of.get(id(first(res, r)), '')}"
            f"{wiki_text(r)}" + (tail or "."))


def holm_verdicts(c: Contrasts) -> dict[int, str]:
    """For each basis row (by id), whether it survives Holm's correction over the page's family of basis rows."""
    _, by_holm, _ = tests_over(c)
    n, picks = len(c.basis), sum(map(is_pick, c.basis))
    over = f"the {n} basis rows" + (f" ({picks} of them {'an lr-grid pick' if picks == 1 else 'lr-grid picks'})"
                                    if picks else "")
    return {id(r): f"; {'survives' if keep else 'does not survive'} Holm over {over}"
            for r, keep in zip(c.basis, by_holm)}


def tests_over(c: Contrasts) -> tuple[list[float], list[bool], list[bool]]:
    """The basis rows' p values and their Holm and Benjamini–Hochberg rejections at 5 %."""
    p = [p_value(r.delta) for r in c.basis]
    return p, holm(p), benjamini_hochberg(p)


def count_sentence(res: Results, c: Contrasts) -> str:
    p, by_holm, by_bh = tests_over(c)
    resolved = [r for r in c.basis if r.delta.resolved]
    named = lambda keep: "; ".join(r.title for r, k in zip(c.basis, keep) if k) or "none"  # noqa: E731
    picks = sum(map(is_pick, c.basis + c.dependent))
    total = len(c.basis) + len(c.sums)
    counted = f"{total} distinct rows" + (
        f" and lr-grid picks ({total - picks} rows; {picks} picks: the contrasts that pick a grid's best lr, a design "
        "at its best lr against its runner-up)" if picks else "")
    return (f"Counting only what is measured once: {len(c.basis)} of the {counted} "
            f"are linearly independent (the other {len(c.sums)} are sums of them: the count below). Of those "
            f"{len(c.basis)}, {len(resolved)} resolve at 95 % one by one; {sum(by_holm)} "
            f"{'survives' if sum(by_holm) == 1 else 'survive'} Holm's correction for the family (5 % family-wise: "
            f"{named(by_holm)}) and {sum(by_bh)} Benjamini–Hochberg's (5 % false discoveries: {named(by_bh)}).")


def count_section(res: Results, orderings: list[bool]) -> list[str]:
    """The tally, the rows that are sums of others, each basis row's test, the power on the central claims, signs
    and WikiText-2, and the previous page against this one."""
    rows = [r for r in res.rows if r.same_as is None]
    counted = distinct(res)
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(verdict_class(r.delta, r.paper), []).append(r)
    dupes = len(res.rows) - len(rows)
    again = f" ({dupes} more {'row is' if dupes == 1 else 'rows are'} the same runs as another, shown once)"
    out = [f"Of {len(rows)} distinct deltas" + (again if dupes else "") + ": "
           + "; ".join(f"{len(groups[k])} {k}" for k in VERDICTS if k in groups) + ".", ""]
    if not counted:  # every curve has one seed so far: no delta has an interval, and a tally of 0 of 0 says nothing
        return out + ["No delta has two seeds yet: there is nothing to tally against the paper's signs.", ""]
    c = family_contrasts(res)
    out += basis_lines(c) + power_lines(res)
    signed = [r for r in counted if r.paper is not None]
    both = [r for r in counted if r.delta.resolved and r.wiki is not None]
    agree = [r for r in both if (r.delta.mean > 0) == (r.wiki.mean > 0)]
    out += [f"Resolved or not, {sum((r.delta.mean > 0) == (r.paper > 0) for r in signed)} of the {len(signed)} "
            f"mean deltas have the paper's sign. On WikiText-2, {len(agree)} of the {len(both)} resolved deltas keep "
            f"their sign ({sum(r.wiki.resolved for r in agree)} of them resolved there too), and {sum(orderings)} of "
            f"the {len(orderings)} comparisons of three or more curves order them as the validation loss does."]
    flips = sign_flips(counted)
    out += [(f"{len(flips)} resolved {'delta flips its' if len(flips) == 1 else 'deltas flip their'} sign on "
             f"WikiText-2, resolved there too: " + "; ".join(
                 f"{r.title} ({fmt(r.delta, True)}, WikiText-2 {fmt(r.wiki, True)})" for r in flips) + ".")
            if flips else "No resolved delta flips its sign on WikiText-2 with the flip resolved there.", ""]
    return out + versus_past(res)


def basis_lines(c: Contrasts) -> list[str]:
    p, by_holm, by_bh = tests_over(c)
    out = ["### Independent rows and the multiple-comparison count", "",
           f"Each row is a vector over the curves' seed-mean losses (+1 ours, −1 its reference); a row joins the "
           f"basis when it raises the rank, the first screen's claims first, then the rest in page order "
           f"(repro/contrasts.py). {len(c.basis)} rows form the basis"
           + (", and these are sums of basis rows, left out of the count:" if c.sums
              else "; no row is a sum of others.")]
    out += [f"- *{r.title}* = {combination_text(terms)}" for r, terms in c.sums]
    out += ["", f"Each basis row's two-sided paired t test (t = mean / (sd / √n), n − 1 degrees of freedom); Holm's "
            f"step-down keeps the family-wise error at {ALPHA:.0%} under any dependence, Benjamini–Hochberg the "
            f"expected share of false discoveries at {ALPHA:.0%} (for independent or positively dependent tests: "
            "rows that share a reference run are correlated). The basis rows are not independent either way.", "",
            "| row | Δ val [95 % CI] | p | resolved | Holm 5 % | BH 5 % |", "|---|---|---|---|---|---|"]
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    out += [f"| {r.title} | {fmt(r.delta, True)} | {pv:.2g} | {yes(r.delta.resolved)} | {yes(h)} | {yes(b)} |"
            for r, pv, h, b in zip(c.basis, p, by_holm, by_bh)]
    return out + [""]


def target_mde(r: Row) -> float:
    """The MDE a central claim needs, the larger of the paper's |Δ| and MDE_FLOOR."""
    return max(abs(r.paper), MDE_FLOOR) if r.paper is not None else MDE_FLOOR


def horizon_name(comp: Comparison) -> str:
    """A horizon rung's model and shape, capitalized: "Dense (d32 L4)"."""
    name = comp.title.split(" at ")[0].removeprefix("The horizon, ")
    return name[0].upper() + name[1:]


def horizon_heads(res: Results) -> list[tuple[str, Row]]:
    """Each horizon family's headline: its longest rung read, each design at its best lr (the page's first claims)."""
    out = []
    for comps in horizon_families(res).values():
        points = [p for p in horizon_points(res, comps) if p.best is not None and p.best.delta is not None]
        if points:
            p = points[-1]
            out.append((f"{horizon_name(p.comp)} at {p.tokens_per_param:.3g} tokens per compute parameter, each at "
                        "its best lr", p.best))
    return out


def short_of_power(res: Results) -> list[str]:
    """The claims of the page's first screen (the horizon headlines and CENTRAL) whose seeds do not yet give an MDE
    at or below their target, or that have no two seeds."""
    rows = dict(central_rows(res))
    weak = lambda r: r is None or r.delta is None or r.delta.n < 2 or r.delta.mde > target_mde(r)  # noqa: E731
    return ([name for name, r in horizon_heads(res) if weak(r)]
            + [name for name, _, _ in CENTRAL if weak(rows.get(name))])


def power_lines(res: Results) -> list[str]:
    """The seeds each central claim needs for an MDE at or below max(|paper Δ|, MDE_FLOOR), from its paired sd."""
    rows = central_rows(res)
    if not rows:
        return []
    out = ["### Power on the central claims", "",
           f"The seeds each central claim would need for an MDE at or below the larger of the paper's |Δ| and "
           f"{MDE_FLOOR:g}, solved from MDE = (t₀.₉₇₅ + t₀.₈₀, n − 1 degrees of freedom) · sd / √n with the paired sd "
           "these runs measured (itself a rough estimate from so few seeds). A row short of its target trains more "
           "seeds of its two curves alone: `python -m repro.results --seeds N --only '<comparison>/<curve>' …`. "
           f"Each row's n is fixed from its pilot, the first {PILOT_SEEDS} seeds, before its final runs: the fewest "
           f"seeds (at least {PILOT_SEEDS}) whose MDE at the pilot's paired sd meets the target. The row then trains "
           "exactly n, whatever its later deltas say, so its interval keeps its nominal 95 % (a rule that stops when "
           "the sd looks low would not). A grid's claim is read with each design at its best lr, picked on the "
           "pilot's seeds, so its n trains the two best lrs' curves. The same-lr rows follow (secondary), then each "
           "other lr grid's best-vs-best row for reference.",
           "",
           "| claim | row | seeds | paired sd | MDE now | paper Δ | target MDE | seeds for it now | the pilot's n |",
           "|---|---|---|---|---|---|---|---|---|"]
    # Each lr grid's best-lr-against-best-lr row (and Fig. 1's own second row), for reference: not
    # a central claim, so it sets no target the opening reports, and its best lrs are themselves read from the seeds.
    central = {key for _, key, _ in CENTRAL}
    best = [("Best lr against best lr (for reference)", grid[1]) for comp in res.plan.comparisons
            if comp.kind == "lr_grid" and comp.key not in central and len(grid := res.rows_of(comp)) == 2
            and grid[1].delta is not None]
    rows += [(f"{name} (secondary)", r) for name, r in central_rows(res, SECONDARY)]
    for name, r in rows + best:
        target = target_mde(r)
        need: Optional[int] = seeds_for(r.delta.sd, target) if r.delta and r.delta.n >= 2 else None
        paper = f"{r.paper:+.4f}" if r.paper is not None else "–"
        sd = f"{r.delta.sd:.4f}" if r.delta and r.delta.n >= 2 else "–"
        mde = f"{r.delta.mde:.4f}" if r.delta and r.delta.n >= 2 else "–"
        plan = planned_seeds(res.paired(r.comparison, r.ours, r.ref), target)
        out.append(f"| {name} | {r.title} | {r.delta.n if r.delta else 0} | {sd} | {mde} | {paper} | {target:.4f} | "
                   f"{need if need is not None else '–'} | {plan if plan is not None else 'no pilot yet'} |")
    return out + [""] + beyond_rule_lines(res, rows + best) + variance_lines(res, [r for _, r in rows])


def planned_seeds(deltas: list[float], target: float) -> Optional[int]:
    """The page's rule: a row's n, fixed from its pilot (the first PILOT_SEEDS paired deltas) as the fewest seeds, at
    least PILOT_SEEDS, whose MDE at the pilot's sd is at most `target`; None before the pilot has run."""
    if len(deltas) < PILOT_SEEDS:
        return None
    need = seeds_for(stat(deltas[:PILOT_SEEDS]).sd, target)
    return max(PILOT_SEEDS, need) if need is not None else None


# Rows whose seeds went past their pilot's n before the rule was fixed: results v3 added seeds round by round under a
# stopping rule it did not always follow. Said on the page of any archive that holds such a row.
BEYOND_PLAN_WHY = ("results v3 added them round by round, and the rounds went to rows whose reading was in doubt at "
                   "the time (contradicting the paper, or unresolved), so their n was chosen from the data")


def beyond_rule_lines(res: Results, named: list[tuple[str, Row]]) -> list[str]:
    """The rows whose seeds differ from their pilot's n, each said plainly: above it, their n was chosen otherwise;
    below it, they are short of their plan."""
    extra, short = [], []
    for _, r in named:
        deltas = res.paired(r.comparison, r.ours, r.ref)
        plan = planned_seeds(deltas, target_mde(r))
        if plan is not None and len(deltas) > plan:
            extra.append(f"{r.title} ran {len(deltas)} where its pilot gives {plan}")
        elif plan is not None and len(deltas) < plan:
            short.append(f"{r.title} has {len(deltas)} of {plan}")
    out = []
    if extra:
        out += [f"These rows ran more seeds than their pilot's n ({BEYOND_PLAN_WHY}); their intervals are read as "
                "they are, and their n is not the rule's: " + "; ".join(extra) + ".", ""]
    if short:
        out += ["Short of their pilot's n (the runs to come): " + "; ".join(short) + ".", ""]
    return out or ["Every row has run exactly the seeds its pilot fixed.", ""]


def past_page(res: Results) -> tuple[str, PastPage]:
    """This page's version and the page before it: runs that evaluate a prefix of the val split are v2's, read
    against v1; runs that evaluate the training mixture are v3's, read against v2, or v4's, read against v3, when a
    horizon rung past the proxy's own tokens (v4's alone: the 1 × rung shares runs with the ladders) has a finished
    run (repro/versions.py)."""
    res.rows  # loads the runs (Results reads them on first use)
    if all_prefix(res):
        return "v2", V1
    horizon = any(res.runs_of(c, curve) for c in res.plan.comparisons if (c.horizon or 1) > 1 for curve in c.curves)
    return ("v4", V3) if horizon else ("v3", V2)


def versus_past(res: Results) -> list[str]:
    """The previous page's summary as it was, then which of its deltas persist here (same sign, resolved in both)
    and which fade."""
    now_name, past = past_page(res)
    kinds: dict[str, list[str]] = {}
    for r in res.rows:
        label = BEST if r.label.startswith(BEST) else r.label  # a best-vs-best row whichever lrs it picked
        old = past.deltas.get((r.comparison.key, r.label)) or past.deltas.get((r.comparison.key, label))
        if old is None or not r.counted:
            continue
        now = r.delta
        if old.resolved and now.resolved:
            kind = "persist" if (old.mean > 0) == (now.mean > 0) else "reverse"
        elif old.resolved:
            kind = "fade"
        else:
            kind = "appear" if now.resolved else "stay unresolved"
        kinds.setdefault(kind, []).append(f"{r.title} ({old.mean:+.4f} → {now.mean:+.4f})")
    out = [f"### {now_name} against {past.name}", "", past.summary, ""]
    if not kinds:
        return out + [f"No comparison of {past.name} has finished runs here yet.", ""]
    text = {"persist": "resolved in both with the same sign", "fade": f"resolved in {past.name}, unresolved now",
            "reverse": "resolved in both with opposite signs", "appear": f"unresolved in {past.name}, resolved now",
            "stay unresolved": "unresolved in both"}
    n = sum(map(len, kinds.values()))
    out.append(f"Of the {n} deltas measured in both ({past.name} → {now_name}):")
    out += [f"- **{k}** ({text[k]}): " + "; ".join(kinds[k]) for k in text if k in kinds]
    return out + [""]

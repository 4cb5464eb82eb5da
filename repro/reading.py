"""The results page's count behind its reading (the reading in plain words is repro/first_screen.py's): the claims the
page leads with, the rows that are sums of others, each independent row's paired t test with the Holm and
Benjamini–Hochberg corrections, the seeds each central claim needs by the pilot rule and what that n lets its label
say, and the previous page against this one (v2 against v1, v3 against v2, v4 against v3). Labels are
repro/stats.py's, the basis repro/contrasts.py's, the tests repro/significance.py's.
"""
from __future__ import annotations

from typing import Optional

from repro.comparisons import Comparison
from repro.contrasts import Contrasts, combination_text, contrasts
from repro.measure import PILOT_SEEDS, Results, Row
from repro.proxy import DENSE, MOE
from repro.horizon_section import families_read
from repro.sources import all_prefix
from repro.significance import benjamini_hochberg, half_at, holm, p_value, seeds_for, seeds_for_half
from repro.stats import ALPHA, SIZE_RULE, VERDICTS, fmt, stat, t80, t975, verdict_class
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


def sign_flips(rows: list[Row]) -> list[Row]:
    """The rows resolved on the eval set and on WikiText-2 with opposite signs."""
    return [r for r in rows if r.delta is not None and r.wiki is not None and r.delta.resolved and r.wiki.resolved
            and (r.delta.mean > 0) != (r.wiki.mean > 0)]


def retuned_grids(res: Results) -> list[tuple[str, Comparison]]:
    """RETUNED's comparisons that the plan has."""
    comps = {c.key: c for c in res.plan.comparisons}
    return [(name, comps[key]) for name, key in RETUNED if key in comps]


def retuned_done(res: Results) -> bool:
    """Whether every RETUNED grid has its delta with each design at its best lr over RETUNED_SEEDS paired seeds."""
    rows = [res.rows_of(comp) for _, comp in retuned_grids(res)]
    return bool(rows) and all(len(r) == 2 and r[1].delta is not None and r[1].delta.n >= RETUNED_SEEDS for r in rows)


def survives_holm(c: Contrasts) -> dict[int, bool]:
    """For each basis row (by id), whether it survives Holm's correction over the page's family of basis rows."""
    _, by_holm, _ = tests_over(c)
    return {id(r): keep for r, keep in zip(c.basis, by_holm)}


def holm_family(c: Contrasts) -> str:
    """The family Holm's correction runs over, in words: "the 50 basis rows (14 of them lr-grid picks)"."""
    n, picks = len(c.basis), sum(map(is_pick, c.basis))
    return f"the {n} basis rows" + (f" ({picks} of them {'an lr-grid pick' if picks == 1 else 'lr-grid picks'})"
                                    if picks else "")


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
    return [(f"{horizon_name(p.comp)} at {p.tokens_per_param:.3g} tokens per compute parameter, each at its best lr",
             p.best) for p in (pts[-1] for pts in families_read(res))]


def screen_claims(res: Results) -> list[tuple[str, Optional[Row]]]:
    """The claims of the page's first screen, in its order: the horizon headlines, CENTRAL (None where a planned claim
    has no row yet), then SECONDARY."""
    rows = dict(central_rows(res))
    planned = {c.key for c in res.plan.comparisons}
    return (horizon_heads(res) + [(name, rows.get(name)) for name, key, _ in CENTRAL if key in planned]
            + [(f"{name} (secondary)", r) for name, r in central_rows(res, SECONDARY)])


def row_plan(res: Results, r: Row) -> Optional[int]:
    """The n the pilot rule fixes for a row (planned_seeds), None before its pilot has run."""
    return planned_seeds(res.paired(r.comparison, r.ours, r.ref), target_mde(r))


def short_of_power(res: Results) -> list[str]:
    """The claims of the page's first screen (the horizon headlines and CENTRAL) with fewer seeds than the pilot rule
    fixes for them (or no pilot yet): the rule's n, not the MDE the seeds happen to give, says when a row is done."""
    rows = dict(central_rows(res))
    weak = lambda r: (r is None or r.delta is None or (plan := row_plan(res, r)) is None  # noqa: E731
                      or r.delta.n < plan)
    return ([name for name, r in horizon_heads(res) if weak(r)]
            + [name for name, _, _ in CENTRAL if weak(rows.get(name))])


def size_reach(res: Results, r: Row) -> Optional[tuple[int, float, Optional[int]]]:
    """What the pilot rule's n lets a row's label say about size: (that n, its half-width at the pilot's sd over
    SIZE_RULE·|paper Δ|, the seeds whose half-width at the pilot's sd meets the size rule); None without a pilot or a
    paper value. A ratio above 1: *reproduces the size* is out of reach at the planned n unless the sd falls."""
    deltas = res.paired(r.comparison, r.ours, r.ref)
    n = row_plan(res, r)
    if n is None or not r.paper:
        return None
    sd, bound = stat(deltas[:PILOT_SEEDS]).sd, SIZE_RULE * abs(r.paper)
    return n, half_at(sd, n) / bound, seeds_for_half(sd, bound)


def plan_labels(res: Results) -> list[str]:
    """The methods paragraph on what the seed plan lets a label say, from the first screen's planned claims."""
    reach = [(name, x) for name, r in screen_claims(res) if r is not None and (x := size_reach(res, r))]
    if not reach:
        return []
    ratios = [t975(n - 1) / (t975(n - 1) + t80(n - 1)) for _, (n, _, _) in reach]
    can = [name for name, (_, over, _) in reach if over <= 1]
    return [f"**The seed plan and the labels.** Each claim's n is planned for an MDE at most the larger of the "
            f"paper's |Δ| and {MDE_FLOOR:g} (the power section). At that n the half-width is t₀.₉₇₅ / (t₀.₉₇₅ + "
            f"t₀.₈₀) of the MDE: {min(ratios):.2f}–{max(ratios):.2f} at the planned n's. *Reproduces the size* needs "
            f"a half-width at most {SIZE_RULE:g} of the paper's |Δ|. So a row planned this way can reach every label "
            f"but *reproduces the size*, unless its later seeds' sd falls well below its pilot's. At their pilots' "
            f"sd, {len(can) or 'none'} of the {len(reach)} planned claims could reach it"
            + (f" ({'; '.join(can)})" if can else "") + ". The power section gives the seeds the size rule would "
            "need; the plan does not train them."]


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
           f"The last two columns are the size rule's: the half-width at the rule's n and the pilot's sd, over "
           f"{SIZE_RULE:g} of the paper's |Δ| (above 1, *reproduces the size* is out of reach there), and the seeds "
           "that would bring it to 1 at the pilot's sd.",
           "",
           "| claim | row | seeds | paired sd | MDE now | paper Δ | target MDE | seeds for it now | the pilot's n | "
           "half-width / size bound | seeds for the size |", "|---" * 11 + "|"]
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
        plan, size = row_plan(res, r), size_reach(res, r)
        sized = f"{size[1]:.2f} | {size[2] if size[2] is not None else '–'}" if size else "– | –"
        out.append(f"| {name} | {r.title} | {r.delta.n if r.delta else 0} | {sd} | {mde} | {paper} | {target:.4f} | "
                   f"{need if need is not None else '–'} | {plan if plan is not None else 'no pilot yet'} | {sized} |")
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

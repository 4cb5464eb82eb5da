"""The results page's section on the magnitudes only a Norm reads (results v4, item 7): under DNP an input-side vector
feeds its branch's inner Norm, so its magnitude β reaches the loss only through that Norm's eps while IWD decays it.
The section reads the A/B (repro/comparisons.py, magnitudes_ab) and every β the telemetry logs at each evaluation."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from repro.comparisons import MAGNITUDES_KEY, Comparison
from repro.measure import Results
from repro.plotting import plot_trajectories
from repro.proxy import compute_params
from repro.stats import fmt


@dataclass(frozen=True)
class Trajectory:
    """One curve's magnitude β of one site over its seeds: tokens per compute parameter at each evaluation shared by
    every seed, and each seed's β there."""
    xs: list[float]
    seeds: list[list[float]]  # (seeds, evaluations)

    @property
    def end(self) -> float:
        return sum(s[-1] for s in self.seeds) / len(self.seeds)

    @property
    def smallest(self) -> float:
        """The smallest |β| any seed reached on the way."""
        return min(abs(v) for s in self.seeds for v in s)

    @property
    def crossed(self) -> int:
        """The seeds whose β changed sign at some evaluation."""
        return sum(any(a * b < 0 for a, b in zip(s, s[1:])) for s in self.seeds)


def site_name(key: str) -> str:
    """"magnitude/L0/attn.q_proj" → "L0 attn.q_proj"; "magnitude/head/norm" → "LM head's input (final norm)"."""
    _, layer, site = key.split("/", 2)
    return "LM head's input (final norm)" if layer == "head" else f"{layer} {site}"


def trajectories(res: Results, comp: Comparison) -> dict[str, dict[str, Trajectory]]:
    """site key → curve label → its Trajectory, for every curve with a finished run (runtime/telemetry.py logs the
    magnitudes at every evaluation); the LM head's site first, then layer by layer."""
    out: dict[str, dict[str, Trajectory]] = {}
    for curve in comp.curves:
        runs = list(res.runs_of(comp, curve).values())
        if not runs:
            continue
        keys = [k for k in runs[0].final_eval if k.startswith("magnitude/")]
        for key in keys:
            per_seed = [{e["tokens"] / compute_params(r.cfg): e[key] for e in r.evals if key in e} for r in runs]
            xs = sorted(set.intersection(*(set(p) for p in per_seed)))
            out.setdefault(key, {})[curve.label] = Trajectory(xs, [[p[x] for x in xs] for p in per_seed])
    head = [k for k in out if k.startswith("magnitude/head/")]
    return {k: out[k] for k in head + [k for k in out if k not in head]}


MAGNITUDE_PLOT_SITES = 4  # the plot: the LM head's site and the sites today's IWD drove closest to zero


def magnitudes_section(res: Results, img_dir: Path) -> list[str]:
    """The magnitudes only a Norm reads (results v4, item 7): what sparing them from IWD does to the loss (the
    comparison's rows), and each β at the end, the smallest it came on the way and the seeds where it changed sign,
    for IWD as today, undecayed and bf16; a plot of the trajectories."""
    comp = next((c for c in res.plan.comparisons if c.key == MAGNITUDES_KEY), None)
    if comp is None:
        return []
    runs = {c.label: len(res.finals(comp, c)) for c in comp.curves}
    if not any(runs.values()):
        return [f"Not run yet. `python -m repro.results --only {comp.key}` trains it.", ""]
    out = [f"{comp.title}. Under DNP the vector on a linear map's input side feeds the branch's inner Norm, so its "
           "magnitude β (OR's) reaches the loss only through that Norm's eps, while IWD decays it. The runs log every "
           "such β at each evaluation (runtime/telemetry.py); the table reads them, each column over its curve's "
           "finished seeds (" + "; ".join(f"{k}: {n}" for k, n in runs.items()) + ").", ""]
    for row in res.rows_of(comp):
        if row.delta is not None:
            out.append(f"- {row.ours.label} − {row.ref.label}: {fmt(row.delta, True)} on the validation loss "
                       f"({row.delta.n} seeds), {fmt(row.wiki, True) if row.wiki else '–'} on WikiText-2.")
    out.append("")
    sites = trajectories(res, comp)
    labels = [c.label for c in comp.curves if runs[c.label]]
    names = " | ".join(labels)
    out += [f"| site | β at the end: {names} | smallest |β| on the way: {names} | seeds whose β changed sign: "
            f"{names} |", "|---" * (1 + 3 * len(labels)) + "|"]
    for key, curves in sites.items():
        cells = [curves.get(label) for label in labels]
        out.append(f"| {site_name(key)} | "
                   + " | ".join(f"{t.end:+.4g}" if t else "–" for t in cells) + " | "
                   + " | ".join(f"{t.smallest:.3g}" if t else "–" for t in cells) + " | "
                   + " | ".join(f"{t.crossed} of {len(t.seeds)}" if t else "–" for t in cells) + " |")
    out += ["", "How close each Norm's input comes to eps needs the run's checkpoint, which the archive does not keep: "
            "`python -m repro.magnitudes RUN_DIR` prints it, with Adam's step on each β and where that step comes "
            "from: the true gradient's mean/rms in float64 on training batches, and the fp32 and bf16 gradients' "
            "rounding error against it.", ""]
    today = comp.curves[0].label
    order = sorted((k for k in sites if today in sites[k] and not k.startswith("magnitude/head/")),
                   key=lambda k: abs(sites[k][today].end))
    shown = [k for k in sites if k.startswith("magnitude/head/")][:1] + order[:MAGNITUDE_PLOT_SITES - 1]
    if shown:
        plot_trajectories({site_name(k): {label: (t.xs, t.seeds) for label, t in sites[k].items()} for k in shown},
                          comp.title, img_dir / f"{comp.key}.png")
        out += [f"![{comp.title}](img/{img_dir.name}/{comp.key}.png)", ""]
    return out

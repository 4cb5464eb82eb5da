"""The reproduction's plots: a figure in the paper's arrangement (loss and Δ-loss against tokens per panel, as
`repro.reproduce` draws it), the results page's Δ-loss curves with their seed bands, and a law per strategy.

Every plot reads runs through runs.py (metrics.jsonl), never wandb; matplotlib is imported where it draws.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from runs import series
from repro.stats import stat


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# ------------------------------------------------------------------------------------------------ paper figures

def _mean_curve(runs, metric: str = "val_loss", from_tokens: int = 0) -> tuple[list[float], list[list[float]]]:
    """Token points (from `from_tokens` on) shared by every seed, and each seed's values there."""
    curves = [dict(zip(*series(r.records, metric, "tokens"))) for r in runs]
    xs = sorted(x for x in set.intersection(*(set(c) for c in curves)) if x >= from_tokens) if curves else []
    return xs, [[c[x] for x in xs] for c in curves]


def terminal_table(figure, runs: dict) -> str:
    """Markdown: per panel and curve, the final val loss (mean ± sd over seeds) and its delta to the panel's
    reference, paired by seed (seeds in the same order)."""
    lines = [f"## Fig. {figure.number}: {figure.title}", "",
             "| panel | curve | seeds | final val loss | Δ vs reference |", "|---|---|---|---|---|"]
    for panel in figure.panels:
        ref = [r.final_val_loss for r in runs[panel.curves[0]]]
        for curve in panel.curves:
            final = [r.final_val_loss for r in runs[curve]]
            s = stat(final)
            if curve == panel.curves[0]:
                delta = "(reference)"
            else:
                d = stat([a - b for a, b in zip(final, ref)])
                delta = f"{d.mean:+.4f} ± {d.sd:.4f}"
            lines.append(f"| {panel.title} | {curve} | {len(final)} | {s.mean:.4f} ± {s.sd:.4f} | {delta} |")
    return "\n".join(lines) + "\n"


def draw_figure(figure, runs: dict, out_dir: Path, log_x: bool = False, name: str | None = None,
                formats: tuple[str, ...] = ("png", "svg"), table: bool = True, from_tokens: int = 0) -> list[Path]:
    """A figure in the paper's arrangement, one row per panel: validation loss against tokens (left) and its Δ to
    the panel's reference (right, as Figs. 1 and 5), each curve the mean over seeds with a min–max band. `runs` maps
    each of the figure's run names to its Run objects (one per seed). Writes PNG, SVG and the terminal table.
    `from_tokens` drops earlier evaluations (1: the step-0 loss at init, which would set the Δ plot's scale)."""
    plt = _pyplot()
    panels = figure.panels
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.6 * len(panels)), squeeze=False)
    for row, panel in zip(axes, panels):
        ref_x, ref_ys = _mean_curve(runs[panel.curves[0]], from_tokens=from_tokens)
        for curve in panel.curves:
            xs, ys = _mean_curve(runs[curve], from_tokens=from_tokens)
            mean = [sum(col) / len(col) for col in zip(*ys)]
            line = row[0].plot(xs, mean, label=curve)[0]
            if len(ys) > 1:
                row[0].fill_between(xs, [min(c) for c in zip(*ys)], [max(c) for c in zip(*ys)],
                                    color=line.get_color(), alpha=0.2)
            shared = [i for i, x in enumerate(xs) if x in set(ref_x)]
            where = {x: j for j, x in enumerate(ref_x)}
            deltas = [[y[i] - r[where[xs[i]]] for i in shared] for y, r in zip(ys, ref_ys)]
            dx = [xs[i] for i in shared]
            dmean = [sum(col) / len(col) for col in zip(*deltas)]
            row[1].plot(dx, dmean, color=line.get_color(), label=curve)
            if len(deltas) > 1:
                row[1].fill_between(dx, [min(c) for c in zip(*deltas)], [max(c) for c in zip(*deltas)],
                                    color=line.get_color(), alpha=0.2)
        _label_row(row, f"Fig. {figure.number} — {panel.title}", f"Δ val loss vs {panel.curves[0]}", log_x)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    name = name or f"fig{figure.number}"
    paths = [out_dir / f"{name}.{fmt}" for fmt in formats]
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    if not table:
        return paths
    table_path = out_dir / f"{name}_terminal.md"
    table_path.write_text(terminal_table(figure, runs))
    print(table_path.read_text())
    return [*paths, table_path]


def plot_law(points: dict[str, list[tuple[float, float]]], fits: dict, title: str, out: Path) -> None:
    """Each strategy's (C, loss) points and its fitted law L = a·C^b, log-log, the laws drawn past the points."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    lo = min(c for pts in points.values() for c, _ in pts)
    hi = max(c for pts in points.values() for c, _ in pts)
    grid = np.geomspace(lo / 1.5, hi * 1.5, 50)
    for name, pts in sorted(points.items()):
        fit = fits[name]
        line = ax.plot([c for c, _ in pts], [L for _, L in pts], "o", label=f"{name}: {fit.a:.4f}·C^{fit.b:.4f}")[0]
        ax.plot(grid, [fit.loss(c) for c in grid], "--", color=line.get_color(), alpha=0.7)
    ax.set_yscale("log")
    _log_x(ax, "compute C (PFLOP/s-days)", "validation loss", title)
    _save(fig, plt, out)


def _log_x(ax, xlabel: str, ylabel: str, title: str) -> None:
    """A small plot's axes: log x, labels, title, a grid at every decade's ticks, the legend."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


# ----------------------------------------------------------------------------------------- the results page

def draw_deltas(panels: list, out: Path, log_x: bool = False) -> Path:
    """The results page's plot of a comparison, one row per panel (repro.measure.CurvePanel): each curve's validation
    loss (left) and each delta's Δ-loss against tokens (right, ours − reference paired by seed), every line the mean
    over seeds with its 95 % t-interval as the band, so an early lead that fades shows as a band that returns to 0."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 3.4 * len(panels)), squeeze=False)
    for row, panel in zip(axes, panels):
        colors = {}
        for band in panel.losses:
            colors[band.label] = _band(row[0], band).get_color()
        for band in panel.deltas:
            _band(row[1], band, colors.get(band.of))
        _label_row(row, panel.title, f"Δ val loss vs {panel.reference} (mean, 95 % CI over seeds)", log_x)
    _save(fig, plt, out)
    return out


def _label_row(row, title: str, delta_title: str, log_x: bool) -> None:
    """A figure row's two axes: the loss (left) and its Δ with the zero line (right), against tokens."""
    row[0].set_title(title, fontsize=10)
    row[1].set_title(delta_title, fontsize=10)
    row[1].axhline(0.0, color="gray", lw=0.8)
    row[0].set_ylabel("validation loss")
    for ax in row:
        ax.set_xlabel("tokens")
        if log_x:
            ax.set_xscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def _band(ax, band, color=None):
    """One line of means and, where it has two or more seeds, the band of their 95 % interval."""
    means = [s.mean for s in band.stats]
    line = ax.plot(band.tokens, means, label=band.label, color=color)[0]
    if any(s.n >= 2 for s in band.stats):
        lo = [s.lo if s.n >= 2 else s.mean for s in band.stats]
        hi = [s.hi if s.n >= 2 else s.mean for s in band.stats]
        ax.fill_between(band.tokens, lo, hi, color=line.get_color(), alpha=0.2)
    return line


def _save(fig, plt, out: Path) -> None:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_horizon(series: dict[str, list[tuple[float, object]]], paper, title: str, out: Path) -> Path:
    """Deltas against tokens per compute parameter (log x): each series' means with their 95 % t-intervals as
    error bars and a band between them, the zero line, and the paper's Δ dashed where given."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (label, points) in enumerate(series.items()):
        pts = sorted(((x, s) for x, s in points if s is not None), key=lambda p: p[0])
        if not pts:
            continue
        xs = [x * (1.03 if i else 1.0) for x, _ in pts]  # the second series a little to the right, readable
        means = [s.mean for _, s in pts]
        err = [[s.mean - s.lo if s.n >= 2 else 0.0 for _, s in pts], [s.hi - s.mean if s.n >= 2 else 0.0 for _, s in pts]]
        line = ax.errorbar(xs, means, yerr=err, marker="o", capsize=3, label=label)[0]
        if len(pts) > 1 and all(s.n >= 2 for _, s in pts):
            ax.fill_between(xs, [s.lo for _, s in pts], [s.hi for _, s in pts], color=line.get_color(), alpha=0.15)
    ax.axhline(0.0, color="gray", lw=0.8)
    if paper is not None:
        ax.axhline(paper, color="black", ls="--", lw=0.8, label=f"the paper's Δ ({paper:+.4f})")
    _log_x(ax, "tokens per compute parameter", "Δ final val loss (95 % CI over seeds)", title)
    _save(fig, plt, out)
    return out


def plot_trajectories(panels: dict[str, dict[str, tuple[list[float], list[list[float]]]]], title: str,
                      out: Path) -> Path:
    """One small plot per site: each curve's magnitude β against tokens per compute parameter (log x), the mean over
    seeds as the line and their min–max as the band; `panels` maps a site to {curve: (xs, values per seed)}."""
    plt = _pyplot()
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    for ax, (site, curves) in zip(axes.flat, panels.items()):
        for label, (xs, seeds) in curves.items():
            v = np.array(seeds)  # (seeds, evaluations)
            line = ax.plot(xs, v.mean(0), label=label)[0]
            if len(seeds) > 1:
                ax.fill_between(xs, v.min(0), v.max(0), color=line.get_color(), alpha=0.2)
        ax.axhline(0.0, color="gray", lw=0.8)
        _log_x(ax, "tokens per compute parameter", "magnitude β", site)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    _save(fig, plt, out)
    return out

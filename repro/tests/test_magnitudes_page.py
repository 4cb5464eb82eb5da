"""The results page's section on the magnitudes only a Norm reads (results v4, item 7; repro/magnitude_section.py),
on synthetic runs: the A/B's delta, and each β at the end, the smallest on the way and the seeds whose β changed
sign, read from the telemetry every evaluation logs."""
from __future__ import annotations

import json
from pathlib import Path

from config import load_config
from repro.comparisons import HORIZON_DENSE, MAGNITUDES_KEY, Plan, magnitudes_ab
from repro.measure import Results
from repro.proxy import compute_params
from repro.magnitude_section import magnitudes_section

SEEDS = 3
# per curve label: (final val loss, β of the LM head's site, β of layer 0's q_proj per seed), at tokens 0, 50, 100
CURVES = {
    "unified, IWD as today": (3.00, (1.0, 1.2, 1.5), {0: (1.0, 0.1, -0.05), 1: (1.0, 0.2, 0.1), 2: (1.0, 0.3, 0.2)}),
    "unified, those β undecayed": (2.99, (1.0, 1.0, 1.0), {s: (1.0, 0.9, 0.8) for s in range(SEEDS)}),
}
NOISE = (0.0, 0.004, -0.003)


def fake_run(path: Path, final: float, head: tuple, q: tuple, seed: int) -> None:
    path.mkdir(parents=True)
    cfg = load_config("configs/tiny_cpu.yaml", ["train.steps=10", "schedule.warmup_steps=1"])
    (path / "config.yaml").write_text(cfg.to_yaml())
    recs = [{"kind": "eval", "step": step, "tokens": tokens, "val_loss": final + 1 - step / 10 + NOISE[seed],
             "val_loss/wiki": final + 2 - step / 10, "magnitude/head/norm": h, "magnitude/L0/attn.q_proj": b}
            for step, tokens, h, b in zip((0, 5, 10), (0, 50, 100), head, q)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_the_magnitudes_section_reads_the_telemetry(tmp_path):
    comp = magnitudes_ab(10, 2e-3, HORIZON_DENSE)
    assert comp.key == MAGNITUDES_KEY and [c.label for c in comp.curves] == [*CURVES, "unified, bf16"]
    where = {}
    for c in comp.curves:
        for s in range(SEEDS):
            d = where[(f"{comp.key}/{c.label}", s)] = tmp_path / f"{c.suffix}-s{s}"
            if c.label in CURVES:
                final, head, q = CURVES[c.label]
                fake_run(d, final, head, q[s], s)
    res = Results(Plan(SEEDS, comparisons=[comp]), where, "wiki")
    text = "\n".join(magnitudes_section(res, tmp_path / "img"))
    row = res.rows_of(comp)[0]
    assert abs(row.delta.mean + 0.01) < 1e-9 and row.delta.n == SEEDS
    assert f"- unified, those β undecayed − unified, IWD as today: {row.delta.mean:+.4f} [" in text
    assert ("| site | β at the end: unified, IWD as today | unified, those β undecayed | smallest |β| on the way: "
            "unified, IWD as today | unified, those β undecayed | seeds whose β changed sign: unified, IWD as "
            "today | unified, those β undecayed |") in text
    assert "| LM head's input (final norm) | +1.5 | +1 | 1 | 1 | 0 of 3 | 0 of 3 |" in text
    # layer 0's q: ends at the mean of -0.05, 0.1, 0.2; seed 0 crossed zero; the smallest |β| was 0.05
    assert "| L0 attn.q_proj | +0.08333 | +0.8 | 0.05 | 0.8 | 1 of 3 | 0 of 3 |" in text
    assert text.index("LM head's input") < text.index("L0 attn.q_proj")
    assert (tmp_path / "img" / f"{MAGNITUDES_KEY}.png").stat().st_size > 1000
    # tokens per compute parameter on the plot's x axis: the run's own N
    n = compute_params(load_config("configs/tiny_cpu.yaml"))
    from repro.magnitude_section import trajectories
    assert trajectories(res, comp)["magnitude/head/norm"]["unified, IWD as today"].xs == [0.0, 50 / n, 100 / n]


def test_the_section_says_how_to_train_it_before_any_run(tmp_path):
    comp = magnitudes_ab(10, 2e-3, HORIZON_DENSE)
    where = {(f"{comp.key}/{c.label}", s): tmp_path / f"{c.suffix}-s{s}" for c in comp.curves for s in range(SEEDS)}
    res = Results(Plan(SEEDS, comparisons=[comp]), where, "wiki")
    assert magnitudes_section(res, tmp_path / "img") == [
        f"Not run yet. `python -m repro.results --only {MAGNITUDES_KEY}` trains it.", ""]

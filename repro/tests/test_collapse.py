"""Issue 52's A/B read from its runs (repro/collapse.py) on synthetic run directories: which runs collapsed, the
smallest headroom and magnitude, and each arm's paired difference to the literal arm."""
from __future__ import annotations

import json
from pathlib import Path

from config import load_config
from repro import collapse
from repro.comparisons import COLLAPSE_ROWS, Plan, collapse_ab
from repro.runner import plan_runs

SEEDS = 3
# per arm: (final val loss per seed, smallest headroom per seed, q's magnitude at the end per seed)
ARMS = {
    "unified, literal": ((3.00, 3.02, 3.01), (2e-7, 50.0, 0.5), (4.8e-6, 0.3, 0.01)),
    "unified, magnitudes removed": ((2.99, 3.00, 3.00), (900.0, 800.0, 1000.0), None),
}


def fake_run(path: Path, final: float, headroom: float, magnitude) -> None:
    path.mkdir(parents=True)
    cfg = load_config("configs/tiny_cpu.yaml", ["train.steps=10", "schedule.warmup_steps=1"])
    (path / "config.yaml").write_text(cfg.to_yaml())
    recs = []
    for step, h in ((0, 1000.0), (5, headroom), (10, max(headroom, 10.0))):
        rec = {"kind": "eval", "step": step, "tokens": 10 * step, "val_loss": final + 1 - step / 10,
               collapse.WIKI: final + 0.5, "headroom/L0/attn.q_proj": h, "headroom/head/lm_head": 2000.0}
        if magnitude is not None:
            rec["magnitude/L0/attn.q_proj"] = 1.0 if step == 0 else magnitude
        rec["magnitude/L0/mlp.router"] = 1e-9  # read directly by the router, not by a Norm: left out
        recs.append(rec)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_the_ab_counts_collapsed_runs_and_reads_paired_deltas(tmp_path, capsys):
    row = COLLAPSE_ROWS.index((10, 4e-3, "dense"))
    comp = collapse_ab(*COLLAPSE_ROWS[row])
    assert [c.label for c in comp.curves] == [*ARMS, "unified, those β undecayed"]
    assert [c.overrides[-1] for c in comp.curves[1:]] == ["model.scale.invariant_magnitude=remove",
                                                          "optim.scale_wd_invariant=false"]
    _, where = plan_runs(Plan(SEEDS, comparisons=[comp]), str(tmp_path))
    # the literal arm is the horizon rung's own run directory (repro/comparisons.py, horizon_rung)
    assert where[(f"{comp.key}/unified, literal", 1)].name == "fig6-0.12b_unified-tiny-d32L4-x10-lr4e-3-s1"
    for label, (finals, heads, mags) in ARMS.items():
        for s in range(SEEDS):
            fake_run(where[(f"{comp.key}/{label}", s)], finals[s], heads[s], None if mags is None else mags[s])
    assert collapse.main([str(tmp_path), "--seeds", str(SEEDS), "--rows", str(row)]) == 0
    lines = {line.split(" | ")[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    # literal: seeds 0 and 2 fell below 1 (2e-7, 0.5); the smallest magnitude is 4.8e-6
    assert lines["| unified, literal"] == "| unified, literal | 3 | 2 | 2e-07 | 4.8e-06 | 3.0100 ± 0.0100 |  | " \
                                          "3.5100 ± 0.0100 |  |  |"
    removed = lines["| unified, magnitudes removed"]
    assert removed.startswith("| unified, magnitudes removed | 3 | 0 | 8e+02 | – | 2.9967 ± 0.0058 | -0.0133 [")
    assert removed.endswith("| no pilot yet |")  # 3 seeds: the pilot rule fixes n from the first 4
    assert "| unified, those β undecayed | 0 | 0 |" in lines["| unified, those β undecayed"]
    assert collapse.main([str(tmp_path / "none"), "--seeds", str(SEEDS), "--rows", str(row)]) == 2


def test_the_ab_reads_a_compact_archive_of_its_runs(tmp_path, capsys):
    from repro.runner import archive
    row = COLLAPSE_ROWS.index((1, 8e-3, "moe"))
    comp = collapse_ab(*COLLAPSE_ROWS[row])
    uniques, where = plan_runs(Plan(1, comparisons=[comp]), str(tmp_path / "runs"))
    assert where[(f"{comp.key}/unified, literal", 0)].name == "fig7-0.5b_unified-tiny-d32L2E8-x1-lr8e-3"
    fake_run(where[(f"{comp.key}/unified, literal", 0)], 3.0, 0.01, 1e-4)
    dest = tmp_path / "ab.jsonl.gz"
    assert archive(uniques, tmp_path / "runs", dest) == 1
    assert collapse.main([str(dest), "--seeds", "1", "--rows", str(row)]) == 0
    assert "| unified, literal | 1 | 1 | 0.01 | 0.0001 | 3.0000 |" in capsys.readouterr().out
    assert collapse.main([str(tmp_path / "missing.jsonl.gz"), "--seeds", "1"]) == 2


def test_the_router_section_pairs_each_folder_by_seed(tmp_path):
    """Fig. 8's MoE Muon row on two folders (router on AdamW, on Muon): unified − baseline by seed, the seeds both
    designs finished, and Welch's difference of the two."""
    from repro.collapse_page import router_section
    finals = {"adamw": {"baseline": (3.10, 3.12, 3.11), "unified": (3.00, 3.03, 3.01)},
              "muon": {"baseline": (3.10, 3.11), "unified": (3.05, 3.07)}}
    for folder, designs in finals.items():
        for design, values in designs.items():
            for s, v in enumerate(values):
                fake_run(tmp_path / folder / f"fig8-moe_0.5b_{design}-tiny-s{s}", v, 1000.0, None)
    lines = router_section(tmp_path / "muon", tmp_path / "adamw")
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    assert rows["| AdamW (results v4)"].startswith("| AdamW (results v4) | 3 | -0.0967 [")  # (-0.10, -0.09, -0.10)
    assert rows["| Muon"].startswith("| Muon | 2 | -0.0450 [") and rows["| Muon"].endswith("] |")
    assert router_section(tmp_path / "none", tmp_path / "adamw") == []  # no Muon runs: no section


def test_the_page_names_each_row_short_of_its_pilots_n_and_what_it_would_cost():
    """A row whose pilot's paired sd asks for more seeds than it ran is named with each arm's runs and n (literal's
    the largest, as it pairs with every arm), and the missing runs are costed at the row's mean CPU time."""
    from pathlib import Path as P
    from repro.collapse_page import AB_BUDGET_HOURS, shortfall
    from repro.reading import MDE_FLOOR, PILOT_SEEDS, planned_seeds
    from runs import Run

    def arm(label: str, finals: list[float]) -> collapse.Arm:
        return collapse.Arm(label, {s: Run(P(f"{label}-s{s}"), None, [{"kind": "eval", "val_loss": v}])
                                    for s, v in enumerate(finals)})
    comp = collapse_ab(*COLLAPSE_ROWS[0])
    literal = [3.0] * PILOT_SEEDS
    noisy = [3.0 + d for d in (0.05, -0.05, 0.04, -0.03)][:PILOT_SEEDS]
    quiet = [3.0 + d for d in (0.001, -0.001, 0.0005, 0.0)][:PILOT_SEEDS]
    arms = [arm("unified, literal", literal), arm("unified, magnitudes removed", noisy),
            arm("unified, those β undecayed", quiet)]
    n = planned_seeds([a - b for a, b in zip(noisy, literal)], MDE_FLOOR)
    assert n > PILOT_SEEDS and planned_seeds([a - b for a, b in zip(quiet, literal)], MDE_FLOOR) == PILOT_SEEDS
    seconds = {r.path.name: 3600.0 for a in arms for r in a.runs.values()}
    [line] = shortfall([(comp, arms)], seconds)
    missing = 2 * (n - PILOT_SEEDS)
    assert f"literal {PILOT_SEEDS} of {n}, magnitudes removed {PILOT_SEEDS} of {n}." in line
    assert "undecayed" not in line and f"The {missing} missing runs would take about {missing:.1f} CPU-hours" in line
    assert ("past the A/B's budget" in line) == (len(seconds) + missing > AB_BUDGET_HOURS)
    assert shortfall([(comp, [arms[0], arms[2]])], seconds) == ["- **Seeds.** Every row has the seeds its pilot asks for."]

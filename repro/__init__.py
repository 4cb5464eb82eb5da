"""The reproduction of the paper's figures: its library in the order of its stages, its commands beside them
(reproduce.py, plan.py, results.py, scaling_law.py: `python -m repro.reproduce`, ...), its tests in repro/tests/.
The framework imports none of it.

    figures.py      which runs make up each figure and panel (configs/figures/fig<N>/)
    experiments.py  when two runs are the same experiment (resolved config outside log.*)
    paper.py        the paper-scale plan: unique runs, their data, their compute (repro/plan.py)
    proxy.py        how a paper run becomes a CPU proxy run: shapes, steps, batch, tokens per parameter
    jobs.py         a figure's runs as jobs: run directory, train.py's arguments, the command that runs one here
    comparisons.py  what repro/pages/results.md compares, with the paper's numbers (docs/paper.md §4)
    runner.py       repro/pages/results.md's unique runs in order, each in its own process, CPU time summed, archives
    (the root runs.py reads a run directory: config.yaml and metrics.jsonl, never wandb)
    stats.py        paired deltas, intervals, MDE, verdicts on what an interval says of the paper's value
    significance.py the paired t test (its CDF from the incomplete beta), Holm, Benjamini–Hochberg, seeds for an MDE
    laws.py         power laws in compute, equal-loss multipliers, exponent intervals, crossings, bootstrap intervals
    measure.py      what the runs measured per comparison (rows, curves, shared runs)
    contrasts.py    which rows are sums of others: the basis the page counts over
    plotting.py     figures, Δ-loss curves with bands, scaling-law plots
    sections.py     one comparison's part of the page; horizon_section.py the horizon's, magnitude_section.py
                    the magnitudes'
    reading.py      the reading in plain words, the count behind it, the power on the central claims, v1 against v2
    page.py         repro/pages/results.md (repro/results.py writes it); versions.py keeps the earlier pages' numbers
"""

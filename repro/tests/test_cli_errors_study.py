"""The study's commands (repro/): a user's mistake gets a one-line `error: ...` naming what is wrong and what to do,
with exit status 2, before any work (docs/design.md principle 10), as tests/test_cli_errors.py holds the framework's
commands to."""
from __future__ import annotations

import json

import pytest

from repro import plan, reproduce, scaling_law
from test_cli_errors import OUT_PROBLEMS, error, usage_error


@pytest.mark.parametrize("out, words", OUT_PROBLEMS)
def test_scaling_law_checks_out_first(tmp_path, capsys, out, words):
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "FILE").write_text("")
    points = tmp_path / "points.csv"
    points.write_text("strategy,C,loss\nbaseline,1,3\nbaseline,2,2.9\n")
    usage_error(scaling_law.main, ["--points", str(points), "--out", str(tmp_path / out)], capsys, *words)


# ------------------------------------------------------------------------------------------------- scaling_law

@pytest.mark.parametrize("csv, words", [
    ("a,b\n1,2\n", ["strategy,C,loss"]),
    ("strategy,C,loss\nbaseline,1,3\nbaseline,2\n", ["line 3", "positive numbers"]),
    ("strategy,C,loss\nbaseline,-1,3\nbaseline,2,2.9\n", ["line 2", "positive numbers"]),
    ("strategy,C,loss\nbaseline,1,nan\nbaseline,2,2.9\n", ["line 2", "positive numbers"]),
])
def test_scaling_law_names_the_bad_csv_row(tmp_path, capsys, csv, words):
    points = tmp_path / "points.csv"
    points.write_text(csv)
    error(scaling_law.main, ["--points", str(points)], capsys, *words)


def test_scaling_law_points_and_diverged_runs(tmp_path, capsys):
    usage_error(scaling_law.main, ["--points", str(tmp_path)], capsys, "is not a file")
    from test_scaling_law import _fake_run
    runs = [_fake_run(tmp_path, f"b{d}", "baseline", d, tokens=1000 * d, loss=3.0) for d in (64, 128)]
    diverged = {"kind": "eval", "step": 10, "tokens": 10, "val_loss": None}  # train.py logs a non-finite loss so
    (runs[1] / "metrics.jsonl").write_text(json.dumps(diverged) + "\n")  # was: "has no evaluation yet"
    error(scaling_law.main, [str(r) for r in runs], capsys, "val_loss is None", "diverged")


# ------------------------------------------------------------------------------------------------ reproduce, plan

def test_reproduce_and_plan_refuse_what_is_not_an_override(tmp_path, capsys, monkeypatch):
    """A word after -- that is not key=value reached every run's train.py command unchecked (plan: was ignored)."""
    usage_error(reproduce.main, ["10", "--dry-run", "--", "garbage"], capsys, "'garbage' is not a key=value")
    usage_error(plan.main, ["garbage"], capsys, "'garbage' is not a key=value")
    (tmp_path / "file").write_text("")
    usage_error(reproduce.main, ["10", "--dry-run", "--out-dir", str(tmp_path / "file")], capsys, "name a folder")
    monkeypatch.setenv("NPROC", "eight")
    usage_error(reproduce.main, ["10", "--dry-run"], capsys, "NPROC='eight'")

"""The kill soak in miniature (scripts/soak.py; its 25-minute report is in docs/reliability.md): a 2-rank run
SIGKILLed twice — once while a checkpoint is being written, once at a random moment — and restarted with the same
command each time ends bit-identical to the uninterrupted run, having resumed each time from the newest complete
checkpoint; a third kill that restarts it on 1 rank keeps every step's tokens and stays within fp64
reduction-order bounds (the soak runs in fp64)."""
from __future__ import annotations

import json

from scripts import soak

# Sequences of 64 tokens instead of tiny_cpu.yaml's 256: a step costs a quarter (the LM head over the 8,192-token
# vocabulary is most of it), and nothing checked depends on the length — the kills land at checkpoint writes (the
# checkpoint's size does not change: the model does not), at start-up or after a logged step; the bounds of a rank
# change are upper bounds on reduction-order error, which shorter sums only lower, and the rank-changed run still
# sums its 512 rows per step in another order than the reference (so it is still not bit-identical: asserted).
SEQ = ["--seq-len", "64"]


def test_two_kills_then_bit_identical(tmp_path, capsys):
    assert soak.main(["--episodes", "1", "--kills", "2", "--steps", "12", *SEQ, "--out", str(tmp_path / "soak")]) == 0
    report = json.loads((tmp_path / "soak" / "report.json").read_text())
    assert report["kills"] == 2 and report["kills_during_checkpoint_write"] >= 1 and report["rank_changes"] == 0
    assert report["divergent_episodes"] == 0 and report["max_loss_diff"] == 0.0 and report["digests_equal"]
    episode = report["episodes_detail"][0]
    assert episode["launches"] == 3 and episode["differing_tensors"] == 0 and episode["tensors"] > 20
    assert "2 kills survived" in capsys.readouterr().out


def test_a_kill_that_restarts_on_one_rank_keeps_the_tokens(tmp_path, capsys):
    assert soak.main(["--episodes", "1", "--kills", "3", "--steps", "14", "--seed", "1", *SEQ,
                      "--out", str(tmp_path / "soak")]) == 0
    report = json.loads((tmp_path / "soak" / "report.json").read_text())
    episode = report["episodes_detail"][0]
    assert [k["kind"] for k in episode["kills"]] == ["checkpoint-write", "random", "rank-change"]
    assert [k["ranks_after"] for k in episode["kills"]] == [2, 2, 1] and report["rank_changes"] == 1
    assert episode["launches"] == 4 and episode["ok"] and report["digests_equal"]
    assert 0 < report["max_tensor_rel_diff_rank_changed"] <= soak.TENSOR_REL_TOL  # not bit-identical: another sum
    assert report["max_optim_abs_diff_rank_changed"] <= soak.OPTIM_ABS_TOL
    assert report["max_loss_diff_rank_changed"] <= soak.LOSS_TOL
    assert "1 onto another rank count" in capsys.readouterr().out
    assert soak.main(["--out", str(tmp_path / "soak")]) == 2  # never mixes a new soak into an old one

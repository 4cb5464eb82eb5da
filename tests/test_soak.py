"""The kill soak in miniature (harness/soak.py; its 25-minute report is in docs/reliability.md): a 2-rank run
SIGKILLed three times — while a checkpoint is being written, at a random moment, and once more with the restart on
1 rank — and restarted with the same command each time resumes from the newest complete checkpoint, matches the
uninterrupted run bit for bit while it stays on 2 ranks, and after the rank change keeps every step's tokens and
stays within fp64 reduction-order bounds (the soak runs in fp64)."""
from __future__ import annotations

import json

from harness import soak

# Sequences of 64 tokens instead of tiny_cpu.yaml's 256: a step costs a quarter (the LM head over the 8,192-token
# vocabulary is most of it), and nothing checked depends on the length — the kills land at checkpoint writes (the
# checkpoint's size does not change: the model does not), at start-up or after a logged step; the bounds of a rank
# change are upper bounds on reduction-order error, which shorter sums only lower, and the rank-changed run still
# sums its 512 rows per step in another order than the reference (so it is still not bit-identical: asserted).
SEQ = ["--seq-len", "64"]


def test_kills_while_writing_at_random_and_onto_one_rank(tmp_path, capsys):
    """One episode, three kills in turn: during a checkpoint write, at a random moment, and one whose restart runs
    on 1 rank. Each restart resumes from the newest complete checkpoint (soak.py checks every one); every step
    logged on 2 ranks through the first two resumes equals the uninterrupted run's bit for bit; after the rank
    change the tokens of every step are the same, and the state is within the fp64 reduction-order bounds (not
    bit-identical: its sums run in another order). The full soak's episodes without a rank change also compare
    every final tensor bit for bit (docs/reliability.md)."""
    assert soak.main(["--episodes", "1", "--kills", "3", "--steps", "14", "--seed", "1", *SEQ,
                      "--out", str(tmp_path / "soak")]) == 0
    report = json.loads((tmp_path / "soak" / "report.json").read_text())
    episode = report["episodes_detail"][0]
    assert [k["kind"] for k in episode["kills"]] == ["checkpoint-write", "random", "rank-change"]
    assert report["kills"] == 3 and report["kills_during_checkpoint_write"] >= 1
    assert [k["ranks_after"] for k in episode["kills"]] == [2, 2, 1] and report["rank_changes"] == 1
    assert episode["launches"] == 4 and episode["ok"] and report["digests_equal"] and episode["tensors"] > 20
    # the 2-rank stretch: at least the steps up to the second kill's resume point, each bit-identical
    resumed = [k["resumed_from"] for k in episode["kills"]]
    assert episode["same_ranks_steps"] == resumed[2] >= max(resumed[1], 1)
    assert report["max_loss_diff_before_rank_change"] == 0.0
    assert 0 < report["max_tensor_rel_diff_rank_changed"] <= soak.TENSOR_REL_TOL  # not bit-identical: another sum
    assert report["max_optim_abs_diff_rank_changed"] <= soak.OPTIM_ABS_TOL
    assert report["max_loss_diff_rank_changed"] <= soak.LOSS_TOL
    assert "3 kills survived" in capsys.readouterr().out
    assert soak.main(["--out", str(tmp_path / "soak")]) == 2  # never mixes a new soak into an old one

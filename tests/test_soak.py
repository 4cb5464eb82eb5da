"""The kill soak in miniature (scripts/soak.py; its 30-minute report is in docs/reliability.md): a 2-rank run
SIGKILLed twice — once while a checkpoint is being written, once at a random moment — and restarted with the same
command each time ends bit-identical to the uninterrupted run, having resumed each time from the newest complete
checkpoint."""
from __future__ import annotations

import json

from scripts import soak


def test_two_kills_then_bit_identical(tmp_path, capsys):
    assert soak.main(["--episodes", "1", "--kills", "2", "--steps", "12", "--out", str(tmp_path / "soak")]) == 0
    report = json.loads((tmp_path / "soak" / "report.json").read_text())
    assert report["kills"] == 2 and report["kills_during_checkpoint_write"] >= 1
    assert report["divergent_episodes"] == 0 and report["max_loss_diff"] == 0.0
    episode = report["episodes_detail"][0]
    assert episode["launches"] == 3 and episode["differing_tensors"] == 0 and episode["tensors"] > 20
    assert "2 kills survived" in capsys.readouterr().out
    assert soak.main(["--out", str(tmp_path / "soak")]) == 2  # never mixes a new soak into an old one

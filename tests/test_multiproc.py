"""The test launcher's rendezvous: every rank of a launch reads the port rank 0 picked for each run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from multiproc import Rendezvous, spawn


def _ports_worker(rank: int, rdzv: Rendezvous, out: str) -> None:
    ports = [rdzv.port(rank, run) for run in range(3)]
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(ports))


def test_every_rank_reads_rank_0s_port_per_run_and_the_board_is_removed(tmp_path):
    rdzv = Rendezvous.new()
    spawn(_ports_worker, (rdzv, str(tmp_path)), nprocs=3, timeout=120)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert seen[0] == seen[1] == seen[2]
    assert all(1024 < p < 65536 for p in seen[0])
    assert not Path(rdzv.board).exists()


def test_a_rank_whose_rank_0_never_writes_times_out_naming_the_run(tmp_path):
    with pytest.raises(TimeoutError, match="rank 0's port of run 2"):
        Rendezvous(str(tmp_path)).port(rank=1, run=2, timeout=0.1)

"""Multi-rank tests on CPU: free ports and a spawn that cannot hang CI (docs/design.md traps 1–2)."""
from __future__ import annotations

import faulthandler
import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch.multiprocessing as mp


def free_port() -> int:
    """A port the kernel says is free now, for a launch's rendezvous. Under pytest-xdist (pytest.ini: -n 2) each worker
    keeps only its own share of the ports, (port // 2) % workers == its index (bind hands out odd ports first, hence
    the // 2): the kernel picks at random, and two workers launching ranks at once could otherwise both be handed
    the port the first one's rank 0 has not yet bound."""
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    for _ in range(64 * workers):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port // 2 % workers == index:
            return port
    raise RuntimeError(f"no free port of xdist worker {index} of {workers} in {64 * workers} tries")


@dataclass(frozen=True)
class Rendezvous:
    """Where a launch's ranks learn each run's port, picked by rank 0 just before that run binds it. A port picked in
    the parent waits out the ranks' start (seconds) and every earlier run of a multi-run launch (minutes), and in that
    time any process's outgoing connection may take it as its ephemeral port (CI saw EADDRINUSE so). Rank 0 writes the
    port to a file on `board` (renamed into place, so no rank reads half of it); the others wait for that file."""
    board: str

    @staticmethod
    def new() -> "Rendezvous":
        return Rendezvous(tempfile.mkdtemp(prefix="scalevec-rdzv-"))

    def port(self, rank: int, run: int = 0, timeout: float = 120.0) -> int:
        path = Path(self.board) / f"run{run}.port"
        if rank == 0:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(str(free_port()))
            os.replace(tmp, path)
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank} waited {timeout:.0f} s for rank 0's port of run {run} in {self.board}")
            time.sleep(0.02)
        return int(path.read_text())


def _rank_entry(rank: int, fn, *args) -> None:
    """A rank's body, then a plain exit. faulthandler prints every thread's Python stack if the rank dies on a signal
    (a SIGABRT from C++ names where it came from). After fn returns, the rank's work is on disk (train.main closes
    its files in `finally`), and os._exit skips interpreter finalization, where PyTorch's process-group and FSDP2
    objects can still abort ("terminate called without an active exception", docs/design.md trap 1; CI saw a rank of the
    six-run tests/test_grad_reduce.py end on SIGABRT) — a teardown these tests do not test. An exception in fn
    still propagates, so mp.spawn reports it as before."""
    faulthandler.enable(all_threads=True)
    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn, args: tuple, nprocs: int, timeout: float = 300.0) -> None:
    """torch.multiprocessing.spawn with a deadline: a rank stuck in a collective fails the test instead of
    hanging the suite. A rank's exception is re-raised, as with mp.spawn."""
    try:
        _spawn(fn, args, nprocs, timeout)
    finally:  # the boards of this launch's rendezvous hold only port files
        for arg in args:
            if isinstance(arg, Rendezvous):
                shutil.rmtree(arg.board, ignore_errors=True)


def _spawn(fn, args: tuple, nprocs: int, timeout: float) -> None:
    ctx = mp.start_processes(_rank_entry, args=(fn, *args), nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{nprocs}-rank test did not finish within {timeout:.0f} s (a hang in a collective?)")

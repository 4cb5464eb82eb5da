"""Multi-rank tests on CPU: free ports and a spawn that cannot hang CI (docs/design.md traps 1–2)."""
from __future__ import annotations

import faulthandler
import os
import socket
import sys
import time

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
    ctx = mp.start_processes(_rank_entry, args=(fn, *args), nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{nprocs}-rank test did not finish within {timeout:.0f} s (a hang in a collective?)")

"""Multi-rank tests on CPU: free ports and a spawn that cannot hang CI (DESIGN.md traps 1–2)."""
from __future__ import annotations

import socket
import time

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, args: tuple, nprocs: int, timeout: float = 300.0) -> None:
    """torch.multiprocessing.spawn with a deadline: a rank stuck in a collective fails the test instead of
    hanging the suite. A rank's exception is re-raised, as with mp.spawn."""
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{nprocs}-rank test did not finish within {timeout:.0f} s (a hang in a collective?)")

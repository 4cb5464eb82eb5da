"""CPU-only runtime settings.

glibc serves every allocation above 32 MiB with a fresh mmap and returns it to the OS on free, so each training step
re-faults its large activations (logits are B·T·V floats): on the 7.4M-parameter CPU default that was ~520k page
faults and ~0.8 s of system time per step (docs/benchmarks.md). Keeping freed memory in the heap removes that; the
numerics are untouched, only the allocator's reuse policy changes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameters, glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
_KEEP = 2**30  # serve blocks up to 1 GiB from the heap and keep up to 2 GiB of free heap (values are C ints)


def tune_glibc_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds for this process. Returns False where it does not apply (not Linux,
    not glibc) or glibc refuses; training then runs as before, only slower."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP) and mallopt(_M_TRIM_THRESHOLD, 2 * _KEEP - 1))

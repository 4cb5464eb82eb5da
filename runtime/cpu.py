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


def _glibc():
    """glibc as a ctypes library, or None (not Linux, or a libc without glibc's malloc interface)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both must exist
    except (OSError, AttributeError):  # musl and others have no mallopt
        return None
    return libc


def tune_glibc_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds for this process. Returns False where it does not apply (not Linux,
    not glibc) or glibc refuses; training then runs as before, only slower."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP) and mallopt(_M_TRIM_THRESHOLD, 2 * _KEEP - 1))


def release_free_heap() -> bool:
    """Give the heap's free memory back to the OS now (glibc `malloc_trim(0)`), as the tuned thresholds above no
    longer do on their own; a memory measurement that starts here then counts only what is allocated after it.
    Returns False where it does not apply."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    libc.malloc_trim(0)
    return True

"""Crash-safe file writes shared by checkpoints and the run logger."""
from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write to `path.partial`, fsync, rename over `path`, fsync the folder: a reader sees the old file or the
    whole new one, never a torn one."""
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems (and Windows) do not open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""Crash-safe file writes shared by checkpoints and the run logger; the checks of a command's output paths."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


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


def out_path_problem(path: Path, kind: str = "file") -> Optional[str]:
    """Why `path` cannot be written as a `kind` ("file" or "folder"), or None. Commands check their output paths with
    it before any work, so a mistyped one is a message up front, not a traceback after the work."""
    path = Path(path)
    wrong_kind = path.is_dir() if kind == "file" else (path.exists() and not path.is_dir())
    if wrong_kind:
        return f"{path} is a {'folder' if kind == 'file' else 'file'}; name a {kind}"
    parent = path.parent
    while not parent.exists():  # ends at the root or at "."
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, so {path} cannot be made under it; choose another path"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable here, so {path} cannot be made; choose another path"
    return None


def image_out_problem(out: Path) -> Optional[str]:
    """Why a plot cannot be written to `out` (a folder, a path under a file, a format matplotlib does not write), or
    None: the commands check it before they read or fit anything."""
    from matplotlib.backend_bases import FigureCanvasBase
    formats = FigureCanvasBase.get_supported_filetypes()
    if Path(out).suffix.lower().lstrip(".") in formats or Path(out).is_dir():
        return out_path_problem(out)
    return (f"{out}: name an image file ending in .png, .pdf or .svg (or another format matplotlib writes: "
            f"{', '.join(sorted(formats))})")


def log_traceback(error: BaseException, path: Path, who: str, extra: str = "") -> Optional[Path]:
    """Append `error`'s traceback (and `extra`, more of them) to the log `path`, headed by the time and `who`; None
    when the disk refuses that write too. A failure's message then stays one line and points here."""
    import time
    import traceback
    try:
        with open(path, "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}, {who}\n{''.join(traceback.format_exception(error))}"
                    f"{extra}\n")
    except OSError:
        return None
    return path

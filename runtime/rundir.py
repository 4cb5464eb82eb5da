"""One writer per run directory: `lock_run_dir` takes `<run>/run.lock` before a run reads or writes anything there,
and holds it until the run ends (docs/reliability.md).

Rank 0 takes the lock for all ranks of a launch and tells them how it went, so they agree. The lock is an exclusive
`flock` on the file, which the kernel drops when its process dies, however it dies: a lock left by a killed run is
taken over at once, and the file's text (host, pid, start time) says whose it was. A run that ends releases the lock
and empties the file, so a non-empty file found free was left by a run that did not end.

Shared filesystems: NFS (with its lock daemon) and Lustre mounted with `-o flock` pass flock between nodes; where a
filesystem refuses flock, the file's text decides instead: a holder on this host that is no longer running is taken
over, any other holder is refused with the command that removes its lock.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch.distributed as dist

from runtime.files import log_traceback

LOCK_FILE = "run.lock"
ERRORS_LOG = "errors.log"  # <run>/: tracebacks of writes the disk refused
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS}


class RunDirError(RuntimeError):
    """A run directory that cannot be used now: another process holds it, or it cannot be created or written."""


@dataclass
class RunLock:
    """The held lock of one run directory (rank 0 holds the file; other ranks hold nothing). `release()` at the end."""

    path: Path
    fd: Optional[int] = None
    note: Optional[str] = None  # what acquiring found, for the run to print: a lock taken over
    made_dir: bool = False  # the run directory did not exist before this lock

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)  # released cleanly: an empty file
        except OSError:
            pass  # a full or read-only disk: the lock still goes with the descriptor
        if self.made_dir and [p.name for p in self.path.parent.iterdir()] == [LOCK_FILE]:
            # A start refused before it wrote anything (a config or data error) leaves no empty run directory
            self.path.unlink(missing_ok=True)
            self.path.parent.rmdir()
        os.close(self.fd)  # drops the flock
        self.fd = None


def lock_run_dir(run_dir: Path, rank: int = 0) -> RunLock:
    """Create `run_dir` and take its lock (rank 0), or raise RunDirError on every rank saying who holds it or what the
    filesystem refused. Collective when a process group is initialized: every rank must call it."""
    run_dir = Path(run_dir)
    lock, problem = RunLock(run_dir / LOCK_FILE), None
    if rank == 0:
        try:
            lock = _acquire(run_dir)
        except RunDirError as e:
            problem = str(e)
    if dist.is_available() and dist.is_initialized():
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0]
    if problem is not None:
        raise RunDirError(problem)
    return lock


def _acquire(run_dir: Path) -> RunLock:
    path = run_dir / LOCK_FILE
    made_dir = not run_dir.exists()
    odd = _not_a_lock_file(path)
    if odd:
        raise RunDirError(f"{path} is {odd}, not the run's lock file: remove it (`rm -r {path}`) and run again")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"cannot create or write the run directory {run_dir} ({_reason(e)}): choose a writable "
                          "log.out_dir, or fix its permissions") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        flocked = True
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RunDirError(f"{run_dir} is in use by {_who(holder)} (its lock: {path}); two runs writing one "
                          "directory would overwrite each other's checkpoints and metrics. Wait for it to end, stop "
                          "it, or use another log.run_name") from None
    except OSError as e:
        if e.errno not in _NO_FLOCK:
            os.close(fd)
            raise RunDirError(f"cannot lock {path} ({_reason(e)})") from None
        flocked = False
    previous = _read(fd)
    if not flocked and previous and not _gone(previous):
        os.close(fd)
        raise RunDirError(f"{run_dir} may be in use by {_who(previous)}: this filesystem has no flock, and that "
                          f"process cannot be checked from here. If it has ended, `rm {path}` and run again")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me()).encode(), 0)
        os.fsync(fd)
    except OSError as e:
        os.close(fd)
        raise RunDirError(f"cannot write the run directory {run_dir} ({_reason(e)}): free space, or choose another "
                          "log.out_dir") from None
    note = (f"took over the lock of {_who(previous)}, which did not end cleanly (killed, or its machine went down)"
            if previous else None)
    return RunLock(path, fd, note, made_dir)


def _not_a_lock_file(path: Path) -> Optional[str]:
    """What stands where the lock file goes, when it is not a plain file (None: a plain file, or nothing)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"a link to {os.readlink(path)}"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    return None if stat.S_ISREG(st.st_mode) else "a device or other special file"


def write_failure(e: OSError, run_dir: Path) -> RunDirError:
    """A write the disk refused during a run (full, over quota, read-only, failing), as one line naming what to do;
    the traceback goes to `<run>/errors.log` when the disk takes it."""
    where = f": {e.filename}" if e.filename else ""
    log = log_traceback(e, Path(run_dir) / ERRORS_LOG, f"pid {os.getpid()}")
    told = f"; the traceback is in {log}" if log else ""
    return RunDirError(f"a write failed ({_reason(e)}{where}){told}. The newest checkpoint is intact: free space (or "
                       "fix the disk) and run the same command to resume from it")


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _read(fd: int) -> Optional[dict]:
    """The holder's text, or None for an empty file (released cleanly, or never held). Unreadable text counts as a
    holder of unknown identity."""
    data = os.pread(fd, 4096, 0)
    if not data.strip():
        return None
    try:
        holder = json.loads(data)
        return holder if isinstance(holder, dict) else {}
    except ValueError:
        return {}


def _who(holder: Optional[dict]) -> str:
    if not holder:
        return "another process"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {holder.get('started', '?')})"


def _gone(holder: dict) -> bool:
    """Whether the holder is known to have ended: a process of this host that no longer runs."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it runs, as another user
    return False


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__

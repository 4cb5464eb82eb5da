"""A checkpoint's files: their names, the marker that makes a checkpoint complete, finding the complete ones, and
checking one whole before anything trusts it (each saving rank's CRC-32 of what it wrote, DCP's byte ranges, the
step that its folder, marker and extra.pt give). runtime/checkpoint.py saves and loads; this module never loads a
tensor.
"""
from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any, Optional

import torch
from torch.distributed.checkpoint import FileSystemReader

from runtime.files import atomic_write

MARKER = "COMPLETE"
EXTRA_FILE = "extra.pt"
STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: missing, incomplete, or not matching the model/optimizer."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


# ---------------------------------------------------------------------------------------------------- finding


def complete_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    if not ckpt_dir.is_dir():
        return []
    found = []
    for path in ckpt_dir.iterdir():
        m = STEP_DIR.match(path.name)
        if m and path.is_dir() and (path / MARKER).is_file():
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest_checkpoint(ckpt_dir: Path) -> Optional[Path]:
    """The newest complete checkpoint in `ckpt_dir`, or None. Tmp dirs and unmarked dirs never count."""
    complete = complete_checkpoints(Path(ckpt_dir))
    return complete[-1][1] if complete else None


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint dir from a checkpoint dir, a `checkpoints/` dir (its latest) or a run dir (its latest)."""
    path = Path(path)
    if (path / MARKER).is_file():
        return path
    if path.is_dir() and STEP_DIR.match(path.name):
        newest = latest_checkpoint(path.parent)
        raise CheckpointError(f"{path} is incomplete (no {MARKER} marker): the save that wrote it did not finish; "
                              + (f"the newest complete one is {newest}" if newest else "none beside it is complete"))
    for ckpt_dir in (path, path / "checkpoints"):
        latest = latest_checkpoint(ckpt_dir)
        if latest is not None:
            return latest
    raise CheckpointError(f"no complete checkpoint at {path} (looked for {MARKER} in {path}, in {path}/step_*, "
                          f"and in {path}/checkpoints/step_*)")


def read_marker(path: Path) -> dict:
    return json.loads((Path(path) / MARKER).read_text())


# ----------------------------------------------------------------------------------------------- verifying

CHECKSUMS = "checksums_rank{}.json"  # per saving rank: {"crc32": {file: [size, crc32]}} of the files it wrote
_CHUNK = 8 << 20


def file_crc32(path: Path) -> int:
    """zlib's CRC-32 of a file, read in 8 MiB chunks: about 2 GB/s on one core (docs/benchmarks.md). It finds any
    change of up to 32 bits in a row, and any other with odds 1 − 2⁻³²: damage, not tampering, is the threat."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_checksums(step_dir: Path, rank: int) -> None:
    """The checksums of the files this rank wrote into `step_dir`: its DCP data files and RNG states, and for rank
    0 DCP's metadata and the trainer's extra.pt. Written before the marker, so a complete checkpoint has them."""
    names = sorted(p.name for p in step_dir.glob(f"__{rank}_*.distcp")) + [f"rng_rank{rank}.pt"]
    names += [".metadata", EXTRA_FILE] if rank == 0 else []
    sums = {n: [(step_dir / n).stat().st_size, file_crc32(step_dir / n)] for n in names}
    atomic_write(step_dir / CHECKSUMS.format(rank), json.dumps({"crc32": sums}, sort_keys=True).encode())


def checksum_mismatches(step_dir: Path, world: int) -> list[str]:
    """Every file of a checkpoint whose size or CRC-32 is not what its saving rank wrote, with why."""
    problems = []
    for r in range(world):
        try:
            sums = json.loads((step_dir / CHECKSUMS.format(r)).read_text())["crc32"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"{CHECKSUMS.format(r)} ({'missing' if isinstance(e, FileNotFoundError) else 'unreadable'})")
            continue
        for name, (size, crc) in sorted(sums.items()):
            path = step_dir / name
            if not path.is_file():
                continue  # missing files are found by the checks that name what they are
            if path.stat().st_size != size:
                problems.append(f"{name} (size {path.stat().st_size:,}, saved {size:,})")
            elif (have := file_crc32(path)) != crc:
                problems.append(f"{name} (changed in place: CRC-32 {have:08x}, saved {crc:08x})")
    return problems


def damaged_files(path: Path) -> list[str]:
    """The files of checkpoint `path` that cannot be read, each with why: the marker, extra.pt, every saving rank's
    RNG file, DCP's metadata, its data files against the byte ranges the metadata gives them (a truncated or
    missing shard), every file against the checksum its saving rank wrote (a change in place), and the step its
    folder name, marker and extra.pt give. Empty: intact. No tensor is loaded; every byte is read once."""
    path, problems = Path(path), []

    def readable(name: str, read) -> Any:
        try:
            return read()
        except Exception as e:  # noqa: BLE001 - any failure to read is the finding
            why = e.strerror if isinstance(e, OSError) and e.strerror else f"unreadable: {type(e).__name__}"
            problems.append(f"{name} ({why})")
            return None
    marker = readable(MARKER, lambda: read_marker(path))
    world = marker.get("world_size") if isinstance(marker, dict) else None
    if marker is not None and not isinstance(world, int):
        problems.append(f"{MARKER} (no world_size)")
    extra = readable(EXTRA_FILE, lambda: torch.load(path / EXTRA_FILE, weights_only=True, map_location="cpu"))
    # One checkpoint, one step: its folder's name, its marker and the step it restores must agree.
    named = STEP_DIR.match(path.name)
    steps = {"folder name": int(named.group(1)) if named else None,
             MARKER: marker.get("step") if isinstance(marker, dict) else None,
             EXTRA_FILE: extra.get("step") if isinstance(extra, dict) else None}
    if len({v for v in steps.values() if v is not None}) > 1:
        problems.append("steps disagree (" + ", ".join(f"{k} {v}" for k, v in steps.items() if v is not None) + ")")
    for r in range(world if isinstance(world, int) else len(list(path.glob("rng_rank*.pt")))):
        readable(f"rng_rank{r}.pt", lambda r=r: torch.load(path / f"rng_rank{r}.pt", weights_only=True))
    metadata = readable(".metadata", lambda: FileSystemReader(str(path)).read_metadata())
    if isinstance(marker, dict) and marker.get("checksums") and isinstance(world, int):
        problems += checksum_mismatches(path, world)
    if metadata is not None:
        needed: dict[str, int] = {}
        for info in metadata.storage_data.values():
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
        for name, size in sorted(needed.items()):
            have = (path / name).stat().st_size if (path / name).is_file() else None
            if have is None or have < size:
                problems.append(f"{name} ({'missing' if have is None else f'truncated: {have:,} of {size:,} bytes'})")
    return problems

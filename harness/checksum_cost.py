"""What the checksums cost: a checkpoint's (runtime/checkpoint.py, `file_crc32`) and a data shard's (data/verify.py,
sha256), each over a file of --gib GiB of random bytes read from the page cache (a save sums the files it has just
written; a resume, or a run's first look at its shards, may read them from disk first, which this does not time),
beside the same file's plain read, in alternating rounds.

    python -m harness.checksum_cost                  # 1 GiB, 5 rounds
    python -m harness.checksum_cost --gib 4 --repeats 3

Prints, per part, the median [min–max] seconds per GiB and the checksum's cost over the read alone. The file is
written to a temporary folder and removed.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=1.0, help="the file's size in GiB")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after one warm-up round")
    args = p.parse_args(argv)
    if args.gib <= 0 or args.repeats < 1:
        p.error("--gib must be positive and --repeats at least 1")
    from runtime.checkpoint_files import _CHUNK, file_crc32

    def read(path: Path) -> None:
        with open(path, "rb") as f:
            while f.read(_CHUNK):
                pass
    size = int(args.gib * 2**30)
    def sha256(path: Path) -> None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    times: dict[str, list[float]] = {"read": [], "read + CRC-32": [], "read + sha256": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "shard.distcp"
        with open(path, "wb") as f:
            for _ in range(0, size, _CHUNK):
                f.write(os.urandom(min(_CHUNK, size - f.tell())))
        for i in range(args.repeats + 1):
            for name, fn in (("read", read), ("read + CRC-32", file_crc32), ("read + sha256", sha256)):
                t0 = time.perf_counter()
                fn(path)
                if i:  # the first round warms the page cache
                    times[name].append((time.perf_counter() - t0) / args.gib)
    for name, ts in times.items():
        print(f"{name}: {statistics.median(ts):.3f} s/GiB [{min(ts):.3f}–{max(ts):.3f}]")
    for name in ("CRC-32", "sha256"):
        extra = statistics.median(a - b for a, b in zip(times[f"read + {name}"], times["read"]))
        print(f"{name} adds {extra:.3f} s/GiB over the read ({1 / max(extra, 1e-9):.2f} GiB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

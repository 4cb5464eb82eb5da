"""Convert a run's checkpoints of the older format (scale-vector banks on disk) to the one the load path reads: each
vector under its own name (runtime/checkpoint_convert.py). Offline, one process; the originals move into
`checkpoints/set_aside/`.

    python -m scripts.convert_checkpoint runs/tiny_cpu                 # every complete checkpoint of the run
    python -m scripts.convert_checkpoint runs/tiny_cpu/checkpoints/step_00000100
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from config import load_saved_config
from strictconfig.config import ConfigError
from model.llama import Llama
from runtime.checkpoint import CheckpointError, complete_checkpoints
from runtime.checkpoint_convert import convert, holds_banks
from runtime.rundir import RunDirError, lock_run_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", type=Path, help="a run directory, or one checkpoint (checkpoints/step_NNNNNNNN) of it")
    args = p.parse_args(argv)
    path = args.path
    is_step = (path / "COMPLETE").exists()
    run = path.parent.parent if is_step else path
    if not (run / "config.yaml").is_file():
        p.error(f"{path}: give a run directory (with config.yaml and checkpoints/) or a checkpoint inside one")
    try:
        cfg = load_saved_config(run / "config.yaml")
    except ConfigError as e:
        print(f"error: {run} has no usable config.yaml ({e})", file=sys.stderr)
        return 2
    with torch.device("meta"):
        model = Llama(cfg.model)  # the saved config is resolved: vocab_size is set
    steps = [path] if is_step else [d for _, d in complete_checkpoints(run / "checkpoints")]
    todo = [d for d in steps if holds_banks(d)]
    for d in sorted(set(steps) - set(todo)):
        print(f"{d}: already in the current format")
    if not todo:
        return 0
    try:
        lock = lock_run_dir(run)  # no run may write the directory while its checkpoints are swapped
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        for d in todo:
            aside = convert(d, model)
            print(f"{d}: converted (the original is {aside})")
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train one run, top to bottom.

    python train.py                                   # the built-in default: configs/tiny_cpu.yaml on CPU
    python train.py --config configs/dense_0.12b_unified.yaml optim.lr=3e-3
    torchrun --nproc_per_node=8 train.py --config configs/dense_0.12b_unified.yaml

Re-running the same command in the same run directory resumes from the newest complete checkpoint.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Optional

import torch

from config import default_run_name, load_config, resolve_vocab, run_tags

from strictconfig.config import ConfigError

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "tiny_cpu.yaml"


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="YAML config; repeat to layer (later files win). "
                                                     f"Default: {DEFAULT_CONFIG.relative_to(DEFAULT_CONFIG.parents[1])}")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--dry-run", action="store_true", help="build the model, print its parameter breakdown, exit")
    p.add_argument("--print-run-dir", action="store_true", help="print the run directory this command uses and exit")
    p.add_argument("--prepare-only", action="store_true",
                   help="prepare the config's data (data.source → data.dir, as a run does on first use) and exit")
    p.add_argument("--stop-at-step", type=int, metavar="K",
                   help="checkpoint and exit after step K (the schedule still spans train.steps); "
                        "run the same command again to continue")
    p.add_argument("--resume-step", type=int, metavar="K",
                   help="resume from the checkpoint of step K rather than the newest; newer checkpoints are moved "
                        "into checkpoints/set_aside/, never deleted")
    p.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. optim.lr=3e-3 train.steps=100")
    args = p.parse_intermixed_args(argv)  # options and key=value overrides in any order
    if args.stop_at_step is not None and args.stop_at_step < 1:
        p.error(f"--stop-at-step {args.stop_at_step}: K must be ≥ 1 (the step after which to checkpoint and exit)")
    if args.resume_step is not None and args.resume_step < 1:
        p.error(f"--resume-step {args.resume_step}: K must be ≥ 1 (a checkpoint's step)")
    if None not in (args.stop_at_step, args.resume_step) and args.stop_at_step <= args.resume_step:
        p.error(f"--stop-at-step {args.stop_at_step} is at or below --resume-step {args.resume_step}: there would be "
                "nothing to train")
    return args


def main(argv: Optional[list[str]] = None) -> dict:
    """Run training; returns a summary (final step, train loss, val loss, run dir) for scripts and tests."""
    args = parse_args(argv)
    config_paths = args.config or [DEFAULT_CONFIG]
    cfg = load_config(config_paths, args.overrides)
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return {}
    if args.dry_run:  # the model only: no data, no process group
        from model.llama import Llama
        from model.summary import format_breakdown
        with torch.device("meta"):
            print(format_breakdown(Llama(resolve_vocab(cfg)), cfg.data.seq_len))
        return {}
    if args.prepare_only:  # the data only: no model, no process group
        from data.prepare import prepare
        print(f"prepared {prepare(cfg.data)}")  # a finished dir with the same settings is kept as it is
        return {}
    run_name = cfg.log.run_name or default_run_name(config_paths, args.overrides)
    cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, run_name=run_name))
    if args.print_run_dir:
        print(Path(cfg.log.out_dir) / run_name)
        return {}

    # ---- distributed: nccl on CUDA, gloo on CPU; a one-rank group for a plain `python train.py`
    from runtime.dist import end_with_launcher, init_distributed, shutdown
    from runtime.rundir import DISK_ERRNOS, lock_run_dir, write_failure
    from runtime.trainer import Trainer
    end_with_launcher()  # under torchrun: a SIGTERM when the launcher dies, so no worker trains on alone
    dist_info = init_distributed(cfg.train.device)
    if dist_info.device.type == "cpu" and cfg.train.cpu_malloc_tuning:
        from runtime.cpu import tune_glibc_malloc
        tune_glibc_malloc()
    clean, trainer, run_lock = False, None, None
    try:
        # ---- one writer per run directory: its lock, before anything there is read or written (runtime/rundir.py)
        run_lock = lock_run_dir(Path(cfg.log.out_dir) / run_name, dist_info.rank)
        if run_lock.note:
            print(f"warning: {run_lock.note}", file=sys.stderr)
        # ---- data → model → loader → resume from the newest intact checkpoint (runtime/trainer.py)
        trainer = Trainer.for_run(cfg, dist_info, resume_step=args.resume_step)
        # ---- the loop: step → log → evaluate → checkpoint; a SIGTERM/SIGINT finishes the step, checkpoints, exits
        result = trainer.fit(stop_at_step=args.stop_at_step, wandb_tags=run_tags(cfg))  # strategy, optimizer, lr…
        clean = True
        return result
    except OSError as e:  # a full, read-only or failing disk under metrics, config or wandb: one line, not a traceback
        if e.errno not in DISK_ERRNOS:
            raise
        raise write_failure(e, Path(cfg.log.out_dir) / run_name) from e
    finally:
        # The FSDP2 model (its DTensors hold the device mesh, and so the process group) sits in reference cycles:
        # dropped here, shutdown's gc.collect frees it while the group is alive. Left to a later collection (the next
        # run's, in a process that trains twice) its destructors would run against a destroyed group (trap 1).
        del trainer
        if run_lock is not None:
            run_lock.release()
        shutdown(dist_info, clean=clean)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input or a stopped run, each with a message that says what to do: no traceback."""
    from data.builtin import BuiltinCorpusError
    from data.shards import DataError
    from data.sources import SourceError
    from data.tokenizer import TokenizerError
    from runtime.checkpoint import CheckpointError
    from runtime.dist import LaunchError
    from runtime.rundir import RunDirError
    from runtime.trainer import NonFiniteError
    return (ConfigError, NonFiniteError, DataError, SourceError, TokenizerError, BuiltinCorpusError, CheckpointError,
            LaunchError, RunDirError)


def cli(argv: Optional[list[str]] = None) -> int:
    """`python train.py`: main, with a user error (or a Ctrl-C outside the loop) said in one line and an exit code."""
    try:
        main(argv)
    except _user_errors() as e:
        # A config error is the same on every rank (each reads the same config): rank 0 says it, once per run.
        # Other errors may be one rank's own (its node's data, its disk), so each rank says its own.
        if not isinstance(e, ConfigError) or os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr)
        elif "TORCHELASTIC_RUN_ID" in os.environ:
            # torchrun stops every rank once one exits with an error: were this rank first, it could stop rank 0
            # before rank 0 said why. Rank 0 exits right after saying it; this one waits for that, 30 s at most.
            time.sleep(30)
        return 2
    except KeyboardInterrupt:  # a Ctrl-C outside the loop (building, resuming), or a second one inside it
        print("error: interrupted; nothing half-written is trusted: the same command resumes from the newest intact "
              "checkpoint (or starts the run)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())

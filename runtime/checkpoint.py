"""Checkpoints with torch.distributed.checkpoint (DCP): sharded save, resharding load, crash-safe on disk.

Layout of one checkpoint (`<run>/checkpoints/step_00001000/`):

    .metadata, __<rank>_0.distcp   DCP: {"model": model state, "optim": optimizer state}, one file per rank
    extra.pt                       the trainer's dict (step, tokens, loader state, config YAML, git commit); rank 0
    rng_rank<r>.pt                 rank r's RNG states (torch CPU, CUDA, python `random`, numpy)
    COMPLETE                       JSON {step, world_size, torch}; written LAST, so its presence means "whole"

A save writes everything into `.tmp-step_<8-digit step>`, renames it to `step_<8-digit step>` and only then writes the
marker: a crash at any point leaves either a tmp dir or a dir without the marker, both ignored by
`latest_checkpoint` and removed by the next save's pruning.

A checkpoint holds the reference model's names (model/): the fast path's banks are written and read as their
vectors (fast/banks.py). A load takes another FFN padding too (runtime/checkpoint_layouts.py).

One file of about 470 lines on purpose: saving, finding and loading share the layout above and the all-or-nothing
protocol across ranks, and a reader checks one against the other here rather than across modules.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from fast.banks import reference_state, stage_banks
from runtime.checkpoint_layouts import finish_layouts, stage_layouts
from runtime.checkpoint_files import (EXTRA_FILE, MARKER, STEP_DIR, CheckpointError, complete_checkpoints,  # noqa: F401
                                     damaged_files, latest_checkpoint, read_marker, resolve_checkpoint, step_dir_name,
                                     write_checksums)  # F401: the callers' names for a checkpoint's finding and checking
from runtime.files import atomic_write, fsync_dir, log_traceback
from runtime.rng import rng_equal, rng_state, set_rng_state

ERRORS_LOG = "errors.log"  # in the checkpoints dir: the tracebacks of failed saves
BANKS_ON_DISK = re.compile(r"^model\.layers\.\d+\.scales\.")  # the older format: runtime/checkpoint_convert.py
_TMP_PREFIX = ".tmp-step_"






@dataclass(frozen=True)
class _Dist:
    rank: int
    world: int
    active: bool  # an initialized process group: collectives (barrier, DCP coordination) are needed


def _dist() -> _Dist:
    if dist.is_available() and dist.is_initialized():
        return _Dist(dist.get_rank(), dist.get_world_size(), True)
    return _Dist(0, 1, False)


def _barrier(d: _Dist) -> None:
    if d.active:
        dist.barrier()


@contextlib.contextmanager
def _single_process_quiet(d: _Dist) -> Iterator[None]:
    """DCP warns on every single-process save/load; without a process group that is exactly our intent."""
    with warnings.catch_warnings():
        if not d.active:
            warnings.filterwarnings("ignore", message="torch.distributed is .*unavailable or uninitialized")
        yield




# ---------------------------------------------------------------------------------------------------- saving


def save_checkpoint(ckpt_dir: Path, step: int, model: nn.Module, optimizer: Optional[torch.optim.Optimizer],
                    extra: dict, keep: int) -> Path:
    """Save model + optimizer (sharded, every rank participates), `extra` (rank 0) and each rank's RNG states.

    Collective: every rank must call it with the same arguments. Returns the final checkpoint directory.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}: must keep at least the checkpoint just written")
    d = _dist()
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / step_dir_name(step)
    tmp = ckpt_dir / f"{_TMP_PREFIX}{step:08d}"
    # Validate `extra` on every rank before any collective (so all ranks raise together instead of the others
    # waiting in a barrier), against exactly the loader resume will use, instead of failing at resume time.
    extra_bytes = _serialize_extra(extra)
    previous = latest_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None

    def write() -> None:  # every rank: its DCP shard and RNG file; rank 0 also the trainer's dict
        if d.rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # left by a save that crashed at this same step
                shutil.rmtree(tmp)
            tmp.mkdir()
        _barrier(d)
        state = {"model": get_model_state_dict(model)}
        if optimizer is not None:
            state["optim"] = get_optimizer_state_dict(model, optimizer)
        state = reference_state(model, state)  # the fast path's banks under the reference's names
        with _single_process_quiet(d):
            dcp.save(state, checkpoint_id=tmp, no_dist=not d.active)  # FileSystemWriter fsyncs its files
        atomic_write(tmp / f"rng_rank{d.rank}.pt", _to_bytes(rng_state()))
        if d.rank == 0:
            atomic_write(tmp / EXTRA_FILE, extra_bytes)
        write_checksums(tmp, d.rank)  # dcp.save returns once rank 0 wrote .metadata: every file is whole

    # A failed write (a full disk, a quota, a lost mount) on any rank stops every rank with the same error: none
    # may wait in a barrier for a rank that gave up. The previous checkpoint is never touched before the new one
    # is whole, so it stays the one a resume loads.
    _all_or_nothing(d, write, step, tmp, previous, cleanup=tmp)

    def commit() -> None:  # rank 0: rename into place, then the marker that makes it a checkpoint
        if d.rank != 0:
            return
        if final.exists():  # re-saving a step (e.g. after a crash right after this step): replace it whole
            old = tmp.with_name(tmp.name + ".old")  # a tmp name: if the delete is cut short, pruning finishes it
            (final / MARKER).unlink(missing_ok=True)
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            _remove(old)
        os.replace(tmp, final)
        fsync_dir(ckpt_dir)
        marker = {"step": step, "world_size": d.world, "torch": torch.__version__, "checksums": True}
        atomic_write(final / MARKER, json.dumps(marker).encode())

    _all_or_nothing(d, commit, step, final, previous, cleanup=None)
    if d.rank == 0:  # the new checkpoint is complete: a prune that fails costs disk space, not the run
        try:
            _prune(ckpt_dir, keep, just_written=final)
        except OSError as e:
            print(f"warning: the checkpoint of step {step} is saved, but removing older ones from {ckpt_dir} failed "
                  f"({e.strerror or type(e).__name__}): they stay; remove them by hand to free the space",
                  file=sys.stderr)
    _barrier(d)  # every rank returns to a folder already pruned
    return final


def _all_or_nothing(d: _Dist, fn, step: int, where: Path, previous: Optional[Path], cleanup: Optional[Path]) -> None:
    """Run `fn` on every rank; if it raised on any of them, raise one CheckpointError on all of them (after the
    others finished theirs) instead of leaving some ranks in a collective forever."""
    error: Optional[BaseException] = None
    try:
        fn()
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - OSError (ENOSPC, EDQUOT, EIO), … DCP's
        error = e  # CheckpointException (a BaseException) carries a rank's OSError
    # NCCL reduces only CUDA tensors; gloo (CPU) takes CPU ones.
    device = f"cuda:{torch.cuda.current_device()}" if d.active and dist.get_backend() == "nccl" else "cpu"
    failed = torch.tensor([0.0 if error is None else 1.0], device=device)
    if d.active:
        dist.all_reduce(failed)
    n_failed = int(failed.item())
    if n_failed == 0:
        return
    if d.rank == 0 and cleanup is not None:
        shutil.rmtree(cleanup, ignore_errors=True)  # frees the space the partial save took
    _barrier(d)
    if error is None:
        what = f"on {n_failed} other rank(s)"
    else:  # one line; the library's traceback goes to a file beside the checkpoints, if the disk takes it
        what = _first_failure(error) if isinstance(error, CheckpointException) else f"{type(error).__name__}: {error}"
        ranks = "".join(f"rank {r}:\n{''.join(traceback.format_exception(exc))}"
                        for r, (exc, _) in sorted(getattr(error, "failures", {}).items()))  # DCP's, per rank
        log = log_traceback(error, where.parent / ERRORS_LOG, f"rank {d.rank}", ranks)
        what += f"; the traceback is in {log}" if log else ""
    resume = (f"the previous checkpoint {previous} is intact: free space (or fix the path) and run the same command "
              f"to resume from step {read_marker(previous)['step']}") if previous is not None else (
        "there is no earlier checkpoint: free space (or fix the path) and run the same command to start again")
    raise CheckpointError(f"writing the checkpoint of step {step} to {where} failed ({what}); {resume}") from error


def _prune(ckpt_dir: Path, keep: int, just_written: Path) -> None:
    complete = complete_checkpoints(ckpt_dir)
    survivors = {p for _, p in complete[-keep:]} | {just_written}
    for _, path in complete:
        if path not in survivors:
            _remove(path)
    # Debris of crashed saves: tmp dirs and renamed-but-unmarked dirs. Only one save runs at a time.
    for path in ckpt_dir.iterdir():
        if path == just_written or not path.is_dir():
            continue
        if path.name.startswith(_TMP_PREFIX) or (STEP_DIR.match(path.name) and not (path / MARKER).is_file()):
            _remove(path)


def _remove(path: Path) -> None:
    # Drop the marker first: a delete interrupted halfway must leave a dir that no longer looks complete.
    (path / MARKER).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _serialize_extra(extra: dict) -> bytes:
    if not isinstance(extra, dict):
        raise TypeError(f"checkpoint extra must be a dict, got {type(extra).__name__}")
    data = _to_bytes(extra)
    try:
        _from_bytes(data)
    except Exception as e:
        # torch's message is a page of advice about trusting sources; its one useful line names the type.
        lines = [ln for ln in str(e).splitlines() if "Unsupported global" in ln] or [str(e)[:300]]
        raise TypeError("checkpoint extra must hold only dicts, lists, tuples, str/int/float/bool/None and "
                        f"tensors (resume loads it with torch.load(weights_only=True)): {lines[0].strip()}") from None
    return data


def _from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


# ---------------------------------------------------------------------------------------------------- loading


def load_checkpoint(path: Path, model: nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> dict:
    """Load model + optimizer (resharding to the current layout) and this rank's RNG states; return `extra`.

    Collective when a process group is initialized. A different world size than the saving run's loads the
    weights and optimizer state fine (DCP reshards). The RNG states carry over too when every saving rank's were
    equal — as in training, where every rank seeds alike and nothing draws per rank — and then every rank takes
    them; per-rank streams that differ cannot be remapped onto another number of ranks: a warning says so.
    """
    path = resolve_checkpoint(path)
    d = _dist()
    _load_states(path, model, optimizer, d)
    saved_world = read_marker(path)["world_size"]
    if saved_world == d.world:
        set_rng_state(torch.load(path / f"rng_rank{d.rank}.pt", weights_only=True))
        return load_extra(path)
    shared = [None]  # rank 0 reads every saved rank's file once; the others get its verdict
    if d.rank == 0:
        states = [torch.load(path / f"rng_rank{r}.pt", weights_only=True) for r in range(saved_world)]
        shared = [states[0] if all(rng_equal(states[0], s) for s in states[1:]) else None]
    if d.active:
        dist.broadcast_object_list(shared, src=0)
    if shared[0] is not None:
        set_rng_state(shared[0])
    elif d.rank == 0:
        warnings.warn(f"checkpoint {path} was saved by {saved_world} ranks with different RNG states, this run has "
                      f"{d.world}: weights and optimizer state were resharded, but per-rank RNG streams cannot be "
                      "remapped, so random draws after the resume differ from an uninterrupted run's",
                      RuntimeWarning, stacklevel=2)
    return load_extra(path)


def load_model_weights(model: nn.Module, path: Path) -> dict:
    """Model weights only (no optimizer, no RNG), for tools: sampling, export. Returns the checkpoint's `extra`.

    `path` may be a checkpoint, a `checkpoints/` dir or a run dir. Works in a plain single process on a
    checkpoint saved by any number of FSDP ranks (DCP reshards into the unsharded module).
    """
    path = resolve_checkpoint(path)
    problems = damaged_files(path)
    if problems:
        raise CheckpointError(f"checkpoint {path} is truncated or damaged ({'; '.join(problems)}): move it aside and "
                              "give an intact one (a run resumes from its newest intact checkpoint by itself)")
    _load_states(path, model, None, _dist())
    return load_extra(path)


def load_extra(path: Path) -> dict:
    return torch.load(resolve_checkpoint(path) / EXTRA_FILE, weights_only=True, map_location="cpu")


def checkpoint_tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP checkpoint (model and optimizer), flat by dotted path, as one process reads it (it
    writes `<step dir>.pt` beside the checkpoint)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = step_dir.parent / f"{step_dir.name}.pt"
    if not out.exists():
        dcp_to_torch_save(step_dir, out)
    flat = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value
    walk("", torch.load(out, weights_only=False))
    return flat


def _load_states(path: Path, model: nn.Module, optimizer: Optional[torch.optim.Optimizer], d: _Dist) -> None:
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    # Check names and shapes ourselves first: DCP's own error for a different architecture is a planner
    # traceback. Every rank reads the same metadata, so every rank raises together (no hang in a collective).
    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    if any(BANKS_ON_DISK.match(k) for k in metadata):
        raise CheckpointError(f"checkpoint {path} stores scale-vector banks (layers.N.scales.*), the format before "
                              "checkpoints held each vector under its own name: convert it once with `python -m "
                              f"scripts.convert_checkpoint {path.parent.parent}` (the original is kept in "
                              "checkpoints/set_aside/), then run the same command again")
    staged = stage_banks(model, state) + stage_layouts(model, state, metadata)
    problems = _mismatches(state, metadata)
    if problems:
        raise CheckpointError(f"checkpoint {path} does not match this model/optimizer "
                              f"(a different architecture, scale-vector design or optimizer?):\n  "
                              + "\n  ".join(problems))
    # Tensors are checked strictly above; partial load only lets a param-group hyperparameter that a newer
    # torch added to the optimizer (absent from an older checkpoint) keep its constructor value.
    try:
        with _single_process_quiet(d):
            dcp.load(state, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=True),
                     no_dist=not d.active)
    except CheckpointException as e:  # raised on every rank alike (DCP gathers the ranks' read errors)
        raise CheckpointError(f"checkpoint {path} could not be read: a file in it is truncated or damaged "
                              f"({_first_failure(e)}); load an older checkpoint in {path.parent}, or move {path} "
                              "aside to resume from the one before it") from e
    try:
        finish_layouts(staged)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from e
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optim"])


def _first_failure(e: CheckpointException) -> str:
    """One rank's read error in one line (DCP's own text is a traceback per rank)."""
    rank, (exc, _trace) = min(e.failures.items(), key=lambda item: item[0])
    return f"rank {rank}: {type(exc).__name__} {exc}".rstrip()


def _mismatches(state: dict, metadata: dict, show: int = 5) -> list[str]:
    """Human-readable differences between our tensors and the checkpoint's (`model.*`, `optim.state.*`)."""
    ours: dict[str, tuple[int, ...]] = {}
    for fqn, t in state["model"].items():
        ours[f"model.{fqn}"] = tuple(t.shape)  # a DTensor's .shape is the global shape, as in the metadata
    for fqn, per_param in state.get("optim", {}).get("state", {}).items():
        for name, t in per_param.items():
            if isinstance(t, torch.Tensor):
                ours[f"optim.state.{fqn}.{name}"] = tuple(t.shape)
    prefixes = ("model.", "optim.state.") if "optim" in state else ("model.",)
    theirs = {k: tuple(v.size) for k, v in metadata.items()
              if k.startswith(prefixes) and isinstance(v, TensorStorageMetadata)}
    problems = []
    for title, keys in (("missing from checkpoint", sorted(ours.keys() - theirs.keys())),
                        ("in checkpoint but not in model", sorted(theirs.keys() - ours.keys()))):
        if keys:
            more = f" … and {len(keys) - show} more" if len(keys) > show else ""
            problems.append(f"{len(keys)} {title}: {', '.join(keys[:show])}{more}")
    shapes = [f"{k}: checkpoint {list(theirs[k])} vs model {list(ours[k])}"
              for k in sorted(ours.keys() & theirs.keys()) if ours[k] != theirs[k]]
    if shapes:
        more = f" … and {len(shapes) - show} more" if len(shapes) > show else ""
        problems.append(f"{len(shapes)} shape mismatches: {'; '.join(shapes[:show])}{more}")
    if "optim" in state:
        groups = {int(k.split(".")[2]) for k in metadata if k.startswith("optim.param_groups.")}
        if len(groups) != len(state["optim"].get("param_groups", [])):
            problems.append(f"optimizer has {len(state['optim']['param_groups'])} param groups, "
                            f"checkpoint has {len(groups)}")
    return problems

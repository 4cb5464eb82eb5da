"""Which checkpoint a run resumes from (runtime/trainer.py, `Trainer.resume`): the newest complete one whose files all
read, every newer damaged one moved into `checkpoints/set_aside/` (never deleted), or the step a user names with
`--resume-step` (docs/reliability.md). Whether a checkpoint reads is runtime/checkpoint.py's `damaged_files`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch.distributed as dist

from runtime.checkpoint import CheckpointError, complete_checkpoints, damaged_files
from runtime.files import atomic_write, fsync_dir

SET_ASIDE = "set_aside"  # <run>/checkpoints/set_aside/: checkpoints a resume passed over, moved there, never deleted
# <run>/checkpoints/rolled_back.json: the step the last --resume-step returned to. A requeued job script that keeps
# the flag then continues the run instead of rolling it back on every restart.
ROLLED_BACK = "rolled_back.json"


def set_aside(path: Path, why: str) -> Path:
    """Move checkpoint `path` into its checkpoints dir's `set_aside/` (a new name if one is taken): a resume and
    pruning no longer see it, and nothing of it is lost. Returns where it went."""
    dest_dir = path.parent / SET_ASIDE
    dest_dir.mkdir(exist_ok=True)
    dest, n = dest_dir / path.name, 1
    while dest.exists():
        dest, n = dest_dir / f"{path.name}.{n}", n + 1
    path.rename(dest)
    (dest / "WHY").write_text(why + "\n")
    fsync_dir(path.parent)
    return dest


def rolled_back_to(ckpt_dir: Path) -> Optional[int]:
    """The step the last --resume-step went back to (None: never, or a record that cannot be read)."""
    try:
        step = json.loads((Path(ckpt_dir) / ROLLED_BACK).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) else None


def resume_point(ckpt_dir: Path, step: Optional[int] = None) -> tuple[Optional[Path], list[str]]:
    """The checkpoint a run resumes from and what was done to get there: (the newest complete checkpoint whose
    files all read, or None; one line per checkpoint set aside). Newer damaged ones are set aside. With `step`, that
    step's checkpoint, and every newer complete one is set aside too (the run trains those steps again, and would
    otherwise prune older checkpoints in their favour). Collective: rank 0 reads and moves, every rank gets its
    verdict (a CheckpointError on every rank if `step` has no intact checkpoint)."""
    active = dist.is_available() and dist.is_initialized()
    verdict: list = [None, [], None]  # path, notes, error
    if not active or dist.get_rank() == 0:
        try:
            verdict = [*_choose(Path(ckpt_dir), step), None]
        except CheckpointError as e:
            verdict = [None, [], str(e)]
    if active:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[2] is not None:
        raise CheckpointError(verdict[2])
    return (Path(verdict[0]) if verdict[0] is not None else None), verdict[1]


def _choose(ckpt_dir: Path, step: Optional[int]) -> tuple[Optional[str], list[str]]:
    complete, notes = complete_checkpoints(ckpt_dir), []
    if step is not None and rolled_back_to(ckpt_dir) == step and any(s > step for s, _ in complete):
        notes.append(f"--resume-step {step}: this run went back to step {step} once already "
                     f"({ckpt_dir / ROLLED_BACK}) and has trained on since, so it continues from its newest "
                     f"checkpoint. To go back to step {step} again, delete that file")
        step = None
    if step is not None:
        chosen = [p for s, p in complete if s == step]
        if not chosen:
            have = ", ".join(str(s) for s, _ in complete) or "none"
            raise CheckpointError(f"--resume-step {step}: {ckpt_dir} has no complete checkpoint of step {step} "
                                  f"(complete: {have})")
        problems = damaged_files(chosen[0])
        if problems:
            raise CheckpointError(f"--resume-step {step}: {chosen[0]} cannot be read ({'; '.join(problems)})")
        for s, p in complete:
            if s > step:
                try:
                    dest = set_aside(p, f"newer than --resume-step {step}")
                except OSError as e:
                    why = e.strerror or type(e).__name__
                    raise CheckpointError(f"--resume-step {step}: {p.name} cannot be set aside ({why}): make "
                                          f"{ckpt_dir} writable and run again") from None
                notes.append(f"set {p.name} aside (newer than --resume-step {step}): {dest}")
        atomic_write(ckpt_dir / ROLLED_BACK, json.dumps({"step": step}) + "\n")
        return str(chosen[0]), notes
    for s, p in reversed(complete):
        problems = damaged_files(p)
        if not problems:
            return str(p), notes
        try:
            dest = set_aside(p, "damaged: " + "; ".join(problems))
        except OSError as e:  # a checkpoints folder that cannot be written: say so, move nothing
            raise CheckpointError(f"checkpoint {p.name} is damaged ({'; '.join(problems)}) and cannot be set aside "
                                  f"({e.strerror or type(e).__name__}): make {ckpt_dir} writable, or move {p} out of "
                                  "it by hand, and run the same command again") from None
        notes.append(f"checkpoint {p.name} is damaged ({'; '.join(problems)}): moved to {dest}")
    if notes:  # a run that had checkpoints, none of them intact: starting over is the user's call, not ours
        raise CheckpointError(f"no checkpoint of {ckpt_dir} can be read: {'; '.join(notes)}. To start this run over "
                              "from step 0, run the same command again")
    return None, notes

"""Learning-rate schedules as pure functions of the step (docs/paper.md §3.1 cosine, §3.3 WSD).

The trainer owns the loop and calls `lr_at(step, total_steps, cfg.optim.lr, cfg.schedule)` once per optimizer step,
then `set_lr(optimizer, lr)` (optim/__init__.py) writes it into every param group. Nothing here holds state, so a
resumed run gets the same lr from the step counter alone, and the whole curve can be plotted without a model.

Conventions (steps are 0-based; the run's last optimizer step is `total_steps - 1`):
- warmup: lr(s) = peak · (s + 1) / warmup_steps for s < warmup_steps, so step 0 already moves the weights
  (lr = peak / warmup_steps, never 0) and the last warmup step, s = warmup_steps - 1, is at the peak;
- cosine: from the peak at s = warmup_steps down to peak · min_lr_ratio exactly at s = total_steps - 1
  (docs/paper.md §3.1: lr_min = lr_max / 20; "[I] the decay presumably runs to the final step");
- wsd: constant peak up to and including s = decay_start = int(total_steps · (1 - decay_frac)), then decay to
  exactly 0 at s = total_steps - 1 with the chosen shape (docs/paper.md §3.3: constant until 80 %, linear to 0);
- steps past the end keep the final value.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optim.config import ScheduleConfig


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warmup multiplier in (0, 1]; 1 once `step >= warmup_steps - 1` (and always when there is none)."""
    if step >= warmup_steps:
        return 1.0
    return (step + 1) / warmup_steps


def decay_factor(progress: float, shape: str) -> float:
    """Multiplier for a decay from 1 at progress 0 to 0 at progress 1 (WSD cooldown shapes)."""
    p = min(max(progress, 0.0), 1.0)
    if shape == "linear":
        return 1.0 - p
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if shape == "sqrt":  # 1 - sqrt(p): the "sqrt cooldown" of Hägele et al. (2024), falls fast then flattens
        return 1.0 - math.sqrt(p)
    raise ValueError(f"unknown decay shape {shape!r}; expected linear | cosine | sqrt")


def wsd_decay_start(total_steps: int, decay_frac: float) -> int:
    """The last step at the peak: the decay phase is (decay_start, total_steps - 1]."""
    return min(int(total_steps * (1.0 - decay_frac)), total_steps - 1)


def lr_at(step: int, total_steps: int, peak_lr: float, cfg: ScheduleConfig) -> float:
    """The learning rate of optimizer step `step` (0-based) in a run of `total_steps` steps."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    if not 0 <= cfg.warmup_steps < total_steps:
        raise ValueError(f"warmup_steps={cfg.warmup_steps} must lie in [0, total_steps={total_steps})")
    last = total_steps - 1
    step = max(step, 0)
    if step < cfg.warmup_steps:
        return peak_lr * warmup_factor(step, cfg.warmup_steps)

    if cfg.name == "cosine":
        # progress 0 at the first post-warmup step, 1 at the last step; max(1, ·) guards a decay of zero length.
        progress = (step - cfg.warmup_steps) / max(1, last - cfg.warmup_steps)
        floor = peak_lr * cfg.min_lr_ratio
        return floor + (peak_lr - floor) * decay_factor(progress, "cosine")

    if cfg.name == "wsd":
        start = wsd_decay_start(total_steps, cfg.decay_frac)
        if step <= start:
            return peak_lr
        progress = (step - start) / max(1, last - start)
        return peak_lr * decay_factor(progress, cfg.decay_shape)

    raise ValueError(f"unknown schedule {cfg.name!r}; expected cosine | wsd")

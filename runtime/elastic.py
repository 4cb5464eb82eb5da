"""A run resumed on another layout: what it may change and what it says. The global batch is the experiment; the
ranks, micro-batch and `train.dtype: auto`'s resolution may change on resume, and the resume message names each
change (runtime/trainer.py, Trainer.resume)."""
from __future__ import annotations

from config import RunConfig
from strictconfig.config import ConfigError


def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per rank per optimizer step: global_batch = micro_batch × world_size × accumulation. A layout
    that does not divide is refused with the values that would (a resume may change micro_batch and world size)."""
    per_step = micro_batch * world_size
    if global_batch % per_step == 0:
        return global_batch // per_step
    if global_batch % world_size:
        ranks = [n for n in range(1, global_batch + 1) if global_batch % n == 0]
        fix = (f"no micro_batch fits {world_size} ranks; run on a number of ranks that divides {global_batch} "
               f"({', '.join(map(str, ranks[:12]))}{', …' if len(ranks) > 12 else ''})")
    else:
        fits = [m for m in range(1, global_batch // world_size + 1) if global_batch // world_size % m == 0]
        fix = f"on {world_size} ranks train.micro_batch may be {', '.join(map(str, fits[:12]))}"
    raise ConfigError(f"train.global_batch: {global_batch} is not a multiple of micro_batch × world size = "
                      f"{micro_batch} × {world_size} = {per_step}; {fix} (the global batch is the experiment: "
                      "keep it to resume a run)")


def layout_change(saved: dict, loader) -> str:
    """The resume message's note when the checkpoint was written with another world size or micro-batch."""
    before = (saved.get("world_size"), saved.get("micro_batch"))
    after = (loader.world_size, loader.micro_batch)
    if before == after:
        return ""
    return (f" (written by {before[0]} rank(s) × micro_batch {before[1]}, now {after[0]} × {after[1]}: the model "
            "and optimizer were resharded, and every step reads the same tokens as before)")


def precision_change(saved: dict, precision) -> str:
    """The resume message's note when `train.dtype: auto` resolved to another dtype where the checkpoint was written
    (another CPU kind, or a GPU). Allowed: fp32 and bf16 mixed precision both keep fp32 master weights, optimizer
    state and gradient reduction, so the checkpoint holds the same state either way; the steps from here on round
    as the new dtype does. (An explicit train.dtype change is refused by resume_conflicts.)"""
    was = saved.get("precision", {}).get("dtype")
    if was is None or was == precision.dtype_name:
        return ""
    return (f" (trained in {was} until now, {precision.dtype_name} from here on: {precision.reason}; the master weights "
            "and optimizer state are fp32 in both)")


def aux_regrouped(cfg: RunConfig, saved: dict, loader) -> str:
    """The resume's warning when a MoE's Switch aux loss now balances other groups of the same tokens: it balances
    each forward's micro_batch × ranks sequences together (model/moe.py), so only a change of that product regroups
    it. "" when nothing changes."""
    moe = cfg.model.moe
    was, now = saved.get("micro_batch", 0) * saved.get("world_size", 0), loader.micro_batch * loader.world_size
    if moe is None or moe.balance != "aux" or moe.aux_coef == 0 or was == now:
        return ""
    return (f"model.moe.balance=aux balances each forward's {now} sequences (micro_batch × ranks; {was} before the "
            "resume): the aux term now groups the same tokens differently, the tokens of every step do not change")

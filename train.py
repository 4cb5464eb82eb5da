"""Train one run, top to bottom.

    python train.py                                   # the built-in default: configs/tiny_cpu.yaml on CPU
    python train.py --config configs/dense_0.12b_unified.yaml optim.lr=3e-3
    torchrun --nproc_per_node=8 train.py --config configs/dense_0.12b_unified.yaml

Re-running the same command in the same run directory resumes from the newest complete checkpoint.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import torch
from torch.distributed.fsdp import FSDPModule

from config import ConfigError, RunConfig, default_run_name, load_config, resolve_vocab, resume_conflicts

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "tiny_cpu.yaml"


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm became NaN/inf; the state of that step is never checkpointed."""


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="YAML config; repeat to layer (later files win). "
                                                     f"Default: {DEFAULT_CONFIG.relative_to(DEFAULT_CONFIG.parents[1])}")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--dry-run", action="store_true", help="build the model, print its parameter breakdown, exit")
    p.add_argument("--print-run-dir", action="store_true", help="print the run directory this command uses and exit")
    p.add_argument("--stop-at-step", type=int, metavar="K",
                   help="checkpoint and exit after step K (the schedule still spans train.steps); "
                        "run the same command again to continue")
    p.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. optim.lr=3e-3 train.steps=100")
    args = p.parse_intermixed_args(argv)  # options and key=value overrides in any order
    if args.stop_at_step is not None and args.stop_at_step < 1:
        p.error(f"--stop-at-step {args.stop_at_step}: K must be ≥ 1 (the step after which to checkpoint and exit)")
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
    run_name = cfg.log.run_name or default_run_name(config_paths, args.overrides)
    cfg = dataclasses.replace(cfg, log=dataclasses.replace(cfg.log, run_name=run_name))
    if args.print_run_dir:
        print(Path(cfg.log.out_dir) / run_name)
        return {}

    # ---- distributed: nccl on CUDA, gloo on CPU; a one-rank group for a plain `python train.py`
    from runtime.dist import init_distributed, shutdown
    dist_info = init_distributed(cfg.train.device)
    if dist_info.device.type == "cpu" and cfg.train.cpu_malloc_tuning:
        from runtime.cpu import tune_glibc_malloc
        tune_glibc_malloc()
    clean = False
    try:
        result = _train(cfg, args.stop_at_step, dist_info)
        clean = True
        return result
    finally:
        shutdown(dist_info, clean=clean)


def _train(cfg: RunConfig, stop_at_step: Optional[int], di) -> dict:
    import random

    import numpy as np
    import torch.distributed as dist

    from data.loader import TrainLoader, batch_digest, resolve_prefetch, val_batches
    from data.prepare import ensure_prepared
    from data.shards import load_meta
    from optim import clip_grad_norm, lr_at, set_lr
    from runtime.build import build_training_model
    from runtime.checkpoint import latest_checkpoint, load_checkpoint, load_extra, save_checkpoint
    from runtime.logging import RunLogger, git_commit
    from runtime.dist import StopConsensus
    from runtime.guard import NonFiniteGuard, describe
    from runtime.metrics import mfu, peak_flops
    from runtime.moe import moe_step_end
    from runtime.telemetry import scale_telemetry

    t = cfg.train
    # Every RNG alike on every rank (nothing in training draws per rank): the states then carry over to a resume
    # on any number of ranks (runtime/checkpoint.py)
    torch.manual_seed(t.seed)
    random.seed(t.seed)
    np.random.seed(t.seed)

    # ---- data: rank 0 prepares (the built-in corpus on first use) and tells the others how it went
    problem = [None]
    if di.is_main:
        try:
            ensure_prepared(cfg.data)
        except Exception as e:  # every rank raises it below, so none waits forever in a collective
            problem = [e]
    dist.broadcast_object_list(problem, src=0)
    if problem[0] is not None:
        raise problem[0]
    meta = load_meta(cfg.data.dir)
    cfg = dataclasses.replace(cfg, model=resolve_vocab(cfg, n_vocab=meta.tokenizer["n_vocab"]))

    # ---- batch shape: global = micro × world × accumulation
    accum = accumulation_steps(t.global_batch, t.micro_batch, di.world_size)
    tokens_per_step = t.global_batch * cfg.data.seq_len

    # ---- model: build on meta → shard (FSDP2) → materialize → one init → compile blocks → optimizer
    built = build_training_model(cfg, di.device)
    model, optimizer, precision = built.model, built.optimizer, built.precision
    if di.is_main:  # auto chooses from the hardware (runtime/precision.py): say what, and why
        print(precision.describe())
    # On the device, pinned and gathered one micro-batch ahead in a background thread where that pays (CUDA)
    loader = TrainLoader(cfg.data.dir, cfg.data.seq_len, t.micro_batch, di.rank, di.world_size, t.seed,
                         device=di.device, prefetch=resolve_prefetch(t.loader_prefetch, di.device))

    # ---- resume: the same command in the same run dir continues from the newest complete checkpoint
    run_dir = Path(cfg.log.out_dir) / cfg.log.run_name
    ckpt_dir = run_dir / "checkpoints"
    step, tokens, loss_value = 0, 0, None
    skipped_steps = 0  # train.on_nonfinite: skip
    latest = latest_checkpoint(ckpt_dir)
    if latest is not None:
        conflicts = resume_conflicts(load_extra(latest)["config"], cfg)
        if conflicts:
            raise ConfigError(f"{run_dir} holds a run with other settings ({'; '.join(conflicts[:5])}); resuming "
                              "would mix two experiments. Use another log.run_name, or the original settings.")
        extra = load_checkpoint(latest, model, optimizer)  # DCP reshards onto this world size
        step, tokens, skipped_steps = extra["step"], extra["tokens"], extra.get("skipped_steps", 0)
        loader.load_state_dict(extra["loader"])  # a global position: the same tokens per step on any layout
        if di.is_main:
            print(f"resumed from {latest} at step {step}{layout_change(extra['loader'], loader)}"
                  f"{precision_change(extra, precision)}")
            regrouped = aux_regrouped(cfg, extra["loader"], loader)
            if regrouped:
                print(f"warning: {regrouped}", file=sys.stderr)

    logger = RunLogger(run_dir, cfg, di.rank, t.steps, start_step=step)
    # The non-finite check lives on the device (runtime/guard.py): a step that does not log reads nothing on the host.
    guard = NonFiniteGuard(t.on_nonfinite, t.max_consecutive_skips, di.device, step=step, skipped=skipped_steps)
    chunk = t.loss_chunk_tokens  # None: by device (model/loss.py, default_chunk_tokens)
    loss_dtype = torch.promote_types(next(model.parameters()).dtype, torch.float32)  # fp64 runs log fp64 losses
    # train.grad_reduce=step: FSDP2 reduce-scatters once per optimizer step, after the last micro-batch's backward
    sync_each = t.grad_reduce == "micro_batch" or accum == 1
    planned = t.steps * tokens_per_step / loader.tokens_per_epoch  # passes over the training data
    if planned > 1 and di.is_main:
        more = "a larger source" if meta.holds_whole_source() else "data.max_tokens, a larger source"
        print(f"warning: {t.steps} steps × {tokens_per_step:,} tokens read the {loader.tokens_per_epoch:,} training "
              f"tokens of {cfg.data.dir} {planned:.2f} times; prepare more ({more}) for a single pass",
              file=sys.stderr)
    flops_per_token = model.flops_per_token(cfg.data.seq_len)
    peak = peak_flops(di.device)
    val_sets = {"val": cfg.data.dir, **{Path(p).name: p for p in cfg.data.val_sets}}  # names checked unique

    def evaluate() -> dict:
        """Mean loss over the first eval_tokens of each validation stream (the same tokens in every run)."""
        model.eval()
        out = {}
        with torch.no_grad():
            for name, data_dir in val_sets.items():
                total = torch.zeros(2, dtype=torch.float64, device=di.device)  # (Σ loss · rows, Σ rows)
                for x, y in val_batches(data_dir, cfg.data.seq_len, t.micro_batch, di.rank, di.world_size,
                                        t.eval_tokens):
                    x, y = x.to(di.device), y.to(di.device)
                    rows = total.new_tensor(float(x.shape[0]))  # the last batch may be smaller
                    total += torch.stack([model(x, y, loss_chunk=chunk).double() * rows, rows])
                dist.all_reduce(total)
                key = "val_loss" if name == "val" else f"val_loss/{name}"
                out[key] = (total[0] / total[1].clamp_min(1)).item()
        # No backward follows, so FSDP2 would keep the root (and the last block) gathered in the compute dtype:
        # free those copies before a checkpoint or telemetry reads the parameters.
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()
        model.train()
        return out

    def checkpoint() -> None:  # only after guard.report() found no halt: a non-finite state is never saved
        extra = {"step": step, "tokens": tokens, "loader": loader.state_dict(), "config": cfg.to_yaml(),
                 "skipped_steps": skipped_steps, "git_commit": git_commit(),
                 "precision": {"dtype": precision.dtype_name, "compile": precision.compile}}
        save_checkpoint(ckpt_dir, step, model, optimizer, extra, keep=t.keep_ckpts)

    # ---- a SIGTERM/SIGINT finishes the current step, checkpoints and exits (preemption loses nothing)
    stop = StopConsensus(di)  # every rank stops at the same step
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def request_stop(signum, _frame):
        stop.requested = True
        signal.signal(signum, previous[signum])  # a second Ctrl-C/SIGTERM acts at once, as usual

    if _main_thread():
        for s in previous:
            signal.signal(s, request_stop)

    failed = False
    try:
        if step == 0:
            logger.log_eval(0, {"tokens": 0, **scale_telemetry(model), **evaluate()})
        window_t0, window_tokens = time.perf_counter(), 0
        while step < t.steps:
            # One optimizer step over the global batch, accumulated over `accum` micro-batches per rank.
            lr = lr_at(step, t.steps, cfg.optim.lr, cfg.schedule)
            set_lr(optimizer, lr)
            epochs_before = loader.epochs_done
            sums = torch.zeros(2, device=di.device, dtype=loss_dtype)  # (LM loss, MoE aux terms) over the step
            digest = torch.zeros((), device=di.device, dtype=torch.int64)  # names the step's tokens (data/loader.py)
            for i in range(accum):
                x, y = loader.next_batch()  # (micro, seq_len) int64 each, on the device (an async copy)
                digest += batch_digest(x)
                if not sync_each:  # accumulate unsharded gradients locally; reduce after the last micro-batch
                    model.set_requires_gradient_sync(i == accum - 1)
                loss = model(x, y, loss_chunk=chunk)  # fused LM head + loss (model/loss.py)
                aux = model.aux_loss()  # MoE balancing terms of this forward, already weighted (0 when dense)
                ((loss + aux) / accum).backward()  # every micro-batch has the same token count
                sums += torch.stack([loss.detach(), aux.detach()]).to(loss_dtype) / accum
            grad_norm = clip_grad_norm(model.parameters(), cfg.optim.grad_clip)  # global: the same on every rank
            # The mean losses of all ranks, on the device (fp64 on the wire): every rank's guard decides alike.
            # The batch digests ride along: their sum names the global batch (exact in fp64, batch_digest).
            reduced = torch.cat([sums.double(), digest.double().view(1)])
            dist.all_reduce(reduced)
            losses = reduced[:2] / di.world_size
            found_inf = guard.check(losses[0], losses[1], grad_norm)  # 1: no update this step (runtime/guard.py)
            optimizer.step(found_inf=found_inf)
            optimizer.zero_grad(set_to_none=True)
            repeat = max(1, math.ceil(epochs_before))  # the first epoch boundary this step may have crossed
            if repeat < loader.epochs_done and di.is_main:
                print(f"warning: step {step + 1} started epoch {repeat + 1} of the training data: from here on the "
                      "run reads windows it has read before", file=sys.stderr)
            step += 1
            tokens += tokens_per_step
            window_tokens += tokens_per_step

            logging_now = step % cfg.log.every == 0 or step == t.steps
            evaluating = step % t.eval_every == 0 or step == t.steps
            stopping = stop.any_rank() or step == stop_at_step  # host values only
            saving = step % t.ckpt_every == 0 or step == t.steps or stopping
            # loads of all ranks → balancing bias (gated like the update); per-layer metrics on log steps ({} if dense)
            moe_stats = moe_step_end(model, keep=1 - found_inf, metrics=logging_now)
            if not (logging_now or evaluating or saving):
                continue  # nothing of this step is read on the host
            report = guard.report()
            skipped_steps = report.skipped
            if report.new_skips and di.is_main:
                h = report.last_skip
                print(f"warning: {report.new_skips} step(s) skipped (no update) up to step {step}; the last: "
                      f"{describe(h)}, {h.streak} in a row", file=sys.stderr)
            if report.halt is not None:
                h = report.halt
                why = "" if t.on_nonfinite == "stop" else (
                    f", {h.streak} in a row (train.max_consecutive_skips={t.max_consecutive_skips})")
                raise NonFiniteError(f"{describe(h)}{why}; the run stopped before the update (no update since). "
                                     f"Resume from the last checkpoint in {ckpt_dir} with a lower optim.lr or a longer "
                                     "schedule.warmup_steps.")
            if logging_now:
                loss_value, aux_value, norm_value, digest_value = torch.cat(
                    [losses, grad_norm.double().view(1), reduced[2:]]).tolist()
                finite = math.isfinite(loss_value + aux_value) and math.isfinite(norm_value)
                elapsed = time.perf_counter() - window_t0  # after the read: the device has finished the window
                tok_per_s = window_tokens / max(elapsed, 1e-9)
                moe_record = {"aux_loss": aux_value, **moe_stats} if moe_stats else {}
                logger.log_train(step, {"tokens": tokens, "epoch": loader.epochs_done,
                                        "loss": loss_value if finite else None, "lr": lr,
                                        "grad_norm": norm_value if finite else None, "tok_per_s": tok_per_s,
                                        "mfu": mfu(flops_per_token, tok_per_s, di.world_size, peak),
                                        "skipped_steps": skipped_steps, "world_size": di.world_size,
                                        "dtype": precision.dtype_name, "compile": precision.compile,
                                        "batch_digest": int(digest_value), **moe_record})
                window_t0, window_tokens = time.perf_counter(), 0
            paused_at = time.perf_counter()  # eval and checkpoint time stays out of tok/s
            if evaluating:
                logger.log_eval(step, {"tokens": tokens, **scale_telemetry(model), **evaluate()})
            if saving:
                checkpoint()
            window_t0 += time.perf_counter() - paused_at
            if stopping:
                if di.is_main:
                    print(f"stopped: checkpointed step {step}; run the same command to resume")
                break
    except BaseException:
        failed = True
        raise
    finally:
        loader.close()
        logger.close(failed=failed)
        if _main_thread():
            for s, handler in previous.items():
                signal.signal(s, handler)
    return {"step": step, "tokens": tokens, "loss": loss_value, "run_dir": str(run_dir),
            **({} if step < t.steps else {"final": _last_eval(run_dir)})}


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


def _last_eval(run_dir: Path) -> dict:
    import json
    path = run_dir / "metrics.jsonl"
    if not path.exists():  # only rank 0 writes it
        return {}
    evals = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "eval"]
    return {k: v for k, v in evals[-1].items() if k.startswith("val_loss")} if evals else {}


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input or a stopped run, each with a message that says what to do: no traceback."""
    from data.builtin import BuiltinCorpusError
    from data.shards import DataError
    from data.sources import SourceError
    from data.tokenizer import TokenizerError
    from runtime.checkpoint import CheckpointError
    from runtime.dist import LaunchError
    return (ConfigError, NonFiniteError, DataError, SourceError, TokenizerError, BuiltinCorpusError, CheckpointError,
            LaunchError)


if __name__ == "__main__":
    try:
        main()
    except _user_errors() as e:
        # A config error is the same on every rank (each reads the same config): rank 0 says it, once per run.
        # Other errors may be one rank's own (its node's data, its disk), so each rank says its own.
        if not isinstance(e, ConfigError) or os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

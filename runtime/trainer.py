"""The trainer: one run's model, optimizer, data, step and loop. train.py is its command.

    trainer = Trainer.for_run(cfg, dist_info)   # data (prepared on first use) → model → loader → resume
    summary = trainer.fit(stop_at_step=None)    # step → log → evaluate → checkpoint, until train.steps

`Trainer.step` is the one training step in the tree: train.py's loop runs it, scripts.bench (bench/steps.py)
times it on its own batches (`Trainer(cfg, di, batches)`), the GPU check runs it through both, the soak through
train.py.

About 460 lines on purpose: build, step, evaluation, checkpoints and the loop share one run's state (model,
optimizer, loader, step counters), and a reader follows one step, one evaluation and one resume in one file;
what each calls (the windows of an evaluation, data/evalset.py; the checkpoint format, runtime/checkpoint.py) lives
apart.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from config import RunConfig, resolve_vocab
from data.evalset import EvalSet
from data.loader import TrainLoader, batch_digest, resolve_prefetch
from data.prepare import ensure_prepared
from data.shards import DataError, load_meta
from data.verify import ShardCheck
from model.summary import flops_per_token as count_flops
from optim import clip_grad_norm, lr_at, set_lr
from runtime.build import build_training_model
from runtime.checkpoint import complete_checkpoints, damaged_files, load_checkpoint, load_extra, save_checkpoint
from strictconfig.config import ConfigError, resume_conflicts
from runtime.dist import LAUNCHER_GONE, DistInfo, StopConsensus
from runtime.elastic import accumulation_steps, aux_regrouped, layout_change, precision_change
from runtime.guard import NonFiniteGuard, describe, state_is_finite
from runtime.logging import RunLogger, git_commit
from runtime.metrics import mfu, peak_flops
from runtime.moe import moe_step_end
from runtime.resume_point import resume_point
from runtime.telemetry import HeadroomWatch, norm_headroom, scale_telemetry


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm became NaN/inf; the state of that step is never checkpointed."""


class Batches(Protocol):
    """Where a step's micro-batches come from: data/loader.py's TrainLoader, or a benchmark's fixed batches."""
    epochs_done: float

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...  # (micro, seq_len) int64 each, on the device

    def close(self) -> None: ...


class FixedBatches:
    """The given batches in turn, again from the first after the last (bench/steps.py: every design gets
    the same ones). Never an epoch boundary: the data is not the experiment there."""
    epochs_done = 0.0

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]):
        self._batches, self._next = batches, 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self._batches[self._next % len(self._batches)]
        self._next += 1
        return batch

    def close(self) -> None:
        pass


@dataclasses.dataclass
class StepOutput:
    """One optimizer step over the global batch, on the device: nothing here has been read on the host."""
    losses: torch.Tensor  # (2,) fp64: the global batch's mean LM loss and MoE aux terms (0 when dense)
    grad_norm: torch.Tensor  # () the global gradient norm before clipping
    digest: torch.Tensor  # () fp64: the sum of every rank's batch digests, which names the global batch
    found_inf: torch.Tensor  # () 1 where the guard kept the update from happening (runtime/guard.py)
    lr: float
    moe_stats: dict[str, float]  # per-layer MoE metrics when step(metrics=True); {} otherwise and when dense


def seed_everything(seed: int) -> None:
    """Every RNG alike on every rank (nothing in training draws per rank): the states then carry over to a resume on
    any number of ranks (runtime/checkpoint.py)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


class Trainer:
    """A built run. `cfg.model.vocab_size` must be resolved (config.resolve_vocab); `val_sets` names the validation
    streams `evaluate` reads ({} for none)."""

    def __init__(self, cfg: RunConfig, di: DistInfo, batches: Batches, val_sets: Optional[dict[str, str]] = None,
                 tokens_per_epoch: Optional[int] = None):
        t = cfg.train
        self.cfg, self.di, self.batches = cfg, di, batches
        self.val_sets = val_sets or {}
        self._eval_sets: dict[str, EvalSet] = {}  # built on the first evaluation (data/evalset.py)
        self.tokens_per_epoch = tokens_per_epoch
        # ---- batch shape: global = micro × world × accumulation
        self.accum = accumulation_steps(t.global_batch, t.micro_batch, di.world_size)
        self.tokens_per_step = t.global_batch * cfg.data.seq_len
        # ---- model: meta → shard (FSDP2) → materialize → one init → compile blocks → optimizer (runtime/build.py)
        built = build_training_model(cfg, di.device)
        self.model, self.optimizer, self.precision = built.model, built.optimizer, built.precision
        self.step_count, self.tokens, self.skipped_steps = 0, 0, 0
        # The non-finite check lives on the device (runtime/guard.py): a step that does not log reads nothing on the
        # host. Rebuilt by `resume` at the checkpoint's step.
        self.guard = NonFiniteGuard(t.on_nonfinite, t.max_consecutive_skips, di.device)
        # fp64 runs log fp64 losses
        self.loss_dtype = torch.promote_types(next(self.model.parameters()).dtype, torch.float32)
        # train.grad_reduce=step: FSDP2 reduce-scatters once per optimizer step, after the last micro-batch's backward
        self.sync_each = t.grad_reduce == "micro_batch" or self.accum == 1
        self.run_dir = Path(cfg.log.out_dir) / (cfg.log.run_name or "run")
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.headroom_watch = HeadroomWatch(cfg.model.scale.invariant_magnitude, cfg.log.headroom_warn)
        self.shard_check: Optional[ShardCheck] = None  # the data dir's shards, checked in the background (for_run)

    @classmethod
    def for_run(cls, cfg: RunConfig, di: DistInfo, resume_step: Optional[int] = None) -> "Trainer":
        """The run `cfg` names: its data (rank 0 prepares it on first use and tells the others how it went), the
        model, the loader (on the device, pinned and gathered one micro-batch ahead where that pays: CUDA), and the
        newest intact checkpoint of its run directory, if any (`resume_step`: that step's)."""
        t = cfg.train
        seed_everything(t.seed)
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
        # the model's vocabulary from the prepared data's tokenizer
        cfg = dataclasses.replace(cfg, model=resolve_vocab(cfg, n_vocab=meta.tokenizer["n_vocab"]))
        accumulation_steps(t.global_batch, t.micro_batch, di.world_size)  # refuse a layout before building anything
        val_sets = {"val": cfg.data.dir, **{Path(p).name: p for p in cfg.data.val_sets}}  # names checked unique
        loader = TrainLoader(cfg.data.dir, cfg.data.seq_len, t.micro_batch, di.rank, di.world_size, t.seed,
                             device=di.device, prefetch=resolve_prefetch(t.loader_prefetch, di.device))
        try:
            trainer = cls(cfg, di, loader, val_sets, loader.tokens_per_epoch)
            if di.is_main:  # auto chooses from the hardware (runtime/precision.py): say what, and why
                print(trainer.precision.describe())
            trainer.resume(resume_step)
            if di.is_main:  # off the first step's path: a bad shard stops every rank at one step (fit)
                trainer.shard_check = ShardCheck(cfg.data.dir, loader.meta)
        except BaseException:
            loader.close()
            raise
        planned = t.steps * trainer.tokens_per_step / loader.tokens_per_epoch  # passes over the training data
        if planned > 1 and di.is_main:
            more = "a larger source" if meta.holds_whole_source() else "data.max_tokens, a larger source"
            print(f"warning: {t.steps} steps × {trainer.tokens_per_step:,} tokens read the "
                  f"{loader.tokens_per_epoch:,} training tokens of {cfg.data.dir} {planned:.2f} times; prepare more "
                  f"({more}) for a single pass", file=sys.stderr)
        return trainer

    # ---- the step

    def step(self, metrics: bool = False) -> StepOutput:
        """One optimizer step over the global batch: `accum` micro-batches per rank (forward with the fused LM head
        + loss, backward), the global gradient norm and clipping, the losses and batch digests of all ranks reduced
        on the device, the non-finite guard, the update (a no-op where the guard says so), the MoE balancing
        bookkeeping. Reads nothing on the host; `metrics` asks the MoE layers for their per-layer numbers too."""
        cfg, model, di = self.cfg, self.model, self.di
        lr = lr_at(self.step_count, cfg.train.steps, cfg.optim.lr, cfg.schedule)
        set_lr(self.optimizer, lr)
        epochs_before = self.batches.epochs_done
        sums = torch.zeros(2, device=di.device, dtype=self.loss_dtype)  # (LM loss, MoE aux terms) over the step
        digest = torch.zeros((), device=di.device, dtype=torch.int64)  # names the step's tokens (data/loader.py)
        for i in range(self.accum):
            x, y = self.batches.next_batch()  # (micro, seq_len) int64 each, on the device (an async copy)
            digest += batch_digest(x)
            if not self.sync_each:  # accumulate unsharded gradients locally; reduce after the last micro-batch
                model.set_requires_gradient_sync(i == self.accum - 1)
            loss = model(x, y, loss_chunk=cfg.train.loss_chunk_tokens)  # the LM head + loss (model/loss.py; fast/head.py)
            aux = model.aux_loss()  # MoE balancing terms of this forward, already weighted (0 when dense)
            ((loss + aux) / self.accum).backward()  # every micro-batch has the same token count
            sums += torch.stack([loss.detach(), aux.detach()]).to(self.loss_dtype) / self.accum
        grad_norm = clip_grad_norm(model.parameters(), cfg.optim.grad_clip)  # global: the same on every rank
        # The mean losses of all ranks, on the device (fp64 on the wire): every rank's guard decides alike.
        # The batch digests ride along: their sum names the global batch (exact in fp64, batch_digest).
        reduced = torch.cat([sums.double(), digest.double().view(1)])
        dist.all_reduce(reduced)
        losses = reduced[:2] / di.world_size
        found_inf = self.guard.check(losses[0], losses[1], grad_norm)  # 1: no update this step (runtime/guard.py)
        self.optimizer.step(found_inf=found_inf)
        self.optimizer.zero_grad(set_to_none=True)
        # loads of all ranks → balancing bias (gated like the update); per-layer metrics when asked ({} if dense)
        moe_stats = moe_step_end(model, keep=1 - found_inf, metrics=metrics)
        repeat = max(1, math.ceil(epochs_before))  # the first epoch boundary this step may have crossed
        if repeat < self.batches.epochs_done and di.is_main:
            print(f"warning: step {self.step_count + 1} started epoch {repeat + 1} of the training data: from here on "
                  "the run reads windows it has read before", file=sys.stderr)
        self.step_count += 1
        self.tokens += self.tokens_per_step
        return StepOutput(losses, grad_norm, reduced[2], found_inf, lr, moe_stats)

    # ---- evaluation and checkpoints

    def eval_set(self, name: str) -> EvalSet:
        """What evaluating validation set `name` reads (data/evalset.py): the training data's val split ("val") as
        train.eval_sample says, an extra set as a prefix; built once per run, the same on every rank."""
        if name not in self._eval_sets:
            t, val = self.cfg.train, name == "val"
            es = EvalSet.build(self.val_sets[name], self.cfg.data.seq_len,
                               t.eval_tokens if val else t.extra_eval_tokens or t.eval_tokens,
                               t.eval_sample if val else "prefix", reserved=set(self.val_sets) - {"val"})
            if self.di.is_main and es.sample == "mixture":
                print(es.describe())
            self._eval_sets[name] = es
        return self._eval_sets[name]

    def evaluate(self) -> dict[str, float]:
        """The mean loss over each validation set's windows (data/evalset.py: the same tokens in every run and on any
        number of ranks): `val_loss`, per source `val_loss/<source>` under train.eval_sample=mixture, and
        `val_loss/<name>` per extra set."""
        cfg, model, di = self.cfg, self.model, self.di
        model.eval()
        out = {}
        with torch.no_grad():
            for name in self.val_sets:
                es = self.eval_set(name)
                # (Σ loss · rows, Σ rows) per stream: a source of the mixture, or the whole set
                totals = torch.zeros(len(es.streams), 2, dtype=torch.float64, device=di.device)
                for k, x, y, real in es.batches(cfg.train.micro_batch, di.rank, di.world_size):
                    x, y = x.to(di.device), y.to(di.device)
                    rows = totals.new_tensor(float(real))  # the last batch may be smaller; a padding batch counts 0
                    loss = model(x, y, loss_chunk=cfg.train.loss_chunk_tokens).double()
                    totals[k] += torch.stack([loss * rows, rows])
                dist.all_reduce(totals)
                out.update(es.report(totals.tolist(), "val_loss" if name == "val" else f"val_loss/{name}"))
        # No backward follows, so FSDP2 would keep the root (and the last block) gathered in the compute dtype:
        # free those copies before a checkpoint or telemetry reads the parameters.
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.reshard()
        model.train()
        return out

    def eval_record(self, step: int) -> dict[str, float]:
        """What an evaluation logs: the scale-vector telemetry, each DNP inner Norm's headroom on the val set's first
        window per rank (a warning line when one stops normalizing: runtime/telemetry.py), and the losses."""
        sites = []
        if "val" in self.val_sets:
            _, x, _, _ = next(self.eval_set("val").batches(1, self.di.rank, self.di.world_size))
            self.model.eval()
            sites = norm_headroom(self.model, x.to(self.di.device))
        warning = self.headroom_watch.check(step, sites)
        if warning and self.di.is_main:
            print(f"warning: {warning}", file=sys.stderr)
        return {"tokens": self.tokens, **scale_telemetry(self.model), **{s.key: s.headroom for s in sites},
                **self.evaluate()}

    def save(self) -> None:
        """A checkpoint of this step: only after guard.report() found no halt, and only of a finite state, so a
        non-finite state is never saved (nor prunes the checkpoints it would replace)."""
        if not state_is_finite(self.model, self.optimizer):
            raise NonFiniteError(f"the parameters or optimizer state are not finite at step {self.step_count}, "
                                 f"although every loss was; nothing was saved. {self.recovery()}")
        loader = self.batches
        extra = {"step": self.step_count, "tokens": self.tokens, "loader": loader.state_dict(),
                 "config": self.cfg.to_yaml(), "skipped_steps": self.skipped_steps, "git_commit": git_commit(),
                 "precision": {"dtype": self.precision.dtype_name, "compile": self.precision.compile}}
        save_checkpoint(self.ckpt_dir, self.step_count, self.model, self.optimizer, extra, keep=self.cfg.train.keep_ckpts)

    def resume(self, step: Optional[int] = None) -> None:
        """Continue from the newest intact checkpoint of the run directory, if there is one: the same command in
        the same run directory continues the run, on any number of ranks (DCP reshards). A newer damaged checkpoint
        is moved aside, never deleted (runtime/resume_point.py). `step`: resume from that step's checkpoint instead,
        the newer ones moved aside."""
        latest, notes = resume_point(self.ckpt_dir, step)
        if self.di.is_main:
            for note in notes:
                print(f"warning: {note}", file=sys.stderr)
        if latest is None:
            return
        cfg, t, loader = self.cfg, self.cfg.train, self.batches
        conflicts = resume_conflicts(load_extra(latest)["config"], cfg)
        if conflicts:
            raise ConfigError(f"{self.run_dir} holds a run with other settings ({'; '.join(conflicts[:5])}); resuming "
                              "would mix two experiments. Use another log.run_name, or the original settings.")
        extra = load_checkpoint(latest, self.model, self.optimizer)  # DCP reshards onto this world size
        self.step_count, self.tokens = extra["step"], extra["tokens"]
        self.skipped_steps = extra.get("skipped_steps", 0)
        self.guard = NonFiniteGuard(t.on_nonfinite, t.max_consecutive_skips, self.di.device, step=self.step_count,
                                    skipped=self.skipped_steps)
        loader.load_state_dict(extra["loader"])  # a global position: the same tokens per step on any layout
        if self.di.is_main:
            print(f"resumed from {latest} at step {self.step_count}{layout_change(extra['loader'], loader)}"
                  f"{precision_change(extra, self.precision)}")
            regrouped = aux_regrouped(cfg, extra["loader"], loader)
            if regrouped:
                print(f"warning: {regrouped}", file=sys.stderr)

    # ---- the loop

    def fit(self, stop_at_step: Optional[int] = None, wandb_tags: Optional[list[str]] = None) -> dict:
        """Train to train.steps (or checkpoint and stop after `stop_at_step`, or at a SIGTERM/SIGINT, which finishes
        the current step first: preemption loses nothing). Returns the final step, tokens, last logged train loss,
        the run directory and, when the run is complete, its last validation losses. `wandb_tags`: the wandb run's
        tags (default: log.wandb.tags)."""
        cfg, t, di = self.cfg, self.cfg.train, self.di
        if stop_at_step is not None and stop_at_step <= self.step_count:
            # Before the logger (which trims metrics.jsonl) and before any step: the run would train past K to
            # train.steps, and its newer checkpoints would push out the older ones
            raise ConfigError(f"--stop-at-step {stop_at_step} is at or below this run's step {self.step_count} "
                              f"({self.run_dir}): there is nothing to train before it. Pass a step above "
                              f"{self.step_count}, or leave out --stop-at-step to train on to {t.steps}")
        logger = RunLogger(self.run_dir, cfg, di.rank, t.steps, start_step=self.step_count, tags=wandb_tags)
        flops_per_token = count_flops(self.model, cfg.data.seq_len)
        peak = peak_flops(di.device)
        stop = StopConsensus(di)  # every rank stops at the same step
        loss_value, failed = None, False
        with _stop_on_signals(stop):
            try:
                at = self.step_count  # step 0's evaluation, or a checkpoint's that metrics.jsonl lost or cut short
                if self._needs_eval(at, logger):
                    logger.log_eval(at, self.eval_record(at))
                window_t0, window_tokens = time.perf_counter(), 0
                while self.step_count < t.steps:
                    step = self.step_count + 1
                    logging_now = step % cfg.log.every == 0 or step == t.steps
                    out = self.step(metrics=logging_now)
                    window_tokens += self.tokens_per_step
                    evaluating = step % t.eval_every == 0 or step == t.steps
                    if self.shard_check is not None and self.shard_check.problem:
                        stop.requested = True  # every rank checkpoints this step and stops with it
                    stopping = stop.any_rank() or step == stop_at_step  # host values only
                    saving = step % t.ckpt_every == 0 or step == t.steps or stopping
                    if not (logging_now or evaluating or saving):
                        continue  # nothing of this step is read on the host
                    self._check_guard(step)
                    if logging_now:
                        loss_value, aux_value, norm_value, digest_value = torch.cat(
                            [out.losses, out.grad_norm.double().view(1), out.digest.view(1)]).tolist()
                        finite = math.isfinite(loss_value + aux_value) and math.isfinite(norm_value)
                        elapsed = time.perf_counter() - window_t0  # after the read: the device finished the window
                        tok_per_s = window_tokens / max(elapsed, 1e-9)
                        moe_record = {"aux_loss": aux_value, **out.moe_stats} if out.moe_stats else {}
                        logger.log_train(step, {"tokens": self.tokens, "epoch": self.batches.epochs_done,
                                                "loss": loss_value if finite else None, "lr": out.lr,
                                                "grad_norm": norm_value if finite else None, "tok_per_s": tok_per_s,
                                                "mfu": mfu(flops_per_token, tok_per_s, di.world_size, peak),
                                                "skipped_steps": self.skipped_steps, "world_size": di.world_size,
                                                "dtype": self.precision.dtype_name, "compile": self.precision.compile,
                                                "batch_digest": int(digest_value), **moe_record})
                        window_t0, window_tokens = time.perf_counter(), 0
                    paused_at = time.perf_counter()  # eval and checkpoint time stays out of tok/s
                    if evaluating:
                        logger.log_eval(step, self.eval_record(step))
                    if saving:
                        logger.sync()  # the records up to the checkpoint reach the disk before it does
                        self.save()
                    window_t0 += time.perf_counter() - paused_at
                    if stopping:
                        if self.shard_check is not None and self.shard_check.problem:
                            raise DataError(f"{self.shard_check.problem} (the run checkpointed step {step} and "
                                            "stopped; once the data is prepared again, the same command resumes)")
                        if di.is_main:
                            print(f"stopped: checkpointed step {step}; run the same command to resume")
                        break
            except BaseException:
                failed = True
                raise
            finally:
                self.batches.close()
                logger.close(failed=failed)
        return {"step": self.step_count, "tokens": self.tokens, "loss": loss_value, "run_dir": str(self.run_dir),
                **({} if self.step_count < t.steps else {"final": _last_eval(self.run_dir)})}

    def _check_guard(self, step: int) -> None:
        """Read the guard's device counters (a host read: only on steps that log, evaluate or save). Warns about
        skipped steps; raises NonFiniteError where the run must stop."""
        t = self.cfg.train
        report = self.guard.report()
        self.skipped_steps = report.skipped
        if report.new_skips and self.di.is_main:
            h = report.last_skip
            print(f"warning: {report.new_skips} step(s) skipped (no update) up to step {step}; the last: "
                  f"{describe(h)}, {h.streak} in a row", file=sys.stderr)
        if report.halt is not None:
            h = report.halt
            why = "" if t.on_nonfinite == "stop" else (
                f", {h.streak} in a row (train.max_consecutive_skips={t.max_consecutive_skips})")
            raise NonFiniteError(f"{describe(h)}{why}; the run stopped before the update (no update since). "
                                 + self.recovery())

    def _needs_eval(self, step: int, logger: RunLogger) -> bool:
        """Whether the run's first step (0, or the checkpoint it resumed from) lacks the evaluation it had: rank 0
        reads metrics.jsonl, and every rank follows it (an evaluation is collective)."""
        t = self.cfg.train
        verdict = [step not in logger.eval_steps and (step == 0 or step % t.eval_every == 0 or step == t.steps)]
        if self.di.world_size > 1:
            dist.broadcast_object_list(verdict, src=0)
        return verdict[0]

    def recovery(self) -> str:
        """What a stopped run can do next: the newest checkpoint that reads, and the commands that work with it."""
        intact = next((p for _, p in reversed(complete_checkpoints(self.ckpt_dir)) if not damaged_files(p)), None)
        where = (f"The newest intact checkpoint is {intact}: the same command resumes from it; add "
                 "train.on_nonfinite=skip to skip a non-finite step instead of stopping (a resume may change it). "
                 if intact is not None else f"{self.ckpt_dir} holds no intact checkpoint. ")
        return where + ("optim.lr and the schedule cannot change on resume: to train with a lower optim.lr or a longer "
                        "schedule.warmup_steps, start a new run (another log.run_name).")


class _stop_on_signals:
    """SIGTERM/SIGINT ask every rank to stop at the same step (StopConsensus); a second one acts at once, as usual.
    The launcher's death (runtime/dist.py, LAUNCHER_GONE; Linux may send it more than once) asks the same, every
    time. Signal handlers can only be set from the main thread: elsewhere (a test's thread) this does nothing."""

    def __init__(self, stop: StopConsensus):
        self.stop = stop
        self.previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            signals = (signal.SIGTERM, signal.SIGINT) + ((LAUNCHER_GONE,) if LAUNCHER_GONE is not None else ())
            self.previous = {s: signal.getsignal(s) for s in signals}
            for s in self.previous:
                signal.signal(s, self._request)
        return self

    def _request(self, signum, _frame):
        if signum == LAUNCHER_GONE:
            if not self.stop.requested:
                print("warning: the launcher (torchrun's agent) is gone: this rank checkpoints the current step "
                      "and exits", file=sys.stderr)
            self.stop.requested = True
            return
        self.stop.requested = True
        signal.signal(signum, self.previous[signum])

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        return False


def _last_eval(run_dir: Path) -> dict:
    path = run_dir / "metrics.jsonl"
    if not path.exists():  # only rank 0 writes it
        return {}
    evals = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "eval"]
    return {k: v for k, v in evals[-1].items() if k.startswith("val_loss")} if evals else {}

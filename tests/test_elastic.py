"""Elastic resume through train.py on CPU ranks: a run stopped on 2 ranks continues on 1 (twice the micro-batch), then
on 2 again, and every optimizer step trains on the same tokens as the uninterrupted run (its `batch_digest`), with
losses and weights within the reduction-order bounds of their dtype (the dense Muon run in fp64, the MoE run in fp32:
the comment below says why); a layout that cannot hold the global batch is refused
before anything is touched."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import train
from config import load_config
from strictconfig.config import ConfigError
from test_moe_train import MOE, moe_state
from runtime.checkpoint import checkpoint_tensors, latest_checkpoint
from runtime.rundir import LOCK_FILE
from runtime.elastic import accumulation_steps, aux_regrouped
from multiproc import Rendezvous, spawn
from test_train import _error_worker, _skip_worker, args_for, data_dir, records, run_ranks  # noqa: F401 - data_dir is a fixture

# What one rank count against another may differ by. Only the order of the sums over rows changes with the layout
# (the loss over the step's 256 token rows, each gradient's sum over them, the all-reduce); each such sum differs by
# ≲ sqrt(n)·u relative (n ≤ 256, u the unit roundoff), and training carries that forward. In fp32 (u = 2⁻²⁴), over
# 9 steps, the loss then stays within a few rounding errors of |loss| ≈ 6: a few 1e-6 (measured 5e-7, MoE).
# FP32_LOSS_TOL is 10× that; a step trained on one other window moves the loss by ~1e-2, and batch_digest must match
# exactly anyway. fp32 weights get no elementwise bound: Adam maps a gradient that cancels to ~1e-8 (where the
# rounding is a large part of it) to an update of ±lr·O(1), so an isolated entry can differ by a whole step (the soak
# in fp32: a weight tensor 1.7e-3 of its norm apart). fp64 (u = 2⁻⁵³, 5e8× smaller) leaves no such gradient in reach:
# the same growth gives ~1e-14 in loss and weights; FP64_TOL is 1e4× that.
FP32_LOSS_TOL = 5e-5
FP64_TOL = 1e-10

STOPS = (3, 6)  # the elastic run stops after these steps; the reference runs straight through 9

DENSE = ("optim.name=muon", "optim.muon.distributed=true", "optim.muon.ns_dtype=float64", "train.dtype=float64",
         "train.steps=9", "train.eval_every=100")
MOE_BIAS = (*MOE, "model.moe.balance=bias", "model.moe.bias_rate=0.01", "model.moe.z_coef=1e-3", "optim.name=adamw",
            "train.steps=9", "train.eval_every=100")


@pytest.fixture(scope="module")
def elastic_runs(data_dir, tmp_path_factory):  # noqa: F811
    """Both elastic runs (dense Muon, MoE AdamW) and their references, in two 2-rank launches instead of six: each
    launch's ranks run the commands one after another (run_ranks; every train.main seeds all RNGs and builds its own
    process group, so a run is the same as in a launch of its own). The first launch: each reference straight through
    9 steps, then each elastic run's first part on 2 ranks (micro 4), stopped after STOPS[0]; then in this process
    each middle part (micro 8, accumulation 1) stopped after STOPS[1]; the second launch: each last part on 2 ranks
    (micro 2, accumulation 2). Per case: (its dir, the reference's argv, the last argv, what the middle part printed,
    the warnings it raised)."""
    import contextlib
    import io
    import warnings
    cases = {"dense": DENSE, "moe": MOE_BIAS}
    dirs = {name: tmp_path_factory.mktemp(name) for name in cases}

    def argv(name, run, *more):
        return args_for(data_dir, dirs[name], run, "train.ckpt_every=3", *cases[name], *more)

    refs = {name: argv(name, "ref") for name in cases}
    firsts = {name: ["--stop-at-step", str(STOPS[0]), *argv(name, "elastic")] for name in cases}
    run_ranks(2, *[a for name in cases for a in (refs[name], firsts[name])])
    printed, warned = {}, {}
    for name in cases:
        out = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
            warnings.simplefilter("always")  # as pytest's recwarn: every warning, also one seen before
            train.main(["--stop-at-step", str(STOPS[1]), *argv(name, "elastic", "train.micro_batch=8")])
        printed[name], warned[name] = out.getvalue(), list(caught)
    lasts = {name: argv(name, "elastic", "train.micro_batch=2") for name in cases}
    run_ranks(2, *lasts.values())
    return {name: SimpleNamespace(dir=dirs[name], ref=refs[name], last=lasts[name], printed=printed[name],
                                  warned=warned[name]) for name in cases}


def assert_same_tokens_and_close_losses(ref_dir, run_dir, loss_tol: float) -> None:
    ref, got = records(ref_dir, "train"), records(run_dir, "train")
    assert [r["step"] for r in got] == [r["step"] for r in ref] == list(range(1, 10))  # no step twice, none lost
    assert [r["batch_digest"] for r in got] == [r["batch_digest"] for r in ref]  # the same tokens, every step
    assert len(set(r["batch_digest"] for r in ref)) == 9  # (and the digest tells the steps apart)
    assert [r["world_size"] for r in got] == [2] * 3 + [1] * 3 + [2] * 3
    assert [r["tokens"] for r in got] == [r["tokens"] for r in ref]
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(ref, got)]
    print(f"\n{run_dir.name} vs {ref_dir.name}: digests equal at {len(got)} steps, max |Δloss| {max(diffs):.2g}")
    assert max(diffs[:3]) == 0.0  # the first part is the same layout and the same code: bit-identical
    assert max(diffs) < loss_tol, diffs


def test_dense_muon_resumes_on_one_rank_then_two(elastic_runs):
    """In fp64, where the rank count's reduction order leaves ~1e-14 (FP64_TOL): losses, every weight and the
    Muon momentum of the last checkpoint."""
    run = elastic_runs["dense"]
    assert (f"at step {STOPS[0]} (written by 2 rank(s) × micro_batch 4, now 1 × 8: the model and optimizer were "
            "resharded, and every step reads the same tokens as before)") in run.printed
    assert not [w for w in run.warned if "RNG" in str(w.message)]  # every rank's RNG states were equal: carried over
    assert_same_tokens_and_close_losses(run.dir / "ref", run.dir / "elastic", FP64_TOL)
    a, b = (checkpoint_tensors(latest_checkpoint(run.dir / name / "checkpoints")) for name in ("ref", "elastic"))
    assert a.keys() == b.keys() and any(".momentum_buffer" in k for k in a)
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    print(f"every checkpoint tensor within {worst:.2g}")
    assert worst < FP64_TOL


def test_moe_adamw_resumes_on_one_rank_then_two(elastic_runs):
    """The aux-loss-free balancing bias, its load counters and the z-loss carry over: the bias moves by ±rate per
    expert and step from the step's loads, summed over ranks and micro-batches, so it is the same on any layout."""
    run = elastic_runs["moe"]
    assert_same_tokens_and_close_losses(run.dir / "ref", run.dir / "elastic", FP32_LOSS_TOL)
    r, e = records(run.dir / "ref", "train"), records(run.dir / "elastic", "train")
    assert [a["moe/L1/max_share"] for a in r] == [b["moe/L1/max_share"] for b in e]  # the same loads every step
    sr, se = moe_state(run.dir / "ref", run.ref), moe_state(run.dir / "elastic", run.last)
    for bias in ("layers.0.mlp.expert_bias", "layers.1.mlp.expert_bias"):  # ±rate steps from equal loads: exact
        assert sr[bias].abs().sum() > 0 and torch.equal(sr[bias], se[bias])
    assert all(not sr[n].any() and not se[n].any() for n in sr if "tokens_per_expert" in n)  # reset at each step end


def test_the_switch_aux_loss_warns_only_when_its_groups_change(data_dir):  # noqa: F811
    """balance=aux balances each forward over all ranks' sequences together: 2 ranks × 4 and 1 × 8 are the same
    groups (no warning), 2 × 2 are not."""
    cfg = load_config(["configs/tiny_moe.yaml"], ["model.moe.balance=aux"])
    saved = {"world_size": 2, "micro_batch": 4}
    assert aux_regrouped(cfg, saved, SimpleNamespace(world_size=1, micro_batch=8)) == ""
    warning = aux_regrouped(cfg, saved, SimpleNamespace(world_size=2, micro_batch=2))
    assert "balances each forward's 4 sequences (micro_batch × ranks; 8 before the resume)" in warning
    bias = load_config(["configs/tiny_moe.yaml"], ["model.moe.balance=bias"])
    assert aux_regrouped(bias, saved, SimpleNamespace(world_size=2, micro_batch=2)) == ""


def test_the_skipped_step_count_carries_across_a_rank_change(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """train.on_nonfinite: skip on 2 ranks (step 3's loss is NaN on rank 0), stopped after step 4, resumed on one
    process: the count is the checkpoint's one scalar, so the resumed records go on from 1, not from 0 or 2."""
    from fast.head import FusedHeadLoss
    monkeypatch.setattr(FusedHeadLoss, "__call__", FusedHeadLoss.__call__)  # a worker's poison never reaches here
    argv = args_for(data_dir, tmp_path, "r", "train.on_nonfinite=skip", "train.ckpt_every=2", "train.eval_every=100")
    spawn(_skip_worker, (2, Rendezvous.new(), ["--stop-at-step", "4", *argv]), nprocs=2)
    train.main(argv)
    recs = records(tmp_path / "r", "train")
    assert [(r["step"], r["world_size"], r["skipped_steps"]) for r in recs] == [
        (1, 2, 0), (2, 2, 0), (3, 2, 1), (4, 2, 1), (5, 1, 1), (6, 1, 1)]
    assert recs[2]["loss"] is None and all(r["loss"] > 0 for r in recs[3:])


def test_a_resume_onto_three_ranks_is_refused_and_changes_nothing(elastic_runs, tmp_path):
    """The dense run, last checkpointed on 2 ranks, restarted on 3 with its global batch of 8: every rank stops with
    the message before any checkpoint is read or model built, and the run directory is left as it was."""
    run = elastic_runs["dense"]
    run_dir = run.dir / "elastic"

    def files() -> dict:  # the run's files; its lock (runtime/rundir.py) is taken and released empty, as by any start
        return {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file() and p.name != LOCK_FILE}
    before = files()
    spawn(_error_worker, (3, Rendezvous.new(), run.last, tmp_path), nprocs=3)
    for rank in range(3):
        assert (tmp_path / f"rank{rank}.txt").read_text() == (
            "ConfigError: train.global_batch: 8 is not a multiple of micro_batch × world size = 2 × 3 = 6; no "
            "micro_batch fits 3 ranks; run on a number of ranks that divides 8 (1, 2, 4, 8) (the global batch is the "
            "experiment: keep it to resume a run)")
    assert files() == before
    assert (run_dir / LOCK_FILE).read_text() == ""


def test_a_layout_that_does_not_divide_the_global_batch_is_refused():
    """3 ranks cannot split a global batch of 8, nor micro-batches of 3 on 2 ranks: refused with the numbers and
    what would fit."""
    with pytest.raises(ConfigError, match=r"train.global_batch: 8 is not a multiple of micro_batch × world size = "
                                          r"4 × 3 = 12; no micro_batch fits 3 ranks; run on a number of ranks that "
                                          r"divides 8 \(1, 2, 4, 8\)"):
        accumulation_steps(8, 4, 3)
    with pytest.raises(ConfigError, match="on 2 ranks train.micro_batch may be 1, 2, 4"):
        accumulation_steps(8, 3, 2)
    assert accumulation_steps(8, 2, 2) == 2

"""Elastic resume through train.py on CPU ranks: a run stopped on 2 ranks continues on 1 (twice the micro-batch), then
on 2 again, and every optimizer step trains on the same tokens as the uninterrupted run (its `batch_digest`), with
losses and weights within fp32 reduction-order differences; a layout that cannot hold the global batch is refused
before anything is touched."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import train
from config import ConfigError, load_config
from test_moe_train import MOE, moe_state
from test_train import args_for, data_dir, final_params, records, run_ranks  # noqa: F401 - data_dir is a fixture

# What one rank count against another may differ by, in fp32. The per-micro-batch sums (the loss over 4·32 token
# rows, the gradients' sums over the rows) are the only computations whose order a new layout changes: each differs
# by ≲ sqrt(n)·u relative (n ≤ 256 terms, u = 2⁻²⁴: ≈ 1e-6). 9 steps of Adam/Muon with lr 3e-3 move weights by
# lr·(relative gradient difference) per step, far below that, so the loss stays within a few rounding errors of
# |loss| ≈ 6 — a few 1e-6. LOSS_TOL is 10× that bound; a step trained on one other window moves the loss by ~1e-2.
LOSS_TOL = 5e-5
# Weights: the same per-step argument on |w| ≲ 0.1 entries (the init std and lr·steps): a few 1e-8 per step, and
# Adam can turn a near-zero gradient's rounding into a whole lr-sized step of either sign (3e-3) on an isolated entry,
# so the bound is relative to the whole tensor (its norm), where such entries weigh ~1/sqrt(numel).
WEIGHT_REL_TOL = 1e-4

STOPS = (3, 6)  # the elastic run stops after these steps; the reference runs straight through 9


def elastic(data, tmp_path, name: str, extra: tuple[str, ...], middle_micro: int, last_micro: int) -> list[str]:
    """2 ranks (micro 4) → 1 process (micro `middle_micro`) → 2 ranks (micro `last_micro`); the last argv."""
    first = args_for(data, tmp_path, name, "train.ckpt_every=3", *extra)
    run_ranks(2, ["--stop-at-step", str(STOPS[0]), *first])
    train.main(["--stop-at-step", str(STOPS[1]), *args_for(data, tmp_path, name, "train.ckpt_every=3", *extra,
                                                              f"train.micro_batch={middle_micro}")])
    last = args_for(data, tmp_path, name, "train.ckpt_every=3", *extra, f"train.micro_batch={last_micro}")
    run_ranks(2, last)
    return last


def assert_same_tokens_and_close_losses(ref_dir, run_dir) -> None:
    ref, got = records(ref_dir, "train"), records(run_dir, "train")
    assert [r["step"] for r in got] == [r["step"] for r in ref] == list(range(1, 10))  # no step twice, none lost
    assert [r["batch_digest"] for r in got] == [r["batch_digest"] for r in ref]  # the same tokens, every step
    assert len(set(r["batch_digest"] for r in ref)) == 9  # (and the digest tells the steps apart)
    assert [r["world_size"] for r in got] == [2] * 3 + [1] * 3 + [2] * 3
    assert [r["tokens"] for r in got] == [r["tokens"] for r in ref]
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(ref, got)]
    assert max(diffs[:3]) == 0.0  # the first part is the same layout and the same code: bit-identical
    assert max(diffs) < LOSS_TOL, diffs


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / a.double().norm().clamp_min(1e-12)).item()


def test_dense_muon_resumes_on_one_rank_then_two(data_dir, tmp_path, capsys, recwarn):  # noqa: F811
    extra = ("optim.name=muon", "optim.muon.distributed=true", "optim.muon.ns_dtype=float32", "train.steps=9",
             "train.eval_every=100")
    ref = args_for(data_dir, tmp_path, "ref", "train.ckpt_every=3", *extra)
    run_ranks(2, ref)
    last = elastic(data_dir, tmp_path, "elastic", extra, middle_micro=8, last_micro=2)  # accumulation 1, 1, 2
    out = capsys.readouterr().out
    assert (f"at step {STOPS[0]} (written by 2 rank(s) × micro_batch 4, now 1 × 8: the model and optimizer were "
            "resharded, and every step reads the same tokens as before)") in out
    assert not [w for w in recwarn if "RNG" in str(w.message)]  # every rank's RNG states were equal: carried over
    assert_same_tokens_and_close_losses(tmp_path / "ref", tmp_path / "elastic")
    pr, pe = final_params(tmp_path / "ref", ref), final_params(tmp_path / "elastic", last)
    assert max(rel_diff(pr[n], pe[n]) for n in pr) < WEIGHT_REL_TOL


def test_moe_adamw_resumes_on_one_rank_then_two(data_dir, tmp_path):  # noqa: F811
    """The aux-loss-free balancing bias, its load counters and the z-loss carry over: the bias moves by ±rate per
    expert and step from the step's loads, summed over ranks and micro-batches, so it is the same on any layout."""
    extra = (*MOE, "model.moe.balance=bias", "model.moe.bias_rate=0.01", "model.moe.z_coef=1e-3",
             "optim.name=adamw", "train.steps=9", "train.eval_every=100")
    ref = args_for(data_dir, tmp_path, "ref", "train.ckpt_every=3", *extra)
    run_ranks(2, ref)
    last = elastic(data_dir, tmp_path, "elastic", extra, middle_micro=8, last_micro=2)  # accumulation 1, 1, 2
    assert_same_tokens_and_close_losses(tmp_path / "ref", tmp_path / "elastic")
    r, e = records(tmp_path / "ref", "train"), records(tmp_path / "elastic", "train")
    assert [a["moe/L1/max_share"] for a in r] == [b["moe/L1/max_share"] for b in e]  # the same loads every step
    sr, se = moe_state(tmp_path / "ref", ref), moe_state(tmp_path / "elastic", last)
    bias = "layers.0.mlp.expert_bias"
    assert sr[bias].abs().sum() > 0 and torch.equal(sr[bias], se[bias])  # ±rate steps from equal loads: exact
    assert max(rel_diff(sr[n], se[n]) for n in sr if sr[n].is_floating_point() and sr[n].norm() > 0) < WEIGHT_REL_TOL


def test_the_switch_aux_loss_warns_only_when_its_groups_change(data_dir):  # noqa: F811
    """balance=aux balances each forward over all ranks' sequences together: 2 ranks × 4 and 1 × 8 are the same
    groups (no warning), 2 × 2 are not."""
    cfg = load_config(["configs/tiny_moe.yaml"], ["model.moe.balance=aux"])
    saved = {"world_size": 2, "micro_batch": 4}
    assert train.aux_regrouped(cfg, saved, SimpleNamespace(world_size=1, micro_batch=8)) == ""
    warning = train.aux_regrouped(cfg, saved, SimpleNamespace(world_size=2, micro_batch=2))
    assert "balances each forward's 4 sequences (micro_batch × ranks; 8 before the resume)" in warning
    bias = load_config(["configs/tiny_moe.yaml"], ["model.moe.balance=bias"])
    assert train.aux_regrouped(bias, saved, SimpleNamespace(world_size=2, micro_batch=2)) == ""


def test_a_layout_that_does_not_divide_the_global_batch_is_refused(data_dir, tmp_path):  # noqa: F811
    """3 ranks cannot split a global batch of 8: refused with the numbers and the rank counts that would work, before
    the checkpoint is read (so nothing of the run changes)."""
    with pytest.raises(ConfigError, match=r"train.global_batch: 8 is not a multiple of micro_batch × world size = "
                                          r"4 × 3 = 12; no micro_batch fits 3 ranks; run on a number of ranks that "
                                          r"divides 8 \(1, 2, 4, 8\)"):
        train.accumulation_steps(8, 4, 3)
    with pytest.raises(ConfigError, match="on 2 ranks train.micro_batch may be 1, 2, 4"):
        train.accumulation_steps(8, 3, 2)
    assert train.accumulation_steps(8, 2, 2) == 2

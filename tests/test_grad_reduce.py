"""train.grad_reduce: one FSDP2 gradient reduction per optimizer step (the default) against one per micro-batch, on 2
CPU ranks through train.py, for dense AdamW, dense Muon and MoE AdamW.

Both paths sum the same micro-batch gradients of the same ranks; only the order differs — (a₁ + a₂) + (b₁ + b₂) for
one reduce-scatter per step, (a₁ + b₁) + (a₂ + b₂) for one per micro-batch — so in float64 the runs agree to the
rounding of a few additions (≤ 4·u₆₄·Σ|terms| per entry), which six AdamW/Muon steps amplify at most by the
optimizer's normalization of small second moments (slope ≤ lr/ε): drift_tol(6, terms=4) ≈ 8e-10 of each weight's
scale, and 1e-9 of the grad norm; both catch any gradient that is missing, doubled or reduced twice (an error of order
1). The logged losses are float64 sums of float64 losses from weights that close: within drift_tol too."""
from __future__ import annotations

import pytest
import torch

from test_train import (args_for, data_dir, drift_tol, final_params, records,  # noqa: F401
                        run_ranks)  # data_dir is a fixture

CASES = {
    "dense_adamw": (),
    "dense_muon": ("optim.name=muon", "optim.muon.ns_dtype=float32"),
    "moe_adamw": ("model.moe.n_experts=4", "model.moe.top_k=2", "model.moe.balance=bias", "model.moe.bias_rate=0.01"),
}


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("grad_reduce")
    argvs = {}
    for case, extra in CASES.items():
        for mode in ("step", "micro_batch"):
            argv = args_for(data_dir, out, f"{case}-{mode}", *extra, f"train.grad_reduce={mode}",
                            "train.micro_batch=2", "train.dtype=float64")  # 2 ranks × 2 micro-batches of 2
            if case.startswith("moe"):
                argv[2:2] = ["--config", "configs/tiny_moe.yaml"]
            argvs[case, mode] = argv
    run_ranks(2, *argvs.values())
    return out, argvs


@pytest.mark.parametrize("case", list(CASES))
def test_one_reduction_per_step_matches_one_per_micro_batch(runs, case):
    out, argvs = runs
    step, micro = (records(out / f"{case}-{mode}", "train") for mode in ("step", "micro_batch"))
    assert [r["step"] for r in step] == [r["step"] for r in micro] == list(range(1, 7))
    for a, b in zip(step, micro):
        assert abs(a["loss"] - b["loss"]) <= drift_tol(6, terms=4) * a["loss"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-9, abs=0)
    assert step[-1]["loss"] < step[0]["loss"]  # it trained
    p_step = final_params(out / f"{case}-step", argvs[case, "step"])
    p_micro = final_params(out / f"{case}-micro_batch", argvs[case, "micro_batch"])
    assert p_step.keys() == p_micro.keys()
    for name, t in p_step.items():
        assert t.dtype == torch.float64, name  # final_params keeps the run's float64
        assert ((t - p_micro[name]).abs().max() / t.abs().max().clamp_min(1)).item() <= drift_tol(6, terms=4), name

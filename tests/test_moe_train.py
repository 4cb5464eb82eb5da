"""Llama-MoE through train.py on CPU: 2 FSDP2 ranks vs one process (AdamW and Muon, both balancing modes), a
bit-identical resume that carries the balancing bias, and the tiny MoE config learning with its MoE metrics."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import train
from config import load_config, resolve_vocab
from model.llama import build_model
from runtime.checkpoint import latest_checkpoint, load_model_weights
from test_train import (U32, args_for, data_dir, drift_tol, records, run_ranks,  # noqa: F401
                        run_dtype)  # data_dir is a fixture

MOE = ("model.moe.n_experts=4", "model.moe.top_k=2")


def moe_state(run_dir: Path, argv: list[str]) -> dict[str, torch.Tensor]:
    """Parameters and buffers (expert bias, load counters) of the run's newest checkpoint, in the run's dtype."""
    cfg = load_config([a for a, b in zip(argv[1::2], argv[::2]) if b == "--config"], [a for a in argv if "=" in a])
    model = build_model(resolve_vocab(cfg, n_vocab=320), dtype=run_dtype(cfg))
    load_model_weights(model, latest_checkpoint(run_dir / "checkpoints"))
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


CASES = [("adamw", "bias"), ("muon", "aux")]


def fsdp_extra(optimizer: str, balance: str) -> tuple[str, ...]:
    return (*MOE, f"model.moe.balance={balance}", "model.moe.bias_rate=0.01", f"optim.name={optimizer}",
            "optim.muon.ns_dtype=float32", "train.steps=10", "train.eval_every=5", "train.dtype=float64")


@pytest.fixture(scope="module")
def two_ranks(data_dir, tmp_path_factory) -> dict[tuple[str, str], tuple[Path, list[str]]]:  # noqa: F811
    """The 2-rank twin of each case, both in one launch (run_ranks: its ranks run the commands one after another;
    every train.main seeds all its RNGs and builds its own process group, so a run is what a launch of its own
    gives). (optimizer, balance) → (its log.out_dir, its argv)."""
    dirs = {case: tmp_path_factory.mktemp("-".join(case)) for case in CASES}
    runs = {case: args_for(data_dir, dirs[case], "two", *fsdp_extra(*case)) for case in CASES}  # 2 × micro 4
    run_ranks(2, *runs.values())
    return {case: (dirs[case], runs[case]) for case in CASES}


@pytest.mark.parametrize("optimizer,balance", CASES)
def test_two_fsdp_ranks_match_one_process(data_dir, tmp_path, optimizer, balance, two_ranks):  # noqa: F811
    """float64, as tests/test_train.py's dense twin (its docstring and drift_tol), the router included (its logits
    are computed in at least float32, so in float64 here: model/moe.py)."""
    one = args_for(data_dir, tmp_path, "one", "train.micro_batch=8", *fsdp_extra(optimizer, balance))
    out, two = two_ranks[(optimizer, balance)]  # 2 ranks × micro 4 = the same 8 sequences
    train.main(one)
    r1, r2 = records(tmp_path / "one", "train"), records(out / "two", "train")
    assert len(r1) == len(r2) == 10
    tol = drift_tol(10)
    # float64 losses from weights ≤ tol apart (the val_loss argument of the dense twin)
    assert all(abs(a["loss"] - b["loss"]) <= tol * a["loss"] for a, b in zip(r1, r2))
    # the loads are summed over ranks before the bias update: both runs see the same global loads
    assert all(a["moe/L1/max_share"] == b["moe/L1/max_share"] for a, b in zip(r1, r2))
    # aux = E·Σ fᵢPᵢ with equal loads fᵢ (above) and float64 probabilities Pᵢ from weights ≤ tol apart
    assert all(abs(a["aux_loss"] - b["aux_loss"]) <= tol * a["aux_loss"] for a, b in zip(r1, r2))
    e1, e2 = records(tmp_path / "one", "eval"), records(out / "two", "eval")
    assert all(abs(a["val_loss"] - b["val_loss"]) <= tol * a["val_loss"] for a, b in zip(e1, e2))
    s1, s2 = moe_state(tmp_path / "one", one), moe_state(out / "two", two)
    bias = "layers.0.mlp.expert_bias"
    if balance == "bias":
        assert s1[bias].abs().sum() > 0
    assert torch.equal(s1[bias], s2[bias])  # the same ±rate steps from the same global loads
    assert all(((s1[n] - s2[n]).abs().max() / s1[n].abs().max().clamp_min(1)).item() <= tol
               for n in s1 if s1[n].is_floating_point())


def test_resume_is_bit_identical_with_the_bias(data_dir, tmp_path):  # noqa: F811
    extra = (*MOE, "model.moe.balance=bias", "model.moe.bias_rate=0.01", "train.ckpt_every=2")
    full = args_for(data_dir, tmp_path, "full", *extra)
    part = args_for(data_dir, tmp_path, "part", *extra)
    train.main(full)
    train.main(["--stop-at-step", "3", *part])
    train.main(part)  # the same command resumes
    lf = [(r["step"], r["loss"], r["moe/L0/max_load"]) for r in records(tmp_path / "full", "train")]
    lp = [(r["step"], r["loss"], r["moe/L0/max_load"]) for r in records(tmp_path / "part", "train")]
    assert lf == lp
    sf, sp = moe_state(tmp_path / "full", full), moe_state(tmp_path / "part", part)
    assert sf["layers.1.mlp.expert_bias"].abs().sum() > 0
    assert all(torch.equal(sf[n], sp[n]) for n in sf)


def test_tiny_moe_config_learns_and_logs_its_balance(data_dir, tmp_path):  # noqa: F811
    argv = ["--config", "configs/tiny_moe.yaml", f"data.dir={data_dir.dir}", f"data.source={data_dir.source}",
            "data.tokenizer=bpe:320", "data.seq_len=32", "data.val_frac=0.2", "train.steps=12",
            "train.global_batch=8", "train.micro_batch=8", "train.eval_every=6", "train.eval_tokens=1024",
            "schedule.warmup_steps=2", "log.every=3", "log.wandb.mode=disabled", f"log.out_dir={tmp_path}",
            "log.run_name=tiny", "train.device=cpu", "train.dtype=float32"]
    train.main(argv)
    train_recs, evals = records(tmp_path / "tiny", "train"), records(tmp_path / "tiny", "eval")
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5
    last = train_recs[-1]
    for i in range(4):
        assert 0 <= last[f"moe/L{i}/min_share"] <= 1 / 16 <= last[f"moe/L{i}/max_share"] < 1
        assert last[f"moe/L{i}/max_load"] >= 1 >= last[f"moe/L{i}/min_load"]
        assert last[f"moe/L{i}/aux"] > 0.5 and last[f"moe/L{i}/z"] > 0
    # the LM loss stays separate from the (weighted) aux terms: 4 layers × 0.01 × aux
    # the logged aux_loss is float32 arithmetic on the same per-layer values: 4 products by 0.01 (itself rounded),
    # 3 additions and train.py's `sums`, ≲ 6 roundings of u₃₂·aux_loss; 16 leaves room for another summation order
    assert abs(last["aux_loss"] - 0.01 * sum(last[f"moe/L{i}/aux"] for i in range(4))) <= 16 * U32 * last["aux_loss"]
    assert "scale/scale_output/L0/mean" in evals[-1]  # per-expert vectors in the telemetry

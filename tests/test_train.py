"""train.py end to end on CPU: FSDP2 ranks vs one process, gradient accumulation, bit-identical resume, non-finite
stops, and the run directory's contract. One file (about 450 lines) because its tests share one 2-rank launch
(tests/train_harness.py) that would otherwise run once per file; a run stopped from outside is tests/test_stop.py."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import train
from config import load_config
from strictconfig.config import ConfigError
from data.config import DataConfig
from data.prepare import prepare
from runtime.trainer import NonFiniteError
from model.llama import build_model
from runtime.checkpoint import checkpoint_tensors, latest_checkpoint, load_model_weights
from multiproc import Rendezvous, spawn
from train_harness import (U32, U64, _error_worker, _worker, args_for, data_dir, drift_tol, final_params,  # noqa: F401
                           logged_loss_tol, records, run_dtype, run_ranks)  # re-exported; data_dir is a fixture

# ------------------------------------------------------------------------------------------------------ tests


def test_run_dir_contract(data_dir, tmp_path, capsys):
    summary = train.main(args_for(data_dir, tmp_path, "smoke"))
    assert "stopped normalizing" not in capsys.readouterr().err  # the unified preset at its lr: every branch on
    run = tmp_path / "smoke"
    assert summary["step"] == 6 and (run / "config.yaml").exists()
    saved = load_config(run / "config.yaml")
    assert saved.model.vocab_size == 320 and saved.model.scale.placement == "dnp"  # resolved config
    train_recs, eval_recs = records(run, "train"), records(run, "eval")
    assert [r["step"] for r in train_recs] == [1, 2, 3, 4, 5, 6]
    for r in train_recs:
        assert {"step", "tokens", "loss", "lr", "grad_norm", "tok_per_s"} <= set(r)
    assert train_recs[-1]["tokens"] == 6 * 8 * 32
    assert [r["step"] for r in eval_recs] == [0, 3, 6]
    assert all("val_loss" in r and "wnorm/L0/q" in r for r in eval_recs)
    assert "scale/scale_output/L1/mean" in eval_recs[-1]
    headroom = {k: v for k, v in eval_recs[-1].items() if k.startswith("headroom/")}
    assert len(headroom) == 2 * 5 + 1 and min(headroom.values()) > 100  # q, k, v, gate, up per layer; the LM head
    assert eval_recs[-1]["val_loss"] < eval_recs[0]["val_loss"]
    assert latest_checkpoint(run / "checkpoints").name.endswith("6")


def test_nothing_of_a_run_outlives_its_process_group(data_dir, tmp_path):
    """train.main frees its FSDP2 model before destroying the process group: none of it is left for a later garbage
    collection, which in a process that trains again (the golden and resume tests run several runs per rank) would
    run its destructors against a destroyed group, and can abort the rank (docs/design.md trap 1)."""
    import gc
    gc.collect()
    train.main(args_for(data_dir, tmp_path, "freed", "train.steps=2", "schedule.warmup_steps=1", "train.eval_every=2"))
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, (torch.nn.Module, torch.Tensor))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not left, f"{len(left)} modules or tensors of the run were left to a later collection: {sorted(set(left))}"


def test_extra_eval_set_is_logged(data_dir, tmp_path, shakespeare_text):
    """An eval-only set (text never trained on, tokenized like the training data) becomes val_loss/<folder name>."""
    wiki = tmp_path / "wikitext2"
    held_out = tmp_path / "held_out.txt"
    held_out.write_text(shakespeare_text[600_000:700_000])
    eval_cfg = DataConfig(source=str(held_out), dir=str(wiki), txt_document="paragraph")
    prepare(eval_cfg, eval_only=True, like=data_dir.dir, progress=False)
    train.main(args_for(data_dir, tmp_path, "extra", f"data.val_sets=[{wiki}]", "train.steps=3",
                        "schedule.warmup_steps=1"))
    evals = records(tmp_path / "extra", "eval")
    assert all("val_loss/wikitext2" in r and "val_loss" in r for r in evals)
    assert evals[-1]["val_loss/wikitext2"] < evals[0]["val_loss/wikitext2"]
    assert evals[0]["val_loss/wikitext2"] != evals[0]["val_loss"]


def test_gradient_accumulation_matches_one_batch(data_dir, tmp_path):
    # float64, so that what is compared is the accumulation arithmetic, not fp32 summation order
    argv_a = args_for(data_dir, tmp_path, "accum", "train.micro_batch=2", "train.dtype=float64")  # 4 × 2
    argv_b = args_for(data_dir, tmp_path, "whole", "train.micro_batch=8", "train.dtype=float64")  # 1 × 8
    train.main(argv_a)
    train.main(argv_b)
    la = [r["loss"] for r in records(tmp_path / "accum", "train")]
    lb = [r["loss"] for r in records(tmp_path / "whole", "train")]
    # the logged float64 losses, from weights ≤ drift_tol apart (the val_loss argument below)
    assert all(abs(a - b) <= drift_tol(6) * a for a, b in zip(la, lb)), (la, lb)
    pa, pb = final_params(tmp_path / "accum", argv_a), final_params(tmp_path / "whole", argv_b)
    assert pa["tok_embeddings.weight"].dtype == torch.float64
    assert max(((pa[n] - pb[n]).abs().max() / pa[n].abs().max().clamp_min(1)).item() for n in pa) <= drift_tol(6)


def fsdp_extra(optimizer: str) -> tuple[str, ...]:
    return (f"optim.name={optimizer}", "train.steps=10", "train.eval_every=100", "optim.muon.ns_dtype=float32",
            "train.dtype=float64")


# Eager, as the tolerances below were derived for: train.compile=auto compiles bf16 on a CPU (runtime/precision.py),
# which would add three cold compiles (one process, two ranks) to a test of FSDP2's mixed precision; the compiled
# path is test_compiled_blocks_match_eager's.
BF16_EXTRA = ("train.dtype=bfloat16", "train.compile=false", "train.steps=3", "train.eval_every=100",
              "schedule.warmup_steps=1")


# optim.scale_wd_invariant=false on a MoE: each block's bank of input-side β decays at the router's entry alone (its
# only entry outside an inner Norm), so the masked decay runs on a bank FSDP2 shards over the ranks.
SPARED = ("model.moe={n_experts: 4, top_k: 2, n_shared: 1}", "model.scale.invariant_magnitude=keep",
          "optim.scale_wd_invariant=false", *fsdp_extra("adamw"))


@pytest.fixture(scope="module")
def two_ranks(data_dir, tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """The 2-rank runs of the tests below, in one launch instead of five: run_ranks' ranks run the commands one after
    another, and every train.main seeds all its RNGs and builds its own process group (a fresh port per run), so each
    run is what a launch of its own gives (tests/test_grad_reduce.py runs six so). The FSDP2 twins of the one-process
    runs (AdamW and Muon in float64, bf16), and the resume test's uninterrupted run and its twin stopped after step 3
    then continued by the same command. name → (its log.out_dir, its argv)."""
    root = tmp_path_factory.mktemp("two_ranks")
    dirs = {name: root / name for name in ("fsdp-adamw", "fsdp-muon", "bf16", "full", "part", "spared")}
    runs = {f"fsdp-{o}": args_for(data_dir, dirs[f"fsdp-{o}"], "two", *fsdp_extra(o)) for o in ("adamw", "muon")}
    runs["spared"] = args_for(data_dir, dirs["spared"], "two", *SPARED)
    runs["bf16"] = args_for(data_dir, dirs["bf16"], "two", *BF16_EXTRA)  # 2 ranks × micro 4 = the same 8 sequences
    runs["full"] = args_for(data_dir, dirs["full"], "full", "train.ckpt_every=2")
    runs["part"] = args_for(data_dir, dirs["part"], "part", "train.ckpt_every=2")
    run_ranks(2, runs["fsdp-adamw"], runs["fsdp-muon"], runs["bf16"], runs["spared"], runs["full"],
              ["--stop-at-step", "3", *runs["part"]], runs["part"])  # stopped after step 3, then the same command
    return {name: (dirs[name], argv) for name, argv in runs.items()}


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_two_fsdp_ranks_match_one_process(data_dir, tmp_path, optimizer, two_ranks):
    """float64 (the same FSDP2 path as float32: no mixed-precision policy), so that what is compared is the sharding,
    not float32 summation order, which Adam's normalization and Newton–Schulz amplify after a few steps until the
    difference depends on the CPU's kernels. Newton–Schulz in float32 (not the default bf16): the float32 casts
    of float64 updates that agree to ~1e-16 are the same bits but for a ~1e-9 chance per entry."""
    one = args_for(data_dir, tmp_path, "one", "train.micro_batch=8", *fsdp_extra(optimizer))
    out, two = two_ranks[f"fsdp-{optimizer}"]  # 2 ranks × micro 4 = the same 8 sequences
    train.main(one)
    r1, r2 = records(tmp_path / "one", "train"), records(out / "two", "train")
    assert len(r1) == len(r2) == 10
    tol = drift_tol(10)
    for a, b in zip(r1, r2):
        # float64 losses from weights ≤ tol apart (as val_loss below)
        assert abs(a["loss"] - b["loss"]) <= tol * a["loss"], (a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= tol * max(1.0, a["grad_norm"])  # float64 throughout
    p1, p2 = final_params(tmp_path / "one", one), final_params(out / "two", two)
    assert max(((p1[n] - p2[n]).abs().max() / p1[n].abs().max().clamp_min(1)).item() for n in p1) <= tol
    # Evaluation and telemetry agree too. At step 0 exactly: the sharded init is the single-process one bit for bit.
    e1, e2 = records(tmp_path / "one", "eval"), records(out / "two", "eval")
    assert [r["step"] for r in e1] == [r["step"] for r in e2] == [0, 10]
    keys = [k for k in e1[0] if k.startswith(("scale/", "wnorm/"))]
    assert len(keys) > 10 and all(e1[0][k] == e2[0][k] for k in keys)
    # val_loss sums in float64 (≲ K·u₆₄ apart) from weights ≤ drift_tol apart.
    assert all(abs(a["val_loss"] - b["val_loss"]) <= tol * a["val_loss"] for a, b in zip(e1, e2))
    # Telemetry casts γ and W to float32 and reduces there (runtime/telemetry.py): each side errs by ≤ K·u₃₂ of its
    # magnitude with K ≤ d² = 1024 entries, so 2·K·u₃₂ ≈ 1.2e-4; γ moves ~lr = 3e-3 per step, and a statistic over a
    # rank's half of a vector instead of the whole moves by γ's spread (~1e-2).
    assert all(abs(e1[1][k] - e2[1][k]) <= 2 * 1024 * U32 * max(1.0, abs(e1[1][k])) for k in keys)


def test_undecayed_magnitudes_shard_like_their_bank(data_dir, tmp_path, two_ranks):
    """optim.scale_wd_invariant=false on 2 FSDP2 ranks, each holding part of a bank of spared β (the fast path's
    `input_invariant`), matches one process to float64 drift; against the default run, the spared β's keep the
    decay it took and the router's β does not."""
    one = args_for(data_dir, tmp_path, "one", "train.micro_batch=8", *SPARED)
    out, two = two_ranks["spared"]
    train.main(one)
    p1, p2 = final_params(tmp_path / "one", one), final_params(out / "two", two)
    tol = drift_tol(10)
    assert max(((p1[n] - p2[n]).abs().max() / p1[n].abs().max().clamp_min(1)).item() for n in p1) <= tol
    default = args_for(data_dir, tmp_path, "decayed", "train.micro_batch=8",
                       *(a for a in SPARED if not a.startswith("optim.scale_wd_invariant")))
    train.main(default)
    p0 = final_params(tmp_path / "decayed", default)
    # Against the default run, a spared β is off by the decay it skipped, Σ lr_t·wd·β ≈ 0.0171 · 0.1 (β ≈ 1; the
    # logged lrs of the 10 steps sum to 0.0171), and the router's β by the drift of its gradient alone.
    lrs = sum(r["lr"] for r in records(tmp_path / "one", "train"))
    for i in range(2):
        betas = [n for n in p1 if n.startswith(f"layers.{i}.") and n.endswith("in_scale.beta")]
        moved = {n: (p1[n] - p0[n]).abs().item() for n in betas}
        assert moved.pop(f"layers.{i}.mlp.router.in_scale.beta") < 1e-5
        assert len(moved) == 7 and all(abs(m / (lrs * 0.1) - 1) < 0.1 for m in moved.values()), moved


def test_two_fsdp_ranks_bf16_first_steps(data_dir, tmp_path, two_ranks):
    """bf16 mixed precision (bf16 compute, fp32 master weights and reduction): the first steps agree at bf16
    tolerance (later steps drift apart, docs/design.md)."""
    train.main(args_for(data_dir, tmp_path, "one", "train.micro_batch=8", *BF16_EXTRA))
    l1 = [r["loss"] for r in records(tmp_path / "one", "train")]
    l2 = [r["loss"] for r in records(two_ranks["bf16"][0] / "two", "train")]
    # bf16 (u = 2⁻⁸ ≈ 3.9e-3) activations, fp32 accumulation: a per-token loss is off by a few u, and the ranks round
    # other GEMM shapes: 2e-2 ≈ 5·u of step 1's loss (the same weights); step 2 adds one AdamW step taken from
    # gradients that already differ at bf16's u, whose effect on the loss is first-order small: 5e-2
    assert abs(l1[0] - l2[0]) < 2e-2 and abs(l1[1] - l2[1]) < 5e-2
    # not a rounding bound: a train batch's loss against the held-out loss of the same untrained model (≈ ln 320)
    assert l1[0] > 5.0 and abs(l1[0] - records(tmp_path / "one", "eval")[0]["val_loss"]) < 0.3


def test_rank0_data_error_reaches_every_rank(tmp_path):
    """A data problem found by rank 0 is raised on every rank with the same message: nobody hangs."""
    argv = ["--config", "configs/tiny_cpu.yaml", f"data.dir={tmp_path / 'missing'}", f"data.source={tmp_path}/x.txt",
            "log.wandb.mode=disabled", f"log.out_dir={tmp_path}", "train.device=cpu", "train.dtype=float32"]
    spawn(_error_worker, (2, Rendezvous.new(), argv, tmp_path), nprocs=2)
    messages = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert messages[0] == messages[1] and messages[0].startswith("SourceError: source") and "x.txt" in messages[0]


def test_resume_with_other_settings_is_refused(data_dir, tmp_path):
    train.main(args_for(data_dir, tmp_path, "r", "train.steps=2", "schedule.warmup_steps=1"))
    with pytest.raises(ConfigError, match=r"optim\.lr: 0\.003 in the checkpoint, 0\.001 now"):
        train.main(args_for(data_dir, tmp_path, "r", "train.steps=2", "schedule.warmup_steps=1", "optim.lr=1e-3"))
    # what may change on resume: logging, eval and checkpoint cadence; a data cap that keeps the same tokens (the dir
    # holds its whole source, far below 10¹²)
    train.main(args_for(data_dir, tmp_path, "r", "train.steps=2", "schedule.warmup_steps=1", "train.eval_every=7",
                        "data.max_tokens=1000000000000"))


def test_compiled_blocks_match_eager(data_dir, tmp_path):
    extra = ("train.steps=2", "schedule.warmup_steps=1", "train.eval_every=100")
    train.main(args_for(data_dir, tmp_path, "eager", *extra))
    train.main(args_for(data_dir, tmp_path, "compiled", "train.compile=true", *extra))
    le = [r["loss"] for r in records(tmp_path / "eager", "train")]
    lc = [r["loss"] for r in records(tmp_path / "compiled", "train")]
    # float32 (float64 compiles 3× slower): inductor reorders reductions of K ≤ 1024 terms (vocab 320, 256 tokens,
    # d² = 1024), each side within K·u₃₂ of the loss; step 2's AdamW step from gradients that differ at that level
    # moves the loss only to first order (large moves only where the gradient, and so the loss's slope, is ~0).
    # 2·K·u₃₂·loss ≈ 8e-4, against step 1's move of the loss by 0.33 that a lost gradient path (torch 2.11's bug) cuts.
    assert all(abs(a - b) <= 2 * 1024 * U32 * a + logged_loss_tol(a, additions=2) for a, b in zip(le, lc)), (le, lc)


def test_two_rank_resume_is_bit_identical(two_ranks):
    """2 ranks stopped after step 3, then the same command again (the `two_ranks` launch), against the run that went
    straight through."""
    (out_full, full), (out_part, part) = two_ranks["full"], two_ranks["part"]
    lf = [(r["step"], r["loss"]) for r in records(out_full / "full", "train")]
    lp = [(r["step"], r["loss"]) for r in records(out_part / "part", "train")]
    assert lf == lp  # bit-identical losses, and no duplicated steps in metrics.jsonl
    pf, pp = final_params(out_full / "full", full), final_params(out_part / "part", part)
    assert all(torch.equal(pf[n], pp[n]) for n in pf)


def poison(steps: set[int], micro_per_step: int = 2):
    """Replace the fused head + loss (the fast path's, fast/head.py) by one whose training loss is NaN in the given
    steps (evaluation untouched)."""
    from fast.head import FusedHeadLoss
    real = FusedHeadLoss.__call__
    calls = {"n": 0}

    def poisoned(self, *args, **kwargs):
        loss = real(self, *args, **kwargs)
        if not torch.is_grad_enabled():  # evaluation
            return loss
        calls["n"] += 1
        return loss * float("nan") if (calls["n"] - 1) // micro_per_step + 1 in steps else loss

    FusedHeadLoss.__call__ = poisoned
    return real


def test_nonfinite_loss_stops_before_checkpoint(data_dir, tmp_path, monkeypatch):
    from fast.head import FusedHeadLoss
    monkeypatch.setattr(FusedHeadLoss, "__call__", FusedHeadLoss.__call__)  # restored after the test
    poison({3, 4, 5, 6})
    argv = args_for(data_dir, tmp_path, "nan", "train.ckpt_every=1", "train.eval_every=100")
    with pytest.raises(NonFiniteError, match="at step 3"):
        train.main(argv)
    assert latest_checkpoint(tmp_path / "nan" / "checkpoints").name.endswith("2")  # the poisoned state never saved


def test_a_nonfinite_state_behind_finite_losses_is_never_saved(data_dir, tmp_path, monkeypatch):
    """Optimizer state poisoned where no loss shows it (as a checkpoint damaged in place and loaded would be): the
    save refuses, the checkpoints it would have pruned stay, and the advice names the intact one and a command
    that works; that command then finishes the run as an uninterrupted one does."""
    from runtime.trainer import Trainer
    real = Trainer.save

    def poisoned_save(self):
        if self.step_count == 4:
            state = next(iter(self.optimizer.state.values()))
            state["exp_avg_sq"].view(-1)[0] = float("nan")
        return real(self)
    monkeypatch.setattr(Trainer, "save", poisoned_save)
    argv = args_for(data_dir, tmp_path, "state", "train.ckpt_every=2", "train.eval_every=100", "train.keep_ckpts=1")
    with pytest.raises(NonFiniteError, match=r"not finite at step 4, although every loss was; nothing was saved\. "
                                             r"The newest intact checkpoint is .*step_00000002: the same command "
                                             r"resumes from it") as err:
        train.main(argv)
    assert "start a new run (another log.run_name)" in str(err.value)
    ckpts = tmp_path / "state" / "checkpoints"
    assert [p.name for p in ckpts.glob("step_*")] == ["step_00000002"]  # keep_ckpts=1 pruned nothing
    monkeypatch.undo()
    train.main(argv)
    reference = args_for(data_dir, tmp_path, "clean", "train.ckpt_every=2", "train.eval_every=100")
    train.main(reference)
    a, b = final_params(tmp_path / "state", argv), final_params(tmp_path / "clean", reference)
    assert all(a[n].equal(b[n]) for n in a)


def _skip_worker(rank: int, world: int, rdzv: Rendezvous, argv: list[str]) -> None:
    if rank == 0:
        poison({3}, micro_per_step=1)  # only rank 0's loss is NaN: the all-reduced loss tells every rank to skip
    _worker(rank, world, rdzv, [argv])


@pytest.mark.parametrize("world", [1, 2])
def test_nonfinite_step_is_skipped_on_every_rank(data_dir, tmp_path, monkeypatch, world):
    """on_nonfinite: skip. The poisoned step 3 changes no parameter and no optimizer state on any rank, is counted in
    metrics.jsonl, and the run goes on to the end."""
    from fast.head import FusedHeadLoss
    monkeypatch.setattr(FusedHeadLoss, "__call__", FusedHeadLoss.__call__)
    argv = args_for(data_dir, tmp_path, "skip", "train.on_nonfinite=skip", "train.ckpt_every=1",
                    "train.keep_ckpts=10", "train.eval_every=100")
    if world == 1:
        poison({3})
        train.main(argv)
    else:
        spawn(_skip_worker, (world, Rendezvous.new(), argv), nprocs=world)
    recs = records(tmp_path / "skip", "train")
    assert [r["skipped_steps"] for r in recs] == [0, 0, 1, 1, 1, 1]
    assert recs[2]["loss"] is None and recs[2]["grad_norm"] is None and recs[3]["loss"] > 0
    ckpts = tmp_path / "skip" / "checkpoints"
    s2, s3, s4 = (checkpoint_tensors(ckpts / f"step_{k:08d}") for k in (2, 3, 4))
    assert s2.keys() == s3.keys() and any(k.startswith(".optim.state") for k in s2)
    assert all(torch.equal(s2[k], s3[k]) for k in s2)  # weights and AdamW moments and step counts untouched
    assert not all(torch.equal(s3[k], s4[k]) for k in s3)  # step 4 updates again


def test_too_many_skips_in_a_row_stop_the_run(data_dir, tmp_path, monkeypatch):
    from fast.head import FusedHeadLoss
    monkeypatch.setattr(FusedHeadLoss, "__call__", FusedHeadLoss.__call__)
    poison({2, 4, 5, 6})
    argv = args_for(data_dir, tmp_path, "diverged", "train.on_nonfinite=skip", "train.max_consecutive_skips=2",
                    "train.ckpt_every=1", "train.eval_every=100")
    with pytest.raises(NonFiniteError, match=r"at step 6 .*3 in a row \(train.max_consecutive_skips=2\)"):
        train.main(argv)
    assert latest_checkpoint(tmp_path / "diverged" / "checkpoints").name.endswith("5")  # skipped steps checkpoint
    assert records(tmp_path / "diverged", "train")[-1]["skipped_steps"] == 3  # steps 2, 4 and 5


def test_batch_shape_must_divide(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="train.global_batch"):
        train.main(args_for(data_dir, tmp_path, "bad", "train.micro_batch=3"))


def test_a_device_or_launch_that_does_not_fit_the_machine_is_one_message(data_dir, tmp_path, monkeypatch, capsys):
    """train.device=cuda without CUDA is a ConfigError (it was a RuntimeError's traceback); more torchrun processes per
    node than GPUs is a LaunchError that every rank reports; --stop-at-step below 1 is refused (it trained to the end).
    Nothing is written in any case."""
    from runtime.dist import LaunchError, init_distributed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="train.device: cuda, but CUDA is not available"):
        train.main(args_for(data_dir, tmp_path, "cuda", "train.device=cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(LaunchError, match="LOCAL_RANK=3 but the machine has 1 visible CUDA device"):
        init_distributed("auto")
    assert LaunchError in train._user_errors()
    for k in ("0", "-1"):
        with pytest.raises(SystemExit):
            train.main(["--stop-at-step", k, *args_for(data_dir, tmp_path, "stop")])
        assert "--stop-at-step" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_print_config_and_dry_run(data_dir, tmp_path, capsys):
    train.main(["--print-config", *args_for(data_dir, tmp_path, "p")])
    assert "placement: dnp" in capsys.readouterr().out
    train.main(["--dry-run", *args_for(data_dir, tmp_path, "p")])
    out = capsys.readouterr().out
    assert "scale-vector params" in out and not (tmp_path / "p").exists()
    # no data needed: a paper config whose data was never prepared
    train.main(["--dry-run", "--config", "configs/dense/0.12b.yaml"])
    assert "119,744,256" in capsys.readouterr().out


def test_sample_and_plot_read_a_run(data_dir, tmp_path, capsys):
    from scripts import plot, sample
    train.main(args_for(data_dir, tmp_path, "s"))
    capsys.readouterr()
    argv = ["--run", str(tmp_path / "s"), "--prompt", "KING", "--max-new-tokens", "12", "--seed", "1"]
    assert sample.main(argv) == 0
    first = capsys.readouterr().out
    assert first.startswith("KING") and len(first) > len("KING\n")
    sample.main(argv)
    assert capsys.readouterr().out == first  # seeded
    assert plot.main([str(tmp_path / "s"), "--out", str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").stat().st_size > 1000


def test_unified_iwd_decays_input_vectors_only():
    """The real unified model under iwd: Input-Norm vectors (β under OR) decay, Output-Norm vectors don't."""
    from optim import decays
    from model.llama import Llama
    from model.config import Role
    cfg = load_config(["configs/base.yaml", "configs/scale/unified_literal.yaml"],
                      ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=64"])
    with torch.device("meta"):
        roles = Llama(cfg.model).param_roles()
    mode, alpha = cfg.optim.scale_weight_decay, cfg.optim.scale_wd_alpha
    assert mode == "iwd"
    for name, role in roles.items():
        d = decays(name, role, mode, alpha)
        if role == Role.SCALE_OUTPUT:
            assert not d, name
        elif role == Role.SCALE_INPUT:
            assert d == name.endswith(".beta"), name
        else:
            assert d, name
    assert decays("layers.0.attn.q_proj.in_scale.alpha", Role.SCALE_INPUT, mode, include_alpha=True)


def test_export_hf_from_a_trained_checkpoint(data_dir, tmp_path):
    """The CLI path: train HG + DP + OR, export the checkpoint, and transformers reproduces our logits."""
    import transformers
    from scripts import export_hf
    argv = args_for(data_dir, tmp_path, "exp", "--config", "configs/scale/hg_dp_or.yaml",
                    "optim.scale_weight_decay=all")
    train.main(argv)
    run = tmp_path / "exp"
    assert export_hf.main(["--config", str(run / "config.yaml"), "--checkpoint", str(run),
                           "--out", str(tmp_path / "hf")]) == 0
    ours = build_model(load_config(run / "config.yaml").model)
    load_model_weights(ours, run)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    tokens = torch.randint(0, 320, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(tokens), hf(tokens).logits
    # both float32, the same math in other kernels: ≤ K·ε per reduction, K ≤ 320 (vocab; d 32, d_ffn 64, 32 tokens),
    # 8 chained (tests/test_ffn_padding.py's tolerance): 8·K·ε ≈ 3e-4 normwise; a mis-folded vector is O(1e-1)
    assert ((a - b).norm() / a.norm()).item() <= 8 * 320 * torch.finfo(torch.float32).eps


def test_epochs_are_logged_and_a_repeat_warns(tmp_path, shakespeare_text, capsys):
    """A corpus smaller than the run: a warning up front, another at the step that starts epoch 2, and `epoch` in
    every train record."""
    docs = tmp_path / "docs"
    docs.mkdir()
    text = shakespeare_text
    for i in range(3):
        (docs / f"doc{i}.txt").write_text(text[i * 1500:(i + 1) * 1500])
    small = DataConfig(source=str(docs), dir=str(tmp_path / "small"), tokenizer="bpe:320", seq_len=32,
                       val_frac=0.34)
    prepare(small)
    argv = args_for(small, tmp_path, "repeat", "train.eval_every=100", "data.val_frac=0.34", "train.steps=10")
    capsys.readouterr()
    train.main(argv)
    err = capsys.readouterr().err
    epochs = [r["epoch"] for r in records(tmp_path / "repeat", "train")]
    assert epochs == sorted(epochs) and epochs[0] > 0 and epochs[-1] > 1
    first_repeat = next(i for i, e in enumerate(epochs) if e > 1) + 1  # the step that read past epoch 1
    assert "times; prepare more" in err and f"step {first_repeat} started epoch 2" in err

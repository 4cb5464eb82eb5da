"""The harness the train.py tests share: a tiny prepared corpus, the argv of a tiny run, its records and checkpoints,
spawned ranks, and the rounding bounds the float64 comparisons take from the arithmetic. test_train.py and the other
end-to-end test modules import it (through test_train, which re-exports it)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import train
from config import load_config, resolve_vocab
from data.config import DataConfig
from data.prepare import prepare
from model.llama import build_model
from runtime.checkpoint import latest_checkpoint, load_model_weights
from multiproc import Rendezvous, spawn


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, shakespeare_text) -> DataConfig:
    """A tiny prepared corpus: 24 documents cut from Shakespeare, a 320-token trained BPE."""
    root = tmp_path_factory.mktemp("train_data")
    text = shakespeare_text[:240_000]
    docs = root / "docs"
    docs.mkdir()
    for i in range(24):
        (docs / f"doc{i:02d}.txt").write_text(text[i * 10_000:(i + 1) * 10_000])
    cfg = DataConfig(source=str(docs), dir=str(root / "prepared"), tokenizer="bpe:320", seq_len=32, val_frac=0.2)
    prepare(cfg)
    return cfg


def args_for(data: DataConfig, out_dir: Path, name: str, *extra: str) -> list[str]:
    return [
        "--config", "configs/base.yaml", "--config", "configs/scale/unified.yaml",
        "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.d_ffn=64",
        f"data.dir={data.dir}", f"data.source={data.source}", "data.tokenizer=bpe:320", "data.seq_len=32",
        "data.val_frac=0.2",
        "train.steps=6", "train.global_batch=8", "train.micro_batch=4", "train.eval_every=3",
        "train.eval_tokens=512", "train.ckpt_every=100", "schedule.warmup_steps=2", "optim.lr=3e-3",
        "log.every=1", "log.wandb.mode=disabled", f"log.out_dir={out_dir}", f"log.run_name={name}",
        "train.device=cpu", "train.dtype=float32", *extra,
    ]


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def run_dtype(cfg) -> torch.dtype:
    """The dtype a run keeps its parameters in: float64 for float64 runs, else float32 (bf16 keeps fp32 masters)."""
    return torch.float64 if cfg.train.dtype == "float64" else torch.float32


def final_params(run_dir: Path, argv: list[str]) -> dict[str, torch.Tensor]:
    """The newest checkpoint's parameters, in the run's own dtype (a float64 run's are not rounded to float32)."""
    cfg = load_config([a for a, b in zip(argv[1::2], argv[::2]) if b == "--config"],
                      [a for a in argv if "=" in a])
    meta = json.loads((Path(cfg.data.dir) / "meta.json").read_text())
    model = build_model(resolve_vocab(cfg, n_vocab=meta["n_vocab"]), dtype=run_dtype(cfg))
    load_model_weights(model, latest_checkpoint(run_dir / "checkpoints"))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _worker(rank: int, world: int, rdzv: Rendezvous, runs: list[list[str]]) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    for i, argv in enumerate(runs):  # e.g. a stopped run, then the same command again
        # A fresh port per run: the first run's rendezvous store may outlive its process group for a moment,
        # and a second group meeting on the same port could read its stale keys and hang.
        os.environ["MASTER_PORT"] = str(rdzv.port(rank, i))
        train.main(argv)


def run_ranks(world: int, *runs: list[str]) -> None:
    spawn(_worker, (world, Rendezvous.new(), list(runs)), nprocs=world)


def _error_worker(rank: int, world: int, rdzv: Rendezvous, argv: list[str], out: Path) -> None:
    try:
        _worker(rank, world, rdzv, [argv])
    except Exception as e:  # noqa: BLE001 - recorded for the test to inspect
        (out / f"rank{rank}.txt").write_text(f"{type(e).__name__}: {e}")


# Rounding (unit roundoff u = 2⁻ᵖ) and the bounds the float64 reference comparisons below take from it.
U32, U64 = 2.0**-24, 2.0**-53


# train.py sums each step's loss in float32 for a float32 run (its `sums`): each rounding or addition errs by
# ≤ u₃₂·loss (the loss is positive), and comparing two runs adds both sides' errors. (A float64 run sums in float64.)
def logged_loss_tol(loss: float, additions: int) -> float:
    """Two logged float32 losses of runs whose exact losses agree: (1 + `additions`) roundings per side, doubled."""
    return 2 * (1 + additions) * U32 * abs(loss)


# In float64, two runs that differ only in reduction order (ranks, micro-batches) differ per gradient entry by
# ≲ K·u₆₄·Σ|terms| with K ≤ 1024 (tokens per step 256, channels ≤ 64, d²) and Σ|terms| ≲ 1 here; AdamW's update
# lr·m̂/(√v̂ + ε) has slope ≤ lr/ε in g, so S steps move the weights apart by ≲ S·(lr/ε)·K·u₆₄ (to first order; Muon's
# normalized update is no steeper than that). For S = 10, lr = 3e-3, ε = 1e-8: 3.4e-7, four orders below one
# lr-sized step (a skipped micro-batch, a gradient scaled by the world size: AdamW's ε and the clip see it).
def drift_tol(steps: int, terms: int = 1024, lr: float = 3e-3, eps: float = 1e-8) -> float:
    return steps * (lr / eps) * terms * U64

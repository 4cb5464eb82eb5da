"""2-rank FSDP2 (gloo, CPU) checkpoint round trip: save → load into fresh shards → bit-identical continuation,
and a single process loading that 2-rank checkpoint into a plain module (DCP reshards)."""
from __future__ import annotations

import gc
import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.checkpoint import latest_checkpoint, load_checkpoint, load_model_weights, save_checkpoint
from multiproc import Rendezvous, spawn

VOCAB, D, WORLD = 37, 16, 2  # odd vocab: the embedding / head rows shard unevenly (19 + 18)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.fc1 = nn.Linear(D, 4 * D)
        self.fc2 = nn.Linear(4 * D, D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.drop = nn.Dropout(0.2)  # consumes the torch RNG: proves the RNG state is restored too

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        h = h + self.fc2(self.drop(F.gelu(self.fc1(h))))
        return self.head(h)


def _build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = Toy()
    for layer in (model.embed, model.fc1, model.fc2, model.head):
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> float:
    g = torch.Generator().manual_seed(1000 * step + rank)  # data depends on (step, rank) only, like the loader
    idx = torch.randint(0, VOCAB, (4, 9), generator=g)
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def _full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # Collective; rank 0 gets the gathered tensors, the others an empty dict.
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _worker(rank: int, rdzv: Rendezvous, run_dir: str) -> None:
    torch.set_num_threads(1)  # 2 ranks on 2 cores; also avoids hangs in forked/spawned workers
    # FSDP2 flags every module output that is a view (Linear on 3-D input); this model does no in-place ops.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rdzv.port(rank)))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        ckpt_dir = Path(run_dir) / "checkpoints"
        model, opt = _build(seed=0)
        for step in range(3):
            _train_step(model, opt, step, rank)
        saved = save_checkpoint(ckpt_dir, 3, model, opt, {"step": 3, "tokens": 3 * 4 * 8 * WORLD}, keep=1)
        ref_losses = [_train_step(model, opt, step, rank) for step in range(3, 6)]
        ref_full = _full_params(model)

        torch.manual_seed(1234)  # scramble the RNG: only the restore can bring back the dropout stream
        model2, opt2 = _build(seed=1)
        extra = load_checkpoint(saved, model2, opt2)
        assert extra == {"step": 3, "tokens": 192}
        losses = [_train_step(model2, opt2, step, rank) for step in range(3, 6)]
        assert losses == ref_losses, (losses, ref_losses)  # bit-identical, not approximately equal
        full = _full_params(model2)
        for name, t in ref_full.items():
            assert torch.equal(t, full[name]), name
        for p, q in zip(model.parameters(), model2.parameters()):  # the local shards as well
            assert torch.equal(p.to_local(), q.to_local())

        final = save_checkpoint(ckpt_dir, 6, model2, opt2, {"step": 6}, keep=1)
        assert latest_checkpoint(ckpt_dir) == final and not saved.exists()  # keep=1 pruned step 3
        if rank == 0:
            torch.save(full, Path(run_dir) / "full_step6.pt")
    finally:
        gc.collect()  # measured: without these two, an FSDP2 rank sometimes aborts at interpreter exit
        dist.barrier()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert dist.is_available(), "this torch build lacks torch.distributed, which training needs"
    run_dir = tmp_path_factory.mktemp("fsdp_run")
    spawn(_worker, (Rendezvous.new(), str(run_dir)), nprocs=WORLD)
    return run_dir


def test_fsdp2_resume_is_bit_identical(two_rank_run: Path) -> None:
    # The assertions ran inside the ranks (a failure there fails the spawn); this checks what they left.
    ckpt = latest_checkpoint(two_rank_run / "checkpoints")
    assert ckpt is not None and ckpt.name == "step_00000006"
    assert sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]


def test_single_process_loads_two_rank_checkpoint(two_rank_run: Path) -> None:
    full = torch.load(two_rank_run / "full_step6.pt", weights_only=True)
    model = Toy()
    extra = load_model_weights(model, two_rank_run)  # a run dir: its latest checkpoint
    assert extra["step"] == 6
    ours = model.state_dict()
    assert ours.keys() == full.keys()
    for name, t in full.items():
        assert torch.equal(ours[name], t), name


def test_world_size_change_reshards_optimizer_and_warns_about_rng(two_rank_run: Path) -> None:
    model = Toy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_checkpoint(two_rank_run / "checkpoints", model, opt)
    assert any("saved by 2 ranks" in str(w.message) and "RNG" in str(w.message) for w in caught)
    state = opt.state_dict()["state"]
    assert len(state) == len(list(model.parameters()))
    assert all(float(s["step"]) == 6 for s in state.values())
    emb = state[0]["exp_avg"]  # the unevenly sharded embedding's moment came back whole
    assert emb.shape == (VOCAB, D) and emb.abs().sum() > 0

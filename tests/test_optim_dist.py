"""2-rank FSDP2 (gloo, CPU) against one process: Muon on row-split matrices, AdamW/Muon training parity with
gradient clipping, and a DCP save → load → resume of the hybrid optimizer.

Each test spawns 2 workers with torch.multiprocessing.spawn (DESIGN.md traps: one thread per worker, and
gc.collect() + barrier before destroy_process_group). Every worker also computes the one-process reference
itself, on plain (unsharded) tensors, so the comparison happens inside the worker.
"""
from __future__ import annotations

import datetime
import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from config import MuonConfig, OptimConfig, ScheduleConfig
from model.config import Role
from optim import build_optimizer, clip_grad_norm, lr_at, set_lr
from optim.muon import Muon, zeropower_via_newtonschulz
from multiproc import free_port, spawn

WORLD = 2


def _entry(rank: int, port: int, fn, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        fn(rank, *args)
    except BaseException:
        dist.destroy_process_group()  # no barrier: the other rank may be stuck elsewhere; spawn reports this one
        raise
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def _spawn(fn, *args) -> None:
    spawn(_entry, (free_port(), fn, args), nprocs=WORLD)


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


# --------------------------------------------------------------------------------- Muon on split matrices


SHAPES = [(7, 10), (6, 10), (3, 5), (3, 5, 4)]  # odd rows (4 | 3), even rows wide, tall-ish, stacked experts


def _muon_split_worker(rank: int) -> None:
    mesh = init_device_mesh("cpu", (WORLD,))
    gen = torch.Generator().manual_seed(0)
    w0 = [torch.randn(*s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(*s, generator=gen) for s in SHAPES] for _ in range(4)]
    ref = [nn.Parameter(w.clone()) for w in w0]
    sharded = [nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(0)])) for w in w0]
    kw = dict(lr=0.05, weight_decay=0.1, momentum=0.95, nesterov=True, update_scale="moonlight")
    opt_ref, opt = Muon(ref, **kw), Muon(sharded, **kw)
    for step_grads in grads:
        for p, q, g in zip(ref, sharded, step_grads):
            p.grad = g.clone()
            q.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
        opt_ref.step()
        opt.step()
    for p, q, shape in zip(ref, sharded, SHAPES):
        assert q.to_local().shape[0] == torch.empty(shape).chunk(WORLD)[rank].shape[0]  # 7 rows: 4 | 3
        got, want = q.full_tensor(), p.detach()
        # Same gathered bits → same Newton–Schulz → in practice bit-identical; bf16 would allow ~1e-2 relative.
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, msg=f"shape {shape}")
    # Negative control: orthogonalizing the local row shard instead is measurably wrong, so the test can fail.
    g = grads[0][0]
    local = zeropower_via_newtonschulz(g.chunk(WORLD)[rank]).float()
    whole = zeropower_via_newtonschulz(g).float().chunk(WORLD)[rank]
    assert (local - whole).abs().max() > 0.05


def test_muon_on_row_split_matrices_matches_one_device():
    _spawn(_muon_split_worker)


# ------------------------------------------------------------------------------- training parity (toy model)

VOCAB, D, FFN, BATCH, SEQ = 11, 8, 7, 4, 6  # odd sizes so FSDP2's row shards are uneven


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class ORScale(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.ones(1))

    def forward(self) -> torch.Tensor:
        return self.beta * _rms(self.alpha)


class ToyLM(nn.Module):
    """embed → Norm·γ_in(OR) → up (7×8) → SiLU·γ_out → down (8×7) → residual → Norm·γ_f → lm_head."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, D)
        self.in_scale = ORScale(D)
        self.up = nn.Linear(D, FFN, bias=False)
        self.out_scale = nn.Parameter(1 + 0.1 * torch.randn(FFN))
        self.down = nn.Linear(FFN, D, bias=False)
        self.final_scale = nn.Parameter(torch.ones(D))
        self.lm_head = nn.Linear(D, VOCAB, bias=False)

    ROLES = {"embed.weight": Role.EMBED, "in_scale.alpha": Role.SCALE_INPUT, "in_scale.beta": Role.SCALE_INPUT,
             "up.weight": Role.MATRIX, "out_scale": Role.SCALE_OUTPUT, "down.weight": Role.MATRIX,
             "final_scale": Role.SCALE_INPUT, "lm_head.weight": Role.LM_HEAD}

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        h = self.up(_rms(x) * self.in_scale())
        x = x + self.down(F.silu(h) * self.out_scale)
        return self.lm_head(_rms(x) * self.final_scale)


def _batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (steps, BATCH, SEQ + 1), generator=gen)
    return [(d[:, :-1], d[:, 1:]) for d in data]


def _train(model, opt, batches, rows: slice, start: int, total: int, peak: float, clip: float):
    """Steps on rows `rows` of each batch; returns [(global mean loss, pre-clip grad norm)] per step."""
    sched = ScheduleConfig(name="cosine", warmup_steps=2, min_lr_ratio=0.1)
    out = []
    for i, (x, y) in enumerate(batches):
        set_lr(opt, lr_at(start + i, total, peak, sched))
        logits = model(x[rows])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y[rows].reshape(-1))
        loss.backward()
        norm = clip_grad_norm(list(model.parameters()), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach()
        if dist.is_initialized() and rows != slice(None):
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # equal rows per rank: the mean of means = global mean
        out.append((loss.item(), float(norm)))
    return out


def _sharded(seed: int, mesh) -> ToyLM:
    model = ToyLM(seed)
    fully_shard(model, mesh=mesh)
    return model


def _parity_worker(rank: int, name: str) -> None:
    mesh = init_device_mesh("cpu", (WORLD,))
    # float32 Newton–Schulz: with bf16, the 1-process and 2-rank runs differ by bf16 roundings of Muon's update
    # (≈ 7e-5 on up.weight after 10 steps on some CPUs), which would mask a real sharding bug at this tolerance.
    cfg = OptimConfig(name=name, lr=1e-2, weight_decay=0.1, scale_weight_decay="iwd", grad_clip=0.5,
                      muon=MuonConfig(ns_dtype="float32"))
    batches, steps, rows = _batches(10), 10, slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)

    ref = ToyLM(0)
    ref_hist = _train(ref, build_optimizer(ref, ToyLM.ROLES, cfg), batches, slice(None), 0, steps, cfg.lr, 0.5)
    model = _sharded(0, mesh)
    opt = build_optimizer(model, ToyLM.ROLES, cfg)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    hist = _train(model, opt, batches, rows, 0, steps, cfg.lr, 0.5)

    for i, ((l_ref, n_ref), (l, n)) in enumerate(zip(ref_hist, hist)):
        assert abs(l - l_ref) < 1e-5, f"{name} step {i}: loss {l} vs one process {l_ref}"
        assert abs(n - n_ref) < 1e-5 * max(1.0, n_ref), f"{name} step {i}: grad norm {n} vs {n_ref}"
    assert any(n > 0.5 for _, n in ref_hist), "clipping was never active; the test would not cover it"
    for (pn, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(_full(q.detach()), p.detach(), rtol=1e-4, atol=1e-5, msg=pn)


def _parity_both_worker(rank: int) -> None:
    for name in ("adamw", "muon"):  # one spawn for both: a spawn costs ~2 s of imports on 2 cores
        _parity_worker(rank, name)


def test_fsdp2_two_ranks_match_one_process_adamw_and_muon():
    _spawn(_parity_both_worker)


# ------------------------------------------------------------------------------------- DCP save → resume


def _dcp_worker(rank: int, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    mesh = init_device_mesh("cpu", (WORLD,))
    cfg = OptimConfig(name="muon", lr=1e-2, scale_weight_decay="iwd")
    batches, total, rows = _batches(6), 6, slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)

    model = _sharded(0, mesh)
    opt = build_optimizer(model, ToyLM.ROLES, cfg)
    _train(model, opt, batches[:3], rows, 0, total, cfg.lr, 1.0)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    uninterrupted = _train(model, opt, batches[3:], rows, 3, total, cfg.lr, 1.0)

    fresh = _sharded(1, mesh)  # different init, empty optimizer state: DCP creates it with a zero-lr step
    fresh_opt = build_optimizer(fresh, ToyLM.ROLES, cfg)
    msd, osd = get_state_dict(fresh, fresh_opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert [g["name"] for g in fresh_opt.param_groups] == ["muon", "adamw/decay", "adamw/no_decay"]
    muon_p = fresh_opt.param_groups[0]["params"][0]
    assert isinstance(fresh_opt.state[muon_p]["momentum_buffer"], DTensor)
    assert all(float(fresh_opt.state[p]["step"]) == 3 for g in fresh_opt.param_groups[1:] for p in g["params"])
    resumed = _train(fresh, fresh_opt, batches[3:], rows, 3, total, cfg.lr, 1.0)

    assert resumed == uninterrupted, f"resumed {resumed} vs uninterrupted {uninterrupted}"
    for (n, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p.full_tensor(), q.full_tensor()), n


def test_dcp_round_trip_resumes_identically(tmp_path):
    _spawn(_dcp_worker, str(tmp_path / "ckpt"))

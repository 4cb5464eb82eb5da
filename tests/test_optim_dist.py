"""2-rank FSDP2 (gloo, CPU) against one process: Muon on row-split matrices, distributed Muon against the every-rank
path (parity and the split of the Newton–Schulz work), AdamW/Muon training parity with gradient clipping, and a DCP
save → load → resume of the hybrid optimizer.

Each test's worker runs on 2 ranks of torch.multiprocessing.spawn, all four in one launch (the `two_ranks` fixture;
docs/design.md traps: one thread per worker, and gc.collect() + barrier before destroy_process_group). Every worker also
computes the one-process reference itself, on plain (unsharded) tensors, so the comparison happens inside the
worker; each test then reads how its worker ended.
"""
from __future__ import annotations

import datetime
import gc
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from optim.config import MuonConfig, OptimConfig, ScheduleConfig
from model.config import Role
from optim import build_optimizer, clip_grad_norm, lr_at, set_lr
from optim.muon import Muon, NSSpec, zeropower_via_newtonschulz
from optim.muon_dist import assign_owners, ns_cost, plan_buckets
from multiproc import Rendezvous, spawn

WORLD = 2


def _entry(rank: int, rdzv: Rendezvous, fn, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{rdzv.port(rank)}", rank=rank, world_size=WORLD,
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
    spawn(_entry, (Rendezvous.new(), fn, args), nprocs=WORLD)


def _in_turn(rank: int, out: str, jobs: list[tuple]) -> None:
    """Each test's worker in turn on one process group; `<out>/<name>.rank<r>` says how each ended on each rank (a
    file `ok`, or the traceback). The first failure ends the launch (the other rank may wait in a collective)."""
    for name, fn, args in jobs:
        try:
            fn(rank, *args)
        except BaseException:
            Path(out, f"{name}.rank{rank}").write_text(traceback.format_exc())
            raise
        Path(out, f"{name}.rank{rank}").write_text("ok")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The four tests' 2-rank workers in one launch instead of four (a launch costs two interpreters' imports of
    torch, seconds on 2 cores): they run one after another on the same 2-rank gloo group, each on its own tensors and
    optimizers, and each test reads how its own worker ended (_outcome). The folder of the outcomes."""
    out = tmp_path_factory.mktemp("two_ranks")
    jobs = [("muon_split", _muon_split_worker, ()), ("distributed_muon", _distributed_muon_worker, ()),
            ("parity", _parity_both_worker, ()), ("dcp", _dcp_worker, (str(out / "ckpt"),))]
    try:
        _spawn(_in_turn, str(out), jobs)
    except Exception as e:  # noqa: BLE001 - each test reports its own worker's outcome below
        (out / "launch.txt").write_text(f"{type(e).__name__}: {e}")
    return out


def _outcome(out: Path, name: str) -> None:
    """Fail with the worker's traceback if it failed on a rank, or with the launch's error if it never finished."""
    ends = {r: (out / f"{name}.rank{r}").read_text() if (out / f"{name}.rank{r}").exists() else None
            for r in range(WORLD)}
    failed = [f"rank {r}:\n{text}" for r, text in ends.items() if text not in (None, "ok")]
    if failed:
        pytest.fail("\n".join(failed))
    if any(text is None for text in ends.values()):
        launch = (out / "launch.txt").read_text() if (out / "launch.txt").exists() else "?"
        pytest.fail(f"{name} did not run to its end on every rank: an earlier worker ended the launch ({launch})")


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
        # Bit-identical on any CPU: the gathered update is the whole matrix's bits, so Newton–Schulz makes the same
        # kernel calls on the same input, and momentum, decay and the step are elementwise on either layout.
        assert torch.equal(got, want), f"shape {shape}: max diff {(got - want).abs().max()}"
    # Negative control: orthogonalizing the local row shard instead is measurably wrong, so the test can fail.
    g = grads[0][0]
    local = zeropower_via_newtonschulz(g.chunk(WORLD)[rank]).float()
    whole = zeropower_via_newtonschulz(g).float().chunk(WORLD)[rank]
    assert (local - whole).abs().max() > 0.05


def test_muon_on_row_split_matrices_matches_one_device(two_ranks):
    _outcome(two_ranks, "muon_split")


# ------------------------------------------------------------------- distributed Muon vs the every-rank path

# (global shape, split dim): odd rows (4 | 3), even rows, tall (NS on the transpose), one row (rank 1 holds none),
# split columns (5 | 4), stacked experts split by expert (2 | 1: orthogonalized locally), experts split by row.
DIST_CASES = [((7, 10), 0), ((6, 10), 0), ((10, 6), 0), ((1, 8), 0), ((6, 9), 1), ((3, 5, 4), 0), ((2, 7, 5), 1)]
MUON_LR, MUON_STEPS = 0.05, 4


def _two_muons(mesh, ns_dtype: str, bucket_elements: int = 1 << 27
               ) -> tuple[list[nn.Parameter], list[nn.Parameter], Muon, Muon]:
    """The same DTensor parameters and gradients, MUON_STEPS steps of distributed Muon and of the every-rank path."""
    gen = torch.Generator().manual_seed(0)
    w0 = [torch.randn(*shape, generator=gen) for shape, _ in DIST_CASES]
    lead = [Replicate()] * (mesh.ndim - 1)  # HSDP: replicated across the leading mesh dims, split along the last
    params = {flag: [nn.Parameter(distribute_tensor(w.clone(), mesh, lead + [Shard(d)], src_data_rank=None))
                     for w, (_, d) in zip(w0, DIST_CASES)] for flag in (True, False)}
    opts = {flag: Muon(params[flag], lr=MUON_LR, weight_decay=0.1, ns_dtype=ns_dtype, distributed=flag)
            for flag in (True, False)}
    opts[True].bucket_elements = bucket_elements
    for _ in range(MUON_STEPS):
        grads = [torch.randn(*shape, generator=gen) for shape, _ in DIST_CASES]
        for flag in (True, False):
            for p, g, (_, d) in zip(params[flag], grads, DIST_CASES):
                p.grad = distribute_tensor(g.clone(), mesh, lead + [Shard(d)], src_data_rank=None)
            opts[flag].step()
    return params[True], params[False], opts[True], opts[False]


def _check_work_split(rank: int, fast_log: list[tuple[int, ...]], ref_log: list[tuple[int, ...]]) -> None:
    """Each rank ran Newton–Schulz on exactly the matrices assign_owners gave it, plus its own experts."""
    logs = [None] * WORLD
    dist.all_gather_object(logs, (fast_log, ref_log))
    exchanged = [shape for shape, d in DIST_CASES if d >= len(shape) - 2]  # shapes are distinct: they name matrices
    owners = assign_owners([ns_cost(s) for s in exchanged], WORLD)
    assert set(owners) == set(range(WORLD)), owners
    for r, (fast, ref) in enumerate(logs):
        assert ref == [shape for shape, _ in DIST_CASES], "the every-rank path orthogonalizes everything everywhere"
        own_experts = ((2, 1)[r], 5, 4)  # (3, 5, 4) on Shard(0): experts 2 | 1
        want = sorted([s for s, o in zip(exchanged, owners) if o == r] + [own_experts])
        assert sorted(fast) == want, f"rank {r} orthogonalized {fast}, expected {want}"


def _distributed_muon_worker(rank: int) -> None:
    mesh = init_device_mesh("cpu", (WORLD,))
    for ns_dtype in ("float32", "bfloat16"):
        fast, ref, opt, opt_ref = _two_muons(mesh, ns_dtype)
        for p, q, (shape, _) in zip(fast, ref, DIST_CASES):
            got, want = p.detach().full_tensor(), q.detach().full_tensor()
            if ns_dtype == "float32":
                # Bit-identical: the owner concatenates the bits full_tensor() gathers and makes the same NS call;
                # expert stacks split by expert run the same per-matrix batched kernels (on CPU; optim/muon_dist.py).
                assert torch.equal(got, want), f"{shape}: max diff {(got - want).abs().max()}"
                assert torch.equal(opt.state[p]["momentum_buffer"].full_tensor(),
                                   opt_ref.state[q]["momentum_buffer"].full_tensor())
            else:
                # Identical on CPU as well; the bound allows what a GPU's batched GEMM may round apart for a smaller
                # expert batch: one bf16 ulp (2⁻⁸ relative, |O| ≤ 2) of each step's lr·0.2·√max(m, n)·O.
                tol = MUON_STEPS * MUON_LR * 0.2 * max(shape[-2:]) ** 0.5 * 2 * 2**-8
                torch.testing.assert_close(got, want, rtol=0, atol=tol, msg=f"{shape}")
        _check_work_split(rank, opt.ns_shapes, opt_ref.ns_shapes)
    grads, specs = [p.grad for p in fast], [NSSpec((1.0, 0.0, 0.0), 1, 1e-7, torch.float32)] * len(fast)
    assert plan_buckets(grads, specs, [True] * len(fast)) == [([0, 1, 2, 3, 4, 6], 0), ([5], None)]
    assert plan_buckets(grads, specs, [False] * len(fast)) == [([i], None) for i in range(len(fast))]
    small = plan_buckets(grads, specs, [True] * len(fast), cap=40)  # ≤ 80 elements per bucket: 70 | 60 | 60+8 | 54 | 70
    assert small == [([0], 0), ([1], 0), ([2, 3], 0), ([4], 0), ([5], None), ([6], 0)], small
    for layout, cap in ((mesh, 40), (init_device_mesh("cpu", (1, WORLD)), 1 << 27)):  # 5 buckets; HSDP layout
        fast, ref, _, _ = _two_muons(layout, "float32", cap)
        assert all(torch.equal(p.detach().full_tensor(), q.detach().full_tensor()) for p, q in zip(fast, ref))


def test_distributed_muon_matches_every_rank_path_and_splits_the_work(two_ranks):
    # One worker for parity (float32 bit-identical, bf16 within a bound) and the work split.
    _outcome(two_ranks, "distributed_muon")


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


def _sharded(seed: int, mesh, dtype: torch.dtype = torch.float32) -> ToyLM:
    model = ToyLM(seed).to(dtype)
    fully_shard(model, mesh=mesh)
    return model


# float64 training parity: the ranks and the one process sum the same products in other orders, ≤ K·u₆₄·Σ|terms| per
# gradient entry (u₆₄ = 2⁻⁵³) with K ≤ 512 (every reduction here: 24 tokens, 8 channels, the ~330 entries of the grad
# norm) and Σ|terms| ≲ 1; AdamW's slope in g is ≤ lr/ε (Muon's normalized update is no steeper), so 10 steps at
# lr = 1e-2, ε = 1e-8 drift by ≲ 10·(lr/ε)·K·u₆₄ ≈ 6e-7 (first order) — four orders below one lr-sized step.
PARITY_TOL = 10 * (1e-2 / 1e-8) * 512 * 2**-53


def _parity_worker(rank: int, name: str) -> None:
    mesh = init_device_mesh("cpu", (WORLD,))
    # Everything in float64, Newton–Schulz included (PARITY_TOL): in float32 (let alone bf16 Newton–Schulz) the
    # summation-order differences, amplified by AdamW/Muon over 10 steps, depend on the CPU's kernels.
    cfg = OptimConfig(name=name, lr=1e-2, weight_decay=0.1, scale_weight_decay="iwd", grad_clip=0.5)
    batches, steps, rows = _batches(10), 10, slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)

    def optimizer(m):
        opt = build_optimizer(m, ToyLM.ROLES, cfg)
        for g in opt.param_groups:
            if g["kind"] == "muon":
                g["ns_dtype"] = "float64"
        return opt

    ref = ToyLM(0).double()
    ref_hist = _train(ref, optimizer(ref), batches, slice(None), 0, steps, cfg.lr, 0.5)
    model = _sharded(0, mesh, torch.float64)
    opt = optimizer(model)
    assert all(isinstance(p, DTensor) and p.dtype == torch.float64 for p in model.parameters())
    hist = _train(model, opt, batches, rows, 0, steps, cfg.lr, 0.5)

    for i, ((l_ref, n_ref), (l, n)) in enumerate(zip(ref_hist, hist)):
        assert abs(l - l_ref) <= PARITY_TOL * l_ref, f"{name} step {i}: loss {l} vs one process {l_ref}"
        assert abs(n - n_ref) <= PARITY_TOL * max(1.0, n_ref), f"{name} step {i}: grad norm {n} vs {n_ref}"
    assert any(n > 0.5 for _, n in ref_hist), "clipping was never active; the test would not cover it"
    for (pn, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        err = (_full(q.detach()) - p.detach()).abs().max() / p.detach().abs().max().clamp_min(1)
        assert err <= PARITY_TOL, f"{pn}: {err}"


def _parity_both_worker(rank: int) -> None:
    for name in ("adamw", "muon"):  # one spawn for both: a spawn costs ~2 s of imports on 2 cores
        _parity_worker(rank, name)


def test_fsdp2_two_ranks_match_one_process_adamw_and_muon(two_ranks):
    _outcome(two_ranks, "parity")


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


def test_dcp_round_trip_resumes_identically(two_ranks):
    _outcome(two_ranks, "dcp")

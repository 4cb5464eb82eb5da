"""Our Muon (optim/muon.py) against torch.optim.Muon, on one device (the 2-rank FSDP2 case: test_optim_dist.py),
and the pure parts of distributed Muon (optim/muon_dist.py: owners, shard sizes, the plan)."""
import math

import pytest
import torch

from optim.config import MuonConfig, OptimConfig
from optim.muon import Muon, NSSpec, update_scale, zeropower_via_newtonschulz
from optim.muon_dist import assign_owners, ns_cost, plan_buckets, shard_sizes

# Our update_scale names → torch.optim.Muon's adjust_lr_fn (torch ≥ 2.9).
TORCH_ADJUST = {"moonlight": "match_rms_adamw", "jordan": "original"}


def _run_pair(shape, update_scale_kind, nesterov, momentum=0.95, wd=0.1, steps=6, lr=0.02, lr_schedule=False):
    torch.manual_seed(0)
    w0 = torch.randn(*shape)
    ours, ref = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    kw = dict(lr=lr, weight_decay=wd, momentum=momentum, nesterov=nesterov, ns_steps=5,
              ns_coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7)
    opt = Muon([ours], update_scale=update_scale_kind, **kw)
    opt_ref = torch.optim.Muon([ref], adjust_lr_fn=TORCH_ADJUST[update_scale_kind], **kw)
    for i in range(steps):
        g = torch.randn(*shape)
        ours.grad, ref.grad = g.clone(), g.clone()
        if lr_schedule:  # the trainer's way: write group["lr"] before each step
            for o in (opt, opt_ref):
                o.param_groups[0]["lr"] = lr * (i + 1) / steps
        opt.step()
        opt_ref.step()
    return ours.detach(), ref.detach(), opt, opt_ref


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (7, 7), (1, 5)])
@pytest.mark.parametrize("kind", ["moonlight", "jordan"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_matches_torch_muon(shape, kind, nesterov):
    ours, ref, opt, opt_ref = _run_pair(shape, kind, nesterov)
    # the same operations as torch's (optim/muon.py), so in practice bit-identical; the bound allows the lr scale (a
    # Python float on either side) a few u₃₂ of each update: rtol 1e-6 ≈ 16·u₃₂ (u = 2⁻²⁴); a wrong scale is ≥ 1e-2
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)
    buf = opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"]
    buf_ref = opt_ref.state[opt_ref.param_groups[0]["params"][0]]["momentum_buffer"]
    torch.testing.assert_close(buf, buf_ref, rtol=0, atol=0)  # same state layout: checkpoints interchange


def test_matches_torch_muon_with_changing_lr_and_other_momentum():
    ours, ref, _, _ = _run_pair((12, 8), "moonlight", True, momentum=0.9, wd=0.05, lr_schedule=True)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)


def test_update_scales():
    assert update_scale((6, 10), "moonlight") == pytest.approx(0.2 * math.sqrt(10))  # 0.2·√max(m, n)
    assert update_scale((10, 6), "jordan") == pytest.approx(math.sqrt(10 / 6))  # √max(1, m/n)
    assert update_scale((6, 10), "jordan") == 1.0
    with pytest.raises(ValueError):
        update_scale((6, 10), "adam")


def test_newton_schulz_roughly_orthogonalizes():
    torch.manual_seed(0)
    g = torch.randn(32, 48)
    s = torch.linalg.svdvals(zeropower_via_newtonschulz(g).float())
    assert s.min() > 0.5 and s.max() < 1.3  # the quintic's band around 1, not exactly 1
    assert zeropower_via_newtonschulz(g).dtype == torch.bfloat16


def test_stacked_experts_are_orthogonalized_per_matrix():
    torch.manual_seed(0)
    g = torch.randn(3, 10, 6)
    batched = zeropower_via_newtonschulz(g).float()
    for e in range(3):
        single = zeropower_via_newtonschulz(g[e]).float()
        # bf16 (u = 2⁻⁸): batched kernels round apart, a few of the 15 products' roundings of |O| ≤ 1: 2e-2 ≈ 5·u
        torch.testing.assert_close(batched[e], single, atol=2e-2, rtol=0)


def test_does_not_write_into_a_bf16_gradient():
    g = torch.randn(6, 10, dtype=torch.bfloat16)
    before = g.clone()
    zeropower_via_newtonschulz(g)
    assert torch.equal(g, before)


def test_rejects_vectors():
    with pytest.raises(ValueError, match="matrices"):
        Muon([torch.nn.Parameter(torch.ones(4))])


def test_zero_grad_step_only_decays():
    p = torch.nn.Parameter(torch.ones(4, 6))
    opt = Muon([p], lr=0.1, weight_decay=0.5)
    p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(p.detach(), torch.full((4, 6), 1 - 0.1 * 0.5))


# ------------------------------------------------------------------------------- distributed Muon, pure parts


def test_assign_owners_balances_newton_schulz_cost():
    d, f = 64, 172  # a Llama block: q, k, v, o (k/v with 4× fewer heads), gate, up, down
    shapes = [(d, d), (d // 4, d), (d // 4, d), (d, d), (f, d), (f, d), (d, f)] * 4
    costs = [ns_cost(s) for s in shapes]
    for world in (2, 3, 8):
        owners = assign_owners(costs, world)
        assert owners == assign_owners(costs, world)  # a pure function: every rank computes the same owners
        loads = [sum(c for c, o in zip(costs, owners) if o == r) for r in range(world)]
        assert max(loads) - min(loads) <= max(costs)  # LPT: no rank is more than one matrix ahead
        round_robin = [sum(costs[r::world]) for r in range(world)]
        assert max(loads) <= max(round_robin)
    assert ns_cost((3, 10, 6)) == 3 * 10 * 6 * 6  # per expert: m·n·min(m, n)


@pytest.mark.parametrize("length", [1, 2, 7, 8, 9, 64])
@pytest.mark.parametrize("world", [2, 3, 8])
def test_shard_sizes_follow_torch_chunk(length, world):
    chunks = [c.shape[0] for c in torch.empty(length).chunk(world)]  # DTensor's Shard(0) split
    assert shard_sizes(length, world) == chunks + [0] * (world - len(chunks))


def test_plain_tensors_take_the_reference_path():
    spec = NSSpec((3.4445, -4.7750, 2.0315), 5, 1e-7, torch.bfloat16)
    grads = [torch.zeros(4, 6), torch.zeros(2, 4, 6)]
    assert plan_buckets(grads, [spec] * 2, [True, True]) == [([0], None), ([1], None)]
    results = []
    for flag in (True, False):  # one process: the flag changes nothing, bit for bit
        torch.manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(*s)) for s in ((6, 10), (2, 5, 3))]
        opt = Muon(ps, lr=0.02, distributed=flag)
        for _ in range(3):
            for p in ps:
                p.grad = torch.randn_like(p)
            opt.step()
        assert opt.ns_shapes == [(6, 10), (2, 5, 3)]
        results.append([p.detach() for p in ps])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_distributed_flag_flows_from_config():
    from model.config import Role
    from optim import build_optimizer

    model = torch.nn.Linear(4, 6, bias=False)
    for flag in (True, False):
        opt = build_optimizer(model, {"weight": Role.MATRIX}, OptimConfig(name="muon",
                                                                           muon=MuonConfig(distributed=flag)))
        assert opt.param_groups[0]["kind"] == "muon" and opt.param_groups[0]["distributed"] is flag
    assert MuonConfig().distributed  # the fast path is the default

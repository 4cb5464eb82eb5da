"""Our Muon (optim/muon.py) against torch.optim.Muon, on one device (the 2-rank FSDP2 case: test_optim_dist.py)."""
import math

import pytest
import torch

from optim.muon import Muon, update_scale, zeropower_via_newtonschulz

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
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-7)  # in practice bit-identical
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
        torch.testing.assert_close(batched[e], single, atol=2e-2, rtol=0)  # bf16: batched kernels round apart


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

"""HybridOptimizer (optim/hybrid.py) on one process: equal to torch's own AdamW + Muon side by side, fused = foreach,
and state_dict round trips (the 2-rank FSDP2 + DCP round trip is in test_optim_dist.py)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optim.config import MuonConfig, OptimConfig
from model.config import Role
from optim import build_optimizer, param_groups, set_lr
from optim.hybrid import HybridOptimizer

VOCAB, D = 13, 8


class Tiny(nn.Module):
    ROLES = {"embed.weight": Role.EMBED, "norm": Role.SCALE_INPUT, "qk_norm": Role.SCALE_OUTPUT,
             "proj.weight": Role.MATRIX, "lm_head.weight": Role.LM_HEAD}

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, D)
        self.norm = nn.Parameter(1 + 0.1 * torch.randn(D))
        self.proj = nn.Linear(D, 2 * D, bias=False)
        self.qk_norm = nn.Parameter(torch.ones(2 * D))
        self.lm_head = nn.Linear(2 * D, VOCAB, bias=False)

    def forward(self, idx):
        return self.lm_head(torch.tanh(self.proj(self.embed(idx) * self.norm)) * self.qk_norm)


def _steps(model, opt, n, seed=0, lrs=None):
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for i in range(n):
        data = torch.randint(0, VOCAB, (4, 9), generator=gen)
        if lrs is not None:
            set_lr(opt, lrs[i])
        loss = F.cross_entropy(model(data[:, :-1]).reshape(-1, VOCAB), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_equals_torch_adamw_plus_torch_muon():
    cfg = OptimConfig(name="muon", lr=1e-2, scale_weight_decay="iwd", muon=MuonConfig(update_scale="moonlight"))
    ours, ref = Tiny(), Tiny()
    opt = build_optimizer(ours, Tiny.ROLES, cfg)
    ref_opts = []
    for g in param_groups(ref.named_parameters(), Tiny.ROLES, cfg):
        if g["kind"] == "muon":
            ref_opts.append(torch.optim.Muon(g["params"], lr=g["lr"], weight_decay=g["weight_decay"],
                                             momentum=g["momentum"], nesterov=g["nesterov"],
                                             adjust_lr_fn="match_rms_adamw"))
        else:
            ref_opts.append(torch.optim.AdamW(g["params"], lr=g["lr"], betas=g["betas"], eps=g["eps"],
                                              weight_decay=g["weight_decay"]))

    class Both:  # the two stock optimizers side by side, as torch's Muon docstring suggests
        param_groups = [g for o in ref_opts for g in o.param_groups]

        def step(self):
            for o in ref_opts:
                o.step()

        def zero_grad(self, set_to_none=True):
            for o in ref_opts:
                o.zero_grad(set_to_none=set_to_none)

    lrs = [1e-2 * f for f in (0.5, 1.0, 0.8, 0.4, 0.1)]
    assert _steps(ours, opt, 5, lrs=lrs) == _steps(ref, Both(), 5, lrs=lrs)
    for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n


# Fused and foreach AdamW evaluate lr·m̂/(√v̂ + ε) in other orders: a few u of each update, which the next steps'
# gradients carry and AdamW's slope (≤ lr/ε in g) amplifies. In float64 (u₆₄ = 2⁻⁵³) and with K ≤ 64 terms per
# reduction (32 tokens, 16 channels), n steps drift by ≲ n·(lr/ε)·K·u₆₄ (first order): 4 steps at lr = 1e-2 → 3e-8.
# In float32 that bound would be a whole lr-sized step (a near-zero gradient's sign); a wrong β₂, bias correction or
# decay is off by O(lr) = 1e-2 at once.
def _drift_tol(steps: int) -> float:
    return steps * (1e-2 / OptimConfig().eps) * 64 * 2**-53


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_fused_adamw_matches_foreach(name):
    a, b = Tiny().double(), Tiny().double()
    cfg = OptimConfig(name=name, lr=1e-2)
    opt_a = HybridOptimizer(param_groups(a.named_parameters(), Tiny.ROLES, cfg), fused=False)
    opt_b = HybridOptimizer(param_groups(b.named_parameters(), Tiny.ROLES, cfg), fused=True)  # CPU fused kernel
    assert any(g.get("fused") for g in opt_b.param_groups)
    for g in (*opt_a.param_groups, *opt_b.param_groups):
        if g["kind"] == "muon":
            g["ns_dtype"] = "float64"  # bf16 Newton–Schulz would round the two apart by bf16's ε
    la, lb = _steps(a, opt_a, 4), _steps(b, opt_b, 4)
    assert all(abs(x - y) <= _drift_tol(4) * x for x, y in zip(la, lb)), (la, lb)
    for p, q in zip(a.parameters(), b.parameters()):
        assert ((p - q).abs().max() / p.abs().max().clamp_min(1)).item() <= _drift_tol(4)


@pytest.mark.parametrize("fused_after", [False, True])
def test_state_dict_round_trip_resumes_identically(fused_after):
    cfg = OptimConfig(name="muon", lr=1e-2, scale_weight_decay="iwd")
    model = Tiny().double()  # float64: fused against foreach is then bounded by _drift_tol
    opt = build_optimizer(model, Tiny.ROLES, cfg)
    _steps(model, opt, 3)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())  # state_dict() hands out the live tensors
    cont = _steps(model, opt, 3, seed=1)

    fresh = Tiny(seed=5).to(next(model.parameters()).dtype)
    fresh.load_state_dict(saved_model)
    fresh_opt = HybridOptimizer(param_groups(fresh.named_parameters(), Tiny.ROLES, cfg), fused=fused_after)
    fresh_opt.load_state_dict(saved_opt)
    if fused_after:  # a CPU checkpoint resumed with fused AdamW: `step` moves next to its parameter
        assert all(fresh_opt.state[p]["step"].device == p.device for p in fresh_opt.param_groups[1]["params"])
        resumed = _steps(fresh, fresh_opt, 3, seed=1)
        assert all(abs(x - y) <= _drift_tol(3) * y for x, y in zip(resumed, cont)), (resumed, cont)
    else:
        assert _steps(fresh, fresh_opt, 3, seed=1) == cont


def test_load_keeps_live_hyperparameters():
    model = Tiny()
    opt = build_optimizer(model, Tiny.ROLES, OptimConfig(name="muon", weight_decay=0.1))
    _steps(model, opt, 1)
    sd = opt.state_dict()
    opt2 = build_optimizer(Tiny(), Tiny.ROLES, OptimConfig(name="muon", weight_decay=0.2, betas=(0.8, 0.9)))
    opt2.load_state_dict(sd)
    assert [g["weight_decay"] for g in opt2.param_groups] == [0.2, 0.2]  # the resolved config wins
    assert opt2.param_groups[1]["betas"] == (0.8, 0.9)
    assert len(opt2.state) == len(opt.state)


def test_load_rejects_a_checkpoint_with_other_groups():
    model = Tiny()
    opt = build_optimizer(model, Tiny.ROLES, OptimConfig(name="adamw", scale_weight_decay="iwd"))
    _steps(model, opt, 1)
    other = build_optimizer(Tiny(), Tiny.ROLES, OptimConfig(name="muon", scale_weight_decay="iwd"))
    with pytest.raises(ValueError, match="scale_weight_decay"):
        other.load_state_dict(opt.state_dict())


def test_groups_need_a_kind():
    with pytest.raises(ValueError, match="kind"):
        HybridOptimizer([{"params": [nn.Parameter(torch.ones(2))], "name": "x", "lr": 1e-3}])


def _snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    state = [{k: v.clone() for k, v in s.items() if torch.is_tensor(v)} for s in opt.state.values()]
    return params, state


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a[0], b[0])) and all(
        s.keys() == t.keys() and all(torch.equal(s[k], t[k]) for k in s) for s, t in zip(a[1], b[1]))


def test_found_inf_makes_the_step_a_no_op_and_zero_changes_nothing():
    """train.on_nonfinite's device-side skip: found_inf = 1 leaves weights, AdamW's moments and step counts and Muon's
    momentum bit for bit as they were, NaN gradients and all; found_inf = 0 is exactly the step without it (fused
    AdamW checks the flag only; Muon's keep = 1 path computes the same fp32 numbers, optim/muon.py)."""
    cfg = OptimConfig(name="muon", lr=1e-2, scale_weight_decay="iwd")
    flagged, plain = Tiny(), Tiny()
    opt_f = build_optimizer(flagged, Tiny.ROLES, cfg, fused=True)
    opt_p = build_optimizer(plain, Tiny.ROLES, cfg, fused=True)
    gen = torch.Generator().manual_seed(3)
    for step in range(4):
        data = torch.randint(0, VOCAB, (4, 9), generator=gen)
        for model in (flagged, plain):
            F.cross_entropy(model(data[:, :-1]).reshape(-1, VOCAB), data[:, 1:].reshape(-1)).backward()
        opt_f.step(found_inf=torch.zeros(()))
        opt_p.step()
        assert _same(_snapshot(flagged, opt_f), _snapshot(plain, opt_p)), step
        before = _snapshot(flagged, opt_f)
        for p in flagged.parameters():
            p.grad = torch.full_like(p, float("nan"))
        opt_f.step(found_inf=torch.ones(()))
        assert _same(_snapshot(flagged, opt_f), before), step
        for opt in (opt_f, opt_p):
            opt.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="fused"):
        build_optimizer(Tiny(), Tiny.ROLES, cfg, fused=False).step(found_inf=torch.zeros(()))

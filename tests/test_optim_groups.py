"""Weight-decay decisions (IWD, docs/paper.md §1.7) and param groups (docs/paper.md §3.2), proven with real optimizer steps:
with zero gradients an AdamW or Muon step changes a parameter only through decoupled decay, p ← p·(1 − lr·wd),
so a decayed parameter shrinks by exactly that factor and an undecayed one stays put.
"""
import itertools

import pytest
import torch
from torch import nn

from optim.config import MuonConfig, OptimConfig
from model.config import Role
from optim import build_optimizer, decays, param_groups, set_lr

LR, WD = 0.1, 0.5


class OR(nn.Module):
    """γ = β·Norm(α), as model/scaling.py's OR vector: α ∈ R^d, β of shape (1,)."""

    def __init__(self, d: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.ones(1))


class Toy(nn.Module):
    """One parameter of each role, plus an OR pair on each side."""

    def __init__(self, d: int = 4, vocab: int = 5):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.in_norm = nn.Module()
        self.in_norm.weight = nn.Parameter(torch.ones(d))
        self.q_norm = nn.Module()
        self.q_norm.weight = nn.Parameter(torch.ones(d))
        self.in_scale = OR(d)
        self.out_scale = OR(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    ROLES = {
        "embed.weight": Role.EMBED,
        "q_proj.weight": Role.MATRIX,
        "in_norm.weight": Role.SCALE_INPUT,
        "q_norm.weight": Role.SCALE_OUTPUT,
        "in_scale.alpha": Role.SCALE_INPUT,
        "in_scale.beta": Role.SCALE_INPUT,
        "out_scale.alpha": Role.SCALE_OUTPUT,
        "out_scale.beta": Role.SCALE_OUTPUT,
        "lm_head.weight": Role.LM_HEAD,
    }


ALWAYS = {"embed.weight", "q_proj.weight", "lm_head.weight"}  # Llama default: non-scale parameters decay
INPUT = {"in_norm.weight", "in_scale.beta"}
OUTPUT = {"q_norm.weight", "out_scale.beta"}
EXPECTED = {  # mode → scale vectors (besides α) that decay
    "all": INPUT | OUTPUT,
    "iwd": INPUT,
    "no_output": INPUT,
    "no_input": OUTPUT,
    "none": set(),
}


def _decayed_after_zero_grad_step(model: nn.Module, cfg: OptimConfig, roles=Toy.ROLES) -> set[str]:
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, roles, cfg)
    set_lr(opt, LR)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    out = set()
    for n, p in model.named_parameters():
        if torch.equal(p.detach(), before[n]):
            continue
        torch.testing.assert_close(p.detach(), before[n] * (1 - LR * WD), msg=f"{n} changed, but not by decay")
        out.add(n)
    return out


@pytest.mark.parametrize("mode,alpha,optimizer", list(itertools.product(EXPECTED, [False, True], ["adamw", "muon"])))
def test_exactly_the_expected_parameters_decay(mode, alpha, optimizer):
    cfg = OptimConfig(name=optimizer, weight_decay=WD, scale_weight_decay=mode, scale_wd_alpha=alpha)
    expected = ALWAYS | EXPECTED[mode]
    if alpha:  # α decays together with its β (docs/paper.md §1.7 leaves it open; optim.scale_wd_alpha decides)
        expected |= {n.replace("beta", "alpha") for n in EXPECTED[mode] if n.endswith("beta")}
    assert _decayed_after_zero_grad_step(Toy(), cfg) == expected
    assert {n for n, r in Toy.ROLES.items() if decays(n, r, mode, alpha)} == expected


class UnifiedBranch(nn.Module):
    """A unified-strategy (HG + DNP + OR) attention input and LM head, docs/paper.md §1.9: per-branch input-side OR
    vectors (Input-Norm) and output-side OR vectors (Output-Norm) around q/k/v and the LM head."""

    def __init__(self, d: int = 4, vocab: int = 6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        for c in ("q", "k", "v"):
            setattr(self, f"{c}_in_scale", OR(d))
            setattr(self, f"{c}_proj", nn.Linear(d, d, bias=False))
            setattr(self, f"{c}_out_scale", OR(d))
        self.o_proj = nn.Linear(d, d, bias=False)
        self.head_in_scale = OR(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.head_out_scale = OR(vocab)

    def roles(self) -> dict[str, Role]:
        out = {}
        for n, _ in self.named_parameters():
            if "in_scale" in n:
                out[n] = Role.SCALE_INPUT
            elif "out_scale" in n:
                out[n] = Role.SCALE_OUTPUT
            else:
                out[n] = {"embed.weight": Role.EMBED, "lm_head.weight": Role.LM_HEAD}.get(n, Role.MATRIX)
        return out


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("alpha", [False, True])
def test_unified_iwd_decays_input_side_only(optimizer, alpha):
    model = UnifiedBranch()
    roles = model.roles()
    cfg = OptimConfig(name=optimizer, weight_decay=WD, scale_weight_decay="iwd", scale_wd_alpha=alpha)
    decayed = _decayed_after_zero_grad_step(model, cfg, roles)
    input_side = {n for n, r in roles.items() if r is Role.SCALE_INPUT}
    output_side = {n for n, r in roles.items() if r is Role.SCALE_OUTPUT}
    assert len(input_side) == 8 and len(output_side) == 8
    assert decayed & output_side == set()  # Output-Norm: no wd
    assert decayed & input_side == {n for n in input_side if alpha or n.endswith("beta")}
    assert {"embed.weight", "lm_head.weight", "o_proj.weight", "q_proj.weight"} <= decayed


def test_muon_groups_take_matrices_only():
    model = Toy()
    groups = param_groups(model.named_parameters(), Toy.ROLES, OptimConfig(name="muon", scale_wd_alpha=True))
    by_name = {g["name"]: g for g in groups}
    assert [g["name"] for g in groups] == ["muon", "adamw/decay"]  # "all" with α: nothing lands in no_decay
    assert by_name["muon"]["params"] == [model.q_proj.weight]
    assert by_name["muon"]["update_scale"] == "moonlight" and by_name["muon"]["nesterov"]
    adamw = {id(p) for p in by_name["adamw/decay"]["params"]}
    assert id(model.embed.weight) in adamw and id(model.lm_head.weight) in adamw and id(model.in_scale.alpha) in adamw
    for g in groups:
        assert g["lr"] == g["initial_lr"] == OptimConfig().lr and g["lr_scale"] == 1.0


def test_adamw_groups_split_by_decay():
    groups = param_groups(Toy().named_parameters(), Toy.ROLES, OptimConfig(scale_weight_decay="none"))
    assert [(g["name"], g["kind"], g["weight_decay"], len(g["params"])) for g in groups] == [
        ("adamw/decay", "adamw", 0.1, 3), ("adamw/no_decay", "adamw", 0.0, 6)]


def test_every_parameter_needs_a_role():
    roles = dict(Toy.ROLES)
    del roles["q_norm.weight"]
    with pytest.raises(ValueError, match="q_norm.weight"):
        param_groups(Toy().named_parameters(), roles, OptimConfig())


def test_frozen_parameters_are_left_out():
    model = Toy()
    model.embed.weight.requires_grad_(False)
    groups = param_groups(model.named_parameters(), Toy.ROLES, OptimConfig())
    assert sum(len(g["params"]) for g in groups) == len(Toy.ROLES) - 1


def test_muon_settings_flow_from_config():
    cfg = OptimConfig(name="muon", muon=MuonConfig(momentum=0.9, nesterov=False, ns_steps=3, update_scale="jordan"))
    g = param_groups(Toy().named_parameters(), Toy.ROLES, cfg)[0]
    assert (g["momentum"], g["nesterov"], g["ns_steps"], g["update_scale"]) == (0.9, False, 3, "jordan")


def test_set_lr_respects_lr_scale():
    opt = build_optimizer(Toy(), Toy.ROLES, OptimConfig(name="muon"))
    opt.param_groups[0]["lr_scale"] = 0.5
    set_lr(opt, 1e-3)
    assert [g["lr"] for g in opt.param_groups] == [5e-4, 1e-3, 1e-3]  # muon, adamw/decay, adamw/no_decay (α)


# ------------------------------------------------------------------ magnitudes that get no gradient (results v4)

def _unified(moe: bool = False, *overrides: str):
    from config import load_config, resolve_vocab
    from model.llama import Llama
    paths = ["configs/tiny_moe.yaml" if moe else "configs/tiny_cpu.yaml", "configs/scale/unified_literal.yaml"]
    cfg = load_config(paths, list(overrides))
    with torch.device("meta"):
        return cfg, Llama(resolve_vocab(cfg))


def test_the_magnitudes_that_only_meet_a_norm():
    """Unified (HG + DNP + OR, DNP on the LM head): every branch's input-side β feeds an inner Norm, so each block's
    input bank of β is all invariant, and so is the final norm's β (the head's only vector on that side); no α, no
    output-side vector. In the MoE the router has no inner Norm (model.scale.router false): its β alone is not."""
    cfg, model = _unified()
    masks = model.invariant_magnitudes()
    banks = {f"layers.{i}.scales.input.beta" for i in range(cfg.model.n_layers)}
    assert set(masks) == banks | {"norm.scale.beta"}
    assert all(bool(m.all()) for m in masks.values())
    assert all(masks[n].shape == p.shape for n, p in model.named_parameters() if n in masks)
    cfg, moe = _unified(True)
    masks = moe.invariant_magnitudes()
    bank = moe.layers[0].scales["input"]
    router = moe.layers[0].mlp.router.in_scale.slot.ranges["beta"]
    mask = masks["layers.0.scales.input.beta"]
    assert not bool(mask[router[0]:router[1]].any()) and int(mask.sum()) == bank.beta.numel() - 1
    _, routed = _unified(True, "model.scale.router=true")  # the router's logits normalized too: all invariant
    assert bool(routed.invariant_magnitudes()["layers.0.scales.input.beta"].all())


def test_a_masked_group_decays_only_the_entries_that_get_gradient():
    """optim.scale_wd_invariant false: a bank all invariant joins no_decay; one partly invariant joins
    adamw/decay_masked, where a zero-gradient step decays exactly the other entries by (1 − lr·wd) and a found_inf
    step changes nothing; the default keeps every β in adamw/decay."""
    cfg, model = _unified(True)
    model = type(model)(model.cfg)  # on the CPU, for real steps
    model.init_weights(0)
    roles, masks = model.param_roles(), model.invariant_magnitudes()
    default = {g["name"] for g in param_groups(model.named_parameters(), roles, cfg.optim, None, masks)}
    assert "adamw/decay_masked" not in default
    spare = OptimConfig(lr=LR, weight_decay=WD, scale_weight_decay="iwd", scale_wd_invariant=False)
    opt = build_optimizer(model, roles, spare, fused=True)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = {g["name"]: [names[id(p)] for p in g["params"]] for g in opt.param_groups}
    assert groups["adamw/decay_masked"] == [f"layers.{i}.scales.input.beta" for i in range(cfg.model.n_layers)]
    assert "norm.scale.beta" in groups["adamw/no_decay"]
    bank = dict(model.named_parameters())["layers.0.scales.input.beta"]
    keep = masks["layers.0.scales.input.beta"]
    with torch.no_grad():
        bank.copy_(torch.linspace(0.5, 1.5, bank.numel()))
    before = bank.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step(found_inf=torch.ones(()))
    assert torch.equal(bank, before)
    set_lr(opt, LR)
    opt.step(found_inf=torch.zeros(()))
    expect = torch.where(keep, before, before * (1 - LR * WD))
    torch.testing.assert_close(bank.detach(), expect, rtol=2 ** -22, atol=0)


def test_the_knob_needs_dnp_magnitudes():
    from config import load_config
    from kernel.config import ConfigError
    with pytest.raises(ConfigError, match=r"optim.scale_wd_invariant.*placement=dp.*reparam=or"):
        load_config(["configs/tiny_cpu.yaml", "configs/scale/hg_dp_or.yaml"], ["optim.scale_wd_invariant=false"])
    with pytest.raises(ConfigError, match=r"placement=dnp, model.scale.reparam=direct"):
        load_config(["configs/tiny_cpu.yaml", "configs/scale/hg_dnp.yaml"], ["optim.scale_wd_invariant=false"])
    load_config(["configs/tiny_cpu.yaml", "configs/scale/unified_literal.yaml"], ["optim.scale_wd_invariant=false"])


def test_an_invariant_magnitude_gets_gradient_only_through_eps():
    """What the knob rests on: each β that Llama.invariant_magnitudes marks reaches the loss only through its Norm's
    eps. In float64 its gradient scales with eps (100× from eps 1e-9 to 1e-7: the gradient goes as eps/(ms + eps)^k,
    linear to O(eps/ms), and the Norm inputs' mean squares ms here are ≳ 1e-5, so within 2 %) and vanishes at eps 0,
    where the unmarked entries (the MoE router's β) keep theirs."""
    import dataclasses

    from config import load_config, resolve_vocab
    from model.llama import Llama
    cfg = load_config(["configs/tiny_moe.yaml", "configs/scale/unified_literal.yaml"],
                      ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.moe.n_experts=4",
                       "model.moe.top_k=2", "data.tokenizer=bpe:320"])
    base = resolve_vocab(cfg)
    tokens = torch.randint(0, base.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    grads = {}
    for eps in (1e-7, 1e-9, 0.0):
        model = Llama(dataclasses.replace(base, norm_eps=eps)).double()
        model.init_weights(0)
        model(tokens[:, :-1], tokens[:, 1:]).backward()
        grads[eps] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        masks = model.invariant_magnitudes()
    for name, mask in masks.items():
        big, small, none = (grads[e][name][mask] for e in (1e-7, 1e-9, 0.0))
        assert big.abs().min() > 0
        torch.testing.assert_close(big, 100 * small, rtol=2e-2, atol=0)
        assert none.abs().max() <= 1e-9 * big.abs().max()
        if not bool(mask.all()):  # the router's β: a real gradient at eps 0
            assert grads[0.0][name][~mask].abs().min() > 1e6 * none.abs().max()


# ------------------------------------------------------------------------------------- Muon on the MoE router

def test_muon_takes_the_router_as_the_paper_reads_and_the_knob_keeps_it_on_adamw():
    """docs/paper.md §3.2: Muon on "2D matrices inside Transformer layers", the MoE router's among them;
    optim.muon.router false keeps it on AdamW."""
    from config import load_config, resolve_vocab
    from model.llama import Llama
    for router, group in ((None, "muon"), ("false", "adamw/decay")):
        cfg = load_config("configs/tiny_moe.yaml", ["optim.name=muon"] + ([f"optim.muon.router={router}"] if router
                                                                          else []))
        with torch.device("meta"):
            model = Llama(resolve_vocab(cfg))
        groups = param_groups(model.named_parameters(), model.param_roles(), cfg.optim)
        names = {id(p): n for n, p in model.named_parameters()}
        where = {names[id(p)]: g["name"] for g in groups for p in g["params"]}
        assert where["layers.0.mlp.router.weight"] == group
        assert where["layers.0.mlp.gate_proj.weight"] == "muon"


def test_a_run_saved_before_the_router_knob_reads_as_adamw(tmp_path):
    """A config.yaml written before optim.muon.router existed trained the router with AdamW: reading it back says
    false (kernel/config.py, `since`), and a resume under today's default is refused rather than switching it."""
    import yaml
    from config import load_config, load_saved_config
    from kernel.config import resume_conflicts
    cfg = load_config("configs/tiny_moe.yaml", ["optim.name=muon"])
    old = cfg.to_dict()
    del old["optim"]["muon"]["router"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    assert load_saved_config(path).optim.muon.router is False and cfg.optim.muon.router is True
    assert load_config(path).optim.muon.router is True  # a config a user writes gets today's default
    assert resume_conflicts(path.read_text(), cfg) == ["optim.muon.router: False in the checkpoint, True now"]
    assert resume_conflicts(yaml.safe_dump(cfg.to_dict()), cfg) == []

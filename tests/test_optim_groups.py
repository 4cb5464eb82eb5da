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
    """γ = β·Norm(α), as model/vectors.py's OR vector: α ∈ R^d, β of shape (1,)."""

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
    """Unified (HG + DNP + OR, DNP on the LM head): every branch's input-side β feeds an inner Norm, and so does the
    final norm's β (the head's only vector on that side); no α, no output-side vector. In the MoE the router has no
    inner Norm (model.scale.router false): its β alone is not marked. On the fast path each block's marked β fill
    a bank of their own, so a bank decays or not as a whole."""
    from fast import apply_fast_path
    from fast.banks import parameter_names
    branches = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
    cfg, model = _unified()
    marked = model.invariant_magnitudes()
    assert marked == {f"layers.{i}.{b}.in_scale.beta" for i in range(cfg.model.n_layers) for b in branches} | \
        {"norm.scale.beta"}
    params = dict(model.named_parameters())
    assert all(n in params for n in marked)
    apply_fast_path(model)
    assert parameter_names(model, marked) == {f"layers.{i}.scales.input_invariant.beta"
                                              for i in range(cfg.model.n_layers)} | {"norm.scale.beta"}
    cfg, moe = _unified(True)
    marked = moe.invariant_magnitudes()
    assert "layers.0.mlp.router.in_scale.beta" not in marked and "layers.0.mlp.gate_proj.in_scale.beta" in marked
    apply_fast_path(moe)
    assert "layers.0.scales.input.beta" in dict(moe.named_parameters())  # the router's β, in a bank of its own
    assert "layers.0.scales.input.beta" not in parameter_names(moe, marked)
    _, routed = _unified(True, "model.scale.router=true")  # the router's logits normalized too: marked
    assert "layers.0.mlp.router.in_scale.beta" in routed.invariant_magnitudes()


def test_the_knob_spares_the_marked_magnitudes_on_both_paths():
    """optim.scale_wd_invariant false: the marked β (each its own parameter, or the fast path's bank of them) join
    adamw/no_decay, the router's β stays in adamw/decay; the default keeps every β in adamw/decay."""
    from fast import apply_fast_path
    from fast.banks import parameter_names
    spare = OptimConfig(lr=LR, weight_decay=WD, scale_weight_decay="iwd", scale_wd_invariant=False)
    for fast in (False, True):
        cfg, model = _unified(True)
        if fast:
            apply_fast_path(model)
        names = {id(p): n for n, p in model.named_parameters()}
        marked = parameter_names(model, model.invariant_magnitudes())
        default = param_groups(model.named_parameters(), model.param_roles(), cfg.optim, None, marked)
        decayed = {names[id(p)] for g in default if g["name"] == "adamw/decay" for p in g["params"]}
        assert marked <= decayed
        groups = {g["name"]: {names[id(p)] for p in g["params"]}
                  for g in param_groups(model.named_parameters(), model.param_roles(), spare, None, marked)}
        assert marked <= groups["adamw/no_decay"] and not marked & groups["adamw/decay"]
        router = "layers.0.scales.input.beta" if fast else "layers.0.mlp.router.in_scale.beta"
        assert router in groups["adamw/decay"]


def test_the_knob_needs_dnp_magnitudes():
    from config import load_config
    from strictconfig.config import ConfigError
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
        marked = model.invariant_magnitudes()
    router = "layers.0.mlp.router.in_scale.beta"  # not marked: a real gradient at eps 0
    assert marked and router not in marked
    for name in marked:
        big, small, none = (grads[e][name] for e in (1e-7, 1e-9, 0.0))
        assert big.abs().min() > 0
        torch.testing.assert_close(big, 100 * small, rtol=2e-2, atol=0)
        # At eps 0, ∂L/∂β = Σ_i ∂L/∂γ_i · γ_i / β cancels exactly; fp64 leaves rounding of a sum over d terms, each
        # about |α_i ∂L/∂α_i| in size (γ ∝ α): at most d·u times their sum, with a factor 4 for the operations.
        alpha = dict(model.named_parameters())[name.replace(".beta", ".alpha")]
        terms = (alpha.detach() * grads[0.0][name.replace(".beta", ".alpha")]).abs().sum()
        assert none.abs().max() <= 4 * alpha.shape[-1] * torch.finfo(torch.float64).eps * terms
        assert none.abs().max() < 1e-6 * big.abs().max()  # eps's share dominates by far
        assert grads[0.0][router].abs().min() > 1e6 * none.abs().max()


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
    false (strictconfig/config.py, `since`), and a resume under today's default is refused rather than switching it."""
    import yaml
    from config import load_config, load_saved_config
    from strictconfig.config import resume_conflicts
    cfg = load_config("configs/tiny_moe.yaml", ["optim.name=muon"])
    old = cfg.to_dict()
    del old["optim"]["muon"]["router"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    assert load_saved_config(path).optim.muon.router is False and cfg.optim.muon.router is True
    assert load_config(path).optim.muon.router is True  # a config a user writes gets today's default
    assert resume_conflicts(path.read_text(), cfg) == ["optim.muon.router: False in the checkpoint, True now"]
    assert resume_conflicts(yaml.safe_dump(cfg.to_dict()), cfg) == []

"""The model half: parameter counts against the paper, init equivalences, folding, causality, roles."""
import math
from dataclasses import replace

import pytest
import torch

from config import load_config
from model.config import ModelConfig, Role, ScaleConfig
from runtime.hf_export import folded_state_dict, plain_config
from model.llama import Llama, build_model
from model.summary import flops_per_token, num_params, params_by_role
from model.scaling import ScaledLinear, rms_normalize
from model.vectors import ScaleVector

PRESETS = ["baseline", "none", "hg", "hg_ap", "hg_dp", "hg_dnp", "hg_dp_or", "hg_dp_er", "hg_dnp_or", "hg_dnp_er",
           "unified", "unified_literal", "gemma"]
FOLDABLE = ["baseline", "none", "hg", "hg_ap", "hg_dp", "hg_dp_or", "hg_dp_er"]


def preset(name: str) -> ScaleConfig:
    return load_config(f"configs/scale/{name}.yaml").model.scale


def preset_model_cfg(name: str, **sizes) -> ModelConfig:
    cfg = load_config(f"configs/scale/{name}.yaml").model
    small = dict(d_model=32, n_layers=2, n_heads=4, vocab_size=67, d_ffn=48)
    return replace(cfg, **{**small, **sizes})


def meta_model(cfg: ModelConfig) -> Llama:
    with torch.device("meta"):
        return Llama(cfg)


# ----------------------------------------------------------------------------------------------- counts

PAPER_DENSE = {  # docs/paper.md §2.3 (baseline, V = 50,304) and §2.4 (unified under the best-fit reading)
    "0.12b": (119_744_256, 119_846_846),
    "0.25b": (254_018_560, 254_208_234),
    "0.5b": (482_696_960, 483_008_554),
    "0.75b": (749_142_528, 749_558_612),
    "1b": (1_028_065_024, 1_028_562_326),
}


@pytest.mark.parametrize("size", PAPER_DENSE)
def test_paper_parameter_counts(size):
    base_cfg = load_config(f"configs/dense/{size}.yaml").model
    base = meta_model(base_cfg)
    baseline_total, unified_total = PAPER_DENSE[size]
    assert num_params(base) == baseline_total
    by_role = params_by_role(base)
    assert by_role["scale_input"] == (2 * base_cfg.n_layers + 1) * base_cfg.d_model
    assert by_role["scale_output"] == 0
    unified = meta_model(load_config([f"configs/dense/{size}.yaml", "configs/scale/unified_literal.yaml"]).model)
    assert num_params(unified) == unified_total


def test_llama_1b_scale_vector_count():
    by_role = params_by_role(meta_model(load_config("configs/dense/1b.yaml").model))
    assert by_role["scale_input"] + by_role["scale_output"] == 80_640  # docs/paper.md §1.2


def test_vocab_padding_and_ffn_defaults():
    cfg = ModelConfig(d_model=768, vocab_size=50304)
    assert cfg.ffn_dim == 2048 and cfg.head_dim == 64 and cfg.kv_heads == 12


# ----------------------------------------------------------------------------------------------- init equivalence

def logits_of(cfg: ModelConfig, tokens: torch.Tensor, seed: int = 0) -> torch.Tensor:
    model = build_model(cfg, seed=seed, dtype=torch.float64)
    with torch.no_grad():
        return model(tokens)


TOKENS = torch.randint(0, 67, (2, 11), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", ["none", "hg", "hg_ap", "hg_dp", "hg_dp_or", "hg_dp_er"])
def test_init_equals_baseline(name):
    """Every vector starts at γ = 1, so with the same W every design without an inner Norm is the baseline."""
    ref = logits_of(preset_model_cfg("baseline"), TOKENS)
    out = logits_of(preset_model_cfg(name), TOKENS)
    # float64: γ = 1 multiplies exactly; OR's β·√d·α/‖α‖ is 1 to a few u₆₄ (u = 2⁻⁵³), carried through 2 blocks of
    # K ≤ 67-term reductions: ≲ 1e-14. 1e-12 keeps two orders; a γ ≠ 1 at init is ≥ 1e-2 off
    assert ((out - ref).norm() / ref.norm()).item() <= 1e-12


@pytest.mark.parametrize("reparam", ["or", "er"])
def test_reparam_alone_equals_baseline_at_init(reparam):
    cfg = preset_model_cfg("baseline")
    cfg = replace(cfg, scale=replace(cfg.scale, reparam=reparam))
    ref = logits_of(preset_model_cfg("baseline"), TOKENS)
    assert ((logits_of(cfg, TOKENS) - ref).norm() / ref.norm()).item() <= 1e-12  # as above


def randomize_vectors(model: Llama, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    roles = model.param_roles()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if roles[name] in (Role.SCALE_INPUT, Role.SCALE_OUTPUT):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen, dtype=p.dtype))


def test_dnp_on_qk_is_explicit_qk_norm():
    cfg = preset_model_cfg("hg_dnp")
    model = build_model(cfg, dtype=torch.float64)
    randomize_vectors(model)
    attn, hd = model.layers[0].attn, cfg.head_dim
    h = torch.randn(2, 5, cfg.d_model, dtype=torch.float64)
    for proj in (attn.q_proj, attn.k_proj):
        pre = torch.nn.functional.linear(h * proj.in_scale(), proj.weight)  # (B, T, H·hd)
        per_head = pre.view(2, 5, -1, hd)
        qk_norm = per_head / per_head.pow(2).mean(-1, keepdim=True).add(cfg.norm_eps).sqrt()
        expected = qk_norm.flatten(-2) * proj.out_scale()
        torch.testing.assert_close(proj(h), expected, rtol=1e-12, atol=1e-12)  # float64, 32-term sums: ~1e-15


# ----------------------------------------------------------------------------------------------- folding

@pytest.mark.parametrize("name", FOLDABLE + ["dp_shared", "ap_no_head"])
def test_folding_preserves_logits(name):
    if name == "dp_shared":
        cfg = preset_model_cfg("baseline")
        cfg = replace(cfg, scale=ScaleConfig(placement="dp", reparam="or", lm_head=True))
    elif name == "ap_no_head":
        cfg = preset_model_cfg("hg_ap")
        cfg = replace(cfg, scale=replace(cfg.scale, lm_head=False, reparam="er"), n_kv_heads=2)
    else:
        cfg = preset_model_cfg(name)
    model = build_model(cfg, dtype=torch.float64)
    randomize_vectors(model)
    plain = build_model(plain_config(cfg), seed=99, dtype=torch.float64)
    plain.load_state_dict(folded_state_dict(model))
    with torch.no_grad():
        ref, out = model(TOKENS), plain(TOKENS)
    # float64: folding rounds each W·diag(γ) entry (u₆₄), and 2 blocks of ≤ 67-term reductions carry it (≲ 1e-14);
    # 1e-10 allows the random γ ∈ [0.5, 1.5] to condition the network 10⁴× worse. A missing fold is O(1e-1).
    assert ((out - ref).norm() / ref.norm()).item() <= 1e-10


def test_folding_refuses_inner_norm():
    with pytest.raises(ValueError, match="inner Norm"):
        folded_state_dict(build_model(preset_model_cfg("unified")))


# ----------------------------------------------------------------------------------------------- causality

@pytest.mark.parametrize("name", PRESETS)
def test_causal(name):
    cfg = preset_model_cfg(name)
    model = build_model(cfg, dtype=torch.float64)
    randomize_vectors(model)
    t = 6
    changed = TOKENS.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 1) % 67
    with torch.no_grad():
        a, b = model(TOKENS), model(changed)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


# ----------------------------------------------------------------------------------------------- roles

@pytest.mark.parametrize("name", PRESETS)
def test_roles_cover_every_parameter_once(name):
    model = meta_model(preset_model_cfg(name))
    roles = model.param_roles()  # asserts coverage itself
    assert set(roles) == {n for n, _ in model.named_parameters()}
    assert roles["tok_embeddings.weight"] == Role.EMBED and roles["lm_head.weight"] == Role.LM_HEAD
    for n, p in model.named_parameters():
        if roles[n] == Role.MATRIX:
            assert p.dim() == 2


def test_unified_roles_input_vs_output():
    roles = meta_model(preset_model_cfg("unified_literal")).param_roles()
    for n, role in roles.items():
        if ".in_scale." in n or n.startswith("norm.scale"):
            assert role == Role.SCALE_INPUT, n
        if ".out_scale." in n:
            assert role == Role.SCALE_OUTPUT, n
    assert roles["lm_head.out_scale.alpha"] == Role.SCALE_OUTPUT
    assert roles["layers.0.attn.q_proj.in_scale.beta"] == Role.SCALE_INPUT
    gemma = meta_model(preset_model_cfg("gemma")).param_roles()
    assert gemma["layers.0.attn.q_norm.scale.weight"] == Role.SCALE_OUTPUT
    assert gemma["layers.0.ffn_out_norm.scale.weight"] == Role.SCALE_OUTPUT
    assert gemma["layers.0.attn_norm.scale.weight"] == Role.SCALE_INPUT


# ----------------------------------------------------------------------------------------------- pieces

def test_scale_vector_reparams():
    for reparam in ("direct", "or", "er"):
        sv = ScaleVector(7, reparam, Role.SCALE_INPUT).double()
        sv.reset_parameters()
        torch.testing.assert_close(sv(), torch.ones(7, dtype=torch.float64))
    sv = ScaleVector(4, "or", Role.SCALE_INPUT).double()
    with torch.no_grad():
        sv.alpha.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        sv.beta.fill_(2.0)
    a = sv.alpha.detach()
    torch.testing.assert_close(sv(), 2.0 * 2.0 * a / a.norm())  # β·√d·α/‖α‖ with √d = 2
    sv = ScaleVector(3, "er", Role.SCALE_INPUT).double()
    with torch.no_grad():
        sv.alpha.copy_(torch.tensor([0.0, 1.0, 2.0]))
        sv.beta.fill_(0.5)
    torch.testing.assert_close(sv(), torch.exp(torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64) + 0.5))


def test_rms_normalize_matches_paper_norm():
    x = torch.randn(3, 16, dtype=torch.float64)
    torch.testing.assert_close(rms_normalize(x, 0.0), 4.0 * x / x.norm(dim=-1, keepdim=True))


def test_dnp_lm_head_normalizes_over_vocab():
    model = build_model(preset_model_cfg("unified_literal"), dtype=torch.float64)
    with torch.no_grad():
        logits = model(TOKENS)
    # not rounding: the Norm's ε. mean(y²) = ms/(ms + ε) = 1 − ε/(ms + ε) ≥ 1 − 2e-3 for the pre-norm logits' ms ≥ 5e-3
    torch.testing.assert_close(logits.pow(2).mean(-1), torch.ones(2, 11, dtype=torch.float64), rtol=0, atol=2e-3)


def test_init_is_independent_of_world_and_reproducible():
    cfg = preset_model_cfg("unified_literal")
    a, b = build_model(cfg, seed=3), build_model(cfg, seed=3)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    c = build_model(cfg, seed=4)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    std = a.layers[0].attn.o_proj.weight.std().item()
    # depth scaling 1/sqrt(2·n_layers) = 1/2; statistics, not rounding: a 32×32 sample's std is within
    # 1/√(2·1024) ≈ 2 % of σ (one standard error), 0.2·σ is ~9 of them, and no scaling (σ) or 1/n_layers² is 50 % off
    assert abs(std - cfg.init_std / 2.0) < 0.2 * cfg.init_std


def test_flops_per_token():
    cfg = load_config("configs/dense/0.12b.yaml").model
    model = meta_model(cfg)
    n = num_params(model, exclude_embedding=True)
    assert n == 81_110_784  # docs/paper.md §3.6: N = 81.11M for Dense-0.12B
    assert flops_per_token(model, 1024) == 6 * n + 12 * 6 * 768 * 1024


def test_scaled_linear_without_vectors_is_linear():
    lin = ScaledLinear(5, 3).double()
    torch.nn.init.normal_(lin.weight)
    x = torch.randn(4, 5, dtype=torch.float64)
    torch.testing.assert_close(lin(x), x @ lin.weight.T)


@pytest.mark.parametrize("rows", [2, 64])  # fewer rows than d_out/d_in: the activations are scaled; more: W is
@pytest.mark.parametrize("inner", [False, True])
def test_scaled_linear_either_side_equals_the_formula(rows, inner):
    """u ⊙ post(W (v ⊙ x)) whichever side ScaledLinear scales, values and gradients, for every reparameterization."""
    from model.scaling import Norm
    for reparam in ("direct", "or", "er"):
        lin = ScaledLinear(6, 8, in_scale=ScaleVector(6, reparam, Role.SCALE_INPUT),
                           inner=Norm(8, 1e-6, None, group=4) if inner else None,
                           out_scale=ScaleVector(8, reparam, Role.SCALE_OUTPUT)).double()
        torch.nn.init.normal_(lin.weight)
        for sv in (lin.in_scale, lin.out_scale):
            for p in sv.parameters():
                torch.nn.init.uniform_(p, 0.5, 1.5)
        x = torch.randn(rows, 6, dtype=torch.float64, requires_grad=True)
        got = lin(x)
        y = (x * lin.in_scale()) @ lin.weight.T
        ref = (lin.inner(y) if inner else y) * lin.out_scale()
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)  # float64, ≤ 8-term sums: ~1e-15
        g = torch.randn_like(ref)
        grads = torch.autograd.grad(got, [x, *lin.parameters()], g)
        ref_grads = torch.autograd.grad(ref, [x, *lin.parameters()], g)
        for a, b in zip(grads, ref_grads):  # ≤ 64-term sums (rows) with cancellation (Norm): 1e-10 relative
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_rms_normalize_is_the_plain_formula_bit_for_bit(dtype):
    """Our Norm and F.rms_norm compute exactly the plain fp32-reduction formula on CPU."""
    x = torch.randn(5, 48, dtype=dtype) * 3
    x32 = x.float() if dtype == torch.bfloat16 else x
    plain = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
    assert torch.equal(rms_normalize(x, 1e-5), plain)
    assert torch.equal(torch.nn.functional.rms_norm(x, (48,), eps=1e-5), plain)


def test_norm_backward_through_its_output_is_exact():
    """The Norm's backward (written through y and r, keeping no input): gradcheck in fp64, padded widths included."""
    x = torch.randn(3, 4, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rms_normalize(t, 1e-3), (x,))
    padded = torch.nn.functional.pad(torch.randn(3, 5, dtype=torch.float64), (0, 3)).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: rms_normalize(t, 1e-3, 5), (padded,))


def test_input_side_magnitudes_in_the_telemetry():
    """Each input-side vector's magnitude is logged on its own key: OR's β with its sign (a sign change shows), ER's
    e^β, a direct vector's RMS (runtime/telemetry.py)."""
    from runtime.telemetry import scale_telemetry
    for name, reparam in (("unified_literal", "or"), ("hg_dnp_er", "er"), ("baseline", "direct")):
        model = build_model(preset_model_cfg(name), "cpu").double()
        model.init_weights(0)
        q = model.layers[1].attn.q_proj.in_scale if name != "baseline" else model.layers[1].attn_norm.scale
        with torch.no_grad():
            q.part("weight" if reparam == "direct" else "beta").fill_(-0.5)
        t = scale_telemetry(model)
        site = "attn.q_proj" if name != "baseline" else "attn_norm"
        want = {"or": -0.5, "er": math.exp(-0.5), "direct": 0.5}[reparam]
        assert t[f"magnitude/L1/{site}"] == pytest.approx(want, rel=1e-6), name  # fp32 telemetry of fp64 values
        others = [v for k, v in t.items() if k.startswith("magnitude/") and k != f"magnitude/L1/{site}"]
        assert others and all(v == pytest.approx(1.0) for v in others), name

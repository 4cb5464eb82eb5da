"""Llama-MoE: the paper's parameter counts, the dense limit, dispatch/combine against a per-token reference (grouped
GEMM and loop), balancing (aux loss, bias), every scale preset, folding, roles, Muon per expert. One file (about 420 lines) so that
the MoE's reference tests sit beside the counts they check."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from config import load_config

from optim.config import MuonConfig, OptimConfig
from model.config import ModelConfig, MoEConfig, Role, ScaleConfig
from runtime.hf_export import folded_state_dict, plain_config
from model.llama import Llama, build_model
from model.summary import activated_params, flops_per_token, num_params, params_by_role
from model.moe import MoE
from optim import build_optimizer
from runtime.checkpoint import load_checkpoint, save_checkpoint
from runtime.moe import moe_step_end
from test_model import FOLDABLE, PRESETS, randomize_vectors

V = 61


def moe_cfg(preset: str = "baseline", **moe) -> ModelConfig:
    """A small MoE: d 32, 2 layers, 8 experts of hidden 21 (stored as 64), top-2, a shared expert of 85 (128)."""
    cfg = load_config(f"configs/scale/{preset}.yaml").model
    return replace(cfg, d_model=32, n_layers=2, n_heads=4, vocab_size=V,
                   moe=MoEConfig(**{"n_experts": 8, "top_k": 2, **moe}))


def meta(cfg: ModelConfig) -> Llama:
    with torch.device("meta"):
        return Llama(cfg)


TOKENS = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(0))

# ----------------------------------------------------------------------------------------------------- counts

PAPER_MOE = {  # docs/paper.md §2.3: (total, activated) with V = 50,304, a bias-free d×32 router, no shared-expert gate
    "0.25b": (251_044_480, 113_633_920),
    "0.5b": (480_942_336, 183_671_040),
    "0.8b": (797_327_040, 281_231_040),
    "1b": (1_058_931_712, 354_976_768),
    "2b": (1_996_574_720, 620_856_320),
}


@pytest.mark.parametrize("size", PAPER_MOE)
def test_paper_moe_parameter_counts(size):
    cfg = load_config(f"configs/moe/{size}.yaml")
    model = meta(cfg.model)
    total, activated = PAPER_MOE[size]
    assert num_params(model) == total and activated_params(model) == activated
    assert params_by_role(model)["scale_input"] == (2 * cfg.model.n_layers + 1) * cfg.model.d_model
    moe = model.layers[0].mlp
    assert moe.expert_dim == int(2 * cfg.model.d_model / 3) and moe.expert_dim_padded % 64 == 0
    shared = model.layers[0].mlp.shared_expert.gate_proj
    assert shared.d_out == int(8 * cfg.model.d_model / 3) and shared.weight.shape[0] % 64 == 0
    # MFU counts what a token costs: activated parameters without the input embedding
    n = activated - cfg.model.padded_vocab * cfg.model.d_model
    assert flops_per_token(model, 1024) == 6 * n + 12 * cfg.model.n_layers * cfg.model.d_model * 1024


def test_inspect_model_reports_activated_params(capsys):
    from scripts import inspect_model
    import json
    assert inspect_model.main(["--config", "configs/moe_0.5b_unified.yaml", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["activated_params"] < info["total_params"] and info["moe"]["n_experts"] == 32
    assert info["by_role"]["scale_output"] > 0 and info["scale"]["placement"] == "dnp"


# ------------------------------------------------------------------------------------------- the dense limit

def _dense_twin(cfg: ModelConfig) -> ModelConfig:
    return replace(cfg, moe=None, d_ffn=cfg.moe.expert_dim(cfg.d_model))


@pytest.mark.parametrize("preset", PRESETS)
def test_one_expert_top1_no_shared_is_the_dense_swiglu(preset):
    """E = 1, k = 1, no shared expert: the router's softmax is 1, so the MoE is the dense model with the same
    weights (vectors included) — for every design."""
    cfg = replace(moe_cfg(preset, n_experts=1, top_k=1, n_shared=0, expert_ffn=48),  # both stored as 64
                  scale=replace(load_config(f"configs/scale/{preset}.yaml").model.scale))
    dense = build_model(_dense_twin(cfg), dtype=torch.float64)
    randomize_vectors(dense)
    moe = build_model(cfg, dtype=torch.float64)
    randomize_vectors(moe, seed=2)  # router vectors get other values: they must not matter
    src, state = dense.state_dict(), moe.state_dict()
    buffers = {n for n, _ in moe.named_buffers()}  # the balancing state: the MoE's own
    for name, t in state.items():
        if ".router." not in f".{name}" and name not in buffers:
            state[name] = src[name].reshape(t.shape)  # (F, d) → (1, F, d); (F,) → (1, F)
    moe.load_state_dict(state)
    with torch.no_grad():
        a, b = dense(TOKENS), moe(TOKENS)
    # float64 but for the router (softmax of one logit: exactly 1): the same products in another order, ~K·u₆₄ with
    # K ≤ 64 per reduction through 2 blocks (≈ 1e-14); 1e-10 is that with 4 orders of margin, and a lost weight is O(1)
    assert ((a - b).norm() / a.norm()).item() <= 1e-10


# ----------------------------------------------------------------------------- dispatch/combine vs a reference

def reference_moe(moe: MoE, h: torch.Tensor) -> torch.Tensor:
    """Every token through each of its k experts, one at a time, weighted: no sorting, no grouping."""
    x = h.reshape(-1, moe.d)
    probs = torch.nn.functional.linear(x.float(), moe.router.weight.float()).softmax(-1)
    experts = (probs + moe.expert_bias).topk(moe.top_k, dim=-1).indices
    weights = probs.gather(-1, experts)
    out = []
    for t in range(x.shape[0]):
        y = moe.shared_expert(x[t])
        for j in range(moe.top_k):
            e = experts[t, j]
            g, u = moe.gate_proj.weight[e] @ x[t], moe.up_proj.weight[e] @ x[t]
            y = y + weights[t, j] * (moe.down_proj.weight[e] @ (torch.nn.functional.silu(g) * u))
        out.append(y)
    return torch.stack(out).view(h.shape)


@pytest.mark.parametrize("impl", ["grouped", "loop"])
def test_sorted_path_equals_per_token_reference(impl):
    cfg = moe_cfg("baseline", balance="bias", impl=impl)
    model = build_model(cfg)
    moe = model.layers[0].mlp
    with torch.no_grad():
        moe.expert_bias[5:] = -10.0  # experts 5–7 are never chosen: zero-token groups
    h = torch.randn(3, 7, cfg.d_model, requires_grad=True)
    out = moe(h)
    assert moe.tokens_per_expert[5:].sum() == 0 and moe.tokens_per_expert[:5].min() > 0
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), [h, *moe.parameters()])
    h2 = h.detach().clone().requires_grad_()
    ref = reference_moe(moe, h2)
    ref_grads = torch.autograd.grad((ref * g).sum(), [h2, *moe.parameters()])
    # float32 (the grouped GEMM has no float64 kernel), the same products summed in another order: ≤ K·ε per
    # reduction, K ≤ 128 (the shared expert's padded hidden; d = 32, 21 tokens), a few chained per path: 8·K·ε
    # (≈ 1.2e-4) of each tensor's largest entry. A lost expert, weight or gradient path is off by O(1) of it.
    tol = 8 * 128 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(out, ref, rtol=0, atol=tol * ref.abs().max().item())
    for (name, _), a, b in zip([("h", None), *moe.named_parameters()], grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=tol * b.abs().max().item(), msg=name)


def test_grouped_and_loop_agree_with_every_vector():
    """The unified design (per-expert output vectors, DNP's inner Norm over padded rows) through both paths."""
    cfg = moe_cfg("unified", impl="loop")
    loop = build_model(cfg, dtype=torch.float64)
    randomize_vectors(loop)
    grouped = build_model(replace(cfg, moe=replace(cfg.moe, impl="grouped")), dtype=torch.float32)
    grouped.load_state_dict({k: v.float() for k, v in loop.state_dict().items()})
    a = loop(TOKENS)
    b = grouped(TOKENS)
    # float32 against float64: ≤ K·ε₃₂ per reduction, K ≤ 64 (padded hidden; d = 32, V = 61, 13 tokens), 8 chained
    # (test_ffn_padding.tolerance's reasoning): 8·K·ε ≈ 6e-5 normwise; a mis-scaled expert vector is O(1e-1).
    assert (b.double() - a).norm() <= 8 * 64 * torch.finfo(torch.float32).eps * a.norm()


def test_grouped_with_unaligned_widths_is_refused_by_name():
    """impl=grouped asked for explicitly where the rows are not whole 16-byte bf16 units: a message naming the widths
    and the way out, not the GEMM's stride assertion from inside torch on a GPU (auto takes the loop there)."""
    cfg = replace(moe_cfg(impl="grouped"), d_model=36, n_heads=2)  # 36 % 8 ≠ 0
    with pytest.raises(RuntimeError, match=r"d_model \(36\) and the stored expert width"):
        build_model(cfg, dtype=torch.float32)(TOKENS)
    auto = build_model(replace(cfg, moe=replace(cfg.moe, impl="auto")), dtype=torch.float32)
    assert not auto.layers[0].mlp.uses_grouped(torch.zeros(1, 36)) and auto(TOKENS).isfinite().all()


# Padding (model.ffn_pad_multiple) for the routed experts, the shared expert and the dense MLP alike:
# tests/test_ffn_padding.py.


# ------------------------------------------------------------------------------------------------- balancing

def _cyclic_moe(E: int = 4, k: int = 2, **kw) -> tuple[MoE, torch.Tensor]:
    """Token t strongly prefers experts t and t+1 (mod E): with E tokens, every expert gets exactly k slots and, by
    symmetry, the same mean probability."""
    cfg = moe_cfg("none", n_experts=E, top_k=k, **kw)
    moe = build_model(cfg, dtype=torch.float64).layers[0].mlp
    with torch.no_grad():
        moe.router.weight.zero_()
        for t in range(E):
            moe.router.weight[t, t] = moe.router.weight[(t + 1) % E, t] = 5.0
    h = torch.zeros(1, E, cfg.d_model, dtype=torch.float64)
    h[0, torch.arange(E), torch.arange(E)] = 1.0
    return moe, h


def test_aux_loss_is_one_when_balanced_and_grows_with_skew():
    moe, h = _cyclic_moe()
    moe.train()
    moe(h)
    assert torch.equal(moe.tokens_per_expert, torch.full((4,), 2))
    # E·Σ fᵢPᵢ, unscaled: the router's probabilities are float32 (model/moe.py), E·tokens = 16 of them summed:
    # ≤ 16·u₃₂ ≈ 1e-6 (u₃₂ = 2⁻²⁴); a miscounted slot moves it by 1/8
    assert abs(moe.stat_sums[0].item() - 1.0) < 16 * 2**-24
    torch.testing.assert_close(moe.balance_loss, torch.tensor(0.01, dtype=torch.float64),
                               rtol=16 * 2**-24, atol=0)  # aux_coef · 1, the same float32 sum
    moe.reset_step_stats()
    moe(torch.zeros_like(h).index_fill_(2, torch.tensor([0]), 1.0))  # every token prefers experts 0 and 1
    assert moe.stat_sums[0].item() > 1.5


def test_z_loss_and_no_balance():
    moe, h = _cyclic_moe(balance="none", z_coef=1e-3)
    moe(h)
    z = torch.logsumexp(torch.nn.functional.linear(h[0], moe.router.weight), -1).pow(2).mean()
    # the model's router logits are float32 (K = 32 products), z here float64: (K + 4 tokens)·u₃₂ of z, doubled (z ∝
    # logsumexp²) ≈ 4e-6; a missing square or mean is O(1)
    torch.testing.assert_close(moe.balance_loss, 1e-3 * z, rtol=2 * 36 * 2**-24, atol=0)
    moe2, _ = _cyclic_moe(balance="none")
    moe2(h)
    assert moe2.balance_loss is None


def test_bias_update_moves_load_toward_the_mean():
    cfg = moe_cfg("baseline", balance="bias", bias_rate=0.01)
    model = build_model(cfg)
    moe = model.layers[0].mlp
    gen = torch.Generator().manual_seed(3)
    r = torch.randn(cfg.d_model, generator=gen)
    r = r / r.norm()
    h = torch.randn(8, 16, cfg.d_model, generator=gen) + 2.0 * r  # varied tokens sharing a direction …
    with torch.no_grad():
        moe.router.weight.copy_(0.3 * torch.randn(8, cfg.d_model, generator=gen))
        moe.router.weight[0] += 1.5 * r  # … that expert 0 prefers: a skewed router
    history = []
    for _ in range(40):
        with torch.no_grad():
            moe(h)
        history.append(moe_step_end(model, metrics=True)["moe/L0/max_load"])
    late = sum(history[-10:]) / 10
    assert history[0] > 1.6 and late < 0.85 * history[0], history
    assert moe.expert_bias[0] < 0 and moe.tokens_per_expert.sum() == 0  # counters reset after each step


def test_bias_and_counters_survive_a_checkpoint_bit_for_bit(tmp_path):
    cfg = moe_cfg("unified", balance="bias")
    model = build_model(cfg)
    with torch.no_grad():
        for _, moe in model.moe_layers():
            moe.expert_bias.copy_(torch.randn(8) * 1e-3)
            moe.tokens_per_expert.copy_(torch.arange(8) * 7)
    save_checkpoint(tmp_path, 1, model, None, {"step": 1}, keep=1)
    fresh = build_model(cfg, seed=5)
    load_checkpoint(tmp_path, fresh, None)
    for (_, a), (_, b) in zip(model.moe_layers(), fresh.moe_layers()):
        assert torch.equal(a.expert_bias, b.expert_bias) and torch.equal(a.tokens_per_expert, b.tokens_per_expert)
    for (n, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p, q), n


# ----------------------------------------------------------------------------------- presets, folding, roles

@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_a_step(preset):
    model = build_model(moe_cfg(preset))
    opt = build_optimizer(model, model.param_roles(), OptimConfig(name="muon"))
    loss = torch.nn.functional.cross_entropy(model(TOKENS).flatten(0, 1), TOKENS.roll(-1, 1).flatten())
    (loss + model.aux_loss()).backward()
    assert all(p.grad is not None for p in model.parameters())
    opt.step()
    assert torch.isfinite(model(TOKENS)).all()


@pytest.mark.parametrize("preset", FOLDABLE + ["dp_router"])
def test_folding_gives_a_plain_llama_moe(preset):
    cfg = moe_cfg("hg_dp" if preset == "dp_router" else preset, shared_gate=True)
    if preset == "dp_router":  # the router takes the output side too
        cfg = replace(cfg, scale=replace(cfg.scale, router=True, reparam="er"))
    model = build_model(cfg, dtype=torch.float64)
    randomize_vectors(model)
    plain = build_model(plain_config(cfg), seed=9, dtype=torch.float64)
    plain.load_state_dict(folded_state_dict(model))
    assert plain.cfg.moe == cfg.moe and plain.cfg.scale == ScaleConfig()
    with torch.no_grad():
        ref, out = model(TOKENS), plain(TOKENS)
    assert ((out - ref).norm() / ref.norm()).item() <= 1e-10  # float64: as tests/test_model.py's folding test


@pytest.mark.parametrize("preset", ["hg_dnp", "unified"])
def test_folding_refuses_dnp(preset):
    with pytest.raises(ValueError, match="inner Norm"):
        folded_state_dict(build_model(moe_cfg(preset)))


def test_roles_and_vector_placement():
    model = meta(replace(moe_cfg("unified"), scale=ScaleConfig(heterogeneous=True, placement="dnp", reparam="or",
                                                              lm_head=True, router=True)))
    roles = model.param_roles()
    p = "layers.0.mlp."
    assert roles[f"{p}gate_proj.weight"] == roles[f"{p}down_proj.weight"] == Role.EXPERT_MATRIX
    assert roles[f"{p}router.weight"] == Role.ROUTER and roles[f"{p}shared_expert.up_proj.weight"] == Role.MATRIX
    assert roles[f"{p}gate_proj.in_scale.alpha"] == roles[f"{p}router.in_scale.beta"] == Role.SCALE_INPUT
    assert roles[f"{p}gate_proj.out_scale.alpha"] == roles[f"{p}router.out_scale.alpha"] == Role.SCALE_OUTPUT
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes[f"{p}gate_proj.in_scale.alpha"] == (32,)  # one v per branch kind, shared by the experts
    assert shapes[f"{p}gate_proj.out_scale.alpha"] == (8, 21)  # one u per expert, logical width
    assert shapes[f"{p}gate_proj.out_scale.beta"] == (8, 1)
    assert shapes[f"{p}router.out_scale.alpha"] == (8,)
    assert "layers.0.ffn_norm.scale.weight" not in shapes  # HG: no shared γ


def test_router_knob_is_refused_where_it_means_nothing():
    from strictconfig.config import ConfigError
    with pytest.raises(ConfigError, match="scale.router"):
        load_config(["configs/tiny_cpu.yaml"], ["model.scale.router=true"])
    with pytest.raises(ConfigError, match="moe.top_k"):
        load_config(["configs/tiny_moe.yaml"], ["model.moe.top_k=17"])
    with pytest.raises(ConfigError, match="did you mean model.moe.n_experts"):
        load_config(["configs/tiny_moe.yaml"], ["model.moe.n_expert=4"])


def test_muon_orthogonalizes_each_expert_with_its_own_scale():
    """A stacked (E, F, d) weight gets E independent Newton–Schulz updates, each scaled by 0.2·√max(F, d) with F the
    logical hidden size (21), not the stored one (64)."""
    from optim.muon import update_scale, zeropower_via_newtonschulz
    model = build_model(moe_cfg("baseline"))
    opt = build_optimizer(model, model.param_roles(),
                          OptimConfig(name="muon", lr=0.1, weight_decay=0.0, muon=MuonConfig(ns_dtype="float32",
                                                                                          nesterov=False)))
    w = model.layers[0].mlp.gate_proj.weight
    assert any(w is q for g in opt.param_groups if g["kind"] == "muon" for q in g["params"])
    before = w.detach().clone()
    model(TOKENS).pow(2).mean().backward()
    grad = w.grad.detach().clone()
    opt.step()
    assert w.shape == (8, 64, 32) and model.logical_shapes()["layers.0.mlp.gate_proj.weight"] == (8, 21, 32)
    for e in range(w.shape[0]):
        update = 0.1 * 0.2 * 32 ** 0.5 * zeropower_via_newtonschulz(  # per expert: max(21, 32)
            0.05 * grad[e], dtype=torch.float32)
        # Newton–Schulz in float32, batched over the stack here and one matrix there: 5 iterations × 3 products
        # of K ≤ 64 terms, ≤ 15·K·u₃₂ of the update (≈ 6e-5), and the subtraction's rounding (u₃₂ of W); the stored
        # width's scale 0.2·√64 instead would be 41 % of the update off
        err = (w[e].detach() - (before[e] - update)).abs().max()
        assert err <= 15 * 64 * 2**-24 * update.abs().max() + 2 * 2**-24 * before[e].abs().max(), (e, err)
    assert update_scale((8, 21, 32), "moonlight") == 0.2 * 32 ** 0.5 != update_scale(w.shape, "moonlight")


@pytest.mark.gpu
def test_grouped_gemm_matches_loop_on_cuda_bf16():
    """Forward and backward: the grouped GEMM's backward (the transposed layouts, per-expert weight gradients from
    uneven row groups) runs nowhere else in the GPU check but eager in its moe-gemm part."""
    cfg = moe_cfg("unified", impl="loop")
    loop = build_model(cfg, device="cuda", dtype=torch.bfloat16)
    grouped = build_model(replace(cfg, moe=replace(cfg.moe, impl="auto")), device="cuda", dtype=torch.bfloat16)
    grouped.load_state_dict(loop.state_dict())
    tokens = TOKENS.cuda()
    assert grouped.layers[0].mlp.uses_grouped(torch.zeros(1, device="cuda", dtype=torch.bfloat16))
    outs, grads = [], []
    for m in (loop, grouped):
        out = m(tokens).float()
        (out.pow(2).mean() + m.layers[0].mlp.balance_loss).backward()
        outs.append(out)
        grads.append([p.grad.float() for p in m.parameters()])
    # bf16 (u = 2⁻⁸): the two paths round at different points, a few roundings per chain (the compiled test's
    # reasoning above): 2e-2 normwise for the logits and the gradients, with DNP's near-zero gradients under a floor
    assert ((outs[0] - outs[1]).norm() / outs[0].norm()).item() < 2e-2
    floor = 1e-3 * max(g.norm().item() for g in grads[0])
    for (name, _), a, b in zip(loop.named_parameters(), *grads):
        assert (a - b).norm().item() < 2e-2 * a.norm().item() + floor, name


def test_grouped_path_compiles_as_one_graph():
    """fullgraph=True fails on any graph break, so this proves the grouped path never reads a value on the host
    (no .item(), no .tolist(): no device sync); compiled and eager agree, gradients included. In bf16, as on a GPU
    (the grouped GEMM's compile-time check insists on it)."""
    cfg = moe_cfg("unified", impl="grouped")
    eager = build_model(cfg, dtype=torch.bfloat16).layers[0].mlp
    compiled = build_model(cfg, dtype=torch.bfloat16).layers[0].mlp
    compiled.compile(fullgraph=True)
    h = torch.randn(2, 13, cfg.d_model, dtype=torch.bfloat16)
    outs, grads = [], []
    for m in (eager, compiled):
        x = h.clone().requires_grad_()
        out = m(x)
        (out.float().pow(2).mean() + m.balance_loss).backward()
        outs.append(out.float())
        grads.append([x.grad.float(), *(p.grad.float() for p in m.parameters())])
    assert torch.equal(eager.tokens_per_expert, compiled.tokens_per_expert)  # the same routing
    # bf16 (u = 2⁻⁸ ≈ 3.9e-3): inductor keeps fp32 between ops that eager rounds to bf16, a few roundings per path:
    # normwise ≈ u; 1e-2 (≈ 2.6·u) for the output, 2e-2 for gradients (one more chain), measured ≈ 0.3 of either
    assert ((outs[0] - outs[1]).norm() / outs[0].norm()).item() < 1e-2
    floor = 1e-3 * max(a.norm().item() for a in grads[0])  # DNP makes some gradients 0 up to bf16 noise
    for (name, _), a, b in zip([("h", None), *eager.named_parameters()], *grads):
        assert (a - b).norm().item() < 2e-2 * a.norm().item() + floor, name


@pytest.mark.parametrize("rows_per_expert", [1, 9])  # few rows: the activations are scaled; many: the weight stack
@pytest.mark.parametrize("inner", [False, True])
def test_expert_branch_either_side_equals_the_formula(rows_per_expert, inner):
    """y_r = u_e ⊙ post(W_e (v ⊙ x_r)) for a row r of expert e, whichever side ExpertBranch scales; values and
    gradients in fp64, with padded rows (d_out 5 → 8)."""
    from model.config import Role
    from model.moe import loop_matmul
    from model.scaling import ExpertBranch, Norm
    from model.vectors import ScaleVector
    E, d_in, d_out, pad = 3, 4, 5, 8
    br = ExpertBranch(E, d_in, d_out, pad, in_scale=ScaleVector(d_in, "or", Role.SCALE_INPUT),
                      inner=Norm(pad, 1e-6, None, logical=d_out) if inner else None,
                      out_scale=ScaleVector(d_out, "or", Role.SCALE_OUTPUT, count=E)).double()
    with torch.no_grad():
        br.weight.normal_()
        br.weight[:, d_out:] = 0.0
        for p in [*br.in_scale.parameters(), *br.out_scale.parameters()]:
            p.uniform_(0.5, 1.5)
    counts = [rows_per_expert] * E
    expert_of_row = torch.arange(E).repeat_interleave(rows_per_expert)
    x = torch.randn(E * rows_per_expert, d_in, dtype=torch.float64, requires_grad=True)
    got = br(x, expert_of_row, lambda a, w: loop_matmul(a, w, counts))
    ref_rows = []
    for r, e in enumerate(expert_of_row.tolist()):
        y = br.weight[e] @ (br.in_scale() * x[r])
        y = br.inner(y) if inner else y
        ref_rows.append(y * torch.nn.functional.pad(br.out_scale()[e], (0, pad - d_out)))
    ref = torch.stack(ref_rows)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)  # float64, ≤ 8-term sums: ~1e-15
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(got, [x, *br.parameters()], g),
                    torch.autograd.grad(ref, [x, *br.parameters()], g)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)  # ≤ 27-row sums with the Norm's cancellation


@pytest.mark.parametrize("preset", PRESETS)
def test_every_vector_starts_at_one(preset):
    """init sets γ = 1 for every vector (docs/paper.md §1.1), the routed experts' (E, d) stacks of u_e included: the
    matrix draw goes by role, not by shape (it once drew those stacks, and OR's (E, 1) β, from N(0, init_std²))."""
    for model in (build_model(moe_cfg(preset, n_shared=1)), build_model(_dense_twin(moe_cfg(preset)))):
        for name, sv in model.scale_vectors():
            assert torch.equal(sv(), torch.ones_like(sv())), name

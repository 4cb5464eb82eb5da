"""Every design compiles as one graph per block and one for the fused head + loss (`fullgraph=True`: a graph break
raises). Dynamo's tracing is what finds breaks; the "eager" backend skips inductor's code generation, so all
presets fit in seconds. tests/test_train.py trains with inductor itself (`train.compile=true`)."""
from dataclasses import replace

import pytest
import torch

from config import load_config
from fast import build_fast_model
from fast.head import FusedHeadLoss
from model.llama import build_model
from runtime.parallel import compile_blocks
from test_loss import bound, terms
from test_model import PRESETS, preset_model_cfg


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # each test counts its own compilations
    yield
    torch._dynamo.reset()


X, Y = torch.randint(0, 67, (2, 9), generator=torch.Generator().manual_seed(0)), torch.arange(18).view(2, 9) % 67


def compiled_step(model, dtype=torch.float32, x=X, y=Y):
    """As runtime/build.py compiles: each block, and the fast path's head chunks (the reference head stays eager)."""
    compile_blocks(model, torch.device("cpu"), dtype, backend="eager")
    if isinstance(model.loss_fn, FusedHeadLoss):
        model.loss_fn = FusedHeadLoss("eager")
    loss = model(x, y, loss_chunk=8)  # 18 tokens: chunks of 8, 8 and 2
    loss.backward()
    return loss


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_compiles_without_a_graph_break(name, fast):
    """One graph per block and per head chunk, and the compiled graphs' gradients are eager's. The "eager" backend
    runs dynamo's captured graph op for op (no AOT autograd, no fusion): the same kernels on the same inputs, so the
    loss and every gradient are eager's bit for bit, on any CPU; this is where torch 2.11 once gave exact zeros for
    every gradient through the Norm (fast/branches.py, _Norm): a check of the loss alone did not see it. Both the
    fast path and the reference model."""
    model = (build_fast_model if fast else build_model)(preset_model_cfg(name), seed=0)
    eager = model(X, Y, loss_chunk=8)
    eager.backward()
    ref = grads(model)
    model.zero_grad(set_to_none=True)
    loss = compiled_step(model)
    # The fast head with DNP's vocabulary Norm runs its chunk in two forms of the same formulas (fast/head.py): in
    # place when eager, as graphs when compiled. They agree to fp32 rounding over the 67 logits, not bit for bit
    # (each gradient to the size of its terms: test_loss.terms).
    tol = bound(torch.float32, 67) if fast and model.lm_head.inner is not None else 0.0
    assert torch.allclose(loss, eager, rtol=tol, atol=0)
    for n, g in grads(model).items():
        assert ref[n].abs().max() > 0, f"{n}: no gradient in eager"
        atol = tol * max(ref[n].abs().max(), terms(ref, n).abs().max())
        assert torch.allclose(g, ref[n], rtol=0, atol=atol), (n, (g - ref[n]).abs().max().item())


@pytest.mark.parametrize("name", ["baseline", "unified"])
def test_inductor_head_gradients_match_eager(name):
    """The fused head's chunk step compiled by inductor (as train.compile=true runs it) against the eager chunk: the
    loss, and the gradients of the head's input h and of every head parameter. In float64, so that the bound comes
    from the arithmetic and not from one CPU's float32 kernels: inductor reorders the reductions, each of K ≤ 2·64
    tokens × 32 channels = 4096 terms (OR's β sums them all), off by ≤ K·u₆₄·Σ|terms| per side (u₆₄ = 2⁻⁵³); with
    Σ|terms| up to 10³× the largest entry (cancellation), 2·K·u₆₄·10³ ≈ 1e-9 of it. A wrong gradient is off by O(1):
    under torch 2.11 before the _Norm fix (a same-dtype cast of the saved output, any dtype), all 0."""
    cfg = replace(preset_model_cfg(name), n_layers=1)
    model = build_fast_model(cfg, seed=0, dtype=torch.float64)
    h = torch.randn(2, 64, cfg.d_model, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = torch.randint(0, 67, (2, 64), generator=torch.Generator().manual_seed(4))
    out = {}
    for backend in (None, "inductor"):
        model.zero_grad(set_to_none=True)
        h_leaf = h.clone().requires_grad_(True)
        loss = FusedHeadLoss(backend)(model.norm, model.lm_head, h_leaf, y, 32)
        loss.backward()
        params = {n: p.grad.clone() for n, p in [*model.norm.named_parameters(), *model.lm_head.named_parameters()]}
        out[backend] = loss.detach(), {"h": h_leaf.grad.clone(), **params}
    (ref_loss, ref), (loss, got) = out[None], out["inductor"]
    tol = 2 * 4096 * 2**-53 * 1e3
    assert abs(loss - ref_loss) <= tol * ref_loss
    for n, g in ref.items():
        scale = g.abs().max().item()
        assert scale > 0, n
        assert (got[n] - g).abs().max() <= tol * scale, (n, (got[n] - g).abs().max().item(), scale)


@pytest.mark.parametrize("name", ["baseline", "unified"])
def test_moe_on_the_grouped_gemm_compiles_without_a_graph_break(name):
    # bf16: the grouped GEMM's compile-time check insists on it (as on a GPU)
    cfg = load_config(["configs/tiny_moe.yaml", f"configs/scale/{name}.yaml"]).model
    cfg = replace(cfg, d_model=32, n_layers=2, n_heads=4, vocab_size=67,
                  moe=replace(cfg.moe, n_experts=4, top_k=2, impl="grouped"))
    model = build_fast_model(cfg, seed=0, dtype=torch.bfloat16)
    assert torch.isfinite(compiled_step(model, torch.bfloat16))


def test_moe_on_the_loop_is_compiled_with_breaks_allowed():
    """The exact per-expert loop reads the row counts on the host (.tolist()): compile_blocks knows and does not ask
    for one graph, so an MoE model trains compiled on CPU too."""
    cfg = load_config(["configs/tiny_moe.yaml", "configs/scale/unified.yaml"]).model
    cfg = replace(cfg, d_model=32, n_layers=1, n_heads=4, vocab_size=67, moe=replace(cfg.moe, n_experts=4, top_k=2))
    model = build_model(cfg, seed=0)
    assert torch.isfinite(compiled_step(model))

"""Every design compiles as one graph per block and one for the fused head + loss (`fullgraph=True`: a graph break
raises). Dynamo's tracing is what finds breaks; the "eager" backend skips inductor's code generation, so all
presets fit in seconds. tests/test_train.py trains with inductor itself (`train.compile=true`)."""
from dataclasses import replace

import pytest
import torch

from config import load_config
from model.llama import build_model
from test_model import PRESETS, preset_model_cfg


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # each test counts its own compilations
    yield
    torch._dynamo.reset()


X, Y = torch.randint(0, 67, (2, 9), generator=torch.Generator().manual_seed(0)), torch.arange(18).view(2, 9) % 67


def compiled_step(model, dtype=torch.float32, x=X, y=Y):
    model.compile_for_training(torch.device("cpu"), dtype, backend="eager")
    loss = model(x, y, loss_chunk=8)  # 18 tokens: chunks of 8, 8 and 2
    loss.backward()
    return loss


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_compiles_without_a_graph_break(name):
    """One graph per block and per head chunk, and the compiled graphs' gradients are eager's. The "eager" backend
    runs dynamo's captured graph op for op, so values and gradients agree to fp32 rounding (the bound below is a few
    ulps of the largest entry); this is where torch 2.11 once gave exact zeros for every gradient through the Norm
    (model/scaling.py, _Norm): a check of the loss alone did not see it."""
    model = build_model(preset_model_cfg(name), seed=0)
    eager = model(X, Y, loss_chunk=8)
    eager.backward()
    ref = grads(model)
    model.zero_grad(set_to_none=True)
    loss = compiled_step(model)
    assert torch.allclose(loss, eager, rtol=1e-6)
    for n, g in grads(model).items():
        scale = ref[n].abs().max().item()
        assert scale > 0, f"{n}: no gradient in eager"
        assert torch.allclose(g, ref[n], rtol=1e-5, atol=1e-5 * scale), (n, (g - ref[n]).abs().max().item(), scale)


@pytest.mark.parametrize("name", ["baseline", "unified"])
def test_inductor_head_gradients_match_eager(name):
    """The fused head's chunk step compiled by inductor (as train.compile=true runs it) against the eager chunk: the
    loss, and the gradients of the head's input h and of every head parameter. Inductor reorders fp32 reductions
    (over the 67 logits and the 32 channels): the bound is 1e-4 relative to each gradient's largest entry, two
    orders above that rounding and far below a wrong gradient (under torch 2.11 before the _Norm fix, all 0)."""
    from model.loss import head_loss
    cfg = replace(preset_model_cfg(name), n_layers=1)
    model = build_model(cfg, seed=0)
    h = torch.randn(2, 64, cfg.d_model, generator=torch.Generator().manual_seed(3))
    y = torch.randint(0, 67, (2, 64), generator=torch.Generator().manual_seed(4))
    out = {}
    for backend in (None, "inductor"):
        model.zero_grad(set_to_none=True)
        h_leaf = h.clone().requires_grad_(True)
        loss = head_loss(model.norm, model.lm_head, h_leaf, y, 32, compiled=backend)
        loss.backward()
        params = {n: p.grad.clone() for n, p in [*model.norm.named_parameters(), *model.lm_head.named_parameters()]}
        out[backend] = loss.detach(), {"h": h_leaf.grad.clone(), **params}
    (ref_loss, ref), (loss, got) = out[None], out["inductor"]
    assert torch.allclose(loss, ref_loss, rtol=1e-6)
    for n, g in ref.items():
        scale = g.abs().max().item()
        assert scale > 0, n
        assert torch.allclose(got[n], g, rtol=1e-4, atol=1e-4 * scale), (n, (got[n] - g).abs().max().item(), scale)


@pytest.mark.parametrize("name", ["baseline", "unified"])
def test_moe_on_the_grouped_gemm_compiles_without_a_graph_break(name):
    # bf16: the grouped GEMM's compile-time check insists on it (as on a GPU)
    cfg = load_config(["configs/tiny_moe.yaml", f"configs/scale/{name}.yaml"]).model
    cfg = replace(cfg, d_model=32, n_layers=2, n_heads=4, vocab_size=67,
                  moe=replace(cfg.moe, n_experts=4, top_k=2, impl="grouped"))
    model = build_model(cfg, seed=0, dtype=torch.bfloat16)
    assert torch.isfinite(compiled_step(model, torch.bfloat16))


def test_moe_on_the_loop_is_compiled_with_breaks_allowed():
    """The exact per-expert loop reads the row counts on the host (.tolist()): compile_for_training knows and does
    not ask for one graph, so an MoE model trains compiled on CPU too."""
    cfg = load_config(["configs/tiny_moe.yaml", "configs/scale/unified.yaml"]).model
    cfg = replace(cfg, d_model=32, n_layers=1, n_heads=4, vocab_size=67, moe=replace(cfg.moe, n_experts=4, top_k=2))
    model = build_model(cfg, seed=0)
    assert torch.isfinite(compiled_step(model))

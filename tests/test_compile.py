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


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_compiles_without_a_graph_break(name):
    model = build_model(preset_model_cfg(name), seed=0)
    eager = model(X, Y, loss_chunk=8)
    loss = compiled_step(model)
    assert torch.allclose(loss, eager, rtol=1e-6)
    assert all(p.grad is not None for p in model.parameters())


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

"""The fused LM head + loss (model/loss.py) against the plain path: full logits, then cross-entropy."""
from dataclasses import replace

import pytest
import torch

from config import load_config
from model.llama import build_model
from test_model import PRESETS, preset_model_cfg


def loss_and_grads(model, x, y, chunk, scale=1.0):
    model.zero_grad(set_to_none=True)
    loss = model(x, y, loss_chunk=chunk)
    (loss * scale).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", PRESETS)
def test_fused_head_loss_equals_plain_path_fp64(name):
    # vocab 67; 3 × 7 = 21 tokens over chunks of 8: the last chunk is short (5 rows)
    model = build_model(preset_model_cfg(name), seed=1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 67, (3, 7), generator=gen) for _ in range(2))
    ref_loss, ref = loss_and_grads(model, x, y, chunk=0)
    loss, grads = loss_and_grads(model, x, y, chunk=8, scale=0.25)  # the incoming gradient is carried through
    assert torch.allclose(loss, ref_loss, rtol=0, atol=1e-12)
    assert ref_loss.dtype == loss.dtype == torch.float64
    for n, g in ref.items():
        assert torch.allclose(grads[n], 0.25 * g, rtol=1e-9, atol=1e-14), n
    # the plain path is the logits path: model(x) is unchanged for sampling, eval and export
    logits = model(x)
    assert logits.shape == (3, 7, model.cfg.padded_vocab)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    assert torch.allclose(ref_loss, expected, rtol=0, atol=1e-12)


def test_fused_head_loss_moe_and_one_chunk_per_row():
    cfg = load_config(["configs/tiny_moe.yaml", "configs/scale/unified.yaml"]).model
    cfg = replace(cfg, d_model=32, n_layers=2, n_heads=4, vocab_size=50, moe=replace(cfg.moe, n_experts=4, top_k=2))
    model = build_model(cfg, seed=2, dtype=torch.float64)
    x, y = torch.randint(0, 50, (2, 5)), torch.randint(0, 50, (2, 5))
    ref_loss, ref = loss_and_grads(model, x, y, chunk=0)
    for chunk in (1, 3, 10, 64):  # a row per chunk, uneven chunks, exactly all rows, more than all rows
        loss, grads = loss_and_grads(model, x, y, chunk)
        assert torch.allclose(loss, ref_loss, rtol=0, atol=1e-12)
        assert all(torch.allclose(grads[n], g, rtol=1e-9, atol=1e-14) for n, g in ref.items())


def test_fused_head_never_materializes_more_than_one_chunk_of_logits():
    model = build_model(preset_model_cfg("unified"), seed=0)
    rows = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: rows.append(out.shape[0]))
    x, y = torch.randint(0, 67, (4, 16)), torch.randint(0, 67, (4, 16))
    model(x, y, loss_chunk=16).backward()
    assert rows == [16] * 4  # four chunks of 16 rows, each run once: no full-logits pass, no recomputation
    rows.clear()
    with torch.no_grad():  # evaluation: the same chunks, without gradients
        no_grad = model(x, y, loss_chunk=16)
    assert rows == [16] * 4 and not no_grad.requires_grad
    assert torch.allclose(no_grad, model(x, y, loss_chunk=0), rtol=1e-6, atol=0)


def test_fused_head_in_fp32_matches_to_rounding():
    model = build_model(preset_model_cfg("unified", vocab_size=1000), seed=3)
    x, y = torch.randint(0, 1000, (4, 33)), torch.randint(0, 1000, (4, 33))
    ref_loss, ref = loss_and_grads(model, x, y, chunk=0)
    loss, grads = loss_and_grads(model, x, y, chunk=40)
    assert torch.allclose(loss, ref_loss, rtol=1e-6)
    for n, g in ref.items():
        assert torch.allclose(grads[n], g, rtol=1e-4, atol=1e-7 * g.abs().max().item()), n


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["baseline", "unified"])
def test_fused_head_compiled_on_cuda_bf16_matches_the_plain_path(name):
    """The GPU training path: compiled blocks and compiled fused head in bf16, against full logits in the same model."""
    model = build_model(preset_model_cfg(name, vocab_size=1000), device="cuda", seed=4, dtype=torch.bfloat16)
    x, y = (torch.randint(0, 1000, (4, 64), device="cuda") for _ in range(2))
    ref_loss, ref = loss_and_grads(model, x, y, chunk=0)
    model.compile_for_training(torch.device("cuda"), torch.bfloat16)
    loss, grads = loss_and_grads(model, x, y, chunk=96)  # 256 tokens: chunks of 96, 96 and 64
    assert abs(loss.item() - ref_loss.item()) < 2e-2 * ref_loss.item()
    for n, g in ref.items():
        assert ((grads[n].float() - g.float()).norm() / g.float().norm().clamp_min(1e-12)).item() < 5e-2, n

"""Our Llama equals transformers' LlamaForCausalLM on the exported directory (MHA and GQA, folded designs too)."""

import pytest
import torch

from model.config import ModelConfig, ScaleConfig
from runtime.hf_export import export
from model.llama import build_model
from scripts import export_hf

import transformers  # noqa: E402  (a declared dependency in requirements.txt)


@pytest.mark.parametrize("n_kv_heads, scale", [
    (None, ScaleConfig()),
    (2, ScaleConfig()),
    (2, ScaleConfig(heterogeneous=True, placement="dp", reparam="or", lm_head=True)),
])
def test_transformers_llama_matches(tmp_path, n_kv_heads, scale):
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, vocab_size=128, scale=scale)
    model = build_model(cfg, seed=5)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-trivial vectors so a mis-mapped norm or a missing fold shows
        for _, sv in model.scale_vectors():
            for p in sv.parameters():
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    export(model, tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float32).eval()
    tokens = torch.randint(0, 128, (2, 17), generator=gen)
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    # both float32, the same math in other kernels: ≤ K·ε per reduction, K ≤ 192 (the padded FFN hidden; d 64, vocab
    # 128, 17 tokens), 8 chained (tests/test_ffn_padding.py's tolerance): 8·K·ε ≈ 1.8e-4 normwise. A mis-mapped
    # norm or a missing fold (vectors drawn in 0.5–1.5) is O(1e-1).
    assert ((ours - theirs).norm() / ours.norm()).item() <= 8 * 192 * torch.finfo(torch.float32).eps


def test_cli_refuses_dnp(tmp_path, capsys):
    code = export_hf.main(["--config", "configs/dense_0.12b_unified.yaml", "--out", str(tmp_path / "x")])
    assert code == 2 and "cannot be exported" in capsys.readouterr().err

"""bench/profile.py: where a step's time goes, by category and by op, one design beside another
(`scripts.bench --profile`)."""
import json

import torch

from bench import profile
from scripts import bench
from test_bench import TINY


def test_categories_of_the_kernels_and_ops_a_step_runs():
    assert profile.category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn") == "matmul"
    assert profile.category("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN") == "matmul"
    assert profile.category("aten::mm") == "matmul"
    assert profile.category("pytorch_flash::flash_bwd_dq_dk_dv_loop_kernel") == "attention"
    assert profile.category("triton_red_fused__to_copy_mul_rsqrt_sum_1") == "compiled fused"
    assert profile.category("compiled graphs (inductor, CPU)") == "compiled fused"
    assert profile.category("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert profile.category("Memcpy DtoD (Device -> Device)") == "copy / fill"
    assert profile.category("void at::native::vectorized_elementwise_kernel<4, AUnaryFunctor>") == profile.OTHER


def test_a_design_that_does_more_shows_where(tmp_path):
    """Two "designs" on the same input: the second adds an elementwise tail. The report charges the difference to
    that op and its category, the per-step numbers divide by the steps, and every op is in the JSON beside it."""
    a = torch.randn(192, 192)

    def plain():
        return (a @ a).sum().item()

    def more():
        b = a @ a
        for _ in range(20):
            b = torch.sigmoid(b)
        return b.sum().item()

    p0 = profile.profile_step("plain", plain, 3, torch.device("cpu"))
    p1 = profile.profile_step("more", more, 3, torch.device("cpu"))
    calls = {o.name: o.calls_per_step for o in p1.ops}
    assert calls["aten::mm"] == 1 and calls["aten::sigmoid"] == 20  # per step, not over the 3
    assert "aten::sigmoid" not in {o.name for o in p0.ops}
    assert p1.by_category()[profile.OTHER] > p0.by_category()[profile.OTHER]
    assert 0 < p0.busy_ms_per_step <= p0.wall_ms_per_step * torch.get_num_threads()
    path = tmp_path / "prof.md"
    profile.write_profiles(path, [p0, p1])
    text = path.read_text()
    assert "| category | plain | more (Δ) |" in text and "more − plain" in text
    diff_rows = text.split("more − plain")[1].split("Largest ops")[0]
    assert "`aten::sigmoid` | other elementwise | 0.000 |" in diff_rows
    ops = json.loads(path.with_suffix(".json").read_text())
    assert [p["design"] for p in ops] == ["plain", "more"] and ops[1]["busy_ms_per_step"] > 0


def test_bench_profile_writes_the_report_of_every_design(tmp_path, capsys):
    out = tmp_path / "p" / "profile.md"
    assert bench.main([*TINY, "--presets", "baseline", "hg_dnp", "--no-hf-reference", "--no-memory",
                       "--profile", str(out), "--profile-steps", "1"]) == 0
    text = out.read_text()
    assert "| category | baseline | hg_dnp (Δ) |" in text and "Largest ops of hg_dnp" in text
    assert "| wall |" in text and "| busy (sum) |" in text
    assert [p["design"] for p in json.loads(out.with_suffix(".json").read_text())] == ["baseline", "hg_dnp"]

"""The user-facing scripts that need no trained run: inspect_model and bench."""
import json

from runtime.cpu import tune_glibc_malloc
from scripts import bench, inspect_model


def test_inspect_model_json(capsys):
    assert inspect_model.main(["--config", "configs/dense_0.12b_unified.yaml", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    # the paper's 0.11985B (docs/paper.md §5) less the 31 magnitudes only an inner Norm reads (6 layers × 5 branches
    # and the LM head), which configs/scale/unified.yaml removes
    assert info["total_params"] == 119_846_846 - 31
    assert info["non_embedding_params"] == 119_846_846 - 31 - 50304 * 768
    assert info["scale_params"] == info["by_role"]["scale_input"] + info["by_role"]["scale_output"] == \
        102_590 + 9_984 - 31
    assert info["flops_per_token"] > 6 * info["non_embedding_params"]


def test_inspect_model_bad_key(capsys):
    assert inspect_model.main(["--config", "configs/tiny_cpu.yaml", "model.d_modle=3"]) == 2
    assert "did you mean model.d_model" in capsys.readouterr().err


def test_bench_prints_every_design(capsys):
    argv = ["--presets", "baseline", "unified", "--steps", "2", "--warmup", "1", "--vocab-size", "128",
            "--micro-batch", "2", "--seq-len", "16", "--device", "cpu",
            "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "train.compile=false", "train.dtype=float32",
            "--no-hf-reference",
            "--no-memory", "--no-footprint"]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"baseline", "unified"} and rows["baseline"][-2] == "1.000"  # time ×
    assert float(rows["unified"][3]) > 0  # ms/step measured


def test_bench_compares_models(capsys):
    """--models: an MoE against the dense model of its activated size, each with its own overrides."""
    argv = ["--models", "configs/tiny_moe.yaml model.moe.n_experts=4 model.moe.top_k=2",
            "configs/tiny_cpu.yaml model.d_ffn=64", "--presets", "baseline", "--steps", "2", "--warmup", "1",
            "--no-memory", "--no-footprint", "--vocab-size", "128", "--micro-batch", "2", "--seq-len", "16",
            "--device", "cpu",
            "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "train.compile=false",
            "train.dtype=float32"]
    assert bench.main(argv) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    moe, dense = rows["tiny_moe[n_experts=4][top_k=2]/baseline"], rows["tiny_cpu[d_ffn=64]/baseline"]
    assert int(moe[1].replace(",", "")) > int(moe[2].replace(",", ""))  # total > activated
    assert dense[1] == dense[2] and float(dense[3]) > 0


def test_malloc_tuning_applies_on_linux():
    assert tune_glibc_malloc()  # this project's machines are Linux with glibc

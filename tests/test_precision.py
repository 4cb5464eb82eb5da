"""train.dtype / train.compile: auto choose from the hardware (runtime/precision.py): bf16 only where the CPU has bf16
arithmetic, compile on CPU only in bf16; an explicit setting is obeyed; a resume onto a CPU that resolves auto
differently continues and says so."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import runtime.precision as precision_mod
import train
from runtime.precision import CpuArithmetic, resolve_precision
from test_train import args_for, data_dir, records  # noqa: F401 - data_dir is a fixture

CPU = torch.device("cpu")
AVX2 = CpuArithmetic("AVX2", amx=False, avx512_bf16=False)  # AMD EPYC (Zen 2/3)
AVX512 = CpuArithmetic("AVX512", amx=False, avx512_bf16=False)  # Skylake/Cascade Lake Xeon: bf16 emulated
ZEN4 = CpuArithmetic("AVX512", amx=False, avx512_bf16=True)  # AMD EPYC (Zen 4)
SAPPHIRE = CpuArithmetic("AVX512", amx=True, avx512_bf16=True)  # Intel Xeon with AMX
CAPPED = CpuArithmetic("AVX2", amx=True, avx512_bf16=True)  # an AMX Xeon under ATEN_CPU_CAPABILITY=avx2


@pytest.mark.parametrize("cpu, dtype, compiled, words", [
    (AVX2, torch.float32, False, "no bf16 arithmetic: AVX2"),
    (AVX512, torch.float32, False, "no bf16 arithmetic: AVX512"),
    (CAPPED, torch.float32, False, "no bf16 arithmetic: AVX2"),
    (ZEN4, torch.bfloat16, True, "has bf16 arithmetic: AVX512 with AVX512-BF16"),
    (SAPPHIRE, torch.bfloat16, True, "has bf16 arithmetic: AMX"),
])
def test_auto_on_cpu_is_bf16_only_with_bf16_arithmetic(cpu, dtype, compiled, words):
    p = resolve_precision("auto", "auto", CPU, cpu)
    assert (p.dtype, p.compile) == (dtype, compiled) and words in p.reason
    assert p.describe().startswith(f"precision: {'bf16 mixed' if dtype == torch.bfloat16 else 'fp32, eager'}")


def test_auto_on_cuda_is_compiled_bf16():
    p = resolve_precision("auto", "auto", torch.device("cuda"), AVX2)
    assert (p.dtype, p.compile, p.reason) == (torch.bfloat16, True, "auto on CUDA")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("cpu", [AVX2, SAPPHIRE])
def test_an_explicit_setting_is_obeyed_on_every_cpu(dtype, cpu):
    for compile_setting in (True, False):
        p = resolve_precision(dtype, compile_setting, CPU, cpu)
        assert (p.dtype, p.compile, p.reason) == (getattr(torch, dtype), compile_setting, f"train.dtype={dtype}")
    # compile auto follows the dtype: on CPU only bf16 compiles
    assert resolve_precision(dtype, "auto", CPU, cpu).compile == (dtype == "bfloat16")


def test_this_cpu_is_read_from_torch_and_a_capped_capability_means_fp32():
    """ATEN_CPU_CAPABILITY=avx2 caps ATen's kernels at AVX2 (no bf16 instructions) on any x86 CPU: auto is fp32."""
    code = ("import torch; from runtime.precision import cpu_arithmetic, resolve_precision; "
            "c = cpu_arithmetic(); p = resolve_precision('auto', 'auto', torch.device('cpu')); "
            "print(c.capability, c.has_bf16, p.dtype, p.compile)")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "PYTHONPATH": "."}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AVX2", "False", "torch.float32", "False"]
    here = precision_mod.cpu_arithmetic()  # this machine, as torch sees it: consistent with its capability
    assert here.has_bf16 == ((here.amx or here.avx512_bf16) and here.capability.startswith("AVX512"))


def test_a_resume_onto_a_cpu_without_bf16_continues_and_says_so(data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The checkpoint of an auto run in bf16 (a CPU with bf16 arithmetic) resumes on one without: allowed — fp32 master
    weights and optimizer state either way — with the change in the resume line and in every train record."""
    argv = args_for(data_dir, tmp_path, "moved", "train.steps=4", "train.dtype=auto", "train.compile=false",
                    "schedule.warmup_steps=1")
    monkeypatch.setattr(precision_mod, "cpu_arithmetic", lambda: SAPPHIRE)
    train.main([*argv, "--stop-at-step", "2"])
    first = capsys.readouterr().out
    assert "precision: bf16 mixed (fp32 master weights), eager (auto: this CPU has bf16 arithmetic: AMX)" in first
    monkeypatch.setattr(precision_mod, "cpu_arithmetic", lambda: AVX2)
    result = train.main(argv)
    second = capsys.readouterr().out
    assert "precision: fp32, eager (auto: this CPU has no bf16 arithmetic: AVX2)" in second
    assert ("resumed from" in second and "at step 2 (trained in bfloat16 until now, float32 from here on: auto: this "
            "CPU has no bf16 arithmetic: AVX2; the master weights and optimizer state are fp32 in both)" in second)
    assert result["step"] == 4
    recs = records(tmp_path / "moved", "train")
    assert [(r["step"], r["dtype"]) for r in recs] == [(1, "bfloat16"), (2, "bfloat16"), (3, "float32"),
                                                       (4, "float32")]


def test_an_explicit_dtype_change_on_resume_is_still_refused(data_dir, tmp_path):  # noqa: F811
    from strictconfig.config import ConfigError
    argv = args_for(data_dir, tmp_path, "pinned", "train.steps=2", "schedule.warmup_steps=1")
    train.main(argv)
    with pytest.raises(ConfigError, match=r"train\.dtype: 'float32' in the checkpoint, 'bfloat16' now"):
        train.main([*argv, "train.dtype=bfloat16"])

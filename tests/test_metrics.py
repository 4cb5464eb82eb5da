"""MFU arithmetic, the peak-FLOPs table, and the windowed throughput meter."""
from __future__ import annotations

import pytest
import torch

from runtime.metrics import Throughput, mfu, peak_flops, peak_flops_for_name


def test_mfu_arithmetic() -> None:
    # 6·N FLOPs/token for N = 124M at 400k tok/s over 8 GPUs of 989 TFLOP/s peak.
    got = mfu(6 * 124e6, 400_000, 8, 989e12)
    assert got == pytest.approx(6 * 124e6 * 4e5 / (8 * 989e12))
    assert mfu(1e9, 312e3, 1, 312e12) == pytest.approx(1.0)  # exactly at the peak
    assert mfu(1e9, 1e3, 1, None) is None
    assert mfu(1e9, 1e3, 0, 1e12) is None


def test_peak_flops() -> None:
    assert peak_flops(torch.device("cpu")) is None
    assert peak_flops_for_name("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for_name("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_for_name("NVIDIA H100 NVL") == 835e12
    assert peak_flops_for_name("NVIDIA H200") == 989e12
    assert peak_flops_for_name("NVIDIA H200 NVL") == 835e12
    assert peak_flops_for_name("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for_name("NVIDIA A100 80GB PCIe") == 312e12
    assert peak_flops_for_name("NVIDIA L40S") == 362e12
    assert peak_flops_for_name("NVIDIA GeForce GTX 1080") is None


def test_throughput_skips_warmup_and_uses_a_window() -> None:
    meter = Throughput(window=3, warmup=2)
    assert meter.step(100, now=0.0) is None  # compile step: 10 s, must not count
    assert meter.step(100, now=10.0) is None
    assert meter.step(100, now=11.0) == pytest.approx(100.0)
    assert meter.step(100, now=12.0) == pytest.approx(100.0)
    assert meter.step(300, now=13.0) == pytest.approx(500 / 3)
    assert meter.step(300, now=14.0) == pytest.approx(700 / 3)  # window: the last 3 steps only
    meter.restart(now=100.0)  # an eval pause
    assert meter.tokens_per_s is None
    assert meter.step(200, now=101.0) == pytest.approx(200.0)
    with pytest.raises(ValueError):
        Throughput(window=0)

"""MFU arithmetic, the peak-FLOPs table, and the windowed throughput meter."""
from __future__ import annotations

import pytest
import torch

from runtime.metrics import mfu, peak_flops, peak_flops_for_name


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



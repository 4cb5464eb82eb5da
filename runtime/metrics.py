"""Model FLOPs utilization (MFU) and the peaks it divides by.

MFU = achieved model FLOP/s ÷ the hardware's dense peak (PaLM, Chowdhery et al. 2022, App. B). The model
supplies FLOPs per token (forward + backward, ≈ 6·N plus attention); we supply the peak and the arithmetic.
"""
from __future__ import annotations

import re
from typing import Optional

import torch

# Dense (no 2:4 sparsity) BF16 tensor-core peaks. Vendor sheets print the sparse figure with an asterisk;
# the dense one is half of it. The first pattern that matches `torch.cuda.get_device_name()` wins.
_PEAK_BF16: list[tuple[str, float]] = [
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): BF16 1,979 / 1,513 / 1,671 TFLOPS with sparsity
    # for SXM / PCIe / NVL.
    (r"H100.*PCIE", 756e12),
    (r"H100.*NVL", 835e12),
    (r"H100", 989e12),  # SXM, e.g. "NVIDIA H100 80GB HBM3"
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): BF16 1,979 / 1,671 TFLOPS with sparsity for SXM /
    # NVL; GH200 (Grace Hopper) uses the same Hopper GPU.
    (r"H200.*NVL", 835e12),
    (r"H200", 989e12),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): BF16 312 TFLOPS dense, SXM and PCIe alike.
    (r"A100", 312e12),
    # NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 with sparsity).
    (r"L40S", 362e12),
]


def peak_flops_for_name(name: str) -> Optional[float]:
    """Dense BF16 peak FLOP/s for a CUDA device name, or None when the GPU is not in the table."""
    upper = name.upper()
    for pattern, flops in _PEAK_BF16:
        if re.search(pattern, upper):
            return flops
    return None


def peak_flops(device: torch.device) -> Optional[float]:
    """Dense BF16 peak FLOP/s of `device`; None on CPU or an unknown GPU (then MFU is simply not reported)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        return peak_flops_for_name(torch.cuda.get_device_name(device))
    except (RuntimeError, AssertionError):
        return None


def mfu(flops_per_token: float, tokens_per_s: float, n_devices: int, peak: Optional[float]) -> Optional[float]:
    """Fraction of the peak used: flops_per_token · tokens_per_s / (n_devices · peak).

    `tokens_per_s` is the global rate (all ranks); `flops_per_token` counts forward + backward.
    """
    if peak is None or peak <= 0 or n_devices <= 0 or tokens_per_s is None:
        return None
    return flops_per_token * tokens_per_s / (n_devices * peak)



"""Throughput and model FLOPs utilization (MFU).

MFU = achieved model FLOP/s ÷ the hardware's dense peak (PaLM, Chowdhery et al. 2022, App. B). The model
supplies FLOPs per token (forward + backward, ≈ 6·N plus attention); we supply the peak and the arithmetic.
"""
from __future__ import annotations

import re
import time
from collections import deque
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


class Throughput:
    """Tokens/s over the last `window` steps, ignoring the first `warmup` steps (torch.compile, allocator warmup).

    Call `step(tokens)` once per optimizer step, after something that waits for the device (e.g. `loss.item()`),
    so wall time is real. Call `restart()` after a pause that is not training (eval, checkpoint) so the pause
    does not count as a slow step.
    """

    def __init__(self, window: int = 20, warmup: int = 2) -> None:
        if window < 1 or warmup < 0:
            raise ValueError(f"window={window} must be ≥ 1 and warmup={warmup} ≥ 0")
        self.window, self.warmup = window, warmup
        self._steps = 0
        self._tokens = 0  # cumulative tokens since the last mark
        self._marks: deque[tuple[float, int]] = deque(maxlen=window + 1)  # (time, cumulative tokens)

    def step(self, tokens: int, now: Optional[float] = None) -> Optional[float]:
        """Record one step of `tokens` tokens ending now; return the current rate (None while warming up)."""
        now = time.perf_counter() if now is None else now
        self._steps += 1
        if self._steps <= self.warmup or not self._marks:
            # The end of the last warmup step is where measured time starts.
            self._marks.clear()
            self._marks.append((now, self._tokens))
            return None
        self._tokens += tokens
        self._marks.append((now, self._tokens))
        return self.tokens_per_s

    def restart(self, now: Optional[float] = None) -> None:
        """Start a new window at `now`: what happened since the last step (eval, checkpoint) is not counted."""
        self._marks.clear()
        self._marks.append((time.perf_counter() if now is None else now, self._tokens))

    @property
    def tokens_per_s(self) -> Optional[float]:
        if len(self._marks) < 2:
            return None
        (t0, n0), (t1, n1) = self._marks[0], self._marks[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

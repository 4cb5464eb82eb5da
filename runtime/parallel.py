"""FSDP2 wrapping: one `fully_shard` per block and one at the root (torchtitan's layout), with bf16 parameters and
fp32 gradient reduction when mixed precision is on."""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from model.llama import Llama


def resolve_dtype(setting: str, device: torch.device) -> torch.dtype:
    """auto: bf16 mixed precision on CUDA, fp32 on CPU (bf16 on CPU only when asked)."""
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, setting)


def shard_model(model: Llama, compute_dtype: torch.dtype, device: torch.device) -> Llama:
    """Shard a meta-device model in place. Parameters stay fp32 (the optimizer's master copy); FSDP2 casts them to
    bf16 for forward/backward and reduces gradients in fp32. float64 (reference runs) keeps everything in double."""
    mp: Optional[MixedPrecisionPolicy] = None
    if compute_dtype == torch.float64:
        model.to(torch.float64)
    elif compute_dtype != torch.float32:
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    # An explicit mesh on the run's device type: FSDP2's default mesh follows the accelerator whenever one
    # exists, which would put a train.device=cpu run (gloo) on a CUDA mesh.
    kwargs = {"mesh": init_device_mesh(device.type, (dist.get_world_size(),))}
    if mp is not None:
        kwargs["mp_policy"] = mp
    for i, block in enumerate(model.layers):
        # The last block's parameters are needed again at once by backward: keep them gathered after forward.
        fully_shard(block, reshard_after_forward=i < len(model.layers) - 1, **kwargs)
    fully_shard(model, **kwargs)
    return model

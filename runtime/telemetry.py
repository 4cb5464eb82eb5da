"""Scale-vector telemetry at each eval: per role and layer, mean / std / min / max of the effective vectors γ; the
magnitude of every input-side vector (OR's β, signed; ER's e^β; a direct vector's RMS), one key per vector, whose
trajectory under DNP and IWD is a question of its own (the inner Norm cancels it, so only decay moves it); and the
Frobenius norms of W_q, W_k, W_v (docs/paper.md Fig. 4). Every rank must call it (sharded parameters are gathered)."""
from __future__ import annotations

from collections import defaultdict

import torch
from torch.distributed.tensor import DTensor

from model.config import Role
from model.llama import Llama


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _layer_of(name: str) -> str:
    """`layers.3.attn.q_proj.in_scale` → L3; the final norm and LM head → head."""
    parts = name.split(".")
    return f"L{parts[1]}" if parts[0] == "layers" else "head"


def _site(name: str) -> str:
    """Where a vector sits within its layer: `layers.3.mlp.shared_expert.gate_proj.in_scale` → mlp.shared_expert.
    gate_proj; `norm.scale` → norm."""
    parts = name.split(".")[2:] if name.startswith("layers.") else name.split(".")
    return ".".join(parts[:-1]) or parts[0]


@torch.no_grad()
def scale_telemetry(model: Llama) -> dict[str, float]:
    groups: dict[str, list[torch.Tensor]] = defaultdict(list)
    magnitudes: dict[str, float] = {}
    for name, sv in model.scale_vectors():
        gamma = _full(sv()).float().flatten()  # effective γ, whatever the parameterization; (E, F) stacks flat
        groups[f"scale/{sv.role.value}/{_layer_of(name)}"].append(gamma)
        if sv.role == Role.SCALE_INPUT:  # `layers.3.attn.q_proj.in_scale` → magnitude/L3/attn.q_proj
            magnitudes[f"magnitude/{_layer_of(name)}/{_site(name)}"] = _full(sv.magnitude()).float().mean().item()
    out: dict[str, float] = {}
    for key, vectors in groups.items():
        v = torch.cat(vectors)
        out.update({f"{key}/mean": v.mean().item(), f"{key}/std": v.std().item() if v.numel() > 1 else 0.0,
                    f"{key}/min": v.min().item(), f"{key}/max": v.max().item()})
    out.update(magnitudes)
    for i, block in enumerate(model.layers):
        for proj in ("q_proj", "k_proj", "v_proj"):
            w = _full(getattr(block.attn, proj).weight)
            out[f"wnorm/L{i}/{proj[0]}"] = w.float().norm().item()
    return out

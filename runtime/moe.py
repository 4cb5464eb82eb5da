"""MoE bookkeeping once per optimizer step: the expert loads of every rank in one all-reduce, the aux-loss-free bias
update from them, and — on log steps only — the per-layer metrics for metrics.jsonl (model/moe.py computes and
accumulates the numbers). Nothing here reads the device on a step that does not log."""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from model.llama import Llama


@torch.no_grad()
def moe_step_end(model: Llama, keep: Optional[torch.Tensor] = None, metrics: bool = False) -> dict[str, float]:
    """Call on every rank after optimizer.step(). Sums this step's loads and (aux, z) statistics over ranks on the
    device, updates each layer's balancing bias (balance = bias; `keep`, a 0-dim 1/0 tensor, gates it like the
    optimizer's update: 0 on a skipped step), and resets the counters. With `metrics` (a log step) it returns, per
    MoE layer i, from one host read:

        moe/L{i}/max_load, moe/L{i}/min_load   the most and least loaded expert's load / mean load (1 = balanced)
        moe/L{i}/max_share, moe/L{i}/min_share their share of the step's routed slots (1/E = balanced)
        moe/L{i}/aux, moe/L{i}/z               the unscaled aux (1 = balanced) and z-loss values, mean over micro-batches

    plus moe/max_load, the worst layer's. Empty for a dense model, and without `metrics`.
    """
    layers = list(model.moe_layers())
    if not layers:
        return {}
    # (layers, E + 3): loads, then Σ aux, Σ z, micro-batch count — one collective for the whole model.
    stats = torch.stack([torch.cat([m.tokens_per_expert.double(), m.stat_sums.double()]) for _, m in layers])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(stats)
    n_experts = layers[0][1].n_experts  # every MoE layer has the same config
    for (_, moe), row in zip(layers, stats):
        if moe.cfg.balance == "bias":
            moe.update_bias(row[:n_experts], keep)
        moe.reset_step_stats()
    if not metrics:
        return {}
    load = stats[:, :n_experts]  # (layers, E)
    table = torch.stack([load.max(1).values, load.min(1).values, load.sum(1), load.mean(1),
                         stats[:, n_experts], stats[:, n_experts + 1], stats[:, n_experts + 2]], dim=1)
    out: dict[str, float] = {}
    for (i, _), (hi, lo, total, mean, aux_sum, z_sum, micro) in zip(layers, table.tolist()):  # the one host read
        out.update({f"moe/L{i}/max_load": hi / max(mean, 1e-12), f"moe/L{i}/min_load": lo / max(mean, 1e-12),
                    f"moe/L{i}/max_share": hi / max(total, 1e-12), f"moe/L{i}/min_share": lo / max(total, 1e-12),
                    f"moe/L{i}/aux": aux_sum / max(micro, 1.0), f"moe/L{i}/z": z_sum / max(micro, 1.0)})
    out["moe/max_load"] = max(v for k, v in out.items() if k.endswith("/max_load"))
    return out

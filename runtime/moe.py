"""MoE bookkeeping once per optimizer step: the expert loads of every rank in one all-reduce, the aux-loss-free bias
update from them, and the per-layer metrics for metrics.jsonl (model/moe.py computes and accumulates the numbers)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from model.llama import Llama


@torch.no_grad()
def moe_step_end(model: Llama, skipped: bool = False) -> dict[str, float]:
    """Call on every rank after optimizer.step(); `skipped` (a step without an update) only resets the counters. Sums this step's loads and (aux, z) statistics over ranks, updates
    each layer's balancing bias (balance = bias), resets the counters, and returns, per MoE layer i:

        moe/L{i}/max_load, moe/L{i}/min_load   the most and least loaded expert's load / mean load (1 = balanced)
        moe/L{i}/max_share, moe/L{i}/min_share their share of the step's routed slots (1/E = balanced)
        moe/L{i}/aux, moe/L{i}/z               the unscaled aux (1 = balanced) and z-loss values, mean over micro-batches

    plus moe/max_load, the worst layer's. Empty for a dense model.
    """
    layers = list(model.moe_layers())
    if not layers:
        return {}
    if skipped:  # no update: the balancing bias stays where it is, like the weights
        for _, moe in layers:
            moe.reset_step_stats()
        return {}
    # (layers, E + 3): loads, then Σ aux, Σ z, micro-batch count — one collective for the whole model.
    stats = torch.stack([torch.cat([m.tokens_per_expert.double(), m.stat_sums.double()]) for _, m in layers])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(stats)
    out: dict[str, float] = {}
    for (i, moe), row in zip(layers, stats):
        load = row[: moe.n_experts]
        if moe.cfg.balance == "bias":
            moe.update_bias(load)
        moe.reset_step_stats()
        aux_sum, z_sum, micro = row[moe.n_experts:].tolist()
        total, mean = load.sum().item(), load.mean().item()
        hi, lo = load.max().item(), load.min().item()
        out.update({f"moe/L{i}/max_load": hi / max(mean, 1e-12), f"moe/L{i}/min_load": lo / max(mean, 1e-12),
                    f"moe/L{i}/max_share": hi / max(total, 1e-12), f"moe/L{i}/min_share": lo / max(total, 1e-12),
                    f"moe/L{i}/aux": aux_sum / max(micro, 1.0), f"moe/L{i}/z": z_sum / max(micro, 1.0)})
    out["moe/max_load"] = max(v for k, v in out.items() if k.endswith("/max_load"))
    return out

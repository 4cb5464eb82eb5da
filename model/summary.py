"""A model's parameter and FLOP counts, and their breakdown: what `train.py --dry-run` and `scripts.inspect_model`
print."""
from __future__ import annotations

import math

from model.config import Role
from model.llama import Llama


def num_params(model: Llama, exclude_embedding: bool = False) -> int:
    """Logical parameters: the zero padding of FFN hidden sizes is not counted."""
    n = sum(p.numel() for p in model.parameters()) - padding_zeros(model)
    return n - model.tok_embeddings.weight.numel() if exclude_embedding else n


def activated_params(model: Llama, exclude_embedding: bool = False) -> int:
    """The parameters one token uses: all but the routed experts it is not sent to (docs/paper.md §2.3's
    "activated"; = num_params for a dense model)."""
    return num_params(model, exclude_embedding) - sum(m.inactive_params() for _, m in model.moe_layers())


def _padding(model: Llama) -> dict[str, int]:
    """{parameter name: its stored zeros} for every FFN weight."""
    params = dict(model.named_parameters())
    return {n: params[n].numel() - math.prod(shape) for n, shape in model.logical_shapes().items()}


def padding_zeros(model: Llama) -> int:
    """Stored zeros of the FFN padding: memory, never parameters."""
    return sum(_padding(model).values())


def params_by_role(model: Llama) -> dict[str, int]:
    """Logical parameters per role."""
    params, padding = dict(model.named_parameters()), _padding(model)
    counts = {role.value: 0 for role in Role}
    for name, role in model.param_roles().items():
        counts[role.value] += params[name].numel() - padding.get(name, 0)
    return counts


def flops_per_token(model: Llama, seq_len: int) -> int:
    """Training FLOPs per token: 6·N plus attention scores and values, 12·n_layers·n_heads·head_dim·seq_len (PaLM's
    count, without halving for the causal mask). N = activated parameters without the input embedding: for a dense
    model, the paper's compute axis (docs/paper.md §3.6); for MoE, what a token costs (MFU). The paper's MoE compute
    axis counts total parameters instead (§3.6)."""
    c = model.cfg
    return 6 * activated_params(model, exclude_embedding=True) + 12 * c.n_layers * c.n_heads * c.head_dim * seq_len


def breakdown(model: Llama, seq_len: int) -> dict:
    """Counts of a (possibly meta-device) model; the keys docs/design.md's inspect_model contract names."""
    by_role = params_by_role(model)
    scale = by_role["scale_input"] + by_role["scale_output"]
    return {
        "total_params": num_params(model),
        "non_embedding_params": num_params(model, exclude_embedding=True),
        "activated_params": activated_params(model),  # one token's parameters (MoE: top-k routed experts)
        "scale_params": scale,
        "scale_fraction": scale / num_params(model),
        "by_role": by_role,
        "n_scale_vectors": sum(1 for _ in model.scale_vectors()),
        "vocab_size": model.cfg.vocab_size,
        "seq_len": seq_len,
        "flops_per_token": flops_per_token(model, seq_len),
        # storage, not parameters: FFN hidden sizes zero-padded to ffn_pad_multiple (every count above is logical)
        "ffn_pad_multiple": model.cfg.ffn_pad_multiple,
        "padding_zeros": padding_zeros(model),
        "scale": vars(model.cfg.scale) | {"gemma_norms": model.cfg.gemma_norms},
        "moe": None if model.cfg.moe is None else vars(model.cfg.moe),
    }


def format_breakdown(model: Llama, seq_len: int) -> str:
    info = breakdown(model, seq_len)
    lines = [f"total params          {info['total_params']:>15,}",
             f"non-embedding params  {info['non_embedding_params']:>15,}"]
    if info["moe"] is not None:
        lines.append(f"activated params      {info['activated_params']:>15,}  (one token: shared expert + top-"
                     f"{info['moe']['top_k']} of {info['moe']['n_experts']} routed experts + the rest)")
    lines.append(f"scale-vector params   {info['scale_params']:>15,}  ({info['scale_fraction']:.3e} of total, "
                 f"{info['n_scale_vectors']} vectors)")
    lines += [f"  {role:<20}{n:>15,}" for role, n in info["by_role"].items()]
    lines.append(f"training FLOPs/token  {info['flops_per_token']:>15,}  (6N + attention at seq_len "
                 f"{info['seq_len']}; N = activated non-embedding params)")
    if info["padding_zeros"]:
        lines.append(f"FFN padding (zeros)   {info['padding_zeros']:>15,}  (stored, not counted: hidden sizes padded "
                     f"to a multiple of {info['ffn_pad_multiple']})")
    return "\n".join(lines)

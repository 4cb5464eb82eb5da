"""A model's parameter and FLOP breakdown: what `train.py --dry-run` and `scripts.inspect_model` print."""
from __future__ import annotations

from model.llama import Llama


def breakdown(model: Llama, seq_len: int) -> dict:
    """Counts of a (possibly meta-device) model; the keys docs/design.md's inspect_model contract names."""
    by_role = model.params_by_role()
    scale = by_role["scale_input"] + by_role["scale_output"]
    return {
        "total_params": model.num_params(),
        "non_embedding_params": model.num_params(exclude_embedding=True),
        "activated_params": model.activated_params(),  # one token's parameters (MoE: top-k routed experts)
        "scale_params": scale,
        "scale_fraction": scale / model.num_params(),
        "by_role": by_role,
        "n_scale_vectors": sum(1 for _ in model.scale_vectors()),
        "vocab_size": model.cfg.vocab_size,
        "seq_len": seq_len,
        "flops_per_token": model.flops_per_token(seq_len),
        # storage, not parameters: FFN hidden sizes zero-padded to ffn_pad_multiple (every count above is logical)
        "ffn_pad_multiple": model.cfg.ffn_pad_multiple,
        "padding_zeros": model.padding_zeros(),
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

"""Scale-vector telemetry at each eval: per role and layer, mean / std / min / max of the effective vectors γ; the
magnitude of every input-side vector (OR's β, signed; ER's e^β; a direct vector's RMS), one key per vector, whose
trajectory under DNP and IWD is a question of its own (the inner Norm cancels it, so only decay moves it); and the
Frobenius norms of W_q, W_k, W_v (docs/paper.md Fig. 4). Every rank must call it (sharded parameters are gathered).

`norm_headroom` measures, per layer and site, how far each DNP inner Norm's input stays above its eps; `HeadroomWatch`
turns a collapse into one warning line (docs/paper.md §1.7)."""
from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from model.config import Role
from model.llama import Llama
from model.scaling import ExpertBranch, Norm, ScaledLinear


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _where(module: str) -> tuple[str, str]:
    """A module's layer and site: `layers.3.mlp.shared_expert.gate_proj` → (L3, mlp.shared_expert.gate_proj);
    the final norm and the LM head → (head, norm), (head, lm_head)."""
    parts = module.split(".")
    return (f"L{parts[1]}", ".".join(parts[2:])) if parts[0] == "layers" else ("head", module)


@torch.no_grad()
def scale_telemetry(model: Llama) -> dict[str, float]:
    groups: dict[str, list[torch.Tensor]] = defaultdict(list)
    magnitudes: dict[str, float] = {}
    for name, sv in model.scale_vectors():
        gamma = _full(sv()).float().flatten()  # effective γ, whatever the parameterization; (E, F) stacks flat
        layer, site = _where(name.rsplit(".", 1)[0])  # `layers.3.attn.q_proj.in_scale` → (L3, attn.q_proj)
        groups[f"scale/{sv.role.value}/{layer}"].append(gamma)
        if sv.role == Role.SCALE_INPUT and sv.has_magnitude:  # → magnitude/L3/attn.q_proj
            magnitudes[f"magnitude/{layer}/{site}"] = _full(sv.magnitude()).float().mean().item()
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


@dataclass(frozen=True)
class HeadroomSite:
    """One inner Norm: `headroom` = the mean over its rows of (input mean square) / eps, over one probe sequence per
    rank; `magnitude` = the product of the magnitudes of the input-side vectors that feed it (the branch's own v and
    its Pre-Norm's shared γ; 1 where none has one)."""

    layer: str  # L3, or head
    site: str  # attn.q_proj, mlp.gate_proj (the routed experts), mlp.shared_expert.up_proj, lm_head
    headroom: float
    magnitude: float

    @property
    def key(self) -> str:
        return f"headroom/{self.layer}/{self.site}"


@torch.no_grad()
def norm_headroom(model: Llama, tokens: torch.Tensor) -> list[HeadroomSite]:
    """Every DNP inner Norm's headroom on `tokens` (B, T), this rank's probe rows: one eager forward with full logits
    (so the LM head's vocabulary Norm runs as a module), each inner Norm's input read by a forward pre-hook and
    summed over ranks. Compiled blocks run eager for this call only (torch.compiler.set_stance), so hooks fire and no
    graph is recompiled. Every rank must call it; [] for a model without inner Norms."""
    feeds = {id(b): norm for norm, branches in model.norm_groups() for b in branches}
    branches = [(name, m) for name, m in model.named_modules()
                if isinstance(m, (ScaledLinear, ExpertBranch)) and m.inner is not None]
    if not branches:
        return []
    device = tokens.device
    sums = torch.zeros(len(branches), 2, dtype=torch.float64, device=device)  # (Σ mean square, rows) per site
    hooks = [b.inner.register_forward_pre_hook(functools.partial(_add_mean_square, out=sums[i]))
             for i, (_, b) in enumerate(branches)]
    try:
        with torch.compiler.set_stance("force_eager"):
            model(tokens)
    finally:
        for h in hooks:
            h.remove()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(sums)
    values = (sums[:, 0] / sums[:, 1].clamp(min=1)).tolist()
    out = []
    for (name, branch), ms in zip(branches, values):
        magnitude = 1.0
        for v in (branch.in_scale, feeds[id(branch)].scale):
            if v is not None and v.role == Role.SCALE_INPUT and v.has_magnitude:
                magnitude *= _full(v.magnitude()).float().mean().item()
        out.append(HeadroomSite(*_where(name), ms / branch.inner.eps, magnitude))
    return out


def _add_mean_square(norm: Norm, args: tuple, out: torch.Tensor) -> None:
    """A forward pre-hook: adds (Σ over rows of the row's mean square, rows) of a Norm's input (…, dim) to `out`, rows
    being its normalized groups (heads on q/k/v) over the logical width."""
    x = args[0].detach()
    x = x.to(torch.promote_types(x.dtype, torch.float32))  # fp32 at least: bf16 squares lose digits
    if norm.group != norm.dim:
        x = x.unflatten(-1, (-1, norm.group))
    ms = x.pow(2).sum(-1) / (norm.logical or x.shape[-1])  # (rows…)
    out += torch.stack([ms.sum().double(), torch.tensor(float(ms.numel()), dtype=torch.float64, device=ms.device)])


class HeadroomWatch:
    """One warning line the first time a site's headroom falls below `threshold` (log.headroom_warn) in this process
    (the worst site named, the others counted), so a run that switches a branch off says so where the user looks."""

    def __init__(self, invariant_magnitude: str, threshold: float):
        self.invariant_magnitude, self.threshold = invariant_magnitude, threshold
        self.warned: set[str] = set()

    def check(self, step: int, sites: list[HeadroomSite]) -> Optional[str]:
        low = sorted((s for s in sites if not s.headroom >= self.threshold and s.key not in self.warned),
                     key=lambda s: s.headroom if math.isfinite(s.headroom) else -1.0)
        if not low:
            return None
        self.warned.update(s.key for s in low)
        worst = low[0]
        more = f" (and {len(low) - 1} more: {', '.join(f'{s.layer} {s.site}' for s in low[1:4])}" \
               f"{', …' if len(low) > 4 else ''})" if len(low) > 1 else ""
        if worst.magnitude < 0.1 and self.invariant_magnitude == "keep":
            fix = ("its input-side magnitude has collapsed under weight decay; a new run with "
                   "model.scale.invariant_magnitude=remove has none to collapse")
        else:
            fix = "the scale of its weights has collapsed; a lower optim.lr or optim.weight_decay keeps it"
        return (f"step {step}: {worst.layer} {worst.site}: DNP's inner Norm stopped normalizing (headroom "
                f"{worst.headroom:.2g} = input mean square / eps < {self.threshold:g}, input-side magnitude "
                f"{worst.magnitude:.2g}){more}: the branch's output is scaled down, {fix}")

"""Parameter roles → optimizer param groups: who decays (IWD, docs/paper.md §1.7) and who gets Muon (docs/paper.md §3.2).

Everything keys off the role the model assigns (`model.param_roles()`), never off shapes; the one place a name is
read is the OR/ER split of a scale vector into its magnitude β (`...beta`) and direction α (`...alpha`), whose
decay the paper leaves open (docs/paper.md §1.7, §6.1) and `optim.scale_wd_alpha` decides.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

import torch

from model.config import Role

if TYPE_CHECKING:
    from optim.config import OptimConfig

SCALE_ROLES = frozenset({Role.SCALE_INPUT.value, Role.SCALE_OUTPUT.value})
# Muon takes the 2-D weights inside the blocks and the MoE's stacked 3-D expert weights, orthogonalized per expert;
# the router too unless optim.muon.router is false; embeddings, the LM head and every scale vector stay on AdamW
# (docs/paper.md §3.2). Roles compare as strings (Role is a str Enum), so a role the model adds later needs no
# change here.
MUON_ROLES = frozenset({Role.MATRIX.value, "expert_matrix"})
ROUTER_ROLE = Role.ROUTER.value  # on Muon too under optim.muon.router (the paper's "2D matrices inside layers")

# mode → (does an Input-Norm vector decay, does an Output-Norm vector decay). docs/paper.md §1.7 and Fig. 3:
# "all" is the paper's default (Llama and the Gemma baseline decay every scale vector); "iwd" = "no wd:
# Output-Norm" is the paper's proposal; "no_input" is Fig. 3's other arm.
WD_MODES: dict[str, tuple[bool, bool]] = {
    "all": (True, True),
    "iwd": (True, False),
    "no_output": (True, False),
    "no_input": (False, True),
    "none": (False, False),
}


def role_value(role: Role | str) -> str:
    """"matrix" for Role.MATRIX or "matrix" alike (a str Enum's str() is not its value on every Python)."""
    return role.value if isinstance(role, enum.Enum) else str(role)


def decays(name: str, role: Role | str, mode: str, include_alpha: bool) -> bool:
    """Whether parameter `name` with `role` gets weight decay under `optim.scale_weight_decay = mode`.

    Non-scale parameters (embedding, LM head, matrices, …) always decay: the Llama default of wd 0.1 on every
    parameter (docs/paper.md §1.7, §3.1). For a decayed scale vector under OR/ER (γ = β·Norm(α), γ = e^β·e^(α−mean α))
    the scalar β decays, and α only when `include_alpha` (optim.scale_wd_alpha).
    """
    if mode not in WD_MODES:
        raise ValueError(f"unknown scale_weight_decay mode {mode!r}; expected one of {sorted(WD_MODES)}")
    value = role_value(role)
    if value not in SCALE_ROLES:
        return True
    input_decays, output_decays = WD_MODES[mode]
    if not (input_decays if value == Role.SCALE_INPUT.value else output_decays):
        return False
    if name.rsplit(".", 1)[-1] == "alpha":  # OR/ER direction vector; `...beta` and `...weight` decay as the vector
        return include_alpha
    return True


def param_groups(
    named_params: Iterable[tuple[str, torch.nn.Parameter]],
    roles: Mapping[str, Role | str],
    cfg: OptimConfig,
    logical_shapes: Optional[Mapping[str, tuple[int, ...]]] = None,
    invariant: Optional[Iterable[str]] = None,
) -> list[dict[str, Any]]:
    """Param-group dicts for `HybridOptimizer`, each with `name` (for logging), `kind` ("adamw" | "muon"),
    `params`, `weight_decay`, `lr` (= cfg.lr, the peak) and `lr_scale` (the trainer sets lr = schedule · lr_scale).
    The muon group also has `logical_shapes`, parallel to `params`: each matrix's unpadded shape (`logical_shapes`,
    Llama.logical_shapes(); its own shape when absent), which Muon's update scale reads (optim/muon.py).

    adamw: groups "adamw/decay" and "adamw/no_decay". muon: "muon" (every Muon role; matrices always decay,
    docs/paper.md §3.2: "weight decay 0.1") plus the two AdamW groups for everything else. Empty groups are dropped.
    Parameters with requires_grad=False are left out. Raises if a trainable parameter has no role; asserts that
    every trainable parameter lands in exactly one group.

    `invariant` (Llama.invariant_magnitudes: the parameters that hold only magnitudes no gradient reaches) is read
    when `cfg.scale_wd_invariant` is false: a decayed parameter among them joins "adamw/no_decay".
    """
    if cfg.name not in ("adamw", "muon"):
        raise ValueError(f"unknown optimizer {cfg.name!r}; expected adamw | muon")
    params = [(n, p) for n, p in named_params if p.requires_grad]
    names = [n for n, _ in params]
    missing = set(names) - set(roles)  # roles may also name frozen parameters; those are simply not optimized
    if missing:
        raise ValueError(f"parameters without a role: {sorted(missing)}")

    buckets: dict[str, list[torch.nn.Parameter]] = {"muon": [], "adamw/decay": [], "adamw/no_decay": []}
    muon_shapes: list[tuple[int, ...]] = []
    spared = set() if cfg.scale_wd_invariant else set(invariant or ())
    muon_roles = MUON_ROLES | ({ROUTER_ROLE} if cfg.muon.router else set())
    for name, p in params:
        role = roles[name]
        if cfg.name == "muon" and role_value(role) in muon_roles:
            if p.ndim < 2:
                raise ValueError(f"{name}: role {role_value(role)} goes to Muon but has shape {tuple(p.shape)}")
            buckets["muon"].append(p)
            muon_shapes.append(tuple((logical_shapes or {}).get(name, p.shape)))
        elif decays(name, role, cfg.scale_weight_decay, cfg.scale_wd_alpha) and name not in spared:
            buckets["adamw/decay"].append(p)
        else:
            buckets["adamw/no_decay"].append(p)

    m = cfg.muon
    groups: list[dict[str, Any]] = []
    if buckets["muon"]:
        groups.append(dict(
            name="muon", kind="muon", params=buckets["muon"], lr=cfg.lr, initial_lr=cfg.lr, lr_scale=1.0,
            weight_decay=cfg.weight_decay, momentum=m.momentum, nesterov=m.nesterov,
            ns_coefficients=tuple(m.ns_coefficients), ns_steps=m.ns_steps, eps=m.eps, update_scale=m.update_scale,
            ns_dtype=m.ns_dtype, distributed=m.distributed, logical_shapes=muon_shapes,
        ))
    for name, wd in (("adamw/decay", cfg.weight_decay), ("adamw/no_decay", 0.0)):
        if buckets[name]:
            groups.append(dict(
                name=name, kind="adamw", params=buckets[name], lr=cfg.lr, initial_lr=cfg.lr, lr_scale=1.0,
                weight_decay=wd, betas=tuple(cfg.betas), eps=cfg.eps,
            ))

    placed = [id(p) for g in groups for p in g["params"]]
    assert len(placed) == len(set(placed)) == len(params), "every parameter must land in exactly one group"
    assert set(placed) == {id(p) for _, p in params}
    return groups


def group_summary(groups: list[dict[str, Any]]) -> dict[str, int]:
    """{group name: number of scalars} for the dry-run printout and logs (global counts: a DTensor's numel() is
    its full size under FSDP2 too)."""
    return {g["name"]: sum(p.numel() for p in g["params"]) for g in groups}

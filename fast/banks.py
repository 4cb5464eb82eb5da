"""Banks: the fast path stores a block's scale vectors as one flat tensor per kind of parameter, each vector a slice.
FSDP2's gathers, gradient clipping and the optimizer then pay their per-tensor host work for a few tensors per block
instead of one or two per vector (a unified_literal block has 20 vector tensors in 4 banks, a unified block 15 in 3). The math is each vector's own: a slice's gradient is the
vector's, AdamW is elementwise, and decay follows the bank's role.

A bank holds vectors of one role whose magnitudes are all of one kind for weight decay: `input`, `output`, and
`input_invariant` (the vectors of `Llama.invariant_magnitudes`, whose β optim.scale_wd_invariant may spare). So a
bank's β decays or not as a whole.

Banks never reach disk: a checkpoint holds each vector under the reference model's names
(`layers.0.attn.q_proj.in_scale.alpha`), so a run saved on the fast path resumes on the reference and the reverse
(`reference_state` on save, `stage_banks` on load).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor

from model.llama import Llama
from model.vectors import ScaleVector

# (a member's reference parameter name, its (start, stop) in the bank, its shape)
Member = tuple[str, tuple[int, int], tuple[int, ...]]


@dataclass(frozen=True, eq=False)
class BankSlot:
    """Where a banked vector's entries lie: `ranges[kind]` = (start, stop) in the bank's flat tensor of that kind. The
    bank is referenced, not registered: it is a module of the block, once."""

    bank: "ScaleBank"
    ranges: dict[str, tuple[int, int]]


class BankedVector(ScaleVector):
    """A ScaleVector that owns no parameters: it reads its weight, α or β as slices of its block's bank. Outside
    FSDP2's forward a bank is a sharded DTensor: it is gathered whole first (telemetry, export), on every rank."""

    def __init__(self, vector: ScaleVector, slot: BankSlot):
        nn.Module.__init__(self)  # not ScaleVector.__init__: its parameters live in the bank
        self.dim, self.reparam, self.role = vector.dim, vector.reparam, vector.role
        self.count, self.has_magnitude = vector.count, vector.has_magnitude
        self.slot = slot

    def part(self, kind: str) -> torch.Tensor:
        flat = getattr(self.slot.bank, kind)
        if isinstance(flat, DTensor):
            flat = flat.full_tensor()
        start, stop = self.slot.ranges[kind]
        return flat[start:stop].view(self.shapes()[kind])

    def reset_parameters(self) -> None:
        pass  # Llama.init_weights fills the bank's tensors

    def extra_repr(self) -> str:
        return super().extra_repr() + ", banked"


class ScaleBank(nn.Module):
    """The vectors of one block, one role and one reparameterization as one flat tensor per kind (`weight`, or
    `alpha` and `beta`), each vector a slice."""

    def __init__(self, vectors: list[ScaleVector]):
        super().__init__()
        if not vectors or len({(v.role, v.reparam) for v in vectors}) != 1:
            raise ValueError("a bank holds one or more vectors of one role and one reparameterization")
        self.role, self.reparam, self.n_vectors = vectors[0].role, vectors[0].reparam, len(vectors)
        # Kinds in order of first appearance: vectors without a magnitude have α alone beside others' α and β
        offsets = dict.fromkeys((k for v in vectors for k in v.kinds), 0)
        self.slots: list[BankSlot] = []
        for v in vectors:
            ranges = {}
            for kind, shape in v.shapes().items():
                n = int(torch.Size(shape).numel())
                ranges[kind] = (offsets[kind], offsets[kind] + n)
                offsets[kind] += n
            self.slots.append(BankSlot(self, ranges))
        device = vectors[0].part(vectors[0].kinds[0]).device
        for kind, n in offsets.items():
            self.register_parameter(kind, nn.Parameter(torch.empty(n, device=device)))

    def extra_repr(self) -> str:
        return f"vectors={self.n_vectors}, reparam={self.reparam}, role={self.role.value}"


def bank_blocks(model: Llama) -> None:
    """Give every block a `scales` ModuleDict of banks and put a BankedVector in place of each of its vectors. On the
    meta device, before FSDP2 shards the blocks. The final norm's and the LM head's vectors keep their own tensors:
    the fused head reads them by name."""
    invariant = {name.removesuffix(".beta") for name in model.invariant_magnitudes()}
    for i, block in enumerate(model.layers):
        prefix = f"layers.{i}."
        by_key: dict[str, list[tuple[str, ScaleVector]]] = {}
        for name, m in block.named_modules():
            if isinstance(m, ScaleVector):
                key = m.role.value.removeprefix("scale_")
                key += "_invariant" if prefix + name in invariant else ""
                by_key.setdefault(key, []).append((name, m))
        banks = nn.ModuleDict()
        for key, named in by_key.items():
            bank = ScaleBank([v for _, v in named])
            for (name, vector), slot in zip(named, bank.slots):
                _replace(block, name, BankedVector(vector, slot))
            banks[key] = bank
        if banks:
            block.scales = banks


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


def bank_members(model: nn.Module) -> dict[str, list[Member]]:
    """{bank parameter name: [(a member's reference name, its span, its shape)]}, in bank order; {} without banks.
    A reference name is what the vector's parameter is called in the reference model
    (`layers.0.attn.q_proj.in_scale.alpha`): the names on disk and of export."""
    bank_names = {id(m): n for n, m in model.named_modules() if isinstance(m, ScaleBank)}
    out: dict[str, list[Member]] = {}
    for name, v in model.named_modules():
        if isinstance(v, BankedVector):
            for kind, span in v.slot.ranges.items():
                out.setdefault(f"{bank_names[id(v.slot.bank)]}.{kind}", []).append(
                    (f"{name}.{kind}", span, v.shapes()[kind]))
    return out


def parameter_names(model: nn.Module, reference: set[str]) -> set[str]:
    """The names of this model's parameters that hold the reference parameters `reference`: each itself, or the
    bank that holds it. A bank must hold only such parameters or none (banks are split so: `bank_blocks`)."""
    out = set(reference)
    for bank, members in bank_members(model).items():
        held = [name in reference for name, _, _ in members]
        if any(held):
            if not all(held):
                raise ValueError(f"bank {bank} holds parameters of two kinds for weight decay")
            out -= {name for name, _, _ in members}
            out.add(bank)
    return out


# ------------------------------------------------------------------------------------------------ checkpoints

def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def unbanked(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{name: tensor} by this model's parameter names (a bank whole) → by the reference's: each bank split into its
    members' views."""
    out = dict(tensors)
    for bank, members in bank_members(model).items():
        if bank in out:
            flat = out.pop(bank)
            out.update({name: flat[a:b].view(shape) for name, (a, b), shape in members})
    return out


def banked(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `unbanked`: {name: tensor} by the reference's names → by this model's, each bank's members
    flattened and joined."""
    out = dict(tensors)
    for bank, members in bank_members(model).items():
        if all(name in out for name, _, _ in members):
            out[bank] = torch.cat([out.pop(name).reshape(-1) for name, _, _ in members])
    return out


def reference_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole (a DTensor gathered: call on every rank), under the reference model's names."""
    return unbanked(model, {name: _full(p).detach() for name, p in model.named_parameters()})


def reference_state(model: nn.Module, state: dict) -> dict:
    """`state` ({"model": …, "optim": …} as torch.distributed.checkpoint.state_dict gives it) with every bank split
    into its members under their reference names, whole on every rank (a bank is small: DCP writes one copy)."""
    members = bank_members(model)
    if not members:
        return state
    model_state = dict(state["model"])
    for bank, ms in members.items():
        flat = _full(model_state.pop(bank)).detach()
        model_state.update({name: flat[a:b].view(shape).clone() for name, (a, b), shape in ms})
    out = {**state, "model": model_state}
    if "optim" in state:
        per_param = dict(state["optim"]["state"])
        for bank, ms in members.items():
            if bank not in per_param:
                continue
            saved = {k: _full(v) for k, v in per_param.pop(bank).items()}  # exp_avg, exp_avg_sq, step: gathered once
            for name, (a, b), shape in ms:
                per_param[name] = {k: v[a:b].view(shape).clone() if v.ndim else v.clone() for k, v in saved.items()}
        groups = [{**g, "params": _members_of(g["params"], members)} for g in state["optim"]["param_groups"]]
        out["optim"] = {**state["optim"], "state": per_param, "param_groups": groups}
    return out


def _members_of(names: list[str], members: dict[str, list[Member]]) -> list[str]:
    return [m for n in names for m in ([name for name, _, _ in members[n]] if n in members else [n])]


# One tensor (or one parameter's optimizer state) read under the reference names: called after DCP's read, it builds
# the bank from what DCP read.
Staged = Callable[[], None]


def stage_banks(model: nn.Module, state: dict) -> list[Staged]:
    """Stage each bank of `state` ({"model": …, "optim": …}) to be read from a checkpoint under its members'
    reference names: every member a plain, whole tensor for DCP to fill, on every rank, for the parameter and for
    each optimizer state of it; call the returned functions after DCP's read to join them into the banks (a DTensor
    takes its own shard: every rank holds the whole tensor, no communication)."""
    members = bank_members(model)
    staged: list[Staged] = []
    if not members:
        return staged
    optim = state.get("optim", {}).get("state", {})
    for bank, ms in members.items():
        _contiguous(ms)
        names = [name for name, _, _ in ms]
        ours = state["model"].pop(bank)
        state["model"].update({name: torch.zeros(shape, dtype=ours.dtype) for name, _, shape in ms})
        staged.append(lambda bank=bank, names=names, ours=ours: _join(state["model"], bank, names, ours))
        if bank in optim:
            per_param = optim.pop(bank)
            for name, _, shape in ms:
                optim[name] = {k: torch.zeros(shape if v.ndim else (), dtype=v.dtype) for k, v in per_param.items()}
            staged.append(lambda bank=bank, names=names, per_param=per_param:
                          _join_state(optim, bank, names, per_param))
    if "optim" in state:  # the groups list parameters by name: the members on disk, the banks here
        ours = [list(g["params"]) for g in state["optim"]["param_groups"]]
        for g in state["optim"]["param_groups"]:
            g["params"] = _members_of(g["params"], members)

        def restore_groups() -> None:
            for g, names in zip(state["optim"]["param_groups"], ours):
                g["params"] = names
        staged.append(restore_groups)
    return staged


def _like(full: torch.Tensor, ours: torch.Tensor) -> torch.Tensor:
    """`full` as `ours` is held: its device and dtype, and its shard when it is a DTensor."""
    full = full.to(device=ours.device, dtype=ours.dtype)
    if isinstance(ours, DTensor):
        return distribute_tensor(full, ours.device_mesh, ours.placements, src_data_rank=None)
    return full


def _contiguous(members: list[Member]) -> None:
    """A bank's members in `bank_members` order fill it end to end: what joining them in that order needs."""
    ends = [0] + [b for _, (_, b), _ in members[:-1]]
    assert [a for _, (a, _), _ in members] == ends, f"bank members out of order: {members}"


def _join(holder: dict, bank: str, names: list[str], ours: torch.Tensor) -> None:
    holder[bank] = _like(torch.cat([holder.pop(name).reshape(-1) for name in names]), ours)


def _join_state(optim: dict, bank: str, names: list[str], ours: dict[str, torch.Tensor]) -> None:
    """A bank's optimizer state from its members': per-entry tensors joined, and a scalar (AdamW's step count) that
    every member must share: one tensor has one."""
    parts = [optim.pop(name) for name in names]
    joined = {}
    for key, v in ours.items():
        values = [p[key] for p in parts]
        if v.ndim:
            joined[key] = _like(torch.cat([x.reshape(-1) for x in values]), v)
        elif all(torch.equal(values[0], x) for x in values[1:]):
            joined[key] = values[0].to(device=v.device, dtype=v.dtype)
        else:
            raise ValueError(f"the vectors of bank {bank} have different optimizer {key!r} values "
                             f"({sorted({x.item() for x in values})}), which one bank cannot hold; resume this run "
                             "with train.fast_path=false (one tensor per vector)")
    optim[bank] = joined


"""Checkpoints of an older format, converted offline (`python -m scripts.convert_checkpoint`), so the load path reads
one format: every tensor under the reference model's names (model/).

The one older format: scale-vector banks on disk. Before the fast path kept banks in memory only, a checkpoint held
each block's vectors as one flat tensor per role and kind (`layers.0.scales.input.alpha`), every vector a slice in
module order, and the optimizer's state of it alike. Conversion splits each into its vectors' own tensors
(`layers.0.attn.q_proj.in_scale.alpha`), the optimizer groups' parameter lists too, and leaves every other tensor and
file as it was. The original moves into `checkpoints/set_aside/`, never deleted.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from model.llama import Llama
from model.vectors import ScaleVector
from runtime.checkpoint import BANKS_ON_DISK
from runtime.checkpoint_files import (EXTRA_FILE, MARKER, CheckpointError, damaged_files, read_marker,
                                     resolve_checkpoint, write_checksums)
from runtime.files import atomic_write, fsync_dir

def holds_banks(step_dir: Path) -> bool:
    """Whether a checkpoint stores scale-vector banks (the older format)."""
    return any(BANKS_ON_DISK.match(k) for k in FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata)


def legacy_banks(model: Llama) -> dict[str, list[tuple[str, tuple[int, int], tuple[int, ...]]]]:
    """{bank name: [(a vector's reference name, its (start, stop), its shape)]} as the older format laid banks out:
    per block, one bank per role ("input", "output") holding its vectors in module order, kinds in order of first
    appearance."""
    out: dict[str, list] = {}
    for i, block in enumerate(model.layers):
        offsets: dict[str, dict[str, int]] = {}
        for name, v in block.named_modules():
            if not isinstance(v, ScaleVector):
                continue
            key = v.role.value.removeprefix("scale_")
            for kind, shape in v.shapes().items():
                at = offsets.setdefault(key, {}).setdefault(kind, 0)
                n = int(torch.Size(shape).numel())
                out.setdefault(f"layers.{i}.scales.{key}.{kind}", []).append(
                    (f"layers.{i}.{name}.{kind}", (at, at + n), shape))
                offsets[key][kind] = at + n
    return out


def convert(step_dir: Path, model: Llama) -> Path:
    """Rewrite one checkpoint of the older format under the reference's names, for `model` (built from the run's
    config, on any device, meta included). Returns where the original was set aside."""
    step_dir = resolve_checkpoint(step_dir)
    problems = damaged_files(step_dir)
    if problems:
        raise CheckpointError(f"checkpoint {step_dir} is damaged ({'; '.join(problems)}): not converted")
    banks = legacy_banks(model)
    with tempfile.TemporaryDirectory(dir=step_dir.parent, prefix=".convert-") as tmp:
        flat = Path(tmp) / "state.pt"
        dcp_to_torch_save(step_dir, flat)
        state = torch.load(flat, weights_only=False)
        flat.unlink()
        _split(state, banks, model.invariant_magnitudes())
        out = Path(tmp) / step_dir.name
        with warnings.catch_warnings():  # one process, as meant: DCP's single-process warning says nothing here
            warnings.filterwarnings("ignore", message="torch.distributed is .*unavailable or uninitialized")
            dcp.save(state, checkpoint_id=out, no_dist=True)
        for f in step_dir.iterdir():  # the trainer's dict, the RNG states: as they were
            if f.name == EXTRA_FILE or f.name.startswith("rng_rank"):
                shutil.copy2(f, out / f.name)
        marker = read_marker(step_dir)
        for r in range(marker["world_size"]):  # one process wrote every DCP file: rank 0's checksums hold them
            write_checksums(out, r)
        atomic_write(out / MARKER, json.dumps({**marker, "checksums": True, "converted_from": "banks"}).encode())
        problems = damaged_files(out)
        if problems:  # the converted copy is checked like any checkpoint before it replaces the original
            raise CheckpointError(f"the converted copy of {step_dir} is damaged ({'; '.join(problems)}): not replaced")
        aside = step_dir.parent / "set_aside" / f"{step_dir.name}.banks"
        aside.parent.mkdir(exist_ok=True)
        if aside.exists():
            raise CheckpointError(f"{aside} exists already: move it away, then convert again")
        step_dir.rename(aside)
        out.rename(step_dir)
        fsync_dir(step_dir.parent)
    return aside


def _split(state: dict, banks: dict, invariant: set[str]) -> None:
    """Every bank of `state` (the model's tensors, the optimizer's state and groups) into its vectors, in place. The
    older format's masked-decay group (optim.scale_wd_invariant=false with a bank partly spared) goes too: each of its
    vectors joins adamw/no_decay when it is one of `invariant` (the β the mask spared), else adamw/decay."""
    model = state["model"]
    for bank, members in banks.items():
        if bank not in model:
            continue
        flat = model.pop(bank)
        if flat.numel() != members[-1][1][1]:
            raise CheckpointError(f"bank {bank} holds {flat.numel()} entries, the run's config lays out "
                                  f"{members[-1][1][1]}: was the checkpoint written with another design?")
        model.update({name: flat[a:b].reshape(shape).clone() for name, (a, b), shape in members})
    optim = state.get("optim")
    if optim is None:
        return
    per_param = optim.get("state", {})
    for bank, members in banks.items():
        if bank in per_param:
            saved = per_param.pop(bank)
            for name, (a, b), shape in members:
                per_param[name] = {k: v[a:b].reshape(shape).clone() if v.ndim else v.clone() for k, v in saved.items()}
    groups = optim.get("param_groups", [])
    for group in groups:
        group["params"] = [m for n in group["params"] for m in ([x for x, _, _ in banks[n]] if n in banks else [n])]
    masked = [g for g in groups if g.get("name") == "adamw/decay_masked"]
    if masked:
        by_name = {g.get("name"): g for g in groups}
        for name in masked[0]["params"]:
            target = by_name.get("adamw/no_decay" if name in invariant else "adamw/decay")
            if target is None:
                raise CheckpointError(f"{name} of the masked-decay group has no group to join in this checkpoint")
            target["params"].append(name)
        groups.remove(masked[0])
    leftover = sorted(k for k in model if ".scales." in k)
    if leftover:
        raise CheckpointError(f"banks the run's config does not lay out: {', '.join(leftover[:3])}")

"""Scale-vector banks (model/scaling.py, ScaleBank): a block's vectors as one tensor per role and kind, each vector a
slice, with the numbers of one tensor per vector; and a checkpoint written before banks (one tensor per vector) still
resumes (runtime/checkpoint_layouts.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from optim.config import OptimConfig
from model.config import Role
from model.llama import Llama, build_model
from model.vectors import ScaleBank, ScaleVector
from optim import build_optimizer
from runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from test_model import preset_model_cfg, randomize_vectors

SCALE = (Role.SCALE_INPUT, Role.SCALE_OUTPUT)


def test_a_unified_block_holds_four_scale_tensors():
    """HG + DNP + OR: 10 vectors per block, α and β each, in 2 banks of 2 tensors; the head's 2 keep theirs."""
    model = build_model(preset_model_cfg("unified_literal"))
    roles = model.param_roles()
    scale = [n for n, r in roles.items() if r in SCALE]
    assert sorted(n for n in scale if n.startswith("layers.0.")) == [
        f"layers.0.scales.{side}.{kind}" for side in ("input", "output") for kind in ("alpha", "beta")]
    assert len([n for n in scale if not n.startswith("layers.")]) == 4  # the final norm's γ, the head's u: α, β each
    bank = model.layers[0].scales["input"]
    assert bank.n_vectors == 5 and bank.alpha.shape == (5 * model.cfg.d_model,) and bank.beta.shape == (5,)
    assert sum(sv.numel() for _, sv in model.scale_vectors()) == model.params_by_role()["scale_input"] + \
        model.params_by_role()["scale_output"]


@pytest.mark.parametrize("reparam", ["direct", "or", "er"])
def test_a_banked_vector_is_its_own_vector(reparam):
    """γ and its gradient from a slice of the bank equal a vector's own parameters', bit for bit, stacks included."""
    own = [ScaleVector(6, reparam, Role.SCALE_OUTPUT).double(), ScaleVector(4, reparam, Role.SCALE_OUTPUT, count=3)
           .double()]
    banked = [ScaleVector(6, reparam, Role.SCALE_OUTPUT), ScaleVector(4, reparam, Role.SCALE_OUTPUT, count=3)]
    bank = ScaleBank(banked).double()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in bank.parameters():
            p.copy_(0.5 + torch.rand(p.shape, generator=gen, dtype=p.dtype))
        for sv in own:
            for kind in sv.kinds:
                getattr(sv, kind).copy_(banked[own.index(sv)].part(kind))
    weights = [torch.randn(6, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)]
    sum((sv() * w).sum() for sv, w in zip(own, weights)).backward()
    sum((sv() * w).sum() for sv, w in zip(banked, weights)).backward()
    for a, b in zip(own, banked):
        assert torch.equal(a(), b())
    for kind in own[0].kinds:
        expected = torch.cat([getattr(sv, kind).grad.reshape(-1) for sv in own])
        assert torch.equal(getattr(bank, kind).grad, expected), kind


def test_init_makes_every_banked_vector_one():
    model = build_model(preset_model_cfg("unified_literal"))
    for _, sv in model.scale_vectors():
        assert torch.equal(sv(), torch.ones_like(sv())), sv


# --------------------------------------------------------------------------------- checkpoints written before banks

def _trained(seed: int) -> tuple[Llama, torch.optim.Optimizer]:
    """The unified model after 2 AdamW steps on random tokens (vectors randomized: every slice differs)."""
    model = build_model(preset_model_cfg("unified_literal"), dtype=torch.float64)
    randomize_vectors(model, seed)
    opt = build_optimizer(model, model.param_roles(), OptimConfig(lr=1e-2), fused=True)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(2):
        x = torch.randint(0, model.cfg.vocab_size, (2, 9), generator=gen)
        model(x[:, :-1], x[:, 1:], loss_chunk=0).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _rewrite_per_vector(step_dir: Path, model: Llama, opt: torch.optim.Optimizer, bump_step: bool = False) -> None:
    """The checkpoint's DCP files as scalevec wrote them before banks: each vector's tensors, and their optimizer
    states, under the vector's own name (`layers.0.attn.q_proj.in_scale.alpha`), and the groups list those names."""
    members = model.bank_members()
    osd = get_optimizer_state_dict(model, opt)
    state = {}
    for fqn, per in osd["state"].items():
        for i, (name, (a, b), shape) in enumerate(members.get(fqn, [(fqn, (0, 0), None)])):
            if shape is None:
                state[name] = per
                continue
            state[name] = {k: v[a:b].view(shape).clone() if v.ndim else v.clone() + (bump_step and i == 1)
                           for k, v in per.items()}
    groups = [{**g, "params": [m for p in g["params"] for m, _, _ in members.get(p, [(p, None, None)])]}
              for g in osd["param_groups"]]
    for f in [*step_dir.glob("*.distcp"), step_dir / ".metadata"]:
        f.unlink()
    dcp.save({"model": model.unbanked(get_model_state_dict(model)), "optim": {"state": state, "param_groups": groups}},
             checkpoint_id=step_dir, no_dist=True)


def test_a_checkpoint_written_before_banks_resumes(tmp_path):
    """Weights and AdamW state load into the banks, and the next step is the same step, bit for bit."""
    model, opt = _trained(seed=1)
    save_checkpoint(tmp_path, 2, model, opt, {"step": 2}, keep=1)
    step_dir = next(tmp_path.glob("step_*"))
    _rewrite_per_vector(step_dir, model, opt)
    meta = dcp.FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    assert "model.layers.0.attn.q_proj.in_scale.alpha" in meta and "model.layers.0.scales.input.alpha" not in meta
    fresh, fresh_opt = _trained(seed=2)  # other weights and moments everywhere
    load_checkpoint(tmp_path, fresh, fresh_opt)
    for (n, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), n
        for k, v in opt.state[p].items():
            assert torch.equal(v, fresh_opt.state[q][k]), (n, k)
    x = torch.randint(0, model.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    for m, o in ((model, opt), (fresh, fresh_opt)):
        m(x[:, :-1], x[:, 1:], loss_chunk=0).backward()
        o.step()
    for (n, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), n


def test_vectors_of_one_bank_with_different_step_counts_are_refused(tmp_path):
    model, opt = _trained(seed=1)
    save_checkpoint(tmp_path, 2, model, opt, {"step": 2}, keep=1)
    _rewrite_per_vector(next(tmp_path.glob("step_*")), model, opt, bump_step=True)
    fresh, fresh_opt = _trained(seed=2)
    with pytest.raises(CheckpointError, match="different optimizer 'step' values"):
        load_checkpoint(tmp_path, fresh, fresh_opt)

"""FFN hidden sizes zero-padded in storage (model.ffn_pad_multiple): the dense MLP, the MoE's shared expert and its
routed experts. A padded model is the unpadded one — outputs, gradients, counts, FLOPs, training under AdamW and Muon
(whose update scale reads the logical shape) — its padding stays exactly zero, and checkpoints load across paddings
(one written before padding existed included)."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from config import load_config

from strictconfig.config import resume_conflicts

from optim.config import OptimConfig
from model.config import ModelConfig, MoEConfig
from model.llama import Llama, build_model
from model.summary import activated_params, flops_per_token, num_params, padding_zeros, params_by_role
from optim import build_optimizer
from runtime.checkpoint import CheckpointError, load_checkpoint, load_model_weights, save_checkpoint
from test_model import randomize_vectors
from test_train import data_dir  # noqa: F401 (a fixture: the prepared tiny corpus)

V, D_FFN, EXPERT, PAD = 67, 42, 21, 64
TOKENS = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(0))
CASES = [(kind, preset) for kind in ("dense", "moe") for preset in ("baseline", "unified")]


def cfg_of(kind: str, preset: str, pad: int, routed_pad=None) -> ModelConfig:
    """d 32, 2 layers; dense hidden 42 (and the MoE's shared expert), routed hidden 21: stored as 64 when padded."""
    cfg = replace(load_config(f"configs/scale/{preset}.yaml").model, d_model=32, n_layers=2, n_heads=4, vocab_size=V,
                  d_ffn=D_FFN, ffn_pad_multiple=pad)
    if kind == "moe":
        cfg = replace(cfg, moe=MoEConfig(n_experts=4, top_k=2, expert_ffn=EXPERT, shared_ffn=D_FFN,
                                         pad_multiple=routed_pad))
    return cfg


def tolerance(dtype: torch.dtype) -> float:
    """Normwise, relative to the largest gradient (or output) norm. A padded matmul adds exact zeros to its sums, so
    the two models differ only where a kernel orders a reduction differently: at most ~K·ε per reduction of length
    K (Higham's γ_K) — K ≤ max(64 padded hidden, 67 vocab, 26 tokens) here — and a handful of chained reductions per
    block, forward and backward: 8·K·ε, i.e. ≈ 1e-13 in float64 and ≈ 6e-5 in float32. (Measured: float64 agrees to
    ~1e-16, float32 to ~1e-7.) A global scale rather than per parameter, because some gradients are exactly 0 up to
    rounding (OR's β before DNP's inner Norm, which is scale-invariant)."""
    return 8 * max(PAD, V, TOKENS.numel()) * torch.finfo(dtype).eps


def padding_of(model: Llama) -> dict[str, torch.Tensor]:
    """Every padded weight's entries outside its logical block (flattened)."""
    params, out = dict(model.named_parameters()), {}
    for name, shape in model.logical_shapes().items():
        mask = torch.ones(params[name].shape, dtype=torch.bool)
        mask[tuple(slice(0, n) for n in shape)] = False
        out[name] = params[name].detach()[mask]
    return out


def crop(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t[tuple(slice(0, n) for n in like.shape)]


def forward_backward(model: Llama) -> torch.Tensor:
    out = model(TOKENS)
    (out.pow(2).mean() + model.aux_loss()).backward()
    return out.detach()


# ------------------------------------------------------------------------------------------ the same model

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind, preset", CASES)
def test_padded_model_equals_unpadded(kind, preset, dtype):
    plain, padded = (build_model(cfg_of(kind, preset, pad), dtype=dtype) for pad in (1, PAD))
    for m in (plain, padded):
        randomize_vectors(m)
    shapes = {n: tuple(p.shape) for n, p in plain.named_parameters()}
    assert padded.logical_shapes() == plain.logical_shapes() == {n: shapes[n] for n in plain.logical_shapes()}
    assert padding_zeros(plain) == 0
    # Counts, FLOPs (and so MFU) are logical; the vectors keep the logical width, so no parameter is padding.
    assert num_params(padded) == num_params(plain) and params_by_role(padded) == params_by_role(plain)
    assert activated_params(padded) == activated_params(plain)
    assert flops_per_token(padded, 128) == flops_per_token(plain, 128)
    assert padding_zeros(padded) == sum(p.numel() for p in padding_of(padded).values()) > 0
    if preset == "unified":  # DNP's inner Norm on gate/up divides by the logical width, not the stored one
        mlp = padded.layers[0].mlp
        branches = [mlp.gate_proj, mlp.up_proj] + ([mlp.shared_expert.gate_proj] if kind == "moe" else [])
        assert all(b.inner.logical == b.d_out and b.inner.dim == PAD for b in branches)

    a, b = forward_backward(plain), forward_backward(padded)
    tol = tolerance(dtype)
    assert (a - b).norm() <= tol * a.norm()
    if kind == "moe":  # the same routing
        assert all(torch.equal(p.mlp.tokens_per_expert, q.mlp.tokens_per_expert)
                   for p, q in zip(plain.layers, padded.layers))
    grads = dict(plain.named_parameters())
    scale = max(p.grad.norm() for p in grads.values())
    for name, q in padded.named_parameters():
        p = grads[name]
        assert torch.equal(crop(q.detach(), p), p.detach()), name  # init draws the logical shape: the same weights
        assert (crop(q.grad, p) - p.grad).norm() <= tol * scale, name
    for name, shape in padded.logical_shapes().items():
        g = dict(padded.named_parameters())[name].grad.clone()
        g[tuple(slice(0, n) for n in shape)] = 0
        assert g.abs().max() == 0, name  # no gradient reaches the padding: exactly 0


# ------------------------------------------------------------------------------------------------ training

def _optimizer(model: Llama, name: str, ns_dtype: str = "bfloat16"):
    opt = build_optimizer(model, model.param_roles(), OptimConfig(name=name, lr=1e-2, weight_decay=0.1))
    for g in opt.param_groups:
        if g["kind"] == "muon":
            g["ns_dtype"] = ns_dtype  # a reference run may orthogonalize in float64
    return opt


def _train(model: Llama, opt, steps: int, check=None) -> None:
    for _ in range(steps):
        forward_backward(model)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if check is not None:
            check()


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_training_keeps_padding_zero_and_matches_unpadded(kind, optimizer):
    """float64 throughout (Newton–Schulz too). The padding stays exactly zero after every step (zero gradients, zero
    moments, weight decay of 0 is 0) and the logical weights follow the unpadded model's: the gradients agree to
    `tolerance`, and AdamW's update lr·m/(√v + ε) has slope up to lr/ε = 1e6 in a gradient entry near ε, so over
    `steps` steps the weights may drift apart by steps·(lr/ε)·tolerance (≈ 4e-7) — far below what a wrong Muon scale
    would do: 0.2·√max(m, n) from the padded shape is 23 % larger for down_proj (42 → 64) and 41 % for the routed
    gate/up (32 → 64), a difference of ~lr = 1e-2."""
    plain, padded = (build_model(cfg_of(kind, "unified", pad), dtype=torch.float64) for pad in (1, PAD))
    opts = [_optimizer(m, optimizer, "float64") for m in (plain, padded)]
    if optimizer == "muon":
        group = next(g for g in opts[1].param_groups if g["kind"] == "muon")
        logical = padded.logical_shapes()
        names = {id(p): n for n, p in padded.named_parameters()}
        assert all(tuple(s) == logical.get(names[id(p)], tuple(p.shape))
                   for p, s in zip(group["params"], group["logical_shapes"]))

    def zero() -> None:
        assert all(t.abs().max() == 0 for t in padding_of(padded).values())

    steps = 3
    _train(plain, opts[0], steps)
    _train(padded, opts[1], steps, check=zero)
    params, tol = dict(plain.named_parameters()), steps * (1e-2 / OptimConfig().eps) * tolerance(torch.float64)
    for name, q in padded.named_parameters():
        p = params[name].detach()
        assert (crop(q.detach(), p) - p).norm() <= tol * max(p.norm(), 1.0), name
    state = opts[1].state  # AdamW's moments and Muon's momentum are zero in the padding too
    for name, shape in padded.logical_shapes().items():
        for t in state[dict(padded.named_parameters())[name]].values():
            if t.dim():
                outside = t.clone()
                outside[tuple(slice(0, n) for n in shape)] = 0
                assert outside.abs().max() == 0, name


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_padding_stays_zero_under_bf16_muon(kind):
    """The production path: float32 master weights, Newton–Schulz in bf16 — its zero rows and columns stay exact."""
    model = build_model(cfg_of(kind, "unified", PAD))
    opt = _optimizer(model, "muon")

    def zero() -> None:
        assert all(t.abs().max() == 0 for t in padding_of(model).values())

    _train(model, opt, 3, check=zero)
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------------------------- checkpoints

def _saved(tmp_path: Path, cfg: ModelConfig, optimizer: str) -> tuple[Path, Llama]:
    model = build_model(cfg)
    opt = _optimizer(model, optimizer, "float32")
    _train(model, opt, 2)
    return save_checkpoint(tmp_path / "ckpt", 2, model, opt, {"step": 2}, keep=1), model


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_checkpoint_loads_across_paddings(tmp_path, kind, optimizer):
    """A checkpoint written without padding (as before ffn_pad_multiple; the routed experts were padded to 8) resumes
    in a padded model: the same logical weights and optimizer state, the padding zero, and the next step the same
    (to float32's tolerance; Newton–Schulz in float32, as bf16 would round the two apart by bf16's ε)."""
    old, new = cfg_of(kind, "unified", 1, routed_pad=8 if kind == "moe" else None), cfg_of(kind, "unified", PAD)
    path, before = _saved(tmp_path, old, optimizer)
    model = build_model(new, seed=7)
    opt = _optimizer(model, optimizer, "float32")
    assert load_checkpoint(path, model, opt) == {"step": 2}
    ref = dict(before.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(crop(p.detach(), ref[name]), crop(ref[name].detach(), p)), name
    assert all(t.abs().max() == 0 for t in padding_of(model).values())
    ref_opt = _optimizer(before, optimizer, "float32")
    load_checkpoint(path, before, ref_opt)  # the same starting point (the same code path for its state)
    for p, q in zip(before.parameters(), model.parameters()):
        for key, t in ref_opt.state[p].items():
            assert torch.equal(crop(opt.state[q][key], t), crop(t, opt.state[q][key])), key
    _train(before, ref_opt, 1)
    _train(model, opt, 1)
    a, b = before(TOKENS), model(TOKENS)
    assert (a - b).norm() <= tolerance(torch.float32) * a.norm()

    back = build_model(old, seed=8)  # and back: a padded checkpoint into an unpadded model (a tool's weights)
    padded_path = save_checkpoint(tmp_path / "padded", 3, model, opt, {"step": 3}, keep=1)
    load_model_weights(back, padded_path)
    assert (back(TOKENS) - b).norm() <= tolerance(torch.float32) * b.norm()


def test_non_zero_padding_is_refused(tmp_path):
    path_model = build_model(cfg_of("dense", "baseline", PAD))
    with torch.no_grad():
        path_model.layers[0].mlp.down_proj.weight[:, -1] = 1.0  # not padding any more
    path = save_checkpoint(tmp_path / "ckpt", 1, path_model, None, {"step": 1}, keep=1)
    with pytest.raises(CheckpointError, match=r"layers\.0\.mlp\.down_proj\.weight .* non-zero entries"):
        load_model_weights(build_model(cfg_of("dense", "baseline", 1)), path)


def test_a_config_from_before_the_key_resumes():
    """resume_conflicts reads a key missing from a checkpoint's config as its default: the padding keys are storage
    only (the loader re-pads), so an old config (no ffn_pad_multiple, moe.pad_multiple: 8) resumes; its YAML loads."""
    cfg = load_config("configs/tiny_moe.yaml")
    old = cfg.to_dict()
    del old["model"]["ffn_pad_multiple"]
    old["model"]["moe"]["pad_multiple"] = 8
    assert resume_conflicts(yaml.safe_dump(old), cfg) == []
    assert resume_conflicts(yaml.safe_dump(old), replace(cfg, model=replace(cfg.model, d_model=128)))
    resolved = load_config(["configs/tiny_moe.yaml"], ["model.moe.pad_multiple=8", "model.ffn_pad_multiple=64"]).model
    assert resolved.padded_ffn(170, routed=True) == 176 and resolved.padded_ffn(170) == 192


def test_inspect_model_reports_logical_counts(capsys):
    import json
    from scripts import inspect_model
    assert inspect_model.main(["--config", "configs/dense/0.25b.yaml", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["total_params"] == 254_018_560 and info["ffn_pad_multiple"] == 64  # docs/paper.md §2.3, d_FFN 2730
    assert info["padding_zeros"] == 12 * 3 * (2752 - 2730) * 1024


def test_an_unpadded_run_resumes_padded_with_the_same_command(data_dir, tmp_path):
    """train.py end to end: a run stopped with unpadded FFNs (a checkpoint from before ffn_pad_multiple) continues
    under the default padding (hidden 48 stored as 64) — no settings conflict, and the loss curve of the uninterrupted
    unpadded run, to float32's rounding."""
    import train
    from test_train import args_for, records
    old = ["model.d_ffn=48", "model.ffn_pad_multiple=1"]
    train.main(args_for(data_dir, tmp_path, "full", *old))
    train.main(["--stop-at-step", "3", *args_for(data_dir, tmp_path, "part", *old)])
    train.main(args_for(data_dir, tmp_path, "part", "model.d_ffn=48"))  # the same command, padded (the default)
    full, part = ([r["loss"] for r in records(tmp_path / name, "train")] for name in ("full", "part"))
    assert len(part) == len(full) == 6 and part[:3] == full[:3]
    assert all(abs(a - b) <= tolerance(torch.float32) * a for a, b in zip(full[3:], part[3:]))


# ---------------------------------------------------------------------------------------- FSDP2 (DTensors)

def _fsdp_worker(rank: int, rdzv: Rendezvous, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from runtime.build import build_training_model
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(rdzv.port(rank)))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        states = []
        for pad in (1, PAD):
            cfg = load_config(["configs/tiny_moe.yaml"], [
                "model.d_model=32", "model.n_layers=2", "model.n_heads=2", f"model.d_ffn={D_FFN}",
                f"model.vocab_size={V}", "model.moe.n_experts=4", "model.moe.top_k=2", f"model.ffn_pad_multiple={pad}",
                "optim.name=muon", "train.dtype=float32", "train.compile=false"])
            built = build_training_model(cfg, torch.device("cpu"))
            if pad == 1:
                _train(built.model, built.optimizer, 1)
                path = save_checkpoint(Path(out), 1, built.model, built.optimizer, {"step": 1}, keep=1)
            else:
                load_checkpoint(path, built.model, built.optimizer)
            states.append((get_model_state_dict(built.model, options=full), built.model.logical_shapes()))
        if rank == 0:
            (old, _), (new, logical) = states
            assert any(new[n].shape != shape for n, shape in logical.items()), "the model is padded"
            for name, t in old.items():
                assert torch.equal(crop(new[name], t), t), name
            for name, shape in logical.items():
                assert new[name].count_nonzero() == old[name].count_nonzero(), name  # the padding is zero
    finally:
        dist.barrier()
        dist.destroy_process_group()


def test_two_rank_unpadded_checkpoint_loads_into_padded_shards(tmp_path):
    from multiproc import Rendezvous, spawn
    spawn(_fsdp_worker, (Rendezvous.new(), str(tmp_path / "ckpt")), nprocs=2)

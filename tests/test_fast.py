"""The fast path (fast/) against the reference model (model/): the same function, values and gradients to float64
rounding, for every design; banks that are their vectors; checkpoints under the reference's names that resume on
either path; and a design the fast path does not know refused in one line, while the reference trains it."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from fast import FastPathError, apply_fast_path, build_fast_model
from fast.banks import ScaleBank, BankedVector, banked, unbanked, reference_parameters
from fast.branches import FastExpertBranch, FastNorm
from model.config import Role
from model.llama import Llama, build_model
from model.moe import loop_matmul
from model.rope import rope_tables
from model.scaling import ExpertBranch, GroupLayout, Norm, rms_normalize
from model.vectors import ScaleVector
from optim import build_optimizer
from optim.config import OptimConfig
from runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from test_loss import assert_grads_close, bound
from test_model import PRESETS, preset_model_cfg, randomize_vectors
from test_moe import moe_cfg

TOKENS = torch.randint(0, 67, (2, 25), generator=torch.Generator().manual_seed(0))
SCALE = (Role.SCALE_INPUT, Role.SCALE_OUTPUT)


def twins(cfg, seed: int = 1) -> tuple[Llama, Llama]:
    """The reference model and the fast path's, float64, with the same random vectors: the fast one loads the
    reference's weights by the reference's names, as a checkpoint does."""
    ref = build_model(cfg, dtype=torch.float64)
    randomize_vectors(ref, seed)
    fast = build_fast_model(cfg, dtype=torch.float64)
    fast.load_state_dict(banked(fast, ref.state_dict()))
    return ref, fast


def loss_and_grads(model: Llama, chunk: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss on TOKENS over chunks of `chunk` rows, and every gradient by the reference's names."""
    model.zero_grad(set_to_none=True)
    loss = model(TOKENS[:, :-1], TOKENS[:, 1:], loss_chunk=chunk)
    loss.backward()
    return loss.detach(), unbanked(model, {n: p.grad for n, p in model.named_parameters()})


@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("name", PRESETS)
def test_the_fast_path_computes_the_reference_function(name, moe):
    """Every design, dense and MoE: the same weights under the same names at init, then the same loss and every
    gradient to float64 rounding (the fast path reorders products: vectors folded into W, u handed on, the DNP
    head's formulas written out), over chunks of 16 rows and on full logits."""
    cfg = replace(moe_cfg(name), vocab_size=67) if moe else preset_model_cfg(name)
    init_ref, init_fast = build_model(cfg, seed=4), build_fast_model(cfg, seed=4)
    for n, p in init_ref.named_parameters():
        assert torch.equal(reference_parameters(init_fast)[n], p.detach()), n
    ref, fast = twins(cfg)
    for chunk in (16, 0):
        ref_loss, ref_grads = loss_and_grads(ref, chunk)
        loss, grads = loss_and_grads(fast, chunk)
        assert torch.allclose(loss, ref_loss, rtol=bound(torch.float64, 48), atol=0), chunk
        assert grads.keys() == ref_grads.keys()
        assert_grads_close(grads, ref_grads, torch.float64, 67)


EXTRA = {  # the knobs the presets above leave at one value on the fast path
    "router": lambda: replace(moe_cfg("unified"), vocab_size=67, scale=replace(moe_cfg("unified").scale, router=True)),
    "shared_gate": lambda: replace(moe_cfg("hg_dnp_or", shared_gate=True, n_shared=1), vocab_size=67),
    "gqa_dp": lambda: preset_model_cfg("hg_dp_or", n_kv_heads=2),
    "gqa_gemma": lambda: preset_model_cfg("gemma", n_kv_heads=2),
    "no_head": lambda: replace(preset_model_cfg("unified"), scale=replace(preset_model_cfg("unified").scale,
                                                                          lm_head=False)),
}


@pytest.mark.parametrize("case", list(EXTRA))
def test_the_fast_path_computes_the_reference_function_off_the_presets(case):
    """The router's output side and DNP of its logits, the shared-expert gate, GQA outside unified, an LM head
    without DNP under unified: the same loss and gradients to float64 rounding."""
    ref, fast = twins(EXTRA[case]())
    ref_loss, ref_grads = loss_and_grads(ref, 16)
    loss, grads = loss_and_grads(fast, 16)
    assert torch.allclose(loss, ref_loss, rtol=bound(torch.float64, 48), atol=0)
    assert_grads_close(grads, ref_grads, torch.float64, 67)


def test_the_fast_path_refuses_a_built_model():
    """Applied after materialization it would bank the vectors into fresh, unset tensors: refused."""
    with pytest.raises(ValueError, match="meta device"):
        apply_fast_path(build_model(preset_model_cfg("hg_dp")))


def test_the_fast_norm_is_the_reference_norm():
    """FastNorm's forward is rms_normalize op for op (bit for bit, fp32 and bf16, whole and per head, padded); its
    written-out backward is the formula's to fp64 rounding."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(5, 12, generator=gen).to(dtype)
        for ref, fast in ((Norm(12, 1e-6, None), FastNorm(12, 1e-6, None)),
                          (Norm(12, 1e-6, None, group=4), FastNorm(12, 1e-6, None, group=4)),
                          (Norm(12, 1e-6, None, logical=9), FastNorm(12, 1e-6, None, logical=9))):
            assert torch.equal(fast(x), ref(x))
    x = torch.randn(4, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    g = torch.randn(4, 8, dtype=torch.float64, generator=gen)
    ref, = torch.autograd.grad(rms_normalize(x, 1e-3), x, g)
    got, = torch.autograd.grad(FastNorm(8, 1e-3, None)(x), x, g)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)  # 8-term sums in fp64
    assert torch.equal(rms_normalize(x, 1e-3), Norm(8, 1e-3, None)(x))


@pytest.mark.parametrize("n_kv_heads", [4, 2])  # 2: GQA, where query head j reads kv head j // 2
@pytest.mark.parametrize("tokens", [2, 48])  # fewer rows than the widths: vectors on the activations; more: on W
def test_dnp_u_handed_on_equals_u_on_the_activations(n_kv_heads, tokens):
    """DNP's u_v and u_up scale o_proj's and down_proj's columns (FastScaledLinear, `hand_on`): the reference's
    attention and MLP, values and gradients, with GQA and a padded FFN hidden."""
    from fast.banks import bank_members
    cfg = preset_model_cfg("unified", n_kv_heads=n_kv_heads, ffn_pad_multiple=32)  # hidden 48 stored as 64
    ref_model, fast_model = twins(cfg)
    (ref, fast) = (ref_model.layers[0], fast_model.layers[0])
    assert fast.mlp.up_proj.weight.shape[0] == 64 and fast.attn.v_proj.handed_on() is not None
    assert bank_members(fast_model)
    h = torch.randn(1, tokens, cfg.d_model, dtype=torch.float64, requires_grad=True)
    cos, sin = rope_tables(tokens, cfg.head_dim, cfg.rope_theta, h.device, h.dtype)
    for got_fn, ref_fn in ((lambda: fast.attn(h, cos, sin), lambda: ref.attn(h, cos, sin)),
                           (lambda: fast.mlp(h), lambda: ref.mlp(h))):
        got, want = got_fn(), ref_fn()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)  # fp64, the same terms reassociated
        g = torch.randn_like(want)
        names = [f"layers.0.{n}" for n, _ in fast.named_parameters()]  # the model's names, banks whole
        got_grads = torch.autograd.grad(got, [h, *fast.parameters()], g, allow_unused=True)
        a = unbanked(fast_model, {n: t for n, t in zip(["h", *names], got_grads) if t is not None})
        ref_grads = torch.autograd.grad(want, [h, *ref.parameters()], g, allow_unused=True)
        b = {n: t for n, t in zip(["h", *[f"layers.0.{n}" for n, _ in ref.named_parameters()]], ref_grads)
             if t is not None}
        for name, grad in b.items():  # ≤ 48-row sums through the Norms' backward: 1e-10 relative
            torch.testing.assert_close(a[name], grad, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("rows_per_expert", [1, 9])
def test_expert_u_handed_on_to_down_equals_u_on_the_rows(rows_per_expert):
    """DNP's u_e of the experts' up branch scales down_proj's columns (FastExpertBranch, `hand_on`): the reference
    ExpertBranch's function, values and gradients in fp64, with padded hidden units (5 → 8)."""
    E, d, f, pad = 3, 4, 5, 8
    up = FastExpertBranch(E, d, f, pad, inner=FastNorm(pad, 1e-6, None, logical=f),
                          out_scale=ScaleVector(f, "or", Role.SCALE_OUTPUT, count=E)).double()
    down = FastExpertBranch(E, f, d, d_in_padded=pad).double()
    with torch.no_grad():
        for br in (up, down):
            br.weight.normal_()
        up.weight[:, f:] = 0.0
        down.weight[:, :, f:] = 0.0
        for p in up.out_scale.parameters():
            p.uniform_(0.5, 1.5)
    counts = [rows_per_expert] * E
    expert_of_row = torch.arange(E).repeat_interleave(rows_per_expert)
    matmul = lambda a, w: loop_matmul(a, w, counts)  # noqa: E731
    x = torch.randn(E * rows_per_expert, d, dtype=torch.float64, requires_grad=True)
    gate = F.silu(torch.randn(E * rows_per_expert, pad, dtype=torch.float64))
    got = down(gate * up(x, expert_of_row, matmul, hand_on=True), expert_of_row, matmul, handed=up.handed_on())
    ref = ExpertBranch.forward(down, gate * ExpertBranch.forward(up, x, expert_of_row, matmul), expert_of_row,
                               matmul)  # the reference's equation on the same modules
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)  # float64, ≤ 8-term sums reassociated
    params = [x, *up.parameters(), *down.parameters()]
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(got, params, g), torch.autograd.grad(ref, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)  # ≤ 27-row sums with the Norm's cancellation


# ----------------------------------------------------------------------------------------------------- banks

def test_a_unified_block_holds_four_scale_tensors():
    """HG + DNP + OR: 10 vectors per block, α and β each, in 2 banks of 2 tensors (every input-side vector is one
    only an inner Norm reads: its own bank); the head's 2 vectors keep theirs."""
    model = build_fast_model(preset_model_cfg("unified_literal"))
    roles = model.param_roles()
    scale = [n for n, r in roles.items() if r in SCALE]
    assert sorted(n for n in scale if n.startswith("layers.0.")) == [
        f"layers.0.scales.{side}.{kind}" for side in ("input_invariant", "output") for kind in ("alpha", "beta")]
    assert len([n for n in scale if not n.startswith("layers.")]) == 4  # the final norm's γ, the head's u: α, β each
    bank = model.layers[0].scales["input_invariant"]
    assert bank.n_vectors == 5 and bank.alpha.shape == (5 * model.cfg.d_model,) and bank.beta.shape == (5,)
    assert isinstance(model.layers[0].attn.q_proj.in_scale, BankedVector)
    assert sum(p.numel() for n, p in model.named_parameters() if roles[n] in SCALE) == \
        sum(sv.numel() for _, sv in build_model(preset_model_cfg("unified_literal")).scale_vectors())


@pytest.mark.parametrize("reparam", ["direct", "or", "er"])
def test_a_banked_vector_is_its_own_vector(reparam):
    """γ and its gradient from a slice of the bank equal a vector's own parameters', bit for bit, stacks included."""
    own = [ScaleVector(6, reparam, Role.SCALE_OUTPUT).double(),
           ScaleVector(4, reparam, Role.SCALE_OUTPUT, count=3).double()]
    bank = ScaleBank(own).double()
    views = [BankedVector(v, slot) for v, slot in zip(own, bank.slots)]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in bank.parameters():
            p.copy_(0.5 + torch.rand(p.shape, generator=gen, dtype=p.dtype))
        for sv, view in zip(own, views):
            for kind in sv.kinds:
                getattr(sv, kind).copy_(view.part(kind))
    weights = [torch.randn(6, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)]
    sum((sv() * w).sum() for sv, w in zip(own, weights)).backward()
    sum((sv() * w).sum() for sv, w in zip(views, weights)).backward()
    for a, b in zip(own, views):
        assert torch.equal(a(), b())
    for kind in own[0].kinds:
        expected = torch.cat([getattr(sv, kind).grad.reshape(-1) for sv in own])
        assert torch.equal(getattr(bank, kind).grad, expected), kind


def test_init_makes_every_banked_vector_one():
    model = build_fast_model(preset_model_cfg("unified_literal"))
    for _, sv in model.scale_vectors():
        assert torch.equal(sv(), torch.ones_like(sv())), sv


# ------------------------------------------------------------------------------------------------ checkpoints

def _trained(fast: bool, seed: int) -> tuple[Llama, torch.optim.Optimizer]:
    """The unified model, on the fast path or not, after 2 AdamW steps on random tokens (vectors randomized first:
    every slice differs)."""
    cfg = preset_model_cfg("unified_literal")
    ref = build_model(cfg, dtype=torch.float64)
    randomize_vectors(ref, seed)
    model = build_fast_model(cfg, dtype=torch.float64) if fast else ref
    if fast:
        model.load_state_dict(banked(model, ref.state_dict()))
    opt = build_optimizer(model, model.param_roles(), OptimConfig(lr=1e-2), fused=True)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(2):
        x = torch.randint(0, cfg.vocab_size, (2, 9), generator=gen)
        model(x[:, :-1], x[:, 1:], loss_chunk=0).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _moments(model: Llama, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every parameter and optimizer state tensor by the reference's names."""
    out = {}
    for kind in ("param", "exp_avg", "exp_avg_sq", "step"):
        by_param = {n: (p.detach() if kind == "param" else opt.state[p][kind]) for n, p in model.named_parameters()}
        if kind == "step":
            members = unbanked(model, {n: t.expand(p.numel()) for (n, t), p in zip(by_param.items(),
                                                                                     model.parameters())})
            out.update({f"{n}.step": t.reshape(-1)[0] for n, t in members.items()})
        else:
            out.update({f"{n}.{kind}": t for n, t in unbanked(model, by_param).items()})
    return out


@pytest.mark.parametrize("saved_fast", [True, False])
def test_a_checkpoint_resumes_on_either_path(tmp_path, saved_fast):
    """Saved on one path, loaded on the other: the checkpoint holds the reference's names (no bank reaches disk),
    and every weight and AdamW state comes back bit for bit."""
    model, opt = _trained(saved_fast, seed=1)
    save_checkpoint(tmp_path, 2, model, opt, {"step": 2}, keep=1)
    meta = dcp.FileSystemReader(str(next(tmp_path.glob("step_*")))).read_metadata().state_dict_metadata
    assert "model.layers.0.attn.q_proj.in_scale.alpha" in meta
    assert "optim.state.layers.0.attn.q_proj.in_scale.alpha.exp_avg" in meta
    assert not any(".scales." in k for k in meta)
    other, other_opt = _trained(not saved_fast, seed=2)  # other weights and moments everywhere
    load_checkpoint(tmp_path, other, other_opt)
    want, got = _moments(model, opt), _moments(other, other_opt)
    assert want.keys() == got.keys()
    for key, t in want.items():
        assert torch.equal(got[key].to(t.dtype), t), key


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_vectors_of_one_bank_with_different_step_counts_are_refused(tmp_path):
    """A bank has one AdamW step count: a checkpoint whose vectors differ there cannot go into one."""
    model, opt = _trained(False, seed=1)
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    state["optim"]["state"]["layers.0.attn.k_proj.in_scale.alpha"]["step"] += 1
    save_checkpoint(tmp_path, 2, model, opt, {"step": 2}, keep=1)
    step_dir = next(tmp_path.glob("step_*"))
    for f in [*step_dir.glob("*.distcp"), step_dir / ".metadata"]:
        f.unlink()
    dcp.save(state, checkpoint_id=step_dir, no_dist=True)
    for f in step_dir.glob("checksums_rank*.json"):  # the files were rewritten on purpose
        f.unlink()
    fast, fast_opt = _trained(True, seed=2)
    with pytest.raises(CheckpointError, match="different optimizer 'step' values"):
        load_checkpoint(tmp_path, fast, fast_opt)


# ---------------------------------------------------------------------------------------- designs it knows

class ToyVector(ScaleVector):
    """A design of its own: γ = 2·sigmoid(w − 1), w₀ = 1 (so γ₀ = 1), written in the reference alone."""

    def forward(self) -> torch.Tensor:
        return 2 * torch.sigmoid(self.part("weight") - 1)


def toy_input_vector(self: GroupLayout, dim: int, only_norms_read: bool) -> ScaleVector:
    return ToyVector(dim, "direct", Role.SCALE_INPUT)


def test_the_fast_path_refuses_a_design_it_does_not_know():
    cfg = preset_model_cfg("hg_dp")
    with torch.device("meta"):
        model = Llama(cfg)
        model.layers[0].attn.q_proj.in_scale = ToyVector(cfg.d_model, "direct", Role.SCALE_INPUT)
    with pytest.raises(FastPathError, match=r"does not know ToyVector at layers\.0\.attn\.q_proj\.in_scale.*"
                                            r"train\.fast_path=false"):
        apply_fast_path(model)
    with torch.device("meta"):
        model = Llama(cfg)
    model.cfg = replace(cfg, scale=replace(cfg.scale, reparam="sigmoid"))  # a value a new design would add
    with pytest.raises(FastPathError, match=r"model\.scale\.reparam='sigmoid'"):
        apply_fast_path(model)


def test_the_first_run_shows_no_recompute_caution():
    """torch's four-line caution about in-place ops in a compiled checkpoint with a context_fn (our recomputed
    regions hold none) is dropped on its logger once the fast path is applied; other warnings there pass."""
    import logging
    build_fast_model(preset_model_cfg("unified"))
    logger = logging.getLogger("torch._higher_order_ops.wrap")

    def passes(msg: str) -> bool:
        return all(f.filter(logging.LogRecord(logger.name, logging.WARNING, __file__, 1, msg, None, None))
                   for f in logger.filters)
    assert not passes("\nDetected that context_fn is passed to torch.utils.checkpoint under torch.compile.\nPlease")
    assert passes("something else")

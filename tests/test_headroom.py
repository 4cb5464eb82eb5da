"""Magnitudes that only a Norm reads (docs/paper.md §1.7): the design without them (model.scale.invariant_magnitude:
remove), each DNP inner Norm's headroom in every evaluation, and the warning when one stops normalizing."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import train
from scripts import plot, summarize
from config import load_config
from strictconfig.config import ConfigError
from model.llama import Llama, build_model
from model.summary import num_params
from runtime.telemetry import HeadroomSite, HeadroomWatch, norm_headroom
from train_harness import args_for, data_dir, records  # noqa: F401  (data_dir is a fixture)

SMALL = dict(d_model=32, n_layers=2, n_heads=4, vocab_size=67, d_ffn=48)
TOKENS = torch.randint(0, 67, (2, 9), generator=torch.Generator().manual_seed(0))


def model_cfg(preset: str, moe: bool = False, **scale):
    cfg = load_config(["configs/tiny_moe.yaml" if moe else "configs/tiny_cpu.yaml", f"configs/scale/{preset}.yaml"])
    return replace(cfg.model, **SMALL, scale=replace(cfg.model.scale, **scale))


def fp64(cfg) -> Llama:
    model = build_model(cfg, "cpu").double()
    model.init_weights(0)
    return model


U = "unified_literal"  # the paper's unified, whose magnitudes `remove` drops (configs/scale/unified.yaml drops them)
CASES = [("hg_dnp", False, {}), ("hg_dnp_or", False, {}), ("hg_dnp_er", False, {}), (U, False, {}), (U, True, {}),
         (U, True, {"router": True}), (U, False, {"heterogeneous": False}), (U, True, {"heterogeneous": False}),
         (U, True, {"heterogeneous": False, "router": True})]


@pytest.mark.parametrize("preset,moe,scale", CASES)
def test_removing_the_invariant_magnitudes_keeps_the_function_at_init(preset, moe, scale):
    """γ = 1 at init in both forms, so the logits agree; the parameters the new form drops are exactly the β that
    Llama.invariant_magnitudes marks in the literal form (OR, ER; a direct vector has no β of its own)."""
    literal = fp64(model_cfg(preset, moe, **scale))
    removed = fp64(model_cfg(preset, moe, **scale, invariant_magnitude="remove"))
    ref = literal(TOKENS)
    # float64: both forms multiply by γ = 1 up to OR's √d·α/‖α‖ rounding (a few u₆₄ = 2⁻⁵³) through 2 blocks: ≲ 1e-14
    assert ((removed(TOKENS) - ref).norm() / ref.norm()).item() <= 1e-12
    dropped = num_params(literal) - num_params(removed)
    params = dict(literal.named_parameters())
    marked = sum(params[n].numel() for n in literal.invariant_magnitudes())
    if literal.cfg.scale.reparam == "direct":  # a direct vector's weight becomes its direction α: same count
        assert dropped == 0 and not removed.invariant_magnitudes()
    else:
        assert dropped == marked > 0
    assert not removed.invariant_magnitudes()  # nothing left for optim.scale_wd_invariant to spare


def test_only_vectors_that_only_norms_read_lose_their_magnitude():
    """The MoE router has no inner Norm unless model.scale.router: its input-side vector keeps β, and so does a shared
    FFN γ that the router reads; the attention's shared γ and every DNP branch's own v lose it."""
    hg = fp64(model_cfg("unified", True, invariant_magnitude="remove")).layers[0]
    assert hg.mlp.router.in_scale.has_magnitude and not hg.mlp.gate_proj.in_scale.has_magnitude
    assert not hg.attn.q_proj.in_scale.has_magnitude
    shared = fp64(model_cfg("unified", True, heterogeneous=False, invariant_magnitude="remove")).layers[0]
    assert not shared.attn_norm.scale.has_magnitude and shared.ffn_norm.scale.has_magnitude
    routed = fp64(model_cfg("unified", True, heterogeneous=False, router=True, invariant_magnitude="remove"))
    assert not routed.layers[0].ffn_norm.scale.has_magnitude
    head = fp64(model_cfg("unified", lm_head=False, invariant_magnitude="remove"))
    assert head.norm.scale.has_magnitude  # the LM head without DNP reads the final norm's γ directly


@pytest.mark.parametrize("reparam", ["direct", "or", "er"])
def test_a_vector_without_magnitude_is_its_direction(reparam):
    """OR γ = Norm(α), direct γ = Norm(α), ER γ = e^(α − mean α): any scale of α (any shift, for ER) is the same γ."""
    from model.config import Role
    from model.vectors import ScaleVector
    v = ScaleVector(6, reparam, Role.SCALE_INPUT, magnitude=False).double()
    assert v.kinds == ("alpha",)
    a = torch.tensor([0.5, 1.5, 2.0, 0.25, 1.0, 3.0], dtype=torch.float64)
    with torch.no_grad():
        v.alpha.copy_(a)
    gamma = v()
    with torch.no_grad():
        v.alpha.copy_(a + 0.7 if reparam == "er" else 3.0 * a)
    torch.testing.assert_close(v(), gamma, rtol=1e-15, atol=0)
    assert torch.allclose(gamma, torch.exp(a - a.mean()) if reparam == "er" else a / a.pow(2).mean().sqrt())


def test_the_knob_is_refused_where_it_means_nothing():
    with pytest.raises(ConfigError, match="model.scale.invariant_magnitude"):
        load_config(["configs/tiny_cpu.yaml", "configs/scale/hg_dp_or.yaml"], ["model.scale.invariant_magnitude=remove"])
    with pytest.raises(ConfigError, match="optim.scale_wd_invariant"):
        load_config("configs/tiny_cpu.yaml", ["model.scale.invariant_magnitude=remove", "optim.scale_wd_invariant=false"])


# ------------------------------------------------------------------------------------------------ headroom

def test_headroom_is_the_inner_norms_input_mean_square_over_eps():
    """Layer 0's q branch by hand: z = W_q (v ⊙ Norm(embedding)), per head mean square over head_dim, averaged over
    the rows and heads, over eps; the LM head's over the vocabulary. Each site's magnitude is its vectors' β."""
    model = fp64(model_cfg(U))
    with torch.no_grad():
        model.layers[0].attn.q_proj.in_scale.part("beta").fill_(0.01)
    sites = {s.key: s for s in norm_headroom(model, TOKENS)}
    blk, eps = model.layers[0], model.cfg.norm_eps
    h = blk.attn_norm(model.tok_embeddings(TOKENS))
    z = torch.nn.functional.linear(h * blk.attn.q_proj.in_scale(), blk.attn.q_proj.weight)  # (B, T, H·hd)
    want = z.unflatten(-1, (model.cfg.n_heads, -1)).pow(2).mean(-1).mean().item() / eps
    q = sites["headroom/L0/attn.q_proj"]
    assert q.headroom == pytest.approx(want, rel=1e-12) and q.magnitude == pytest.approx(0.01, rel=1e-6)
    assert len(sites) == model.cfg.n_layers * 5 + 1 and "headroom/head/lm_head" in sites
    assert all(s.headroom > 100 for k, s in sites.items() if k != "headroom/L0/attn.q_proj")  # init: W ~ N(0, 0.02²)
    assert norm_headroom(fp64(model_cfg("hg_dp_or")), TOKENS) == []  # no inner Norm, nothing to measure


def test_the_probe_does_not_recompile_compiled_blocks():
    """The probe runs compiled blocks eagerly (torch.compiler.set_stance) with its hooks, then removes them: the next
    compiled forward reuses its graphs."""
    model = fp64(model_cfg("unified"))
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    for block in model.layers:
        block.compile(backend=counting, fullgraph=True)
    torch._dynamo.reset()
    model(TOKENS)
    compiled = len(graphs)
    sites = norm_headroom(model, TOKENS)
    assert sites and all(h.headroom > 0 for h in sites)
    model(TOKENS)
    assert compiled > 0 and len(graphs) == compiled
    torch._dynamo.reset()


def test_the_watch_warns_once_per_site_naming_the_worst():
    watch = HeadroomWatch("keep", 1.0)
    ok = HeadroomSite("L0", "attn.q_proj", 5e3, 1.0)
    assert watch.check(10, [ok]) is None
    low = [HeadroomSite("L1", "attn.k_proj", 2e-8, 3e-6), HeadroomSite("L0", "mlp.up_proj", 0.5, 0.2), ok]
    line = watch.check(20, low)
    assert line.startswith("step 20: L1 attn.k_proj:") and "3e-06" in line and "and 1 more: L0 mlp.up_proj" in line
    assert "model.scale.invariant_magnitude=remove" in line
    assert watch.check(30, low) is None  # said once
    line = HeadroomWatch("remove", 1.0).check(5, [HeadroomSite("L0", "attn.v_proj", 0.1, 1.0)])
    assert "invariant_magnitude" not in line and "optim.lr" in line
    assert HeadroomWatch("keep", 1.0).check(1, [HeadroomSite("L0", "x", math.nan, 1.0)]) is not None  # NaN: none
    assert HeadroomWatch("keep", 0.0).check(1, low) is None  # log.headroom_warn 0: never


def _collapse_run(data_dir, tmp_path, name, *extra):
    """120 steps at a constant lr 2e-2 with weight decay 10, far faster than the paper's recipe: decay walks the
    input-side β toward 0 within tens of steps. Over 200 such steps (batch 8), seeds 0–2 ended with a smallest
    headroom of 4e-26 to 2e-23 in the literal form and 1e3 without the magnitudes."""
    argv = args_for(data_dir, tmp_path, name, "train.steps=120", "train.eval_every=20", "train.global_batch=4",
                    "train.micro_batch=4", "optim.lr=2e-2", "optim.weight_decay=10", "schedule.min_lr_ratio=1",
                    "log.every=60", *extra)
    train.main(argv)
    evals = records(tmp_path / name, "eval")
    return min(v for r in evals for k, v in r.items() if k.startswith("headroom/"))


def test_a_collapsing_run_warns_and_the_new_form_keeps_its_headroom(data_dir, tmp_path, capsys):
    """The literal form's β collapse switches branches off: headroom in metrics.jsonl falls orders below 1 and one
    warning line names the layer, the site and the setting. Without the magnitude, headroom stays far above."""
    literal = _collapse_run(data_dir, tmp_path, "literal", "model.scale.invariant_magnitude=keep")
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "stopped normalizing" in line]
    assert literal < 1e-3 and warnings, err
    assert all(line.startswith("warning: step ") and " L" in line for line in warnings)
    assert "model.scale.invariant_magnitude=remove" in warnings[0]
    removed = _collapse_run(data_dir, tmp_path, "removed", "model.scale.invariant_magnitude=remove")
    assert removed > 100 and "stopped normalizing" not in capsys.readouterr().err
    # summarize marks the run and names the site; plot draws the headroom on its log axis
    assert summarize.main([str(tmp_path / "literal"), str(tmp_path / "removed")]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "stopped normalizing at step" in rows["literal"] and "stopped" not in rows["removed"]
    out = tmp_path / "headroom.png"
    assert plot.main([str(tmp_path / "literal"), "--metric", "headroom", "--out", str(out)]) == 0 and out.stat().st_size


def test_the_cost_harness_times_the_probe_beside_an_evaluation(data_dir, tmp_path, capsys):
    from harness import headroom_cost
    argv = args_for(data_dir, tmp_path, "cost")
    assert headroom_cost.main([*argv[:4], "--repeats", "1", *argv[4:]]) == 0
    out = capsys.readouterr().out
    assert "11 inner Norms" in out and "probe / evaluate:" in out and "evaluate" in out

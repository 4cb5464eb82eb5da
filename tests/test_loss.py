"""The LM head + loss over chunks, the reference's (model/loss.py) and the fast path's fused one (fast/head.py),
against full logits, then cross-entropy."""
from dataclasses import replace

import pytest
import torch

from torch.utils._python_dispatch import TorchDispatchMode

from config import load_config
from fast import build_fast_model as build_model
from fast.head import FusedHeadLoss, _weight_grad_mode
from model.llama import build_model as build_reference
from model.loss import CUDA_CHUNK_BYTES, CUDA_CHUNK_RANGE, chunked_cross_entropy, default_chunk_tokens
from test_model import PRESETS, preset_model_cfg, randomize_vectors


def bound(dtype, length):
    """The tolerance of a result whose rounding comes from reductions of up to `length` terms in `dtype`, relative
    to its scale: length · eps bounds the relative error of such a sum in any order (Higham's γ_n; what two CPU
    kinds' different blocked orders can differ by), and 16 covers the few reductions chained on the way (norm, matmul,
    softmax, their backward) and terms larger than the result (cancellation). Not from one machine's output."""
    return 16 * length * torch.finfo(dtype).eps


def loss_and_grads(model, x, y, chunk, scale=1.0):
    model.zero_grad(set_to_none=True)
    loss = model(x, y, loss_chunk=chunk)
    (loss * scale).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def terms(ref, name):
    """What sets the rounding of gradient `name`: itself, except OR/ER's β, whose gradient sums terms of α's size
    (∂L/∂γᵢ·γᵢ over the channels) that cancel to ~0 for the final norm's β under a DNP head (the vocabulary Norm makes
    the loss invariant to that scale)."""
    return ref[name.removesuffix("beta") + "alpha"] if name.endswith(".beta") else ref[name]


def assert_grads_close(got, ref, dtype, length, factor=1.0):
    """Every gradient in `got` is `factor` times its reference, to bound(dtype, length) of the size of its terms."""
    for n, g in ref.items():
        scale = abs(factor) * max(g.abs().max().item(), terms(ref, n).abs().max().item())
        assert torch.allclose(got[n], factor * g, rtol=0, atol=bound(dtype, length) * scale), n


class CountOps(TorchDispatchMode):
    """Counts the calls of one operator (its overload packet's name) under the mode."""

    def __init__(self, name):
        super().__init__()
        self.name, self.calls = name, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket.__name__ == self.name
        return func(*args, **(kwargs or {}))


def head_loss_and_grads(model, h, y, chunk):
    """The head's loss and the gradients of h and of every norm and head parameter; how many chunks added the head
    weight's gradient in place (scalevec::add_gemm_)."""
    model.zero_grad(set_to_none=True)
    h = h.clone().requires_grad_(True)
    with CountOps("add_gemm_") as count:  # the chunks' backward runs inside the loss's forward
        loss = FusedHeadLoss()(model.norm, model.lm_head, h, y, chunk)
    loss.backward()
    params = [*model.norm.named_parameters("norm"), *model.lm_head.named_parameters("lm_head")]
    return loss.detach(), {"h": h.grad.clone(), **{n: p.grad.clone() for n, p in params}}, count.calls


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", PRESETS)
def test_head_weight_gradient_in_place_equals_the_plain_path(name, dtype):
    """The fused head for one chunk and for eight, against full logits: the loss and the gradients of h and of every
    norm and head parameter (vectors randomized: γ = 1 would hide a misplaced one). Eight chunks of 8 rows fold no
    vector into W (8 < d = 32), so each adds the head weight's gradient in place; one chunk of 64 rows folds AP/DP's
    u into W (64 ≥ d: ScaledLinear.folds), and there the weight's gradient comes from autograd."""
    model = build_model(preset_model_cfg(name), seed=5, dtype=dtype)
    randomize_vectors(model)
    gen = torch.Generator().manual_seed(6)
    h = torch.randn(4, 16, model.cfg.d_model, generator=gen, dtype=dtype)
    y = torch.randint(0, 67, (4, 16), generator=gen)
    ref_loss, ref, _ = head_loss_and_grads(model, h, y, chunk=0)
    folds = any(model.lm_head.folds(64))
    assert folds == (name in ("hg_ap", "hg_dp", "hg_dp_or", "hg_dp_er"))
    for chunk, n_chunks in ((8, 8), (64, 1)):
        loss, grads, in_place = head_loss_and_grads(model, h, y, chunk)
        assert in_place == (0 if chunk == 64 and folds else n_chunks), chunk
        # the loss: a mean over 64 rows; a gradient: reductions over the 67 logits, the 64 rows or the 32 channels
        assert torch.allclose(loss, ref_loss, rtol=bound(dtype, 64), atol=0), chunk
        assert all(g.abs().max() > 0 for g in ref.values())
        assert_grads_close(grads, ref, dtype, 67)


def test_the_default_chunk_fits_the_budget_in_the_fewest_equal_chunks():
    """train.loss_chunk_tokens: null. CPU: 1024. CUDA: within the 4 GiB budget (above the 1024-token floor), in the
    fewest chunks the budget allows, all of one size wherever such a split is in the searched range — at the paper's
    micro-batches always: 0.12B's 32 × 1024 at V = 50,304 is 4 × 8192, not 3 × 10240 plus a tail of 2048."""
    cuda = torch.device("cuda")  # only its type is read: no GPU needed
    assert default_chunk_tokens(torch.device("cpu"), 50304, 32768) == 1024
    assert default_chunk_tokens(cuda, 50304, 32 * 1024) == 8192
    assert default_chunk_tokens(cuda, 50304, 4 * 4096) == 8192  # 1B, Table 3's micro-batch
    assert default_chunk_tokens(cuda, 32000, 32 * 1024) == 16384
    lo, hi = CUDA_CHUNK_RANGE
    for vocab in (512, 32000, 50304, 131072, 262144):
        fit = max(lo, min(hi, CUDA_CHUNK_BYTES // (8 * vocab) // 1024 * 1024))
        for n_tokens in (1, 1000, 1024, 10241, 16384, 32768, 33000, 65536, 3 * 4096 * 7, 999_983):
            chunk = default_chunk_tokens(cuda, vocab, n_tokens)
            count = -(-n_tokens // chunk)
            assert 1 <= chunk <= max(fit, 1) and (chunk <= lo or 8 * chunk * vocab <= CUDA_CHUNK_BYTES)
            fewest = -(-n_tokens // fit)
            if any(n_tokens % n == 0 for n in range(fewest, 2 * fewest + 1)):
                assert n_tokens % chunk == 0 and count <= 2 * fewest, (vocab, n_tokens, chunk)
            else:
                assert count == fewest, (vocab, n_tokens, chunk)
            if n_tokens % (fewest * 1024) == 0:  # micro-batches of whole 1024-token blocks: the fewest chunks
                assert count == fewest, (vocab, n_tokens, chunk)


def test_head_weight_gradient_accumulates_as_the_dtypes_allow():
    """In place where the operands have the buffer's dtype (fp32, fp64); a bf16 product cannot go into an fp32 buffer
    on CPU (no out_dtype GEMM there), so it is formed in bf16 and added, as autograd's path did."""
    acc32, acc64 = torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.float64)
    assert _weight_grad_mode(torch.float32, acc32) == "addmm_"
    assert _weight_grad_mode(torch.float64, acc64) == "addmm_"
    assert _weight_grad_mode(torch.bfloat16, acc32) == "add"


@pytest.mark.parametrize("name", ["baseline", "unified"])
def test_fused_head_in_bf16_on_cpu_matches_the_plain_path(name):
    """The bf16 fallback ("add"): the same gradients as the plain path in bf16, to bf16 rounding. Both paths round
    the logits, their gradient and each product to bf16 (eps 2⁻⁷); the plain path's weight gradient is one bf16
    product over all rows, the fused one four fp32-added ones: a few eps apart, norm-wise."""
    model = build_model(preset_model_cfg(name), seed=7, dtype=torch.bfloat16)
    randomize_vectors(model)
    gen = torch.Generator().manual_seed(8)
    h = torch.randn(4, 16, model.cfg.d_model, generator=gen).bfloat16()
    y = torch.randint(0, 67, (4, 16), generator=gen)
    ref_loss, ref, _ = head_loss_and_grads(model, h, y, chunk=0)
    loss, grads, in_place = head_loss_and_grads(model, h, y, chunk=16)
    assert in_place == 4  # the buffer's update goes through the op, in its "add" form
    eps = torch.finfo(torch.bfloat16).eps
    assert abs(loss.item() - ref_loss.item()) <= 4 * eps * ref_loss.item()
    for n, g in ref.items():
        err = (grads[n].float() - g.float()).norm() / max(g.float().norm(), terms(ref, n).float().norm())
        assert err.item() <= 8 * eps, (n, err.item())


@pytest.mark.parametrize("name", PRESETS)
def test_fused_head_loss_equals_plain_path_fp64(name):
    # vocab 67; 3 × 7 = 21 tokens over chunks of 8: the last chunk is short (5 rows)
    model = build_model(preset_model_cfg(name), seed=1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 67, (3, 7), generator=gen) for _ in range(2))
    ref_loss, ref = loss_and_grads(model, x, y, chunk=0)
    loss, grads = loss_and_grads(model, x, y, chunk=8, scale=0.25)  # the incoming gradient is carried through
    # the loss: a mean over 21 rows; a gradient: reductions over at most the 67 logits
    assert torch.allclose(loss, ref_loss, rtol=bound(torch.float64, 21), atol=0)
    assert ref_loss.dtype == loss.dtype == torch.float64
    assert_grads_close(grads, ref, torch.float64, 67, factor=0.25)
    # the plain path is the logits path: model(x) is unchanged for sampling, eval and export
    logits = model(x)
    assert logits.shape == (3, 7, model.cfg.padded_vocab)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    assert torch.allclose(ref_loss, expected, rtol=bound(torch.float64, 21), atol=0)


def test_fused_head_loss_moe_and_one_chunk_per_row():
    cfg = load_config(["configs/tiny_moe.yaml", "configs/scale/unified.yaml"]).model
    cfg = replace(cfg, d_model=32, n_layers=2, n_heads=4, vocab_size=50, moe=replace(cfg.moe, n_experts=4, top_k=2))
    model = build_model(cfg, seed=2, dtype=torch.float64)
    x, y = torch.randint(0, 50, (2, 5)), torch.randint(0, 50, (2, 5))
    ref_loss, ref = loss_and_grads(model, x, y, chunk=0)
    for chunk in (1, 3, 10, 64):  # a row per chunk, uneven chunks, exactly all rows, more than all rows
        loss, grads = loss_and_grads(model, x, y, chunk)
        assert torch.allclose(loss, ref_loss, rtol=bound(torch.float64, 10), atol=0)  # a mean over 10 rows
        assert_grads_close(grads, ref, torch.float64, 50)  # reductions over at most the 50 logits


class LogitsRows(TorchDispatchMode):
    """The rows of every matrix product that makes logits (its output has `vocab` columns), in call order."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.rows = vocab, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("mm", "addmm") and out.dim() == 2 and out.shape[1] == self.vocab:
            self.rows.append(out.shape[0])
        return out


@pytest.mark.parametrize("name", ["baseline", "unified"])
def test_fused_head_never_materializes_more_than_one_chunk_of_logits(name):
    model = build_model(preset_model_cfg(name), seed=0)
    x, y = torch.randint(0, 67, (4, 16)), torch.randint(0, 67, (4, 16))
    with LogitsRows(model.cfg.padded_vocab) as products:
        model(x, y, loss_chunk=16).backward()
    assert products.rows == [16] * 4  # four chunks of 16 rows, each run once: no full-logits pass, no recomputation
    with torch.no_grad(), LogitsRows(model.cfg.padded_vocab) as products:  # evaluation: the same chunks
        no_grad = model(x, y, loss_chunk=16)
    assert products.rows == [16] * 4 and not no_grad.requires_grad
    assert torch.allclose(no_grad, model(x, y, loss_chunk=0), rtol=bound(torch.float32, 64), atol=0)  # 64 rows


def test_fused_head_in_fp32_matches_to_rounding():
    model = build_model(preset_model_cfg("unified", vocab_size=1000), seed=3)
    x, y = torch.randint(0, 1000, (4, 33)), torch.randint(0, 1000, (4, 33))
    ref_loss, ref = loss_and_grads(model, x, y, chunk=0)
    loss, grads = loss_and_grads(model, x, y, chunk=40)
    assert torch.allclose(loss, ref_loss, rtol=bound(torch.float32, 132), atol=0)  # a mean over 132 rows
    assert_grads_close(grads, ref, torch.float32, 1000)  # reductions over at most the 1000 logits


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["baseline", "unified"])
def test_fused_head_compiled_on_cuda_bf16_matches_the_plain_path(name):
    """The GPU training path: compiled blocks and compiled fused head in bf16, against full logits in the same model."""
    model = build_model(preset_model_cfg(name, vocab_size=1000), device="cuda", seed=4, dtype=torch.bfloat16)
    x, y = (torch.randint(0, 1000, (4, 64), device="cuda") for _ in range(2))
    ref_loss, ref = loss_and_grads(model, x, y, chunk=0)
    from runtime.parallel import compile_blocks
    compile_blocks(model, torch.device("cuda"), torch.bfloat16)
    model.loss_fn = FusedHeadLoss("inductor")
    loss, grads = loss_and_grads(model, x, y, chunk=96)  # 256 tokens: chunks of 96, 96 and 64
    # bf16 (eps 2⁻⁷): the logits, their gradient and each product are rounded to bf16 on both paths, a few eps apart
    eps = torch.finfo(torch.bfloat16).eps
    assert abs(loss.item() - ref_loss.item()) < 4 * eps * ref_loss.item()
    for n, g in ref.items():
        err = (grads[n].float() - g.float()).norm() / max(g.float().norm(), terms(ref, n).float().norm())
        assert err.item() < 8 * eps, (n, err.item())


def dnp_chunk_inputs(dtype, n=37, vocab=101):
    gen = torch.Generator().manual_seed(5)
    z = (3 * torch.randn(n, vocab, generator=gen, dtype=torch.float64)).to(dtype)
    u = (0.5 + torch.rand(vocab, generator=gen, dtype=torch.float64)).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    return z, u, targets, torch.tensor(1 / 50, dtype=torch.promote_types(dtype, torch.float32))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_dnp_heads_eager_and_graph_forms_agree(dtype):
    """The vocabulary-Norm chunk in place (eager runs) and as the compiled graphs' functional form (run here
    uncompiled): the same formulas, so equal to the rounding of their fp32 (fp64) arithmetic over 101 logits."""
    from fast.head import _vocab_norm_dl_, _vocab_norm_eager_, _vocab_norm_stats
    z, u, targets, inv_rows = dnp_chunk_inputs(dtype)
    loss, r, lse, s = _vocab_norm_stats(z, u, targets, inv_rows, 1e-6, 101)
    dl = z.clone()
    _vocab_norm_dl_(dl, u, targets, inv_rows, r, lse)
    got_dl = z.clone()
    got_loss, got_r, got_s = _vocab_norm_eager_(got_dl, u, targets, inv_rows, 1e-6, 101)
    tol = bound(inv_rows.dtype, 101)
    assert got_dl.dtype == dl.dtype == dtype
    assert torch.allclose(got_loss, loss, rtol=tol, atol=0)
    assert torch.allclose(got_r, r, rtol=tol, atol=0)
    assert torch.allclose(got_s, s, rtol=0, atol=tol * s.abs().max())
    # ∂/∂l in the logits' dtype: both round the same fp32 value, so at most one bf16 ulp apart
    dl_tol = max(tol, 2 * torch.finfo(dtype).eps)
    assert torch.allclose(got_dl.double(), dl.double(), rtol=0, atol=dl_tol * dl.double().abs().max())


class FreshBuffers(TorchDispatchMode):
    """The storages of every (rows × vocab) tensor an op returns that no earlier op returned: allocations of the size
    of a chunk's logits."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.seen = numel, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() == self.numel:
            self.seen.add(out.untyped_storage().data_ptr())
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_eager_dnp_head_holds_at_most_two_chunk_buffers(dtype):
    """The eager chunk of a DNP head writes the logits over z and ∂/∂l back into z, so it allocates one (n, V)
    buffer besides z in fp32 (the softmax) and two for bf16 logits (their fp32 copy too): the baseline's
    cross-entropy allocates three (its fp32 logits, their log-softmax and its gradient)."""
    from fast.head import _vocab_norm_eager_
    z, u, targets, inv_rows = dnp_chunk_inputs(dtype)
    with FreshBuffers(z.numel()) as fresh:
        _vocab_norm_eager_(z, u, targets, inv_rows, 1e-6, 101)
    assert len(fresh.seen - {z.untyped_storage().data_ptr()}) == (1 if dtype == torch.float32 else 2)


@pytest.mark.parametrize("name", PRESETS)
def test_the_reference_head_over_chunks_is_the_loss_over_full_logits(name):
    """model/loss.py's chunked cross-entropy (each chunk's logits recomputed in backward) against full logits, in
    the reference model, values and gradients to fp64 rounding."""
    ref_model = build_reference(preset_model_cfg(name), seed=3, dtype=torch.float64)
    randomize_vectors(ref_model, seed=3)
    x, y = torch.randint(0, 67, (3, 13)), torch.randint(0, 67, (3, 13))
    ref_loss, ref = loss_and_grads(ref_model, x, y, chunk=0)
    loss, grads = loss_and_grads(ref_model, x, y, chunk=10)  # chunks of 10, 10, 10 and 9 rows
    assert torch.allclose(loss, ref_loss, rtol=bound(torch.float64, 39), atol=0)
    assert_grads_close(grads, ref, torch.float64, 67)
    assert ref_model.loss_fn is chunked_cross_entropy

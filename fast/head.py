"""The fused LM head + cross-entropy: the fast path's form of model/loss.py's chunked cross-entropy, the same loss
(tests/test_loss.py holds the two to rounding), with each chunk's forward and backward run at once.

At paper scale (vocab 50,304, 16 × 1024 tokens per micro-batch) the plain path's fp32 logits are 3.3 GB, kept for
backward together with their softmax: the largest tensors of the step. Here each chunk's forward and backward run at
once, inside the forward of one autograd Function:

    for each chunk c of rows:  ℓ_c = Σ_rows CE(head(h_c), y_c) / N      (N = all rows)
                               ∂ℓ_c/∂h_c → grad_h[c],  Σ_c ∂ℓ_c/∂θ → grad_θ   (θ: the norm's and the head's params)
    loss = Σ_c ℓ_c;  backward: grad_h · g,  grad_θ · g                    (g: the incoming gradient, a scalar)

so the step holds one chunk's logits plus grad_h (N, d) and one fp32 gradient per head parameter, and computes the
head's matmuls exactly once each (no recomputation). The chunk runs the real modules (`torch.func.functional_call`
with detached leaves), so every design's head runs the code that defines it (model/scaling.py, fast/branches.py).
Rows are whole vocabulary rows: DNP's inner Norm over the vocabulary needs all of a row's logits.

A head with DNP's vocabulary Norm (the unified design's) takes its own path, `_vocab_norm_head`: per chunk the Norm,
u and the cross-entropy forward and backward written out over the chunk's logits; autograd only for the small parts
(the final norm over the rows, u), once per micro-batch.

The head weight's gradient, the largest (V × d: 50,304 × 768), is added straight into its fp32 buffer by the chunk's
matmul (`_HeadMatmul`: buffer += Gᵀ x with `addmm_`) rather than formed as a fresh (V, d) tensor per chunk and then
added; every other gradient (h, the vectors, the norms) comes from autograd.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from model.loss import accumulation_dtype as _acc, cross_entropy_sum as _cross_entropy_sum, default_chunk_tokens


class FusedHeadLoss:
    """Llama.loss_fn on the fast path: the mean cross-entropy of lm_head(norm(h)) against targets, in fp32, as
    model/loss.py's `chunked_cross_entropy` computes it. `backend`: a torch.compile backend ("inductor") for each
    chunk's forward and backward, one graph each (fullgraph: a break fails loudly), so the Norms and the softmax fuse
    into few passes over the chunk's logits; None: eager."""

    def __init__(self, backend: Optional[str] = None):
        self.backend = backend

    def __call__(self, norm: nn.Module, lm_head: nn.Module, h: torch.Tensor, targets: torch.Tensor,
                 chunk: Optional[int]) -> torch.Tensor:
        """h: (B, T, d), targets: (B, T) int64. `chunk` > 0: chunks of that many tokens; None: the device's chunk
        (`default_chunk_tokens`); 0: full logits at once."""
        if chunk is None:
            chunk = default_chunk_tokens(h.device, lm_head.weight.shape[0], targets.numel())
        h, targets = h.flatten(0, 1), targets.flatten()  # (N, d), (N,)
        if chunk <= 0:
            return _cross_entropy_sum(lm_head(norm(h)), targets) / targets.numel()
        modules = (norm, lm_head)
        names = [[n for n, _ in m.named_parameters()] for m in modules]
        params = [p for m in modules for p in m.parameters()]
        if torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in params)):
            return _FusedHeadLoss.apply(h, targets, chunk, self.backend, modules, names, *params)
        with torch.no_grad():  # eval: chunks without gradients
            total = sum(_cross_entropy_sum(lm_head(norm(h[s:s + chunk])), targets[s:s + chunk])
                        for s in range(0, h.shape[0], chunk))
        return total / targets.numel()

    def __repr__(self) -> str:
        return f"FusedHeadLoss(backend={self.backend!r})"


def _chunk_loss_sum(modules: tuple[nn.Module, nn.Module], params: tuple[dict, dict], h_c: torch.Tensor,
                    targets_c: torch.Tensor, weight_grad: Optional[torch.Tensor], mode: str) -> torch.Tensor:
    """Σ CE over one chunk, through the real modules with `params` (detached leaves) in place of theirs. With
    `weight_grad` (the head weight's fp32 gradient buffer), the head's matmul is `_HeadMatmul`, whose backward adds
    the chunk's weight gradient into it (`mode`: how, `_weight_grad_mode`)."""
    x_c = functional_call(modules[0], params[0], (h_c,))
    kwargs = {} if weight_grad is None else {"matmul": lambda x, w: _HeadMatmul.apply(x, w, weight_grad, mode)}
    logits = functional_call(modules[1], params[1], (x_c,), kwargs)  # (n, V): one chunk's logits only
    return _cross_entropy_sum(logits, targets_c)


class _HeadMatmul(torch.autograd.Function):
    """y = x Wᵀ, x: (n, d), W: (V, d) → (n, V), whose backward returns ∂L/∂x = G W as autograd's would and adds W's
    gradient Gᵀ x (V, d) into `weight_grad` instead of returning it (W gets None): one GEMM into the fp32 buffer,
    no (V, d) temporary. ScaledLinear hands it the stored weight itself (no vector folded in), so Gᵀ x is the
    parameter's whole gradient; the head's vectors get theirs from autograd around this op."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, weight_grad: torch.Tensor, mode: str) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.weight_grad, ctx.mode = weight_grad, mode
        return F.linear(x, w)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # g: (n, V)
        x, w = ctx.saved_tensors
        _add_gemm()(ctx.weight_grad, g.t(), x, ctx.mode)
        return (g.mm(w) if ctx.needs_input_grad[0] else None), None, None, None


_ADD_GEMM: dict[str, Callable] = {}


def _add_gemm() -> Callable:
    """The op acc += a b (`how`: `_weight_grad_mode`), as a custom op that declares its mutation: compiled, the
    buffer is updated in place, where a traced `addmm_` is functionalized into a fresh (V, d) product and a copy."""
    if "op" not in _ADD_GEMM:  # registered on first use: no import-time side effects (docs/design.md principle 4)
        @torch.library.custom_op("scalevec::add_gemm_", mutates_args=("acc",))
        def add_gemm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, how: str) -> None:
            # `how`, not `mode`: the compiled graph's wrapper of a mutating op takes a `mode` of its own
            if how == "addmm_":
                acc.addmm_(a, b)
            elif how == "out_dtype":
                torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
            else:  # "add": the product in the operands' dtype, as autograd's linear backward forms it, then added
                acc += a.mm(b)
        _ADD_GEMM["op"] = add_gemm_
    return _ADD_GEMM["op"]


@functools.cache
def _fp32_out_gemm(device: torch.device) -> bool:
    """Whether this device's addmm adds a bf16 product into an fp32 buffer in place, `torch.addmm(acc, a, b,
    out_dtype=torch.float32, out=acc)`: CUDA's cuBLAS path has it (torch 2.11 accepts the fp32 `acc`; earlier
    kernels wanted it bf16, hence the probe); CPU has no kernel for it (torch 2.11, 2.13). Probed once per device,
    at the first fused-head backward: a torch that refuses the call (its dtype checks raise on the host) or returns
    a wrong sum gets False, and the head then adds a bf16 product as autograd's own path does — the arithmetic it
    had before, so the fallback changes no number. The check of the sum is the one host read, once per process."""
    if device.type != "cuda":
        return False
    acc, a = torch.ones(2, 2, device=device), torch.ones(2, 2, device=device, dtype=torch.bfloat16)
    try:
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
    except (RuntimeError, TypeError, NotImplementedError):  # no such kernel or signature in this torch
        return False
    return bool((acc == 3).all())  # 1 + (1·1 + 1·1), added into the fp32 buffer itself


def _weight_grad_mode(operand: torch.dtype, acc: torch.Tensor) -> str:
    """How `_HeadMatmul` adds Gᵀ x (operands of dtype `operand`) into the fp32 buffer `acc`, chosen once per step:
    "addmm_" in place where the dtypes match (fp32 and fp64 models, any device); "out_dtype" in place for bf16/fp16
    operands where the device's GEMM writes fp32 (CUDA), a product never rounded to bf16, so closer to the exact
    sum than the plain path's bf16 gradient; else "add": the product in the operands' dtype, then added — the
    arithmetic autograd's path had (bf16 on CPU)."""
    if operand == acc.dtype:
        return "addmm_"
    if operand in (torch.bfloat16, torch.float16) and acc.dtype == torch.float32 and _fp32_out_gemm(acc.device):
        return "out_dtype"
    return "add"


_COMPILED: dict[tuple[Callable, str], Callable] = {}


def _compiled(fn: Callable, backend: Optional[str]) -> Callable:
    """`fn` compiled by `backend` (one graph, static shapes: a break fails loudly), or `fn` itself for None."""
    if backend is None:
        return fn
    if (fn, backend) not in _COMPILED:  # built on first use: no import-time side effects (docs/design.md principle 4)
        _COMPILED[fn, backend] = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend)
    return _COMPILED[fn, backend]


def _autograd_chunks(modules: tuple[nn.Module, nn.Module], params: Sequence[dict], h: torch.Tensor,
                     targets: torch.Tensor, chunk: int, inv_rows: torch.Tensor, weight_grad: Optional[torch.Tensor],
                     mode: str, backend: Optional[str], grad_h: bool):
    """Every head without a vocabulary Norm, one chunk at a time: yields (the chunk's leaf of h, Σ CE · c, roots,
    their gradients) per chunk, the chunk's Σ CE through the real modules and its backward from autograd (the chunk
    compiled by `backend`, forward and backward one graph each), which the caller runs before the next chunk's
    forward."""
    chunk_loss = _compiled(_chunk_loss_sum, backend)
    for s in range(0, h.shape[0], chunk):
        h_c = h[s:s + chunk].detach().requires_grad_(grad_h)  # (n, d)
        with torch.enable_grad():
            sum_c = chunk_loss(modules, params, h_c, targets[s:s + chunk], weight_grad, mode)
        yield h_c, sum_c.detach() * inv_rows, [sum_c], [inv_rows]


def _has_vocab_norm(lm_head: nn.Module) -> bool:
    """Whether the head normalizes its logits over the vocabulary (DNP on the LM head, docs/paper.md §1.9 [I])."""
    return getattr(lm_head, "inner", None) is not None


def _vocab_norm_head(modules: tuple[nn.Module, nn.Module], params: Sequence[dict], h: torch.Tensor,
                     targets: torch.Tensor, chunk: int, inv_rows: torch.Tensor, weight_grad: Optional[torch.Tensor],
                     mode: str, backend: Optional[str], grad_h: bool) -> list[tuple]:
    """The head with DNP's vocabulary Norm, y = u ⊙ Norm(W (v ⊙ x)) over the vocabulary, on all N rows, as one part:
    [(h's leaf, Σ CE · c, the roots of its backward, their gradients)].

    Autograd covers only the small tensors, once per micro-batch: the final norm and v over the rows, a (N, d), and
    u = out_scale() (V,) from its α and β. Everything of size (rows, V) is `_vocab_norm_core`, one chunk at a time,
    whose backward is written out: no graph and no saved (rows, V) tensors, where autograd's partitioner kept fp32
    (rows, V) buffers between a forward and a backward graph (logits, the Norm's output, the softmax). The chunks'
    ∂/∂a fill one (N, d) buffer; ∂/∂u and ∂/∂W come from the chunks' sums N and G once all are in (`_vocab_norm_core`
    derives them); one backward through the small parts follows."""
    head = modules[1]
    h = h.detach().requires_grad_(grad_h)
    with torch.enable_grad():
        a, u = _compiled(_vocab_norm_inputs, backend)(modules, params, h)  # (N, d), (V,)
    w, inner = params[1]["weight"].detach().to(a.dtype), head.inner
    rows, u_ = a.detach(), u.detach()
    acc = _acc(rows.dtype)
    # N = Σ_chunks ∂/∂lᵀ (r ⊙ a), (V, d) in fp32: in W's gradient buffer when there is one (its final value is made
    # from N below), else in its own
    n_acc = weight_grad if weight_grad is not None else torch.zeros(w.shape, dtype=acc, device=w.device)
    mode = mode if weight_grad is not None else _weight_grad_mode(w.dtype, n_acc)
    g_acc = torch.zeros(w.shape[1], w.shape[1], dtype=acc, device=w.device)  # G = Σ aᵀ diag(r² s) a, (d, d)
    uw, wtw = _compiled(_vocab_norm_operands, backend)(w, u_)  # diag(u) W (V, d), WᵀW (d, d)
    grad_a = torch.empty_like(rows)  # (N, d)
    loss = torch.zeros((), dtype=inv_rows.dtype, device=h.device)
    for s in range(0, rows.shape[0], chunk):
        sum_c, grad_a[s:s + chunk] = _vocab_norm_core(
            rows[s:s + chunk], w, uw, wtw, u_, targets[s:s + chunk], inv_rows, inner.eps, inner.logical or inner.dim,
            n_acc, g_acc, mode, backend)
        loss += sum_c * inv_rows
    grad_u = _compiled(_vocab_norm_finish_, backend)(n_acc, w, u_, g_acc, weight_grad is not None)
    return [(h, loss, [a, u], [grad_a, grad_u.to(u.dtype)])]


def _vocab_norm_inputs(modules: tuple[nn.Module, nn.Module], params: Sequence[dict],
                       h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The DNP head's small parts, once per micro-batch: the head's input a = v ⊙ norm(h) (N, d) and u (V,), each
    from its parameters (OR's α and β included)."""
    norm, head = modules
    a = functional_call(norm, params[0], (h,))  # (N, d)
    if head.in_scale is not None:
        a = a * functional_call(head.in_scale, _under(params[1], "in_scale"), ())
    return a, functional_call(head.out_scale, _under(params[1], "out_scale"), ())


def _vocab_norm_operands(w: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """diag(u) W (V, d) and WᵀW (d, d), in W's dtype: the chunks' operands for ∂/∂a, once per micro-batch."""
    return u.to(w.dtype)[:, None] * w, w.t().mm(w)


def _vocab_norm_finish_(n_acc: torch.Tensor, w: torch.Tensor, u: torch.Tensor, g_acc: torch.Tensor,
                        into_n: bool) -> torch.Tensor:
    """Once all chunks are in: ∂/∂u_j = Σ_k W_jk N_jk (V,) in fp32 (W cast inside the multiply, not copied), and,
    `into_n` (N is W's gradient buffer), ∂/∂W = diag(u) N − W G written over N; W G in W's dtype, as the head's
    other matmuls."""
    grad_u = (n_acc * w).sum(1)
    if into_n:
        n_acc.mul_(u.to(n_acc.dtype)[:, None]).sub_(w.mm(g_acc.to(w.dtype)))
    return grad_u


def _under(params: dict, prefix: str) -> dict:
    """The entries of a module's parameter dict that belong to its submodule `prefix`, named as the submodule names
    them."""
    return {n[len(prefix) + 1:]: p for n, p in params.items() if n.startswith(prefix + ".")}


def _vocab_norm_core(a: torch.Tensor, w: torch.Tensor, uw: torch.Tensor, wtw: torch.Tensor, u: torch.Tensor,
                     targets: torch.Tensor, inv_rows: torch.Tensor, eps: float, width: int, n_acc: torch.Tensor,
                     g_acc: torch.Tensor, mode: str, backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the DNP head, forward and backward at once, without autograd. a: (n, d) the head's input,
    w: (V, d), uw = diag(u) W, wtw = WᵀW (d, d), u: (V,), targets: (n,). Returns Σ CE over the rows and ∂/∂a (n, d)
    times `inv_rows`; adds the chunk's ∂/∂lᵀ (r ⊙ a) into `n_acc` (V, d) (mode: `_weight_grad_mode`) and its
    aᵀ diag(r² s) a into `g_acc` (d, d), from which `_vocab_norm_head` makes ∂/∂u and ∂/∂W once all chunks are in.

    Forward (docs/paper.md §1.5, in at least fp32 from the logits on):
        z = a Wᵀ,  r = (Σ_j z_j²/V + eps)^(-1/2),  y = z·r,  l = u ⊙ y,  CE = logsumexp(l) − l_t
    Backward, c = inv_rows, p = softmax(l):
        ∂/∂l = c (p − onehot_t),   ∂/∂u = Σ_rows ∂/∂l ⊙ y,
        ∂/∂z = r (u ⊙ ∂/∂l − y·s),   s = Σ_j (u ⊙ ∂/∂l)_j y_j / V = c (Σ_j p_j l_j − l_t) / V
    (the Norm's backward, as `_Norm` writes it; s through l = u ⊙ y, so a row's s comes from the pass that makes its
    logsumexp). Since z = a Wᵀ, every product with ∂/∂z splits into one with ∂/∂l and a small one (N as above):
        ∂/∂a = ∂/∂z W = r ⊙ (∂/∂l · diag(u) W) − r² s ⊙ (a WᵀW),
        ∂/∂W = ∂/∂zᵀ a = diag(u) N − W G,   G = Σ_rows r² s aᵀa,      ∂/∂u_j = Σ_k W_jk N_jk,
    so the chunk makes two passes over its logits, as the baseline's cross-entropy does (the statistics, then ∂/∂l
    written over z itself: one (n, V) tensor), and no pass for ∂/∂u or ∂/∂z; the matmuls over (n, V) stay three. The
    extra matmuls are (d × d)-sized: n·d² per chunk, V·d² twice per micro-batch. ∂/∂l is in the logits' dtype, as
    autograd's ∂/∂z would be, before the matmuls.

    Compiled (`backend`): the whole chunk is one graph (`_vocab_norm_chunk`), its matmuls and the small ops around
    them included, so the chunk pays one call instead of about twenty eager ops. Eager, `_vocab_norm_eager_`: the
    same arithmetic in place."""
    if backend is not None:
        return _compiled(_vocab_norm_chunk, backend)(a, w, uw, wtw, u, targets, inv_rows, eps, width, n_acc, g_acc,
                                                     mode)
    z = F.linear(a, w)  # (n, V): the chunk's logits before the Norm
    sum_ce, r, s = _vocab_norm_eager_(z, u, targets, inv_rows, eps, width)  # z ← ∂/∂l
    return sum_ce, _vocab_norm_grads(a, z, r, s, uw, wtw, n_acc, g_acc, mode)


def _vocab_norm_chunk(a: torch.Tensor, w: torch.Tensor, uw: torch.Tensor, wtw: torch.Tensor, u: torch.Tensor,
                      targets: torch.Tensor, inv_rows: torch.Tensor, eps: float, width: int, n_acc: torch.Tensor,
                      g_acc: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`_vocab_norm_core` as one compiled graph: the statistics pass, the ∂/∂l pass written over the logits, and
    `_vocab_norm_grads`."""
    z = F.linear(a, w)  # (n, V)
    sum_ce, r, lse, s = _vocab_norm_stats(z, u, targets, inv_rows, eps, width)
    _vocab_norm_dl_(z, u, targets, inv_rows, r, lse)  # z ← ∂/∂l, in place
    return sum_ce, _vocab_norm_grads(a, z, r, s, uw, wtw, n_acc, g_acc, mode)


def _vocab_norm_grads(a: torch.Tensor, dl: torch.Tensor, r: torch.Tensor, s: torch.Tensor, uw: torch.Tensor,
                      wtw: torch.Tensor, n_acc: torch.Tensor, g_acc: torch.Tensor, mode: str) -> torch.Tensor:
    """From a chunk's ∂/∂l (n, V) and its row statistics r, s (n, 1): adds ∂/∂lᵀ (r ⊙ a) into `n_acc` and
    aᵀ diag(r² s) a into `g_acc`, and returns ∂/∂a (n, d) in a's dtype (`_vocab_norm_core`'s formulas)."""
    q = r * r * s  # (n, 1) r² s
    _add_gemm()(n_acc, dl.t(), (a * r).to(a.dtype), mode)  # N += ∂/∂lᵀ (r ⊙ a)
    g_acc.add_((a * q).to(a.dtype).t().mm(a).to(g_acc.dtype))  # G += aᵀ diag(r² s) a
    grad_a = r * dl.mm(uw) - q * a.mm(wtw)  # (n, d), at least fp32
    return grad_a.to(a.dtype)


def _vocab_norm_stats(z: torch.Tensor, u: torch.Tensor, targets: torch.Tensor, inv_rows: torch.Tensor, eps: float,
                      width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The row statistics of `_vocab_norm_core`: (Σ CE, r (n, 1), logsumexp (n, 1), s (n, 1))."""
    acc = _acc(z.dtype)
    z32, u32 = z.to(acc), u.to(acc)
    # Σz² and max(u ⊙ z) depend on nothing else, so one pass over the row makes both: the exponentials' range
    # m = max(r u ⊙ z) = r · max(u ⊙ z), r > 0 (any m gives the same logsumexp; this one keeps the exps near ≤ 1)
    sq, top = z32.square().sum(-1, keepdim=True), (z32 * u32).amax(-1, keepdim=True)  # (n, 1) each
    r = torch.rsqrt(sq / width + eps)  # (n, 1)
    m = top * r
    logits = z32 * r * u32  # (n, V)
    e = torch.exp(logits - m)  # one pass makes both row sums below
    total = e.sum(-1, keepdim=True)  # (n, 1)
    lse = m + torch.log(total)
    l_t = logits.gather(1, targets[:, None])  # (n, 1)
    s = inv_rows * ((e * logits).sum(-1, keepdim=True) / total - l_t) / width  # (n, 1): c (Σ_j p_j l_j − l_t) / V
    return (lse - l_t).sum(), r, lse, s


def _vocab_norm_dl_(z: torch.Tensor, u: torch.Tensor, targets: torch.Tensor, inv_rows: torch.Tensor,
                    r: torch.Tensor, lse: torch.Tensor) -> None:
    """z ← ∂/∂l = c (p − onehot_t) of `_vocab_norm_core`, the softmax recomputed from z, r and lse, in z's dtype,
    each element written where it was read."""
    acc = _acc(z.dtype)
    p = torch.exp(z.to(acc) * r * u.to(acc) - lse)
    z.copy_((inv_rows * (p - _onehot(targets, z.shape[1]).to(acc))).to(z.dtype))


def _vocab_norm_eager_(z: torch.Tensor, u: torch.Tensor, targets: torch.Tensor, inv_rows: torch.Tensor, eps: float,
                       width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The compiled graphs' arithmetic for eager runs: (Σ CE, r, s), and z ← ∂/∂l in z's dtype. Op for op the same
    formulas, written in place: the logits over z itself (over one fp32 copy of it when z is bf16), the softmax in a
    second buffer (tests/test_loss.py holds the two forms to fp64 rounding)."""
    acc = _acc(z.dtype)
    logits = z.to(acc)  # (n, V): z itself when it is already in acc (z is this chunk's own, read no more)
    r = torch.rsqrt(_row_dot(logits, logits) / width + eps)  # (n, 1)
    logits.mul_(r).mul_(u.to(acc))
    m = logits.amax(-1, keepdim=True)
    l_t = logits.gather(1, targets[:, None])  # (n, 1)
    e = torch.sub(logits, m).exp_()  # (n, V)
    total = e.sum(-1, keepdim=True)
    s = inv_rows * (_row_dot(e, logits) / total - l_t) / width  # (n, 1)
    lse = m + torch.log(total)
    dl = e.mul_(inv_rows / total).scatter_add_(1, targets[:, None], (-inv_rows).expand(len(targets), 1))
    z.copy_(dl)
    return (lse - l_t).sum(), r, s


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_j a_ij b_ij of each row, (n, 1), as a batched dot product: no (n, V) product is formed."""
    return torch.bmm(a[:, None, :], b[:, :, None])[:, :, 0]


def _onehot(targets: torch.Tensor, width: int) -> torch.Tensor:
    """(n, width) bool, True at each row's target: a comparison the compiled passes fuse, never a stored tensor."""
    return torch.arange(width, device=targets.device) == targets[:, None]


class _FusedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, targets: torch.Tensor, chunk: int, compiled: Optional[str],
                modules: tuple[nn.Module, nn.Module], names: Sequence[Sequence[str]],
                *params: torch.Tensor) -> torch.Tensor:
        n_rows = h.shape[0]
        inv_rows = torch.full((), 1.0 / n_rows, dtype=_acc(h.dtype), device=h.device)  # d loss / d Σ_chunk CE
        wants = [ctx.needs_input_grad[6 + i] for i in range(len(params))]
        leaves = [p.detach().requires_grad_(w) for p, w in zip(params, wants)]
        rest = iter(leaves)  # params are the modules' parameters in order: hand each module its own
        by_module = [{n: next(rest) for n in module_names} for module_names in names]
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None  # (N, d)
        grad_params = [torch.zeros_like(p, dtype=_acc(p.dtype)) if w else None for p, w in zip(params, wants)]
        # The head weight's gradient goes into its buffer in place, by _HeadMatmul's backward, unless the head folds
        # a vector into W at this chunk size (AP/DP's u once a chunk has ≥ d rows: ScaledLinear.folds); then W's
        # gradient passes through the fold, is not the matmul's Gᵀx, and comes from autograd and `acc += g` like
        # every other parameter's. In place, W's leaf still requires grad and is asked for (its "gradient" is None,
        # hence allow_unused) so that the backward runs even when nothing before the matmul wants a gradient.
        i_w = len(names[0]) + list(names[1]).index("weight")
        vocab_norm = _has_vocab_norm(modules[1])  # its own path, which never folds a vector into W
        in_place = grad_params[i_w] is not None and (vocab_norm or not any(modules[1].folds(min(chunk, n_rows))))
        weight_grad = grad_params[i_w] if in_place else None
        mode = _weight_grad_mode(params[i_w].dtype, weight_grad) if in_place else ""
        if in_place:
            _add_gemm()  # registered here, in eager: a compiled chunk's backward only calls it
        wrt = [(i, leaf) for i, (leaf, w) in enumerate(zip(leaves, wants)) if w]
        loss = torch.zeros((), dtype=_acc(h.dtype), device=h.device)
        parts = _vocab_norm_head if vocab_norm else _autograd_chunks
        s = 0  # the first row of the part
        for h_part, loss_part, roots, root_grads in parts(modules, by_module, h, targets, chunk, inv_rows,
                                                          weight_grad, mode, compiled, grad_h is not None):
            # the part's backward at once: into its rows of grad_h and the parameters' fp32 sums
            inputs = ([h_part] if grad_h is not None else []) + [leaf for _, leaf in wrt]
            grads = list(torch.autograd.grad(roots, inputs, grad_outputs=root_grads, allow_unused=True)
                         if inputs else [])
            if grad_h is not None:
                grad_h[s:s + h_part.shape[0]] = grads.pop(0)
            for (i, _), g in zip(wrt, grads):
                if g is not None and not (in_place and i == i_w):
                    grad_params[i] += g  # fp32 accumulation over chunks
            loss += loss_part
            s += h_part.shape[0]
        ctx.save_for_backward(grad_h, *[g for g in grad_params if g is not None])
        ctx.has_grad_h, ctx.wants = grad_h is not None, wants
        ctx.param_dtypes = [p.dtype for p in params]
        return loss

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        saved = list(ctx.saved_tensors)
        grad_h = saved.pop(0)
        grad_h = grad_h * grad_out.to(grad_h.dtype) if ctx.has_grad_h else None
        grad_params = []
        for wants, dtype in zip(ctx.wants, ctx.param_dtypes):
            grad_params.append((saved.pop(0) * grad_out).to(dtype) if wants else None)
        return (grad_h, None, None, None, None, None, *grad_params)

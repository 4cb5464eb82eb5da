"""FSDP2 wrapping: one `fully_shard` per block and one at the root (torchtitan's layout), with bf16 parameters and
fp32 gradient reduction when mixed precision is on; and activation checkpointing of the blocks, applied before
sharding (configs/base.yaml, train.activation_checkpointing / reshard_after_forward / fsdp_prefetch)."""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from model.config import ModelConfig
from model.llama import Block, Llama


# ------------------------------------------------------------------------------------- activation checkpointing

def _aten_ops(*names: str) -> frozenset:
    return frozenset(getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n))


# `selective` keeps what is expensive to recompute — the outputs of matmuls (the linear maps, the MoE's grouped GEMM)
# and of attention (SDPA's output and logsumexp, which its backward reads) — and recomputes everything else: norms,
# scale-vector multiplies, RoPE, SiLU·up, residual adds, routing. Those ops cost next to no FLOPs but their outputs
# are as large as the matmuls', so memory falls for little extra compute (torchtitan's "op" policy, without its
# every-other-matmul rule). The MoE's all-reduce of expert counts is kept too: recomputation then issues no collective
# from inside backward.
_SAVED_OPS = _aten_ops(
    "mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_scaled_mm",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
) | frozenset([torch.ops._c10d_functional.all_reduce.default, torch.ops._c10d_functional.wait_tensor.default])


def _save_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _recompute_all(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def _keep_state(block: Block) -> Iterator[None]:
    """Recomputation re-runs the forward's side effects too: a MoE block would count its tokens and aux statistics
    twice (`tokens_per_expert += counts`) and rebind `balance_loss` to a recomputed tensor. Put the block's buffers and
    tensor attributes back as the real forward left them, so state and metrics do not depend on checkpointing."""
    buffers = [(b, b.clone()) for b in block.buffers()]
    attrs = [(m, k, v) for m in block.modules() for k, v in vars(m).items() if isinstance(v, torch.Tensor)]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        for m, k, v in attrs:
            setattr(m, k, v)


def _contexts(policy: str, block: Block) -> tuple[Any, Any]:
    """checkpoint's context_fn for a block with state (buffers): the policy's contexts (none for full) plus
    `_keep_state` around the recomputation. When torch.compile traces the block (`compile_checkpointed_state`), the
    compiled graph applies the updates once, in forward, and must see only the policy's contexts, which tag the ops
    to recompute."""
    rule = _save_matmuls if policy == "selective" else _recompute_all
    if torch.compiler.is_compiling():
        return create_selective_checkpoint_contexts(rule)
    forward_ctx, recompute_ctx = (create_selective_checkpoint_contexts(rule) if policy == "selective"
                                  else (contextlib.nullcontext(), contextlib.nullcontext()))
    # _keep_state outermost: its clones and copies are not ops of the recomputation (SAC would expect them cached)
    return forward_ctx, _chain(_keep_state(block), recompute_ctx)


@contextlib.contextmanager
def _chain(*contexts: Any) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        yield


class CheckpointedBlock(Block):
    """A Block whose forward activations are recomputed in backward instead of kept (torch.utils.checkpoint,
    non-reentrant): `full` recomputes the whole block, `selective` keeps the matmul and attention outputs.

    A subclass rather than a wrapper module, so its parameters keep their names (`layers.3.attn.q_proj.weight`, not
    `layers.3._checkpoint_wrapped_module.attn…`): roles, optimizer groups and checkpoints key off those names, so a
    checkpoint saved with or without it loads either way. `apply_activation_checkpointing` builds these in place of
    the meta-device blocks, before anything is materialized. (A wrapper module would rename them; swapping the block's
    class or its forward at run time is monkeypatching, docs/design.md principle 4.)"""

    def __init__(self, cfg: ModelConfig, policy: str):
        super().__init__(cfg)
        self.policy = policy
        stateful = any(True for _ in self.buffers())  # the MoE's counters; a dense block has none
        # context_fn must be a function or a functools.partial for torch.compile to trace the checkpoint; a dense
        # block's is the bare policy (none at all for full: plain checkpointing, no dispatch-mode overhead in eager).
        if stateful:
            self._context_fn = functools.partial(_contexts, policy, self)
        elif policy == "selective":
            self._context_fn = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
        else:
            self._context_fn = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():  # evaluation keeps no activations: nothing to recompute
            return super().forward(x, cos, sin)
        kwargs = {} if self._context_fn is None else {"context_fn": self._context_fn}
        return checkpoint(super().forward, x, cos, sin, use_reentrant=False, **kwargs)


def compile_checkpointed_state() -> bool:
    """Let torch.compile trace checkpointed blocks that update state (the MoE's counters). In eager, `_keep_state`
    undoes the recomputation's replay of those updates, so they happen once, in forward. By default dynamo refuses a
    checkpointed region with side effects (eager checkpointing would replay them; a compiled backward cannot) and runs
    the block eagerly, or fails under fullgraph. Its switch "apply forward side effects once, not again in backward"
    is exactly the eager semantics above. It is process-wide and private to torch (present in 2.13), so it is set only
    when checkpointing meets compile, and False comes back where this torch lacks it."""
    config = torch._dynamo.config
    if not hasattr(config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        return False
    config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    return True


def _signature(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    tensors = [*module.named_parameters(), *module.named_buffers()]
    return [(n, tuple(t.shape), t.dtype) for n, t in tensors]


def apply_activation_checkpointing(model: Llama, mode: str) -> Llama:
    """Rebuild every block as a CheckpointedBlock (mode full | selective; none: unchanged). On the meta device, before
    FSDP2 (which must see the final modules) and before init (which draws each parameter from its name, so the
    weights are those of the model without checkpointing)."""
    if mode == "none":
        return model
    if mode not in ("full", "selective"):
        raise ValueError(f"activation checkpointing {mode!r}: expected none, full or selective")
    for i, block in enumerate(model.layers):
        if type(block) is not Block or not all(t.is_meta for t in block.parameters()):
            raise TypeError(f"layers.{i}: activation checkpointing rebuilds plain Blocks on the meta device, before "
                            f"sharding and init; got a {type(block).__name__}")
        with torch.device("meta"):
            new = CheckpointedBlock(model.cfg, mode)
        # The rebuilt block must be the same block: same parameters and buffers, same names, shapes and dtypes.
        assert _signature(new) == _signature(block), f"layers.{i}: Block({model.cfg}) differs from the model's block"
        model.layers[i] = new
    return model


# --------------------------------------------------------------------------------------------------------- FSDP2

def shard_model(model: Llama, compute_dtype: torch.dtype, device: torch.device,
                reshard_after_forward: str | bool = "auto", prefetch: int = 0) -> Llama:
    """Shard a meta-device model in place. Parameters stay fp32 (the optimizer's master copy); FSDP2 casts them to
    bf16 for forward/backward and reduces gradients in fp32. float64 (reference runs) keeps everything in double.

    reshard_after_forward (the blocks'): auto = every block but the last frees its gathered parameters after forward
    and gathers them again in backward; true = every block does; false = none does (ZeRO-2-like: one all-gather per
    block per step instead of two, the full parameters held from forward to backward). `prefetch` > 0: each block's
    forward (backward) explicitly issues the all-gathers of the next (previous) `prefetch` blocks; 0 keeps FSDP2's
    implicit prefetching. None of these changes a number, only when communication happens and what memory holds."""
    mp: Optional[MixedPrecisionPolicy] = None
    if compute_dtype == torch.float64:
        model.to(torch.float64)
    elif compute_dtype != torch.float32:
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    # An explicit mesh on the run's device type: FSDP2's default mesh follows the accelerator whenever one
    # exists, which would put a train.device=cpu run (gloo) on a CUDA mesh.
    kwargs = {"mesh": init_device_mesh(device.type, (dist.get_world_size(),))}
    if mp is not None:
        kwargs["mp_policy"] = mp
    blocks = list(model.layers)
    for i, block in enumerate(blocks):
        if reshard_after_forward == "auto":
            # The last block's parameters are needed again at once by backward: keep them gathered after forward.
            reshard = i < len(blocks) - 1
        else:
            reshard = bool(reshard_after_forward)
        fully_shard(block, reshard_after_forward=reshard, **kwargs)
    fully_shard(model, **kwargs)  # the root (embedding, final norm, head): FSDP2 keeps it gathered after forward
    if prefetch > 0:
        _set_prefetch(model, blocks, prefetch)
    return model


def _set_prefetch(model: Llama, blocks: list[torch.nn.Module], n: int) -> None:
    """Explicit prefetch, n blocks deep. FSDP2's implicit forward prefetch is the CPU thread running ahead: a block's
    all-gather is issued when the CPU reaches that block, so a host sync (`.item()`, `.tolist()` in the MoE's loop
    path, a data-dependent shape) stalls it, and with it the next gather. Issuing the next blocks' all-gathers from
    the current block's pre-forward keeps communication ahead of compute regardless. Backward's implicit prefetch is
    already one block deep; n > 1 overlaps more at the cost of n gathered blocks held at once."""
    model.set_modules_to_forward_prefetch(blocks[:n])  # during the embedding
    model.set_modules_to_backward_prefetch(blocks[::-1][:n])  # during the LM head's backward
    for i, block in enumerate(blocks):
        block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + n])
        block.set_modules_to_backward_prefetch(blocks[max(0, i - n):i][::-1])  # nearest (needed first) first


# ------------------------------------------------------------------------------------------------------- compile

def compile_blocks(model: Llama, device: torch.device, dtype: torch.dtype, backend: str = "inductor",
                   fullgraph: Optional[bool] = None) -> None:
    """torch.compile each block in place (parameter names, and so roles and checkpoints, are unchanged); the
    embedding and the loop stay eager (the fast path's head compiles its own chunks: fast/head.py). Every block is
    one graph (fullgraph: a break fails loudly) except an MoE on its exact per-expert loop, which needs the experts'
    row counts on the host (the grouped GEMM path compiles whole). `fullgraph=False`: allow breaks."""
    if fullgraph is None:
        probe = torch.empty(0, device=device, dtype=dtype)
        fullgraph = all(moe.uses_grouped(probe) for _, moe in model.moe_layers())
    for block in model.layers:
        block.compile(fullgraph=fullgraph, backend=backend)

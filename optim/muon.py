"""Muon for the matrices inside the blocks (PAPER.md §3.2), with FSDP2 (DTensor) support.

Per matrix W ∈ R^{m×n} with gradient G, each step (Keller Jordan's Muon + Moonlight's scaling):
    B ← μ·B + (1 − μ)·G                          momentum, μ = 0.95
    U ← (1 − μ)·G + μ·B  (Nesterov)  or  B       PAPER.md §3.2: "Nesterov momentum 0.95"
    O ← NS₅(U)                                    5 quintic Newton–Schulz steps in bf16,
                                                  (a, b, c) = (3.4445, −4.7750, 2.0315)
    W ← W·(1 − lr·wd)                             decoupled weight decay, wd 0.1 (PAPER.md §3.2)
    W ← W − lr·s(m, n)·O                          s = 0.2·√max(m, n) (Moonlight: update RMS ≈ AdamW's, so AdamW's
                                                  lr and wd carry over) or √max(1, m/n) (Keller Jordan's)
(m, n) is the LOGICAL shape (the group's "logical_shapes", parallel to "params"): a matrix stored zero-padded (an FFN
hidden, model.ffn_pad_multiple) is scaled as its unpadded self; its zero gradient rows/columns stay exactly zero
through Newton–Schulz (each iterate p(XXᵀ)·X keeps X's zero rows and columns), so its update is the unpadded one's.
`lr` is read from the param group at every step, so the schedule works by writing group["lr"].

Why not just torch.optim.Muon: torch ≥ 2.9 has exactly this math (the same EMA-form momentum, `adjust_lr_fn`
"match_rms_adamw" = Moonlight, "original" = Jordan) and tests/test_muon.py proves ours equal to it, but it runs
Newton–Schulz on whatever tensor it is handed. Under FSDP2 that is a DTensor whose local part is a row shard; an
orthogonalized shard is not the shard of the orthogonalized matrix. Here a DTensor update is gathered whole
(`full_tensor()`), orthogonalized, and each rank keeps its own rows (`distribute_tensor(..., src_data_rank=None)`
slices locally, no communication). It also takes stacked 3-D weights (MoE experts), orthogonalized per matrix,
and never writes into a bf16 gradient (torch's `div_` would when the gradient already is bf16).

Cost under FSDP2 with N ranks, `distributed: false` (the reference path): one all-gather of U per matrix per step
(full fp32 matrices to every rank) and N-fold redundant Newton–Schulz work (every rank orthogonalizes every matrix).

Distributed Muon (`optim.muon.distributed: true`, the default; DESIGN.md principle 9) gives each matrix one owner
rank, which alone runs its Newton–Schulz:
  1. Owners by greedy longest-processing-time (LPT): matrices sorted by NS cost b·m·n·min(m, n) (per iteration
     X·Xᵀ and A·X cost ≈ 2·k²·K each for k = min, K = max), each to the least-loaded rank. Every rank computes the
     same assignment from global shapes alone (no communication), and LPT's makespan is within 4/3 of optimal,
     where round-robin by index is not: a Llama block's gate/up/down are ~2.7× its q/o, k/v smaller still.
  2. One `all_to_all_single` sends each rank's shard of U to the owner, cast to the NS dtype first. That cast is
     NS's own first operation, so the owner sees exactly the bits `full_tensor()` + cast would give: in bf16
     half of fp32's bytes. The owner concatenates the shards (uneven ones too) and orthogonalizes the whole matrix
     with the same `zeropower_via_newtonschulz` call as the reference path, so its output is bit-identical.
  3. A second `all_to_all_single` returns to every rank its own rows of O, wrapped as a DTensor with `from_local`.
Per rank and matrix this moves 2·(N−1)/N of a shard (in bf16) instead of (N−1) shards (in fp32): for N = 8, 8×
fewer bytes, and NS work drops N-fold. Matrices are exchanged in buckets (all `exchange` matrices of one mesh
and NS dtype, cut at EXCHANGE_BUCKET_ELEMENTS per rank so the transient buffers, ≈ 4 shards' worth, stay bounded),
two collectives per bucket rather than per matrix; owners are balanced per bucket, as each bucket is a
synchronization point. Alternatives rejected: all-gather, NS on the owner only, all-gather the results (twice
today's traffic); gather to and scatter from the owner (two collectives per matrix, every byte through one rank).
all_to_all_single takes uneven splits and bf16 on gloo (the CPU tests) and on NCCL.
Stacked MoE experts (E, m, n) sharded on the expert dimension need no communication at all: each rank holds whole
expert matrices and orthogonalizes its own (NS is per matrix), so the work is split by FSDP2 itself. Batched
matmuls are per-matrix, so this matches the whole stack bit for bit on CPU (tested); a GPU's batched GEMM may pick
another kernel for another batch size. Equal shapes are not batched into one NS on the owner: a batched kernel
rounds apart from the 2-D one (tests/test_muon.py), which would break the bit-identity with the reference path.
Anything else (a plain tensor, a mesh of one rank, Partial or several Shard placements) takes the reference path.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's / Moonlight's quintic (PAPER.md §3.2)
UPDATE_SCALES = ("moonlight", "jordan")
# Per rank and exchange bucket: ~4 transient buffers of this many NS-dtype elements (128 Mi: 256 MB each in bf16);
# a Llama-7B's matrices (6.5 G) on 8 ranks are ~7 buckets, enough matrices per bucket for LPT to balance.
EXCHANGE_BUCKET_ELEMENTS = 1 << 27


def zeropower_via_newtonschulz(
    grad: Tensor, coefficients: tuple[float, float, float] = NS_COEFFICIENTS, steps: int = 5, eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """≈ U·Vᵀ for grad = U·S·Vᵀ, in bf16; [..., m, n] → [..., m, n]. The quintic trades exactness for speed: it
    maps singular values to roughly 0.7–1.2 rather than exactly 1, which Keller Jordan found harmless.

    The same operations, in the same order, as torch.optim.Muon's, so 2-D results agree bit for bit; leading
    dimensions are a batch of independent matrices (stacked MoE experts).
    """
    if grad.ndim < 2:
        raise ValueError(f"Newton–Schulz needs a matrix, got shape {tuple(grad.shape)}")
    a, b, c = coefficients
    shape = grad.shape
    x = grad.to(dtype)  # bf16 by default; float32 for reference runs
    if x.ndim > 3:
        x = x.reshape(-1, *shape[-2:])
    transposed = shape[-2] > shape[-1]  # iterate on the wide side: the Gram matrix is min(m, n)²
    if transposed:
        x = x.mT
    # Frobenius norm ≥ spectral norm, so this puts every singular value in [0, 1].
    norm = x.norm() if x.ndim == 2 else x.norm(dim=(-2, -1), keepdim=True)
    x = x / norm.clamp(min=eps)
    mm = torch.addmm if x.ndim == 2 else torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT  # [.., k, k], k = min(m, n)
        x = mm(x, mm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # a·X + (b·A + c·A²)·X
    if transposed:
        x = x.mT
    return x.reshape(shape)


def update_scale(shape: torch.Size | tuple[int, ...], kind: str) -> float:
    """The per-matrix lr multiplier for a (stack of) m×n matrices; `shape` is the GLOBAL shape."""
    m, n = shape[-2], shape[-1]
    if kind == "moonlight":
        return 0.2 * math.sqrt(max(m, n))
    if kind == "jordan":
        return math.sqrt(max(1.0, m / n))
    raise ValueError(f"unknown Muon update_scale {kind!r}; expected one of {UPDATE_SCALES}")


class NSSpec(NamedTuple):
    """One param group's Newton–Schulz settings."""
    coefficients: tuple[float, float, float]
    steps: int
    eps: float
    dtype: torch.dtype

    def __call__(self, x: Tensor, log: Optional[list[tuple[int, ...]]] = None) -> Tensor:
        if log is not None:
            log.append(tuple(x.shape))
        return zeropower_via_newtonschulz(x, self.coefficients, self.steps, self.eps, self.dtype)


def orthogonalize(update: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.bfloat16, log: Optional[list[tuple[int, ...]]] = None) -> Tensor:
    """Newton–Schulz on the whole matrix, also when `update` is a sharded DTensor: the reference path (see the module
    docstring); `log` collects the shapes this rank orthogonalizes."""
    spec = NSSpec(coefficients, steps, eps, dtype)
    if isinstance(update, DTensor):
        # all-gather: [m, n] on every rank. Contiguous: torch 2.11 returns a column-sharded (Shard(1)) matrix with
        # uneven shards as a strided view of its padded gather, and NS on a strided input reduces in another order
        # (1 ulp apart from the exchange path, which concatenates into a contiguous matrix).
        full = update.full_tensor().contiguous()
        ortho = spec(full, log)
        # src_data_rank=None: every rank slices its own shard from its own copy, no scatter. Each row lives on
        # one rank only, so the copies need not even agree bit for bit (they do: same kernels, same input); with a
        # Replicate mesh dimension (HSDP) they must, which the same-kernels argument gives.
        return distribute_tensor(ortho, update.device_mesh, update.placements, src_data_rank=None)
    return spec(update, log)


# ------------------------------------------------------------------------------------------ distributed Muon


def ns_cost(shape: Sequence[int]) -> int:
    """Newton–Schulz work of a (stack of) m×n matrices, up to a constant: b·m·n·min(m, n)."""
    *batch, m, n = shape
    return math.prod(batch) * m * n * min(m, n)


def assign_owners(costs: Sequence[int], world: int) -> list[int]:
    """Owner rank per matrix by greedy LPT: largest first, each to the least-loaded rank (ties: lowest index).
    A pure function of `costs`, so every rank computes the same owners without communicating."""
    loads, owners = [0] * world, [0] * len(costs)
    for j in sorted(range(len(costs)), key=lambda j: (-costs[j], j)):
        owners[j] = min(range(world), key=lambda r: (loads[r], r))
        loads[owners[j]] += costs[j]
    return owners


def shard_sizes(length: int, world: int) -> list[int]:
    """Sizes along a Shard dim per mesh coordinate, as DTensor and FSDP2 split it (torch.chunk): ⌈length/world⌉
    each, the remainder last, trailing ranks possibly empty (7 rows on 2 ranks: 4 | 3; 1 row: 1 | 0)."""
    chunk = -(-length // world)
    return [max(0, min(length - r * chunk, chunk)) for r in range(world)]


def split_dims(t: Tensor) -> Optional[tuple[int, int]]:
    """(mesh dim, tensor dim) of the one Shard placement of a DTensor that distributed Muon handles; None (the
    reference path) for a plain tensor, a mesh dim of one rank, or anything but one Shard plus Replicates."""
    if not isinstance(t, DTensor):
        return None
    shards = [(i, p.dim % t.ndim) for i, p in enumerate(t.placements) if type(p) is Shard]
    if len(shards) != 1 or not all(type(p) in (Shard, Replicate) for p in t.placements):
        return None  # e.g. Partial, or FSDP2 × tensor parallel (_StridedShard): gather whole, as before
    mesh_dim, dim = shards[0]
    return (mesh_dim, dim) if t.device_mesh.size(mesh_dim) > 1 else None


def _like(local: Tensor, like: DTensor) -> DTensor:
    """`local` as this rank's shard of a DTensor laid out as `like` (global shape given: shards may be uneven)."""
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                              stride=like.stride())


def orthogonalize_local(update: DTensor, spec: NSSpec, log: Optional[list[tuple[int, ...]]] = None) -> DTensor:
    """A stack split along a batch dim (MoE experts (E, m, n) on Shard(0)): each rank holds whole matrices and
    orthogonalizes its own, with no communication."""
    local = update.to_local()
    return _like(spec(local, log) if local.numel() else local.to(spec.dtype), update)


def _mesh_order(mesh: DeviceMesh, mesh_dim: int) -> tuple[dist.ProcessGroup, int, list[int]]:
    """The process group along `mesh_dim`, this rank's coordinate on it, and each coordinate's rank in the group
    (a DeviceMesh may list ranks in any order; a process group numbers them in ascending global rank)."""
    group, coord = mesh.get_group(mesh_dim), list(mesh.get_coordinate())
    me, coord[mesh_dim] = coord[mesh_dim], slice(None)
    return group, me, [dist.get_group_rank(group, r) for r in mesh.mesh[tuple(coord)].tolist()]


def _all_to_all(chunks: list[list[Tensor]], recv_numel: list[int], group: dist.ProcessGroup, group_rank: list[int],
                like: Tensor) -> list[Tensor]:
    """Send the flat tensors chunks[c] to mesh coordinate c; returns, per coordinate, the flat tensor it sent here."""
    coord_of = sorted(range(len(group_rank)), key=lambda c: group_rank[c])  # group rank → coordinate
    send = torch.cat([like.new_empty(0)] + [t for c in coord_of for t in chunks[c]])
    in_splits = [sum(t.numel() for t in chunks[c]) for c in coord_of]
    out_splits = [recv_numel[c] for c in coord_of]
    out = like.new_empty(sum(out_splits))
    dist.all_to_all_single(out, send, out_splits, in_splits, group=group)
    parts = out.split(out_splits)
    return [parts[group_rank[c]] for c in range(len(group_rank))]


def orthogonalize_exchange(updates: list[DTensor], specs: list[NSSpec], mesh_dim: int,
                           log: Optional[list[tuple[int, ...]]] = None) -> list[DTensor]:
    """Matrices split along a matrix dim (FSDP2's row shards) on one mesh: shards → owner, NS there, rows back
    (the module docstring). Every update shares the mesh and its Shard's mesh dim; all specs share one dtype."""
    group, me, group_rank = _mesh_order(updates[0].device_mesh, mesh_dim)
    world, dtype = len(group_rank), specs[0].dtype
    owners = assign_owners([ns_cost(u.shape) for u in updates], world)
    dims = [u.placements[mesh_dim].dim % u.ndim for u in updates]
    sizes = [shard_sizes(u.shape[d], world) for u, d in zip(updates, dims)]

    def piece(j: int, c: int) -> list[int]:  # shape of coordinate c's shard of matrix j
        shape = list(updates[j].shape)
        shape[dims[j]] = sizes[j][c]
        return shape

    local = [u.to_local() for u in updates]
    for j, t in enumerate(local):
        if list(t.shape) != piece(j, me):
            raise RuntimeError(f"Muon: shard of shape {tuple(t.shape)} is not torch.chunk's {piece(j, me)} of "
                               f"{tuple(updates[j].shape)}; set optim.muon.distributed=false")
    by_owner = [[j for j, o in enumerate(owners) if o == c] for c in range(world)]
    mine = by_owner[me]
    like = local[0].new_empty(0, dtype=dtype)

    # 1. every rank's shard of U → its owner, in the NS dtype (NS's own first cast, so no bits change)
    chunks = [[local[j].to(dtype).reshape(-1) for j in by_owner[c]] for c in range(world)]
    recv = [sum(math.prod(piece(j, c)) for j in mine) for c in range(world)]
    got = [part.split([math.prod(piece(j, c)) for j in mine]) for c, part in
           enumerate(_all_to_all(chunks, recv, group, group_rank, like))]
    # 2. the owner reassembles each whole matrix and orthogonalizes it, exactly as the reference path does
    results = [specs[j](torch.cat([got[c][k].view(piece(j, c)) for c in range(world)], dims[j]), log)
               for k, j in enumerate(mine)]
    # 3. each rank's own rows of O ← their owner
    offsets = [[sum(s[:c]) for c in range(world)] for s in sizes]
    chunks = [[o.narrow(dims[j], offsets[j][c], sizes[j][c]).reshape(-1) for j, o in zip(mine, results)]
              for c in range(world)]
    recv = [sum(local[j].numel() for j in by_owner[c]) for c in range(world)]
    out: list[Optional[DTensor]] = [None] * len(updates)
    for c, part in enumerate(_all_to_all(chunks, recv, group, group_rank, like)):
        for j, flat in zip(by_owner[c], part.split([local[j].numel() for j in by_owner[c]])):
            out[j] = _like(flat.view(local[j].shape), updates[j])
    return out  # type: ignore[return-value]


def plan_buckets(grads: Sequence[Tensor], specs: Sequence[NSSpec], distributed: Sequence[bool],
                 cap: int = EXCHANGE_BUCKET_ELEMENTS) -> list[tuple[list[int], Optional[int]]]:
    """The order in which step() orthogonalizes: (indices, mesh dim) per batch. A mesh dim marks an exchange
    bucket (row-split matrices of one mesh and NS dtype, ≤ `cap` elements per rank unless one matrix alone is
    larger); None, one tensor on its own (reference or local path). Depends only on global shapes and placements,
    so every rank gets the same plan and calls the same collectives in the same order."""
    done: list[tuple[list[int], Optional[int]]] = []
    open_: dict[tuple[Any, ...], tuple[list[int], int]] = {}  # key → (indices, their global numel)
    for i, (g, spec, on) in enumerate(zip(grads, specs, distributed)):
        where = split_dims(g) if on else None
        if where is None or where[1] < g.ndim - 2:
            done.append(([i], None))
            continue
        key = (g.device_mesh, where[0], spec.dtype)
        bucket, numel = open_.get(key, ([], 0))
        if bucket and numel + g.numel() > cap * g.device_mesh.size(where[0]):
            done.append((bucket, where[0]))
            bucket, numel = [], 0
        bucket.append(i)
        open_[key] = (bucket, numel + g.numel())
    done += [(bucket, key[1]) for key, (bucket, _) in open_.items()]
    return sorted(done, key=lambda b: b[0][0])


# ---------------------------------------------------------------------------------------------- the optimizer


def momentum_update(grad: Tensor, momentum_buffer: Tensor, momentum: float, nesterov: bool,
                    keep: Optional[Tensor] = None) -> Tensor:
    """B ← μB + (1−μ)G in place; returns U = (1−μ)G + μB (Nesterov) or B.

    `keep` (a 0-dim float tensor on the device, 1 or 0): 0 makes this a no-op on B without reading the flag on the
    host — G is replaced by 0 (it may be NaN) and the lerp weight is 0·(1−μ), so B + 0·(0 − B) = B exactly. With 1
    the values are those of the path without `keep`, bit for bit (tests/test_optim_hybrid.py): the weight is the
    same fp32 number and the lerp kernel the same formula."""
    if keep is None:
        momentum_buffer.lerp_(grad, 1 - momentum)
        return grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer
    grad = torch.where(keep > 0, grad, 0.0)
    momentum_buffer.lerp_(grad, keep * (1 - momentum))
    return grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer


def apply_update(param: Tensor, ortho: Tensor, lr: float, weight_decay: float, update_scale_kind: str,
                 shape: Optional[Sequence[int]] = None, keep: Optional[Tensor] = None) -> None:
    """W ← W·(1 − lr·wd) − lr·s(m, n)·O, in place; (m, n) from `shape` (the logical one) or else param.shape.

    `keep` (0-dim, 1 or 0, on the device): 0 leaves W exactly as it is — the decay factor is 1 − 0·lr·wd = 1 and O·0 = 0
    (O is finite: momentum_update zeroed the gradient) — with no host read. With 1 the numbers are the plain path's:
    the factor is computed in float64 as Python computes 1 − lr·wd, and O·1 = O."""
    alpha = -lr * update_scale(param.shape if shape is None else shape, update_scale_kind)
    if keep is None:
        param.mul_(1 - lr * weight_decay)
        param.add_(ortho, alpha=alpha)
        return
    param.mul_(1 - keep.double() * (lr * weight_decay))
    param.add_(ortho * keep.to(ortho.dtype), alpha=alpha)


def logical_shape(group: dict[str, Any], param: Tensor) -> tuple[int, ...]:
    """The global shape whose update scale `param` takes: the group's "logical_shapes" entry for it (a zero-padded
    matrix's unpadded shape), else its own."""
    for q, shape in zip(group["params"], group.get("logical_shapes") or ()):
        if q is param:
            return tuple(shape)
    return tuple(param.shape)


@torch.no_grad()
def muon_update(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor,
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    nesterov: bool,
    ns_coefficients: tuple[float, float, float],
    ns_steps: int,
    eps: float,
    update_scale_kind: str,
    ns_dtype: str = "bfloat16",
) -> None:
    """One Muon step for one parameter, in place (param, momentum_buffer); plain tensors or DTensors alike, on the
    reference path."""
    update = momentum_update(grad, momentum_buffer, momentum, nesterov)
    ortho = orthogonalize(update, ns_coefficients, ns_steps, eps, getattr(torch, ns_dtype))
    apply_update(param, ortho, lr, weight_decay, update_scale_kind)


class Muon(torch.optim.Optimizer):
    """Muon over ≥2-D parameters; state per parameter is {"momentum_buffer"}, as in torch.optim.Muon.

    Defaults follow PAPER.md §3.2 (Nesterov 0.95, wd 0.1, 5 NS steps, Moonlight scaling). Param groups may carry
    extra keys (name, kind, lr_scale, initial_lr); HybridOptimizer (optim/hybrid.py) drives this class as its Muon
    engine over its own groups and state. `distributed` (per group) turns on distributed Muon for DTensors (module
    docstring); `ns_shapes` lists the shapes this rank orthogonalized in the last step (telemetry, tests).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        ns_steps: int = 5,
        eps: float = 1e-7,
        update_scale: str = "moonlight",
        ns_dtype: str = "bfloat16",
        distributed: bool = True,
    ) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1:
            raise ValueError(f"Muon: need lr ≥ 0, weight_decay ≥ 0, momentum in [0, 1); got {lr}, "
                             f"{weight_decay}, {momentum}")
        if update_scale not in UPDATE_SCALES or len(ns_coefficients) != 3 or not 0 < ns_steps < 100:
            raise ValueError(f"Muon: bad update_scale {update_scale!r}, ns_coefficients {ns_coefficients} or "
                             f"ns_steps {ns_steps}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=tuple(ns_coefficients), ns_steps=ns_steps, eps=eps, update_scale=update_scale,
                        ns_dtype=ns_dtype, distributed=distributed)
        super().__init__(params, defaults)
        self.ns_shapes: list[tuple[int, ...]] = []
        self.bucket_elements = EXCHANGE_BUCKET_ELEMENTS  # per rank and exchange bucket (plan_buckets)
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(f"Muon takes matrices (≥ 2-D); got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None, found_inf: Optional[Tensor] = None
             ) -> Optional[float]:
        """`found_inf`: a 0-dim float tensor on the device; nonzero makes the whole step a no-op (momentum and
        weights untouched) without a host read — the contract of fused AdamW's found_inf, which train.py passes to
        both engines (optim/hybrid.py)."""
        keep = None if found_inf is None else 1.0 - found_inf.float().clamp(0, 1)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [(p, g) for g in self.param_groups for p in g["params"] if p.grad is not None]
        specs = [NSSpec(tuple(g["ns_coefficients"]), g["ns_steps"], g["eps"], getattr(torch, g.get("ns_dtype",
                 "bfloat16"))) for _, g in work]
        flags = [bool(g.get("distributed", True)) for _, g in work]
        self.ns_shapes = []
        # Per batch: momentum → orthogonalize → apply; each parameter's arithmetic is its own, so batching changes
        # no bits, and only one batch's updates are alive at a time.
        for batch, mesh_dim in plan_buckets([p.grad for p, _ in work], specs, flags, self.bucket_elements):
            updates = [self._update(*work[i], keep) for i in batch]
            if mesh_dim is not None:
                orthos = orthogonalize_exchange(updates, [specs[i] for i in batch], mesh_dim, self.ns_shapes)
            else:
                orthos = [self._orthogonalize_one(u, specs[i], flags[i]) for u, i in zip(updates, batch)]
            for i, ortho in zip(batch, orthos):
                p, g = work[i]
                apply_update(p, ortho, float(g["lr"]), g["weight_decay"], g["update_scale"], logical_shape(g, p),
                             keep=keep)
        return loss

    def _update(self, p: Tensor, group: dict[str, Any], keep: Optional[Tensor] = None) -> Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        return momentum_update(p.grad, state["momentum_buffer"], group["momentum"], group["nesterov"], keep)

    def _orthogonalize_one(self, update: Tensor, spec: NSSpec, distributed: bool) -> Tensor:
        where = split_dims(update) if distributed else None
        if where is not None and where[1] < update.ndim - 2:
            return orthogonalize_local(update, spec, self.ns_shapes)
        return orthogonalize(update, *spec, log=self.ns_shapes)

"""How Muon.step (optim/muon.py) splits the Newton–Schulz work of FSDP2-sharded matrices across ranks, instead of
the reference path, optim/muon.py's `orthogonalize` (`full_tensor()`, then NS on every rank).

Distributed Muon (`optim.muon.distributed: true`, the default; docs/design.md principle 9) gives each matrix one owner
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
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

if TYPE_CHECKING:  # optim/muon.py imports this module: NSSpec's type only, no import at run time
    from optim.muon import NSSpec

# Per rank and exchange bucket: ~4 transient buffers of this many NS-dtype elements (128 Mi: 256 MB each in bf16);
# a Llama-7B's matrices (6.5 G) on 8 ranks are ~7 buckets, enough matrices per bucket for LPT to balance.
EXCHANGE_BUCKET_ELEMENTS = 1 << 27


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
    """The order in which Muon.step() orthogonalizes: (indices, mesh dim) per batch. A mesh dim marks an exchange
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

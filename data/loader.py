"""The training loader and the validation streams, over memory-mapped token shards.

Training windows. A window is seq_len + 1 contiguous tokens starting at a multiple of seq_len inside one shard
(x = the first seq_len, y = the last seq_len, so every token but a shard's first is a target exactly once per
epoch); windows never cross a shard boundary. Number them 0..W-1 in shard order.

Order. Epoch e visits the windows in the order of a keyed bijection of [0, W), `window_order`: a Feistel network
over the smallest even-bit domain ≥ W with round keys from numpy's PCG64 seeded with (seed, e), cycle-walked back
into [0, W). Position i of the epoch reads window π_e(i), computed for just the rows of a batch: no per-epoch array,
so memory and start-up stay flat however large the data (106B tokens are 103M windows of 1,024: a materialized
int64 permutation would be 0.8 GB per rank per cached epoch, and seconds to draw). Checkpoints written before
(state versions 1–2) resume in the order they started with, numpy's `permutation(W)` seeded with (seed, e). The
epochs are laid end to end as one global stream; global step k takes the micro_batch × world_size consecutive
positions [k·B·ws, (k+1)·B·ws), and rank r takes positions k·B·ws + i·ws + r for i < B. Hence, for any world
size: ranks are disjoint, every window appears exactly once per epoch across ranks, no window is ever dropped,
and every rank produces the same number of batches (a batch may straddle two epochs).

Resuming anywhere. The state is the global position — windows consumed by all ranks together, k·B·ws — the same on
every rank, so rank 0's `state_dict()` resumes them all, on any world size and micro-batch. An optimizer step of
global batch G (= B·ws·accumulation) reads positions [s·G, (s+1)·G) whatever B and ws are: a resume onto 1 rank
with twice the micro-batch, or onto 4 ranks with half, trains every later step on exactly the same windows. What
does change is which rank, and which micro-batch, holds a window: sums over the global batch (the loss, the
gradients) then differ by fp32 reduction order only. A forward's micro-batches of all ranks together hold positions
[s·G + j·B·ws, s·G + (j+1)·B·ws): a layout with the same B·ws (2 ranks × 4 → 1 × 8) keeps those groups too, so a
term computed per forward over all ranks (a MoE's Switch aux loss, model/moe.py) is unchanged; another B·ws regroups
it. `batch_digest` identifies a global batch's tokens independently of the split.

Validation. `val_batches` reads the first `max_tokens` tokens of a val split (shards concatenated in order) as
windows at stride seq_len, the same for every run. With n windows and ws ranks, rank r takes windows r, r+ws, …
of the first ⌊n/ws⌋·ws (the < ws leftover windows are dropped, so with ws = 1 nothing is) and yields them in
batches of micro_batch, the last one possibly smaller but of the same size on every rank: every rank runs the
same number of forwards, so collectives never hang. Average losses weighted by rows, not per batch. This is
train.eval_sample=prefix; the mixture's windows (a document-shuffled sample per source) are data/evalset.py's.

Running ahead. With `prefetch=True` a daemon thread gathers the next micro-batches while the trainer computes
(data/prefetch.py): the same batches as without it. `step` counts the batches the trainer has consumed, never the
ones gathered ahead, so `state_dict()` resumes exactly.
On CUDA the host batch is pinned and its copy to the device asynchronous (with or without prefetch).
`resolve_prefetch` turns train.loader_prefetch into the flag.
"""
from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from data.prefetch import Producer
from data.shards import DataError, Meta, load_meta, open_shard
from data.verify import out_of_vocab

STATE_VERSION = 3  # 1: the per-rank micro-batch count `step` (position = step·B·ws); 1–2: the materialized order
FEISTEL_ROUNDS = 6  # ≥ 4 makes a Feistel network a pseudo-random permutation (Luby–Rackoff); 6 for margin


def resolve_prefetch(setting: str | bool, device: torch.device | str) -> bool:
    """train.loader_prefetch → TrainLoader's `prefetch`: true/false as given; "auto" runs ahead on CUDA only.
    Measured on 2 CPU cores (harness/bench_loader.py): with the data in the page cache next_batch costs the loop
    0.2–0.5 ms right after a step either way, and neither a 5 ms compute step nor the tiny model's ~1.2 s step is
    faster with the thread (differences inside the noise), so the CPU default is the plain path. Prefetch pays
    when the reads go to the disk, as in the first epoch of a dataset larger than RAM: next_batch 7.5–8.3 →
    0.9–1.2 ms per 16-row batch, 13.6–14.5 → 7.7–8.5 ms per 5 ms-step iteration; set it true there."""
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ValueError(f"loader_prefetch must be auto, true or false (got {setting!r})")
    return torch.device(device).type == "cuda"


DIGEST_PRIME = 2**31 - 1
_DIGEST_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def batch_digest(x: torch.Tensor) -> torch.Tensor:
    """An integer naming the windows of a batch, whichever ranks and micro-batches hold them: Σ over rows of
    (Σ_t x_t·w_t mod P), P = 2³¹ − 1, w a fixed pseudo-random vector in [1, P). A plain sum over rows, so the digests
    of a global batch's micro-batches, summed over accumulation and all-reduced over ranks, give one number per
    step that any layout reproduces; a different window (or a shifted one) changes it. x: (B, L) int64 ids;
    returns a 0-dim int64 tensor on x's device (no host read). Exact: each term (x·w mod P) < 2³¹, so a row sums
    below 2⁶³ for L < 2³², and a global batch's total stays below 2⁵³ (exact in the fp64 all-reduce) for fewer
    than 2²² rows."""
    key = (x.shape[-1], str(x.device))
    if key not in _DIGEST_WEIGHTS:
        gen = torch.Generator().manual_seed(0)
        _DIGEST_WEIGHTS[key] = torch.randint(1, DIGEST_PRIME, (x.shape[-1],), generator=gen).to(x.device)
    return ((x * _DIGEST_WEIGHTS[key]) % DIGEST_PRIME).sum()  # x < 2³¹ ids: each product < 2⁶²


def read_meta(data_dir: str | Path) -> dict:
    """meta.json as a plain dict: n_vocab, tokenizer {spec, name, ranks_hash, n_vocab, eot}, source, request,
    dtype, splits {train, val: {docs, tokens, shards}}, text_bytes, seconds, fingerprint. A missing dir is an
    error that names the prepare command."""
    return load_meta(data_dir).to_dict()


FD_HEADROOM = 256  # open files left for everything else (sockets, checkpoints, compile caches, wandb)


def make_room_for_files(n: int, data_dir: Path) -> None:
    """Each memory-mapped shard holds a file descriptor while the split is open: 1,060 for 106B tokens in 100M-token
    shards (harness/bench_loader.py --scale-check), above the 1,024 that many systems allow by default. Raise this
    process's soft limit of open files to make room for `n` more, up to the hard limit (no privilege needed), or
    say what to do."""
    try:
        import resource
    except ImportError:  # not POSIX: no such limit to manage
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fd_dir = Path("/proc/self/fd")
    need = (len(list(fd_dir.iterdir())) if fd_dir.is_dir() else 0) + n + FD_HEADROOM
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        raise DataError(f"{data_dir}: its {n:,} shards hold {n:,} open files, but this process may open at most "
                        f"{hard:,} (`ulimit -Hn`); raise the limit (`ulimit -n {need}` as root or in "
                        "/etc/security/limits.conf) or re-prepare with fewer, larger shards (--shard-tokens)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def _open_split(data_dir: Path, meta: Meta, split: str) -> list[np.ndarray]:
    info = meta.splits.get(split)
    if info is None or not info.shards:
        what = "an eval-only set" if meta.eval_only else "prepared without it"
        raise DataError(f"{data_dir} has no {split} split ({what})")
    make_room_for_files(len(info.shards), data_dir)
    arrays = []
    for shard in info.shards:
        arr = open_shard(data_dir / shard.file)
        if len(arr) != shard.tokens:
            raise DataError(f"shard {data_dir / shard.file} holds {len(arr)} tokens but meta.json says "
                            f"{shard.tokens}; the dir is corrupted, re-run prepare with --force")
        arrays.append(arr)
    return arrays


# splitmix64's constants (Steele, Lea & Flood 2014): golden-ratio increment, then the finalizer's multipliers/shifts
_MIX = tuple(np.uint64(c) for c in (0x9E3779B97F4A7C15, 30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31))


@functools.lru_cache(maxsize=64)
def _round_keys(seed: int, epoch: int) -> tuple[np.uint64, ...]:
    keys = np.random.default_rng([seed, epoch]).integers(0, 2**63, size=FEISTEL_ROUNDS, dtype=np.int64)
    return tuple(np.uint64(k) for k in keys)


def window_order(idx: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """π(idx) for the keyed bijection π of [0, n) that orders epoch `epoch` (module docstring). idx: int64 array of
    positions in [0, n); returns the window ids, same shape. A balanced Feistel network on 2h-bit integers
    (2^2h ≥ n, so the domain is < 4n) is a bijection of [0, 2^2h) for any round function; applying it again to the
    values that land at or above n (cycle walking) restricts it to a bijection of [0, n), in ≤ 4 rounds on average.
    The round function mixes (half, key) with splitmix64's finalizer, in wrapping uint64 arithmetic."""
    idx = np.asarray(idx, dtype=np.int64)
    if n <= 1:
        return np.zeros_like(idx)
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    keys = _round_keys(seed, epoch)

    def feistel(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for k in keys:
            z = (right ^ k) * _MIX[0]
            z = (z ^ (z >> _MIX[1])) * _MIX[2]
            z = (z ^ (z >> _MIX[3])) * _MIX[4]
            z ^= z >> _MIX[5]
            left, right = right, left ^ (z & mask)
        return (left << shift) | right

    out = idx.astype(np.uint64)
    todo = np.arange(out.size)
    flat = out.reshape(-1)
    while todo.size:
        flat[todo] = feistel(flat[todo])
        todo = todo[flat[todo] >= np.uint64(n)]
    return out.astype(np.int64)


class TrainLoader:
    """Batches (x, y) of int64 tensors (micro_batch, seq_len) on `device` for one rank; see the module docstring.
    With prefetch, call `close()` (or use it as a context manager) when done; a forgotten loader's thread still
    ends by itself once the loader is garbage-collected, and never holds up interpreter exit (daemon)."""

    def __init__(self, data_dir: str | Path, seq_len: int, micro_batch: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, *, device: torch.device | str = "cpu", prefetch: bool = False):
        if not (seq_len > 0 and micro_batch > 0 and world_size > 0 and 0 <= rank < world_size):
            raise ValueError(f"TrainLoader: need seq_len, micro_batch > 0 and 0 ≤ rank < world_size "
                             f"(got {seq_len}, {micro_batch}, rank {rank}, world_size {world_size})")
        self.data_dir = Path(data_dir)
        self.seq_len, self.micro_batch, self.rank, self.world_size, self.seed = (
            seq_len, micro_batch, rank, world_size, seed)
        meta = load_meta(self.data_dir)
        self.meta, self.n_vocab = meta, int(meta.tokenizer["n_vocab"])
        self.fingerprint = meta.fingerprint
        self.shards = _open_split(self.data_dir, meta, "train")
        self.files = [self.data_dir / s.file for s in meta.splits["train"].shards]
        # windows in shard s: starts 0, L, 2L, … while start + L + 1 ≤ len(shard)
        per_shard = np.array([max(0, (len(a) - 1) // seq_len) for a in self.shards], dtype=np.int64)
        self.n_windows = int(per_shard.sum())
        if self.n_windows == 0:
            raise DataError(f"{self.data_dir}: the train split's shards are shorter than seq_len + 1 = {seq_len + 1} "
                            "tokens; use a smaller seq_len or more data")
        self._first = np.concatenate([[0], np.cumsum(per_shard)])  # first global window id of each shard
        self.step = 0  # micro-batches the trainer has consumed (identical on every rank); prefetched ones not
        self.order = "feistel"  # "permutation" once a checkpoint of state version 1–2 is loaded
        self._perms: dict[int, np.ndarray] = {}
        self._perms_lock = threading.Lock()  # the producer thread and the caller may both fill the cache
        self.device = torch.device(device)
        self.prefetch = prefetch
        # Pinned (page-locked) host memory is what lets a host→device copy run asynchronously; it needs CUDA.
        self._pin = self.device.type == "cuda"
        self._producer: Producer | None = None

    @property
    def tokens_per_epoch(self) -> int:
        """Target tokens in one pass over all windows (across all ranks)."""
        return self.n_windows * self.seq_len

    @property
    def epochs_done(self) -> float:
        """Passes over the training windows so far, across all ranks (1.0 = every window seen once)."""
        return self.step * self.micro_batch * self.world_size / self.n_windows

    @property
    def epoch(self) -> int:
        """The epoch of the next window this rank reads."""
        return int(self._positions(self.step)[0] // self.n_windows)

    def permutation(self, epoch: int) -> np.ndarray:
        """The materialized order of checkpoints from state versions 1–2 (module docstring), cached per epoch."""
        with self._perms_lock:
            if epoch not in self._perms:
                if len(self._perms) >= 4:  # a batch spans at most a few epochs
                    self._perms.pop(min(self._perms))
                self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
            return self._perms[epoch]

    def _order(self, epoch: int, idx: np.ndarray) -> np.ndarray:
        if self.order == "permutation":
            return self.permutation(epoch)[idx]
        return window_order(idx, self.n_windows, self.seed, epoch)

    def _positions(self, step: int) -> np.ndarray:
        b, ws = self.micro_batch, self.world_size
        return step * b * ws + np.arange(b, dtype=np.int64) * ws + self.rank

    def window_ids(self, step: int) -> np.ndarray:
        """Global window ids of this rank's micro-batch number `step`."""
        pos = self._positions(step)  # (B,)
        epochs, idx = np.divmod(pos, self.n_windows)
        out = np.empty_like(pos)
        for e in np.unique(epochs):  # one or two epochs per batch
            sel = epochs == e
            out[sel] = self._order(int(e), idx[sel])
        return out

    def gather(self, step: int) -> torch.Tensor:
        """Micro-batch number `step` on the host as one int64 tensor (2, B, L): [0] is x, [1] is y (one buffer, so
        one copy to the device). Pinned when the device is CUDA. A pure function of `step`: the producer thread
        calls it ahead of time."""
        L = self.seq_len
        out = torch.empty((2, self.micro_batch, L), dtype=torch.int64, pin_memory=self._pin)
        rows = out.numpy()  # (2, B, L) view of the same memory: numpy widens uint16/uint32 straight into it
        wids = self.window_ids(step)  # (B,)
        shard = np.searchsorted(self._first, wids, side="right") - 1  # (B,) the shard of each window
        starts = (wids - self._first[shard]) * L  # (B,) token offset inside it
        # One fancy index per shard rather than a Python loop per row (~2× faster): the reads from the memory map,
        # page faults included, happen inside numpy, and it is only the Python around them that holds the GIL
        # the training loop needs too.
        for s in np.unique(shard):
            sel = np.flatnonzero(shard == s)
            win = self.shards[s][starts[sel, None] + np.arange(L + 1)]  # (b_s, L + 1)
            if int(win.max()) >= self.n_vocab:  # a shard changed after it was prepared: never an IndexError later
                row = int(np.argmax((win >= self.n_vocab).any(axis=1)))
                raise DataError(out_of_vocab(self.files[s], win[row], self.n_vocab, self.data_dir, self.meta,
                                             int(starts[sel][row])))
            rows[0, sel] = win[:, :-1]
            rows[1, sel] = win[:, 1:]
        return out

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next micro-batch (x, y), each int64 (micro_batch, seq_len) on `device`; y is x shifted by one."""
        host = self._take_prefetched() if self.prefetch else self.gather(self.step)  # (2, B, L)
        self.step += 1
        if self.device.type != "cpu":
            # Why fresh pinned tensors rather than a few rotating ones: torch's caching host allocator records an
            # event on the current stream for every non_blocking copy out of a pinned block and hands the block
            # out again only once that event has completed, so dropping `host` right after this line can never
            # let a later gather overwrite memory an in-flight copy still reads; rotating buffers would need the
            # same events by hand. Steady state allocates nothing new (the allocator caches the blocks).
            # The copy (B·L·16 bytes: 256 KiB at 16 × 1024) is queued on the compute stream: no host wait, and a
            # side stream would save only its ~10 µs of device time at the cost of cross-stream bookkeeping.
            host = host.to(self.device, non_blocking=self._pin)
        return host[0], host[1]

    def _take_prefetched(self) -> torch.Tensor:
        # (Re)start the producer where the trainer stands: first call, after load_state_dict or close(), or after
        # anyone moved `step`; its queued batches are for another position then.
        if self._producer is None or self._producer.next_step != self.step:
            self.close()
            self._producer = Producer(self, self.step)
        return self._producer.take()

    def close(self) -> None:
        """Stop the prefetch thread (if any) and drop its queued batches; a later next_batch() starts a new one."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def __enter__(self) -> TrainLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    @property
    def position(self) -> int:
        """Windows consumed so far by all ranks together: the global position in the stream of epochs."""
        return self.step * self.micro_batch * self.world_size

    def state_dict(self) -> dict:
        """The global position plus what must not change under it. `world_size` and `micro_batch` are the saving
        run's layout, for the resume message: a resume may change them (module docstring)."""
        return {"version": STATE_VERSION, "position": self.position, "epoch": self.epoch, "seed": self.seed,
                "seq_len": self.seq_len, "fingerprint": self.fingerprint, "world_size": self.world_size,
                "micro_batch": self.micro_batch, "order": self.order}

    def load_state_dict(self, sd: dict) -> None:
        """Continue at the saved global position, on this loader's world size and micro-batch. Refused, with a
        message naming the numbers, if the data, seq_len or seed differ (other windows, another experiment) or if
        the position does not fall on a micro-batch boundary of this layout (it always does when the global batch
        is unchanged and divisible, as train.py requires)."""
        version = sd.get("version", 1)
        if version not in (1, 2, STATE_VERSION):
            raise DataError(f"loader state version {version} is newer than this code reads ({STATE_VERSION}); "
                            "resume with the version of scalevec that wrote the checkpoint")
        if sd.get("fingerprint") != self.fingerprint:
            raise DataError(f"loader state is for data with fingerprint {str(sd.get('fingerprint'))[:12]}, but "
                            f"{self.data_dir} has {self.fingerprint[:12]}: the data changed since the checkpoint "
                            "(re-prepared, or another data.dir); resume with the original data or start a new run")
        for key in ("seq_len", "seed"):
            if sd.get(key) != getattr(self, key):
                raise DataError(f"loader state was saved with {key}={sd.get(key)}, this run has "
                                f"{key}={getattr(self, key)}: other windows in another order, so not a resume; "
                                f"use the original {key} or start a new run")
        # version 1 counted this rank's micro-batches under the saving layout, the same on every rank
        position = int(sd["position"]) if version >= 2 else int(sd["step"]) * sd["micro_batch"] * sd["world_size"]
        per_batch = self.micro_batch * self.world_size
        if position % per_batch:
            raise DataError(f"the checkpoint's data position ({position} windows, written by world_size="
                            f"{sd.get('world_size')} × micro_batch={sd.get('micro_batch')}) is not a multiple of this "
                            f"run's micro_batch × world_size = {self.micro_batch} × {self.world_size} = {per_batch}: "
                            "no micro-batch of this layout starts there; resume with a layout that divides it")
        self.close()  # batches gathered ahead belong to the old position
        self.order = sd.get("order", "permutation")  # versions 1–2 drew the materialized permutation
        if self.order not in ("feistel", "permutation"):
            raise DataError(f"loader state has window order {self.order!r}, which this code does not know; resume "
                            "with the version of scalevec that wrote the checkpoint")
        self.step = position // per_batch

    def __repr__(self) -> str:
        return (f"TrainLoader({self.data_dir}, seq_len={self.seq_len}, micro_batch={self.micro_batch}, rank "
                f"{self.rank}/{self.world_size}, {self.n_windows} windows, step {self.step}, device {self.device}"
                f"{', prefetch' if self.prefetch else ''})")


def val_batches(data_dir: str | Path, seq_len: int, micro_batch: int, rank: int = 0, world_size: int = 1,
                max_tokens: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The first max_tokens (None: all) tokens of the val split as (x, y) batches for this rank (module doc)."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir)
    tokens = _read_prefix(_open_split(data_dir, meta, "val"), max_tokens)
    problem = out_of_vocab(data_dir / "val_*.bin", tokens, int(meta.tokenizer["n_vocab"]), data_dir, meta)
    if problem:
        raise DataError(problem)
    n = max(0, (len(tokens) - 1) // seq_len)
    per_rank = n // world_size
    if per_rank == 0:
        raise DataError(f"{data_dir}: the val stream ({len(tokens)} tokens) makes {n} windows of {seq_len + 1}, "
                        f"fewer than the {world_size} rank(s); raise eval_tokens or lower seq_len")
    ids = np.arange(per_rank, dtype=np.int64) * world_size + rank
    for lo in range(0, per_rank, micro_batch):
        rows = np.stack([tokens[w * seq_len: w * seq_len + seq_len + 1] for w in ids[lo: lo + micro_batch]])
        buf = torch.from_numpy(rows.astype(np.int64))
        yield buf[:, :-1].contiguous(), buf[:, 1:].contiguous()


def _read_prefix(shards: list[np.ndarray], max_tokens: int | None) -> np.ndarray:
    # max_tokens targets need max_tokens + 1 tokens (the last window's final target)
    want = None if max_tokens is None else max_tokens + 1
    parts, have = [], 0
    for arr in shards:
        take = len(arr) if want is None else min(len(arr), want - have)
        parts.append(np.asarray(arr[:take]))
        have += take
        if want is not None and have >= want:
            break
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

"""Running ahead for the training loader (data/loader.py's TrainLoader with `prefetch=True`): a daemon thread
gathers micro-batches step, step + 1, … (at most PREFETCH_DEPTH ahead) while the trainer computes, and `next_batch()`
only takes the next one: the same batches as without it. The thread reaches the loader only through a weak reference
and uses nothing of it but `gather(step)` (a pure function of `step`) and `rank` (for the thread's name).
"""
from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # data/loader.py imports this module: the loader's type only, no import at run time
    from data.loader import TrainLoader

PREFETCH_DEPTH = 2  # batches gathered ahead of the trainer at most: one hides a gather, two absorb jitter
_POLL_S = 0.1  # how often a blocked producer looks for close() or a garbage-collected loader


class Producer:
    """One daemon thread gathering micro-batches start, start + 1, … of a loader, in order, at most PREFETCH_DEPTH
    ahead of take(). The thread holds the loader only through a weak reference, so a loader nobody closed can still
    be collected, and the thread then ends within _POLL_S. An exception in a gather is queued in that batch's place
    and raised by take() (the original exception, with its message and traceback), then again on every later take().

    Two C-level SimpleQueues (batches one way, free slots the other) instead of one bounded queue.Queue: a take is
    then one C call (measured right after a step: ~45 µs, against 160–2000 µs for Queue's Python-level locking)."""

    def __init__(self, loader: TrainLoader, start: int):
        self.next_step = start  # the step take() returns next
        self._ready: queue.SimpleQueue[tuple[int, torch.Tensor | Exception]] = queue.SimpleQueue()
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token per batch it may gather ahead
        for _ in range(PREFETCH_DEPTH):
            self._slots.put(None)
        self._stop = threading.Event()
        self._error: Exception | None = None
        _stop_at_exit(self)
        self._thread = threading.Thread(
            target=_produce, args=(weakref.ref(loader), start, self._ready, self._slots, self._stop),
            name=f"TrainLoader-prefetch-rank{loader.rank}", daemon=True)
        self._thread.start()

    def take(self) -> torch.Tensor:
        if self._error is not None:
            raise self._error
        while True:
            try:
                step, item = self._ready.get(timeout=_POLL_S)  # returns as soon as a batch is put
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._ready.empty():  # only close() ends it without a batch
                    raise RuntimeError("TrainLoader: the prefetch thread ended without producing the next batch")
        if isinstance(item, Exception):
            self._error = item
            raise item
        assert step == self.next_step, (step, self.next_step)
        self.next_step += 1
        self._slots.put(None)
        return item

    def close(self) -> None:
        self._stop.set()
        self._slots.put(None)  # wakes a producer waiting for a slot at once
        self._thread.join(timeout=10.0)  # a gather in flight takes ~1 ms (a cold one more); bounded for a stuck disk
        while not self._ready.empty():  # drop the batches gathered ahead now, not when the loader goes
            self._ready.get_nowait()


_LIVE: weakref.WeakSet[Producer] = weakref.WeakSet()
_AT_EXIT = False


def _stop_at_exit(producer: Producer) -> None:
    """Close every producer before the interpreter finalizes. A daemon thread still inside a torch call then (GIL
    released) is killed by pthread_exit when it takes the GIL back, which unwinds through C++ noexcept frames:
    "terminate called without an active exception" and SIGABRT (8 of 12 exits right after a first next_batch).
    atexit handlers run while daemon threads are still alive, so joining them there avoids it."""
    global _AT_EXIT
    if not _AT_EXIT:  # registered with the first producer: no import-time side effects
        atexit.register(_close_all)
        _AT_EXIT = True
    _LIVE.add(producer)


def _close_all() -> None:
    for producer in list(_LIVE):
        producer.close()


def _produce(ref: weakref.ref[TrainLoader], step: int, ready: queue.SimpleQueue, slots: queue.SimpleQueue,
             stop: threading.Event) -> None:
    """The producer thread's body (a function, not a method, so that it holds no strong reference to the loader)."""
    while True:
        while True:  # wait for a free slot, looking now and then for close() or a collected loader
            try:
                slots.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if ref() is None:
                    return
        loader = ref()
        if stop.is_set() or loader is None:
            return
        try:
            item: torch.Tensor | Exception = loader.gather(step)
        except Exception as e:  # surfaced by take(); the thread stops here
            item = e
        del loader
        ready.put((step, item))
        if isinstance(item, Exception):
            return
        step += 1

"""Shared-memory blocks that a DataLoader worker reuses once the main process has let go of them.

A batch crosses from a worker to the main process in shared memory. A fresh block costs the kernel a page fault
and a zeroed page for every 4 KiB written into it, which is more than the copy itself: filling a fresh 59 MB
block (64 frames of 480x640) took ~68 ms here against ~17 ms for a block written before, and a 9.6 MB one
(224x224) ~11.5 ms against 3. So each worker keeps the blocks it has sent in a small pool and writes a later batch
into one the main process is done with:

- a worker's pool has a control block in shared memory holding, per slot, the number of the last hand-over of its
  block (written by the worker) and the last hand-over the main process has released (written by the main
  process); the control block travels to the main process with the first block the worker sends;
- every pooled block is pickled with a ticket (pool, slot, hand-over number), see `TensorBatch`;
- the receiving process watches each pooled block's storage through a weak reference and, once nothing holds it
  any more (no tensor, view or numpy array of it), releases that hand-over in the control block; it looks
  whenever a batch arrives;
- the worker writes into a block again only when its last hand-over has been released.

A block the receiving process still holds is therefore never written. What this cannot see is a process that
passes batch tensors on to a third process (through `torch.multiprocessing`) and drops them before that process is
done with them: such code must copy them, or turn reuse off with `EPISERVE_REUSE_SHARED_MEMORY=0`.
"""

from __future__ import annotations

import math
import multiprocessing.util
import os
import secrets
import threading
from typing import Any

REUSE_VARIABLE = "EPISERVE_REUSE_SHARED_MEMORY"
POOL_SLOTS = 8  # per worker: blocks in flight (DataLoader prefetch), held by the training loop, and free
KEPT_FREE = 3  # free blocks kept beyond the one a batch takes: the rest of a burst's blocks go back at once
_SENT, _RELEASED = 0, 1

Ticket = tuple[int, int, int, int, Any]  # pool token, owner pid, slot, hand-over number, control block or None


def reuse_enabled() -> bool:
    return os.environ.get(REUSE_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


class WorkerPool:
    """The blocks one DataLoader worker process hands over (see the module docstring).

    The pool holds every pooled block's storage. A block is free when the main process has released its last
    hand-over and nothing in this worker but the pool holds it (a batch being filled, or a chunk still being cut
    into batches, holds it), so it is written again only when nobody can see the change."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._use_count = torch._C._storage_Use_Count
        self.token = secrets.randbits(62)
        self.pid = os.getpid()
        control = torch.empty(0, dtype=torch.int64).set_(torch.UntypedStorage._new_shared(POOL_SLOTS * 16))
        self._control = control.view(POOL_SLOTS, 2)
        self._control.zero_()
        self._numbers = self._control.numpy()
        self._control_sent = False
        self._blocks: list[Any] = [None] * POOL_SLOTS
        # per slot: handed out by `empty` and not sent with a ticket since. Such a block may have left the worker
        # without one (a collate_fn or transform that returns a plain tuple or dict of its tensors), so nothing
        # tells when the receiver is done with it: it is dropped from the pool instead of being written again.
        self._untracked = [False] * POOL_SLOTS
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised tensor of `shape` and `dtype` in shared memory for this worker's next batch: in a free
        pooled block that fits, else in a new one (pooled while a slot is empty or holds a free block of another
        size)."""
        nbytes = math.prod(shape) * dtype.itemsize
        with self._lock:  # the block must be held (by the tensor) before another thread looks for a free one
            return self._torch.empty(0, dtype=dtype).set_(self._storage(nbytes), 0, shape)

    def _storage(self, nbytes: int) -> Any:
        free = [slot for slot, block in enumerate(self._blocks) if block is not None and self._free(slot)]
        # the smallest that fits (a larger one is left for larger needs), never over twice the need (the whole block
        # travels with a batch)
        fitting = [slot for slot in free if nbytes <= self._blocks[slot].nbytes() <= 2 * nbytes]
        chosen = min(fitting, key=lambda slot: self._blocks[slot].nbytes()) if fitting else None
        if chosen is not None:
            storage = self._lend(chosen)
        else:
            storage = self._torch.UntypedStorage._new_shared(nbytes)
            vacant = [slot for slot, block in enumerate(self._blocks) if block is None] or free
            if vacant:
                chosen = vacant[0]
                self._blocks[chosen] = storage  # replaces a free block of another size, if any
                self._lend(chosen)
        for slot in [slot for slot in free if slot != chosen][KEPT_FREE:]:
            self._blocks[slot] = None  # more free blocks than the next batches need: their memory goes back
        return storage

    def idle_blocks(self) -> int:
        """How many pooled blocks are free now (for tests and diagnostics)."""
        with self._lock:
            return sum(1 for slot, block in enumerate(self._blocks) if block is not None and self._free(slot))

    def _lend(self, slot: int) -> Any:
        self._untracked[slot] = True
        return self._blocks[slot]

    def ticket(self, storage: Any) -> Ticket | None:
        """The ticket for sending `storage`, if it is a pooled block."""
        address = storage.data_ptr()
        with self._lock:
            return self._ticket(address)

    def _ticket(self, address: int) -> Ticket | None:
        for slot, block in enumerate(self._blocks):
            if block is not None and block.data_ptr() == address:
                self._untracked[slot] = False
                self._numbers[slot, _SENT] += 1
                control = None
                if not self._control_sent:
                    control, self._control_sent = self._control, True
                return (self.token, self.pid, slot, int(self._numbers[slot, _SENT]), control)
        return None

    def _free(self, slot: int) -> bool:
        if self._use_count(self._blocks[slot]._cdata) != 1:
            return False
        if self._untracked[slot]:  # let go of without a ticket: perhaps sent without one (see `__init__`)
            self._blocks[slot], self._untracked[slot] = None, False
            return False
        return bool(self._numbers[slot, _RELEASED] == self._numbers[slot, _SENT])

    def close(self) -> None:
        """Let go of every block and the control block. A worker ends with `os._exit`, which frees no object: under
        torch's "file_system" sharing strategy each block it still held would stay in /dev/shm for as long as the
        main process runs."""
        with self._lock:  # no slots left: a block asked for later (a batch still being pickled) is not pooled
            self._blocks, self._control, self._numbers = [], None, None


class Releases:
    """The receiving side: pooled blocks watched until nothing holds them, then released to their worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._controls: dict[int, tuple[int, Any]] = {}  # pool token -> (owner pid, its control numbers)
        self._watching: list[tuple[Any, int, int, int]] = []  # weak storage, pool token, slot, hand-over

    def receive(self, storage: Any, ticket: Ticket) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        token, pid, slot, number, control = ticket
        with self._lock:
            if control is not None:
                self._controls[token] = (pid, control.numpy())
            self._watching.append((StorageWeakRef(storage), token, slot, number))
            self._sweep()

    def _sweep(self) -> None:
        watching = []
        for watched in self._watching:
            weak, token, slot, number = watched
            if not weak.expired():
                watching.append(watched)
            elif token in self._controls:
                numbers = self._controls[token][1]
                numbers[slot, _RELEASED] = max(int(numbers[slot, _RELEASED]), number)
        self._watching = watching
        watched_pools = {token for _, token, _, _ in watching}
        for token, (pid, _) in list(self._controls.items()):
            if token not in watched_pools and not _alive(pid):
                del self._controls[token]  # its worker is gone: nobody reads these numbers again


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_pool: WorkerPool | None = None
_pool_lock = threading.Lock()
RELEASES = Releases()


def worker_pool(torch: Any) -> WorkerPool | None:
    """This DataLoader worker's pool; None outside a worker, where reuse is off, or in a torch without the
    storage reference counts it needs."""
    global _pool
    from torch.utils.data import get_worker_info

    if get_worker_info() is None or not reuse_enabled():
        return None
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():  # a fork of a worker starts its own pool
            try:
                _pool = WorkerPool(torch)
            except (AttributeError, RuntimeError):
                return None
            multiprocessing.util.Finalize(None, _pool.close, exitpriority=0)  # run as the worker process ends
        return _pool


def tickets(tensors: dict[str, Any]) -> list[tuple[str, Ticket]]:
    """Tickets for those of `tensors` (name -> tensor) that lie in this worker's pooled blocks."""
    pool = _pool
    if pool is None or pool.pid != os.getpid():
        return []
    found = []
    for name, tensor in tensors.items():
        ticket = pool.ticket(tensor.untyped_storage())
        if ticket is not None:
            found.append((name, ticket))
    return found


def receive(tensors: dict[str, Any], tickets: list[tuple[str, Ticket]]) -> None:
    """In the receiving process: watch the pooled blocks of `tensors` until nothing holds them."""
    for name, ticket in tickets:
        RELEASES.receive(tensors[name].untyped_storage(), ticket)

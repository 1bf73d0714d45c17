"""Bounded waits on an object store: a request waits on the store until its deadline, never longer.

The server gives each request a deadline (`EPISERVE_REMOTE_WAIT_S` after it arrives, see `store_deadline`). Work
that reads the store for it (loading a dataset's index, building a segment, reading rows cold) runs in a store
thread, and the request waits for it until the deadline; past it, the request gets a 503 naming the object while
the work goes on without it. A build still publishes its segment (atomically, as every build does) for a later
request; other work's result is dropped when it ends. Store threads are bounded in number, so a stalled store cannot
pile them up: a request that finds them all busy waits for one within its deadline too. Outside a request (the CLI,
background builds), store work runs in the caller's thread for as long as it takes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from app.sources.files import DatasetPath, is_remote_path
from app.sources.object_store import ObjectStoreError

STORE_THREADS = 32  # per process: well above the reads one process runs at once, below what a stall could exhaust
T = TypeVar("T")
log = logging.getLogger("episerve.store")

StoreDeadline = tuple[float, float]  # (time.monotonic() deadline, the allowance it was set with)
_deadline: contextvars.ContextVar[StoreDeadline | None] = contextvars.ContextVar(
    "episerve_store_deadline", default=None
)
_slots = threading.BoundedSemaphore(STORE_THREADS)


@contextlib.contextmanager
def store_deadline(seconds: float) -> Iterator[None]:
    """Within the block, every wait on the store ends `seconds` from now (or by an enclosing block's deadline)."""
    deadline = time.monotonic() + seconds
    enclosing = _deadline.get()
    token = _deadline.set(enclosing if enclosing is not None and enclosing[0] <= deadline else (deadline, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def current_store_deadline() -> StoreDeadline | None:
    """The deadline waits on the store have here, if any (to keep it with work that goes on later)."""
    return _deadline.get()


@contextlib.contextmanager
def kept_store_deadline(deadline: StoreDeadline | None) -> Iterator[None]:
    """Within the block, waits on the store have `deadline` (from `current_store_deadline`) again."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def wait_on_store(what: str, work: Callable[[], T]) -> T:
    """`work()`, which reads `what` (an `s3://` location) from the store: waited for until the current deadline,
    past which `ObjectStoreError` is raised and `work` goes on in its store thread. Without a deadline (outside a
    request, and in store threads, which start with no context), `work` runs right here."""
    bound = _deadline.get()
    if bound is None:
        return work()
    deadline, allowance = bound
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not _slots.acquire(timeout=remaining):
        raise _late(what, allowance)
    done: concurrent.futures.Future[T] = concurrent.futures.Future()
    # Daemon threads, unlike an executor's: a store read abandoned by its request never holds up the process's exit.
    threading.Thread(target=_run, args=(work, done), name="episerve-store", daemon=True).start()
    concurrent.futures.wait([done], timeout=max(0.0, deadline - time.monotonic()))
    if not done.done():
        done.add_done_callback(functools.partial(_report, what))
        raise _late(what, allowance)
    return done.result()


def _run(work: Callable[[], T], done: concurrent.futures.Future[T]) -> None:
    try:
        done.set_result(work())
    except BaseException as exc:
        done.set_exception(exc)
    finally:
        _slots.release()


def _report(what: str, done: concurrent.futures.Future[T]) -> None:
    """How work a request stopped waiting for ended (no request reports it)."""
    failure = done.exception()
    if failure is not None:
        log.warning("reading %s failed after its request stopped waiting: %s", what, failure)


def _late(what: str, allowance: float) -> ObjectStoreError:
    return ObjectStoreError(
        f"cannot read {what}: the object store did not answer within {allowance:g} s "
        "(the read goes on in the background; retry)"
    )


def on_store(root: DatasetPath, rel: str | None, work: Callable[[], T]) -> T:
    """`work()`, which reads the file `rel` of the dataset at `root` (None: its metadata and files): for a dataset
    in an object store, waited for only until the request's deadline (`wait_on_store`); else simply run."""
    if not is_remote_path(root):
        return work()
    return wait_on_store(str(root if rel is None else root / rel), work)

"""Reading ahead: the results of a sequence of loads, each computed on a background thread up to `depth` loads
before it is consumed, so a loader's next request travels while its last answer is used."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
W = TypeVar("W")


def prefetched(load: Callable[[W], T], work: Iterable[W], depth: int) -> Iterator[T]:
    """`load` of each piece of `work`, in order, run up to `depth` pieces ahead on a background thread (in this
    thread, one at a time, when `depth` is 0). A load's exception is raised where its result would have been
    yielded; closing the iterator early stops the thread after the load it is in."""
    if depth <= 0:
        yield from map(load, work)
        return
    ready: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stopped = threading.Event()

    def put(item: tuple[str, Any]) -> None:
        while not stopped.is_set():
            try:
                ready.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def produce() -> None:
        try:
            for piece in work:
                if stopped.is_set():
                    return
                put(("result", load(piece)))
            put(("end", None))
        except BaseException as exc:  # handed to the consuming thread, which raises it
            put(("error", exc))

    thread = threading.Thread(target=produce, name="episerve-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = ready.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stopped.set()

"""The process-wide budget of response bytes in flight (`EPISERVE_MAX_INFLIGHT_BYTES`).

Every row answer holds a `Hold` on the budget from before its rows are read until its last byte is handed to the
transport: the piece of rows it has computed and not sent yet, plus what the transport may buffer of one send.
A read that finds the budget spent waits (first come, first served) until answers in flight release theirs; a
client that stops reading holds at most its piece (and the next, read ahead while the budget was at most half
spent) until the send timeout cuts it off. A single hold larger than
the whole budget is granted once nothing else is held, so no answer waits forever.

A hold counts memory the answer holds, never bytes it sends from elsewhere: rows sent from the segments' maps and
camera frames left pending to be sent from the decoded-frame segments' maps (`app.reads.pending_copies`) take
none, so a client that stops reading a take of thousands of such frames holds one send, not its whole answer.
"""

from __future__ import annotations

import asyncio
from collections import deque

from app import metrics


class InflightBudget:
    """Bytes in flight, at most `limit` at once (a hold over the limit only when it is alone)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    def try_hold(self, size: int) -> Hold | None:
        """A hold of `size` bytes if they are free right now (and nobody waits before), else None."""
        if self._waiting or not self._fits(size):
            return None
        self._take(size)
        return Hold(self, size)

    async def hold(self, size: int) -> Hold:
        """A hold of `size` bytes, once they are free."""
        held = self.try_hold(size)
        if held is not None:
            return held
        await self._wait_for(size)
        return Hold(self, size)

    async def _wait_for(self, size: int) -> None:
        """Wait until `size` bytes are taken for the caller."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, future)
        self._waiting.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self._give(size)  # granted while being cancelled: give it back
            elif entry in self._waiting:
                self._waiting.remove(entry)
                self._grant()
            raise

    def spare(self, size: int) -> bool:
        """Whether `size` more bytes would leave at least half of the budget free, with nobody waiting."""
        return not self._waiting and self.used + size <= self.limit // 2

    def _fits(self, size: int) -> bool:
        return self.used == 0 or self.used + size <= self.limit

    def _take(self, size: int) -> None:
        self.used += size
        metrics.INFLIGHT_BYTES.set(self.used)

    def _give(self, size: int) -> None:
        self.used -= size
        metrics.INFLIGHT_BYTES.set(self.used)
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            size, future = self._waiting.popleft()
            if future.done():
                continue
            self._take(size)
            future.set_result(None)


class Hold:
    """Bytes held on an `InflightBudget`: grown as an answer computes a piece, shrunk as it is sent, released
    when the answer is done (released twice is once)."""

    def __init__(self, budget: InflightBudget, size: int) -> None:
        self.budget, self.size = budget, size
        self.released = False

    async def grow_to(self, size: int) -> None:
        """Hold `size` bytes in all, waiting for the difference when the budget is spent."""
        extra = size - self.size
        if extra <= 0:
            return
        if self.budget.try_hold(extra) is None:
            await self.budget._wait_for(extra)
        self.size = size

    def try_grow_into_spare(self, size: int) -> bool:
        """Hold `size` bytes in all if the difference fits in the spare half of the budget right now (nobody
        waiting, at most half of it held afterwards); whether it is held. For work done ahead of need, such as
        reading the next piece of an answer while one is sent: it never makes another read wait, however many
        clients stop reading."""
        extra = size - self.size
        if extra > 0:
            if not self.budget.spare(extra):
                return False
            self.budget._take(extra)
            self.size = size
        return True

    def set(self, size: int) -> None:
        """Hold `size` bytes in all, now (memory already taken counts even over the limit)."""
        if size > self.size:
            self.budget._take(size - self.size)
        elif size < self.size:
            self.budget._give(self.size - size)
        self.size = size

    def settle(self, size: int) -> None:
        """`set(size)`, unless the hold is released: for work that may finish after its answer has ended (a piece
        read ahead), whose bytes nobody holds any more."""
        if not self.released:
            self.set(size)

    def release(self) -> None:
        self.set(0)
        self.released = True

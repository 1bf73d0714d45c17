"""Takes of several datasets in one request (`POST /takes`): a mixture's batch, read as one request instead of one
per dataset.

Each take is an ordinary `TakeRead` of its dataset, with the same limits, decisions and answers. `TakesRead`
adds what concerns the request as a whole: the indices of all its takes count against one `max_take_indices`,
and a problem with any take names the take (`takes[i]`, its dataset). Every take is checked before any is
answered, so a bad take is an error status, never a stream cut short.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from app.errors import OverLimit, ProblemError, TryLater
from app.reads.catalog import Catalog
from app.reads.requests import DatasetTake, TakesRequest
from app.reads.service import TakeRead
from app.settings import Settings


class TakesRead:
    """The takes of one `POST /takes` request, in order: `reads[i]` is `takes[i]`'s read."""

    def __init__(self, catalog: Catalog, request: TakesRequest, settings: Settings) -> None:
        limit = settings.max_take_indices
        if request.indices > limit:
            raise OverLimit(
                f"{request.indices} indices asked by {len(request.takes)} takes; the limit is {limit} per request",
                limit,
            )
        self.takes = request.takes
        self.inline_read_bytes = settings.inline_read_bytes
        self.max_frame_bytes = settings.max_frame_bytes
        self.reads: list[TakeRead] = []
        for number, take in enumerate(request.takes):
            with naming(number, take):
                self.reads.append(TakeRead(catalog.get(take.dataset), take))

    def quick(self) -> bool:
        """Whether every take can be answered right away from what this process has mapped (see
        `RowRead.quick`), copying no more than `inline_read_bytes` in all (as one take may); decided for each take
        until one cannot."""
        copied = 0
        for number, (take, read) in enumerate(zip(self.takes, self.reads, strict=True)):
            with naming(number, take):
                if not read.quick():
                    return False
            copied += read.inline_bytes
            if copied > self.inline_read_bytes:
                return False
        self._check_frame_bytes()
        return True

    def check(self) -> None:
        """Raise the first take's problem, if any, before any is answered (loading indexes: it may block); then make
        sure the data and video files every take is read from can be opened, all at once (a Hub dataset fetches
        those not there yet: the first take's 503 is raised once every take's fetches are under way)."""
        for number, (take, read) in enumerate(zip(self.takes, self.reads, strict=True)):
            with naming(number, take):
                read.check()
        self._check_frame_bytes()
        waiting: list[TryLater] = []
        for number, (take, read) in enumerate(zip(self.takes, self.reads, strict=True)):
            try:
                with naming(number, take):
                    read.files_at_hand()
            except TryLater as exc:
                waiting.append(exc)
        if waiting:
            raise waiting[0]

    def _check_frame_bytes(self) -> None:
        """A 413 when the takes' camera frames together hold more than `max_frame_bytes`: the limit bounds an
        answer, and a thousand takes each within it are not."""
        frame_bytes = sum(read.frame_bytes for read in self.reads)
        if frame_bytes > self.max_frame_bytes:
            raise OverLimit(
                f"the {len(self.reads)} takes' camera frames are {frame_bytes} bytes decoded; the limit is "
                f"{self.max_frame_bytes} bytes per response (EPISERVE_MAX_FRAME_BYTES)",
                self.max_frame_bytes,
            )

    def view_rows(self) -> list[int]:
        """Rows in each take's view (after `quick` or `check`)."""
        return [read.view_rows for read in self.reads]


@contextmanager
def naming(number: int, take: DatasetTake) -> Iterator[None]:
    """A problem raised inside, with the take it concerns named first in its detail."""
    try:
        yield
    except ProblemError as exc:
        # Named in place: a copy would rebuild the problem from its detail alone, which `OverLimit` (its limit)
        # and other problems with more arguments cannot be.
        exc.detail = f"takes[{number}] (dataset {take.dataset!r}): {exc.detail}"
        exc.args = (exc.detail,)
        raise

"""Retry policy: which failures are retried, and how long to wait, bounded in attempts and in total time."""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

RETRY_STATUSES = frozenset({429, 502, 503, 504})
PROGRESS_HEADER = "x-download-progress"  # `<bytes done>/<bytes>` of a download the server answers 503 for


@dataclass(frozen=True)
class Retries:
    """How hard the client tries before giving up.

    A request is tried at most `attempts` times in all, and never started after `deadline` seconds have passed
    since the first try. Between tries the client sleeps `backoff * 2**n` seconds (capped at `max_backoff`), with
    jitter, or what the server's `Retry-After` asks for when that fits in the deadline.
    Connection errors and 429/502/503/504 are retried; every other error is raised at once, and so is a 503 whose
    problem says `"transient": false` (a dataset or mixture file the operator must fix first).

    Until the server has answered a client once, refused or failed connections are retried for
    `first_contact_deadline` seconds only: a wrong URL or a server that is not running fails fast, while a server
    that was up and went away (a restart during training) gets the whole `deadline`.

    A 503 that reports a download under way (the files of a Hub dataset a read needs: `X-Download-Progress`) is
    waited out however long it takes, as long as it moves: such answers use up no attempts, and each one whose
    download moved (fewer bytes left, or other files) starts the deadline afresh, so only a download that does not
    move for `deadline` seconds gives up.
    """

    attempts: int = 10
    backoff: float = 0.2
    max_backoff: float = 5.0
    deadline: float = 60.0
    first_contact_deadline: float = 3.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if min(self.backoff, self.max_backoff, self.deadline, self.first_contact_deadline) < 0:
            raise ValueError("backoff, max_backoff and the deadlines must be non-negative")

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to sleep before retry number `retry` (0-based)."""
        if retry_after is not None:
            return retry_after
        # Jitter in [0.5, 1] of the exponential step: spreads many workers apart without wasting attempts on
        # near-zero waits while a server restarts.
        step = min(self.max_backoff, self.backoff * 2**retry)
        return step * random.uniform(0.5, 1.0)


class RetryBudget:
    """The remaining attempts and time of one logical request."""

    def __init__(self, policy: Retries) -> None:
        self.policy = policy
        self.started = time.monotonic()
        self.attempt = 0
        self._least_left: dict[int, int] = {}  # bytes of the files a download 503 waits for -> the fewest left

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def next_wait(
        self, retry_after: float | None = None, *, deadline: float | None = None, progress: str | None = None
    ) -> float | None:
        """Seconds to wait before the next attempt, or None when the budget is spent (the caller then raises).

        `deadline` shortens the policy's deadline for this decision (never lengthens it). `progress`: the download
        progress a 503 reported (uses up no attempt; the deadline runs from the last time it moved).
        """
        if progress is None:
            self.attempt += 1
            if self.attempt >= self.policy.attempts:
                return None
        elif self._moved(progress):
            self.started = time.monotonic()
        wait = self.policy.delay(max(0, self.attempt - 1), retry_after)
        if self.elapsed + wait > self.deadline(deadline):
            return None
        return wait

    def _moved(self, progress: str) -> bool:
        """Whether a download's progress (`<bytes done>/<bytes>`) moved: files of another size in all than before
        (the download went on to other files, or some are done), or fewer bytes left of the same ones than at any
        answer before (answers may come from several server workers, each with its own view of one download)."""
        try:
            done, total = (int(part) for part in progress.split("/"))
        except ValueError:
            return False
        least = self._least_left.get(total)
        if least is not None and total - done >= least:
            return False
        self._least_left[total] = total - done
        return True

    def deadline(self, shorter: float | None = None) -> float:
        """The deadline in force: the policy's, or `shorter` when that is less."""
        return self.policy.deadline if shorter is None else min(shorter, self.policy.deadline)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or HTTP date); None when absent or unparsable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())

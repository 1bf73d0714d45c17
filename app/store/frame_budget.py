"""The disk budget of decoded-frame segments (`EPISERVE_VIDEO_CACHE_BYTES`), shared by every dataset, worker and
process using one cache directory; and, kept apart, the budget of the hot pixel segments over encoded tiers
(`EPISERVE_VIDEO_HOT_BYTES`): each budget lists and evicts the segments of its own store directory only.

A segment's last use is its sidecar's modification time, touched by the reads that use it (at most once a second
per segment and process), so every process sees one least-recently-used order. Before a new segment is built, the
least recently used others are evicted until it fits: each under its own segment lock (one being built is never
touched), sidecar first, so a half-evicted segment is never served. A process that still has an evicted segment
mapped reads its complete, unlinked file until it notices (its next touch) and lets it go.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from app.store.mapped_segments import SegmentLRU

TOUCH_INTERVAL_S = 1.0
log = logging.getLogger("episerve.cache")


@dataclass(frozen=True)
class _Resident:
    sidecar: Path
    arrow: Path
    nbytes: int
    used_at: float


class FrameBudget:
    """Keeps the segments under `datasets_dir/*/<store>/` (every dataset's decoded-frame segments, or their hot
    pixel segments) within `limit` bytes (None: no limit)."""

    def __init__(
        self, datasets_dir: Path, limit: int | None, lru: SegmentLRU, store: str = "frames", min_idle_s: float = 0.0
    ) -> None:
        self.datasets_dir = datasets_dir
        self.limit = limit
        self.lru = lru
        self.store = store
        self.min_idle_s = min_idle_s  # segments used more recently are never evicted for a new one
        self.evicted = 0  # segments this process evicted (for tests and status)
        self._touched: dict[Path, float] = {}
        self._lock = threading.Lock()

    def admit(self, arrow: Path, nbytes: int) -> bool:
        """Make room for a new segment of about `nbytes` at `arrow`; False if it can never fit the budget, or only by
        evicting segments used within `min_idle_s` (then nothing is evicted)."""
        if self.limit is None:
            return True
        if nbytes > self.limit:
            log.info("%s of %s (%.1f MB) exceed their budget", self.store, arrow.name, nbytes / 1e6)
            return False
        self.datasets_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(self.datasets_dir / self._lock_name):
            residents = sorted(self._residents(exclude=arrow), key=lambda r: r.used_at)
            used = sum(r.nbytes for r in residents)
            idle_before = time.time() - self.min_idle_s if self.min_idle_s else float("inf")
            evictable = [r for r in residents if r.used_at <= idle_before]
            if used - sum(r.nbytes for r in evictable) + nbytes > self.limit:
                log.debug("%s of %s not admitted: the budget is held by segments in use", self.store, arrow.name)
                return False
            for victim in evictable:
                if used + nbytes <= self.limit:
                    break
                if self._evict(victim):
                    used -= victim.nbytes
        return True

    @property
    def _lock_name(self) -> str:
        return "frame-budget.lock" if self.store == "frames" else f"{self.store}-budget.lock"

    def touch(self, arrow: Path) -> bool:
        """Record a use of the segment at `arrow`; False if it has been evicted (then drop it from the open maps,
        so its disk space is freed once this read is done with it)."""
        if self.limit is None:
            return True
        now = time.monotonic()
        with self._lock:
            if now - self._touched.get(arrow, -TOUCH_INTERVAL_S) < TOUCH_INTERVAL_S:
                return True
            self._touched[arrow] = now
        try:
            os.utime(arrow.with_suffix(".json"))
        except FileNotFoundError:
            self.lru.discard(str(arrow))
            return False
        return True

    def _residents(self, exclude: Path | None) -> list[_Resident]:
        residents = []
        for sidecar in self.datasets_dir.glob(f"*/{self.store}/*.json"):
            arrow = sidecar.with_suffix(".arrow")
            if arrow == exclude:
                continue
            try:
                residents.append(_Resident(sidecar, arrow, arrow.stat().st_size, sidecar.stat().st_mtime))
            except FileNotFoundError:
                continue  # being published or evicted right now
        return residents

    def _evict(self, victim: _Resident) -> bool:
        try:
            with FileLock(victim.arrow.with_suffix(".lock"), timeout=0):
                victim.sidecar.unlink(missing_ok=True)
                victim.arrow.unlink(missing_ok=True)
        except Timeout:
            return False  # being built: not ours to take
        self.lru.discard(str(victim.arrow))
        self.evicted += 1
        log.info("evicted %s %s (%.1f MB): over budget", self.store, victim.arrow.name, victim.nbytes / 1e6)
        return True

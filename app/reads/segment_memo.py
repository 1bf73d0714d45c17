"""What reads derive from a segment's maps (pixel views, presentation times, located columns), remembered for as
long as the segment stays open: the store holds the data, reads keep what they compute from it here."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from app.store.mapped_segments import Segment

V = TypeVar("V")
_KEPT_PER_SEGMENT = 16  # derived values kept per segment (selections of columns, mostly)
_MEMO: weakref.WeakKeyDictionary[Segment, dict[Hashable, Any]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def remembered(segment: Segment, key: Hashable, compute: Callable[[], V]) -> V:
    """What `compute` derives from `segment`, remembered under `key` while the segment lives."""
    with _LOCK:
        values = _MEMO.setdefault(segment, {})
        if key in values:
            return values[key]
    value = compute()
    with _LOCK:
        if len(values) >= _KEPT_PER_SEGMENT:
            values.pop(next(iter(values)))
        values[key] = value
    return value

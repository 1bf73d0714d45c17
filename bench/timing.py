"""Small timing helpers: medians, percentiles, and a monotonic stopwatch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

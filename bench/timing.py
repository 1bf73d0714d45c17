"""Small timing helpers: medians, percentiles, rounds of interleaved measurements, and a stopwatch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


Key = TypeVar("Key")
Figures = dict[str, float]  # one measurement: figure name -> value


def in_rounds(measure: Callable[[Key], Figures], keys: Sequence[Key], rounds: int) -> dict[Key, list[Figures]]:
    """Measure every key `rounds` times, round by round; each round starts one key later, so no peer always runs
    first or always right after the same other one. Per key, the measurements in round order."""
    seen: dict[Key, list[Figures]] = {key: [] for key in keys}
    for round_number in range(rounds):
        shift = round_number % len(keys)
        for key in [*keys[shift:], *keys[:shift]]:
            seen[key].append(measure(key))
    return seen


def medians(measurements: Sequence[Figures]) -> Figures:
    """The median of every figure over rounds."""
    return {name: median([m[name] for m in measurements]) for name in measurements[0]}


def ratio_spread(ours: Sequence[Figures], peer: Sequence[Figures], name: str) -> str:
    """`rounds a-b` of the per-round ratios ours ÷ peer, for a table note; empty for a single round."""
    if len(ours) < 2:
        return ""
    ratios = [o[name] / p[name] for o, p in zip(ours, peer, strict=True) if p[name]]
    return f"rounds {min(ratios):.2f}-{max(ratios):.2f}x"


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

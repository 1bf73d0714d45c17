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
    first. Every measurement starts on a quiet machine (`wait_for_quiet`). Per key, the measurements in round
    order."""
    seen: dict[Key, list[Figures]] = {key: [] for key in keys}
    for round_number in range(rounds):
        shift = round_number % len(keys)
        for key in [*keys[shift:], *keys[:shift]]:
            wait_for_quiet()
            seen[key].append(measure(key))
    return seen


def wait_for_quiet(idle_share: float = 0.9, window_s: float = 0.2, max_wait_s: float = 5.0) -> float:
    """Wait until the CPUs were at least `idle_share` idle over a `window_s` window (at most `max_wait_s`), so
    work left over from the previous measurement does not land in the next one: a server still decoding the
    batches a loader's workers asked for before they were shut down (~0.4 s of CPU for a 480x640 batch on
    demand), or workers exiting. Returns the seconds waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_wait_s:
        before = _cpu_times()
        time.sleep(window_s)
        after = _cpu_times()
        if before is None or after is None:
            break  # no /proc/stat: the pause alone
        busy, idle = (after[0] - before[0]), (after[1] - before[1])
        if busy + idle > 0 and idle / (busy + idle) >= idle_share:
            break
    return time.perf_counter() - started


def _cpu_times() -> tuple[int, int] | None:
    """(busy, idle) jiffies of all CPUs since boot, from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return sum(fields[:8]) - idle, idle


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

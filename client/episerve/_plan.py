"""The plan of a mixture: which component, and which of its rows, fills each position of an epoch.

An epoch of a mixture is a sequence of `epoch_size` sample positions. `MixturePlan.locate(epoch, positions)` maps
positions to `(component, row)` as a pure function of (quotas, component sizes, seed, epoch, position): nothing
the size of the epoch is materialised and no earlier position is replayed, so every rank and DataLoader worker
computes its own positions alone, and a run resumes at position 10^8 as fast as at 0.

Two guarantees, kept by the two halves of this module:

**Weights hold in every prefix.** Weights become integer quotas `a_k` with `D = sum(a_k)` (`quotas()`); component
`k`'s share is `w_k = a_k / D`. For every prefix of `n` positions of an epoch, component `k` fills
`floor(n w_k) <= N_k(n) <= ceil(n w_k)` of them, so `|N_k(n) - n w_k| < 1`.

Proof. Give the `j`-th draw of component `k` (from 0) the window of positions `[r, d]` with release
`r = floor(j / w_k)` and deadline `d = ceil((j + 1) / w_k) - 1`. (1) If every draw lands inside its window, the bound
holds: draw `floor(n w_k) - 1` has deadline `ceil(floor(n w_k) / w_k) - 1 <= n - 1`, so it lies in the prefix,
hence `N_k(n) >= floor(n w_k)`; draw `ceil(n w_k)` has release `floor(ceil(n w_k) / w_k) >= n`, so it lies after
the prefix, hence `N_k(n) <= ceil(n w_k)`. (2) Such a placement exists: the draws of `k` whose windows lie inside
positions `[s, e]` number at most `floor((e + 1) w_k) - ceil(s w_k) <= (e - s + 1) w_k`, so all components
together need at most `e - s + 1` of those `e - s + 1` positions; windows are intervals, and for unit jobs with
interval windows this (Hall's condition on intervals) is enough for every job to get a position of its own
(Glover's theorem for convex bipartite graphs). (3) Earliest-deadline-first finds it: at each position, among the
components whose next draw is released, take the one whose next draw's deadline is earliest. For convex bipartite
graphs this greedy builds a perfect matching whenever one exists (Glover), and a released draw always exists:
by position `p`, `sum_k ceil((p + 1) w_k) >= p + 1` draws are released and only `p` were placed. Taking each
component's draws in order loses nothing, since consecutive draws' releases and deadlines never decrease.
(4) At `n = D` every component has exactly `a_k` draws (both bounds equal `a_k`) and every window shifts by `D`
positions per `a_k` draws, so the schedule repeats with period `D`. One period is computed once (`D <= 65,536`
positions, ~0.1 s) and stored as two small arrays; position `p` is `(p // D, p % D)` in it. Quota methods are
inherently sequential (no divisor method keeps quota, Balinski and Young), which is why one period is computed
rather than a closed form evaluated.

Which component wins a tie of deadlines is decided by a seeded order of the components, so the interleaving
depends on the seed.

**Rows without replacement per pass.** Component `k`'s draws are numbered across epochs: its `i`-th draw of epoch
`e` is its draw `g = e * E_k + i`, `E_k` being its draws per epoch. Draw `g` is row `permute(g mod size_k)` of pass
`g // size_k`, where `permute` is a bijection of `[0, size_k)` seeded by (seed, component, pass): four keyed rounds
of invertible steps on `b`-bit words (add, multiply by an odd number, xor-shift; `2^b` the smallest power of two
at least `size_k`), walked until it lands inside `[0, size_k)`. So a
component smaller than its share cycles through fresh shuffles; a larger one is subsampled, each epoch continuing
where the last one stopped (every row is drawn once before any is drawn twice).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import numpy as np

PERIOD = 65_536  # positions of one period of the component schedule when the weights need rounding
_ROUNDS = 4


def quotas(weights: Sequence[float]) -> tuple[int, ...]:
    """Integer quotas per period for `weights`: exact when the weights are proportional to integers summing to at
    most `PERIOD` (floats within 1e-12 of a fraction with a denominator up to `PERIOD` count as that fraction:
    0.1 is 1/10), else the largest-remainder rounding of the shares to `PERIOD` positions (each at least 1).

    Reduced by their greatest common divisor, so equal weights make a period of one position per component.
    """
    if not weights:
        raise ValueError("a mixture needs at least one component")
    if any(not math.isfinite(w) or w <= 0 for w in weights):
        raise ValueError(f"weights must be positive and finite, got {list(weights)}")
    fractions = [Fraction(w).limit_denominator(PERIOD) for w in weights]
    common = math.lcm(*(f.denominator for f in fractions))
    exact = [int(f * common) for f in fractions]
    close = all(abs(w - a / common) <= 1e-12 * w for w, a in zip(weights, exact, strict=True))
    if close and sum(exact) <= PERIOD:
        result = exact
    else:
        if len(weights) > PERIOD:
            raise ValueError(f"a mixture has at most {PERIOD} components")
        total = math.fsum(weights)
        ideal = [w / total * PERIOD for w in weights]
        result = [max(1, int(x)) for x in ideal]
        by_remainder = sorted(range(len(weights)), key=lambda k: result[k] - ideal[k])
        for k in by_remainder[: max(0, PERIOD - sum(result))]:
            result[k] += 1
        while sum(result) > PERIOD:  # components raised to 1 took positions from the largest ones
            result[result.index(max(result))] -= 1
    divisor = math.gcd(*result)
    return tuple(a // divisor for a in result)


class Schedule(NamedTuple):
    """One period of the component sequence: the component at each position and how many earlier positions of
    the period hold the same component."""

    component: np.ndarray  # (D,) uint16/uint32
    rank: np.ndarray  # (D,) int64


@functools.lru_cache(maxsize=16)
def schedule(quota: tuple[int, ...], seed: int) -> Schedule:
    """The earliest-deadline-first period for `quota` (see the module docstring), ties broken by a seeded order."""
    import heapq

    period = sum(quota)
    priority = np.random.default_rng([seed, 0x5C4ED]).permutation(len(quota)).tolist()
    drawn = [0] * len(quota)
    ready: list[tuple[int, int, int]] = []  # (deadline, priority, component) of released next draws
    waiting: list[tuple[int, int, int]] = []  # (release, priority, component)
    for k, a in enumerate(quota):
        heapq.heappush(ready, (-(-period // a) - 1, priority[k], k))  # draw 0: release 0
    component = [0] * period
    rank = [0] * period
    push, pop = heapq.heappush, heapq.heappop
    for position in range(period):
        while waiting and waiting[0][0] <= position:
            _, order, k = pop(waiting)
            push(ready, (-(-(drawn[k] + 1) * period // quota[k]) - 1, order, k))
        deadline, order, k = pop(ready)
        if deadline < position:  # impossible by the proof above; a guard against a broken invariant
            raise AssertionError(f"component {k} missed its deadline {deadline} at position {position}")
        component[position] = k
        j = drawn[k]
        rank[position] = j
        drawn[k] = j = j + 1
        a = quota[k]
        if j < a:
            release = j * period // a
            if release <= position + 1:
                push(ready, (-(-(j + 1) * period // a) - 1, order, k))
            else:
                push(waiting, (release, order, k))
    kind = np.uint16 if len(quota) <= 65_535 else np.uint32
    return Schedule(np.asarray(component, dtype=kind), np.asarray(rank, dtype=np.int64))


@dataclass(frozen=True)
class MixturePlan:
    """Which `(component, row)` fills each position of each epoch of a mixture (see the module docstring).

    `quota` are the components' integer quotas per period, `sizes` their row counts, `epoch_size` the positions
    per epoch. Building one costs one period of the schedule (cached per process); `locate` is O(1) per position.
    """

    quota: tuple[int, ...]
    sizes: tuple[int, ...]
    seed: int
    epoch_size: int

    def __post_init__(self) -> None:
        if len(self.quota) != len(self.sizes):
            raise ValueError("one quota per component")
        if any(size < 1 for size in self.sizes):
            raise ValueError(f"every component needs at least one row, got sizes {list(self.sizes)}")
        if self.epoch_size < 0:
            raise ValueError("epoch_size must be non-negative")

    @property
    def period(self) -> int:
        return sum(self.quota)

    def counts(self, positions: np.ndarray | int) -> np.ndarray:
        """`N_k(n)` for each prefix length `n` in `positions`: how many of the first `n` positions of an epoch
        each component fills, as an array `(len(positions), K)` (or `(K,)` for one int)."""
        n = np.asarray(positions, dtype=np.int64)
        cycles, within = np.divmod(n, self.period)
        table = self._prefix_counts()
        return cycles[..., None] * np.asarray(self.quota, dtype=np.int64) + table[within]

    def draws_per_epoch(self) -> np.ndarray:
        """How many rows each component delivers in one epoch."""
        return self.counts(self.epoch_size)

    def components(self, positions: np.ndarray) -> np.ndarray:
        """The component at each position (of any epoch: the component sequence is the same in every epoch)."""
        period = schedule(self.quota, self.seed)
        return period.component[np.asarray(positions, dtype=np.int64) % self.period].astype(np.int64)

    def locate(self, epoch: int, positions: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """`(component, row)` arrays for `positions` of `epoch`; rows are positions in the component's view."""
        wanted = np.asarray(positions, dtype=np.int64).reshape(-1)
        if len(wanted) and (wanted.min() < 0 or wanted.max() >= self.epoch_size):
            raise IndexError(f"positions must lie in [0, {self.epoch_size}) for an epoch of that many positions")
        if epoch < 0:
            raise ValueError("epoch must be non-negative")
        period = schedule(self.quota, self.seed)
        cycles, within = np.divmod(wanted, self.period)
        component = period.component[within].astype(np.int64)
        quota = np.asarray(self.quota, dtype=np.int64)
        draw = cycles * quota[component] + period.rank[within]
        draw += epoch * self.draws_per_epoch()[component]
        sizes = np.asarray(self.sizes, dtype=np.int64)
        passes, index = np.divmod(draw, sizes[component])
        keys = _keys(self.seed, component, passes)
        return component, _permute(index, sizes[component], keys)

    def _prefix_counts(self) -> np.ndarray:
        """`(D + 1, K)`: per prefix of the period, how many positions each component holds."""
        return _prefix_counts(self.quota, self.seed)


@functools.lru_cache(maxsize=16)
def _prefix_counts(quota: tuple[int, ...], seed: int) -> np.ndarray:
    period = schedule(quota, seed)
    table = np.zeros((len(period.component) + 1, len(quota)), dtype=np.int64)
    if len(quota) <= 64:  # small K: one cumulative sum per component
        for k in range(len(quota)):
            table[1:, k] = np.cumsum(period.component == k)
    else:
        table[np.arange(1, len(period.component) + 1), period.component.astype(np.int64)] = 1
        np.cumsum(table, axis=0, out=table)
    return table


def permutation(size: int, seed: int, component: int = 0, pass_: int = 0) -> np.ndarray:
    """The whole seeded bijection of `[0, size)` for one pass of one component (for tests and small sizes)."""
    index = np.arange(size, dtype=np.int64)
    keys = _keys(seed, np.full(size, component), np.full(size, pass_))
    return _permute(index, np.full(size, size, dtype=np.int64), keys)


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective scramble of 64-bit words (numpy's array arithmetic wraps)."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _keys(seed: int, component: np.ndarray, passes: np.ndarray) -> np.ndarray:
    """One 64-bit key per element, from (seed, component, pass)."""
    base = _mix(np.asarray([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    key = _mix(base ^ np.asarray(component, dtype=np.int64).astype(np.uint64))
    return _mix(key ^ np.asarray(passes, dtype=np.int64).astype(np.uint64))


def _permute(index: np.ndarray, size: np.ndarray, key: np.ndarray) -> np.ndarray:
    """`index` through the keyed bijection of `[0, size)` (all arrays of one length), by cycle walking: a value
    the bijection of `[0, 2^b)` (`2^b` the smallest power of two at least `size`) sends outside `[0, size)` goes
    through it again until it lands inside. Since `2^b < 2 size`, a walk takes fewer than two steps on average,
    and it ends: the cycle through a value in range comes back to the range."""
    values = np.asarray(index, dtype=np.int64).astype(np.uint64)
    if len(values) == 0:
        return values.astype(np.int64)
    limit = np.asarray(size, dtype=np.int64).astype(np.uint64)
    bits = np.maximum(1, np.ceil(np.log2(np.maximum(size, 2))).astype(np.int64)).astype(np.uint64)
    rounds = _Rounds.of(bits, key)  # once per call, not once per step of the walk
    todo = np.arange(len(values))
    values = rounds.apply(values, slice(None))
    todo = todo[values >= limit]
    while len(todo):
        values[todo] = rounds.apply(values[todo], todo)
        todo = todo[values[todo] >= limit[todo]]
    return values.astype(np.int64)


@dataclass(frozen=True)
class _Rounds:
    """A keyed bijection of `b`-bit words, one per element: rounds of adding a key, multiplying by an odd key and
    xor-shifting the high half onto the low one, each step invertible modulo `2^b`."""

    mask: np.ndarray
    shift: np.ndarray
    keys: tuple[np.ndarray, ...]  # the round keys
    odd: tuple[np.ndarray, ...]  # the round keys made odd (multipliers)

    @classmethod
    def of(cls, bits: np.ndarray, key: np.ndarray) -> _Rounds:
        keys = tuple(_mix(key + np.uint64(round_)) for round_ in range(_ROUNDS))
        mask = (np.uint64(1) << bits) - np.uint64(1)
        return cls(mask, (bits + np.uint64(1)) // np.uint64(2), keys, tuple(k | np.uint64(1) for k in keys))

    def apply(self, values: np.ndarray, where: slice | np.ndarray) -> np.ndarray:
        """The bijection of the elements `where` applied to `values` (theirs)."""
        mask, shift = self.mask[where], self.shift[where]
        for key, odd in zip(self.keys, self.odd, strict=True):
            values = (values + key[where]) & mask
            values = (values * odd[where]) & mask
            values = values ^ (values >> shift)
        return values

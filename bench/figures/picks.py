"""Episode picks shared by the cold-cache figures: seeded, distinct, and written as episode specs."""

from __future__ import annotations

import numpy as np


def pick(episodes: int, fraction: float, seed: int) -> list[int]:
    """`fraction` of the episode ids, drawn without replacement, ascending."""
    count = max(1, round(episodes * fraction))
    return sorted(np.random.default_rng(seed).choice(episodes, size=count, replace=False).tolist())


def spec(ids: list[int]) -> str:
    """Ids as an episode spec with ranges: [0, 1, 2, 5] -> '0-2,5'."""
    parts, run_start, previous = [], None, None
    for i in [*ids, None]:
        if run_start is not None and (i is None or i != previous + 1):
            parts.append(str(run_start) if run_start == previous else f"{run_start}-{previous}")
            run_start = None
        if i is not None and run_start is None:
            run_start = i
        previous = i
    return ",".join(parts)


def view_rows(lengths: list[int], ids: list[int]) -> int:
    """Rows in the view of `ids`."""
    return sum(lengths[i] for i in ids)


def cold_pick(lengths: list[int], fraction: float, batch_size: int, seed: int) -> tuple[list[int], list[int]]:
    """A cold-start pick (P8, P11): a `fraction` of the episodes (seeded by `seed`), and the view rows of its first
    batch, `batch_size` rows drawn without replacement (seeded by `seed + 1`)."""
    ids = pick(len(lengths), fraction, seed=seed)
    total = view_rows(lengths, ids)
    batch = np.random.default_rng(seed + 1).choice(total, size=min(batch_size, total), replace=False)
    return ids, batch.tolist()

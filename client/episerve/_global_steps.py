"""Ranks, workers and batches as views of one sequence of positions.

Global step `s` of a run that starts at position `start` covers positions `[start + s G, start + (s + 1) G)` of the
epoch, `G = batch_size * world_size`; rank `r` takes the `r`-th of `world_size` consecutive equal parts of it
(`[.. + r B, .. + (r + 1) B)`). The last step of an epoch may be short: it is split as evenly as it goes (parts
differ by at most one position), or left out with `drop_last`. A rank's DataLoader workers take its steps in turn
(worker `w` of `W` takes steps `w, w + W, ...`), which is the order torch's DataLoader hands them out in. So after
`n` steps every rank has delivered exactly the positions `[start, start + n G)` between them, whatever the world
size, worker count or per-rank batch, and the position `start + n G` is all a resumed run needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GlobalSteps:
    """The steps of one run through the rest of an epoch of `epoch_size` positions, from `start`."""

    epoch_size: int
    start: int
    batch_size: int
    world_size: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.world_size < 1:
            raise ValueError("world_size must be at least 1")
        if not 0 <= self.start <= self.epoch_size:
            raise ValueError(f"start {self.start} is outside an epoch of {self.epoch_size} positions")

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def num_steps(self) -> int:
        full, rest = divmod(self.epoch_size - self.start, self.global_batch)
        return full + (1 if rest and not self.drop_last else 0)

    def span(self, step: int, rank: int) -> tuple[int, int]:
        """Positions `[low, high)` of `rank` at `step`."""
        first = self.start + step * self.global_batch
        size = min(self.global_batch, self.epoch_size - first)
        return first + rank * size // self.world_size, first + (rank + 1) * size // self.world_size

    def position_after(self, steps: int) -> int:
        """The first position not delivered once `steps` steps were (at the epoch's end: its size)."""
        if steps < 0:
            raise ValueError("steps must be non-negative")
        return min(self.epoch_size, self.start + steps * self.global_batch)


def resume_state(version: str, seed: int, epoch: int, position: int) -> dict[str, Any]:
    """The state a mixture run resumes from: nothing about the ranks, workers or batches that made it."""
    return {"mixture": version, "seed": seed, "epoch": epoch, "position": position}


def check_state(state: dict[str, Any], version: str, seed: int, epoch_size: int) -> tuple[int, int]:
    """`(epoch, position)` of a saved state, after checking it belongs to this mixture and seed."""
    problems = []
    if state.get("mixture") != version:
        problems.append(f"mixture version: saved {state.get('mixture')!r}, now {version!r} (a component changed?)")
    if state.get("seed") != seed:
        problems.append(f"seed: saved {state.get('seed')!r}, now {seed!r}")
    position = int(state.get("position", -1))
    if not 0 <= position <= epoch_size:
        problems.append(f"position {position} is outside an epoch of {epoch_size} positions")
    if problems:
        raise ValueError("the state was saved for another plan; " + "; ".join(problems))
    return int(state["epoch"]), position

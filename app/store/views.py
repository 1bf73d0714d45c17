"""Views: a dataset restricted to a set of episodes, numbered 0..N-1.

Rows of a view are in ascending episode order, then stored frame order, whatever order the caller listed the
episodes in. A view is a list of runs (source file, row range) with cumulative offsets; it costs no disk, and
mapping view rows to stored rows is a binary search.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from app.store.episode_index import EpisodeIndex


@dataclass(frozen=True)
class EpisodeView:
    """Runs of stored rows in view order; `offsets[i]` is the view row where run i starts."""

    episodes: np.ndarray
    episode_offsets: np.ndarray  # view row where each selected episode starts, plus the total at the end
    run_file: np.ndarray
    run_start: np.ndarray
    run_stop: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @classmethod
    def of(cls, index: EpisodeIndex, episodes: np.ndarray | None = None) -> EpisodeView:
        """The view of `episodes` (sorted, existing ids), or of the whole dataset when None."""
        lengths = index.episode_lengths
        if episodes is None:
            episodes = index.episodes
            runs = np.arange(len(index.run_file))
        else:
            positions = np.searchsorted(index.episodes, episodes)
            lengths = lengths[positions]
            first = index.episode_offsets[positions]
            counts = index.episode_offsets[positions + 1] - first
            runs = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
        files, starts, stops = _coalesce(index.run_file[runs], index.run_start[runs], index.run_stop[runs])
        offsets = np.zeros(len(files) + 1, dtype=np.int64)
        np.cumsum(stops - starts, out=offsets[1:])
        episode_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=episode_offsets[1:])
        return cls(np.asarray(episodes, dtype=np.int64), episode_offsets, files, starts, stops, offsets)

    def spans(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """(source file, first stored row, end stored row) covering view rows [start, stop), in order."""
        run = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while start < stop:
            offset = int(self.offsets[run])
            end = min(stop, int(self.offsets[run + 1]))
            first = int(self.run_start[run]) + start - offset
            yield int(self.run_file[run]), first, first + end - start
            start = end
            run += 1

    def episode_bounds(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """View rows [lo, hi) of the episode each of `rows` belongs to, vectorised."""
        position = np.searchsorted(self.episode_offsets, rows, side="right") - 1
        return self.episode_offsets[position], self.episode_offsets[position + 1]

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source file, stored row) of each view row, vectorised."""
        run = np.searchsorted(self.offsets, rows, side="right") - 1
        return self.run_file[run], self.run_start[run] + (rows - self.offsets[run])


def _coalesce(files: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge runs that continue each other in the same file (a whole LeRobot file becomes one run)."""
    if len(files) == 0:
        return files, starts, stops
    continues = (files[1:] == files[:-1]) & (starts[1:] == stops[:-1])
    keep = np.concatenate(([True], ~continues))
    last = np.concatenate((np.flatnonzero(keep)[1:] - 1, [len(files) - 1]))
    return files[keep], starts[keep], stops[last]

"""What a dataset object reads: one dataset's episodes, columns and windows, and the requests for them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from episerve._client import Client, DeltaTimestamps, Pages
from episerve._episodes import Episodes, episode_spec


@dataclass(frozen=True)
class Selection:
    """A dataset view and the columns read from it (`episodes` as the spec string sent to the server)."""

    dataset_id: str
    episodes: str | None
    columns: list[str] | None
    delta_timestamps: dict[str, Sequence[float]] | None
    tolerance_s: float | None

    @classmethod
    def of(
        cls,
        dataset_id: str,
        episodes: Episodes,
        columns: Sequence[str] | None,
        delta_timestamps: DeltaTimestamps | None,
        tolerance_s: float | None,
    ) -> Selection:
        return cls(
            dataset_id,
            episode_spec(episodes),
            list(columns) if columns is not None else None,
            dict(delta_timestamps) if delta_timestamps is not None else None,
            tolerance_s,
        )

    def num_rows(self, client: Client) -> int:
        """The view's row count (one small request, which also validates the selection)."""
        return client.num_rows(
            self.dataset_id,
            self.episodes,
            self.columns,
            delta_timestamps=self.delta_timestamps,
            tolerance_s=self.tolerance_s,
        )

    def take(self, client: Client, positions: np.ndarray) -> Pages:
        """The rows at view `positions`, in that order."""
        return client._take_rows(
            self.dataset_id, positions, self.episodes, self.columns, self.delta_timestamps, self.tolerance_s
        )

    def read(self, client: Client, start: int, stop: int) -> Pages:
        """View rows `[start, stop)`."""
        return client._read_pages(
            self.dataset_id, self.episodes, start, stop, self.columns, self.delta_timestamps, self.tolerance_s
        )

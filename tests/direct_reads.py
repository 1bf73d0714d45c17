"""Reads straight from the read service (no HTTP), as the routes make them: slices and takes by episode ranges."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from app.errors import OverLimit
from app.reads.episode_spec import EpisodeRanges, format_ranges
from app.reads.requests import SliceRequest, TakeRequest
from app.reads.service import Answer, answer_slice, answer_take
from app.store.dataset import Dataset


def read_slice(
    dataset: Dataset,
    episodes: EpisodeRanges | None,
    start: int,
    stop: int | None,
    columns: list[str] | None,
    max_rows: int,
) -> Answer:
    """View rows [start, stop) of `episodes` (all: None); a slice of more than `max_rows` rows is `OverLimit`."""
    spec = format_ranges(episodes) if episodes else None
    answer = answer_slice(dataset, SliceRequest(episodes=spec, start=start, stop=stop, columns=columns))
    assert isinstance(answer, Answer)
    if sum(batch.num_rows for batch in answer.batches) > max_rows:
        raise OverLimit(f"the slice holds more than {max_rows} rows", max_rows)
    if answer.pending:
        answer.pending.make()
    return answer


@dataclass(frozen=True)
class Taken:
    table: pa.Table


def take(dataset: Dataset, episodes: EpisodeRanges | None, rows: list[int], columns: list[str] | None) -> Taken:
    """View `rows` of `episodes` (all: None), in that order, every row in place."""
    spec = format_ranges(episodes) if episodes else None
    answer = answer_take(dataset, TakeRequest(episodes=spec, indices=rows, columns=columns))
    if answer.pending:
        answer.pending.make()
    return Taken(pa.Table.from_batches(answer.batches, answer.schema))

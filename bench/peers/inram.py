"""The in-RAM approach to serving episode picks: `pyarrow.dataset(...).to_table(filter=...)` into memory, then
slices of that table serialised as IPC streams, as a naive server would answer page requests."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads


def serve_everything(files: Sequence[str], page_rows: int) -> int:
    """Load every episode into memory, then serialise it page by page; return the bytes produced."""
    dataset = pads.dataset(list(files), format="parquet")
    episodes = pc.unique(dataset.to_table(columns=["episode_index"])["episode_index"])
    table = dataset.to_table(filter=pads.field("episode_index").isin(episodes))
    produced = 0
    for start in range(0, table.num_rows, page_rows):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(start, page_rows))
        produced += sink.getvalue().size
    return produced

"""Fixed-size list columns holding nulls read back whole from parquet, on every pyarrow the pins allow.

pyarrow 25 (Python 3.10's newest) cannot read them by itself (`app.sources.fixed_lists`); on a newer pyarrow the
same path is taken by switching its version check off, so CI checks it on both interpreters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.sources import fixed_lists
from app.sources.parquet import ParquetRowGroups, open_parquet_file, read_parquet_table
from app.sources.source import conform_batch
from tests.support import ServerProcess, read_stream

ROWS = 12
POSE = pa.list_(pa.float32(), 3)
GRIP = pa.struct([pa.field("force", pa.list_(pa.int32(), 2)), pa.field("name", pa.string())])


def written() -> pa.Table:
    """Rows whose fixed-size lists are null every third row, also inside a struct and a list."""
    return pa.table(
        {
            "episode_index": pa.array([i // 4 for i in range(ROWS)], pa.int64()),
            "pose": pa.array([None if i % 3 == 1 else [i, i + 0.5, -i] for i in range(ROWS)], POSE),
            "grip": pa.array(
                [{"force": None if i % 3 == 2 else [i, 2 * i], "name": f"g{i}"} for i in range(ROWS)], GRIP
            ),
            "path": pa.array([[[i, i], None] for i in range(ROWS)], pa.list_(pa.list_(pa.int64(), 2))),
            "dense": pa.array([[i, i] for i in range(ROWS)], pa.list_(pa.float64(), 2)),
        }
    )


@pytest.fixture(params=["as installed", "as pyarrow 25"])
def pyarrow_reads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "as pyarrow 25":
        monkeypatch.setattr(fixed_lists, "READS_NULL_FIXED_LISTS", False)
    return request.param


@pytest.fixture
def parquet_file(tmp_path: Path) -> Path:
    path = tmp_path / "part-0.parquet"
    pq.write_table(written(), path, row_group_size=5)
    return path


def test_a_file_reads_back_whole_batch_by_batch(parquet_file: Path, pyarrow_reads: str) -> None:
    parquet = open_parquet_file(str(parquet_file))
    batches = [conform_batch(b, written().schema) for b in parquet.iter_batches(batch_size=4)]
    assert pa.Table.from_batches(batches).equals(written())


def test_row_groups_read_back_whole(parquet_file: Path, pyarrow_reads: str) -> None:
    groups = ParquetRowGroups(parquet_file)
    rows = int(groups.offsets[3] - groups.offsets[1])
    batches = groups.take([1, 2], written().schema, np.arange(rows), batch_rows=3)
    assert pa.Table.from_batches(batches).equals(written().slice(5))


def test_a_whole_small_file_reads_with_its_own_types(parquet_file: Path, pyarrow_reads: str) -> None:
    assert read_parquet_table(parquet_file).equals(written())


def test_only_a_file_that_may_hold_null_fixed_lists_gets_another_footer(parquet_file: Path, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fixed_lists, "READS_NULL_FIXED_LISTS", False)
        footer = fixed_lists.readable_footer(pq.read_metadata(parquet_file))
        assert footer is not None
        schema = footer.schema.to_arrow_schema()
        assert schema.field("pose").type == pa.list_(pa.field("element", pa.float32()))
        assert schema.field("dense").type == pa.list_(pa.float64(), 2)  # no null in it: read as stored
        assert footer.num_rows == ROWS and footer.num_row_groups == 3
        dense = tmp_path / "dense.parquet"
        pq.write_table(written().select(["episode_index", "dense"]), dense)
        assert fixed_lists.readable_footer(pq.read_metadata(dense)) is None


@pytest.fixture(scope="module")
def nullable_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("fixed-lists")
    (root / "nulls").mkdir()
    pq.write_table(written(), root / "nulls" / "part-0.parquet", row_group_size=5)
    with ServerProcess([root], tmp_path_factory.mktemp("fixed-lists-cache")) as running:
        yield running


def test_the_server_serves_null_fixed_lists_in_episode_order(nullable_server: ServerProcess) -> None:
    with nullable_server.client() as http:
        everything = http.get("/datasets/nulls/rows")
        sliced = http.get("/datasets/nulls/rows", params={"episodes": "2,0", "columns": "pose,grip,path"})
        taken = http.post("/datasets/nulls/rows/take", json={"indices": [7, 0, 5], "columns": ["pose", "grip"]})
    for answer in (everything, sliced, taken):
        assert answer.status_code == 200, answer.text
    assert read_stream(everything.content).equals(written())
    expected = written().select(["pose", "grip", "path"])
    assert read_stream(sliced.content).equals(pa.concat_tables([expected.slice(0, 4), expected.slice(8, 4)]))
    assert read_stream(taken.content).equals(written().select(["pose", "grip"]).take([7, 0, 5]))

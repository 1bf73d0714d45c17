"""Takes gather wide rows by per-row slices and fixed-width rows as byte copies; both must equal the oracle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.reads.byte_gather import MappedColumns, Part, fixed_row_width, gather, gather_kinds
from app.settings import Settings
from app.store.catalog import Catalog
from tests.direct_reads import read_slice, take
from tests.support import assert_tables_equal, oracle


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Catalog]:
    root = tmp_path_factory.mktemp("wide-root")
    (root / "wide").mkdir()
    rng = np.random.default_rng(11)
    for part in range(3):
        n = 150
        episodes = np.sort(rng.integers(part * 5, part * 5 + 6, n))
        blobs = [rng.bytes(int(rng.integers(3000, 6000))) for _ in range(n)]
        table = pa.table(
            {
                "episode_index": episodes,
                "frame": pa.array([{"bytes": b, "path": f"f{i}.png"} for i, b in enumerate(blobs)]),
                "note": [f"row {part}-{i}" for i in range(n)],
                "x": rng.normal(size=n),
            }
        )
        pq.write_table(table, root / "wide" / f"part-{part}.parquet", row_group_size=40)
    settings_ = Settings(roots=[root], cache_dir=root.parent / f"{root.name}-cache", build_batch_bytes=64 * 1024)
    return root / "wide", Catalog(settings_, [root])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_wide_take_equals_oracle_in_request_order(wide: tuple[Path, Catalog], data: st.DataObject) -> None:
    path, catalog = wide
    dataset = catalog.get("wide")
    episodes = data.draw(st.lists(st.integers(0, 15), min_size=1, max_size=5).filter(lambda e: e))
    known = set(dataset.index().episodes.tolist())
    episodes = [e for e in episodes if e in known] or [int(dataset.index().episodes[0])]
    view = oracle(path, episodes)
    indices = data.draw(st.lists(st.integers(0, view.num_rows - 1), min_size=1, max_size=300))
    columns = data.draw(st.sampled_from([None, ["frame"], ["note", "x"], ["x", "frame", "episode_index"]]))
    ranges = [(e, e) for e in sorted(set(episodes))]
    taken = take(dataset, ranges, indices, columns).table
    expected = view.take(pa.array(indices))
    assert_tables_equal(taken, expected if columns is None else expected.select(columns))


def test_dictionary_encoded_columns_are_served_as_plain_values(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "categorical").mkdir(parents=True)
    labels = pa.array(["pick", "place", "pick", "push"]).dictionary_encode()
    pq.write_table(pa.table({"episode_index": [0, 0, 1, 1], "label": labels}), root / "categorical" / "a.parquet")
    dataset = Catalog(Settings(roots=[root], cache_dir=tmp_path / "cache"), [root]).get("categorical")
    assert dataset.index().schema.field("label").type == pa.string()
    selected = read_slice(dataset, [(1, 1)], 0, None, None, 100)
    assert pa.Table.from_batches(selected.batches, selected.schema)["label"].to_pylist() == ["pick", "push"]
    assert take(dataset, None, [3, 0], ["label"]).table["label"].to_pylist() == ["push", "pick"]


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Catalog]:
    """Fixed-width columns of every byte width (gathered as bytes), plus a bool and a nullable one (not)."""
    root = tmp_path_factory.mktemp("fixed-root")
    (root / "fixed").mkdir()
    rng = np.random.default_rng(12)
    for part in range(3):
        n = 400
        values = rng.normal(size=(n, 6)).astype(np.float32)
        table = pa.table(
            {
                "episode_index": np.sort(rng.integers(part * 4, part * 4 + 5, n)),
                "small": pa.array(rng.integers(-100, 100, n), pa.int8()),
                "half": pa.array(rng.normal(size=n).astype(np.float16)),
                "when": pa.array(rng.integers(0, 10**15, n), pa.timestamp("us")),
                "day": pa.array(rng.integers(0, 30_000, n).astype(np.int32), pa.date32()),
                "price": pa.array([f"{v:.2f}" for v in rng.uniform(0, 100, n)]).cast(pa.decimal128(9, 2)),
                "code": pa.array([rng.bytes(3) for _ in range(n)], pa.binary(3)),
                "state": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 6),
                "grid": pa.FixedSizeListArray.from_arrays(
                    pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 9, n * 4), pa.int16()), 2), 2
                ),
                "done": rng.random(n) < 0.1,
                "maybe": pa.array([None if v < 0.2 else float(v) for v in rng.random(n)]),
            }
        )
        pq.write_table(table, root / "fixed" / f"part-{part}.parquet", row_group_size=70)
    settings_ = Settings(roots=[root], cache_dir=root.parent / f"{root.name}-cache", build_batch_bytes=64 * 1024)
    return root / "fixed", Catalog(settings_, [root])


FIXED_WIDTH = ["episode_index", "small", "half", "when", "day", "price", "code", "state", "grid"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fixed_width_take_equals_oracle_in_request_order(fixed: tuple[Path, Catalog], data: st.DataObject) -> None:
    path, catalog = fixed
    dataset = catalog.get("fixed")
    picked = data.draw(st.none() | st.lists(st.integers(0, 11), min_size=1, max_size=4))
    view = oracle(path, picked)
    indices = data.draw(st.lists(st.integers(0, view.num_rows - 1), max_size=500))
    kind = data.draw(st.sampled_from(["fixed width", "fixed width", "fixed width", "all", "bool", "nulls"]))
    columns = {"all": None, "bool": ["state", "done"], "nulls": ["maybe", "when"]}.get(kind) or data.draw(
        st.lists(st.sampled_from(FIXED_WIDTH), min_size=1, max_size=5, unique=True)
    )
    ranges = None if picked is None else [(e, e) for e in sorted(set(picked))]
    taken = take(dataset, ranges, indices, columns).table
    expected = view.take(pa.array(indices, pa.int64()))
    assert_tables_equal(taken, expected if columns is None else expected.select(columns))


def _segment_batches(seed: int) -> list[pa.RecordBatch]:
    """Record batches with sliced (offset) arrays of every copyable kind, as two stored batches."""
    rng = np.random.default_rng(seed)
    n = 60
    table = pa.table(
        {
            "grid": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 99, n * 4), pa.int16()), 2), 2
            ),
            "x": rng.normal(size=n),
            "code": pa.array([rng.bytes(3) for _ in range(n)], pa.binary(3)),
            "frame": pa.array([{"bytes": rng.bytes(int(rng.integers(0, 40))), "path": f"p{i}"} for i in range(n)]),
            "note": pa.array([f"row {seed}-{i}" * int(rng.integers(0, 3)) for i in range(n)], pa.large_string()),
            "wide": pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=n * 40)), 40),  # 320 bytes a row
        }
    )
    return [b.slice(3, 20) for b in table.to_batches(max_chunksize=30)]


@pytest.mark.parametrize("columns", [None, ["grid", "x", "code"], ["frame", "x"], ["note", "wide"], ["wide"]])
def test_gather_copies_rows_of_every_kind_from_offset_arrays_in_request_order(columns: list[str] | None) -> None:
    segments = [_segment_batches(1), _segment_batches(2)]
    if columns is not None:
        segments = [[b.select(columns) for b in batches] for batches in segments]
    schema = segments[0][0].schema
    kinds = gather_kinds(schema)
    assert kinds is not None
    mapped = [MappedColumns.of(batches, kinds) for batches in segments]
    assert all(m is not None for m in mapped)
    rng = np.random.default_rng(3)
    files = rng.integers(0, 2, 150)
    stored = rng.integers(0, 40, 150)  # two batches of 20 rows per segment
    parts = []
    for number in (0, 1):
        positions = np.flatnonzero(files == number)
        batch, row = np.divmod(stored[positions], 20)
        parts.append(Part(mapped[number], positions, batch, row))  # type: ignore[arg-type]
    got = gather(schema, parts, len(files))
    tables = [pa.Table.from_batches(batches) for batches in segments]
    expected = pa.concat_tables([tables[f].slice(int(r), 1) for f, r in zip(files, stored, strict=True)])
    assert_tables_equal(got, expected)
    batch, row = np.divmod(stored, 20)  # every row from the second segment: one part, already in request order
    alone = gather(schema, [Part(mapped[1], np.arange(len(stored)), batch, row)], len(stored))  # type: ignore[arg-type]
    assert_tables_equal(alone, pa.concat_tables([tables[1].slice(int(r), 1) for r in stored]))


def test_columns_that_cannot_be_copied_byte_wise_are_refused() -> None:
    assert fixed_row_width(pa.list_(pa.int8())) is None
    for kind in (
        pa.bool_(),
        pa.list_(pa.int8()),
        pa.struct([("a", pa.bool_())]),
        pa.null(),
        pa.dictionary(pa.int8(), pa.string()),
    ):
        assert gather_kinds(pa.schema([("a", pa.int8()), ("b", kind)])) is None, kind
    assert gather_kinds(pa.schema([("a", pa.int8()), ("b", pa.binary(5))])) is not None
    nullable = pa.record_batch({"x": pa.array([1.0, None])})
    assert MappedColumns.of([nullable], gather_kinds(nullable.schema)) is None  # type: ignore[arg-type]
    struct_nulls = pa.record_batch({"s": pa.array([{"b": b"x"}, None], pa.struct([("b", pa.binary())]))})
    assert MappedColumns.of([struct_nulls], gather_kinds(struct_nulls.schema)) is None  # type: ignore[arg-type]

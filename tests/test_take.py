"""Takes gather wide rows by per-row slices and fixed-width rows as byte copies; both must equal the oracle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.catalog import Catalog
from app.gather import byte_rows, fixed_row_width, fixed_row_widths
from app.settings import Settings
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
    taken = dataset.take(ranges, indices, columns).table
    expected = view.take(pa.array(indices))
    assert_tables_equal(taken, expected if columns is None else expected.select(columns))


def test_dictionary_encoded_columns_are_served_as_plain_values(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "categorical").mkdir(parents=True)
    labels = pa.array(["pick", "place", "pick", "push"]).dictionary_encode()
    pq.write_table(pa.table({"episode_index": [0, 0, 1, 1], "label": labels}), root / "categorical" / "a.parquet")
    dataset = Catalog(Settings(roots=[root], cache_dir=tmp_path / "cache"), [root]).get("categorical")
    assert dataset.index().schema.field("label").type == pa.string()
    selected = dataset.read_slice([(1, 1)], 0, None, None, 100)
    assert pa.Table.from_batches(selected.batches, selected.schema)["label"].to_pylist() == ["pick", "push"]
    assert dataset.take(None, [3, 0], ["label"]).table["label"].to_pylist() == ["push", "pick"]


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
    taken = dataset.take(ranges, indices, columns).table
    expected = view.take(pa.array(indices, pa.int64()))
    assert_tables_equal(taken, expected if columns is None else expected.select(columns))


def test_fixed_width_byte_views_follow_offsets_and_refuse_nulls() -> None:
    values = pa.array(np.arange(40, dtype=np.int16))
    nested = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(values, 2), 2).slice(3, 5)
    width = fixed_row_width(nested.type)
    assert width == 8
    rows = byte_rows(nested, width)
    assert rows is not None and len(rows) == 5
    assert np.frombuffer(rows[1].tobytes(), np.int16).tolist() == [16, 17, 18, 19]  # row 4 of the unsliced array
    assert byte_rows(pa.array([1.0, None]), 8) is None
    for kind in (pa.bool_(), pa.string(), pa.list_(pa.int8()), pa.struct([("a", pa.int8())]), pa.null()):
        assert fixed_row_width(kind) is None, kind
    assert fixed_row_widths(pa.schema([("a", pa.int8()), ("b", pa.binary(5))])) == [1, 5]
    assert fixed_row_widths(pa.schema([("a", pa.int8()), ("b", pa.bool_())])) is None

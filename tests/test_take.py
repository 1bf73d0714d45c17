"""Take over wide rows (images, long strings) gathers by per-row slices; it must equal the oracle too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.catalog import Catalog
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

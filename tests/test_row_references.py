"""Rows by reference: a client that reads the server's cache directory gets a take's rows from the segment files,
exactly the table it would get over HTTP (schema, columns, values, order); whatever it cannot read there (a
segment rebuilt since, another directory) still comes right, over HTTP."""

from __future__ import annotations

import logging
import pickle
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import episerve
from episerve._cache_files import SegmentUnavailable
from episerve._local_rows import METADATA_KEY, LocalRows
from tests.support import ServerProcess, eventually, oracle, read_stream
from tests.test_errors import assert_problem
from tests.test_operations import metric

# Segments of many small record batches, so a take gathers from several batches of several files.
SMALL_BATCHES = {"EPISERVE_BUILD_BATCH_BYTES": "65536"}
EPISODES = {"part-0.parquet": [4, 0, 2], "part-1.parquet": [1, 5], "part-2.parquet": [3, 6, 7]}
ROWS_PER_EPISODE = 60


def write_dataset(path: Path, seed: int = 0) -> Path:
    """Parquet files of every column kind a take gathers: integers, floats and booleans with nulls, fixed-size
    lists, strings, and binary values of up to 6 KB (wide rows); an episode's rows lie in one file."""
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    first = 0
    for name, episodes in EPISODES.items():
        count = len(episodes) * ROWS_PER_EPISODE
        gaps = np.arange(count) % 7 == 3
        table = pa.table(
            {
                "episode_index": pa.array(np.repeat(episodes, ROWS_PER_EPISODE), pa.int64()),
                "index": pa.array(np.arange(first, first + count), pa.int64()),
                "state": pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=count * 6), pa.float32()), 6),
                "reading": pa.array(rng.normal(size=count), pa.float64(), mask=gaps),
                "flag": pa.array(rng.integers(0, 2, count).astype(bool), mask=gaps),
                "note": pa.array([None if gap else f"row {first + i} " * (i % 4) for i, gap in enumerate(gaps)]),
                "blob": pa.array([rng.bytes(int(rng.integers(0, 6000))) for _ in range(count)], pa.binary()),
            }
        )
        pq.write_table(table, path / name, row_group_size=50)
        first += count
    (path / "episerve.json").write_text('{"fps": 10}')
    return path


def warmed(client: episerve.Client, dataset: str) -> None:
    """Every segment of `dataset` built."""
    client.warm(dataset)
    eventually(lambda: client.cache_status(dataset)["segments_built"] == len(EPISODES), seconds=60)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("row-references")
    write_dataset(root / "rows")
    write_dataset(root / "changing")  # rewritten by a test
    write_dataset(root / "cold", seed=2)  # built by a test
    return root


@pytest.fixture(scope="module")
def server(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess([root], tmp_path_factory.mktemp("row-references-cache") / "cache", env=SMALL_BATCHES) as server:
        warmed(episerve.Client(server.url), "rows")
        yield server


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def _indices(rows: int, seed: int) -> list[int]:
    """Unsorted view positions across every file and record batch, some repeated, some consecutive."""
    rng = np.random.default_rng(seed)
    return [*rng.integers(0, rows, 90).tolist(), 5, 5, rows - 1, 0, *range(40, 60), 41]


def test_references_name_the_segment_rows_holding_each_row(root: Path, server: ServerProcess, http: httpx.Client):
    view = oracle(root / "rows", [6, 1, 4])
    indices = _indices(view.num_rows, 1)
    body = {"episodes": [6, 1, 4], "indices": indices, "columns": ["note", "index", "state"], "rows": "references"}
    response = http.post("/datasets/rows/rows/take", json=body)
    assert response.status_code == 200, response.text
    answer = read_stream(response.content)
    assert answer.column_names == ["segment", "row"] and answer.num_rows == len(indices)
    assert len(response.content) < 16 * len(indices) + 2048  # a few bytes a row, whatever the rows hold
    described = orjson.loads(answer.schema.metadata[METADATA_KEY])
    assert described["columns"] == ["note", "index", "state"]
    segments = []
    for entry in described["segments"]:  # read independently of the client, by path under the cache
        path = server.cache_dir / entry["path"]
        stat = path.stat()
        assert (stat.st_size, stat.st_ino, stat.st_mtime_ns) == (entry["bytes"], entry["inode"], entry["mtime_ns"])
        segments.append(pa.ipc.open_file(pa.memory_map(str(path))).read_all())
        assert segments[-1].num_rows == entry["rows"]
    picked = [segments[s].slice(r, 1) for s, r in zip(*answer.to_pydict().values(), strict=True)]
    got = pa.concat_tables(picked).select(described["columns"])
    assert got.equals(view.take(pa.array(indices)).select(described["columns"]))


@pytest.mark.parametrize(
    "columns",
    [None, ["reading", "state", "index"], ["note", "flag", "episode_index"], ["blob"]],
    ids=["every column (wide rows)", "numbers", "strings and flags", "binary"],
)
def test_a_client_with_the_cache_dir_gathers_the_rows_the_server_would_send(
    root: Path, server: ServerProcess, columns: list[str] | None
) -> None:
    local = episerve.Client(server.url, cache_dir=server.cache_dir)
    remote = episerve.Client(server.url)
    selection = episerve.Selection.of("rows", [7, 0, 3, 5], columns)
    indices = _indices(remote.count(selection), 2)
    pages = local.read_take(selection, indices)
    expected = remote.take("rows", indices, [7, 0, 3, 5], columns)
    assert pages.table.schema.equals(expected.schema, check_metadata=True)
    assert pages.table.equals(expected)
    view = oracle(root / "rows", [7, 0, 3, 5]).take(pa.array(indices))
    assert pages.table.equals(view.select(columns) if columns else view)
    assert sum(b.size for b in pages.buffers) < 16 * len(indices) + 2048  # the rows did not come over HTTP
    assert local.local_rows is not None and local.local_rows._misses == 0


def test_takes_of_several_datasets_read_their_rows_by_reference(server: ServerProcess) -> None:
    local = episerve.Client(server.url, cache_dir=server.cache_dir)
    remote = episerve.Client(server.url)
    takes = [
        (episerve.Selection.of("rows", [2], ["index", "blob"]), [59, 0, 7, 7]),
        (episerve.Selection.of("rows"), [3]),
        (episerve.Selection.of("rows", [2], ["note", "reading"]), [3, 1, 2, 1]),  # rows of one record batch
    ]
    got = local.read_takes(takes)
    assert [pages.table for pages in got] == [pages.table for pages in remote.read_takes(takes)]
    assert got[0].buffers[0].size < 4096  # the one answer of all the takes: no row came over HTTP


def test_windows_come_as_values_when_references_are_asked(root: Path, http: httpx.Client) -> None:
    body = {"indices": [3, 0], "columns": ["index"], "delta_timestamps": {"index": [-0.1, 0]}, "rows": "references"}
    answer = read_stream(http.post("/datasets/rows/rows/take", json=body).content)
    index = oracle(root / "rows", None)["index"].to_pylist()
    assert answer.column_names == ["index", "index_is_pad"]
    assert answer["index"].to_pylist() == [[index[2], index[3]], [index[0], index[0]]]
    assert answer["index_is_pad"].to_pylist() == [[False, False], [True, False]]


def test_an_unknown_rows_mode_is_422(http: httpx.Client) -> None:
    response = http.post("/datasets/rows/rows/take", json={"indices": [0], "rows": "pointers"})
    assert_problem(response, 422, "rows", "'values' or 'references'")


def test_dataloader_workers_gather_rows_from_the_cache_dir(root: Path, server: ServerProcess) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    view = oracle(root / "rows", [5, 2, 6])
    columns = ["index", "state", "reading", "note"]
    dataset = episerve.EpisodeDataset(
        server.url, "rows", episodes=[5, 2, 6], columns=columns, cache_dir=server.cache_dir
    )
    loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2, collate_fn=episerve.collate)
    position_of = {index: position for position, index in enumerate(view["index"].to_pylist())}
    seen: list[int] = []
    for batch in loader:
        positions = [position_of[int(index)] for index in batch["index"]]
        expected = view.take(pa.array(positions))
        assert batch["state"].dtype == torch.float32
        assert np.array_equal(batch["state"].numpy(), np.stack(expected["state"].to_numpy(zero_copy_only=False)))
        readings = expected["reading"].to_numpy(zero_copy_only=False)
        assert np.array_equal(batch["reading"].numpy(), readings, equal_nan=True)
        assert list(batch["note"]) == expected["note"].to_pylist()
        seen += positions
    assert sorted(seen) == list(range(view.num_rows))


@pytest.mark.parametrize("where", ["an empty directory", "a copy of the cache"])
def test_rows_that_cannot_be_read_from_the_cache_dir_come_over_http(
    server: ServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    directory = tmp_path / "empty"
    if where == "a copy of the cache":
        shutil.copytree(server.cache_dir, directory, ignore=shutil.ignore_patterns("*.lock", "metrics"))
    directory.mkdir(exist_ok=True)
    local = episerve.Client(server.url, cache_dir=directory)
    expected = episerve.Client(server.url).take("rows", [50, 1, 170, 1], columns=["index", "blob"])
    with caplog.at_level(logging.WARNING, logger="episerve"):
        for _ in range(3):
            assert local.take("rows", [50, 1, 170, 1], columns=["index", "blob"]).equals(expected)
    reason = "No such file" if where == "an empty directory" else "is not the file the server has mapped"
    assert "rows of a take come over HTTP" in caplog.text and reason in caplog.text
    assert "3 takes in a row could not read rows" in caplog.text
    assert local.local_rows is not None and not local.local_rows.in_use  # values only, for a while
    assert local.take("rows", [2], columns=["index"]).equals(
        episerve.Client(server.url).take("rows", [2], columns=["index"])
    )


def test_a_segment_rebuilt_after_its_source_changed_is_never_read_stale(
    root: Path, server: ServerProcess, http: httpx.Client
) -> None:
    remote = episerve.Client(server.url)
    warmed(remote, "changing")
    local = episerve.Client(server.url, cache_dir=server.cache_dir)
    indices, columns = [0, 130, 7, 7, 299], ["index", "reading", "note"]
    before = local.take("changing", indices, columns=columns)
    assert before.equals(remote.take("changing", indices, columns=columns))
    body = {"indices": indices, "columns": columns, "rows": "references"}
    old_answer = read_stream(http.post("/datasets/changing/rows/take", json=body).content)
    assert LocalRows.referenced(old_answer)

    write_dataset(root / "changing", seed=1)  # every file rewritten: the same rows, other values
    changed = oracle(root / "changing", None).take(pa.array(indices)).select(columns)
    assert not changed.equals(before)
    # Within its layout's second the client may still read the rows as they were, but whole, never a mix; then,
    # by value while the segments rebuild, as they are.
    first = local.take("changing", indices, columns=columns)
    assert first.equals(before) or first.equals(changed)
    eventually(lambda: local.take("changing", indices, columns=columns).equals(changed), seconds=10)
    warmed(remote, "changing")
    with pytest.raises(SegmentUnavailable, match="is not the file the server has mapped"):
        LocalRows(server.cache_dir).resolve(old_answer)  # the files it names were replaced: never read
    pages = local.read_take(episerve.Selection.of("changing", None, columns), indices)
    assert pages.table.equals(changed)
    assert sum(b.size for b in pages.buffers) < 2048  # by reference again, to the rebuilt files


def _layout_rows(layout: dict, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source file, segment row) of view `positions` by a layout's runs, computed here."""
    run = np.searchsorted(layout["offsets"], positions, side="right") - 1
    files = np.asarray(layout["files"])[run]
    return files, np.asarray(layout["starts"])[run] + positions - np.asarray(layout["offsets"])[run]


def test_a_view_layout_places_every_row_of_the_view_in_a_segment(
    root: Path, server: ServerProcess, http: httpx.Client
) -> None:
    view = oracle(root / "rows", [6, 1, 4])
    response = http.post("/datasets/rows/rows/layout", json={"episodes": [6, 1, 4], "columns": ["note", "index"]})
    assert response.status_code == 200, response.text
    layout = response.json()
    assert layout["rows"] == view.num_rows and layout["columns"] == ["note", "index"] and layout["seconds"] == 1.0
    assert layout["offsets"][0] == 0 and layout["offsets"][-1] == view.num_rows
    segments = {}
    for entry in layout["segments"]:  # read independently of the client, by path under the cache
        path = server.cache_dir / entry["path"]
        stat = path.stat()
        assert (stat.st_size, stat.st_ino, stat.st_mtime_ns) == (entry["bytes"], entry["inode"], entry["mtime_ns"])
        segments[entry["file"]] = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        assert segments[entry["file"]].num_rows == entry["rows"]
    assert sorted(segments) == sorted(set(layout["files"]))  # every file of the view is built (warmed)
    files, rows = _layout_rows(layout, np.arange(view.num_rows))
    got = pa.concat_tables(segments[f].slice(r, 1).select(["note", "index"]) for f, r in zip(files, rows, strict=True))
    assert got.equals(view.select(["note", "index"]))


@pytest.mark.parametrize(
    ("body", "where", "detail"),
    [
        ({"columns": ["nope"]}, "columns", "nope"),
        ({"indices": [0]}, "indices", "Extra inputs are not permitted"),
        ({"episodes": "2-x"}, "episodes", "2-x"),
    ],
    ids=["an unknown column", "a field of takes", "a bad episode spec"],
)
def test_a_bad_layout_request_is_422(http: httpx.Client, body: dict, where: str, detail: str) -> None:
    assert_problem(http.post("/datasets/rows/rows/layout", json=body), 422, where, detail)


def test_the_layout_of_an_unknown_dataset_is_404(http: httpx.Client) -> None:
    assert_problem(http.post("/datasets/nothing/rows/layout", json={}), 404, "nothing")


def _takes_served(http: httpx.Client) -> tuple[float, float]:
    """Takes and layouts the server has answered so far."""
    text = http.get("/metrics").text
    endpoint = "/datasets/{dataset_id:path}/rows/"
    take, layout = (
        metric(text, "episerve_requests_total", endpoint=endpoint + name, method="POST", status="200")
        for name in ("take", "layout")
    )
    return take, layout


def test_a_client_on_the_servers_machine_takes_rows_without_a_request_per_take(
    root: Path, server: ServerProcess, http: httpx.Client
) -> None:
    local = episerve.Client(server.url, cache_dir=server.cache_dir)
    selection = episerve.Selection.of("rows", [7, 0, 3, 5], ["state", "note", "blob"])
    view = oracle(root / "rows", [7, 0, 3, 5]).select(["state", "note", "blob"])
    takes_before, layouts_before = _takes_served(http)
    started = time.monotonic()
    for seed in range(30):
        indices = _indices(view.num_rows, seed)
        pages = local.read_take(selection, indices)
        assert pages.table.equals(view.take(pa.array(indices)))
        assert pages.total_rows == view.num_rows and sum(b.size for b in pages.buffers) == 0
    takes_after, layouts_after = _takes_served(http)
    assert takes_after == takes_before  # not one take asked
    assert 1 <= layouts_after - layouts_before <= 2 + (time.monotonic() - started) / 1.0  # one a second


def test_rows_of_a_file_with_no_segment_built_are_asked_until_it_is(
    root: Path, server: ServerProcess, http: httpx.Client
) -> None:
    local = episerve.Client(server.url, cache_dir=server.cache_dir)
    view = oracle(root / "cold", None).select(["index", "reading"])
    indices = _indices(view.num_rows, 3)
    assert http.post("/datasets/cold/rows/layout", json={}).json()["segments"] == []  # nothing built yet
    assert local.take("cold", indices, columns=["index", "reading"]).equals(view.take(pa.array(indices)))
    warmed(episerve.Client(server.url), "cold")
    selection = episerve.Selection.of("cold", None, ["index", "reading"])

    def taken_here() -> bool:
        pages = local.read_take(selection, indices)
        assert pages.table.equals(view.take(pa.array(indices)))
        return sum(b.size for b in pages.buffers) == 0

    eventually(taken_here, seconds=10)  # the layout asked again names the segments built since


def test_layouts_can_be_turned_off(root: Path, tmp_path: Path) -> None:
    with ServerProcess([root], tmp_path / "cache", env={"EPISERVE_ROW_LAYOUT_S": "0"}) as server:
        warmed(episerve.Client(server.url), "rows")
        local = episerve.Client(server.url, cache_dir=server.cache_dir)
        view = oracle(root / "rows", None).select(["index"])
        for seed in range(3):
            indices = _indices(view.num_rows, seed)
            pages = local.read_take(episerve.Selection.of("rows", None, ["index"]), indices)
            assert pages.table.equals(view.take(pa.array(indices)))
            assert 0 < sum(b.size for b in pages.buffers) < 16 * len(indices) + 2048  # asked, by reference


def test_takes_by_layout_beside_takes_that_need_a_request_come_right(root: Path, server: ServerProcess) -> None:
    local = episerve.Client(server.url, cache_dir=server.cache_dir)
    remote = episerve.Client(server.url)
    takes = [
        (episerve.Selection.of("rows", [2, 6], ["index", "state"]), [59, 0, 7, 7]),
        (episerve.Selection.of("rows", [2], ["index"], delta_timestamps={"index": [-0.1, 0]}), [3, 0]),
    ]
    for _ in range(3):
        assert [p.table for p in local.read_takes(takes)] == [p.table for p in remote.read_takes(takes)]


def test_a_take_a_layout_cannot_check_is_checked_by_the_server(server: ServerProcess) -> None:
    local = episerve.Client(server.url, cache_dir=server.cache_dir)
    local.take("rows", [0, 1], columns=["index"])  # its view's layout is known
    with pytest.raises(episerve.InvalidRequest, match="tolerance_s"):
        local.take("rows", [0, 1], columns=["index"], tolerance_s=-1.0)


def test_a_pickled_client_takes_by_layout_as_its_original(root: Path, server: ServerProcess) -> None:
    local = episerve.Client(server.url, cache_dir=server.cache_dir)
    selection = episerve.Selection.of("rows", [1, 4], ["index", "note"])
    view = oracle(root / "rows", [1, 4]).select(["index", "note"])
    assert local.read_take(selection, [3, 0]).table.equals(view.take(pa.array([3, 0])))  # a layout known
    copy = pickle.loads(pickle.dumps(local))  # as a spawned DataLoader worker receives it
    pages = copy.read_take(selection, [5, 2, 5])
    assert pages.table.equals(view.take(pa.array([5, 2, 5]))) and sum(b.size for b in pages.buffers) == 0

"""The segment cache: crash safety, one build under concurrency, no stale rows, no bytes per pick."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.demo import write_demo_dataset
from app.settings import Settings
from app.store.catalog import Catalog
from tests.direct_reads import read_slice, take
from tests.support import (
    ServerProcess,
    assert_tables_equal,
    eventually,
    oracle,
    read_stream,
    write_generic_dataset,
)


def make_catalog(root: Path, cache: Path, **overrides: object) -> Catalog:
    return Catalog(Settings(roots=[root], cache_dir=cache, **overrides), [root])


def write_big_generic_dataset(path: Path, rows: int = 400_000) -> Path:
    path.mkdir(parents=True)
    rng = np.random.default_rng(3)
    values = pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=rows * 16).astype(np.float32)), 16)
    table = pa.table({"episode_index": np.repeat(np.arange(rows // 1000), 1000), "vec": values})
    pq.write_table(table, path / "big.parquet", compression="none")
    return path


def cache_files(cache: Path, pattern: str) -> list[Path]:
    return sorted(cache.rglob(pattern))


def _read_everything(
    root: str, cache: str, dataset_id: str, barrier: multiprocessing.synchronize.Barrier | None, batch_bytes: int
) -> tuple[int, list[int]]:
    catalog = make_catalog(Path(root), Path(cache), build_batch_bytes=batch_bytes)
    dataset = catalog.get(dataset_id)
    dataset.index()
    if barrier is not None:
        barrier.wait()
    selected = read_slice(dataset, None, 0, None, ["episode_index"], 10**9)
    values = pa.Table.from_batches(selected.batches, selected.schema)["episode_index"].to_pylist()
    return dataset.segments.builds, values


def test_sigkill_during_build_leaves_nothing_that_is_served(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_big_generic_dataset(root / "big")
    context = multiprocessing.get_context("spawn")
    for attempt in range(5):
        cache = tmp_path / f"cache-{attempt}"
        process = context.Process(target=_read_everything, args=(str(root), str(cache), "big", None, 64 * 1024))
        process.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.is_alive():
            tmp = cache_files(cache, "*.arrow.tmp")
            if tmp and tmp[0].exists() and tmp[0].stat().st_size > 1_000_000:
                break
            time.sleep(0.001)
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        if cache_files(cache, "*.arrow.tmp") and not cache_files(cache, "segments/*.json"):
            break
    else:
        pytest.fail("could not kill the builder mid-build in 5 attempts")

    with ServerProcess([root], cache) as server:
        response = httpx.get(f"{server.url}/datasets/big/rows", params={"episodes": "7,399"}, timeout=60)
        assert response.status_code == 200
        assert_tables_equal(read_stream(response.content), oracle(root / "big", [7, 399]))
    assert cache_files(cache, "*.tmp") == []
    assert len(cache_files(cache, "segments/*.arrow")) == len(cache_files(cache, "segments/*.json")) == 1


@pytest.mark.parametrize("damage", ["truncate", "remove_sidecar", "garbage_sidecar", "wrong_rows", "empty_file"])
def test_damaged_segment_is_rebuilt_never_served(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=12, files=2, cameras={})
    catalog = make_catalog(root, tmp_path / "cache")
    dataset = catalog.get("demo")
    expected = oracle(root / "demo", None)
    read_slice(dataset, None, 0, None, None, 10**9)
    arrow = cache_files(tmp_path / "cache", "segments/*.arrow")[0]
    sidecar = arrow.with_suffix(".json")
    if damage == "truncate":
        os.truncate(arrow, arrow.stat().st_size // 2)
    elif damage == "remove_sidecar":
        sidecar.unlink()
    elif damage == "garbage_sidecar":
        sidecar.write_bytes(b"{oops")
    elif damage == "wrong_rows":
        sidecar.write_bytes(sidecar.read_bytes().replace(b'"rows":', b'"rows":1'))
    elif damage == "empty_file":
        arrow.write_bytes(b"")

    fresh = make_catalog(root, tmp_path / "cache").get("demo")  # a new process: nothing cached in memory
    selected = read_slice(fresh, None, 0, None, None, 10**9)
    assert_tables_equal(pa.Table.from_batches(selected.batches, selected.schema), expected)
    assert fresh.segments.builds == 1


def _read_again_after_a_rebuild_elsewhere(root: str, cache: str) -> tuple[pa.Table, int, int]:
    """Map every segment, truncate one in place, let another process's maps (another catalog) notice and rebuild
    it, then read everything again: the rows, and the builds of each catalog."""
    mine = make_catalog(Path(root), Path(cache)).get("demo")
    read_slice(mine, None, 0, None, None, 10**9)
    segment = cache_files(Path(cache), "segments/*.arrow")[0]
    os.truncate(segment, segment.stat().st_size // 3)  # in place: the map of `mine` now reaches past the end
    other = make_catalog(Path(root), Path(cache)).get("demo")
    read_slice(other, None, 0, None, None, 10**9)  # a rebuild: another file at the path
    selected = read_slice(mine, None, 0, None, None, 10**9)
    return pa.Table.from_batches(selected.batches, selected.schema), mine.segments.builds, other.segments.builds


def test_a_map_truncated_and_then_rebuilt_by_another_process_is_never_read(tmp_path: Path) -> None:
    """The rebuilt file at the path says nothing of the truncated one still mapped: the map is let go and the new
    file mapped. Run in a child process: reading the truncated map would kill it with SIGBUS."""
    from concurrent.futures import ProcessPoolExecutor

    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=12, files=2, cameras={})
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        job = pool.submit(_read_again_after_a_rebuild_elsewhere, str(root), str(tmp_path / "cache"))
        table, mine, other = job.result()
    assert_tables_equal(table, oracle(root / "demo", None))
    assert (mine, other) == (2, 1)  # its first read built both; then it mapped the other's rebuild


def test_concurrent_processes_build_each_segment_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=40, files=3, cameras={})
    cache = tmp_path / "cache"
    context = multiprocessing.get_context("spawn")
    workers = 4
    with context.Manager() as manager:
        barrier = manager.Barrier(workers)
        with context.Pool(workers) as pool:
            results = pool.starmap(
                _read_everything, [(str(root), str(cache), "demo", barrier, 8 * 1024 * 1024)] * workers
            )
    expected = oracle(root / "demo", None)["episode_index"].to_pylist()
    assert all(values == expected for _, values in results)
    assert sum(builds for builds, _ in results) == 3
    assert len(cache_files(cache, "segments/*.arrow")) == 3
    assert cache_files(cache, "*.tmp") == []


def test_concurrent_requests_in_one_process_share_one_build(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=20, files=1, cameras={})
    dataset = make_catalog(root, tmp_path / "cache", cold_read_bytes=0).get("demo")
    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(lambda _: len(take(dataset, None, [0, 5, 9], ["index"]).table), range(16)))
    assert sizes == [3] * 16
    assert dataset.segments.builds == 1


def test_warm_builds_files_side_by_side_each_once_and_reports_every_row(tmp_path: Path) -> None:
    from app.store.warming import warm

    root = tmp_path / "root"
    write_demo_dataset(root / "demo", format="v2.1", episodes=12, seed=5, cameras={})  # one parquet file per episode
    dataset = make_catalog(root, tmp_path / "cache", build_threads=3, build_batch_bytes=64 * 1024).get("demo")
    index = dataset.index()
    reported: list[int] = []
    finished: list[int] = []

    built = warm(dataset, None, lambda rows, _bytes: reported.append(rows), lambda: finished.append(1))

    assert built == len(index.files) == 12 == len(finished) == len(cache_files(tmp_path / "cache", "*.arrow"))
    assert sum(reported) == sum(source.rows for source in index.files)
    assert not cache_files(tmp_path / "cache", "*.tmp")
    selected = read_slice(dataset, None, 0, None, None, 10**9)
    assert_tables_equal(pa.Table.from_batches(selected.batches, selected.schema), oracle(root / "demo", None))
    assert warm(dataset) == 0  # all cached


def test_warm_stops_at_a_source_that_cannot_be_converted(tmp_path: Path) -> None:
    from app.errors import DatasetError
    from app.store.warming import warm

    root = tmp_path / "root"
    write_demo_dataset(root / "demo", format="v2.1", episodes=6, seed=6, cameras={})
    dataset = make_catalog(root, tmp_path / "cache", build_threads=2).get("demo")
    index = dataset.index()
    broken = root / "demo" / index.files[3].path
    data = bytearray(broken.read_bytes())
    data[4 : len(data) // 2] = bytes(len(data) // 2 - 4)  # pages gone, footer (size and mtime aside) intact
    stat = broken.stat()
    broken.write_bytes(bytes(data))
    os.utime(broken, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert dataset.reload().files[3].rows == index.files[3].rows  # a new ctime: fingerprinted again, footer intact

    with pytest.raises(DatasetError, match=f"^cannot convert {re.escape(index.files[3].path)}: "):
        warm(dataset)
    assert not cache_files(tmp_path / "cache", "*.tmp")
    assert not dataset.segments.paths(index.files[3].path).arrow.exists()


def test_rewritten_source_file_is_never_served_stale(tmp_path: Path) -> None:
    root = tmp_path / "root"
    dataset_dir = root / "table"
    dataset_dir.mkdir(parents=True)
    source = dataset_dir / "rows.parquet"
    pq.write_table(pa.table({"episode_index": [0, 0, 1, 1], "value": [1, 2, 3, 4]}), source)
    with ServerProcess([root], tmp_path / "cache") as server, server.client() as http:
        before = read_stream(http.get("/datasets/table/rows").content)
        assert before["value"].to_pylist() == [1, 2, 3, 4]
        pq.write_table(pa.table({"episode_index": [1, 0, 2], "value": [30, 10, 20]}), source)
        os.utime(source, ns=(time.time_ns(), time.time_ns() + 1_000_000))
        after = read_stream(http.get("/datasets/table/rows").content)
        assert after["episode_index"].to_pylist() == [0, 1, 2]
        assert after["value"].to_pylist() == [10, 30, 20]
        taken = http.post("/datasets/table/rows/take", json={"indices": [0], "episodes": [2]})
        assert read_stream(taken.content)["value"].to_pylist() == [20]
        info = http.get("/datasets/table").json()
        assert info["rows"] == 3
        assert info["episodes"] == 3


def test_changed_file_invalidates_only_its_own_segment(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=30, files=3, cameras={})
    catalog = make_catalog(root, tmp_path / "cache")
    dataset = catalog.get("demo")
    read_slice(dataset, None, 0, None, None, 10**9)
    segments = {p.name: p.stat().st_mtime_ns for p in cache_files(tmp_path / "cache", "segments/*.arrow")}
    target = sorted((root / "demo" / "data").rglob("*.parquet"))[1]
    table = pq.read_table(target)
    pq.write_table(table, target)  # same rows, new file: a new fingerprint
    os.utime(target, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    selected = read_slice(dataset, None, 0, None, None, 10**9)
    assert_tables_equal(pa.Table.from_batches(selected.batches, selected.schema), oracle(root / "demo", None))
    after = {p.name: p.stat().st_mtime_ns for p in cache_files(tmp_path / "cache", "segments/*.arrow")}
    changed = [name for name in segments if after[name] != segments[name]]
    assert len(changed) == 1 and target.stem in changed[0]


def test_three_distinct_picks_cost_no_more_disk_than_one_conversion(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=100, files=4, cameras={})
    cache = tmp_path / "cache"
    with ServerProcess([root], cache) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        for spec in ("0-9", "0-49", "0-99"):  # 10 %, 50 %, full
            assert http.get("/datasets/demo/rows", params={"episodes": spec}).status_code == 200
    cached = sum(p.stat().st_size for p in (cache / "datasets").rglob("*") if p.is_file())
    one_conversion = 0
    for number, source in enumerate(sorted((root / "demo" / "data").rglob("*.parquet"))):
        table = pq.read_table(source)
        with (
            pa.OSFile(str(tmp_path / f"reference-{number}.arrow"), "wb") as sink,
            pa.ipc.new_file(sink, table.schema) as writer,
        ):
            writer.write_table(table)
        one_conversion += (tmp_path / f"reference-{number}.arrow").stat().st_size
    segments = sum(p.stat().st_size for p in cache.rglob("segments/*.arrow"))
    assert segments <= one_conversion * 1.02
    assert cached - segments < 64 * 1024  # sidecars, locks and the episode index only


def test_source_files_with_dots_in_their_names_get_distinct_segments(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "dotted").mkdir(parents=True)
    for part in range(3):
        table = pa.table({"episode_index": [part, part], "value": [part * 10, part * 10 + 1]})
        pq.write_table(table, root / "dotted" / f"train.part{part}.v1.parquet")
    dataset = make_catalog(root, tmp_path / "cache").get("dotted")
    selected = read_slice(dataset, None, 0, None, None, 10**9)
    assert pa.Table.from_batches(selected.batches, selected.schema)["value"].to_pylist() == [0, 1, 10, 11, 20, 21]
    assert len(cache_files(tmp_path / "cache", "segments/*.arrow")) == 3


def test_cold_take_reads_row_groups_and_builds_the_segment_in_the_background(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=30, files=2, cameras={})
    dataset = make_catalog(root, tmp_path / "cache").get("demo")
    view = oracle(root / "demo", [3, 17, 25])
    indices = [view.num_rows - 1, 0, 5, 5, view.num_rows // 2]
    first = take(dataset, [(3, 3), (17, 17), (25, 25)], indices, None).table
    assert_tables_equal(first, view.take(pa.array(indices)))
    deadline = time.monotonic() + 30
    # Both files were touched: both get built. The sidecar is published a moment before the build is counted.
    while dataset.cache_status()["segments_built"] < 2 or dataset.segments.builds < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    again = take(dataset, [(3, 3), (17, 17), (25, 25)], indices, ["index", "action"]).table
    assert_tables_equal(again, view.take(pa.array(indices)).select(["index", "action"]))
    assert dataset.segments.builds == 2  # the second take read the built segments, building nothing again


def test_cold_reads_over_budget_wait_for_the_build(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=10, files=1, cameras={})
    dataset = make_catalog(root, tmp_path / "cache", cold_read_bytes=1).get("demo")
    view = oracle(root / "demo", None)
    assert_tables_equal(take(dataset, None, [7, 1], None).table, view.take(pa.array([7, 1])))
    assert dataset.segments.builds == 1  # built synchronously: the row groups exceeded the budget


def test_conditional_request_is_answered_without_building_and_never_for_changed_sources(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=12, files=2, cameras={})
    params = {"episodes": "3-5", "columns": "index"}
    with ServerProcess([root], tmp_path / "cache-a") as first:
        etag = httpx.get(f"{first.url}/datasets/demo/rows", params=params).headers["etag"]
    with ServerProcess([root], tmp_path / "cache-b") as second, httpx.Client(base_url=second.url) as http:
        cached = http.get("/datasets/demo/rows", params=params, headers={"If-None-Match": etag})
        assert cached.status_code == 304 and cached.headers["etag"] == etag  # same ETag on another replica
        assert cache_files(tmp_path / "cache-b", "segments/*.arrow") == []  # and nothing was built for it
        source = sorted((root / "demo" / "data").rglob("*.parquet"))[0]
        pq.write_table(pq.read_table(source), source)
        os.utime(source, ns=(time.time_ns(), time.time_ns() + 1_000_000))
        fresh = http.get("/datasets/demo/rows", params=params, headers={"If-None-Match": etag})
        assert fresh.status_code == 200 and fresh.headers["etag"] != etag
        assert_tables_equal(read_stream(fresh.content), oracle(root / "demo", [3, 4, 5]).select(["index"]))


def test_cold_reads_beyond_the_worker_memory_budget_wait_their_turn_and_return_correct_rows(tmp_path: Path) -> None:
    from app.sources import open_source
    from app.store.cold_reads import ColdRows
    from app.store.read_memory import ColdReadMemory, cold_read_memory

    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=12, files=1, cameras={})
    source = sorted((root / "demo").rglob("*.parquet"))[0]
    cold = ColdRows(open_source(root / "demo"), source.relative_to(root / "demo").as_posix())
    one_read = cold.read_memory(np.array([0]), pq.read_schema(source), None)
    dataset = make_catalog(root, tmp_path / "cache", cold_read_memory=max(one_read, 1024 * 1024)).get("demo")
    budget = cold_read_memory(dataset.limits.cold_read_memory)
    view = oracle(root / "demo", None)

    held = threading.Event()
    release = threading.Event()

    def hold_the_budget() -> None:
        with budget.reserve(budget.capacity):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_budget)
    holder.start()
    held.wait(10)
    waits = budget.waits
    result: list[pa.Table] = []
    reader = threading.Thread(target=lambda: result.append(take(dataset, None, [7, 1], None).table))
    reader.start()
    deadline = time.monotonic() + 30
    while budget.waits == waits:  # the cold read found the budget taken and waits
        assert time.monotonic() < deadline and reader.is_alive()
        time.sleep(0.01)
    assert result == []
    release.set()
    reader.join(30)
    holder.join(30)
    assert_tables_equal(result[0], view.take(pa.array([7, 1])))
    eventually(lambda: budget.in_use == 0)  # the segment's build, queued by the cold read, reserves on it too

    solo = ColdReadMemory(100)
    with solo.reserve(10**9):  # bigger than the budget: takes all of it, runs alone, never deadlocks
        assert solo.in_use == 100
    assert solo.in_use == 0 and solo.waits == 0


def _tamper_with_index(cache: Path, swap: tuple[int, int], fix_checksum: bool) -> None:
    """Swap two episode ids in the persisted index, keeping it valid JSON (and, with `fix_checksum`, recomputing
    its checksum the way it is computed, as someone who read the code would)."""
    (path,) = cache_files(cache, "index.json")
    doc = orjson.loads(path.read_bytes())
    a, b = swap
    doc["runs"]["episode"] = [b if e == a else a if e == b else e for e in doc["runs"]["episode"]]
    if fix_checksum:
        content = {k: v for k, v in doc.items() if k != "checksum"}
        doc["checksum"] = "sha256:" + hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    path.write_bytes(orjson.dumps(doc))


@pytest.mark.parametrize("fix_checksum", [False, True], ids=["stale-checksum", "fixed-checksum"])
def test_tampered_index_is_discarded_rebuilt_and_reported_by_verify(tmp_path: Path, fix_checksum: bool) -> None:
    from tests.test_operations import run_cli

    root = tmp_path / "root"
    write_demo_dataset(root / "demo", episodes=20, files=2, cameras={})
    cache = tmp_path / "cache"
    expected = oracle(root / "demo", [10, 11])
    make_catalog(root, cache).get("demo").index()
    _tamper_with_index(cache, (10, 11), fix_checksum)

    with ServerProcess([root], cache) as server:
        response = httpx.get(f"{server.url}/datasets/demo/rows", params={"episodes": "10,11"}, timeout=60)
        assert response.status_code == 200
        assert_tables_equal(read_stream(response.content), expected)
        only_11 = read_stream(httpx.get(f"{server.url}/datasets/demo/rows", params={"episodes": "11"}).content)
        assert set(only_11["episode_index"].to_pylist()) == {11}
    assert "discarding the episode index" in server.log_path.read_text()

    _tamper_with_index(cache, (10, 11), fix_checksum)
    report = run_cli("verify", "--root", str(root), "--cache-dir", str(cache))
    assert report.returncode == 1, report.stderr  # damage found, and repaired: the index is always rebuilt
    if fix_checksum:  # only the sources tell
        assert "index.json: it has episode 10 at rows" in report.stdout
        assert "where the sources say episode 10 at rows" in report.stdout
    else:
        assert "index.json: its checksum does not match its content -> rebuilt" in report.stdout
    assert "-> rebuilt" in report.stdout
    clean = run_cli("verify", "--root", str(root), "--cache-dir", str(cache))
    assert clean.returncode == 0 and "index.json" not in clean.stdout


def test_tampered_index_of_a_generic_dataset_is_found_by_verify_and_never_served_after(tmp_path: Path) -> None:
    from tests.test_operations import run_cli

    root = tmp_path / "root"
    write_generic_dataset(root / "generic")
    cache = tmp_path / "cache"
    make_catalog(root, cache).get("generic").index()
    _tamper_with_index(cache, (1, 7), fix_checksum=False)
    served = read_slice(make_catalog(root, cache).get("generic"), [(1, 1)], 0, None, None, 10**9)
    assert_tables_equal(pa.Table.from_batches(served.batches, served.schema), oracle(root / "generic", [1]))

    _tamper_with_index(cache, (1, 7), fix_checksum=True)  # consistent on its face: only the sources tell
    report = run_cli("verify", "--root", str(root), "--cache-dir", str(cache))
    assert report.returncode == 1, report.stderr
    assert "generic: " in report.stdout and "index.json: it has episode" in report.stdout
    assert "where the sources say" in report.stdout and "-> rebuilt" in report.stdout
    served = read_slice(make_catalog(root, cache).get("generic"), [(1, 1), (7, 7)], 0, None, None, 10**9)
    assert_tables_equal(pa.Table.from_batches(served.batches, served.schema), oracle(root / "generic", [1, 7]))


@pytest.mark.parametrize(
    "damage",
    ["overlap", "past_the_file", "gap", "unknown_file"],
)
def test_index_whose_runs_do_not_tile_the_files_is_rebuilt(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "root"
    write_generic_dataset(root / "generic")
    cache = tmp_path / "cache"
    make_catalog(root, cache).get("generic").index()
    (path,) = cache_files(cache, "index.json")
    doc = orjson.loads(path.read_bytes())
    runs = doc["runs"]
    if damage == "overlap":
        runs["start"][1] -= 1
    elif damage == "past_the_file":
        last = max(range(len(runs["stop"])), key=lambda i: (runs["file"][i], runs["stop"][i]))
        runs["stop"][last] += 5
    elif damage == "gap":
        runs["stop"][0] -= 1
    else:
        runs["file"][0] = 9
    content = {k: v for k, v in doc.items() if k != "checksum"}
    doc["checksum"] = "sha256:" + hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    path.write_bytes(orjson.dumps(doc))

    from app.store.episode_index import read_persisted_index

    index, problem = read_persisted_index(path, "episode_index")
    assert index is None and problem is not None
    served = read_slice(make_catalog(root, cache).get("generic"), None, 0, None, None, 10**9)
    assert_tables_equal(pa.Table.from_batches(served.batches, served.schema), oracle(root / "generic", None))
    assert read_persisted_index(path, "episode_index")[1] is None  # rebuilt

"""A running server notices its dataset's `index.json` changing under it (forged, or rebuilt by `verify`): the
runs the file and the server disagree on are read again from the sources, which settle it; and `verify`'s exit
status says whether it found damage (0 nothing, 1 all of it repaired, 2 some left)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq

from tests.support import ServerProcess, assert_tables_equal, oracle, read_stream, write_generic_dataset
from tests.test_cache import _tamper_with_index, make_catalog
from tests.test_operations import run_cli

LOOK = 0.3  # EPISERVE_RESCAN_INTERVAL_S of these servers: how often they look at their files


def _rows(http: httpx.Client, episodes: str | None) -> httpx.Response:
    params = {"episodes": episodes} if episodes is not None else {}
    return http.get("/datasets/generic/rows", params=params)


def _served_right(http: httpx.Client, root: Path, episodes: list[int]) -> bool:
    response = _rows(http, ",".join(map(str, episodes)))
    assert response.status_code == 200, response.text
    served, expected = read_stream(response.content), oracle(root / "generic", episodes)
    return served.num_rows == expected.num_rows and all(
        served[name].combine_chunks().equals(expected[name].combine_chunks()) for name in expected.column_names
    )


def test_a_forged_index_under_a_running_server_is_never_served_not_even_after_a_reload(tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    write_generic_dataset(root / "generic")
    env = {"EPISERVE_RESCAN_INTERVAL_S": str(LOOK)}
    with ServerProcess([root], cache, env=env) as server, server.client() as http:
        assert _served_right(http, root, [1, 7])
        # Episode labels 1 and 7 swapped, checksum recomputed: consistent on its face.
        _tamper_with_index(cache, (1, 7), fix_checksum=True)
        time.sleep(3 * LOOK)
        # Another file rewritten (same rows): the dataset's index is read again, its unchanged files' runs with it.
        other = root / "generic" / "part-2.parquet"
        pq.write_table(pq.read_table(other), other, row_group_size=3)
        os.utime(other, ns=(time.time_ns(), time.time_ns() + 10**9))
        for _ in range(20):
            time.sleep(LOOK)
            for episodes in ([7], [1], [1, 7], [0, 3, 7, 11]):
                assert _served_right(http, root, episodes), f"wrong rows for episodes {episodes}"
    assert "changed under this process and disagrees with it" in server.log_path.read_text()
    assert run_cli("verify", "--root", str(root), "--cache-dir", str(cache)).returncode == 0  # the forgery is gone


def test_a_server_that_loaded_a_forged_index_serves_the_right_rows_once_verify_rebuilds_it(tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    write_generic_dataset(root / "generic")
    make_catalog(root, cache).get("generic").index()
    _tamper_with_index(cache, (1, 7), fix_checksum=True)  # before the server starts: only the sources tell
    env = {"EPISERVE_RESCAN_INTERVAL_S": str(LOOK), "EPISERVE_LOG_LEVEL": "info"}
    with ServerProcess([root], cache, env=env) as server, server.client() as http:
        assert _rows(http, "7").status_code == 200  # (the forged index is loaded: its runs are what it serves)
        report = run_cli("verify", "--root", str(root), "--cache-dir", str(cache))
        assert report.returncode == 1, report.stdout + report.stderr  # damage found, and all of it repaired
        assert "index.json: it has episode" in report.stdout and "-> rebuilt" in report.stdout
        deadline = time.monotonic() + 10 * LOOK + 2
        while not _served_right(http, root, [7]):
            assert time.monotonic() < deadline, "the running server still serves the forged index"
            time.sleep(0.05)
        for episodes in ([7], [1], [1, 7], None):
            response = _rows(http, ",".join(map(str, episodes)) if episodes else None)
            assert_tables_equal(read_stream(response.content), oracle(root / "generic", episodes))
    clean = run_cli("verify", "--root", str(root), "--cache-dir", str(cache))
    assert clean.returncode == 0 and "0 damaged" in clean.stdout and "index.json" not in clean.stdout


def test_verify_exits_2_while_damage_is_left_and_1_once_it_repaired_all_of_it(tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    write_generic_dataset(root / "generic")
    location = ["--root", str(root), "--cache-dir", str(cache)]
    assert run_cli("warm", "generic", *location).returncode == 0
    assert run_cli("verify", *location).returncode == 0
    segment = sorted(cache.rglob("segments/*.arrow"))[0]
    segment.write_bytes(segment.read_bytes()[:-100])
    left = run_cli("verify", *location)
    assert left.returncode == 2 and "NOT rebuilt" in left.stdout, left.stdout
    _tamper_with_index(cache, (1, 7), fix_checksum=True)
    repaired = run_cli("verify", "--rebuild", *location)
    assert repaired.returncode == 1 and "index.json: it has episode" in repaired.stdout, repaired.stdout
    clean = run_cli("verify", *location)
    assert clean.returncode == 0 and "0 damaged" in clean.stdout
    served = make_catalog(root, cache).get("generic")
    assert [fp.path for fp in served.index().files] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]

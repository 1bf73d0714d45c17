"""Cold reads stay within `EPISERVE_COLD_READ_MEMORY` whatever the row-group size: files of one large row group
each, read cold by many concurrent takes, against a real server's anonymous memory. (A pre-buffered parquet reader
kept every row group it had read until the request ended, outside the budget: 1.1-1.5 GiB with 8 files of 24 MB
and a 256 MiB budget.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support import ServerProcess, rss_anon_with_children

FILES = 6
ROWS_PER_FILE = 24_000  # one row group of ~6.5 MB each
COLD_READ_MEMORY = 48 * 1024 * 1024
TAKE = "/datasets/cold/rows/take"


def _write(root: Path) -> None:
    (root / "cold").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for number in range(FILES):
        ids = np.arange(number * ROWS_PER_FILE, (number + 1) * ROWS_PER_FILE)
        action = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(len(ids) * 64, dtype=np.float32)), 64)
        table = pa.table({"episode_index": ids // 500, "index": ids, "action": action})
        pq.write_table(table, root / "cold" / f"part-{number}.parquet", row_group_size=ROWS_PER_FILE)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    _write(tmp_path / "root")
    env = {"EPISERVE_COLD_READ_MEMORY": str(COLD_READ_MEMORY), "EPISERVE_BUILD_THREADS": "1"}
    with ServerProcess([tmp_path / "root"], tmp_path / "cache", env=env) as running:
        yield running


def test_concurrent_cold_takes_of_large_row_groups_stay_within_the_budget(server: ServerProcess) -> None:
    pid = server.process.pid if server.process else 0
    baseline, peak, wrong = rss_anon_with_children(pid), 0, []
    stop = threading.Event()

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with server.client() as http:
            while not stop.is_set():
                rows = rng.integers(0, FILES * ROWS_PER_FILE, 64).tolist()  # touches every file
                answer = http.post(TAKE, json={"indices": rows, "columns": ["index"]})
                got = pa.ipc.open_stream(answer.content).read_all().column("index").to_pylist()
                if got != rows:
                    wrong.append(rows)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(12)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        peak = max(peak, rss_anon_with_children(pid))
        time.sleep(0.02)
    stop.set()
    for thread in threads:
        thread.join()
    assert not wrong
    assert peak - baseline < 2 * COLD_READ_MEMORY, f"RssAnon grew by {(peak - baseline) / 2**20:.0f} MiB"


def test_a_cold_reader_keeps_nothing_of_a_row_group_it_has_read(tmp_path: Path) -> None:
    """What a read decoded is freed with its table, while the reader (held for the request's whole read) lives."""
    from app.sources.parquet import ParquetRowGroups

    _write(tmp_path)
    reader = ParquetRowGroups(tmp_path / "cold" / "part-0.parquet")
    pool = pa.default_memory_pool()
    before = pool.bytes_allocated()
    table = reader.read([0], pa.schema([pa.field("index", pa.int64()), pa.field("action", pa.list_(pa.float32(), 64))]))
    assert table.num_rows == ROWS_PER_FILE
    del table
    assert pool.bytes_allocated() - before < 1024 * 1024

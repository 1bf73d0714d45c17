"""Cold reads stay within `EPISERVE_COLD_READ_MEMORY` whatever the row-group size: files of one large row group
each, read cold by many concurrent takes while their segments build, against a real server's anonymous memory.

Before, a cold read decoded whole row groups, its estimate left out what the allocator keeps resident, and a build
reserved nothing: with 8 files of one 24 MB row group each, the server's RssAnon grew by 274 MiB against a 256 MiB
budget, and by 173 MiB against 64 MiB (a read larger than the budget runs alone, but whole); by 1.1-1.5 GiB while
local files were read pre-buffered. Now a row group is decoded in pieces of about 1 MiB, and reads and builds both
reserve their estimated resident peak on the budget (86 and 51 MiB)."""

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

MiB = 1024 * 1024
FILES = 8
ROWS_PER_FILE = 24_000  # one row group of ~24 MB each: 64 floats and a 768-byte blob a row
BLOB_BYTES = 768
COLD_READ_MEMORY = 64 * MiB
ALLOWANCE = 32 * MiB  # what else requests in flight hold: threads, connections, parsed bodies, answers
TAKE = "/datasets/cold/rows/take"


def _file(number: int, rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(number * rows, (number + 1) * rows)
    action = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 64, dtype=np.float32)), 64)
    offsets = pa.py_buffer((np.arange(rows + 1, dtype=np.int32) * BLOB_BYTES).tobytes())
    blobs = pa.Array.from_buffers(pa.binary(), rows, [None, offsets, pa.py_buffer(rng.bytes(rows * BLOB_BYTES))])
    return pa.table({"episode_index": ids // 500, "index": ids, "action": action, "blob": blobs})


def _write(root: Path, files: int = FILES, rows: int = ROWS_PER_FILE) -> None:
    (root / "cold").mkdir(parents=True)
    for number in range(files):
        path = root / "cold" / f"part-{number}.parquet"
        pq.write_table(_file(number, rows, number), path, row_group_size=rows)


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    _write(tmp_path / "root")
    env = {"EPISERVE_COLD_READ_MEMORY": str(COLD_READ_MEMORY)}
    with ServerProcess([tmp_path / "root"], tmp_path / "cache", env=env) as running:
        yield running


def test_concurrent_cold_takes_of_24_mb_row_groups_and_their_builds_stay_within_the_budget(
    server: ServerProcess,
) -> None:
    pid = server.process.pid if server.process else 0
    baseline, peak, wrong, answered = rss_anon_with_children(pid), 0, [], [0]
    stop = threading.Event()

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with server.client() as http:
            while not stop.is_set():
                rows = rng.integers(0, FILES * ROWS_PER_FILE, 256).tolist()  # touches every file
                answer = http.post(TAKE, json={"indices": rows})
                table = pa.ipc.open_stream(answer.content).read_all()
                if table.column("index").to_pylist() != rows or table.column("blob").combine_chunks().nbytes < 256:
                    wrong.append(rows)
                answered[0] += 1

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(16)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        peak = max(peak, rss_anon_with_children(pid))
        time.sleep(0.01)
    stop.set()
    for thread in threads:
        thread.join()
    assert not wrong
    assert answered[0] >= 8
    growth = peak - baseline
    assert growth < COLD_READ_MEMORY + ALLOWANCE, f"RssAnon grew by {growth / MiB:.0f} MiB"


def test_a_cold_take_of_a_row_group_larger_than_a_piece_returns_the_rows_asked_for(tmp_path: Path) -> None:
    """A row group of ~10 MB is decoded in three pieces; rows from all of them, in any order and repeated, come
    back as pyarrow reads them, and the read stops at the last wanted row."""
    from app.sources import open_source
    from app.store.cold_reads import ColdRows

    _write(tmp_path, files=1, rows=10_000)
    table = pq.read_table(tmp_path / "cold" / "part-0.parquet")
    cold = ColdRows(open_source(tmp_path / "cold"), "part-0.parquet")
    rows = np.sort(np.random.default_rng(1).integers(0, 10_000, 500))
    rows = np.concatenate([rows[:250], rows[249:]])  # one row twice
    for columns in (None, ["blob", "index"], ["action"]):
        got = cold.take(rows, table.schema, columns)
        want = table.take(pa.array(rows))
        assert got.equals(want if columns is None else want.select(columns))
    assert cold.take(np.array([0, 3]), table.schema, ["index"]).column("index").to_pylist() == [0, 3]


def test_a_cold_reader_keeps_nothing_of_a_row_group_it_has_read(tmp_path: Path) -> None:
    """What a read decoded is freed once its wanted rows are copied out, while the reader (held for the request's
    whole read) lives."""
    from app.sources.parquet import ParquetRowGroups

    _write(tmp_path, files=1)
    reader = ParquetRowGroups(tmp_path / "cold" / "part-0.parquet")
    pool = pa.default_memory_pool()
    before = pool.bytes_allocated()
    wanted = pa.schema([pa.field("index", pa.int64()), pa.field("action", pa.list_(pa.float32(), 64))])
    batches = reader.take([0], wanted, np.arange(0, ROWS_PER_FILE, 1000), 4096)
    assert sum(batch.num_rows for batch in batches) == ROWS_PER_FILE // 1000
    del batches
    assert pool.bytes_allocated() - before < 1024 * 1024

"""Cold reads stay within `EPISERVE_COLD_READ_MEMORY` whatever the row-group size: files of one large row group
each, read cold by many concurrent takes while their segments build, against a real server's anonymous memory.

Before, a cold read decoded whole row groups, its estimate left out what the allocator keeps resident, and a build
reserved nothing: with 8 files of one 24 MB row group each, the server's RssAnon grew by 274 MiB against a 256 MiB
budget, and by 173 MiB against 64 MiB (a read larger than the budget runs alone, but whole); by 1.1-1.5 GiB while
local files were read pre-buffered. Now a row group is decoded in pieces of about 1 MiB, and reads and builds both
reserve their estimated resident peak on the budget (86 and 51 MiB).

From an object store, a row group was fetched and decoded whole, by cold reads and builds alike: one file of one
64 MB row group, read cold by 4 concurrent takes while its segment builds, grew the server's RssAnon by 235 MiB
against a 64 MiB budget. Now a row group larger than a read of several is streamed as a local file's are (60-65
MiB)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support import ServerProcess, read_stream, rss_anon_with_children

MiB = 1024 * 1024
FILES = 8
ROWS_PER_FILE = 24_000  # one row group of ~24 MB each: 64 floats and a 768-byte blob a row
BLOB_BYTES = 768
COLD_READ_MEMORY = 64 * MiB
ALLOWANCE = 32 * MiB  # what else requests in flight hold: threads, connections, parsed bodies, answers
TAKE = "/datasets/cold/rows/take"
STORE_ROWS = 64_000  # one row group of ~64 MB in an object store (moto copies the whole object for each ranged GET)
STORE_CLIENTS = 4  # one cold take each, all at once


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


@pytest.fixture()
def store_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, pa.Table]]:
    """A server over one file of one ~64 MB row group in an object store (moto's S3 server on 127.0.0.1), and the
    file's rows."""
    pytest.importorskip("moto.server", reason="moto (a dev dependency) runs the S3 server of this test")
    from tests.test_object_store import BUCKET, S3Server

    _write(tmp_path / "root", files=1, rows=STORE_ROWS)
    table = pq.read_table(tmp_path / "root" / "cold" / "part-0.parquet")
    s3 = S3Server()
    s3.start()
    try:
        s3.client().create_bucket(Bucket=BUCKET)
        with open(tmp_path / "root" / "cold" / "part-0.parquet", "rb") as body:  # one PUT, not a multipart upload
            s3.client().put_object(Bucket=BUCKET, Key="cold-memory/cold/part-0.parquet", Body=body)
        env = s3.env(EPISERVE_COLD_READ_MEMORY=COLD_READ_MEMORY, EPISERVE_REMOTE_WAIT_S=120)
        with ServerProcess([f"s3://{BUCKET}/cold-memory"], tmp_path / "cache", env=env) as running:
            yield running, table
    finally:
        s3.stop()


def test_concurrent_cold_takes_of_a_64_mb_row_group_from_an_object_store_stay_within_the_budget(
    store_server: tuple[ServerProcess, pa.Table],
) -> None:
    """From an object store too, a row group larger than a read of several is fetched in ranges and decoded in
    pieces, and the build that follows the first read streams it likewise: none of them holds it whole. Measured
    until the segment is built, whose rows are then the same."""
    server, table = store_server
    pid = server.process.pid if server.process else 0
    answers: dict[int, tuple[list[int], httpx.Response]] = {}

    def client(seed: int) -> None:
        rows = np.random.default_rng(seed).integers(0, STORE_ROWS, 256).tolist()  # across the whole row group
        with server.client(timeout=120) as http:
            answers[seed] = (rows, http.post(TAKE, json={"indices": rows}))

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(STORE_CLIENTS)]
    with server.client() as http:
        assert http.get("/datasets/cold").status_code == 200  # the index is loaded: only the reads remain
        assert http.get("/datasets/cold/cache").json()["segments_built"] == 0
        baseline = peak = rss_anon_with_children(pid)
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads) or http.get("/datasets/cold/cache").json()["segments_built"] == 0:
            for _ in range(20):
                peak = max(peak, rss_anon_with_children(pid))
                time.sleep(0.01)
        spread = list(range(0, STORE_ROWS, 16))
        from_segment = read_stream(http.post(TAKE, json={"indices": spread}).content)
    assert len(answers) == STORE_CLIENTS
    for rows, answer in answers.values():
        assert answer.status_code == 200, answer.text
        assert read_stream(answer.content).equals(table.take(rows))
    assert from_segment.equals(table.take(spread))
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

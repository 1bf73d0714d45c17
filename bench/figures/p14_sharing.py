"""P14: one server shared under stress: 64 clients that stop reading mid-response while 8 normal trainers read on.

A dataset of its own (rows of a 256 KiB blob, as parquet images or encoded frames are stored) is served by one
single-worker server with the default in-flight budget (`EPISERVE_MAX_INFLIGHT_BYTES`, 1 GiB). Each trainer is a
process that asks for takes of 24 random rows (6 MiB, answered in the thread pool in two pieces) and checks each
answer's rows. The figure compares:

- the server's RssAnon growth while 64 connections each ask for a take of every row (hundreds of MiB each, more
  than the machine's memory in all) and stop reading after their first MiB, against the budget;
- the 8 trainers' rows/s meanwhile, against the same 8 trainers alone on the same server just before.
"""

from __future__ import annotations

import multiprocessing
import socket
import time
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from bench.context import Context
from bench.memory import RssSampler
from bench.processes import EpiserveServer
from bench.report import Row

STALLED = 64
TRAINERS = 8
TAKE_ROWS = 24
BLOB_BYTES = 256 * 1024
BUDGET = 1024**3
TAKE = "/datasets/blobs/rows/take"


def _blob(row: int) -> bytes:
    return np.random.default_rng(row).integers(0, 256, BLOB_BYTES, dtype=np.uint8).tobytes()


def _write_dataset(root: str, rows: int) -> None:
    """`rows` rows of a 256 KiB blob each (row r's blob from seed r), 40 rows an episode."""
    path = Path(root) / "blobs"
    path.mkdir(parents=True, exist_ok=True)
    step = 200
    writer = None
    for start in range(0, rows, step):
        ids = np.arange(start, min(rows, start + step))
        table = pa.table({"episode_index": ids // 40, "index": ids, "blob": [_blob(int(r)) for r in ids]})
        writer = writer or pq.ParquetWriter(path / "part-0.parquet", table.schema)
        writer.write_table(table, row_group_size=100)
    assert writer is not None
    writer.close()


def _train(url: str, rows: int, seconds: float, seed: int) -> tuple[int, int]:
    """Takes of `TAKE_ROWS` random rows for `seconds`: (rows received, wrong rows)."""
    import httpx

    rng = np.random.default_rng(seed)
    got = wrong = 0
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=120) as http:
        while time.monotonic() < deadline:
            picks = rng.integers(0, rows, TAKE_ROWS).tolist()
            answer = http.post(TAKE, json={"indices": picks, "columns": ["index", "blob"]})
            table = pa.ipc.open_stream(answer.content).read_all()
            wrong += sum(a != b for a, b in zip(table.column("index").to_pylist(), picks, strict=True))
            wrong += table.column("blob")[0].as_py() != _blob(picks[0])
            got += table.num_rows
    return got, wrong


def _trainers(url: str, rows: int, seconds: float) -> tuple[float, int]:
    """`TRAINERS` trainer processes at once: (rows/s in all, wrong rows)."""
    with multiprocessing.get_context("spawn").Pool(TRAINERS) as pool:
        started = time.monotonic()
        results = pool.starmap(_train, [(url, rows, seconds, seed) for seed in range(TRAINERS)])
        elapsed = time.monotonic() - started
    return sum(r[0] for r in results) / max(elapsed, seconds), sum(r[1] for r in results)


def _stall(port: int, rows: int) -> socket.socket:
    """A connection asking for a take of every row that stops reading after its first MiB."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.connect(("127.0.0.1", port))
    body = orjson.dumps({"indices": list(range(rows))})
    head = f"POST {TAKE} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    sock.settimeout(30)
    received = 0
    while received < 1 << 20:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += len(chunk)
    return sock


def run(ctx: Context) -> list[Row]:
    quick = ctx.scale.mode == "quick"
    rows, seconds = (960, 12.0) if quick else (4000, 30.0)
    root = ctx.scratch("p14")
    _write_dataset(str(root / "data"), rows)
    settings = {"EPISERVE_MAX_INFLIGHT_BYTES": str(BUDGET), "EPISERVE_SEND_TIMEOUT_S": str(4 * seconds)}
    server = EpiserveServer(root / "data", root / "cache", ctx.logs, workers=1, settings=settings).start()
    try:
        import httpx

        with httpx.Client(base_url=server.url, timeout=300) as http:  # builds and maps the segment first
            assert http.get("/datasets/blobs/rows", params={"stop": 1}).status_code == 200
        alone, wrong_alone = _trainers(server.url, rows, seconds)
        time.sleep(1.0)
        with RssSampler(server.pid) as memory:
            stalled = [_stall(server.port, rows) for _ in range(STALLED)]
            shared, wrong_shared = _trainers(server.url, rows, seconds)
            for sock in stalled:
                sock.close()
    finally:
        server.stop()
        ctx.drop_scratch("p14")
    answer_mib = rows * BLOB_BYTES / 2**20
    note = (
        f"{STALLED} connections each asking for {answer_mib:.0f} MiB and reading 1 MiB of it; "
        f"{TRAINERS} trainers, takes of {TAKE_ROWS} rows; wrong rows {wrong_alone + wrong_shared}"
    )
    growth = memory.growth / 2**20
    return [
        Row(
            "P14",
            "server RssAnon growth, stalled readers + trainers",
            "MiB",
            round(growth),
            "in-flight budget",
            BUDGET / 2**20,
            "< budget",
            growth < BUDGET / 2**20,
            note,
        ),
        Row(
            "P14",
            "8 trainers' rows/s beside 64 stalled readers",
            "rows/s",
            round(shared),
            "the 8 trainers alone",
            round(alone),
            ">= 0.8x",
            shared >= 0.8 * alone and wrong_alone + wrong_shared == 0,
        ),
    ]

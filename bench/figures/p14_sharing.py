"""P14: one server shared under stress: clients that stop reading mid-response while normal readers read on.

Stored rows: a dataset of its own (rows of a 256 KiB blob, as parquet images or encoded frames are stored) is
served by one single-worker server with the default in-flight budget (`EPISERVE_MAX_INFLIGHT_BYTES`, 1 GiB). Each
trainer is a process that asks for takes of 24 random rows (6 MiB, answered in the thread pool in two pieces) and
checks each answer's rows. The figure compares:

- the server's RssAnon growth while 64 connections each ask for a take of every row (hundreds of MiB each, more
  than the machine's memory in all) and stop reading after their first MiB, against the budget;
- the 8 trainers' rows/s meanwhile, against the same 8 trainers alone on the same server just before.

Camera frames: a demo dataset with one 480x640 camera, its decoded-frame cache warmed (`warm --videos`), and one
without cameras, on another single-worker server with the default budget. 64 connections with a 4 KiB receive
buffer each ask for a take of 560 frames (516 MB) and never read a byte; three normal reader processes (two of
8-frame camera takes, each answer's rows and first frame's drawn label checked, one of 2-row action takes of the
other dataset) read beside them. Whiles alone and beside freshly opened stalled takes alternate (alone, beside,
alone, beside, alone: a shared machine's load drifts, and both sides get their share of it); the figure compares
the readers' mean rows/s beside them against alone, states their slowest 2-row take and the server's CPU per row
on both sides, and the server's RssAnon growth against the budget.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import shutil
import socket
import subprocess
import sys
import time
from multiprocessing.pool import Pool
from pathlib import Path

import numpy as np
import orjson
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from bench.context import Context
from bench.memory import RssSampler, tree_pids
from bench.processes import EpiserveServer, _clean_env, app_dir
from bench.report import Row

STALLED = 64
TRAINERS = 8
TAKE_ROWS = 24
BLOB_BYTES = 256 * 1024
BUDGET = 1024**3
TAKE = "/datasets/blobs/rows/take"
CAMERA = "observation.images.top"
CAMERA_SIZE = (480, 640)
CAMERA_TAKE, ACTION_TAKE = "/datasets/cam480/rows/take", "/datasets/actions/rows/take"
CAMERA_STALLED = 64
CAMERA_STALLED_ROWS = 560  # the stalled take: 516 MB of frames
CAMERA_READERS = 3  # two of 8-frame camera takes, one of 2-row action takes


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
    sock.sendall(_post(TAKE, {"indices": list(range(rows))}))
    sock.settimeout(30)
    received = 0
    while received < 1 << 20:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += len(chunk)
    return sock


def run(ctx: Context) -> list[Row]:
    return [*_stored_rows(ctx), *_camera_frames(ctx)]


def _stored_rows(ctx: Context) -> list[Row]:
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


def _camera_datasets(root: Path) -> Path:
    """`cam480` (one 480x640 camera, 676 frames in 8 episodes, two video files) and `actions` (no cameras),
    written once and reused."""
    from app.demo import write_demo_dataset

    if not (root / "cam480" / "meta/info.json").exists():
        shutil.rmtree(root / "cam480", ignore_errors=True)
        write_demo_dataset(root / "cam480", episodes=8, seed=21, cameras={CAMERA: CAMERA_SIZE}, video_files=2)
    if not (root / "actions" / "meta/info.json").exists():
        shutil.rmtree(root / "actions", ignore_errors=True)
        write_demo_dataset(root / "actions", episodes=4, seed=2, cameras=None)
    return root


def _label(frame: np.ndarray) -> tuple[int, int]:
    """(episode, frame index) drawn into a demo frame (`app.demo_video.camera_frames`): 8x8 cells in raster order,
    16 bits of frame index then 16 of episode, most significant first, white = 1."""
    columns = frame.shape[1] // 8
    bits = "".join(
        str(int(frame[r * 8 + 2 : r * 8 + 6, c * 8 + 2 : c * 8 + 6].mean() > 127.5))
        for r, c in (divmod(cell, columns) for cell in range(32))
    )
    return int(bits[16:], 2), int(bits[:16], 2)


def _read_beside(url: str, seconds: float, role: int, seed: int) -> tuple[int, int, float, float]:
    """One normal reader for `seconds`: 8-frame camera takes (role > 0) or 2-row action takes (role 0). (rows
    received, wrong rows, its slowest take, the seconds it read: from its first request to its last answer)."""
    import httpx

    rng = np.random.default_rng([role, seed])
    got = wrong = 0
    slowest = 0.0
    began = time.monotonic()
    deadline = began + seconds
    with httpx.Client(base_url=url, timeout=300) as http:
        while time.monotonic() < deadline:
            started = time.monotonic()
            if role:
                picks = rng.integers(0, CAMERA_STALLED_ROWS, 8).tolist()
                body = {"indices": picks, "columns": ["index", "episode_index", "frame_index", CAMERA]}
                table = pa.ipc.open_stream(http.post(CAMERA_TAKE, json=body).content).read_all()
                first = table.column(CAMERA).combine_chunks().to_numpy_ndarray()[0]
                located = (table.column("episode_index")[0].as_py(), table.column("frame_index")[0].as_py())
                wrong += table.column("index").to_pylist() != picks or _label(first) != located
            else:
                picks = [3, 1]
                table = pa.ipc.open_stream(http.post(ACTION_TAKE, json={"indices": picks}).content).read_all()
                wrong += table.column("index").to_pylist() != picks
            slowest = max(slowest, time.monotonic() - started)
            got += table.num_rows
    return got, wrong, slowest, time.monotonic() - began


def _readers(pool: Pool, url: str, seconds: float, seed: int) -> tuple[float, int, float]:
    """`CAMERA_READERS` readers at once in `pool`'s processes: (rows/s in all, each reader's rows over the seconds
    it read, so the pool's start-up is not counted; wrong rows; slowest 2-row action take in s)."""
    results = pool.starmap(_read_beside, [(url, seconds, role, seed) for role in range(CAMERA_READERS)])
    return sum(r[0] / r[3] for r in results), sum(r[1] for r in results), results[0][2]


def _cpu_seconds(pid: int) -> float:
    """CPU seconds a process tree (a server and its workers) has used so far."""
    total = 0.0
    for member in tree_pids(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = psutil.Process(member).cpu_times()
            total += times.user + times.system
    return total


def _stall_camera(port: int) -> socket.socket:
    """A connection with a 4 KiB receive buffer asking for a take of 560 frames that never reads a byte."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(_post(CAMERA_TAKE, {"indices": list(range(CAMERA_STALLED_ROWS)), "columns": ["index", CAMERA]}))
    return sock


def _post(path: str, request: dict) -> bytes:
    """A whole HTTP/1.1 POST of `request` as JSON."""
    body = orjson.dumps(request)
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _answered(sock: socket.socket) -> bool:
    """Whether a response head has arrived (peeked at: the connection still reads nothing)."""
    try:
        return sock.recv(12, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"HTTP/1.1 200"
    except BlockingIOError:
        return False


def _camera_frames(ctx: Context) -> list[Row]:
    quick = ctx.scale.mode == "quick"
    seconds = 6.0 if quick else 15.0
    root = _camera_datasets(ctx.workdir / "p14-cameras")
    cache = ctx.scratch("p14-cameras")
    command = [sys.executable, "-m", "app.cli", "warm", "cam480", "--videos", "--root", str(root)]
    with open(ctx.logs / "p14-warm.log", "ab") as log:
        subprocess.run(
            [*command, "--cache-dir", str(cache)], cwd=app_dir(), env=_clean_env(), stdout=log, stderr=log, check=True
        )
    settings = {"EPISERVE_MAX_INFLIGHT_BYTES": str(BUDGET), "EPISERVE_SEND_TIMEOUT_S": str(10 * seconds)}
    server = EpiserveServer(root, cache, ctx.logs, workers=1, settings=settings).start()
    rates: dict[bool, list[float]] = {False: [], True: []}  # stalled takes open or not -> readers' rows/s
    slowest: dict[bool, float] = {False: 0.0, True: 0.0}
    cpu: dict[bool, float] = {False: 0.0, True: 0.0}  # server CPU seconds per row read
    wrong = answered = growth = 0
    try:
        import httpx

        with httpx.Client(base_url=server.url, timeout=300) as http:  # maps the segments
            every = {"indices": list(range(CAMERA_STALLED_ROWS)), "columns": ["index", CAMERA]}
            assert http.post(CAMERA_TAKE, json=every).status_code == 200
        with multiprocessing.get_context("spawn").Pool(CAMERA_READERS) as pool:
            _readers(pool, server.url, 1.0, 0)  # the processes start and import once, unmeasured
            # Alone and beside stalled takes in turn (the stalled ones opened afresh each time): a shared machine's
            # load drifts, and both sides get their share of it.
            for phase, stalled_phase in enumerate((False, True, False, True, False)):
                time.sleep(1.0)
                with RssSampler(server.pid) as memory:
                    stalled = [_stall_camera(server.port) for _ in range(CAMERA_STALLED if stalled_phase else 0)]
                    waited = time.monotonic()
                    while not all(map(_answered, stalled)) and time.monotonic() - waited < 60:
                        time.sleep(0.1)
                    answered = max(answered, sum(map(_answered, stalled)))
                    used = _cpu_seconds(server.pid)
                    rate, wrong_here, slowest_here = _readers(pool, server.url, seconds, phase + 1)
                    cpu[stalled_phase] += (_cpu_seconds(server.pid) - used) / (rate * seconds)
                    for sock in stalled:
                        sock.close()
                rates[stalled_phase].append(rate)
                slowest[stalled_phase] = max(slowest[stalled_phase], slowest_here)
                wrong += wrong_here
                if stalled_phase:
                    growth = max(growth, memory.growth)
    finally:
        server.stop()
        ctx.drop_scratch("p14-cameras")
    alone, shared = float(np.mean(rates[False])), float(np.mean(rates[True]))
    growth_mib = growth / 2**20
    answer_mb = CAMERA_STALLED_ROWS * CAMERA_SIZE[0] * CAMERA_SIZE[1] * 3 / 1e6
    per_row = {side: 1e3 * cpu[side] / len(rates[side]) for side in cpu}
    note = (
        f"{CAMERA_STALLED} connections (4 KiB receive buffer) each asking for {CAMERA_STALLED_ROWS} 480x640 frames "
        f"({answer_mb:.0f} MB) and reading none, {answered} answered; readers: two of 8-frame takes, one of 2-row "
        f"action takes of another dataset, whose slowest took {slowest[True]:.2f} s beside them "
        f"({slowest[False]:.2f} s alone); {seconds:.0f} s whiles alone "
        f"({', '.join(f'{r:.0f}' for r in rates[False])} rows/s) and beside "
        f"({', '.join(f'{r:.0f}' for r in rates[True])}) in turn; server CPU {per_row[True]:.2f} ms a row beside, "
        f"{per_row[False]:.2f} alone; wrong rows {wrong}"
    )
    return [
        Row(
            "P14",
            "server RssAnon growth, stalled camera takes + readers",
            "MiB",
            round(growth_mib),
            "in-flight budget",
            BUDGET / 2**20,
            "< budget",
            growth_mib < BUDGET / 2**20,
        ),
        Row(
            "P14",
            f"3 readers' rows/s beside {CAMERA_STALLED} stalled 560-frame camera takes",
            "rows/s",
            round(shared),
            "the 3 readers alone",
            round(alone),
            ">= 0.8x",
            shared >= 0.8 * alone and wrong == 0 and answered == CAMERA_STALLED,
            note,
        ),
    ]

"""The soak's clients, each a process of its own: trainers that mix slices, takes, windows, camera frames and
object-store takes through the real client; a slow reader that reads large answers at a trickle; and stalling
readers that stop reading mid-response for longer than the server's send timeout.

Every answer is checked against the oracles of `bench.soak_data`; what a client saw comes back as a `Tally`.
"""

from __future__ import annotations

import logging
import random
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from bench.soak_data import (
    CAMERA,
    CAMS_DATASET,
    FPS,
    OBJECT_LENGTHS,
    OBJECTS_DATASET,
    ROWS_DATASET,
    RowsOracle,
    object_view,
    read_label,
)

MIXED_KINDS = {"rows": 0.25, "take": 0.25, "windows": 0.2, "frames": 0.15, "objects": 0.15}
WINDOW_OFFSETS = [-2, -1, 0, 1]  # frames: delta_timestamps of [-0.2, -0.1, 0, 0.1] s at 10 fps
SLOW_ROWS = 1500  # a slow reader's take: about 6 MiB
SLOW_BYTES_PER_S = 2 * 1024 * 1024
STALL_READ_BYTES = 1024 * 1024  # a stalling reader reads this much, then stops
_RETRY = re.compile(r"failed \((\d{3}|[A-Za-z]+)")


@dataclass
class Tally:
    """What one client process saw: requests, rows and wrong rows by kind, 5xx answers by status (retried ones
    included), other errors and retries by kind, stalled reads cut off by the server, and for `objects` the latest
    start of a request answered with the replaced object's old version."""

    requests: Counter[str] = field(default_factory=Counter)
    rows: Counter[str] = field(default_factory=Counter)
    wrong: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)
    cut_off: int = 0
    old_version_last_start: float = 0.0  # time.time() a request answered with version 0 of the replaced object began
    new_version_answers: int = 0

    def merge(self, other: Tally) -> None:
        for name in ("requests", "rows", "wrong", "server_errors", "errors", "retries"):
            getattr(self, name).update(getattr(other, name))
        self.cut_off += other.cut_off
        self.old_version_last_start = max(self.old_version_last_start, other.old_version_last_start)
        self.new_version_answers += other.new_version_answers


class _RetryCounter(logging.Handler):
    """Counts the client's retries (its warnings on the `episerve` logger) by reason: a status or an error class."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(logging.WARNING)
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        found = _RETRY.search(record.getMessage())
        reason = found.group(1) if found else "other"
        self.tally.retries[reason] += 1
        if reason.isdigit() and reason.startswith("5"):
            self.tally.server_errors[reason] += 1


def run_client(role: str, url: str, data: str, seconds: float, seed: int, stall_s: float) -> Tally:
    """One client process: `role` is `mixed`, `slow` or `stall` (whose readers stop reading for `stall_s`); it runs
    for `seconds` (the entry point of a client process)."""
    import episerve

    tally = Tally()
    handler = _RetryCounter(tally)
    logging.getLogger("episerve").addHandler(handler)
    deadline = time.monotonic() + seconds
    oracle = RowsOracle.read(sorted((Path(data) / ROWS_DATASET).glob("*.parquet")))
    if role == "stall":
        threads = [
            threading.Thread(target=_stall, args=(url, oracle, deadline, stall_s, seed + n, tally)) for n in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return tally
    rng = random.Random(seed)
    cams = RowsOracle.read(sorted((Path(data) / CAMS_DATASET / "data").rglob("*.parquet")))
    retries = episerve.Retries(attempts=40, deadline=180.0)
    with episerve.Client(url, retries=retries, timeout=180.0) as client:
        while time.monotonic() < deadline:
            kind = "slow" if role == "slow" else rng.choices(list(MIXED_KINDS), list(MIXED_KINDS.values()))[0]
            try:
                if kind == "rows":
                    _rows(client, oracle, rng, tally)
                elif kind == "take":
                    _take(client, oracle, rng, tally)
                elif kind == "windows":
                    _windows(client, oracle, rng, tally)
                elif kind == "frames":
                    _frames(client, cams, rng, tally)
                elif kind == "objects":
                    _objects(client, rng, tally)
                else:
                    _slow(url, oracle, rng, tally)
            except episerve.ServerError as exc:
                if exc.status >= 500:
                    tally.server_errors[str(exc.status)] += 1
                else:
                    tally.errors[f"{kind}: {exc.status} {exc.title}"] += 1
            except Exception as exc:  # whatever a client can meet: counted by kind, the run goes on
                tally.errors[f"{kind}: {type(exc).__name__}"] += 1
    logging.getLogger("episerve").removeHandler(handler)
    return tally


def _count(tally: Tally, kind: str, rows: int, wrong: int) -> None:
    tally.requests[kind] += 1
    tally.rows[kind] += rows
    tally.wrong[kind] += wrong


def _wrong_rows(got: pa.Table, want: pa.Table) -> int:
    """Rows of `got` that differ from `want` in any column (all of them when the shapes differ)."""
    if got.num_rows != want.num_rows or got.column_names != want.column_names:
        return max(got.num_rows, want.num_rows)
    bad = np.zeros(got.num_rows, dtype=bool)
    for name in want.column_names:
        a, b = got[name].combine_chunks(), want[name].combine_chunks()
        if not a.equals(b):
            bad |= np.array([x != y for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)])
    return int(bad.sum())


_COLUMN_PICKS = [None, ["episode_index", "frame_index", "action"], ["index", "blob"], ["blob", "episode_index"]]


def _rows(client, oracle: RowsOracle, rng: random.Random, tally: Tally) -> None:
    """A slice of the view of a few episodes, some columns."""
    episodes = rng.sample(range(oracle.episodes), rng.randint(1, 4))
    view = oracle.view(episodes)
    start = rng.randrange(len(view))
    stop = rng.randint(start, len(view))
    columns = rng.choice(_COLUMN_PICKS)
    got = client.rows(ROWS_DATASET, episodes=episodes, start=start, stop=stop, columns=columns)
    want = oracle.table.take(pa.array(view[start:stop]))
    want = want if columns is None else want.select(columns)
    _count(tally, "rows", got.num_rows, _wrong_rows(got, want))


def _take(client, oracle: RowsOracle, rng: random.Random, tally: Tally) -> None:
    """256 random rows of every episode's view, in the order asked (duplicates allowed)."""
    indices = [rng.randrange(oracle.table.num_rows) for _ in range(256)]
    columns = rng.choice(_COLUMN_PICKS)
    got = client.take(ROWS_DATASET, indices, columns=columns)
    want = oracle.table.take(pa.array(indices))
    want = want if columns is None else want.select(columns)
    _count(tally, "take", got.num_rows, _wrong_rows(got, want))


def _windows(client, oracle: RowsOracle, rng: random.Random, tally: Tally) -> None:
    """64 random rows with `action` windows (LeRobot's `delta_timestamps`), against the clamped reference."""
    indices = np.array([rng.randrange(oracle.table.num_rows) for _ in range(64)])
    deltas = [offset / FPS for offset in WINDOW_OFFSETS]
    got = client.take(ROWS_DATASET, indices, columns=["index", "action"], delta_timestamps={"action": deltas})
    targets, pad = oracle.windows(indices, WINDOW_OFFSETS)
    actions = oracle.table["action"].combine_chunks().flatten().to_numpy().reshape(-1, 8)
    want_action = actions[targets]
    got_action = got["action"].combine_chunks().flatten().flatten().to_numpy().reshape(len(indices), -1, 8)
    got_pad = np.array(got["action_is_pad"].to_pylist(), dtype=bool)
    wrong = got["index"].to_numpy() != oracle.table["index"].to_numpy()[indices]
    if got_action.shape == want_action.shape and got_pad.shape == pad.shape:
        wrong |= (got_action != want_action).any(axis=(1, 2)) | (got_pad != pad).any(axis=1)
    else:
        wrong[:] = True
    _count(tally, "windows", got.num_rows, int(wrong.sum()))


def _frames(client, cams: RowsOracle, rng: random.Random, tally: Tally) -> None:
    """32 random rows of the camera dataset: each frame's drawn label must name its row."""
    indices = [rng.randrange(cams.table.num_rows) for _ in range(32)]
    got = client.take(CAMS_DATASET, indices, columns=["episode_index", "frame_index", CAMERA])
    want = cams.table.take(pa.array(indices))
    frames = got[CAMERA].combine_chunks().to_numpy_ndarray()
    wanted = list(zip(want["episode_index"].to_pylist(), want["frame_index"].to_pylist(), strict=True))
    found = list(zip(got["episode_index"].to_pylist(), got["frame_index"].to_pylist(), strict=True))
    labels = [read_label(frame) for frame in frames]
    wrong = sum(a != b or b != c for a, b, c in zip(found, wanted, labels, strict=True)) if len(found) == 32 else 32
    _count(tally, "frames", got.num_rows, wrong)


def _objects(client, rng: random.Random, tally: Tally) -> None:
    """A take from the object store: the (episode, frame) of each view position, whatever the version; one version
    of the replaced object per answer."""
    episodes = sorted(rng.sample(sorted(OBJECT_LENGTHS), rng.randint(1, 4)))
    view = object_view(episodes)
    indices = sorted(rng.sample(range(len(view)), min(len(view), rng.randint(1, 120))))
    started = time.time()
    got = client.take(OBJECTS_DATASET, indices, episodes=episodes)
    expected = [view[i] for i in indices]
    found = list(zip(got["episode_index"].to_pylist(), got["frame_index"].to_pylist(), strict=True))
    values = got["value"].to_pylist()
    wrong = sum(f != e or v != f[0] * 1000 + f[1] for f, e, v in zip(found, expected, values, strict=True))
    wrong += abs(len(found) - len(expected))
    versions = {v for (e, _), v in zip(found, got["version"].to_pylist(), strict=True) if e >= 4}
    if len(versions) > 1:
        wrong += len(found)  # rows of two versions of one object in one answer
    elif versions == {0}:
        tally.old_version_last_start = max(tally.old_version_last_start, started)
    elif versions == {1}:
        tally.new_version_answers += 1
    _count(tally, "objects", len(found), wrong)


def _slow(url: str, oracle: RowsOracle, rng: random.Random, tally: Tally) -> None:
    """A take of `SLOW_ROWS` rows read at `SLOW_BYTES_PER_S` (never pausing as long as the send timeout); a dropped
    connection is retried, as the client retries it."""
    import httpx

    indices = [rng.randrange(oracle.table.num_rows) for _ in range(SLOW_ROWS)]
    for attempt in range(_SLOW_ATTEMPTS):
        try:
            body = _read_slowly(url, indices, tally)
            break
        except httpx.TransportError as exc:
            if attempt == _SLOW_ATTEMPTS - 1:
                raise
            tally.retries[type(exc).__name__] += 1
            time.sleep(0.5)
    if body is None:
        return
    got = pa.ipc.open_stream(body).read_all()
    _count(tally, "slow", got.num_rows, _wrong_rows(got, oracle.table.take(pa.array(indices))))


_SLOW_ATTEMPTS = 5


def _read_slowly(url: str, indices: list[int], tally: Tally) -> bytes | None:
    """The body of a take of `indices`, read at `SLOW_BYTES_PER_S`; None (counted) for an error status."""
    import httpx

    body = bytearray()
    with (
        httpx.Client(base_url=url, timeout=180.0) as http,
        http.stream("POST", f"/datasets/{ROWS_DATASET}/rows/take", json={"indices": indices}) as answer,
    ):
        if answer.status_code != 200:
            counter = tally.server_errors if answer.status_code >= 500 else tally.errors
            counter[str(answer.status_code) if answer.status_code >= 500 else f"slow: {answer.status_code}"] += 1
            return None
        started = time.monotonic()
        for chunk in answer.iter_raw(256 * 1024):
            body += chunk
            ahead = len(body) / SLOW_BYTES_PER_S - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    return bytes(body)


def _stall(url: str, oracle: RowsOracle, deadline: float, stall_s: float, seed: int, tally: Tally) -> None:
    """Ask for a take of 100,000 rows (about 400 MiB), read `STALL_READ_BYTES` of it, stop reading for `stall_s`
    (longer than the server's send timeout), then read on: the server must have cut the connection off, its answer
    incomplete (and meanwhile held no more than one piece of it)."""
    rng = random.Random(seed)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    while time.monotonic() + stall_s + 5 < deadline:
        indices = [rng.randrange(oracle.table.num_rows) for _ in range(100_000)]
        body = orjson.dumps({"indices": indices, "columns": ["index", "blob"]})
        head = (
            f"POST /datasets/{ROWS_DATASET}/rows/take HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock = None
        try:
            sock = socket.create_connection((host, int(port)), timeout=120)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.sendall(head + body)
            status = _received(sock, STALL_READ_BYTES)[9:12].decode(errors="replace")
            if not status:
                raise ConnectionResetError("closed before an answer")
        except OSError as exc:  # no answer to stall on (a worker replaced meanwhile): try again, counted
            if sock is not None:
                sock.close()
            with _STALL_LOCK:
                tally.retries[f"stall: {type(exc).__name__}"] += 1
            time.sleep(0.5)
            continue
        time.sleep(stall_s)
        try:
            ended = _received(sock, None).endswith(b"0\r\n\r\n")  # the chunked answer's last chunk
        except OSError:  # reset by the server: cut off
            ended = False
        finally:
            sock.close()
        with _STALL_LOCK:
            tally.requests["stall"] += 1
            if status.startswith("5"):
                tally.server_errors[status] += 1
            elif status != "200":
                tally.errors[f"stall: {status}"] += 1
            elif ended:
                tally.errors["stall: answered whole after a stall longer than the send timeout"] += 1
            else:
                tally.cut_off += 1


_STALL_LOCK = threading.Lock()


def _received(sock: socket.socket, limit: int | None) -> bytes:
    """Bytes from `sock` until `limit` (None: until the connection ends)."""
    chunks, size = [], 0
    while limit is None or size < limit:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)

"""Test support: real servers in subprocesses, source datasets on disk, and the pyarrow oracle."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`episerve-server serve` on 127.0.0.1 and a free port, in its own process."""

    def __init__(
        self, roots: Sequence[Path], cache_dir: Path, workers: int = 1, env: dict[str, str] | None = None
    ) -> None:
        self.roots = list(roots)
        self.cache_dir = cache_dir
        self.workers = workers
        self.env = env or {}
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = cache_dir.parent / f"{cache_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout: float = 60.0) -> httpx.Client:
        """An HTTP client of this server, patient enough for a first request on a busy machine (httpx's default
        is 5 s)."""
        return httpx.Client(base_url=self.url, timeout=timeout)

    def start(self, timeout: float = 60.0) -> ServerProcess:
        self.port = free_port()
        command = [sys.executable, "-m", "app.cli", "serve", "--cache-dir", str(self.cache_dir)]
        for root in self.roots:
            command += ["--root", str(root)]
        command += ["--port", str(self.port), "--workers", str(self.workers)]
        if "EPISERVE_LOG_LEVEL" not in self.env:
            command += ["--log-level", "warning"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")} | self.env
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if self._await_ready(timeout):
            return self
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log_path.read_text()}")

    def _await_ready(self, timeout: float) -> bool:
        """Poll `/readyz` until it answers 200 (True) or `timeout` passes (False); raise if the server exits. One
        client for every poll: a new one costs tens of milliseconds of CPU (its TLS context), on every poll."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=1.0) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log_path.read_text()}")
                try:
                    if http.get("/readyz").status_code == 200:
                        return True
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server and its workers (SIGKILL kills the whole process group at once)."""
        if self.process is not None and self.process.poll() is None:
            if sig == signal.SIGKILL:
                os.killpg(self.process.pid, signal.SIGKILL)
            else:
                self.process.send_signal(sig)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # orphaned workers, if any
        self.process = None

    def pids(self) -> list[int]:
        """The server's process and its descendants: the fork server its workers are forked from, the workers,
        multiprocessing's resource tracker."""
        if self.process is None:
            return []
        return [self.process.pid, *_descendants(self.process.pid)]

    def worker_pids(self) -> set[int]:
        """The server's worker processes: the children of its fork server that hold the listening socket (the fork
        server itself holds it only for a moment, while it forks a worker)."""
        if self.process is None:
            return set()
        listening = f"socket:[{_listening_inode(self.port)}]"
        children = _children(self.process.pid)
        forked = [pid for child in children for pid in _children(child)]
        return {pid for pid in forked if listening in _open_files(pid)}

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def session_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temporary directory, shared by all its xdist workers (each has its own below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def written_once(tmp_path_factory: pytest.TempPathFactory, name: str, write: Callable[[Path], object]) -> Path:
    """The directory `name` of the session's directory, filled by `write` once per session by whichever xdist
    worker asks first (the others wait for it): read what is in it, never change it."""
    base = session_directory(tmp_path_factory)
    path, done = base / name, base / f"{name}.complete"
    with FileLock(str(base / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)  # half-written by a worker that was interrupted
            path.mkdir()
            write(path)
            done.touch()
    return path


def read_stream(body: bytes) -> pa.Table:
    return pa.ipc.open_stream(body).read_all()


def source_files(dataset: Path) -> list[Path]:
    """Source parquet files in stored order: LeRobot's data/ tree, or every parquet file, sorted by path."""
    base = dataset / "data" if (dataset / "meta/info.json").exists() else dataset
    return sorted(p for p in base.rglob("*.parquet") if "meta" not in p.relative_to(dataset).parts)


def oracle(dataset: Path, episodes: Iterable[int] | None, column: str = "episode_index") -> pa.Table:
    """What the server must return: rows of the picked episodes, ascending episode, then stored order."""
    table = pa.concat_tables([pq.read_table(p) for p in source_files(dataset)], promote_options="permissive")
    if episodes is None:
        picked = np.arange(table.num_rows)
    else:
        wanted = np.isin(table[column].to_numpy(), np.fromiter(set(episodes), dtype=np.int64))
        picked = np.flatnonzero(wanted)
    order = picked[np.argsort(table[column].to_numpy()[picked], kind="stable")]
    return table.take(pa.array(order, type=pa.int64()))


def assert_tables_equal(actual: pa.Table, expected: pa.Table) -> None:
    """Same column names, types and values, in the same row order."""
    assert actual.column_names == expected.column_names
    assert actual.num_rows == expected.num_rows
    for name in expected.column_names:
        got, want = actual[name].combine_chunks(), expected[name].combine_chunks()
        assert got.type == want.type, name
        assert got.equals(want), f"column {name!r} differs"


def write_generic_dataset(path: Path) -> Path:
    """Plain parquet files (no LeRobot metadata) whose episodes are interleaved and span files; 10 fps."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(7)
    layouts = {
        "part-0.parquet": [3, 3, 1, 1, 1, 7],
        "part-1.parquet": [7, 7, 0, 0, 3, 11, 11],
        "part-2.parquet": [2, 2, 2, 9, 1],
    }
    counter = 0
    for name, ids in layouts.items():
        n = len(ids)
        table = pa.table(
            {
                "episode_index": pa.array(ids, pa.int64()),
                "value": pa.array(np.arange(counter, counter + n), pa.int64()),
                "reading": pa.array(rng.normal(size=n).astype(np.float32)),
                "vec": pa.array(
                    [rng.normal(size=int(rng.integers(0, 4))).tolist() for _ in range(n)], pa.list_(pa.float64())
                ),
                "label": pa.array([f"row-{counter + i}" for i in range(n)]),
            }
        )
        pq.write_table(table, path / name, row_group_size=3)
        counter += n
    (path / "episerve.json").write_text('{"fps": 10}')
    return path


def write_nullable_dataset(path: Path) -> Path:
    """One parquet file whose columns have nulls: `pose` (fixed-size lists) null every third row, `reading`,
    `count` and `flag` (float, integer, boolean) every fourth."""
    path.mkdir(parents=True)
    rows = 12
    values = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    pose = pa.array([None if i % 3 == 1 else values[i].tolist() for i in range(rows)], pa.list_(pa.float32(), 3))
    every_fourth = np.arange(rows) % 4 == 2
    table = pa.table(
        {
            "episode_index": pa.array(np.arange(rows) // 4, pa.int64()),
            "pose": pose,
            "reading": pa.array(np.arange(rows) / 2, pa.float64(), mask=every_fourth),
            "count": pa.array(np.arange(rows) * 3, pa.int32(), mask=every_fourth),
            "flag": pa.array(np.arange(rows) % 3 == 0, pa.bool_(), mask=every_fourth),
            "step": np.arange(rows),
        }
    )
    pq.write_table(table, path / "part-0.parquet", row_group_size=5)
    return path


def write_plain_dataset(path: Path) -> Path:
    """Parquet files with no episode column: one big episode."""
    path.mkdir(parents=True)
    for part in range(2):
        values = np.arange(part * 10, part * 10 + 10)
        pq.write_table(pa.table({"x": values, "y": values * 2.0}), path / f"chunk-{part}.parquet")
    return path


def eventually(check: Callable[[], bool], seconds: float = 15.0) -> None:
    """Wait until `check()` holds (polling every 0.1 s); fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.1)


def rss_anon_with_children(pid: int) -> int:
    """`RssAnon` of process `pid` and its descendants (a server's supervised workers), in bytes."""
    total = 0
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            total = next((int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:")), 0)
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as children:
            return total + sum(rss_anon_with_children(int(child)) for child in children.read().split())
    except (FileNotFoundError, ProcessLookupError):
        return total


def killed_mid_frame_build(
    build: Callable[[str], object], caches: Path, partial_bytes: int, attempts: int = 5, store: str = "frames"
) -> Path:
    """A cache directory whose frame-segment build was killed with SIGKILL midway: `build(cache)` runs in a fresh
    (spawned) process and is killed once its segment's temporary file (in the dataset cache's `store` directory:
    `frames`, or `hot-frames` for a hot pixel segment) holds `partial_bytes`; tried in `caches/cache-<n>` until a
    kill leaves a partial file and nothing published."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    for attempt in range(attempts):
        cache = caches / f"cache-{attempt}"
        process = context.Process(target=build, args=(str(cache),))
        process.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.is_alive():
            partial = list(cache.rglob(f"{store}/*.arrow.tmp"))
            if partial and partial[0].exists() and partial[0].stat().st_size > partial_bytes:
                break
            time.sleep(0.001)
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        if list(cache.rglob(f"{store}/*.arrow.tmp")) and not list(cache.rglob(f"{store}/*.json")):
            return cache
    raise AssertionError(f"could not kill the builder mid-build in {attempts} attempts")


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:  # gone meanwhile
        return []


def _descendants(pid: int) -> list[int]:
    return [pid for child in _children(pid) for pid in (child, *_descendants(child))]


def _open_files(pid: int) -> set[str]:
    """What the file descriptors of process `pid` point to (`socket:[inode]` for a socket)."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed meanwhile
                found.add(os.readlink(fd))
    return found


def _listening_inode(port: int) -> int:
    """The inode of the socket listening on 127.0.0.1:`port` (from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":  # local address, state LISTEN
            return int(fields[9])
    raise LookupError(f"nothing listens on 127.0.0.1:{port}")

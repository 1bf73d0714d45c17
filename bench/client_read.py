"""Client read throughput: `episerve.Client.rows` against httpx's default body reading, a raw-socket reader and
TCP loopback, on the same contiguous `/rows` responses (P1 in targets.md), all in one run.

    python -m bench.client_read [--mode quick|full] [--root DIR] [--repeats N]

Generates (or reuses) the benchmark datasets under `--root`, starts a server on a free port, and prints GB/s of
Arrow bytes landed in a `pyarrow.Table` (median of repeats) and each reader's ratio to loopback.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pyarrow as pa

import episerve
from bench.access import SocketAccess
from bench.config import MODES
from bench.datasets import ensure_dataset
from bench.processes import EpiserveServer


def loopback_gbps(nbytes: int, repeats: int) -> float:
    """TCP loopback ceiling: one thread sends a ready buffer, this one `recv_into`s a reused buffer."""
    payload = memoryview(bytearray(nbytes))
    target = memoryview(bytearray(nbytes))
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def send() -> None:
            conn, _ = server.accept()
            with conn:
                for _ in range(repeats):
                    conn.recv(1)
                    conn.sendall(payload)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        times = []
        with socket.create_connection(("127.0.0.1", port)) as sock:
            for _ in range(repeats):
                start = time.perf_counter()
                sock.sendall(b"x")
                position = 0
                while position < nbytes:
                    position += sock.recv_into(target[position:])
                times.append(time.perf_counter() - start)
        sender.join()
    return nbytes / statistics.median(times) / 1e9


def measure(read: Callable[[], pa.Table], repeats: int) -> tuple[float, int]:
    read()  # warm: cache segments, connections, page cache
    times, nbytes = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        table = read()
        times.append(time.perf_counter() - start)
        nbytes = table.nbytes
        del table
    return nbytes / statistics.median(times) / 1e9, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=sorted(MODES), default="quick")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "episerve-bench-data")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--workers", type=int, default=1, help="server worker processes")
    args = parser.parse_args()
    scale = MODES[args.mode]
    sizes = {"vector": scale.vector, "image": scale.image}
    for size in sizes.values():
        ensure_dataset(args.root, size)
    with tempfile.TemporaryDirectory() as scratch:
        server = EpiserveServer(args.root, Path(scratch) / "cache", Path(scratch), workers=args.workers)
        with server:
            client = episerve.Client(server.url)
            naive = httpx.Client(base_url=server.url, timeout=120)
            for name, rows in scale.p1_rows.items():
                raw = SocketAccess(server.url)  # fresh: the server closes connections idle for a few seconds
                params = {"start": 0, "stop": rows}
                readers: dict[str, Callable[[], pa.Table]] = {
                    "httpx .get().content": lambda n=name, p=params: pa.ipc.open_stream(
                        naive.get(f"/datasets/{n}/rows", params=p).content
                    ).read_all(),
                    "episerve.Client.rows": lambda n=name, r=rows: client.rows(n, start=0, stop=r),
                    "raw socket, reused buffer": lambda n=name, r=rows, s=raw: s.rows(n, 0, r),
                }
                results = {label: measure(read, args.repeats) for label, read in readers.items()}
                nbytes = next(iter(results.values()))[1]
                ceiling = loopback_gbps(nbytes, args.repeats)
                print(f"\n{name}: {rows} rows, {nbytes / 1e6:.1f} MB per response, server workers={args.workers}")
                print(f"  {'TCP loopback (ceiling)':28s} {ceiling:6.2f} GB/s")
                for label, (gbps, _) in results.items():
                    print(f"  {label:28s} {gbps:6.2f} GB/s  {gbps / ceiling:5.2f}x loopback")
                raw.close()
            client.close()
            naive.close()


if __name__ == "__main__":
    main()

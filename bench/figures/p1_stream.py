"""P1: a contiguous `/rows` range streamed into a `pyarrow.Table`, in MB/s of Arrow IPC stream.

Every reader fetches the same ranges (different starts per repeat, each read once untimed first so the page
cache is warm for all), interleaved round-robin so drift on a shared machine hits all of them alike. The byte
count of each range is its exact IPC stream size, the same for every reader; the loopback ceiling receives that
many bytes with no protocol at all.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from bench.access import HttpxAccess, SocketAccess
from bench.context import Context
from bench.peers.flight import FlightReader
from bench.peers.ipc import MmapTable
from bench.peers.loopback import LoopbackReader
from bench.report import Row
from bench.timing import median, timed


def stream_bytes(table: pa.Table) -> int:
    """Exact size of `table` as an Arrow IPC stream."""
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.size()


def _measure(readers: dict[str, Callable[[int], object]], starts: list[int], sizes: dict[int, int]) -> dict:
    """Median MB/s per reader over `starts`, round-robin."""
    for read in readers.values():
        for start in starts:
            read(start)  # warm the page cache and the connections
    speeds: dict[str, list[float]] = {name: [] for name in readers}
    for start in starts:
        for name, read in readers.items():
            speeds[name].append(sizes[start] / timed(lambda read=read, start=start: read(start)) / 1e6)
    return {name: median(values) for name, values in speeds.items()}


def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    access = ctx.access()
    socket_reader = SocketAccess(ctx.server.url)  # type: ignore[union-attr]
    httpx_reader = HttpxAccess(ctx.server.url)  # type: ignore[union-attr]
    flight = FlightReader(ctx.flight_port)
    loopback = LoopbackReader(ctx.loopback_port)
    try:
        for name in ("vector", "image"):
            dataset = ctx.datasets[name]
            count = min(ctx.scale.p1_rows[name], dataset.rows)
            rng = np.random.default_rng(11)
            starts = sorted(rng.integers(0, dataset.rows - count + 1, size=ctx.scale.p1_repeats).tolist())
            local = MmapTable(ctx.ipc[name])
            sizes = {s: stream_bytes(local.slice(s, s + count)) for s in starts}
            del local

            def span(reader: object, name: str = name, count: int = count) -> Callable[[int], object]:
                return lambda start: reader.rows(name, start, start + count)  # type: ignore[attr-defined]

            speeds = _measure(
                {
                    "episerve": span(access),
                    "socket": span(socket_reader),
                    "httpx": span(httpx_reader),
                    "flight": span(flight),
                    "loopback": lambda start, sizes=sizes: loopback.read(sizes[start]),
                },
                starts,
                sizes,
            )
            case = f"{name}, {count:,}-row range"
            mb = f"MB/s ({sizes[starts[0]] / 1e6:.0f} MB)"
            ours = speeds["episerve"]
            ratio_flight, ratio_loop = ours / speeds["flight"], ours / speeds["loopback"]
            rows += [
                Row("P1", case, mb, ours, "Arrow Flight", speeds["flight"], "≥ 1.5x", ratio_flight >= 1.5),
                Row("P1", case, mb, ours, "TCP loopback ceiling", speeds["loopback"], "≥ 0.8x", ratio_loop >= 0.8),
                Row("P1", case, mb, ours, "same server, raw-socket reader", speeds["socket"], "info"),
                Row("P1", case, mb, ours, "same server, httpx default read", speeds["httpx"], "info"),
            ]
    finally:
        for reader in (access, socket_reader, httpx_reader, flight, loopback):
            reader.close()
    return rows

"""P2: random 256-row takes from 1 and from 8 concurrent clients: rows/s and p50/p99 latency.

Each client is its own process (as DataLoader workers or separate trainers would be), started and connected
before the clock starts; all clients of a cell start at the same instant and issue takes of fresh uniformly
random indices back to back for a fixed time. rows/s = all rows delivered ÷ wall time of the cell. Every cell is
measured `Scale.rounds` times, peers interleaved; the table shows the median of each figure and, in the ratio
rows' notes, the range of the per-round ratios.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.context import Context
from bench.report import Row
from bench.timing import in_rounds, medians, percentile, ratio_spread

CONCURRENCY = (1, 8)


@dataclass(frozen=True)
class ClientSpec:
    """How a client process reaches one peer: `kind` is episerve, flight or hf."""

    kind: str
    dataset: str
    rows: int
    url: str = ""
    port: int = 0
    data_root: str = ""
    hf_home: str = ""
    hf_cache: str = ""


_clients: dict[ClientSpec, Any] = {}


def _client(spec: ClientSpec) -> Any:
    """A take function for `spec`, created once per process."""
    if spec not in _clients:
        if spec.kind == "episerve":
            from bench.access import best_access

            access = best_access(spec.url)
            _clients[spec] = lambda ids: access.take(spec.dataset, ids)
        elif spec.kind == "flight":
            from bench.peers.flight import FlightReader

            flight = FlightReader(spec.port)
            _clients[spec] = lambda ids: flight.take(spec.dataset, ids)
        else:
            from bench.peers import hf

            hf.configure_offline(Path(spec.hf_home))
            from bench.datasets import describe

            loaded = hf.load(describe(Path(spec.data_root), spec.dataset), Path(spec.hf_cache)).with_format("torch")
            _clients[spec] = lambda ids: loaded[ids]
    return _clients[spec]


def _session(spec: ClientSpec, batch: int, barrier: Any, seconds: float, seed: int) -> tuple[list[float], float, float]:
    """Takes issued back to back for `seconds` once every client is ready; latencies, start and end times."""
    take = _client(spec)
    rng = np.random.default_rng(seed)
    take(rng.integers(0, spec.rows, size=batch).tolist())  # warm the connection and this process
    latencies: list[float] = []
    barrier.wait()
    started = time.time()
    while time.time() < started + seconds:
        ids = rng.integers(0, spec.rows, size=batch).tolist()
        began = time.perf_counter()
        take(ids)
        latencies.append(time.perf_counter() - began)
    return latencies, started, time.time()


def _cell(spec: ClientSpec, *, pool: Any, manager: Any, clients: int, batch: int, seconds: float) -> dict[str, float]:
    barrier = manager.Barrier(clients)
    jobs = [pool.apply_async(_session, (spec, batch, barrier, seconds, 100 + i)) for i in range(clients)]
    results = [job.get(timeout=seconds + 600) for job in jobs]
    latencies = [lat for lats, _, _ in results for lat in lats]
    wall = max(end for _, _, end in results) - min(start for _, start, _ in results)
    return {
        "rows_per_s": len(latencies) * batch / max(wall, 1e-9),
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
    }


def run(ctx: Context) -> list[Row]:
    assert ctx.server is not None
    batch, seconds = ctx.scale.p2_batch, ctx.scale.p2_seconds
    rows: list[Row] = []
    context = mp.get_context("spawn")
    with context.Manager() as manager, context.Pool(max(CONCURRENCY)) as pool:
        for name in ("vector", "image"):
            dataset = ctx.datasets[name]
            common = {"dataset": name, "rows": dataset.rows}
            specs = {
                "episerve": ClientSpec("episerve", url=ctx.server.url, **common),
                "flight": ClientSpec("flight", port=ctx.flight_port, **common),
                "hf": ClientSpec(
                    "hf",
                    data_root=str(ctx.data_root),
                    hf_home=str(ctx.workdir / "hf-home"),
                    hf_cache=str(ctx.hf_cache),
                    **common,
                ),
            }
            for clients in CONCURRENCY:
                cell = partial(_cell, pool=pool, manager=manager, clients=clients, batch=batch, seconds=seconds)
                by_spec = in_rounds(cell, list(specs.values()), ctx.scale.rounds)
                rounds = {kind: by_spec[spec] for kind, spec in specs.items()}
                ours, flight, hf = (medians(rounds[kind]) for kind in ("episerve", "flight", "hf"))
                case = f"{name}, {batch}-row take, {clients} client{'s' if clients > 1 else ''}"
                tail = ours["p99_ms"] / ours["p50_ms"]
                rows += [
                    Row(
                        "P2",
                        case,
                        "rows/s",
                        ours["rows_per_s"],
                        "Arrow Flight",
                        flight["rows_per_s"],
                        "≥ 1.2x",
                        ours["rows_per_s"] >= 1.2 * flight["rows_per_s"],
                        ratio_spread(rounds["episerve"], rounds["flight"], "rows_per_s"),
                    ),
                    Row(
                        "P2",
                        case,
                        "rows/s",
                        ours["rows_per_s"],
                        "HF datasets `ds[ids]` (torch)",
                        hf["rows_per_s"],
                        "≥ 5x",
                        ours["rows_per_s"] >= 5 * hf["rows_per_s"],
                        ratio_spread(rounds["episerve"], rounds["hf"], "rows_per_s"),
                    ),
                    Row("P2", case, "p50 ms", ours["p50_ms"], "Arrow Flight", flight["p50_ms"], "info"),
                    Row("P2", case, "p99 ms", ours["p99_ms"], "Arrow Flight", flight["p99_ms"], "info"),
                    Row(
                        "P2",
                        case,
                        "p99 ms",
                        ours["p99_ms"],
                        "episerve p50",
                        ours["p50_ms"],
                        "p99 ≤ 4x p50",
                        tail <= 4.0,
                    ),
                ]
    return rows

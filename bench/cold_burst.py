"""Memory of a server hit by many clients right after a cold start (nothing cached yet).

Starts `episerve-server serve` with an empty cache over a generated dataset, lets `--clients` threads send random
takes for `--seconds`, and samples the RssAnon of the server's processes during the burst and `--idle` seconds
after it. Extra server settings come as `--env NAME=VALUE` (e.g. `--env EPISERVE_COLD_READ_BYTES=0`).

    python -m bench.cold_burst --dataset image --clients 64 --seconds 20 --workers 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.config import QUICK
from bench.datasets import ensure_dataset
from bench.processes import EpiserveServer, Managed, _clean_env

MiB = 1024 * 1024


class Server(EpiserveServer):
    """`EpiserveServer` with extra environment settings."""

    def __init__(self, root: Path, cache_dir: Path, log_dir: Path, workers: int, env: dict[str, str]) -> None:
        super().__init__(root, cache_dir, log_dir, workers)
        Managed.__init__(self, self.command, self.log_path, self._ready, _clean_env(env), self.cwd)


def _burst(url: str, dataset: str, rows: int, clients: int, seconds: float, batch: int) -> dict[str, int]:
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with httpx.Client(base_url=url, timeout=120) as http:
            while time.monotonic() < deadline:
                indices = rng.integers(0, rows, batch).tolist()
                try:
                    ok = http.post(f"/datasets/{dataset}/rows/take", json={"indices": indices}).status_code == 200
                except httpx.TransportError:
                    ok = False  # the server died or dropped the connection
                with lock:
                    counts["ok" if ok else "failed"] += 1

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


def rss_anon(pid: int) -> int:
    """`RssAnon` of one process in bytes, 0 if it is gone (as `bench.memory`, without needing psutil)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _workers_rss(pid: int) -> dict[int, int]:
    """RssAnon of the server's processes (the uvicorn parent and its workers), by pid."""
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return {p: rss_anon(p) for p in pids}


def run(args: argparse.Namespace) -> dict[str, object]:
    size = QUICK.image if args.dataset == "image" else QUICK.vector
    generated = ensure_dataset(args.data, size)
    env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="episerve-cold-") as tmp:
        cache = Path(tmp) / "cache"
        with Server(args.data, cache, Path(tmp) / "logs", args.workers, env) as server:
            pid = server.pid
            time.sleep(1.0)
            before = _workers_rss(pid)
            peak: dict[int, int] = dict(before)
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    for p, value in _workers_rss(pid).items():
                        peak[p] = max(peak.get(p, 0), value)
                    stop.wait(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            counts = _burst(server.url, generated.name, generated.rows, args.clients, args.seconds, args.batch)
            end = _workers_rss(pid)
            time.sleep(args.idle)
            after = _workers_rss(pid)
            stop.set()
            sampler.join()
    total = {name: sum(values.values()) / MiB for name, values in [("before", before), ("peak", peak)]}
    return {
        "dataset": generated.name,
        "parquet_mib": round(generated.parquet_bytes / MiB, 1),
        "clients": args.clients,
        "workers": args.workers,
        "env": env,
        "requests": counts,
        "rss_anon_mib": {
            "before": round(total["before"], 1),
            "peak": round(total["peak"], 1),  # per-process peaks summed
            "end_of_burst": round(sum(end.values()) / MiB, 1),
            f"after_{args.idle:g}s": round(sum(after.values()) / MiB, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_burst", description=__doc__)
    parser.add_argument("--dataset", choices=["vector", "image"], default="image")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "episerve-bench-data")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=256, help="indices per take")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server (repeatable)")
    print(json.dumps(run(parser.parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

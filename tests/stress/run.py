"""Load and fault runs against a real server (on demand; not part of the unit suite).

    python -m tests.stress.run load    [--seconds 60] [--clients 64] [--workers 2]
    python -m tests.stress.run faults  [--kills 20]

`load`: concurrent clients mix /rows, take and windowed take requests; every response is checked against the
source parquet (the `index` column of each row), and errors, p50/p99 latency and the server's anonymous RSS are
reported. `faults`: the server is killed with SIGKILL at random moments while it builds segments, restarted each
time; afterwards every row must equal the oracle and no temporary file may be left.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from app.demo import write_demo_dataset
from tests.support import ServerProcess, assert_tables_equal, oracle, read_stream

FPS = 30


def rss_anon_kib(pids: list[int]) -> int:
    """Sum of RssAnon over the processes (memory-mapped pages are page cache, not counted)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


async def client_loop(
    url: str,
    view_index: np.ndarray,
    episodes: int,
    deadline: float,
    seed: int,
    results: list[tuple[str, float, str | None]],
) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while time.monotonic() < deadline:
            kind = rng.choice(["rows", "take", "window"])
            started = time.perf_counter()
            error = None
            try:
                if kind == "rows":
                    start = rng.randrange(len(view_index))
                    stop = min(len(view_index), start + rng.randrange(1, 4096))
                    response = await http.get(
                        "/datasets/demo/rows", params={"start": start, "stop": stop, "columns": "index,action"}
                    )
                    expected = view_index[start:stop]
                else:
                    indices = [rng.randrange(len(view_index)) for _ in range(256)]
                    body: dict = {"indices": indices, "columns": ["index", "action"]}
                    if kind == "window":
                        body["delta_timestamps"] = {
                            "action": [k / FPS for k in range(50)],
                            "observation.state": [-1 / FPS, 0.0],
                        }
                    response = await http.post("/datasets/demo/rows/take", json=body)
                    expected = view_index[indices]
                if response.status_code != 200:
                    error = f"{kind}: HTTP {response.status_code}: {response.text[:200]}"
                else:
                    got = read_stream(response.content)["index"].to_numpy()
                    if not np.array_equal(got, expected):
                        error = f"{kind}: wrong rows"
            except httpx.HTTPError as exc:
                error = f"{kind}: {exc!r}"
            results.append((kind, time.perf_counter() - started, error))


def run_load(seconds: float, clients: int, workers: int, episodes: int) -> int:
    with tempfile.TemporaryDirectory(prefix="episerve-load-") as scratch:
        root = Path(scratch) / "root"
        write_demo_dataset(root / "demo", episodes=episodes, seed=5)
        view_index = oracle(root / "demo", None)["index"].to_numpy()
        server = ServerProcess([root], Path(scratch) / "cache", workers=workers).start()
        try:
            httpx.post(f"{server.url}/datasets/demo/cache", timeout=60)
            baseline = rss_anon_kib(server.pids())
            samples: list[int] = []
            stop_sampling = threading.Event()

            def sample() -> None:
                while not stop_sampling.wait(0.5):
                    samples.append(rss_anon_kib(server.pids()))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            results: list[tuple[str, float, str | None]] = []
            deadline = time.monotonic() + seconds

            async def main() -> None:
                await asyncio.gather(
                    *(client_loop(server.url, view_index, episodes, deadline, seed, results) for seed in range(clients))
                )

            asyncio.run(main())
            stop_sampling.set()
            sampler.join()
        finally:
            server.stop()
    errors = [e for _, _, e in results if e]
    print(
        f"{len(results)} requests from {clients} clients in {seconds:.0f} s against {workers} workers: "
        f"{len(errors)} errors"
    )
    print("| request | count | p50 ms | p99 ms |\n|---|---|---|---|")
    for kind in ("rows", "take", "window"):
        latencies = np.array([s for k, s, _ in results if k == kind]) * 1000
        if len(latencies):
            print(
                f"| {kind} | {len(latencies)} | {np.percentile(latencies, 50):.1f} | "
                f"{np.percentile(latencies, 99):.1f} |"
            )
    peak = max(samples, default=baseline)
    print(
        f"server RssAnon: {baseline / 1024:.0f} MiB before, {peak / 1024:.0f} MiB peak "
        f"(+{(peak - baseline) / 1024:.0f} MiB)"
    )
    for error in errors[:10]:
        print("  ", error)
    return 1 if errors else 0


def run_faults(kills: int, seed: int) -> int:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="episerve-faults-") as scratch:
        root = Path(scratch) / "root"
        write_demo_dataset(root / "demo", episodes=240, seed=6, image_size=48, files=12)
        cache = Path(scratch) / "cache"
        env = {"EPISERVE_BUILD_BATCH_BYTES": str(256 * 1024)}
        killed_mid_build = 0
        for attempt in range(kills):
            server = ServerProcess([root], cache, workers=2, env=env).start()
            spec = f"{rng.randrange(240)}-{rng.randrange(240)}" if rng.random() < 0.5 else None

            def fire(url: str = server.url, spec: str | None = spec) -> None:
                try:
                    params = {"episodes": spec} if spec and spec.split("-")[0] <= spec.split("-")[1] else {}
                    httpx.get(f"{url}/datasets/demo/rows", params=params, timeout=60)
                except httpx.HTTPError:
                    pass

            threads = [threading.Thread(target=fire) for _ in range(3)]
            for thread in threads:
                thread.start()
            # wait until some segments are published and another build is under way, then kill at a random moment
            published = rng.randrange(12)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not (
                list(cache.rglob("*.arrow.tmp")) and len(list(cache.rglob("segments/*.json"))) >= published
            ):
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.05))
            killed_mid_build += bool(list(cache.rglob("*.arrow.tmp")))
            server.stop(signal.SIGKILL)
            for thread in threads:
                thread.join()
            print(
                f"kill {attempt + 1}/{kills}: {len(list(cache.rglob('segments/*.json')))} segments published, "
                f"{len(list(cache.rglob('*.arrow.tmp')))} partial"
            )
        with ServerProcess([root], cache, workers=2) as server:
            for spec in (None, "0-39", "17,3,200-239"):
                params = {"episodes": spec} if spec else {}
                response = httpx.get(f"{server.url}/datasets/demo/rows", params=params, timeout=120)
                episodes = None if spec is None else _expand(spec)
                assert_tables_equal(read_stream(response.content), oracle(root / "demo", episodes))
        leftovers = list(cache.rglob("*.tmp"))
    print(
        f"{kills} kills ({killed_mid_build} while a segment was being written); "
        f"every row equals the oracle afterwards; temporary files left: {len(leftovers)}"
    )
    return 1 if leftovers else 0


def _expand(spec: str) -> list[int]:
    ids: list[int] = []
    for term in spec.split(","):
        first, _, last = term.partition("-")
        ids.extend(range(int(first), int(last or first) + 1))
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load")
    load.add_argument("--seconds", type=float, default=60)
    load.add_argument("--clients", type=int, default=64)
    load.add_argument("--workers", type=int, default=2)
    load.add_argument("--episodes", type=int, default=300)
    faults = sub.add_parser("faults")
    faults.add_argument("--kills", type=int, default=20)
    faults.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "load":
        return run_load(args.seconds, args.clients, args.workers, args.episodes)
    return run_faults(args.kills, args.seed)


if __name__ == "__main__":
    raise SystemExit(main())

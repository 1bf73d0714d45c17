"""CPU time per DataLoader batch, client side and server side: P3's vector map-style loaders, measured by process.

    python -m bench.batch_cpu [--quick] [--workdir DIR] [--rounds 3] [--batches 400] [--loaders http,ref,mmap]
    python -m bench.batch_cpu --inline [--batches 2000]

Wall-clock samples/s swing with whatever else the shared cores run; the CPU each process spends per batch does
not, much. With a 2-worker DataLoader (batch 256, shuffled, as P3), every loader runs `--rounds` times,
interleaved with a rotating start: after the first batch (workers started), the user+sys CPU of the main process,
of its DataLoader workers and of the server's process tree is read, `--batches` batches are drawn, and the CPU is
read again. Printed per batch: ms of CPU in the main process, in the workers (together), in the server, the
client's sum, and samples/s for reference. The workers may run up to `prefetch_factor` batches each ahead of the
main process, the same for every loader. Loaders: `http` (`EpisodeDataset` over HTTP), `ref` (the same with
`cache_dir=`, rows by reference), `mmap` (P3's local mmap batched ceiling).

`--inline` calls each dataset's `__getitems__` in this process (no DataLoader) and pickles the batch as a worker
hands it over: client and server CPU per batch without worker hand-off, steadier, and what py-spy should look at.
The datasets are P3's `vector` (`--quick`: the quick mode's), generated under the work directory (default: a
temporary `episerve-batch-cpu` directory) with their own cache and server.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.config import MODES
from bench.datasets import ensure_dataset
from bench.processes import EpiserveServer
from bench.run import _ipc_path
from bench.timing import wait_for_quiet
from bench.workers import run_job

BATCH = 256
WORKERS = 2


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _processes() -> tuple[list[int], list[int]]:
    """This process's DataLoader workers (children forked from it, same command line) and every other descendant
    (the server's processes: its supervisor, forkserver and workers)."""
    me = psutil.Process()
    command = me.cmdline()
    workers, others = [], []
    for child in me.children(recursive=True):
        try:
            forked = child.ppid() == me.pid and child.cmdline() == command
        except psutil.NoSuchProcess:
            continue
        (workers if forked else others).append(child.pid)
    return workers, others


def _own_cpu() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


def _datasets(url: str, name: str, cache_dir: Path, ipc: Path) -> dict[str, Any]:
    import episerve
    from bench.peers.mmap_loader import MmapBatchDataset

    return {
        "http": episerve.EpisodeDataset(url, name),
        "ref": episerve.EpisodeDataset(url, name, cache_dir=cache_dir),
        "mmap": MmapBatchDataset(ipc, one_block=True),
    }


def _loader(dataset: Any, kind: str) -> Any:
    from torch.utils.data import DataLoader

    import episerve
    from bench.peers.mmap_loader import identity

    collate = identity if kind == "mmap" else episerve.collate
    return DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS, collate_fn=collate)


def measure_loader(loader: Any, batches: int) -> dict[str, float]:
    """CPU per batch of main process, workers and server over `batches` batches after the first."""
    iterator = iter(loader)
    next(iterator)
    workers, server = _processes()
    main0, workers0, server0 = _own_cpu(), _cpu(workers), _cpu(server)
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    elapsed = time.perf_counter() - started
    main1, workers1, server1 = _own_cpu(), _cpu(workers), _cpu(server)
    del iterator
    per = 1000.0 / batches
    return {
        "main": (main1 - main0) * per,
        "workers": (workers1 - workers0) * per,
        "server": (server1 - server0) * per,
        "client": (main1 - main0 + workers1 - workers0) * per,
        "samples_s": batches * BATCH / elapsed,
    }


def measure_inline(dataset: Any, batches: int, seed: int) -> dict[str, float]:
    """CPU per `__getitems__` call (plus the pickling a worker's hand-off does) in this process, and the server's."""
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(len(dataset))[:BATCH].tolist() for _ in range(64)]
    pickle.dumps(dataset.__getitems__(orders[0]), protocol=pickle.HIGHEST_PROTOCOL)
    server = _processes()[1]
    own0, server0 = _own_cpu(), _cpu(server)
    started = time.perf_counter()
    for number in range(batches):
        batch = dataset.__getitems__(orders[number % len(orders)])
        pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
    elapsed = time.perf_counter() - started
    own1, server1 = _own_cpu(), _cpu(server)
    per = 1000.0 / batches
    return {"client": (own1 - own0) * per, "server": (server1 - server0) * per, "samples_s": batches * BATCH / elapsed}


def _rounds(kinds: list[str], rounds: int, measure: Callable[[str], dict[str, float]]) -> dict[str, list[dict]]:
    seen: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for number in range(rounds):
        order = kinds[number % len(kinds) :] + kinds[: number % len(kinds)]
        for kind in order:
            wait_for_quiet()
            figures = measure(kind)
            seen[kind].append(figures)
            cells = "  ".join(
                f"{key} {value:8.3f}" if key != "samples_s" else f"{value:9,.0f}/s" for key, value in figures.items()
            )
            print(f"round {number + 1} {kind:5} {cells}", file=sys.stderr, flush=True)
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "episerve-batch-cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--loaders", default="http,ref,mmap")
    parser.add_argument("--inline", action="store_true", help="call __getitems__ in this process, no DataLoader")
    parser.add_argument("--server-workers", type=int, default=2)
    args = parser.parse_args(argv)

    from bench.peers.ipc import convert

    scale = MODES["quick" if args.quick else "full"]
    workdir = args.workdir / scale.mode
    workdir.mkdir(parents=True, exist_ok=True)
    size = scale.vector
    dataset = ensure_dataset(workdir / "data", size)
    ipc = convert(dataset.files, _ipc_path(workdir, size))
    cache_dir, logs = workdir / "cache", workdir / "logs"
    logs.mkdir(exist_ok=True)
    run_job(
        "episerve-build",
        {"root": str(workdir / "data"), "cache_dir": str(cache_dir), "dataset": size.name},
        logs / "warm.log",
    )
    kinds = [kind for kind in args.loaders.split(",") if kind]
    with EpiserveServer(workdir / "data", cache_dir, logs, workers=args.server_workers) as server:
        datasets = _datasets(server.url, size.name, cache_dir, ipc)
        if args.inline:
            seen = _rounds(
                kinds,
                args.rounds,
                lambda kind: measure_inline(datasets[kind], args.batches, seed=len(kind)),
            )
        else:
            seen = _rounds(kinds, args.rounds, lambda kind: measure_loader(_loader(datasets[kind], kind), args.batches))
    how = "inline" if args.inline else f"{WORKERS}-worker DataLoader"
    print(f"# ms CPU per batch of {BATCH} ({how}), medians of {args.rounds} rounds")
    for kind, figures in seen.items():
        keys = figures[0].keys()
        cells = "  ".join(
            f"{key} {statistics.median(f[key] for f in figures):.3f}"
            if key != "samples_s"
            else f"{statistics.median(f[key] for f in figures):,.0f} samples/s"
            for key in keys
        )
        print(f"{kind:5} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

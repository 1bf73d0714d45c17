"""CPU time per sample of P16's loader on each way a camera frame reaches the trainer, server and client apart.

    python -m bench.frame_cpu [--quick] [--sizes photo480,photo224] [--tier jpeg] [--rounds 3] [--samples 1280]

For each photo dataset of P16 (`bench/camera_datasets.py`), a server (2 workers) per setting: `raw` (the raw cache),
`server` (the JPEG tier `--tier`, decoded by the server), `client` (the same server, `Client(frames="encoded")`:
JPEG bytes on the wire, decoded in the DataLoader workers) and `local` (the same server, `Client(cache_dir=...)`:
the JPEGs read by reference from the cache's segments and decoded in the DataLoader workers). Each cache is built
once with `warm --videos` in the work dir and reused. The loader is P16's `EpisodeDataset` (the camera and `index`,
batch 64, 2 workers, shuffled).
Per measurement, after one warm-up pass: user + system CPU of the server's process tree, and of this process plus
its reaped DataLoader workers, over `--samples` samples, in ms per sample, with samples/s. Settings run interleaved
in `--rounds` rounds, each round starting one setting later. CPU time swings far less than wall-clock time on a
shared machine, so compare these figures between two versions (the server under test is `$BENCH_APP_PATH` or this
checkout, see `bench.processes.app_dir`; the client is the `episerve` this interpreter imports).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.camera_datasets import CAMERA, ensure_camera_dataset
from bench.config import MODES
from bench.figures.p16_frame_tiers import warm_tier
from bench.processes import EpiserveServer

BATCH, WORKERS = 64, 2
SETTINGS = ("raw", "server", "client", "local")


def _tree_seconds(pid: int) -> float:
    process = psutil.Process(pid)
    total = 0.0
    for member in (process, *process.children(recursive=True)):
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _own_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def _loader(url: str, dataset: str, setting: str, cache: Path) -> Any:
    from torch.utils.data import DataLoader

    import episerve

    if setting == "client":
        client = episerve.Client(url, frames="encoded")
    elif setting == "local":
        client = episerve.Client(url, cache_dir=cache)
    else:
        client = episerve.Client(url)
    samples = episerve.EpisodeDataset(client, dataset, columns=[CAMERA, "index"])
    return DataLoader(
        samples,
        batch_size=BATCH,
        shuffle=True,
        num_workers=WORKERS,
        collate_fn=episerve.collate,
        persistent_workers=False,
    )


def _draw(loader: Any, samples: int) -> int:
    seen = 0
    iterator = iter(loader)
    for batch in iterator:
        seen += len(batch["index"])
        if seen >= samples:
            break
    del iterator  # shuts the workers down (reaped: their CPU time lands in this process's children times)
    return seen


def measure(loader: Any, server_pid: int, samples: int) -> dict[str, float]:
    """CPU ms per sample of the server tree and of this process with its workers, and samples/s, over one pass."""
    server_before, own_before, started = _tree_seconds(server_pid), _own_seconds(), time.perf_counter()
    seen = _draw(loader, samples)
    elapsed = time.perf_counter() - started
    server, own = _tree_seconds(server_pid) - server_before, _own_seconds() - own_before
    return {"server_ms": 1e3 * server / seen, "client_ms": 1e3 * own / seen, "samples_per_s": seen / elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.frame_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the quick-mode datasets")
    parser.add_argument("--sizes", default="photo480,photo224")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--tier", default="jpeg", help="the JPEG tier (EPISERVE_VIDEO_FRAME_TIER)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1280)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "episerve-bench")
    args = parser.parse_args(argv)
    scale = MODES["quick" if args.quick else "full"]
    workdir = args.workdir.resolve() / scale.mode
    settings = args.settings.split(",")
    for name in args.sizes.split(","):
        size = next(s for s in scale.p9.datasets if s.name == name)
        dataset = ensure_camera_dataset(workdir / "camera-data", size)
        servers: dict[str, EpiserveServer] = {}
        for setting in settings:
            tier = "raw" if setting == "raw" else args.tier
            cache = workdir / "frame-tiers" / name / tier.replace(":", "-")
            if not cache.is_dir():
                warm_tier(dataset, cache, tier, workdir / "logs" / "frame-cpu-warm.log")
            if tier not in servers:
                settings_env = {"EPISERVE_VIDEO_FRAME_TIER": tier}
                servers[tier] = EpiserveServer(dataset.root, cache, workdir / "logs", WORKERS, settings_env).start()
        try:
            samples = min(args.samples, dataset.rows - 2 * BATCH)
            loaders = {}
            for setting in settings:
                server = servers["raw" if setting == "raw" else args.tier]
                cache = workdir / "frame-tiers" / name / (args.tier if setting != "raw" else "raw").replace(":", "-")
                loaders[setting] = (_loader(server.url, name, setting, cache), server.pid)
                _draw(loaders[setting][0], samples)  # warm-up: connections, maps, the page cache
            results: dict[str, list[dict[str, float]]] = {setting: [] for setting in settings}
            for round_ in range(args.rounds):
                for setting in settings[round_ % len(settings) :] + settings[: round_ % len(settings)]:
                    loader, pid = loaders[setting]
                    results[setting].append(measure(loader, pid, samples))
        finally:
            for server in servers.values():
                server.stop()
        for setting in settings:
            rounds = results[setting]
            figures = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
            each = " ".join(f"{r['server_ms']:.2f}/{r['client_ms']:.2f}" for r in rounds)
            print(
                f"{name} {setting:6} server {figures['server_ms']:6.2f} ms  client {figures['client_ms']:6.2f} ms  "
                f"total {figures['server_ms'] + figures['client_ms']:6.2f} ms/sample  "
                f"{figures['samples_per_s']:7.0f} samples/s  (rounds server/client: {each})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

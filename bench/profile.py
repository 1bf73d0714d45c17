"""Profile the server and the client on one benchmark workload with py-spy, and summarise where time goes.

    python -m bench.profile take [--dataset vector] [--seconds 15] [--workers 2] [--quick] [--out DIR]
    python -m bench.profile camera [--dataset camera480] [--policy on-demand] [--native] [--quick]
    python -m bench.profile camera --dataset photo480 --tier jpeg [--frames encoded] [--native]

Workloads: `rows` (P1: contiguous ranges through `episerve.Client`), `take` (P2: random 256-row takes, one
client), `loader` (P3: `EpisodeDataset` in a 2-worker DataLoader), `windows` (P7: windowed takes), `camera`
(P9: `EpisodeDataset` of the camera and `index`, batch 64, in a 2-worker DataLoader, against a server whose
`EPISERVE_VIDEO_CACHE_POLICY` is `--policy`; first-touch after `warm --videos`; with `--tier`, P16's setting: the
frame tier `--tier` built by `warm --videos` once into the work dir and reused, and `--frames encoded` for
`Client(frames="encoded")`). py-spy
samples the server's processes and, separately, the client process (and its DataLoader workers), writing
collapsed stacks (`*.txt`, for flamegraph tools or speedscope) plus a summary of the heaviest frames, by
inclusive and by self time, to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from bench.context import Context
from bench.memory import tree_pids
from bench.processes import EpiserveServer
from bench.run import prepare

BATCH = 256
IDLE_FRAMES = ("select (", "epoll_wait", "_worker (concurrent", "wait (threading", "poll (", "recv_into (")


def _workload(
    kind: str, url: str, dataset: str, rows: int, stop: threading.Event, frames: str = "pixels"
) -> Callable[[], int]:
    import episerve
    from bench.camera_datasets import CAMERA

    client = episerve.Client(url, frames=frames)
    rng = np.random.default_rng(0)

    def rows_loop() -> int:
        done, span = 0, min(100_000, rows)
        while not stop.is_set():
            start = int(rng.integers(0, rows - span + 1))
            done += client.rows(dataset, start=start, stop=start + span).num_rows
        return done

    def take_loop(delta_timestamps: dict | None = None) -> int:
        done = 0
        while not stop.is_set():
            ids = rng.integers(0, rows, size=BATCH)
            done += client.take(dataset, ids, delta_timestamps=delta_timestamps).num_rows
        return done

    def loader_loop(columns: list[str] | None = None, batch: int = BATCH) -> int:
        from torch.utils.data import DataLoader

        loader = DataLoader(
            episerve.EpisodeDataset(client, dataset, columns=columns),
            batch_size=batch,
            shuffle=True,
            num_workers=2,
            collate_fn=episerve.collate,
        )
        done = 0
        while not stop.is_set():
            for batch in loader:
                done += len(batch["index"])
                if stop.is_set():
                    break
        return done

    def windows_loop() -> int:
        fps = 30
        return take_loop({"action": [k / fps for k in range(50)], "observation.state": [-1 / fps, 0.0]})

    def camera_loop() -> int:
        return loader_loop([CAMERA, "index"], batch=64)

    loops = {"rows": rows_loop, "take": take_loop, "loader": loader_loop, "windows": windows_loop}
    return {**loops, "camera": camera_loop}[kind]


def _record(pid: int, seconds: float, out: Path, native: bool = False) -> subprocess.Popen[bytes]:
    command = ["py-spy", "record", "--pid", str(pid), "--subprocesses", "--format", "raw", "--rate", "100"]
    command += ["--duration", str(int(seconds)), "--output", str(out)]
    command.append("--native" if native else "--nonblocking")  # py-spy cannot combine the two
    out.unlink(missing_ok=True)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command[0] = py_spy
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarise(path: Path, top: int = 25, exclude_pids: Iterable[int] = ()) -> str:
    """Heaviest frames of a collapsed-stack file, by inclusive and by self samples (idle frames dropped).

    Stacks of processes in `exclude_pids` are left out (the server, when profiling the client's process tree).
    """
    excluded = tuple(f"process {pid}:" for pid in exclude_pids)
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        if excluded and any(frame.startswith(excluded) for frame in frames):
            continue
        # py-spy nests child processes as `process PID:"cmdline"` frames (a cmdline may itself hold ';').
        frames = [f for f in frames if "(" in f and not f.startswith(("process ", " "))] or frames
        if any(idle in frames[-1] for idle in IDLE_FRAMES):
            continue
        count = int(count_text)
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    lines = [f"{path.name}: {total} busy samples", "  inclusive:"]
    lines += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    lines += ["  self:"]
    lines += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=["rows", "take", "loader", "windows", "camera"])
    parser.add_argument(
        "--dataset",
        choices=["vector", "image", "camera480", "camera224", "photo480", "photo224"],
        help="default: vector, or camera480 for the camera workload",
    )
    parser.add_argument(
        "--policy",
        choices=["on-demand", "first-touch"],
        default="on-demand",
        help="camera workload: the server's EPISERVE_VIDEO_CACHE_POLICY",
    )
    parser.add_argument("--tier", help="camera workload: the server's EPISERVE_VIDEO_FRAME_TIER, its cache warmed")
    parser.add_argument(
        "--frames", choices=["pixels", "encoded"], default="pixels", help="camera workload: the client's"
    )
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="use the quick-mode datasets")
    parser.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "episerve-bench")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "episerve-profile")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    camera = args.workload == "camera"
    args.dataset = args.dataset or ("camera480" if camera else "vector")
    if camera != args.dataset.startswith(("camera", "photo")):
        parser.error(f"the {args.workload} workload does not read the {args.dataset} dataset")
    ctx = prepare(mode, args.workdir.resolve() / mode, tabular=not camera)
    args.out.mkdir(parents=True, exist_ok=True)
    root, cache, settings = ctx.data_root, ctx.cache_dir, None
    if camera and args.tier:
        root, cache, rows = _tier_server(ctx, args.dataset, args.tier)
        settings = {"EPISERVE_VIDEO_FRAME_TIER": args.tier}
    elif camera:
        root, cache, rows = _camera_server(ctx, args.dataset, args.policy)
        settings = {"EPISERVE_VIDEO_CACHE_POLICY": args.policy}
    else:
        rows = ctx.datasets[args.dataset].rows
    with EpiserveServer(root, cache, ctx.logs, workers=args.workers, settings=settings) as server:
        stop = threading.Event()
        work = _workload(args.workload, server.url, args.dataset, rows, stop, args.frames)
        result: dict[str, int] = {}
        runner = threading.Thread(target=lambda: result.setdefault("rows", work()))
        runner.start()
        time.sleep(2.0)  # warm-up: connections, segments, DataLoader workers
        name = f"{args.workload}-{args.dataset}"
        server_out, client_out = args.out / f"server-{name}.txt", args.out / f"client-{name}.txt"
        recorders = [
            _record(server.pid, args.seconds, server_out, args.native),
            _record(os.getpid(), args.seconds, client_out, args.native),
        ]
        for recorder in recorders:
            recorder.wait()
        server_pids = tree_pids(server.pid)
        stop.set()
        runner.join()
    print(f"{args.workload} on {args.dataset}: {result.get('rows', 0):,} rows in ~{args.seconds + 2:.0f} s")
    if server_out.exists():
        print(summarise(server_out))
    if client_out.exists():
        print(summarise(client_out, exclude_pids=server_pids))
    if camera and not args.tier:
        ctx.drop_scratch("profile-camera")
    return 0


def _camera_server(ctx: Context, name: str, policy: str) -> tuple[Path, Path, int]:
    """(root, cache dir, rows) for a server of P9's camera dataset `name`; the cache is an empty scratch directory,
    warmed with `warm --videos` for the first-touch policy."""
    from bench.camera_datasets import ensure_camera_dataset
    from bench.figures.p9_camera import warm_seconds

    size = next(c for c in ctx.scale.p9.datasets if c.name == name)
    dataset = ensure_camera_dataset(ctx.workdir / "camera-data", size)
    cache = ctx.scratch("profile-camera")
    if policy == "first-touch":
        warm_seconds(ctx, dataset, cache)
    return dataset.root, cache, dataset.rows


def _tier_server(ctx: Context, name: str, tier: str) -> tuple[Path, Path, int]:
    """(root, cache dir, rows) for a server of P16's dataset `name` on frame tier `tier`, its cache built by
    `warm --videos` once into the work dir (where `python -m bench.frame_cpu` keeps it too) and reused."""
    from bench.camera_datasets import ensure_camera_dataset
    from bench.figures.p16_frame_tiers import warm_tier

    size = next(c for c in ctx.scale.p9.datasets if c.name == name)
    dataset = ensure_camera_dataset(ctx.workdir / "camera-data", size)
    cache = ctx.workdir / "frame-tiers" / name / tier.replace(":", "-")
    if not cache.is_dir():
        warm_tier(dataset, cache, tier, ctx.logs / "profile-warm.log")
    return dataset.root, cache, dataset.rows


if __name__ == "__main__":
    sys.exit(main())

"""P16: camera frames at real dataset sizes, per frame tier and size, on camera-like content
(`bench/camera_datasets.py`: a pan and zoom over photographs with sensor noise, and the ALOHA insertion scene
rendered with MuJoCo), encoded as LeRobot records (AV1, GOP 2).

Per dataset (each content at 480x640 and 224x224; each row names its content and size), each tier's cache is built
with `episerve-server warm DATASET --videos` under `EPISERVE_VIDEO_FRAME_TIER` (raw, and JPEG at the qualities in
`JPEG_TIERS`), and:

- disk: the frame segments' bytes ÷ the source MP4s' bytes;
- samples/s, through each of two loaders side by side, both shuffled (batch 64, 2 workers): `EpisodeDataset` (the
  camera and `index`) and `RemoteLeRobotDataset` (LeRobot's whole sample: the camera as float32 in [0, 1], the
  state, the action, the standard columns, `task`); each against a server on demand (AV1 decoded per request, the
  peer), on the raw cache, on each JPEG tier decoded by the server, on each JPEG tier with
  `Client(frames="encoded")` (JPEG bytes on the wire, decoded in the DataLoader workers), and on each JPEG tier on
  the server's machine with `Client(cache_dir=...)` (the JPEGs read from the cache's segments by reference and
  decoded in the workers), each compared with the same loader on demand (and `frames="encoded"` also with the
  same loader with the server decoding);
- wire bytes per frame of a 64-frame take, pixels and encoded;
- PSNR of each JPEG tier's frames against the exact frames (LeRobot's decode: the on-demand server's).

Loaders run `Scale.rounds` times, interleaved; the table shows medians. LeRobot 0.6.1 and Lance are P9's peers (the
same DataLoader settings). Where the ALOHA scene cannot be rendered (no MuJoCo or headless GL), its rows say so.
"""

from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.camera_datasets import CAMERA, CameraDataset
from bench.config import CameraSize
from bench.context import Context
from bench.figures.camera_sets import rows_per_dataset
from bench.figures.p3_loader import samples_per_second
from bench.processes import EpiserveServer, _clean_env, app_dir
from bench.report import Row
from bench.timing import in_rounds, medians, ratio_spread

BATCH = 64
WORKERS = 2
COLUMNS = [CAMERA, "index"]
JPEG_TIERS = ("jpeg", "jpeg:95:420")  # the default (quality 92, 4:4:4 chroma) and the earlier one
LOADERS = ("EpisodeDataset", "RemoteLeRobotDataset")
KEY = "samples_per_s"
# On-demand AV1 ÷ JPEG tier targets (targets.md P16), by frame height.
TARGET_VS_ON_DEMAND = {480: 3.0, 224: 5.0}


def run(ctx: Context) -> list[Row]:
    return rows_per_dataset(ctx, "P16", ctx.scale.p9.of("photo", "aloha"), partial(_dataset_rows, ctx))


def _dataset_rows(ctx: Context, size: CameraSize, dataset: CameraDataset) -> list[Row]:
    source_bytes = dataset.video_bytes
    caches = {
        tier: ctx.workdir / "frame-tiers" / dataset.name / tier.replace(":", "-") for tier in ("raw", *JPEG_TIERS)
    }
    disk = {tier: _warm(ctx, dataset, cache, tier) for tier, cache in caches.items()}
    servers = {"on demand": EpiserveServer(dataset.root, ctx.scratch(f"p16-{dataset.name}"), ctx.logs, 2, _on_demand())}
    for tier, cache in caches.items():
        servers[tier] = EpiserveServer(dataset.root, cache, ctx.logs, 2, {"EPISERVE_VIDEO_FRAME_TIER": tier})
    started = []
    try:
        for server in servers.values():
            started.append(server.start())
        loaders = _loaders(dataset, {name: server.url for name, server in servers.items()}, caches)
        samples = min(ctx.scale.p9.samples, dataset.rows - 2 * BATCH)
        measured = in_rounds(partial(_speed, loaders, samples), list(loaders), ctx.scale.rounds)
        wire = {tier: _wire_bytes(servers[tier].url, dataset) for tier in JPEG_TIERS}
        quality = {tier: _psnr(servers["on demand"].url, servers[tier].url, dataset) for tier in JPEG_TIERS}
    finally:
        for server in reversed(started):
            server.stop()
        ctx.drop_scratch(f"p16-{dataset.name}")
    case = f"{size.label}, {dataset.rows:,} frames"
    ctx.notes.append(f"P16 {case}: the source MP4s hold {source_bytes / dataset.rows / 1e3:.1f} KB a frame.")
    target = TARGET_VS_ON_DEMAND.get(dataset.height, 3.0)
    rows = [
        Row("P16", f"{case}, raw cache", "x source MP4", disk["raw"] / source_bytes, "source MP4", 1.0, "info"),
        *_speed_rows(f"{case}, raw cache", "raw", "on demand", "on-demand AV1", None, measured),
    ]
    for tier in JPEG_TIERS:
        ratio = disk[tier] / source_bytes
        pixels_wire, encoded_wire = wire[tier]
        rows += [
            Row("P16", f"{case}, {tier}", "x source MP4", ratio, "source MP4", 1.0, "≤ 6x", ratio <= 6.0),
            Row(
                "P16",
                f"{case}, {tier}",
                "dB PSNR",
                quality[tier],
                "exact frames (40 dB)",
                40.0,
                "≥ 40 dB",
                quality[tier] >= 40,
            ),
            *_speed_rows(f"{case}, {tier}, server decodes", tier, "on demand", "on-demand AV1", target, measured),
            *_speed_rows(
                f"{case}, {tier}, client decodes (frames=encoded)",
                f"{tier} encoded",
                "on demand",
                "on-demand AV1",
                target,
                measured,
            ),
            *_speed_rows(
                f"{case}, {tier}, client decodes (frames=encoded)",
                f"{tier} encoded",
                tier,
                "the server decoding",
                0.8,
                measured,
            ),
            *_speed_rows(
                f"{case}, {tier}, same machine (cache_dir=, client decodes)",
                f"{tier} local",
                "on demand",
                "on-demand AV1",
                target,
                measured,
            ),
            Row(
                "P16",
                f"{case}, {tier}, frames=encoded",
                "wire bytes/frame",
                encoded_wire,
                "raw pixels on the wire",
                pixels_wire,
                "≤ 0.1x" if dataset.height >= 480 else "info",  # targets.md: a 480x640 frame in a tenth
                encoded_wire <= 0.1 * pixels_wire if dataset.height >= 480 else None,
            ),
        ]
    return rows


def _speed_rows(
    case: str, setting: str, baseline: str, peer: str, factor: float | None, measured: dict[tuple[str, str], Any]
) -> list[Row]:
    """One samples/s row per loader, side by side: the loader on `setting` against the same loader on `baseline`
    (`factor`: the target ratio, None for information)."""
    rows = []
    for name in LOADERS:
        ours, theirs = measured[name, setting], measured[name, baseline]
        speed, peer_speed = medians(ours)[KEY], medians(theirs)[KEY]
        rows.append(
            Row(
                "P16",
                f"{case}, {name}",
                "samples/s",
                speed,
                peer,
                peer_speed,
                "info" if factor is None else f"≥ {factor:g}x",
                None if factor is None else speed >= factor * peer_speed,
                ratio_spread(ours, theirs, KEY),
            )
        )
    return rows


def _on_demand() -> dict[str, str]:
    return {"EPISERVE_VIDEO_CACHE_POLICY": "on-demand"}


def _warm(ctx: Context, dataset: CameraDataset, cache: Path, tier: str) -> int:
    return warm_tier(dataset, cache, tier, ctx.logs / "p16-warm.log")


def warm_tier(dataset: CameraDataset, cache: Path, tier: str, log_path: Path) -> int:
    """Build the dataset's frame segments of `tier` into `cache` with `episerve-server warm DATASET --videos` (once:
    a later run reuses them), its output appended to `log_path`; the segments' bytes."""
    command = [sys.executable, "-m", "app.cli", "warm", dataset.name, "--videos"]
    command += ["--root", str(dataset.root), "--cache-dir", str(cache)]
    env = _clean_env({"EPISERVE_VIDEO_FRAME_TIER": tier})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        subprocess.run(command, cwd=app_dir(), env=env, stdout=log, stderr=log, check=True)
    return sum(path.stat().st_size for path in cache.rglob("frames/*.arrow"))


def _loaders(dataset: CameraDataset, urls: dict[str, str], caches: dict[str, Path]) -> dict[tuple[str, str], Any]:
    """(loader, server setting) -> a shuffled DataLoader of that loader against that server, for every loader of
    `LOADERS` and every setting (the servers of `urls`; each JPEG tier's with `frames="encoded"`, and on the
    server's machine with `cache_dir=` its cache in `caches`, the JPEGs read from the segments by reference)."""
    from torch.utils.data import DataLoader

    import episerve
    from episerve.lerobot import RemoteLeRobotDataset

    shuffled: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "num_workers": WORKERS}

    def loader(name: str, client: Any) -> Any:
        if name == "RemoteLeRobotDataset":
            samples = RemoteLeRobotDataset(client, dataset.name)
            return DataLoader(samples, collate_fn=RemoteLeRobotDataset.collate, persistent_workers=False, **shuffled)
        samples = episerve.EpisodeDataset(client, dataset.name, columns=COLUMNS)
        return DataLoader(samples, collate_fn=episerve.collate, persistent_workers=False, **shuffled)

    loaders = {}
    for name in LOADERS:
        loaders[name, "on demand"] = loader(name, urls["on demand"])
        loaders[name, "raw"] = loader(name, urls["raw"])
        for tier in JPEG_TIERS:
            loaders[name, tier] = loader(name, urls[tier])
            loaders[name, f"{tier} encoded"] = loader(name, episerve.Client(urls[tier], frames="encoded"))
            loaders[name, f"{tier} local"] = loader(name, episerve.Client(urls[tier], cache_dir=caches[tier]))
    return loaders


def _speed(loaders: dict[tuple[str, str], Any], samples: int, key: tuple[str, str]) -> dict[str, float]:
    return {KEY: samples_per_second(loaders[key], samples, BATCH)}


def _picked(dataset: CameraDataset, count: int = 64, seed: int = 16) -> list[int]:
    return np.random.default_rng(seed).choice(dataset.rows, size=count, replace=False).tolist()


def _wire_bytes(url: str, dataset: CameraDataset) -> tuple[float, float]:
    """Bytes per frame of a 64-frame take's answer: as pixels, and encoded."""
    body = {"indices": _picked(dataset), "columns": [CAMERA]}
    with httpx.Client(base_url=url, timeout=300) as http:
        pixels = http.post(f"/datasets/{dataset.name}/rows/take", json=body)
        encoded = http.post(f"/datasets/{dataset.name}/rows/take", json=body | {"frames": "encoded"})
    pixels.raise_for_status()
    encoded.raise_for_status()
    return len(pixels.content) / len(body["indices"]), len(encoded.content) / len(body["indices"])


def _psnr(exact_url: str, tier_url: str, dataset: CameraDataset) -> float:
    """PSNR of the tier's frames against the exact frames, over 64 random frames."""
    import episerve

    picked = _picked(dataset, seed=17)
    frames = []
    for url in (exact_url, tier_url):
        with episerve.Client(url) as client:
            table = client.take(dataset.name, picked, columns=[CAMERA])
        frames.append(table[CAMERA].combine_chunks().to_numpy_ndarray().astype(np.float64))
    mse = float(np.mean((frames[0] - frames[1]) ** 2))
    return float("inf") if mse == 0 else 10 * float(np.log10(255.0**2 / mse))

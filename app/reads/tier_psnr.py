"""How far a lossy frame tier's frames are from the exact ones: the PSNR of a camera's frames as its tier keeps them
against the same frames decoded exactly (the server's decode, LeRobot's frames), measured on the camera's own
frames so that `/datasets/<id>` (and the viewer, which reads it) states it beside the tier's quality setting.

Measured once per dataset snapshot and camera, on the first `SAMPLE_FRAMES` frames of the first episode: one short
decode from one file, so describing a dataset under a lossy tier costs a few frames' decode once, and nothing under
the exact tier.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import numpy as np

from app.errors import DatasetError
from app.sources.source import Source, VideoFeature
from app.sources.video import decode_nearest_into
from app.store.dataset import Dataset

SAMPLE_FRAMES = 16

log = logging.getLogger("episerve.catalog")

# By source snapshot (replaced when the dataset reloads), then by camera (its tier and served size included).
_MEASURED: weakref.WeakKeyDictionary[Source, dict[VideoFeature, dict[str, Any]]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def tier_psnr(dataset: Dataset, camera: VideoFeature) -> dict[str, Any]:
    """`{"psnr_db": dB, "psnr_frames": n}` for a camera under a lossy tier: the PSNR over the `n` frames sampled
    (null when none could be decoded); nothing for an exact tier."""
    if not camera.tier.lossy:
        return {}
    source = dataset.source()
    with _LOCK:
        known = _MEASURED.get(source, {}).get(camera)
    if known is None:
        known = _measure(dataset, source, camera)
        if known is None:  # not remembered: a store that failed for a moment is asked again next time
            return {"psnr_db": None, "psnr_frames": 0}
        with _LOCK:
            _MEASURED.setdefault(source, {})[camera] = known
    return known


def _measure(dataset: Dataset, source: Source, camera: VideoFeature) -> dict[str, Any] | None:
    """The PSNR over the sample, or None when its file could not be decoded."""
    index = dataset.index()
    if not len(index.episodes):
        return {"psnr_db": None, "psnr_frames": 0}
    count = min(SAMPLE_FRAMES, int(index.episode_lengths[0]))
    exact = np.empty((count, *camera.shape), dtype=np.uint8)
    places = [np.array([i]) for i in range(count)]
    try:
        clip = source.episode_clip(camera.key, int(index.episodes[0]))
        times = clip.from_timestamp + np.arange(count) / (camera.fps or dataset.info().fps or 10.0)
        found = decode_nearest_into(
            exact, places, dataset.path, clip.path, times, camera, dataset.decoders, require_frames=False
        )
    except DatasetError as exc:
        log.warning("dataset %s: cannot measure the PSNR of camera %s: %s", dataset.id, camera.key, exc.detail)
        return None
    exact = exact[~np.isnan(found)]
    kept = exact.copy()
    camera.tier.as_kept(kept, np.arange(len(kept)))
    squared = sum(int(np.square(k.astype(np.int32) - e).sum()) for k, e in zip(kept, exact, strict=True))
    # A sample kept exactly has no finite PSNR: stated as null, like a sample that could not be decoded.
    psnr = round(float(10 * np.log10(255.0**2 * exact.size / squared)), 2) if squared else None
    return {"psnr_db": psnr, "psnr_frames": len(exact)}

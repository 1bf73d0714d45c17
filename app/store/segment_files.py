"""A segment on disk: `<name>.arrow` (uncompressed Arrow IPC), its `<name>.json` sidecar, `<name>.lock` held while
it is built and `<name>.arrow.tmp` written before the rename; the sidecar's format, the file's checksum, and the
removal of temporary files that interrupted writes left behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson
import pyarrow as pa
import xxhash
from filelock import FileLock, Timeout

from app.sources import SourceFingerprint, schema_hash

SEGMENT_FORMAT = 2


@dataclass(frozen=True)
class SegmentPaths:
    """The files of one segment."""

    arrow: Path
    sidecar: Path
    lock: Path
    tmp: Path


def expected_sidecar(source: SourceFingerprint, schema: pa.Schema) -> dict[str, Any]:
    """What a sidecar must say for its segment to serve `source` with `schema`."""
    return {"format": SEGMENT_FORMAT, "source": source.to_dict(), "schema_hash": schema_hash(schema)}


def read_sidecar(paths: SegmentPaths, source: SourceFingerprint, schema: pa.Schema) -> dict | None:
    """The segment's sidecar, if it is readable and says the segment serves `source` with `schema`."""
    try:
        sidecar = orjson.loads(paths.sidecar.read_bytes())
    except (OSError, ValueError):
        return None
    if any(sidecar.get(k) != v for k, v in expected_sidecar(source, schema).items()):
        return None
    return sidecar


def file_checksum(path: Path) -> str:
    """Checksum of a whole file (`xxh3_64:<hex>`)."""
    with open(path, "rb") as handle:
        return handle_checksum(handle)


def handle_checksum(handle: BinaryIO) -> str:
    """`file_checksum` of the file open as `handle`, read with plain reads from its start: a file truncated
    meanwhile gives a short read and another checksum, where a map would fault."""
    digest = xxhash.xxh3_64()
    handle.seek(0)
    while chunk := handle.read(_CHECKSUM_READ_BYTES):
        digest.update(chunk)
    return "xxh3_64:" + digest.hexdigest()


_CHECKSUM_READ_BYTES = 4 * 1024 * 1024
TEMP_MAX_AGE_SECONDS = 300.0
FRAME_STORE, HOT_FRAME_STORE = "frames", "hot-frames"  # decoded camera frames, and the hot pixels over encoded ones
STORE_DIRS = ("segments", FRAME_STORE, HOT_FRAME_STORE)  # a dataset cache's segment stores


@dataclass(frozen=True)
class Removed:
    """A file removed from the cache, and its size."""

    path: Path
    nbytes: int


def clean_temps(cache_dir: Path, max_age: float = TEMP_MAX_AGE_SECONDS) -> list[Removed]:
    """Remove temporary files that interrupted writes left in a dataset's cache directory.

    A segment's temps (`<name>.arrow.tmp`, its sidecar's `.<name>.json.*.tmp`) are only written under the
    segment's file lock, so they are removed only when that lock is free: a build running in another process
    (or thread) keeps its temp. Other temps (the index's `.index.json.*.tmp`) are written in one short call and
    are removed once older than `max_age` seconds."""
    removed: list[Removed] = []
    for tmp in sorted(tmp for store in STORE_DIRS for tmp in (cache_dir / store).glob("*.tmp")):
        name = tmp.name.removesuffix(".arrow.tmp") if tmp.name.endswith(".arrow.tmp") else _sidecar_stem(tmp.name)
        if name is None:
            removed += _remove_if_old(tmp, max_age)
            continue
        try:
            with FileLock(tmp.parent / f"{name}.lock", timeout=0):
                removed += remove_file(tmp)
        except Timeout:
            continue  # being written right now
    for tmp in sorted(cache_dir.glob(".*.tmp")) if cache_dir.is_dir() else []:
        removed += _remove_if_old(tmp, max_age)
    return removed


def _sidecar_stem(name: str) -> str | None:
    """`<name>` of a sidecar temp `.<name>.json.<random>.tmp` (see `app.files.write_atomically`), else None."""
    if not name.startswith(".") or ".json." not in name:
        return None
    return name[1:].rsplit(".json.", 1)[0]


def _remove_if_old(path: Path, max_age: float) -> list[Removed]:
    try:
        if time.time() - path.stat().st_mtime < max_age:
            return []
    except OSError:
        return []
    return remove_file(path)


def remove_file(path: Path) -> list[Removed]:
    """Remove `path` and report it (nothing when it is gone already or cannot be removed)."""
    try:
        nbytes = path.stat().st_size
        path.unlink()
    except OSError:
        return []
    return [Removed(path, nbytes)]

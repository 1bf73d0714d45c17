"""Frames by reference read only the cache's own files: a symlink planted inside `cache_dir` to a file outside it
is never followed, a FIFO (or anything but a regular file) there never blocks the client, and a `datasets/`
directory the operator symlinked elsewhere still works."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from episerve._local_frames import METADATA_KEY, FramesUnavailable, LocalFrames

SHAPE = [2, 2, 3]
KIND = pa.fixed_shape_tensor(pa.uint8(), SHAPE)


def _segment(path: Path, fill: int) -> np.ndarray:
    """A decoded-frame segment of 4 frames whose pixels are `fill + frame number`; returns the frames."""
    frames = (np.arange(4, dtype=np.uint8)[:, None] + fill).repeat(12, axis=1)
    column = pa.FixedSizeListArray.from_arrays(pa.array(frames.reshape(-1)), 12)
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("frame", column.type)])) as writer:
        writer.write_batch(pa.record_batch([column], names=["frame"]))
    return frames.reshape(4, *SHAPE)


def _references(relative: str, target: Path, rows: list[int]) -> pa.Table:
    """A take's camera column as the server sends it: references to `rows` of the segment at `relative`, with
    the identity (size, inode, mtime) of `target`, the file a reader following links would find."""
    stat = os.stat(target)
    entry = {"path": relative, "bytes": stat.st_size, "inode": stat.st_ino, "mtime_ns": stat.st_mtime_ns}
    described = {"shape": SHAPE, "segments": [entry]}
    references = pa.StructArray.from_arrays(
        [pa.array([0] * len(rows), pa.int32()), pa.array(rows, pa.int64())], ["segment", "row"]
    )
    field = pa.field("camera", references.type, metadata={METADATA_KEY: orjson.dumps(described)})
    return pa.Table.from_arrays([references], schema=pa.schema([field]))


def _pixels(table: pa.Table) -> np.ndarray:
    return np.stack([np.asarray(v, dtype=np.uint8).reshape(SHAPE) for v in table["camera"].to_pylist()])


def test_a_symlink_in_the_cache_to_a_file_outside_it_is_never_read(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _segment(cache / "datasets/d-1/frames/own.arrow", fill=10)
    _segment(tmp_path / "outside/secret.arrow", fill=200)
    planted = cache / "datasets/d-1/frames/planted.arrow"
    planted.symlink_to(tmp_path / "outside/secret.arrow")
    local = LocalFrames(cache)
    with pytest.raises(FramesUnavailable, match="symlink"):
        local.resolve(_references("datasets/d-1/frames/planted.arrow", planted, [0, 1]))
    # A directory of the cache replaced by a symlink to another directory: refused the same way.
    (cache / "datasets/d-2").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(FramesUnavailable, match="symlink"):
        local.resolve(_references("datasets/d-2/secret.arrow", tmp_path / "outside/secret.arrow", [0]))
    # The cache's own files are read as ever.
    own = local.resolve(_references("datasets/d-1/frames/own.arrow", cache / "datasets/d-1/frames/own.arrow", [3, 0]))
    assert _pixels(own).tolist() == [np.full(SHAPE, 13).tolist(), np.full(SHAPE, 10).tolist()]


def test_a_fifo_in_the_cache_never_blocks_the_client(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fifo = cache / "datasets/d-1/frames/fifo.arrow"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def resolve() -> None:
        try:
            LocalFrames(cache).resolve(_references("datasets/d-1/frames/fifo.arrow", fifo, [0]))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=resolve, daemon=True)
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():  # blocked opening the FIFO: let it go, then fail
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=5)
        pytest.fail("opening a FIFO in the cache blocked the client")
    assert len(outcome) == 1 and isinstance(outcome[0], FramesUnavailable), outcome
    assert "not a regular file" in str(outcome[0])


def test_a_datasets_directory_symlinked_elsewhere_still_works(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    frames = _segment(tmp_path / "big-disk/datasets/d-1/frames/0.arrow", fill=50)
    (cache / "datasets").symlink_to(tmp_path / "big-disk/datasets", target_is_directory=True)
    target = tmp_path / "big-disk/datasets/d-1/frames/0.arrow"
    got = LocalFrames(cache).resolve(_references("datasets/d-1/frames/0.arrow", target, [2, 1, 2]))
    assert _pixels(got).tolist() == frames[[2, 1, 2]].tolist()

"""Camera frames read straight from the server's decoded-frame cache, for a client on the same machine.

With `Client(cache_dir=...)` takes ask for camera frames as references (`frames: "references"`): for a camera
whose frames the server has decoded into segments, each row names a segment file (relative to the cache
directory) and a row of it, and this module maps the file and hands out the frames as zero-copy slices of the map.
They are copied once, channels-first, into the batch, as a local memory-mapped read would; no frame crosses a
socket. A file is used only if its size, inode and modification time are those of the file the server has mapped,
so a file rebuilt since (or another cache at that path) is never read; then the frames come over HTTP instead.
"""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import stat as stat_module
import threading
import time
import weakref
from collections import OrderedDict
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa

from episerve._encoded_frames import decode_frames
from episerve._numpy import fixed_width

METADATA_KEY = b"episerve.frames"  # names the description of a column of references in its field metadata
_FRAME = "frame"  # the pixels column of a decoded-frame segment
_OPEN_FILES = 16  # segment files kept mapped per client and process
_MISSES_BEFORE_PAUSING = 3  # takes in a row whose references could not be read...
_PAUSE_SECONDS = 60.0  # ...make the process ask for pixels only, for this long
_UNLINKED_CHECK_SECONDS = 1.0  # how often mapped files are checked for eviction by the server

log = logging.getLogger("episerve")


class FramesUnavailable(Exception):
    """A referenced segment file cannot be read from here (missing, rebuilt since, or not a segment)."""


class LocalFrames:
    """The server's cache directory as this machine sees it, and the segment files this process has mapped."""

    def __init__(self, cache_dir: str | os.PathLike[str]) -> None:
        directory = Path(cache_dir).expanduser()
        if not directory.is_dir():
            raise ValueError(f"cache_dir {str(directory)!r} is not a directory")
        self.cache_dir = directory.resolve()
        # Where segment paths start from: the cache directory, and its `datasets/` wherever the operator put it (a
        # symlink made when the cache was set up). Below that, no symlink is followed (`_open_confined`).
        self._datasets = (self.cache_dir / "datasets").resolve()
        self._paused_until = 0.0  # `time.monotonic()`, the same clock in every process of the machine
        self._misses = 0
        self._open: OrderedDict[tuple[Any, ...], _MappedSegment] = OrderedDict()
        self._lock = threading.Lock()
        self._checked_at = 0.0

    def __repr__(self) -> str:
        return f"LocalFrames({str(self.cache_dir)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"cache_dir": self.cache_dir, "paused_until": self._paused_until}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["cache_dir"])  # type: ignore[misc]
        self._paused_until = state["paused_until"]

    @property
    def in_use(self) -> bool:
        """Whether takes ask for references: not for a while after a few takes in a row could not read them."""
        return time.monotonic() >= self._paused_until

    def resolve(self, table: pa.Table) -> pa.Table:
        """`table` with each referenced camera column replaced by its frames (`FramesUnavailable` if some
        referenced file cannot be read here)."""
        self._drop_unlinked()
        for number, field in enumerate(table.schema):
            if field.metadata and METADATA_KEY in field.metadata:
                frames = self._frames(field.name, json.loads(field.metadata[METADATA_KEY]), table.column(number))
                table = table.set_column(number, pa.field(field.name, frames.type), frames)
        self._misses = 0
        return table

    def missed(self, error: FramesUnavailable) -> None:
        """Note a take whose references could not be read; after a few in a row, ask for pixels for a while."""
        self._misses += 1
        if self._misses == 1:
            log.warning("camera frames of a take come over HTTP: %s", error)
        if self._misses % _MISSES_BEFORE_PAUSING == 0:
            self._paused_until = time.monotonic() + _PAUSE_SECONDS
            if self._misses == _MISSES_BEFORE_PAUSING:
                log.warning(
                    "%d takes in a row could not read frames from %s; reading them over HTTP for %.0f s at a time",
                    self._misses,
                    self,
                    _PAUSE_SECONDS,
                )

    def _drop_unlinked(self) -> None:
        """Let go of mapped files the server has evicted (at most once a second), so their disk space is freed."""
        now = time.monotonic()
        if now - self._checked_at < _UNLINKED_CHECK_SECONDS:
            return
        self._checked_at = now
        with self._lock:
            for key, segment in list(self._open.items()):
                if segment.unlinked():
                    del self._open[key]

    def _frames(self, name: str, described: dict[str, Any], column: pa.ChunkedArray) -> pa.ChunkedArray:
        shape = [int(n) for n in described["shape"]]
        kind = pa.fixed_shape_tensor(pa.uint8(), shape)
        encoding = described.get("encoding")  # segments of encoded images (a JPEG tier), decoded here
        stored = pa.binary() if encoding is not None else kind
        segments = [self._segment(entry, stored) for entry in described["segments"]]
        references = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        segment_of = fixed_width(references.field(0), np.dtype(np.int32))
        row_of = fixed_width(references.field(1), np.dtype(np.int64))
        if len(segment_of) and (segment_of.min() < 0 or segment_of.max() >= len(segments)):
            raise FramesUnavailable("a reference names a segment the answer does not list")
        runs = pa.chunked_array(_runs(segments, segment_of, row_of), type=stored)
        if encoding is None:
            return runs
        return pa.chunked_array([decode_frames(name, encoding, tuple(shape), runs)], type=kind)

    def _segment(self, entry: dict[str, Any], kind: pa.DataType) -> _MappedSegment:
        path = self.cache_dir / entry["path"]
        key = (str(path), entry["bytes"], entry["inode"], entry["mtime_ns"], str(kind))
        with self._lock:
            segment = self._open.get(key)
            if segment is not None and segment.intact():
                self._open.move_to_end(key)
                return segment
        relative = PurePosixPath(entry["path"])
        if relative.is_absolute() or ".." in relative.parts:
            raise FramesUnavailable(f"segment path {entry['path']!r} lies outside {self.cache_dir}")
        segment = _MappedSegment(path, entry, kind, self._open_confined(relative))
        with self._lock:
            for stale in [k for k in self._open if k[0] == key[0]]:  # the file at this path before a rebuild:
                del self._open[stale]  # unmapped, so an evicted file's disk space is freed (as the server does)
            self._open[key] = segment
            while len(self._open) > _OPEN_FILES:
                self._open.popitem(last=False)
        return segment

    def _open_confined(self, relative: PurePosixPath) -> int:
        """A descriptor of the regular file at `relative` below the cache directory, reached without following
        any symlink (but a symlinked `datasets/`, resolved once): a symlink planted in the cache to a file outside
        it is refused, and so is anything but a regular file (opened non-blocking: a FIFO never blocks)."""
        parts = relative.parts
        if parts and parts[0] == "datasets":
            base, parts = self._datasets, parts[1:]
        else:
            base = self.cache_dir
        if not parts:
            raise FramesUnavailable(f"segment path {str(relative)!r} names no file")
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        if os.open not in os.supports_dir_fd or not nofollow:  # no openat (Windows): compare real paths
            target = (base / Path(*parts)).resolve()
            if not target.is_relative_to(self.cache_dir) and not target.is_relative_to(self._datasets):
                raise FramesUnavailable(f"segment path {str(relative)!r} leads outside {self.cache_dir}")
            try:
                return _regular_file(os.open(target, flags | getattr(os, "O_NONBLOCK", 0)), relative)
            except OSError as exc:
                raise FramesUnavailable(f"cannot open {target}: {exc.strerror}") from exc
        directory = getattr(os, "O_DIRECTORY", 0)
        try:
            descriptor = os.open(base, flags | directory)
        except OSError as exc:
            raise FramesUnavailable(f"cannot open {base}: {exc.strerror}") from exc
        try:
            for part in parts[:-1]:
                inner = os.open(part, flags | directory | nofollow, dir_fd=descriptor)
                os.close(descriptor)
                descriptor = inner
            found = os.open(parts[-1], flags | nofollow | os.O_NONBLOCK, dir_fd=descriptor)
        except OSError as exc:  # ELOOP, ENOTDIR: a symlink where a file or directory of the cache should be
            reason = "a symlink, not the cache's own file" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else None
            raise FramesUnavailable(f"cannot open {self.cache_dir / relative}: {reason or exc.strerror}") from exc
        finally:
            os.close(descriptor)
        return _regular_file(found, relative)


def _regular_file(descriptor: int, relative: PurePosixPath) -> int:
    """`descriptor`, if it is a regular file's (else closed, and `FramesUnavailable`)."""
    if not stat_module.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise FramesUnavailable(f"segment path {str(relative)!r} is not a regular file")
    return descriptor


class _MappedSegment:
    """One decoded-frame segment file, mapped read-only: its frames per record batch as tensor arrays (`kind`, a
    fixed-shape tensor type), or as the encoded images a JPEG tier keeps (`kind` binary)."""

    def __init__(self, path: Path, entry: dict[str, Any], kind: pa.DataType, descriptor: int) -> None:
        try:
            stat = os.fstat(descriptor)
            if (stat.st_size, stat.st_ino, stat.st_mtime_ns) != (entry["bytes"], entry["inode"], entry["mtime_ns"]):
                raise FramesUnavailable(f"{path} is not the file the server has mapped (rebuilt, or another cache)")
            try:
                mapped = mmap.mmap(descriptor, stat.st_size, prot=mmap.PROT_READ)
            except (OSError, ValueError) as exc:  # no descriptor left for the map, a file system without mmap
                raise FramesUnavailable(f"cannot map {path}: {exc}") from exc
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor = descriptor  # kept to notice the file's eviction and truncation (`unlinked`, `intact`)
        self._size = stat.st_size
        self._closer = weakref.finalize(self, os.close, descriptor)
        try:
            reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped)))
            column = reader.schema.get_field_index(_FRAME)
            stored = kind.storage_type if isinstance(kind, pa.FixedShapeTensorType) else kind
            if column < 0 or reader.schema.field(column).type != stored:
                raise FramesUnavailable(f"{path} holds no frames of type {kind}")
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except pa.ArrowException as exc:
            raise FramesUnavailable(f"{path} is not a decoded-frame segment: {exc}") from exc
        columns = [batch.column(column) for batch in batches]
        if isinstance(kind, pa.FixedShapeTensorType):
            columns = [pa.ExtensionArray.from_storage(kind, frames) for frames in columns]
        self.tensors = columns
        self.offsets = np.cumsum([0, *(batch.num_rows for batch in batches)])

    def unlinked(self) -> bool:
        """Whether the file was removed from the cache since it was mapped (the map still reads it whole)."""
        try:
            return os.fstat(self._descriptor).st_nlink == 0
        except OSError:
            return True

    def intact(self) -> bool:
        """False if the file was truncated since it was mapped: reading a mapped page past its end would kill the
        process with SIGBUS (one `fstat`, about a microsecond, per take)."""
        try:
            return os.fstat(self._descriptor).st_size >= self._size
        except OSError:
            return False


def _runs(segments: list[_MappedSegment], segment_of: np.ndarray, row_of: np.ndarray) -> list[pa.Array]:
    """The referenced frames in order, as slices of the maps: one per run of consecutive rows of one batch."""
    if len(row_of) == 0:
        return []
    batch_of = np.empty_like(row_of)
    within = np.empty_like(row_of)
    for number, segment in enumerate(segments):
        here = np.flatnonzero(segment_of == number)
        rows = row_of[here]
        if len(rows) and (rows.min() < 0 or rows.max() >= segment.offsets[-1]):
            raise FramesUnavailable(f"a row is past the end of a segment of {segment.offsets[-1]} frames")
        batch_of[here] = np.searchsorted(segment.offsets, rows, side="right") - 1
        within[here] = rows - segment.offsets[batch_of[here]]
    breaks = (np.diff(segment_of) != 0) | (np.diff(batch_of) != 0) | (np.diff(within) != 1)
    starts = [0, *(np.flatnonzero(breaks) + 1).tolist()]
    stops = [*starts[1:], len(row_of)]
    segment_at, batch_at, within_at = (values[starts].tolist() for values in (segment_of, batch_of, within))
    return [
        segments[segment].tensors[batch].slice(row, stop - start)
        for segment, batch, row, start, stop in zip(segment_at, batch_at, within_at, starts, stops, strict=True)
    ]

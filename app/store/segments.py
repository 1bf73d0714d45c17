"""The segment cache: one uncompressed Arrow IPC file per source parquet file, memory-mapped by every worker.

Guarantees, kept by the code below:
- Building streams record batches from the parquet file, so peak memory is about one batch, whatever the size
  of the file or of its row groups (from an object store too, see `app.sources.parquet`); with a `memory` budget
  (the worker's cold-read memory, `app.store.read_memory`), a build reserves that peak on it first, so builds and
  cold reads together stay within it.
- Publishing is atomic: write `<name>.arrow.tmp` (fsync'd unless segments are checksummed on open), drop the old
  sidecar, rename into place, then write the sidecar (itself atomically, fsync'd). A segment is served only when
  its sidecar matches the file on disk (size, rows, schema) and the current source fingerprint; anything else is
  deleted and rebuilt. A crash at any moment therefore leaves at worst a stray `.tmp` or a segment without a
  sidecar, neither of which is ever served.
- Each segment is built once: a file lock across processes, a lock per segment across threads (single-flight).
- Open segments live in a bounded LRU of memory maps, so huge datasets cannot exhaust file descriptors.

The files of a segment and their format are `app.store.segment_files`; mapping them, `app.store.mapped_segments`;
the background builders, `app.store.segment_builds`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import orjson
import pyarrow as pa
from filelock import FileLock

from app import metrics
from app.atomic_files import fsync_directory, write_atomically
from app.errors import DatasetError
from app.sources import Source, SourceFingerprint
from app.sources.files import is_remote_path, shown_path
from app.sources.parquet import BUILD_READ_BATCHES, REMOTE_BUFFER_BYTES
from app.sources.source import SourceReplaced
from app.store.build_backoff import BuildBackoff
from app.store.mapped_segments import Segment, SegmentLRU, map_segment
from app.store.read_memory import ColdReadMemory
from app.store.segment_builds import (
    STOPPING,
    BuildProgress,
    BuildStopped,
    ProgressCallback,
    background_builds,
    unless_stopping,
)
from app.store.segment_files import SegmentPaths, expected_sidecar, file_checksum, handle_checksum, read_sidecar

log = logging.getLogger("episerve.cache")

# A build's peak resident memory, estimated as a cold read's (`app.store.cold_reads`): its batch decoded about three
# times over and a buffered column chunk and a page per column, twice (the allocator's free pages), and from an
# object store what it fetches at once: the row groups of one read (`BUILD_READ_BATCHES` batches' worth), or the
# column chunks' buffers of a larger row group streamed.
_BUILD_DECODE_FACTOR = 3
_BUILD_COLUMN_BYTES = 2 * 1024 * 1024
_ALLOCATOR_SLACK = 2


class SourceChanged(Exception):
    """The source file no longer matches the fingerprint the caller holds: reload the dataset."""


class SegmentStore:
    """The segments of one dataset: `<cache>/segments/<name>.arrow` + `.json` sidecar + `.lock`.

    With `verify_on_open`, a segment this process did not build itself is checksummed when first opened, so
    flipped bytes on disk are caught before a single row is served (one sequential read per open).
    """

    def __init__(
        self,
        directory: Path,
        lru: SegmentLRU,
        batch_bytes: int = 8 * 1024 * 1024,
        verify_on_open: bool = True,
        builder: str = "rows",
        memory: ColdReadMemory | None = None,
    ) -> None:
        self.directory = directory
        self.memory = memory  # the budget a build reserves its memory on, if any
        self.builder = builder  # which background builder thread of the process builds this store's segments
        self.reader: Source | None = None  # the dataset's files, set (and renewed) when its index loads
        self.lru = lru
        self.batch_bytes = batch_bytes
        self.verify_on_open = verify_on_open
        self.builds = 0  # segments this process converted (for tests and status)
        self.building: dict[str, BuildProgress] = {}
        self._paths: dict[str, SegmentPaths] = {}
        self._queued: set[str] = set()
        self.backoff = BuildBackoff()  # background builds that failed wait before being queued again
        self._flights: dict[str, threading.Lock] = {}
        self._flights_lock = threading.Lock()

    @staticmethod
    def segment_name(source_path: str) -> str:
        """Stable per source file, so adding or removing other files never renames a segment."""
        stem = Path(source_path).stem[:40]
        return f"{stem}-{hashlib.sha256(source_path.encode()).hexdigest()[:12]}"

    @property
    def cache_root(self) -> Path:
        """The cache directory all datasets share (this store's dataset lies in its `datasets/`)."""
        return self.directory.parent.parent.parent

    def paths(self, source_path: str) -> SegmentPaths:
        paths = self._paths.get(source_path)
        if paths is None:
            name = self.segment_name(source_path)
            paths = self._paths[source_path] = SegmentPaths(
                arrow=self.directory / f"{name}.arrow",
                sidecar=self.directory / f"{name}.json",
                lock=self.directory / f"{name}.lock",
                tmp=self.directory / f"{name}.arrow.tmp",
            )
        return paths

    def open(self, source: SourceFingerprint, schema: pa.Schema, progress: ProgressCallback | None = None) -> Segment:
        """The validated segment of `source`, built first if missing, stale or damaged."""
        paths = self.paths(source.path)
        key = str(paths.arrow)
        segment = self._open_segment(key, source)
        if segment is not None:
            return segment
        with self._flight(key):
            segment = self._mapped(key, source)
            if segment is None:
                metrics.CACHE_MISSES.inc()
                segment = self._open_valid(paths, source, schema, self.verify_on_open)
            if segment is None:
                segment = self._build(paths, source, schema, progress)
            self.lru.put(key, segment)
            return segment

    def opened(self, source: SourceFingerprint) -> Segment | None:
        """The segment if this process has it mapped already; never maps, builds or waits."""
        return self._open_segment(str(self.paths(source.path).arrow), source)

    def open_if_built(self, source: SourceFingerprint, schema: pa.Schema) -> Segment | None:
        """The segment if it is open or valid on disk; None (without waiting) if it still has to be built."""
        paths = self.paths(source.path)
        key = str(paths.arrow)
        segment = self._open_segment(key, source)
        if segment is not None:
            return segment
        flight = self._flight(key)
        if not flight.acquire(blocking=False):
            return None  # being built by this process right now
        try:
            segment = self._open_valid(paths, source, schema, self.verify_on_open)
            if segment is not None:
                metrics.CACHE_MISSES.inc()
                self.lru.put(key, segment)
            return segment
        finally:
            flight.release()

    def _open_segment(self, key: str, source: SourceFingerprint) -> Segment | None:
        """The segment from the LRU of open memory maps, counted as a cache hit."""
        segment = self._mapped(key, source)
        if segment is not None:
            metrics.CACHE_HITS.inc()
        return segment

    def _mapped(self, key: str, source: SourceFingerprint) -> Segment | None:
        """The segment from the LRU of open memory maps; one whose file was truncated or replaced since is let go
        before anything reads it (the file at its path is then mapped, or rebuilt if it is truncated)."""
        segment = self.lru.get(key, source)
        change = None if segment is None else segment.changed_on_disk()
        if change is not None:
            level = logging.WARNING if change == "truncated" else logging.INFO
            log.log(level, "segment %s was %s on disk since it was mapped; reopening it", Path(key).name, change)
            self.lru.discard(key)
            return None
        return segment

    def queued(self, source_path: str) -> bool:
        """Whether a background build of this source file's segment is queued or under way in this process, or
        failed lately and waits out its backoff (`app.store.build_backoff`): either way, not to be queued now."""
        with self._flights_lock:
            return source_path in self._queued or self.backoff.waiting(source_path)

    def build_in_background(
        self, source: SourceFingerprint, schema: pa.Schema, admit: Callable[[], bool] | None = None
    ) -> None:
        """Queue a build of the segment (once; a failure is logged, and the next request queues it again once
        its backoff has passed: 1 s, doubling up to 30 s while it keeps failing). With `admit`, the build asks it
        again when it starts and is given up if it says no: builds queued together were admitted against the same
        room, and only by the time one starts are all the builds queued before it published."""
        with self._flights_lock:
            if source.path in self._queued or self.backoff.waiting(source.path):
                return
            self._queued.add(source.path)

        def build() -> None:
            try:
                if admit is not None and not admit():
                    log.info("background build of %s given up: its budget has no room for it now", source.path)
                elif not STOPPING.is_set():
                    self.open(source, schema, unless_stopping)
                    self.backoff.succeeded(source.path)
            except BuildStopped:
                log.info("background build of %s given up: the server is stopping", source.path)
            except SourceChanged:  # not a failure: the next request builds the new version
                log.info("background build of %s given up: the file changed", source.path)
            except DatasetError as exc:  # the store failing, a file unreadable: the message says it all
                delay = self.backoff.failed(source.path)
                log.warning("background build of %s failed: %s (next try in %g s)", source.path, exc.detail, delay)
            except Exception:
                delay = self.backoff.failed(source.path)
                log.exception("background build of %s failed (next try in %g s)", source.path, delay)
            finally:
                with self._flights_lock:
                    self._queued.discard(source.path)

        background_builds(self.builder).submit(build)

    def forget(self, segment: Segment) -> None:
        """Unmap a segment this process holds (e.g. one evicted or rebuilt by another process since), so the next
        request maps the file now at its path."""
        self.lru.discard(str(segment.path))

    def verify(self, source: SourceFingerprint, schema: pa.Schema) -> str | None:
        """None if the segment on disk is sound (or absent), else what is wrong with it."""
        paths = self.paths(source.path)
        if not paths.arrow.exists() and not paths.sidecar.exists():
            return None
        sidecar = read_sidecar(paths, source, schema)
        if sidecar is None:
            return "sidecar missing, unreadable or for another source version"
        if not paths.arrow.exists():
            return "segment file missing"
        size = paths.arrow.stat().st_size
        if size != sidecar["bytes"]:
            return f"size {size} differs from the sidecar's {sidecar['bytes']}"
        checksum = file_checksum(paths.arrow)
        if checksum != sidecar["checksum"]:
            return f"checksum {checksum} differs from the sidecar's {sidecar['checksum']}"
        if self._open_valid(paths, source, schema, verify=False) is None:
            return "unreadable as an Arrow IPC file of the expected schema and rows"
        return None

    def discard(self, source: SourceFingerprint) -> None:
        """Delete a segment (e.g. found damaged) so the next open rebuilds it."""
        paths = self.paths(source.path)
        with FileLock(paths.lock):
            paths.sidecar.unlink(missing_ok=True)
            paths.arrow.unlink(missing_ok=True)
        self.lru.discard(str(paths.arrow))

    def built_size(self, source: SourceFingerprint, schema: pa.Schema) -> int | None:
        """Bytes of the segment on disk if its sidecar and size say it is current, else None (cheap: no read)."""
        paths = self.paths(source.path)
        sidecar = read_sidecar(paths, source, schema)
        try:
            if sidecar is None or paths.arrow.stat().st_size != sidecar["bytes"]:
                return None
        except OSError:
            return None
        return int(sidecar["bytes"])

    def published_sizes(self) -> list[int]:
        """Bytes of each segment on disk that has its sidecar (cheap: a directory listing and a stat each)."""
        sizes = []
        for sidecar in self.directory.glob("*.json"):
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                sizes.append(sidecar.with_suffix(".arrow").stat().st_size)
        return sizes

    def _flight(self, key: str) -> threading.Lock:
        with self._flights_lock:
            return self._flights.setdefault(key, threading.Lock())

    def _open_valid(
        self, paths: SegmentPaths, source: SourceFingerprint, schema: pa.Schema, verify: bool = False
    ) -> Segment | None:
        sidecar = read_sidecar(paths, source, schema)
        if sidecar is None or sidecar["rows"] != source.rows:
            return None
        try:
            if paths.arrow.stat().st_size != sidecar["bytes"]:
                return None
            if verify and file_checksum(paths.arrow) != sidecar.get("checksum"):
                log.warning("segment %s fails its checksum; rebuilding it", paths.arrow.name)
                return None
        except OSError:
            return None
        return map_segment(paths.arrow, source, schema, sidecar["bytes"])

    def _build(
        self, paths: SegmentPaths, source: SourceFingerprint, schema: pa.Schema, progress: ProgressCallback | None
    ) -> Segment:
        self.directory.mkdir(parents=True, exist_ok=True)
        with FileLock(paths.lock):
            segment = self._open_valid(paths, source, schema, self.verify_on_open)  # another process's build
            if segment is not None:
                return segment
            paths.sidecar.unlink(missing_ok=True)
            self._check_unchanged(source)
            started = time.perf_counter()
            log.info("building segment %s from %s (%d rows)", paths.arrow.name, source.path, source.rows)
            state = self.building[source.path] = BuildProgress(source.path, source.rows, started=time.time())
            try:
                with self._build_memory(schema):
                    rows, nbytes, checksum = self._write_segment(source, paths.tmp, schema, state, progress)
            finally:
                self.building.pop(source.path, None)
            try:
                self._check_unchanged(source)
                if rows != source.rows:
                    raise SourceChanged(f"{source.path}: read {rows} rows, footer said {source.rows}")
            except SourceChanged:
                paths.tmp.unlink(missing_ok=True)
                raise
            os.replace(paths.tmp, paths.arrow)
            fsync_directory(self.directory)
            sidecar = {
                **expected_sidecar(source, schema),
                "rows": rows,
                "bytes": nbytes,
                "checksum": checksum,
                "built_by_pid": os.getpid(),
            }
            write_atomically(paths.sidecar, orjson.dumps(sidecar))
            with self._flights_lock:
                self.builds += 1
            elapsed = time.perf_counter() - started
            metrics.CACHE_BUILDS.inc()
            metrics.BUILD_SECONDS.observe(elapsed)
            metrics.BUILD_BYTES.inc(nbytes)
            log.info(
                "built segment %s: %d rows, %.1f MB in %.2f s (source %.1f MB/s)",
                paths.arrow.name,
                rows,
                nbytes / 1e6,
                elapsed,
                source.size / 1e6 / max(elapsed, 1e-9),
            )
            segment = self._open_valid(paths, source, schema)
        if segment is None:
            raise DatasetError(f"segment of {source.path!r} failed validation right after it was built")
        return segment

    def _write_segment(
        self,
        source: SourceFingerprint,
        tmp: Path,
        schema: pa.Schema,
        state: BuildProgress,
        progress: ProgressCallback | None,
    ) -> tuple[int, int, str]:
        """Stream the source file into an uncompressed Arrow IPC file; return rows, bytes, checksum."""
        rel = source.path
        try:
            rows = 0
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                for batch in self._batches(source, schema):
                    writer.write_batch(batch)
                    rows += batch.num_rows
                    state.rows_done, state.bytes_done = rows, sink.tell()
                    if progress is not None:
                        progress(batch.num_rows, batch.nbytes)
            with open(tmp, "rb+") as handle:
                if not self.verify_on_open:
                    # Verified segments need no fsync: after a power loss the checksum check on open catches
                    # whatever did not reach the disk, and the segment is rebuilt.
                    os.fsync(handle.fileno())
                nbytes = os.fstat(handle.fileno()).st_size
            checksum = file_checksum(tmp)
        except (OSError, pa.ArrowException) as exc:
            tmp.unlink(missing_ok=True)
            raise DatasetError(f"cannot convert {shown_path(self._source_files().root, rel)}: {exc}") from exc
        except SourceReplaced as exc:
            tmp.unlink(missing_ok=True)
            raise SourceChanged(exc.detail) from exc
        except BaseException:  # e.g. the object store failing mid-read: never leave a partial segment behind
            tmp.unlink(missing_ok=True)
            raise
        return rows, nbytes, checksum

    def sound_batches(self, source: SourceFingerprint, schema: pa.Schema) -> Iterator[pa.RecordBatch] | None:
        """The record batches of `source`'s built segment in `schema`, read from its file rather than a map, once
        the whole file matched its sidecar's checksum; None when no such segment is on disk. For a long read in
        the background (a segment made from another): a segment damaged since it was built is never copied, and a
        file truncated meanwhile fails the read (`OSError` or `ArrowInvalid`) instead of killing the process."""
        paths = self.paths(source.path)
        sidecar = read_sidecar(paths, source, schema)
        if sidecar is None or sidecar["rows"] != source.rows or "checksum" not in sidecar:
            return None
        try:
            handle = open(paths.arrow, "rb")  # noqa: SIM115 - closed by the generator below, or right here
        except OSError:
            return None
        try:
            sound = handle_checksum(handle) == sidecar["checksum"]
        except OSError:
            sound = False
        if not sound:
            handle.close()
            log.warning("segment %s fails its checksum; not read", paths.arrow.name)
            return None
        return _read_batches(handle)

    def _batches(self, source: SourceFingerprint, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """The record batches a segment of `source` in `schema` is written from: its file's, read in a stream."""
        return self._source_files().read_batches(source.path, schema, self.batch_bytes, source.etag)

    def _build_memory(self, schema: pa.Schema) -> contextlib.AbstractContextManager[None]:
        """A build's estimated peak memory reserved on the budget (nothing without one)."""
        if self.memory is None:
            return contextlib.nullcontext()
        held = _BUILD_DECODE_FACTOR * self.batch_bytes + _BUILD_COLUMN_BYTES * len(schema)
        fetched = 0
        if is_remote_path(self._source_files().root):
            fetched = max(BUILD_READ_BATCHES * self.batch_bytes, REMOTE_BUFFER_BYTES * len(schema))
        return self.memory.reserve(_ALLOCATOR_SLACK * held + fetched)

    def _source_files(self) -> Source:
        if self.reader is None:
            raise RuntimeError(f"segments in {self.directory} are built before their dataset's index is loaded")
        return self.reader

    def _check_unchanged(self, source: SourceFingerprint) -> None:
        if not self._source_files().is_unchanged(source):
            raise SourceChanged(f"{source.path} changed")


def _read_batches(handle: BinaryIO) -> Iterator[pa.RecordBatch]:
    """The record batches of the Arrow IPC file open as `handle`, one read at a time; the handle closed at the end."""
    with handle:
        handle.seek(0)
        reader = pa.ipc.open_file(pa.PythonFile(handle, mode="r"))
        for number in range(reader.num_record_batches):
            yield reader.get_batch(number)

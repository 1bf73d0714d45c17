"""The segment cache: one uncompressed Arrow IPC file per source parquet file, memory-mapped by every worker.

Guarantees, kept by the code below:
- Building streams record batches from the parquet file, so peak memory is about one batch, whatever the size
  of the file.
- Publishing is atomic: write `<name>.arrow.tmp` (fsync'd unless segments are checksummed on open), drop the old
  sidecar, rename into place, then write the sidecar (itself atomically, fsync'd). A segment is served only when
  its sidecar matches the file on disk (size, rows, schema) and the current source fingerprint; anything else is
  deleted and rebuilt. A crash at any moment therefore leaves at worst a stray `.tmp` or a segment without a
  sidecar, neither of which is ever served.
- Each segment is built once: a file lock across processes, a lock per segment across threads (single-flight).
- Open segments live in a bounded LRU of memory maps, so huge datasets cannot exhaust file descriptors.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
import pyarrow as pa
import xxhash
from filelock import FileLock, Timeout

from app import metrics
from app.errors import DatasetError
from app.sources import Source, SourceFingerprint, schema_hash
from app.sources.files import shown_path
from app.sources.source import SourceReplaced
from app.store.atomic_files import fsync_directory, write_atomically
from app.store.build_backoff import BuildBackoff

SEGMENT_FORMAT = 2
_UNKNOWN = object()  # not looked at yet (None is an answer)
_SELECTIONS_REMEMBERED = 16
V = TypeVar("V")


def _remembered(cache: dict[Any, V], key: Any, compute: Callable[[], V]) -> V:
    """`cache[key]`, computed on first use. Per-selection caches of a segment keep a few selections: a full one is
    emptied rather than grown (clients use a handful of column selections)."""
    found = cache.get(key, _UNKNOWN)
    if found is _UNKNOWN:
        found = compute()
        if len(cache) >= _SELECTIONS_REMEMBERED:
            cache.clear()
        cache[key] = found
    return found  # type: ignore[return-value]


log = logging.getLogger("episerve.cache")


class SourceChanged(Exception):
    """The source file no longer matches the fingerprint the caller holds: reload the dataset."""


@dataclass
class Segment:
    """An open, validated segment: zero-copy record batches over a memory map."""

    name: str
    source: SourceFingerprint
    batches: list[pa.RecordBatch]
    batch_offsets: np.ndarray  # row offset of each batch, plus the total at the end
    nbytes: int
    path: Path | None = None  # the mapped file, re-checked by `intact`
    inode: int | None = None
    mtime_ns: int | None = None  # with `inode` and `nbytes`, tells this file from a later rebuild at the same path
    _projections: dict[tuple[str, ...], list[pa.RecordBatch]] = field(default_factory=dict, repr=False)
    _row_bytes: dict[tuple[str, ...] | None, float] = field(default_factory=dict, repr=False)
    _derived: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._offsets_list = self.batch_offsets.tolist()
        self._path_text = str(self.path) if self.path is not None else ""  # os.stat of a str is the cheapest

    @property
    def num_rows(self) -> int:
        return int(self.batch_offsets[-1])

    def intact(self) -> bool:
        """False if the mapped file was truncated since it was mapped (one `stat`, about a microsecond).

        Reading a mapped page past the end of a truncated file raises SIGBUS, which kills the worker, so every
        request re-checks the segments it is about to read. A file replaced by a rebuild (another inode) is
        fine: this map still holds the old, complete file."""
        if self.path is None:
            return True
        try:
            stat = os.stat(self._path_text)
        except OSError:
            return True  # unlinked: the mapped inode lives on, untouched
        return stat.st_ino != self.inode or stat.st_size >= self.nbytes

    def at_path(self) -> bool:
        """Whether the file at `path` is still the one mapped here (not unlinked by an eviction, nor replaced by a
        rebuild in another process): what a reader of that path would find."""
        if self.path is None:
            return False
        try:
            stat = os.stat(self._path_text)
        except OSError:
            return False
        return (stat.st_ino, stat.st_size, stat.st_mtime_ns) == (self.inode, self.nbytes, self.mtime_ns)

    def slice(self, start: int, stop: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """Rows [start, stop) as zero-copy slices of the stored batches."""
        number = int(np.searchsorted(self.batch_offsets, start, side="right")) - 1
        while start < stop:
            offset = int(self.batch_offsets[number])
            end = min(stop, int(self.batch_offsets[number + 1]))
            piece = self.batches[number].slice(start - offset, end - start)
            yield piece.select(columns) if columns is not None else piece
            start = end
            number += 1

    def row(self, row: int, columns: list[str] | None = None) -> pa.RecordBatch:
        """One stored row as a zero-copy, one-row slice."""
        number = bisect.bisect_right(self._offsets_list, row) - 1
        return self.projected(columns)[number].slice(row - self._offsets_list[number], 1)

    def projected(self, columns: list[str] | None) -> list[pa.RecordBatch]:
        """The stored batches restricted to `columns` (zero-copy; remembered per selection)."""
        if columns is None:
            return self.batches
        return _remembered(self._projections, tuple(columns), lambda: [b.select(columns) for b in self.batches])

    def row_bytes(self, columns: list[str] | None = None) -> float:
        """Average stored bytes per row of the selected columns (remembered per selection)."""
        key = None if columns is None else tuple(columns)
        return _remembered(
            self._row_bytes, key, lambda: sum(b.nbytes for b in self.projected(columns)) / max(1, self.num_rows)
        )

    def derived(self, key: Any, compute: Callable[[], V]) -> V:
        """What `compute` derives from this segment's maps, remembered under `key` (a few keys are kept)."""
        return _remembered(self._derived, key, compute)

    def take(self, rows: np.ndarray, columns: list[str] | None = None) -> list[pa.RecordBatch]:
        """Rows at the given positions (ascending), gathered batch by batch so no whole column is touched."""
        numbers = np.searchsorted(self.batch_offsets, rows, side="right") - 1
        bounds = np.flatnonzero(np.diff(numbers)) + 1
        pieces = []
        batches = self.projected(columns)
        for group in np.split(np.arange(len(rows)), bounds):
            number = int(numbers[group[0]])
            pieces.append(batches[number].take(pa.array(rows[group] - self.batch_offsets[number])))
        return pieces


class SegmentLRU:
    """Process-wide bounded map of open segments, least recently used evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Segment] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, source: SourceFingerprint) -> Segment | None:
        with self._lock:
            segment = self._items.get(key)
            if segment is None:
                return None
            if segment.source != source:
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return segment

    def put(self, key: str, segment: Segment) -> None:
        with self._lock:
            self._items[key] = segment
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)  # mapped buffers stay valid while a response still uses them
            metrics.OPEN_SEGMENTS.set(len(self._items))

    def discard(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)
            metrics.OPEN_SEGMENTS.set(len(self._items))

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class _SegmentPaths:
    arrow: Path
    sidecar: Path
    lock: Path
    tmp: Path


@dataclass
class BuildProgress:
    """A build under way in this process."""

    source: str
    rows_total: int
    rows_done: int = 0
    bytes_done: int = 0
    started: float = 0.0


ProgressCallback = Callable[[int, int], None]  # (rows, bytes) written by the latest batch


def estimated_segment_bytes(schema: pa.Schema, rows: int) -> int:
    """About how large a segment of `rows` rows of a fixed-width `schema` is on disk (variable-width columns are
    counted at 16 bytes a value)."""
    row = 0
    for field_ in schema:
        kind, count = field_.type, 1
        while isinstance(kind, pa.FixedSizeListType):
            kind, count = kind.value_type, count * kind.list_size
        try:
            row += count * max(1, kind.bit_width // 8)
        except ValueError:
            row += count * 16
    return rows * row + 64 * 1024  # plus the IPC file's framing and footer, roughly


def file_checksum(path: Path) -> str:
    """Checksum of a whole file, read through a memory map (`xxh3_64:<hex>`)."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return "xxh3_64:" + xxhash.xxh3_64_hexdigest(b"")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return "xxh3_64:" + xxhash.xxh3_64_hexdigest(mapped)


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
    ) -> None:
        self.directory = directory
        self.builder = builder  # which background builder thread of the process builds this store's segments
        self.reader: Source | None = None  # the dataset's files, set (and renewed) when its index loads
        self.lru = lru
        self.batch_bytes = batch_bytes
        self.verify_on_open = verify_on_open
        self.builds = 0  # segments this process converted (for tests and status)
        self.building: dict[str, BuildProgress] = {}
        self._paths: dict[str, _SegmentPaths] = {}
        self._queued: set[str] = set()
        self.backoff = BuildBackoff()  # background builds that failed wait before being queued again
        self._flights: dict[str, threading.Lock] = {}
        self._flights_lock = threading.Lock()

    @staticmethod
    def segment_name(source_path: str) -> str:
        """Stable per source file, so adding or removing other files never renames a segment."""
        stem = Path(source_path).stem[:40]
        return f"{stem}-{hashlib.sha256(source_path.encode()).hexdigest()[:12]}"

    def paths(self, source_path: str) -> _SegmentPaths:
        paths = self._paths.get(source_path)
        if paths is None:
            name = self.segment_name(source_path)
            paths = self._paths[source_path] = _SegmentPaths(
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
        """The segment from the LRU of open memory maps; a truncated one is dropped (and so rebuilt)."""
        segment = self.lru.get(key, source)
        if segment is not None and not segment.intact():
            log.warning("segment %s was truncated on disk; rebuilding it", Path(key).name)
            self.lru.discard(key)
            return None
        return segment

    def queued(self, source_path: str) -> bool:
        """Whether a background build of this source file's segment is queued or under way in this process, or
        failed lately and waits out its backoff (`app.store.build_backoff`): either way, not to be queued now."""
        with self._flights_lock:
            return source_path in self._queued or self.backoff.waiting(source_path)

    def build_in_background(self, source: SourceFingerprint, schema: pa.Schema) -> None:
        """Queue a build of the segment (once; a failure is logged, and the next request queues it again once
        its backoff has passed: 1 s, doubling up to 30 s while it keeps failing)."""
        with self._flights_lock:
            if source.path in self._queued or self.backoff.waiting(source.path):
                return
            self._queued.add(source.path)

        def build() -> None:
            try:
                if not _STOPPING.is_set():
                    self.open(source, schema, _unless_stopping)
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

        _background_builds(self.builder).submit(build)

    def verify(self, source: SourceFingerprint, schema: pa.Schema) -> str | None:
        """None if the segment on disk is sound (or absent), else what is wrong with it."""
        paths = self.paths(source.path)
        if not paths.arrow.exists() and not paths.sidecar.exists():
            return None
        sidecar = self._read_sidecar(paths, source, schema)
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
        sidecar = self._read_sidecar(paths, source, schema)
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
        self, paths: _SegmentPaths, source: SourceFingerprint, schema: pa.Schema, verify: bool = False
    ) -> Segment | None:
        sidecar = self._read_sidecar(paths, source, schema)
        if sidecar is None:
            return None
        try:
            stat = paths.arrow.stat()
            if stat.st_size != sidecar["bytes"]:
                return None
            if verify and file_checksum(paths.arrow) != sidecar.get("checksum"):
                log.warning("segment %s fails its checksum; rebuilding it", paths.arrow.name)
                return None
            reader = pa.ipc.open_file(pa.memory_map(str(paths.arrow)))
            if not reader.schema.equals(schema, check_metadata=True):
                return None
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except (OSError, pa.ArrowException):
            return None
        offsets = np.zeros(len(batches) + 1, dtype=np.int64)
        np.cumsum([b.num_rows for b in batches], out=offsets[1:])
        if offsets[-1] != sidecar["rows"] or offsets[-1] != source.rows:
            return None
        return Segment(
            paths.arrow.stem, source, batches, offsets, sidecar["bytes"], paths.arrow, stat.st_ino, stat.st_mtime_ns
        )

    def _read_sidecar(self, paths: _SegmentPaths, source: SourceFingerprint, schema: pa.Schema) -> dict | None:
        try:
            sidecar = orjson.loads(paths.sidecar.read_bytes())
        except (OSError, ValueError):
            return None
        expected = {"format": SEGMENT_FORMAT, "source": source.to_dict(), "schema_hash": schema_hash(schema)}
        if any(sidecar.get(k) != v for k, v in expected.items()):
            return None
        return sidecar

    def _build(
        self, paths: _SegmentPaths, source: SourceFingerprint, schema: pa.Schema, progress: ProgressCallback | None
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
                "format": SEGMENT_FORMAT,
                "source": source.to_dict(),
                "schema_hash": schema_hash(schema),
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
                for batch in self._source_files().read_batches(rel, schema, self.batch_bytes, source.etag):
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

    def _source_files(self) -> Source:
        if self.reader is None:
            raise RuntimeError(f"segments in {self.directory} are built before their dataset's index is loaded")
        return self.reader

    def _check_unchanged(self, source: SourceFingerprint) -> None:
        if not self._source_files().is_unchanged(source):
            raise SourceChanged(f"{source.path} changed")


TEMP_MAX_AGE_SECONDS = 300.0
STORE_DIRS = ("segments", "frames")  # a dataset cache's segment stores: rows, and decoded camera frames


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


class BuildStopped(Exception):
    """A background build given up between two batches because the process is stopping (nothing is published,
    and its temporary file is removed)."""


_STOPPING = threading.Event()
_BUILDERS: dict[str, ThreadPoolExecutor] = {}
_BUILDERS_LOCK = threading.Lock()


def _background_builds(builder: str) -> ThreadPoolExecutor:
    """One builder thread per process and kind of segment: background builds queue up instead of competing for
    the CPU, and a long decode of a video never holds up the conversion of a parquet file."""
    with _BUILDERS_LOCK:
        executor = _BUILDERS.get(builder)
        if executor is None:
            executor = _BUILDERS[builder] = ThreadPoolExecutor(1, thread_name_prefix=f"episerve-build-{builder}")
        return executor


def stop_background_builds() -> None:
    """Give up this process's background builds, queued or under way (at the next batch), so that stopping the
    server does not wait for a whole video to decode; a later request queues them again."""
    _STOPPING.set()
    with _BUILDERS_LOCK:
        executors = list(_BUILDERS.values())
    for executor in executors:
        executor.shutdown(wait=False, cancel_futures=True)


def _unless_stopping(rows: int, nbytes: int) -> None:
    if _STOPPING.is_set():
        raise BuildStopped

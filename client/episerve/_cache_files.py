"""The server's cache directory as this machine sees it: the segment files a take references, mapped in place.

Camera frames (`episerve._local_frames`) and rows (`episerve._local_rows`) come by reference the same way: the
server names segment files relative to its cache directory, with the size, inode and modification time of the file
it has mapped. A file is opened without following any symlink below the directory (a file planted there to point
elsewhere is refused, and so is anything but a regular file), used only if it is the file the server described
(never one rebuilt since, nor another cache's), mapped read-only, and kept mapped in a small per-process LRU; a
file the server has evicted is let go within a second, so its disk space is freed. A take whose references cannot
be read comes over HTTP instead; a few such takes in a row make the process ask for values for a while.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import stat as stat_module
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, Generic, TypeVar

import pyarrow as pa

_MISSES_BEFORE_PAUSING = 3  # takes in a row whose references could not be read...
_PAUSE_SECONDS = 60.0  # ...make the process ask for values only, for this long
_UNLINKED_CHECK_SECONDS = 1.0  # how often mapped files are checked for eviction by the server

T = TypeVar("T")
log = logging.getLogger("episerve")


class SegmentUnavailable(Exception):
    """A referenced segment file cannot be read from here (missing, rebuilt since, or not a segment)."""


class CacheFiles(Generic[T]):
    """The segment files of the server's cache directory this process has mapped, at most `capacity` of them,
    each with what `parse` made of it once."""

    def __init__(self, cache_dir: str | os.PathLike[str], capacity: int) -> None:
        directory = Path(cache_dir).expanduser()
        if not directory.is_dir():
            raise ValueError(f"cache_dir {str(directory)!r} is not a directory")
        self.cache_dir = directory.resolve()
        # Where segment paths start from: the cache directory, and its `datasets/` wherever the operator put it (a
        # symlink made when the cache was set up). Below that, no symlink is followed (`_open_confined`).
        self._datasets = (self.cache_dir / "datasets").resolve()
        self._capacity = capacity
        self._open: OrderedDict[tuple[Any, ...], MappedFile[T]] = OrderedDict()
        self._lock = threading.Lock()
        self._checked_at = 0.0

    def mapped(self, entry: dict[str, Any], kind: str, parse: Callable[[Path, pa.Buffer], T]) -> MappedFile[T]:
        """The file `entry` describes (`path` relative to the cache directory, `bytes`, `inode`, `mtime_ns`),
        mapped, with `parse(path, map)` made of it, remembered under `kind` (`SegmentUnavailable` if it is not
        that file or `parse` refuses it)."""
        key = (entry["path"], entry["bytes"], entry["inode"], entry["mtime_ns"], kind)
        with self._lock:
            found = self._open.get(key)
            if found is not None and found.intact():
                self._open.move_to_end(key)
                return found
        path = self.cache_dir / entry["path"]
        relative = PurePosixPath(entry["path"])
        if relative.is_absolute() or ".." in relative.parts:
            raise SegmentUnavailable(f"segment path {entry['path']!r} lies outside {self.cache_dir}")
        found = MappedFile(path, entry, self._open_confined(relative), parse)
        with self._lock:
            for stale in [k for k in self._open if k[0] == key[0]]:  # the file at this path before a rebuild:
                del self._open[stale]  # unmapped, so an evicted file's disk space is freed (as the server does)
            self._open[key] = found
            while len(self._open) > self._capacity:
                self._open.popitem(last=False)
        return found

    def drop_unlinked(self) -> None:
        """Let go of mapped files the server has evicted (at most once a second), so their disk space is freed."""
        now = time.monotonic()
        if now - self._checked_at < _UNLINKED_CHECK_SECONDS:
            return
        self._checked_at = now
        with self._lock:
            for key, found in list(self._open.items()):
                if found.unlinked():
                    del self._open[key]

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
            raise SegmentUnavailable(f"segment path {str(relative)!r} names no file")
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        if os.open not in os.supports_dir_fd or not nofollow:  # no openat (Windows): compare real paths
            target = (base / Path(*parts)).resolve()
            if not target.is_relative_to(self.cache_dir) and not target.is_relative_to(self._datasets):
                raise SegmentUnavailable(f"segment path {str(relative)!r} leads outside {self.cache_dir}")
            try:
                return _regular_file(os.open(target, flags | getattr(os, "O_NONBLOCK", 0)), relative)
            except OSError as exc:
                raise SegmentUnavailable(f"cannot open {target}: {exc.strerror}") from exc
        directory = getattr(os, "O_DIRECTORY", 0)
        try:
            descriptor = os.open(base, flags | directory)
        except OSError as exc:
            raise SegmentUnavailable(f"cannot open {base}: {exc.strerror}") from exc
        try:
            for part in parts[:-1]:
                inner = os.open(part, flags | directory | nofollow, dir_fd=descriptor)
                os.close(descriptor)
                descriptor = inner
            found = os.open(parts[-1], flags | nofollow | os.O_NONBLOCK, dir_fd=descriptor)
        except OSError as exc:  # ELOOP, ENOTDIR: a symlink where a file or directory of the cache should be
            reason = "a symlink, not the cache's own file" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else None
            raise SegmentUnavailable(f"cannot open {self.cache_dir / relative}: {reason or exc.strerror}") from exc
        finally:
            os.close(descriptor)
        return _regular_file(found, relative)


def _regular_file(descriptor: int, relative: PurePosixPath) -> int:
    """`descriptor`, if it is a regular file's (else closed, and `SegmentUnavailable`)."""
    if not stat_module.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise SegmentUnavailable(f"segment path {str(relative)!r} is not a regular file")
    return descriptor


class MappedFile(Generic[T]):
    """One segment file, mapped read-only, and what was parsed from it (`content`)."""

    def __init__(
        self, path: Path, entry: dict[str, Any], descriptor: int, parse: Callable[[Path, pa.Buffer], T]
    ) -> None:
        try:
            stat = os.fstat(descriptor)
            if (stat.st_size, stat.st_ino, stat.st_mtime_ns) != (entry["bytes"], entry["inode"], entry["mtime_ns"]):
                raise SegmentUnavailable(f"{path} is not the file the server has mapped (rebuilt, or another cache)")
            try:
                mapped = mmap.mmap(descriptor, stat.st_size, prot=mmap.PROT_READ)
            except (OSError, ValueError) as exc:  # no descriptor left for the map, a file system without mmap
                raise SegmentUnavailable(f"cannot map {path}: {exc}") from exc
        except BaseException:
            os.close(descriptor)
            raise
        self._descriptor = descriptor  # kept to notice the file's eviction and truncation (`unlinked`, `intact`)
        self._size = stat.st_size
        self._closer = weakref.finalize(self, os.close, descriptor)
        self.content = parse(path, pa.py_buffer(mapped))

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


class LocalReferences(Generic[T]):
    """References of one kind (to `noun`) read from the cache directory by this process: its
    mapped files, and whether takes ask for references at all (not for a while after a few in a row missed)."""

    noun = "segments"  # in the warnings: "<noun> of a take come over HTTP", "could not read <short noun>"
    short_noun = "segments"
    capacity = 16  # segment files kept mapped per client and process

    def __init__(self, cache_dir: str | os.PathLike[str]) -> None:
        self.files: CacheFiles[T] = CacheFiles(cache_dir, self.capacity)
        self.cache_dir = self.files.cache_dir
        self._paused_until = 0.0  # `time.monotonic()`, the same clock in every process of the machine
        self._misses = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.cache_dir)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"cache_dir": self.cache_dir, "paused_until": self._paused_until}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["cache_dir"])  # type: ignore[misc]
        self._paused_until = state["paused_until"]

    @property
    def in_use(self) -> bool:
        """Whether takes ask for references: not for a while after a few takes in a row could not read them."""
        return time.monotonic() >= self._paused_until

    def read(self) -> None:
        """Note a take whose references were read."""
        self._misses = 0

    def missed(self, error: Exception) -> None:
        """Note a take whose references could not be read; after a few in a row, ask for values for a while."""
        self._misses += 1
        if self._misses == 1:
            log.warning("%s of a take come over HTTP: %s", self.noun, error)
        if self._misses % _MISSES_BEFORE_PAUSING == 0:
            self._paused_until = time.monotonic() + _PAUSE_SECONDS
            if self._misses == _MISSES_BEFORE_PAUSING:
                log.warning(
                    "%d takes in a row could not read %s from %s; reading them over HTTP for %.0f s at a time",
                    self._misses,
                    self.short_noun,
                    self,
                    _PAUSE_SECONDS,
                )

"""Every file the cache publishes — segments, their sidecars, `index.json`, decoded-frame segments and their
sidecars — appears under its name only by a rename of a complete temporary file, never by writing in place.

Observed at the OS level: this process watches the cache's directories with inotify while a real
`episerve-server warm` process (rows and camera frames) fills them. A file written in place shows as created or
modified under its final name, which a reader could open half-written (and a crash would leave behind); a
published one only ever shows as moved to its name. Were `write_atomically` or the segment publish a plain write,
this test would fail (checked by turning each into one)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import sys
from pathlib import Path

import pytest

from app.demo import write_demo_dataset
from tests.test_operations import run_cli

if not sys.platform.startswith("linux"):
    pytest.skip("inotify is Linux's", allow_module_level=True)

IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class Watch:
    """inotify watches on some directories; `events()` drains what happened in them as (directory, name, mask)."""

    def __init__(self, directories: list[Path]) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.directories: dict[int, Path] = {}
        for directory in directories:
            mask = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(directory), mask)
            assert wd >= 0, os.strerror(ctypes.get_errno())
            self.directories[wd] = directory

    def events(self) -> list[tuple[Path, str, int]]:
        found = []
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + size].rstrip(b"\0").decode()
                found.append((self.directories[wd], name, mask))
                offset += _EVENT.size + size

    def close(self) -> None:
        os.close(self.fd)


def _published(name: str) -> bool:
    """A name readers open: not a temporary file, not a build lock."""
    return not name.endswith(".tmp") and not name.endswith(".lock")


def test_every_cache_file_is_published_by_a_rename_never_written_in_place(tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    write_demo_dataset(root / "demo", episodes=6, files=2)  # with two cameras
    location = ["--root", str(root), "--cache-dir", str(cache)]
    # A first warm makes the dataset's cache directories; its files are removed, to be published again, watched.
    assert run_cli("warm", "demo", "--episodes", "0", "--videos", *location).returncode == 0
    (dataset_dir,) = (cache / "datasets").iterdir()
    directories = [dataset_dir, dataset_dir / "segments", dataset_dir / "frames"]
    for directory in directories:
        for path in directory.iterdir():
            if path.is_file():
                path.unlink()

    watch = Watch(directories)
    try:
        warm = run_cli("warm", "demo", "--videos", *location)
        assert warm.returncode == 0, warm.stderr
        events = watch.events()
    finally:
        watch.close()

    in_place = sorted(
        f"{directory.name}/{name}"
        for directory, name, mask in events
        if _published(name) and mask & (IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE)
    )
    assert in_place == [], f"written in place under the name readers open: {in_place}"
    renamed = {(directory.name, name) for directory, name, mask in events if mask & IN_MOVED_TO}
    on_disk = {
        (directory.name, path.name) for directory in directories for path in directory.iterdir() if path.is_file()
    }
    published = {entry for entry in on_disk if _published(entry[1])}
    assert published == renamed & published, f"published without a rename: {sorted(published - renamed)}"
    kinds = {(d, Path(n).suffix) for d, n in published}
    # Every kind of file the cache publishes was seen: rows' and frames' segments and sidecars, and the index.
    assert {("segments", ".arrow"), ("segments", ".json"), ("frames", ".arrow"), ("frames", ".json")} <= kinds
    assert (dataset_dir.name, "index.json") in published
    # The watch saw the writes themselves, into the temporary files.
    assert any(mask & IN_MODIFY and name.endswith(".tmp") for _, name, mask in events)

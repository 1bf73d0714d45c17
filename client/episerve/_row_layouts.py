"""Where a view's rows lie in the server's segment cache, so a client on the same machine takes them with no request.

A take by reference (`episerve._local_rows`) still costs one request a batch: small, but a request costs the
server more CPU than the gather it saves, and a map-style loader makes one per batch. So a client with
`cache_dir=` asks once for the view's layout (`POST /datasets/{id}/rows/layout`: its runs of rows and the built
segment file of each source file it reads, see `app.reads.row_references`) and takes rows from those files itself
for as long as the server says (`EPISERVE_ROW_LAYOUT_S`, a second by default), then asks again: what the server has
rebuilt or evicted since (a source file that changed, a segment built meanwhile) is seen within that time. Until
then a take reads the rows as the layout's files hold them, a consistent earlier state: a file is opened only if it
is the one the layout names (`episerve._cache_files`), and a file mapped here stays readable when the server
replaces or evicts it. Rows whose file has no segment built yet, windowed reads and cameras are taken with a
request as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from episerve._errors import ServerError, Unavailable
from episerve._selection import Selection

_REFUSED_SECONDS = 1.0  # a layout refused for now, or naming a file not readable here, is asked again after this
_KNOWN_LAYOUTS = 1024  # views and column sets a process takes from (a mixture's components, each a few KB)
log = logging.getLogger("episerve")


Located = tuple[list[dict[str, Any]], np.ndarray, np.ndarray]  # segments, each row's segment among them, its row


@dataclass(frozen=True)
class RowLayout:
    """A view's rows in the segment cache: `rows` in the view, the `columns` read, the runs (`offsets`: where each
    starts in the view, then `rows`; `files`: its source file; `starts`: its first row of that file's segment),
    each built segment's description by source file (`segments`), and when it is asked again (`until`)."""

    rows: int
    columns: list[str]
    offsets: np.ndarray
    files: np.ndarray
    starts: np.ndarray
    segments: dict[int, dict[str, Any]]
    until: float

    @classmethod
    def parse(cls, document: dict[str, Any], now: float) -> RowLayout | None:
        """The layout a `/rows/layout` answer describes, asked at `now`; None when the server says not to use it
        (no `seconds`)."""
        if document["seconds"] <= 0:
            return None
        offsets = np.asarray(document["offsets"], dtype=np.int64)
        files = np.asarray(document["files"], dtype=np.int64)
        starts = np.asarray(document["starts"], dtype=np.int64)
        if len(offsets) != len(files) + 1 or len(starts) != len(files) or offsets[-1] != document["rows"]:
            raise ValueError("a row layout whose runs do not add up")
        segments = {int(entry["file"]): entry for entry in document["segments"]}
        until = now + float(document["seconds"])
        return cls(int(document["rows"]), list(document["columns"]), offsets, files, starts, segments, until)

    def locate(self, positions: np.ndarray) -> Located | None:
        """The segments view `positions` lie in, and for each position the index of its segment among them and its
        row of that segment; None when a position is beyond the view or lies in a file whose segment is not listed."""
        if len(positions) == 0 or positions.min() < 0 or positions.max() >= self.rows:
            return None
        run = np.searchsorted(self.offsets, positions, side="right") - 1
        files = self.files[run]
        rows = self.starts[run] + (positions - self.offsets[run])
        first = files[0]
        touched = [int(first)] if (files == first).all() else np.unique(files).tolist()
        entries = [self.segments.get(number) for number in touched]
        if any(entry is None for entry in entries):
            return None
        if len(touched) == 1:
            segment_of = np.zeros(len(positions), dtype=np.int32)
        else:
            segment_of = np.searchsorted(np.asarray(touched), files).astype(np.int32)
        return entries, segment_of, rows  # type: ignore[return-value]


class RowLayouts:
    """The layouts this process knows, by view and columns, each asked with `fetch` (a `/rows/layout` answer) and
    asked again after the `seconds` it states; the most recently used `_KNOWN_LAYOUTS` are kept."""

    def __init__(self, fetch: Callable[[Selection], dict[str, Any]]) -> None:
        self._fetch = fetch
        self._known: OrderedDict[tuple[Any, ...], RowLayout | float] = OrderedDict()  # or until when none is asked
        self._warned: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()
        self.supported = True  # False once the server has no layouts (an older one, or EPISERVE_ROW_LAYOUT_S=0)

    def __getstate__(self) -> dict[str, Any]:  # a copy (a spawned DataLoader worker's) asks its own layouts
        return {"fetch": self._fetch, "supported": self.supported}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["fetch"])  # type: ignore[misc]
        self.supported = state["supported"]

    def current(self, selection: Selection) -> RowLayout | None:
        """The layout of `selection`'s view, asked if not known or old; None where there is none (windows, a
        camera, options only a take checks, the server refused it, or it has no layouts). An unavailable server
        (`Unavailable` once the retries are spent) raises, as the take would."""
        if not self.supported or not _layout_may_serve(selection):
            return None
        key = _key(selection)
        now = time.monotonic()
        with self._lock:  # a DataLoader worker's or a prefetching thread's takes may come at once
            known = self._known.get(key)
            if known is not None:
                self._known.move_to_end(key)
        if known is not None:
            if isinstance(known, RowLayout) and now < known.until:
                return known
            if isinstance(known, float) and now < known:
                return None
        found: RowLayout | float | None
        try:
            found = RowLayout.parse(self._fetch(selection), now)
        except Unavailable:
            raise
        except ServerError as exc:
            if exc.status == 405 or (exc.status == 404 and str(exc.body.get("detail", "")).startswith("no route ")):
                self.supported = False  # an older server, without the route
                return None
            self._refused(key, exc)  # the take asks, and raises what is wrong with it
            found = now + (float("inf") if exc.status == 422 else _REFUSED_SECONDS)
        except (ValueError, KeyError, TypeError) as exc:
            self._refused(key, exc)
            found = now + _REFUSED_SECONDS
        if found is None:  # the server wants every take asked
            self.supported = False
            return None
        self._remember(key, found)
        return found if isinstance(found, RowLayout) else None

    def set_aside(self, selection: Selection) -> None:
        """Take `selection`'s rows with requests for a while, then ask its layout again (a file the layout names
        could not be read here)."""
        self._remember(_key(selection), time.monotonic() + _REFUSED_SECONDS)

    def _remember(self, key: tuple[Any, ...], found: RowLayout | float) -> None:
        with self._lock:
            self._known[key] = found
            self._known.move_to_end(key)
            while len(self._known) > _KNOWN_LAYOUTS:
                self._known.popitem(last=False)

    def _refused(self, key: tuple[Any, ...], error: Exception) -> None:
        if key not in self._warned and not (isinstance(error, ServerError) and error.status == 422):
            self._warned.add(key)
            log.warning("rows of %s are taken with a request: its layout was refused: %s", key[0], error)


def _key(selection: Selection) -> tuple[Any, ...]:
    return (selection.dataset_id, selection.episodes, selection.columns)


def _layout_may_serve(selection: Selection) -> bool:
    """Whether a layout may answer `selection`'s takes: no windows, and none of the options a take validates that
    a layout does not (`tolerance_s`, `frame_size`: a take with them is checked by the server)."""
    return selection.delta_timestamps is None and selection.tolerance_s is None and selection.frame_size is None

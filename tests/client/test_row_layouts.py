"""How the client keeps views' layouts and answers the server's refusals (the layouts themselves, read against a
real server, are tested in tests/test_row_references.py): each answer below is the error the client makes of the
server's status and problem body."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from episerve import Selection
from episerve._errors import ServerError, server_error
from episerve._row_layouts import RowLayout, RowLayouts


def _layout(seconds: float = 60.0, rows: int = 10) -> dict[str, Any]:
    segment = {"file": 0, "path": "datasets/x/segments/0.arrow", "bytes": 1, "inode": 1, "mtime_ns": 1, "rows": rows}
    return {
        "seconds": seconds,
        "rows": rows,
        "columns": ["index"],
        "offsets": [0, rows],
        "files": [0],
        "starts": [0],
        "segments": [segment],
    }


class Server:
    """Answers each layout asked with `answer` (a document, or an error to raise), counting them."""

    def __init__(self, answer: dict[str, Any] | ServerError) -> None:
        self.answer, self.asked = answer, 0

    def __call__(self, selection: Selection) -> dict[str, Any]:
        self.asked += 1
        if isinstance(self.answer, ServerError):
            raise self.answer
        return self.answer


def _error(status: int, detail: str) -> ServerError:
    return server_error(status, {"title": "x", "detail": detail}, reason="", method="POST", url="/rows/layout")


def test_a_layout_is_kept_for_the_seconds_it_states_and_asked_again_after() -> None:
    server = Server(_layout(seconds=0.2))
    layouts = RowLayouts(server)
    selection = Selection.of("x", None, ["index"])
    for _ in range(5):
        assert isinstance(layouts.current(selection), RowLayout)
    assert server.asked == 1
    time.sleep(0.25)
    assert layouts.current(selection) is not None and server.asked == 2


def test_many_views_are_kept_without_asking_again() -> None:
    server = Server(_layout())
    layouts = RowLayouts(server)
    selections = [Selection.of("x", [number], ["index"]) for number in range(100)]
    for _ in range(3):
        for selection in selections:
            assert layouts.current(selection) is not None
    assert server.asked == 100


@pytest.mark.parametrize(
    "error",
    [_error(405, "POST is not allowed on /datasets/x/rows/layout; allowed: GET"), _error(404, "no route POST /x")],
    ids=["405 from an older server", "404 no route"],
)
def test_a_server_without_layouts_is_not_asked_again(error: ServerError) -> None:
    server = Server(error)
    layouts = RowLayouts(server)
    assert layouts.current(Selection.of("x")) is None
    assert layouts.current(Selection.of("y")) is None
    assert server.asked == 1 and not layouts.supported


def test_layouts_turned_off_by_the_server_are_not_asked_again() -> None:
    server = Server(_layout(seconds=0))
    layouts = RowLayouts(server)
    assert layouts.current(Selection.of("x")) is None and layouts.current(Selection.of("x")) is None
    assert server.asked == 1


def test_a_view_the_server_refuses_is_taken_with_requests() -> None:
    camera = Server(_error(422, "a row layout covers stored columns only; 'top' is a camera"))
    layouts = RowLayouts(camera)
    assert layouts.current(Selection.of("x")) is None and layouts.current(Selection.of("x")) is None
    assert camera.asked == 1  # never asked again: the take by reference answers that view
    missing = Server(_error(404, "dataset 'x' not found"))
    assert RowLayouts(missing).current(Selection.of("x")) is None  # the take raises it


def test_an_unavailable_server_raises_as_the_take_would() -> None:
    layouts = RowLayouts(Server(_error(503, "the catalog is still loading")))
    with pytest.raises(ServerError, match="still loading"):
        layouts.current(Selection.of("x"))


@pytest.mark.parametrize(
    "options",
    [{"delta_timestamps": {"index": [0.0]}}, {"tolerance_s": 0.01}, {"frame_size": (8, 8)}],
    ids=["windows", "tolerance_s", "frame_size"],
)
def test_options_only_a_take_checks_are_never_answered_by_a_layout(options: dict[str, Any]) -> None:
    server = Server(_layout())
    assert RowLayouts(server).current(Selection.of("x", None, ["index"], **options)) is None
    assert server.asked == 0


def test_a_layout_locates_rows_in_its_runs_and_refuses_unlisted_files() -> None:
    document = _layout(rows=30) | {"offsets": [0, 10, 25, 30], "files": [2, 0, 2], "starts": [5, 0, 15]}
    document["segments"] = [{"file": 2, "path": "p2", "bytes": 1, "inode": 1, "mtime_ns": 1, "rows": 20}]
    layout = RowLayout.parse(document, 0.0)
    assert layout is not None
    located = layout.locate(np.array([0, 9, 27, 29]))
    assert located is not None
    entries, segment_of, rows = located
    assert [entry["path"] for entry in entries] == ["p2"]
    assert segment_of.tolist() == [0, 0, 0, 0] and rows.tolist() == [5, 14, 17, 19]
    assert layout.locate(np.array([12])) is None  # file 0 has no segment listed
    assert layout.locate(np.array([30])) is None and layout.locate(np.array([-1])) is None

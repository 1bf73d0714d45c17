"""Failures surface as typed exceptions that name their cause, within the configured retry budget."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import episerve
from tests.client.helpers import DEMO
from tests.support import free_port

FAST = episerve.Retries(attempts=4, backoff=0.05, max_backoff=0.2, deadline=1.5)


class _Busy(BaseHTTPRequestHandler):
    """Answers 503 with `Retry-After: <retry_after>` to the first `busy` requests, then a tiny catalog. With
    `progress`, the 503s report a download (`X-Download-Progress`): the n-th one `progress[n]` (the last one
    repeated)."""

    busy = 1
    retry_after = "1"
    progress: tuple[str, ...] = ()
    seen: list[float]

    def do_GET(self) -> None:
        type(self).seen.append(time.monotonic())
        answered = len(type(self).seen)
        if answered <= type(self).busy:
            body = json.dumps({"type": "about:blank", "title": "Unavailable", "status": 503, "detail": "warming up"})
            self.send_response(503)
            self.send_header("Retry-After", type(self).retry_after)
            if type(self).progress:
                self.send_header("X-Download-Progress", type(self).progress[min(answered, len(self.progress)) - 1])
        else:
            body = json.dumps({"datasets": [{"id": "x"}]})
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def busy_server() -> Iterator[tuple[str, type[_Busy]]]:
    handler = type("Busy", (_Busy,), {"seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def test_unknown_dataset_raises_not_found_naming_it(url: str) -> None:
    with pytest.raises(episerve.NotFound, match="no dataset 'no/such'") as caught:
        episerve.EpisodeDataset(url, "no/such")
    assert caught.value.status == 404
    assert "no/such" in caught.value.detail


def test_bad_episode_spec_raises_invalid_request_quoting_the_term(url: str) -> None:
    with pytest.raises(episerve.InvalidRequest, match="'3-x'") as caught:
        episerve.EpisodeIterableDataset(url, DEMO, episodes="1,3-x")
    assert caught.value.status == 422


def test_absent_episodes_raise_not_found_listing_them(url: str) -> None:
    with pytest.raises(episerve.NotFound, match="999"):
        episerve.EpisodeDataset(url, DEMO, episodes=[1, 999])


def test_unknown_column_is_refused_before_any_batch(url: str) -> None:
    with pytest.raises(episerve.ServerError, match="nope"):
        episerve.EpisodeDataset(url, DEMO, columns=["index", "nope"])


def test_index_out_of_range_raises_index_error(url: str) -> None:
    dataset = episerve.EpisodeDataset(url, DEMO, episodes=[0], columns=["index"])
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    with pytest.raises(IndexError):
        dataset.__getitems__([0, -len(dataset) - 1])


def test_server_down_at_start_raises_connection_failed_within_the_budget() -> None:
    address = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(episerve.ConnectionFailed, match="could not reach") as caught:
        episerve.EpisodeDataset(address, DEMO, retries=FAST)
    elapsed = time.monotonic() - started
    assert elapsed < FAST.deadline + 1.0
    assert caught.value.attempts == FAST.attempts
    assert "ConnectError" in str(caught.value) and address in str(caught.value)


def test_deadline_bounds_the_retries_before_the_attempts_run_out() -> None:
    retries = episerve.Retries(attempts=1000, backoff=0.05, max_backoff=0.1, deadline=0.8)
    started = time.monotonic()
    with pytest.raises(episerve.ConnectionFailed):
        episerve.Client(f"http://127.0.0.1:{free_port()}", retries=retries).datasets()
    assert time.monotonic() - started < 1.5


def test_retry_after_is_honoured(busy_server: tuple[str, type[_Busy]]) -> None:
    address, handler = busy_server
    client = episerve.Client(address, retries=episerve.Retries(attempts=3, backoff=0.01, deadline=10))
    assert client.datasets() == [{"id": "x"}]
    first, second = handler.seen
    assert 1.0 <= second - first < 2.0


def test_retry_after_beyond_the_deadline_raises_at_once(busy_server: tuple[str, type[_Busy]]) -> None:
    address, handler = busy_server
    handler.busy, handler.retry_after = 10, "120"
    client = episerve.Client(address, retries=episerve.Retries(attempts=5, deadline=5))
    started = time.monotonic()
    with pytest.raises(episerve.Unavailable, match="warming up") as caught:
        client.datasets()
    assert time.monotonic() - started < 1.0
    assert caught.value.status == 503
    assert len(handler.seen) == 1


def test_persistent_503_gives_up_after_the_attempts(busy_server: tuple[str, type[_Busy]]) -> None:
    address, handler = busy_server
    handler.busy, handler.retry_after = 10, "0.05"
    client = episerve.Client(address, retries=episerve.Retries(attempts=3, deadline=5))
    with pytest.raises(episerve.Unavailable):
        client.datasets()
    assert len(handler.seen) == 3


def test_a_download_that_moves_is_waited_out_past_the_attempts_and_the_deadline(
    busy_server: tuple[str, type[_Busy]],
) -> None:
    address, handler = busy_server
    handler.busy, handler.retry_after = 8, "0.1"
    handler.progress = ("0/800", "100/800", "200/800", "300/800", "0/300", "100/300", "200/300", "250/300")
    client = episerve.Client(address, retries=episerve.Retries(attempts=3, deadline=0.6))
    assert client.datasets() == [{"id": "x"}]  # 8 waits of 0.1 s: past the deadline, and more than 3 attempts
    assert len(handler.seen) == 9


def test_a_download_that_stops_moving_is_given_up_after_the_deadline(busy_server: tuple[str, type[_Busy]]) -> None:
    address, handler = busy_server
    handler.busy, handler.retry_after = 1000, "0.05"
    # Two server workers, each with its own view of the same download that no longer moves.
    handler.progress = ("0/800", "100/800", *["0/800", "100/800"] * 500)
    client = episerve.Client(address, retries=episerve.Retries(attempts=3, deadline=0.5))
    started = time.monotonic()
    with pytest.raises(episerve.Unavailable, match="warming up"):
        client.datasets()
    assert 0.4 < time.monotonic() - started < 2.0
    assert len(handler.seen) > 3  # a download's 503s use up no attempts


def test_a_page_shrinks_to_the_limit_field_of_a_413() -> None:
    from episerve._client import _smaller_limit

    stated = episerve.TooLarge(413, "Request too large", "too many rows", body={"limit": 7})
    assert _smaller_limit(stated, 100) == 7


def test_a_413_without_a_limit_field_halves_the_page_whatever_its_detail_says() -> None:
    from episerve._client import _smaller_limit

    unstated = episerve.TooLarge(413, "Request Entity Too Large", "the limit is 7 rows")  # a proxy's, say
    assert _smaller_limit(unstated, 100) == 50
    with pytest.raises(episerve.TooLarge):
        _smaller_limit(unstated, 1)

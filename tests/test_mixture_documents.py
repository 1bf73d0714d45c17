"""Named mixtures read as hostile input, against a real server: an alias bomb, a 50 MB document, a document nested
100k deep, a Python-object tag and a YAML syntax error are each a quick problem without a traceback; a symlink out of
the mixtures directory is never read; one bad document does not hide the others from `GET /mixtures`; no answer
quotes a document's content. The client's `Mixture.from_file` holds the same limits. An invalid document is a 503
the client does not retry. A `/takes` body of too many takes is refused before they are validated, and an
over-limit take in `POST /takes` is a 413 naming the take, and so are takes whose frames together pass the frame
limit."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path

import httpx
import pytest

import episerve
from app.demo import write_demo_dataset
from app.demo_cameras import TOP_CAMERA
from tests.support import ServerProcess
from tests.test_errors import assert_problem

SECRET = "s3cr3t-token-value-0123456789"
LEVELS = "abcdefghi"
# Nine levels of nine aliases each: 9^9 (387 million) strings once expanded, from ten short lines.
BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{name}: &{name} [{', '.join([f'*{below}'] * 9)}]" for below, name in pairwise(LEVELS)]
    + ["components: *i"]
)


@pytest.fixture(scope="module")
def mixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mixture-docs")
    write_demo_dataset(root / "data" / "robot", format="v3.0", episodes=6, seed=5)
    directory = root / "mixtures"
    directory.mkdir()
    (directory / "good.json").write_text('{"components": [{"dataset": "robot", "weight": 2}]}')
    (directory / "bomb.yaml").write_text(BOMB)
    (directory / "tagged.yaml").write_text("components: !!python/object/apply:os.system ['true']\n")
    (directory / "broken.yml").write_text(f"components: [{{dataset: {SECRET}\n")
    (directory / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with open(directory / "huge.json", "wb") as huge:
        huge.write(b'{"components": [' + b" " * (50 * 1024 * 1024) + b"]}")
    (directory / "nope.json").write_text('{"components": [{"dataset": "nope"}]}')
    heavy = '{"components": [{"dataset": "robot", "weight": 1e308}, {"dataset": "robot", "weight": 1e308}]}'
    (directory / "heavy.json").write_text(heavy)
    secret = root / "tokens.txt"
    secret.write_text(SECRET + "\n")
    (directory / "leak.yml").symlink_to(secret)
    (directory / "passwd.json").symlink_to(secret)
    return root


@pytest.fixture(scope="module")
def server(mixtures: Path) -> ServerProcess:
    env = {"EPISERVE_MIXTURES_DIR": str(mixtures / "mixtures")}
    with ServerProcess([mixtures / "data"], mixtures / "cache", env=env) as running:
        yield running


def test_every_hostile_document_is_a_quick_problem_that_quotes_nothing(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for mixture_id, phrase in [
            ("bomb", "YAML aliases are not allowed"),
            ("tagged", "YAML syntax error"),
            ("broken", "YAML syntax error at line"),
            ("deep", "nested too deeply"),
            ("huge", "larger than 1,048,576 bytes"),
        ]:
            started = time.monotonic()
            answer = http.get(f"/mixtures/{mixture_id}")
            assert time.monotonic() - started < 5, mixture_id
            body = assert_problem(answer, 503, phrase)
            assert SECRET not in answer.text and "Traceback" not in answer.text, body
        assert http.get("/healthz").status_code == 200
        good = http.get("/mixtures/good").json()
        assert good["status"] == "valid" and good["components"][0]["dataset"] == "robot"


def test_symlinks_out_of_the_directory_are_never_read(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for mixture_id in ("leak", "passwd"):
            answer = http.get(f"/mixtures/{mixture_id}")
            assert_problem(answer, 404, f"no mixture {mixture_id!r}")
            assert SECRET not in answer.text


def test_the_listing_gives_each_document_its_own_status(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        answer = http.get("/mixtures")
    assert answer.status_code == 200, answer.text
    assert SECRET not in answer.text
    status = {m["id"]: m["status"] for m in answer.json()["mixtures"]}
    assert set(status) == {"good", "bomb", "tagged", "broken", "deep", "huge", "nope", "heavy"}  # no symlinked ones
    assert status["good"] == "valid"
    assert "no dataset 'nope'" in status["nope"]
    assert "aliases" in status["bomb"] and "larger than" in status["huge"]
    assert "their sum must be finite" in status["heavy"]


def test_the_client_reads_mixture_files_within_the_same_limits(mixtures: Path) -> None:
    directory = mixtures / "mixtures"
    for name, phrase in [
        ("bomb.yaml", "aliases are not allowed"),
        ("deep.json", "nested too deeply"),
        ("huge.json", "larger than"),
        ("broken.yml", "YAML syntax error"),
    ]:
        started = time.monotonic()
        with pytest.raises(episerve.MixtureError, match=phrase) as raised:
            episerve.Mixture.from_file(directory / name)
        assert time.monotonic() - started < 5 and SECRET not in str(raised.value)
    assert episerve.Mixture.from_file(directory / "good.json").components[0].dataset == "robot"
    with pytest.raises(ValueError, match="their sum must be finite"):
        episerve.Mixture.from_file(directory / "heavy.json")
    with pytest.raises(ValueError, match="at most 1e\\+09 times the smallest"):
        episerve.Mixture([{"dataset": "a", "weight": 1e10}, {"dataset": "b", "weight": 1}])


def test_an_over_limit_take_in_takes_is_a_413_naming_it(video_root: Path, tmp_path: Path) -> None:
    env = {"EPISERVE_MAX_FRAME_BYTES": str(64 * 96 * 3 * 8)}  # eight frames of the top camera
    with ServerProcess([video_root], tmp_path / "cache", env=env) as server, httpx.Client(base_url=server.url) as http:
        takes = [
            {"dataset": "cams-v3", "indices": [0, 1], "columns": [TOP_CAMERA]},
            {"dataset": "cams-v3", "indices": list(range(20)), "columns": [TOP_CAMERA]},
        ]
        answer = http.post("/takes", json={"takes": takes})
        assert_problem(answer, 413, "takes[1] (dataset 'cams-v3')")
        assert http.get("/healthz").status_code == 200  # the connection and the server are fine
        # Each within the limit, together over it: the limit bounds the whole answer.
        within = {"dataset": "cams-v3", "indices": list(range(6)), "columns": [TOP_CAMERA]}
        assert http.post("/takes", json={"takes": [within]}).status_code == 200
        answer = http.post("/takes", json={"takes": [within, within]})
        assert_problem(answer, 413, "the 2 takes' camera frames are 221184 bytes", "EPISERVE_MAX_FRAME_BYTES")


def test_a_problem_only_the_operator_can_cure_is_not_retried(
    server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """An invalid mixture file is a 503 marked `transient: false` with no `Retry-After`: the client raises at once
    instead of retrying for its whole deadline. A dataset that is only loading still asks for a retry."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.get("/mixtures/broken")
        body = assert_problem(answer, 503, "YAML syntax error")
        assert body["transient"] is False and body["title"] == "Mixture unavailable"
        assert "retry-after" not in answer.headers
    retries = episerve.Retries(attempts=10, backoff=0.5, deadline=60)
    with episerve.Client(server.url, retries=retries) as client, caplog.at_level("WARNING", logger="episerve"):
        started = time.monotonic()
        with pytest.raises(episerve.Unavailable, match="YAML syntax error") as caught:
            client.mixture("broken")
        assert time.monotonic() - started < 2.0
    assert caught.value.body["transient"] is False
    assert not [record for record in caplog.records if "retry" in record.getMessage()]


def test_a_takes_body_of_too_many_takes_is_refused_before_they_are_validated(server: ServerProcess) -> None:
    """450,000 takes (15.7 MB, under the body limit): counted right after parsing, not validated one by one."""
    take = b'{"dataset":"robot","indices":[1,2]}'
    body = b'{"takes":[' + b",".join([take] * 450_000) + b"]}"
    with httpx.Client(base_url=server.url, timeout=60) as http:
        answer = http.post("/takes", content=body, headers={"Content-Type": "application/json"})
        assert_problem(answer, 422, "at most 1024 takes per request, not 450000")
        assert http.post("/takes", json={"takes": [{"dataset": "robot", "indices": [1, 2]}]}).status_code == 200

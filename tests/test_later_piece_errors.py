"""A problem found in a later piece of an answer read piece by piece can no longer be an error status: the server
closes the connection before the end of the chunked body. Every reader must see that as an error, never as a
shorter answer taken for the whole one. Here the problem is a camera frame beyond the tolerance, in rows after the
first pieces of a take (a real server, real videos, the real client)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.demo_cameras import TOP_CAMERA
from tests.support import ServerProcess

episerve = pytest.importorskip("episerve")

SHIFTED_EPISODE = 5


def _shifted(video_root: Path, root: Path) -> None:
    """`cams-v3` with episode 5's frames 10 ms off the times its rows ask for (beyond the default tolerance)."""
    shutil.copytree(video_root / "cams-v3", root / "shifted")
    (meta,) = sorted((root / "shifted" / "meta/episodes").rglob("*.parquet"))
    table = pq.read_table(meta)
    column = f"videos/{TOP_CAMERA}/from_timestamp"
    pairs = zip(table["episode_index"].to_pylist(), table[column].to_pylist(), strict=True)
    shifted = [t + 0.01 if e == SHIFTED_EPISODE else t for e, t in pairs]
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(shifted, table[column].type))
    pq.write_table(table, meta)


def test_a_problem_in_a_later_piece_cuts_the_answer_and_every_reader_sees_an_error(
    video_root: Path, tmp_path: Path
) -> None:
    _shifted(video_root, tmp_path / "root")
    server = ServerProcess([tmp_path / "root"], tmp_path / "cache")
    with server, episerve.Client(server.url, retries=episerve.Retries(attempts=2)) as client:
        episodes = client.episodes("shifted")
        bad = next(e["dataset_from_index"] for e in episodes if e["episode_index"] == SHIFTED_EPISODE)
        good = [
            i
            for e in episodes
            if e["episode_index"] < SHIFTED_EPISODE
            for i in range(e["dataset_from_index"], e["dataset_to_index"])
        ]
        indices = [*(good * 3)[:900], bad]  # frames of 18 KiB: several pieces of ~4 MiB before the bad row
        body = {"indices": indices, "columns": [TOP_CAMERA]}

        with (
            httpx.Client(base_url=server.url, timeout=60) as http,
            http.stream("POST", "/datasets/shifted/rows/take", json=body) as answer,
        ):
            assert answer.status_code == 200  # the first piece was fine
            assert "content-length" not in answer.headers
            with pytest.raises(httpx.RemoteProtocolError):
                answer.read()

        with pytest.raises(episerve.EpiserveError):  # the client's own transport: an error, not fewer rows
            client.take("shifted", indices, columns=[TOP_CAMERA])

        assert client.take("shifted", indices[:-1], columns=[TOP_CAMERA]).num_rows == len(indices) - 1
        with httpx.Client(base_url=server.url) as http:
            counted = re.findall(
                r'episerve_requests_total\{endpoint="/datasets/\{dataset_id:path\}/rows/take",method="POST",'
                r'status="(\d+)"\} [1-9]',
                http.get("/metrics").text,
            )
        statuses = set(counted)
    log = server.log_path.read_text()
    assert re.search(rf"answer cut short after \d+ rows: no frame of '{TOP_CAMERA}'", log)  # a line, the problem
    # Counted with the problem's status, not as 499 (a client that left): every reader stayed to the end.
    assert "499" not in statuses and any(400 <= int(status) < 600 for status in statuses), statuses
    assert "Traceback" not in log, log[-3000:]

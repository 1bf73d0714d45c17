"""Smaller guards of a shared server, each against a real server: Unicode format characters are escaped in its
log, a 503 never shows an absolute server path, and a frame build that keeps failing is not queued again by every
request (a backoff per file)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from app.demo import write_demo_dataset
from app.demo_cameras import TOP_CAMERA
from tests.support import ServerProcess, write_generic_dataset
from tests.test_errors import assert_problem

FORMAT_CHARACTERS = "%E2%80%AE" + "%E2%80%8B" + "%EF%BB%BF" + "%E2%81%A6"  # U+202E, U+200B, U+FEFF, U+2066
RAW = ("\u202e", "\u200b", "\ufeff", "\u2066")


def test_unicode_format_characters_are_escaped_in_text_and_json_logs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_generic_dataset(root / "generic")
    for log_format in ("text", "json"):
        env = {"EPISERVE_LOG_LEVEL": "info", "EPISERVE_LOG_FORMAT": log_format}
        server = ServerProcess([root], tmp_path / f"cache-{log_format}", env=env)
        with server, server.client() as http:
            assert http.get(f"/datasets/gen{FORMAT_CHARACTERS}eric/rows").status_code in (404, 422)
        log = server.log_path.read_text(encoding="utf-8")
        assert not [c for c in RAW if c in log], f"{log_format} log holds raw format characters"
        lines = [line for line in log.splitlines() if "/datasets/gen" in line]
        assert lines, log
        if log_format == "json":
            lines = [json.loads(line).get("path", "") + json.loads(line)["message"] for line in lines]
        assert any("/datasets/gen\\u202e\\u200b\\ufeff\\u2066eric/rows" in line for line in lines), lines


def test_503_problems_name_files_without_the_server_s_absolute_paths(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_generic_dataset(root / "generic")
    (root / "generic" / "episerve.json").write_text('{"fps": ')  # unreadable settings: the dataset is unavailable
    with ServerProcess([root], tmp_path / "cache") as server, server.client() as http:
        answer = http.get("/datasets/generic/rows", params={"episodes": "1"})
        assert_problem(answer, 503, "episerve.json")
        detail = answer.json()["detail"]
        assert str(tmp_path) not in detail and not re.search(r"(^|[\s'\"])/\w", detail), detail
        assert ".../generic/episerve.json" in detail
    assert str(root / "generic" / "episerve.json") in server.log_path.read_text()  # the operator's log keeps it


def test_a_frame_build_that_keeps_failing_is_queued_again_only_after_a_growing_backoff(tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    write_demo_dataset(root / "demo", episodes=4, format="v2.1")
    env = {"EPISERVE_VIDEO_CACHE_POLICY": "first-touch", "EPISERVE_LOG_LEVEL": "info"}
    with ServerProcess([root], cache, env=env) as server, server.client() as http:
        assert http.get("/datasets/demo/rows", params={"episodes": "0", "columns": "index"}).status_code == 200
        (dataset_dir,) = (cache / "datasets").iterdir()
        (dataset_dir / "frames").mkdir(exist_ok=True)
        (dataset_dir / "frames").rmdir()
        (dataset_dir / "frames").write_text("not a directory: every frame build fails, as with a full disk")
        started, answered = time.monotonic(), 0
        while time.monotonic() - started < 6.0:
            answer = http.get("/datasets/demo/rows", params={"episodes": "1", "columns": f"index,{TOP_CAMERA}"})
            assert answer.status_code == 200, answer.text  # decoded on demand meanwhile
            answered += 1
            time.sleep(0.05)
    failures = [line for line in server.log_path.read_text().splitlines() if "background build of" in line]
    assert answered > 30
    # 1 s, 2 s, 4 s between tries: at most 4 tries in 6 s, however many requests found the file cold.
    assert 1 <= len(failures) <= 4, (answered, failures)
    assert "next try in 1 s" in failures[0] and "next try in 2 s" in failures[1]

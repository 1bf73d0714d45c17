"""Operations and security: tokens, metrics, cache warm-up and verification, request logs, read-only roots."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.demo import write_demo_dataset
from tests.support import ROOT, ServerProcess, assert_tables_equal, oracle, read_stream
from tests.test_errors import assert_problem


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ops-root")
    write_demo_dataset(root / "demo", episodes=30, files=3, cameras={})  # stored columns are all these tests read
    return root


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EPISERVE_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_tokens_guard_data_endpoints_but_not_health(demo_root: Path, tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("# team tokens\nfile-token\n\n")
    env = {"EPISERVE_TOKENS": "alpha,beta", "EPISERVE_TOKENS_FILE": str(tokens_file)}
    with ServerProcess([demo_root], tmp_path / "cache", env=env) as server, server.client() as http:
        for path in (
            "/datasets",
            "/datasets/demo",
            "/datasets/demo/episodes",
            "/datasets/demo/rows",
            "/datasets/demo/cache",
        ):
            response = assert_problem(http.get(path), 401, "bearer token")
            assert "alpha" not in json.dumps(response)
            assert_problem(http.get(path, headers={"Authorization": "Bearer wrong"}), 403, "not accepted")
        assert http.get("/datasets", headers={"Authorization": "Basic alpha"}).status_code == 401
        assert http.get("/datasets").headers["www-authenticate"] == "Bearer"
        for token in ("alpha", "beta", "file-token"):
            ok = http.get("/datasets/demo/rows", params={"episodes": "1"}, headers={"Authorization": f"Bearer {token}"})
            assert ok.status_code == 200
            assert_tables_equal(read_stream(ok.content), oracle(demo_root / "demo", [1]))
        taken = http.post("/datasets/demo/rows/take", json={"indices": [0]})
        assert taken.status_code == 401
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 200
        assert http.get("/metrics").status_code == 200
        log = server.log_path.read_text()
    assert "alpha" not in log and "file-token" not in log


def test_metrics_can_require_the_token(demo_root: Path, tmp_path: Path) -> None:
    env = {"EPISERVE_TOKENS": "alpha", "EPISERVE_METRICS_REQUIRE_TOKEN": "true"}
    with ServerProcess([demo_root], tmp_path / "cache", env=env) as server, server.client() as http:
        assert_problem(http.get("/metrics"), 401)
        assert http.get("/metrics", headers={"Authorization": "Bearer alpha"}).status_code == 200


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus exposition text (0 when absent)."""
    wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    return 0.0


def test_servers_sharing_a_cache_keep_their_metrics_apart_and_clean_only_their_own_hosts_dead_ones(
    demo_root: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    metrics = cache / "metrics"
    other_host = metrics / "other-container-1"  # PID 1 of another container sharing the volume: alive, unknowable
    dead_here = metrics / f"{socket.gethostname()}-{2**22 + 7}"  # a server of this host that died uncleanly
    for directory in (other_host, dead_here):
        directory.mkdir(parents=True)
        (directory / "counter_1.db").write_bytes(b"x")
    with ServerProcess([demo_root], cache) as server, server.client() as http:
        assert http.get("/metrics").status_code == 200
        running = [p.name for p in metrics.iterdir() if p not in (other_host, dead_here)]
        assert running == [f"{socket.gethostname()}-{server.process.pid}"]
    assert (other_host / "counter_1.db").read_bytes() == b"x"
    assert not dead_here.exists()


def test_metrics_count_requests_rows_bytes_and_cache_activity_across_workers(demo_root: Path, tmp_path: Path) -> None:
    with ServerProcess([demo_root], tmp_path / "cache", workers=2) as server, server.client() as http:
        expected_rows = oracle(demo_root / "demo", [2, 3]).num_rows
        sizes = [len(http.get("/datasets/demo/rows", params={"episodes": "2,3"}).content) for _ in range(6)]
        http.get("/datasets/demo/rows", params={"episodes": "999"})
        text = http.get("/metrics").text
    rows_endpoint = "/datasets/{dataset_id:path}/rows"
    assert metric(text, "episerve_requests_total", endpoint=rows_endpoint, method="GET", status="200") == 6
    assert metric(text, "episerve_requests_total", endpoint=rows_endpoint, method="GET", status="404") == 1
    assert metric(text, "episerve_rows_served_total", endpoint=rows_endpoint) == 6 * expected_rows
    assert metric(text, "episerve_response_bytes_total", endpoint=rows_endpoint) >= sum(sizes)
    assert metric(text, "episerve_request_duration_seconds_count", endpoint=rows_endpoint) == 7
    assert metric(text, "episerve_cache_builds_total") >= 1
    assert metric(text, "episerve_cache_hits_total") + metric(text, "episerve_cache_misses_total") >= 6
    assert metric(text, "episerve_cache_segments") >= 1
    assert metric(text, "episerve_cache_bytes") > 0
    assert "episerve_open_segments" in text


def test_warm_endpoint_builds_in_background_and_reports_progress(demo_root: Path, tmp_path: Path) -> None:
    with ServerProcess([demo_root], tmp_path / "cache") as server, server.client() as http:
        before = http.get("/datasets/demo/cache").json()
        assert (before["segments_built"], before["segments_total"], before["bytes"]) == (0, 3, 0)
        started = http.post("/datasets/demo/cache", json={"episodes": "0-5"})
        assert started.status_code == 202
        assert started.json()["warming"]["segments_total"] == 1
        deadline = time.monotonic() + 30
        while http.get("/datasets/demo/cache").json()["warming"]["state"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status = http.get("/datasets/demo/cache").json()
        assert status["warming"]["state"] == "done"
        assert status["segments_built"] == 1 and status["bytes"] > 0
        assert http.post("/datasets/demo/cache").status_code == 202  # no body: every episode
        assert_problem(http.post("/datasets/demo/cache", json={"episodes": "500"}), 404, "500")
        assert_problem(http.post("/datasets/demo/cache", json={"episodes": [-1]}), 422, "episodes")
        deadline = time.monotonic() + 30
        while http.get("/datasets/demo/cache").json()["segments_built"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_cli_warm_builds_with_progress_and_is_idempotent(demo_root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = run_cli("warm", "demo", "--root", str(demo_root), "--cache-dir", str(cache), "--episodes", "0-12")
    assert first.returncode == 0, first.stderr
    assert "rows" in first.stderr and "MB/s" in first.stderr  # the progress bar
    needed = int(first.stdout.split(" segments needed")[0].split()[-1])
    assert f"{needed} built" in first.stdout
    again = run_cli("warm", "demo", "--root", str(demo_root), "--cache-dir", str(cache))
    assert again.returncode == 0 and "3 segments needed" in again.stdout
    assert f"{needed} already cached" in again.stdout
    missing = run_cli("warm", "nope", "--root", str(demo_root), "--cache-dir", str(cache))
    assert missing.returncode == 2 and "'nope'" in missing.stderr


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_verify_detects_damage_and_rebuilds_and_server_never_serves_it(
    demo_root: Path, tmp_path: Path, damage: str
) -> None:
    cache = tmp_path / "cache"
    assert run_cli("warm", "demo", "--root", str(demo_root), "--cache-dir", str(cache)).returncode == 0
    segment = sorted(cache.rglob("segments/*.arrow"))[1]
    data = bytearray(segment.read_bytes())
    if damage == "flip":
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    else:
        data = data[: len(data) // 3]
    segment.write_bytes(bytes(data))

    with ServerProcess([demo_root], cache) as server:  # a fresh process: the damaged file is never served
        response = httpx.get(f"{server.url}/datasets/demo/rows", timeout=60)
        assert_tables_equal(read_stream(response.content), oracle(demo_root / "demo", None))
    # the server rebuilt it; damage it again for verify
    segment.write_bytes(bytes(data))
    report = run_cli("verify", "--root", str(demo_root), "--cache-dir", str(cache))
    assert report.returncode == 2  # damage left
    assert "1 damaged" in report.stdout and "NOT rebuilt" in report.stdout
    assert ("checksum" if damage == "flip" else "size") in report.stdout
    repaired = run_cli("verify", "demo", "--rebuild", "--root", str(demo_root), "--cache-dir", str(cache))
    assert repaired.returncode == 1 and "rebuilt" in repaired.stdout  # damage found, all of it repaired
    clean = run_cli("verify", "--root", str(demo_root), "--cache-dir", str(cache))
    assert clean.returncode == 0 and "3 segments checked, 0 not built, 0 damaged" in clean.stdout


def test_json_request_log_has_one_line_per_request(demo_root: Path, tmp_path: Path) -> None:
    env = {"EPISERVE_LOG_FORMAT": "json", "EPISERVE_LOG_LEVEL": "debug"}
    server = ServerProcess([demo_root], tmp_path / "cache", env=env)
    server.start()
    try:
        httpx.get(f"{server.url}/datasets/demo/rows", params={"episodes": "4", "columns": "index"})
        httpx.get(f"{server.url}/datasets/demo/rows", params={"episodes": "x"})
    finally:
        server.stop()
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "episerve.access" and "/rows" in line["path"]]
    assert [(a["status"], a["level"]) for a in access] == [(200, "debug"), (422, "info")]
    ok = access[0]
    assert ok["method"] == "GET" and ok["rows"] == oracle(demo_root / "demo", [4]).num_rows
    assert ok["bytes"] > 0 and ok["duration_ms"] > 0 and ok["client"].startswith("127.0.0.1:")
    builds = [line for line in lines if line["logger"] == "episerve.cache"]
    assert any("built segment" in b["message"] and "MB" in b["message"] for b in builds)
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    assert not [line for line in lines if "color_message" in line]


def test_row_reads_are_debug_lines_and_other_requests_info(demo_root: Path, tmp_path: Path) -> None:
    server = ServerProcess([demo_root], tmp_path / "cache", env={"EPISERVE_LOG_LEVEL": "info"})
    with server, server.client() as http:
        assert http.get("/datasets/demo/rows", params={"episodes": "4"}).status_code == 200
        assert http.post("/datasets/demo/rows", json={"episodes": "4"}).status_code == 200
        assert http.post("/datasets/demo/rows/take", json={"indices": [0, 1]}).status_code == 200
        assert http.get("/datasets/demo/rows", params={"episodes": "99999"}).status_code == 404
        assert http.get("/datasets").status_code == 200
    log = server.log_path.read_text().splitlines()
    access = [line for line in log if " episerve.access: " in line and "/readyz" not in line]
    assert [line.split(" episerve.access: ")[1].split(" rows=")[0] for line in access] == [
        "GET /datasets/demo/rows?episodes=99999 404",
        "GET /datasets 200",
    ]
    assert all(" INFO " in line for line in access)
    assert all(" client=127.0.0.1:" in line for line in access)


def test_text_log_escapes_control_characters_in_requests(demo_root: Path, tmp_path: Path) -> None:
    forged = "2026-01-01 00:00:00,000 INFO episerve.access: GET /admin 200"
    server = ServerProcess([demo_root], tmp_path / "cache", env={"EPISERVE_LOG_LEVEL": "info"})
    with server, server.client() as http:
        path = "/x%0a" + forged.replace(" ", "%20") + "%0d%1b[31m%7f%c2%85"
        assert http.get(path).status_code == 404
    lines = server.log_path.read_text().splitlines()
    assert not [line for line in lines if line.startswith("2026-01-01")]
    access = [line for line in lines if " episerve.access: GET /x" in line]
    assert len(access) == 1
    assert "GET /x\\n" + forged + "\\r\\x1b[31m\\x7f\\x85 404 " in access[0]


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def test_requests_never_write_into_the_dataset_roots(demo_root: Path, tmp_path: Path) -> None:
    before = tree_digest(demo_root)
    with ServerProcess([demo_root], tmp_path / "cache") as server, server.client() as http:
        http.get("/datasets/demo/rows", params={"episodes": "1-3"})
        http.post("/datasets/demo/rows/take", json={"indices": [1, 2], "delta_timestamps": {"action": [0, 1 / 30]}})
        http.post("/datasets/demo/cache")
        http.get("/datasets/demo/cache")
        http.get("/datasets/..%2F..%2Fetc/rows")
    assert tree_digest(demo_root) == before


def test_segment_truncated_under_a_running_server_is_rebuilt_and_the_worker_survives(
    demo_root: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    expected = oracle(demo_root / "demo", None)
    with ServerProcess([demo_root], cache, workers=1) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        assert_tables_equal(read_stream(http.get("/datasets/demo/rows").content), expected)  # every segment mapped
        segment = sorted(cache.rglob("segments/*.arrow"))[1]
        size = segment.stat().st_size
        os.truncate(segment, size // 3)  # in place: the worker's map now reaches past the end of the file

        take = http.post("/datasets/demo/rows/take", json={"indices": [expected.num_rows - 1, 0]})
        assert take.status_code == 200, take.text
        assert_tables_equal(read_stream(take.content), expected.take([expected.num_rows - 1, 0]))
        assert_tables_equal(read_stream(http.get("/datasets/demo/rows").content), expected)
        assert server.process is not None and server.process.poll() is None
        assert segment.stat().st_size == size  # rebuilt

        os.truncate(segment, size // 2)
        report = run_cli("verify", "--root", str(demo_root), "--cache-dir", str(cache))
        assert report.returncode == 2  # damage left (no --rebuild)
        assert f"size {size // 2} differs from the sidecar's {size}" in report.stdout


def test_leftover_temps_are_cleaned_at_start_and_not_reported_by_verify(demo_root: Path, tmp_path: Path) -> None:
    from filelock import FileLock

    cache = tmp_path / "cache"
    assert run_cli("warm", "demo", "--root", str(demo_root), "--cache-dir", str(cache)).returncode == 0
    first, second = sorted(cache.rglob("segments/*.arrow"))[:2]
    dataset_dir = first.parent.parent
    stale = [
        first.with_name(first.name + ".tmp"),  # an interrupted build
        first.with_name(f".{first.stem}.json.abc123.tmp"),  # an interrupted sidecar write
        dataset_dir / ".index.json.xyz789.tmp",  # an interrupted index write, old
    ]
    fresh_index_tmp = dataset_dir / ".index.json.new000.tmp"  # maybe another process writing it right now
    building = second.with_name(second.name + ".tmp")  # a build under way in another process: locked
    for path in [*stale, fresh_index_tmp, building]:
        path.write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(stale[2], (old, old))

    with FileLock(second.with_suffix(".lock")):
        report = run_cli("verify", "--root", str(demo_root), "--cache-dir", str(cache))
        assert report.returncode == 0, report.stdout
        assert "3 segments checked, 0 not built, 0 damaged" in report.stdout
        assert [p.exists() for p in stale] == [False, False, False]
        assert fresh_index_tmp.exists() and building.exists()
    with ServerProcess([demo_root], cache) as server:
        response = httpx.get(f"{server.url}/datasets/demo/rows", timeout=60)
        assert_tables_equal(read_stream(response.content), oracle(demo_root / "demo", None))
    assert not building.exists()  # its lock is free now: the next start removes it


def _copy_dataset(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


def test_cache_clear_removes_segments_and_index_of_named_datasets_and_skips_builds(
    demo_root: Path, tmp_path: Path
) -> None:
    from filelock import FileLock

    root = tmp_path / "root"
    _copy_dataset(demo_root / "demo", root / "demo")
    _copy_dataset(demo_root / "demo", root / "other")
    cache = tmp_path / "cache"
    for dataset in ("demo", "other"):
        assert run_cli("warm", dataset, "--root", str(root), "--cache-dir", str(cache)).returncode == 0
    demo_dir, other_dir = sorted((cache / "datasets").iterdir())
    demo_bytes = sum(p.stat().st_size for p in demo_dir.rglob("*") if p.suffix in (".arrow", ".json"))

    cleared = run_cli("cache", "clear", "demo", "--root", str(root), "--cache-dir", str(cache))
    assert cleared.returncode == 0, cleared.stderr
    assert f"7 files removed, {demo_bytes} bytes freed" in cleared.stdout  # 3 segments + 3 sidecars + index
    assert f"removed datasets/{demo_dir.name}/index.json" in cleared.stdout
    assert sorted(demo_dir.rglob("*.arrow")) == [] and not (demo_dir / "index.json").exists()
    assert len(sorted(other_dir.rglob("*.arrow"))) == 3  # another dataset's cache is untouched

    with ServerProcess([root], cache) as server:  # a cleared cache is rebuilt on demand
        response = httpx.get(f"{server.url}/datasets/demo/rows", params={"episodes": "1-2"}, timeout=60)
        assert_tables_equal(read_stream(response.content), oracle(root / "demo", [1, 2]))
        building = sorted(other_dir.rglob("*.arrow"))[0]
        with FileLock(building.with_suffix(".lock")):  # as a builder in another process holds it
            everything = run_cli("cache", "clear", "--root", str(root), "--cache-dir", str(cache))
        assert everything.returncode == 0, everything.stderr
        assert f"skipped datasets/{other_dir.name}/segments/{building.name}: being built" in everything.stdout
        assert sorted(p.name for p in cache.rglob("*.arrow")) == [building.name]
        response = httpx.get(f"{server.url}/datasets/demo/rows", params={"episodes": "1-2"}, timeout=60)
        assert_tables_equal(read_stream(response.content), oracle(root / "demo", [1, 2]))


def test_cache_prune_removes_gone_datasets_changed_sources_and_temps_only(demo_root: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "root"
    _copy_dataset(demo_root / "demo", root / "demo")
    _copy_dataset(demo_root / "demo", root / "gone")
    cache = tmp_path / "cache"
    for dataset in ("demo", "gone"):
        assert run_cli("warm", dataset, "--root", str(root), "--cache-dir", str(cache)).returncode == 0
    gone_dir = next(p for p in (cache / "datasets").iterdir() if p.name.startswith("gone-"))
    demo_dir = next(p for p in (cache / "datasets").iterdir() if p.name.startswith("demo-"))
    gone_bytes = sum(p.stat().st_size for p in gone_dir.rglob("*") if p.is_file())
    shutil.rmtree(root / "gone")
    sources = sorted((root / "demo").rglob("*.parquet"))
    first = sources[0]
    os.utime(first, (time.time() + 5, time.time() + 5))  # a changed source: its segment is stale
    stale_segment = next(p for p in demo_dir.rglob("*.arrow") if p.name.startswith(first.stem))
    stale_bytes = stale_segment.stat().st_size + stale_segment.with_suffix(".json").stat().st_size
    leftover = stale_segment.with_name("zzz-interrupted.arrow.tmp")
    leftover.write_bytes(b"x" * 100)
    kept = sorted(p for p in demo_dir.rglob("*.arrow") if p != stale_segment)

    pruned = run_cli("cache", "prune", "--root", str(root), "--cache-dir", str(cache))
    assert pruned.returncode == 0, pruned.stderr
    assert not gone_dir.exists()
    assert f"segments/{stale_segment.name}" in pruned.stdout
    assert f"segments/{leftover.name} (100 bytes)" in pruned.stdout
    assert f"{gone_bytes + stale_bytes + 100} bytes freed" in pruned.stdout
    assert not stale_segment.exists() and not leftover.exists()
    assert sorted(demo_dir.rglob("*.arrow")) == kept  # current segments stay

    again = run_cli("cache", "prune", "--root", str(root), "--cache-dir", str(cache))
    assert again.returncode == 0 and "0 files removed, 0 bytes freed" in again.stdout

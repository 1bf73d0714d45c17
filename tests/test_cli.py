"""The `episerve-server` command line: the contract deploy scripts and benchmarks rely on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pyarrow.parquet as pq

from app import __version__
from app.demo import write_demo_dataset
from tests.support import ServerProcess, assert_tables_equal, oracle, read_stream, write_generic_dataset
from tests.test_operations import run_cli


def test_demo_command_writes_both_formats(tmp_path: Path) -> None:
    v3 = run_cli("demo", "--out", str(tmp_path / "v3"), "--episodes", "7", "--seed", "3")
    assert v3.returncode == 0, v3.stderr
    info = json.loads((tmp_path / "v3/meta/info.json").read_text())
    assert (info["codebase_version"], info["total_episodes"]) == ("v3.0", 7)
    v21 = run_cli("demo", "--out", str(tmp_path / "v21"), "--format", "v2.1", "--episodes", "4")
    assert v21.returncode == 0, v21.stderr
    assert len(list((tmp_path / "v21/data").rglob("episode_*.parquet"))) == 4
    again = run_cli("demo", "--out", str(tmp_path / "v3"))
    assert again.returncode == 2 and "not empty" in again.stderr


def test_two_roots_offering_the_same_id_is_a_startup_error_naming_both(tmp_path: Path) -> None:
    for root in ("a", "b"):
        write_demo_dataset(tmp_path / root / "shared", episodes=2)
    result = run_cli(
        "serve",
        "--root",
        str(tmp_path / "a"),
        "--root",
        str(tmp_path / "b"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--port",
        "1",
    )
    assert result.returncode == 2
    assert "'shared'" in result.stderr
    assert str(tmp_path / "a" / "shared") in result.stderr and str(tmp_path / "b" / "shared") in result.stderr


def test_missing_root_is_a_startup_error(tmp_path: Path) -> None:
    result = run_cli("serve", "--root", str(tmp_path / "nowhere"), "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 2 and "nowhere" in result.stderr


def test_roots_from_the_environment_are_pathsep_separated(tmp_path: Path) -> None:
    write_demo_dataset(tmp_path / "one" / "first", episodes=3, seed=1)
    write_demo_dataset(tmp_path / "two" / "org" / "second", format="v2.1", episodes=2, seed=2)
    env = {"EPISERVE_ROOTS": os.pathsep.join([str(tmp_path / "one"), str(tmp_path / "two")])}
    with ServerProcess([], tmp_path / "cache", env=env) as server:
        ids = [d["id"] for d in httpx.get(f"{server.url}/datasets").json()["datasets"]]
        assert ids == ["first", "org/second"]
        rows = read_stream(httpx.get(f"{server.url}/datasets/org/second/rows").content)
        assert_tables_equal(rows, oracle(tmp_path / "two/org/second", None))


def test_serve_without_roots_serves_the_demo_dataset(tmp_path: Path) -> None:
    server = ServerProcess([], tmp_path / "cache", workers=2)
    server.start(timeout=180)  # each worker may encode the demo's camera videos before the first answer
    try:
        # The other worker may still be writing its copy of the demo when the first answers: wait for it.
        with httpx.Client(base_url=server.url, timeout=180) as http:
            listing = http.get("/datasets").json()["datasets"]
            assert [(d["id"], d["format"], d["episodes"]) for d in listing] == [("demo", "lerobot-v3.0", 200)]
            rows = read_stream(http.get("/datasets/demo/rows", params={"episodes": "9,4"}).content)
    finally:
        server.stop()
    demo = tmp_path / "cache" / "demo-root" / "demo"
    assert_tables_equal(rows, oracle(demo, [4, 9]))
    assert pq.read_metadata(sorted(demo.rglob("file-000.parquet"))[0]).num_rows > 0


def test_version_flag_prints_the_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"episerve-server {__version__}"


def test_every_demo_option_has_help_text() -> None:
    result = run_cli("demo", "--help")
    assert result.returncode == 0
    help_lines = " ".join(result.stdout.split())
    for option, words in {
        "--out OUT": "directory to create",
        "--format {v3.0,v2.1}": "LeRobot codebase version (default v3.0)",
        "--episodes EPISODES": "number of episodes",
        "--seed SEED": "random seed",
    }.items():
        assert f"{option} {words}" in help_lines, option


def test_unknown_dataset_names_the_roots_searched_and_close_ids(tmp_path: Path) -> None:
    for name in ("pusht", "aloha"):
        write_demo_dataset(tmp_path / "root" / "lerobot" / name, episodes=2)
    root, cache = str(tmp_path / "root"), str(tmp_path / "cache")
    warm = run_cli("warm", "lerobot/push", "--root", root, "--cache-dir", cache)
    assert warm.returncode == 2
    assert warm.stderr.strip() == (
        f"episerve-server warm: no dataset 'lerobot/push' below the roots searched ({root}); "
        "did you mean 'lerobot/pusht'?"
    )
    by_name = run_cli("warm", "pushT", "--root", root, "--cache-dir", cache)
    assert by_name.returncode == 2 and by_name.stderr.strip().endswith("did you mean 'lerobot/pusht'?")
    verify = run_cli("verify", "nosuch", "--root", root, "--cache-dir", cache)
    assert verify.returncode == 2
    assert verify.stderr.strip() == (
        f"episerve-server verify: no dataset 'nosuch' below the roots searched ({root}); "
        "they offer 'lerobot/aloha', 'lerobot/pusht'"
    )


def test_roots_that_are_datasets_are_served_as_one_dataset_each(tmp_path: Path) -> None:
    write_demo_dataset(tmp_path / "pick-v3", episodes=5, seed=4, files=2)
    write_demo_dataset(tmp_path / "pick-v21", format="v2.1", episodes=4, seed=5)
    write_generic_dataset(tmp_path / "table")
    roots = [tmp_path / "pick-v3", tmp_path / "pick-v21", tmp_path / "table"]
    with ServerProcess(roots, tmp_path / "cache") as server, server.client() as http:
        listing = {d["id"]: d for d in http.get("/datasets").json()["datasets"]}
        assert sorted(listing) == ["pick-v21", "pick-v3", "table"]  # no data/ or meta/ of their own
        assert [listing[i]["format"] for i in ("pick-v3", "pick-v21", "table")] == [
            "lerobot-v3.0",
            "lerobot-v2.1",
            "parquet",
        ]
        assert listing["pick-v3"]["fps"] == listing["pick-v21"]["fps"] == 30.0
        for dataset_id in listing:
            rows = read_stream(http.get(f"/datasets/{dataset_id}/rows", params={"episodes": "1-2"}).content)
            assert_tables_equal(rows, oracle(tmp_path / dataset_id, [1, 2]))


def test_a_dataset_root_whose_name_is_no_valid_id_is_refused_naming_the_parent(tmp_path: Path) -> None:
    write_demo_dataset(tmp_path / "my demo", episodes=2)
    result = run_cli("serve", "--root", str(tmp_path / "my demo"), "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 2
    assert "'my demo' is not a valid dataset id" in result.stderr and "parent directory" in result.stderr


def test_demo_prints_the_command_that_serves_it(tmp_path: Path) -> None:
    result = run_cli("demo", "--out", str(tmp_path / "pick"), "--episodes", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        str(tmp_path / "pick"),
        "serve it as dataset 'pick' with:",
        f"  episerve-server serve --root {tmp_path / 'pick'}",
    ]

"""Nothing below a root is dropped silently: directories not offered are logged and listed with the reason, a root
inside a LeRobot dataset is refused, and a 404 says which ids are close or which episodes exist."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from app.demo import write_demo_dataset
from app.settings import Settings
from app.store.catalog import Catalog, SkippedDirectory
from tests.support import ServerProcess, write_plain_dataset
from tests.test_errors import assert_problem
from tests.test_operations import run_cli

HIDDEN = "hidden (its name starts with '.')"


def mixed_root(root: Path) -> Path:
    """A root with two datasets and one directory of each kind that is skipped."""
    write_demo_dataset(root / "pusht", episodes=2)
    write_demo_dataset(root / "lerobot" / "aloha", episodes=2)
    write_demo_dataset(root / "my robot", episodes=2)
    write_plain_dataset(root / "my org" / "arm")
    (root / "lerobot" / "downloading").mkdir()
    (root / "notes").mkdir()
    (root / ".trash" / "old").mkdir(parents=True)
    return root


def catalog_of(root: Path, cache: Path) -> Catalog:
    return Catalog(Settings(roots=[root], cache_dir=cache), [root])


def test_directories_not_offered_are_listed_with_the_reason(tmp_path: Path) -> None:
    catalog = catalog_of(mixed_root(tmp_path / "root"), tmp_path / "cache")
    assert catalog.ids() == ["lerobot/aloha", "pusht"]
    skipped = {entry.path: entry.reason for entry in catalog.skipped()}
    assert sorted(skipped) == [".trash", "lerobot/downloading", "my org/arm", "my robot", "notes"]
    assert skipped[".trash"] == HIDDEN
    assert skipped["my robot"].startswith("'my robot' is not a valid dataset id")
    assert skipped["my robot"].endswith("rename it, e.g. to 'my-robot'")
    assert skipped["my org/arm"].startswith("'my org' is not a valid dataset id")
    assert skipped["lerobot/downloading"].startswith("not a dataset: no meta/info.json")
    assert skipped["notes"].startswith("no dataset in it")


def test_each_skipped_directory_is_logged_once_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = mixed_root(tmp_path / "root")
    with caplog.at_level(logging.WARNING, logger="episerve.catalog"):
        catalog = catalog_of(root, tmp_path / "cache")
        catalog.scan()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == len(catalog.skipped()) == 5
    assert f"skipped {root}/my robot: 'my robot' is not a valid dataset id" in "\n".join(lines)


def test_a_symbolic_link_out_of_the_root_is_listed_as_skipped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_demo_dataset(tmp_path / "outside", episodes=2)
    root.mkdir()
    (root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    catalog = catalog_of(root, tmp_path / "cache")
    assert catalog.ids() == []
    assert catalog.skipped() == [SkippedDirectory("escape", "it resolves outside its root (a symbolic link?)")]


def test_the_catalog_endpoint_lists_skipped_directories_and_a_404_names_the_reason(tmp_path: Path) -> None:
    with ServerProcess([mixed_root(tmp_path / "root")], tmp_path / "cache") as server, server.client() as http:
        listing = http.get("/datasets").json()
        assert [d["id"] for d in listing["datasets"]] == ["lerobot/aloha", "pusht"]
        assert [entry["path"] for entry in listing["skipped"]] == [
            ".trash",
            "lerobot/downloading",
            "my org/arm",
            "my robot",
            "notes",
        ]
        assert set(listing["skipped"][0]) == {"path", "reason"}
        assert_problem(http.get("/datasets/my robot"), 404, "'my robot' below a root is not served", "'my-robot'")
        assert_problem(http.get("/datasets/lerobot/alloha"), 404, "did you mean 'lerobot/aloha'?")
        assert_problem(http.get("/datasets/aloha/rows"), 404, "did you mean 'lerobot/aloha'?")


def test_a_skipped_directory_that_becomes_a_dataset_is_served_after_the_rescan(tmp_path: Path) -> None:
    root = mixed_root(tmp_path / "root")
    catalog = Catalog(Settings(roots=[root], cache_dir=tmp_path / "cache", rescan_interval_s=0), [root])
    assert catalog.why_not_offered("lerobot/downloading") is not None
    write_demo_dataset(root / "lerobot" / "downloading", episodes=2)
    assert catalog.get("lerobot/downloading").id == "lerobot/downloading"
    assert catalog.why_not_offered("lerobot/downloading") is None


def test_the_cli_says_why_a_skipped_directory_is_no_dataset(tmp_path: Path) -> None:
    root = mixed_root(tmp_path / "root")
    warm = run_cli("warm", "my robot", "--root", str(root), "--cache-dir", str(tmp_path / "cache"))
    assert warm.returncode == 2
    assert "the directory 'my robot' is skipped: 'my robot' is not a valid dataset id" in warm.stderr


@pytest.mark.parametrize("inside", ["data", "data/chunk-000", "meta"])
def test_a_root_inside_a_lerobot_dataset_is_refused_naming_the_dataset(tmp_path: Path, inside: str) -> None:
    dataset = write_demo_dataset(tmp_path / "pusht", episodes=2)
    result = run_cli("serve", "--root", str(dataset / inside), "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 2
    assert f"is inside the LeRobot dataset {dataset} (it has meta/info.json): pass {dataset} as the root" in (
        result.stderr
    )


def test_episodes_out_of_range_name_the_valid_range(http: httpx.Client) -> None:
    answer = http.get("/datasets/lerobot/demo-v3/rows", params={"episodes": "58-70"})
    assert_problem(answer, 404, "episodes not in this dataset: 60-70; its episodes are 0-59")

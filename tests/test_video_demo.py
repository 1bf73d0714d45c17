"""Camera videos of the demo datasets, checked against the frame oracle (tests/video_oracle.py): the mp4 layout and
episode metadata of v3.0 and v2.1 agree, and LeRobot's frame rule lands on the frame the demo drew for each row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from app import demo_video
from app.cli import main as cli_main
from app.demo import write_demo_dataset
from app.demo_cameras import TWO_CAMERAS
from app.demo_video import Camera, camera_frames
from tests.video_oracle import (
    FrameTimestampError,
    decode_video,
    episode_video,
    frames_at,
    frames_for_rows,
    read_label,
)

FPS = 30
V30_EPISODES, V21_EPISODES = 24, 8


@pytest.fixture(scope="module")
def v30(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("v30") / "demo"
    return write_demo_dataset(out, episodes=V30_EPISODES, seed=11, files=2, cameras=TWO_CAMERAS, video_files=3)


@pytest.fixture(scope="module")
def v21(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("v21") / "demo"
    return write_demo_dataset(out, format="v2.1", episodes=V21_EPISODES, seed=12, cameras=TWO_CAMERAS)


@pytest.fixture(params=["v30", "v21"])
def dataset(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


def read_info(root: Path) -> dict[str, Any]:
    return json.loads((root / "meta/info.json").read_text())


def episode_lengths(root: Path) -> list[int]:
    if read_info(root)["codebase_version"] == "v3.0":
        return pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")["length"].to_pylist()
    return [json.loads(line)["length"] for line in (root / "meta/episodes.jsonl").read_text().splitlines()]


def v30_episode_rows(root: Path) -> list[dict[str, Any]]:
    table = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")
    return table.select([name for name in table.column_names if not name.startswith("stats/")]).to_pylist()


# --- layout and metadata --------------------------------------------------------------------------------------


def test_video_features_are_described_as_lerobot_writes_them(dataset: Path) -> None:
    features = read_info(dataset)["features"]
    for key, (height, width) in TWO_CAMERAS.items():
        assert features[key] == {
            "dtype": "video",
            "shape": [height, width, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": height,
                "video.width": width,
                "video.codec": features[key]["info"]["video.codec"],
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": FPS,
                "video.channels": 3,
                "has_audio": False,
            },
        }
        assert features[key]["info"]["video.codec"] in {"av1", "h264"}
    data = sorted(dataset.glob("data/*/*.parquet"))[0]
    assert not set(TWO_CAMERAS) & set(pq.read_schema(data).names), "a video feature has no data column"


def test_v30_episodes_lie_back_to_back_in_rolling_files(v30: Path) -> None:
    info = read_info(v30)
    rows = v30_episode_rows(v30)
    for key in TWO_CAMERAS:
        files: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            assert row[f"videos/{key}/chunk_index"] == 0
            name = info["video_path"].format(video_key=key, chunk_index=0, file_index=row[f"videos/{key}/file_index"])
            files.setdefault(name, []).append(row)
        assert sorted(files) == [f"videos/{key}/chunk-000/file-{i:03d}.mp4" for i in range(3)]
        assert [p.relative_to(v30).as_posix() for p in sorted((v30 / "videos" / key).rglob("*.mp4"))] == sorted(files)
        for name, episodes in files.items():
            times, frames = decode_video(v30 / name)
            assert len(frames) == sum(row["length"] for row in episodes), "frames = the file's episode lengths"
            assert frames.shape[1:] == (*TWO_CAMERAS[key], 3)
            np.testing.assert_allclose(times, np.arange(len(times)) / FPS, atol=1e-9)
            end = 0.0
            for row in episodes:
                start, stop = row[f"videos/{key}/from_timestamp"], row[f"videos/{key}/to_timestamp"]
                assert start == pytest.approx(end, abs=1e-9), "episodes follow each other without a gap"
                assert stop - start == pytest.approx(row["length"] / FPS, abs=1e-9)
                end = stop
            assert end == pytest.approx(len(frames) / FPS, abs=1e-9), "the last episode ends with the file"
    data_files = {row["data/file_index"] for row in rows}
    assert len(data_files) == 2, "data files roll over independently of the video files"


def test_v30_some_episode_starts_mid_file(v30: Path) -> None:
    starts = [row["videos/observation.images.top/from_timestamp"] for row in v30_episode_rows(v30)]
    assert sum(start > 0 for start in starts) >= V30_EPISODES - 3


def test_v21_one_file_per_episode_and_camera_from_t0(v21: Path) -> None:
    info = read_info(v21)
    assert info["total_videos"] == V21_EPISODES * len(TWO_CAMERAS)
    lengths = episode_lengths(v21)
    found = sorted(p.relative_to(v21).as_posix() for p in (v21 / "videos").rglob("*.mp4"))
    expected = []
    for key in TWO_CAMERAS:
        for episode, length in enumerate(lengths):
            name = info["video_path"].format(episode_chunk=0, video_key=key, episode_index=episode)
            expected.append(name)
            times, frames = decode_video(v21 / name)
            assert len(frames) == length
            np.testing.assert_allclose(times, np.arange(length) / FPS, atol=1e-9)
    assert found == sorted(expected)


def test_camera_stats_are_per_channel(dataset: Path) -> None:
    if read_info(dataset)["codebase_version"] == "v3.0":
        stats = json.loads((dataset / "meta/stats.json").read_text())
    else:
        stats = json.loads((dataset / "meta/episodes_stats.jsonl").read_text().splitlines()[0])["stats"]
    for key in TWO_CAMERAS:
        assert np.array(stats[key]["mean"]).shape == (3, 1, 1)
        assert 0.0 <= np.min(stats[key]["min"]) < np.max(stats[key]["max"]) <= 1.0


# --- the oracle finds the frame the demo drew -----------------------------------------------------------------


def sample_rows(lengths: list[int]) -> list[tuple[int, int]]:
    """First, second, middle and last frame of every episode (the one-frame episode included)."""
    return sorted({(e, f) for e, n in enumerate(lengths) for f in (0, min(1, n - 1), n // 2, n - 1)})


@pytest.mark.parametrize("key", list(TWO_CAMERAS))
def test_oracle_frames_carry_the_label_of_their_row(dataset: Path, key: str) -> None:
    rows = sample_rows(episode_lengths(dataset))
    frames = frames_for_rows(dataset, key, rows)
    assert frames.dtype == np.uint8 and frames.shape == (len(rows), *TWO_CAMERAS[key], 3)
    assert [read_label(frame) for frame in frames] == rows


@pytest.mark.parametrize("key", list(TWO_CAMERAS))
def test_oracle_frames_look_like_the_drawn_frames(dataset: Path, key: str) -> None:
    """Lossy codec: close to what was drawn, and much closer to it than to the neighbouring frame."""
    camera = Camera(key, *TWO_CAMERAS[key])
    lengths = episode_lengths(dataset)
    episode = max(range(len(lengths)), key=lengths.__getitem__)
    picks = [0, 1, lengths[episode] // 2, lengths[episode] - 2]
    decoded = frames_for_rows(dataset, key, [(episode, f) for f in picks]).astype(np.int16)
    for got, index in zip(decoded, picks, strict=True):
        drawn, neighbour = camera_frames(camera, episode, np.array([index, index + 1])).astype(np.int16)
        error = np.abs(got - drawn).mean()
        assert error < 6.0, f"frame {index}: mean abs error {error:.2f}"
        assert np.abs(got - neighbour).mean() > 2 * error


def test_every_frame_of_a_v30_file_is_its_episode_frame(v30: Path) -> None:
    rows = v30_episode_rows(v30)
    key = "observation.images.wrist"
    in_file = [row for row in rows if row[f"videos/{key}/file_index"] == 1]
    _, frames = decode_video(episode_video(v30, key, in_file[0]["episode_index"]).path)
    expected = [(row["episode_index"], f) for row in in_file for f in range(row["length"])]
    assert [read_label(frame) for frame in frames] == expected


def test_oracle_takes_any_order_and_duplicates(v30: Path) -> None:
    rows = [(20, 3), (2, 0), (20, 3), (9, 1)]
    frames = frames_for_rows(v30, "observation.images.top", rows)
    assert [read_label(frame) for frame in frames] == rows


def test_query_within_tolerance_gets_the_nearest_frame(dataset: Path) -> None:
    frames = frames_at(dataset, "observation.images.top", [(1, 2 / FPS + 5e-5), (1, 2 / FPS - 5e-5)])
    assert [read_label(frame) for frame in frames] == [(1, 2), (1, 2)]


def test_query_between_frames_raises_naming_the_distance(dataset: Path) -> None:
    with pytest.raises(FrameTimestampError, match=r"observation\.images\.top.*episode 1.*0\.016667 s away"):
        frames_at(dataset, "observation.images.top", [(1, 2.5 / FPS)])
    frames = frames_at(dataset, "observation.images.top", [(1, 2.5 / FPS)], tolerance_s=0.02)
    assert read_label(frames[0])[0] == 1


def test_unknown_key_or_row_raises(v30: Path) -> None:
    with pytest.raises(KeyError, match="not a video feature"):
        frames_at(v30, "observation.state", [(0, 0.0)])
    with pytest.raises(KeyError, match="no row"):
        frames_for_rows(v30, "observation.images.top", [(0, 10_000)])


@pytest.mark.parametrize("format", ["v3.0", "v2.1"])
def test_without_an_av1_encoder_the_demo_records_h264(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, format: str
) -> None:
    monkeypatch.setattr(demo_video, "ENCODER", demo_video.pick_encoder(available=set()))
    root = write_demo_dataset(tmp_path / "demo", format=format, episodes=4, seed=3, video_files=2)
    assert read_info(root)["features"]["observation.images.top"]["info"]["video.codec"] == "h264"
    rows = sample_rows(episode_lengths(root))
    assert [read_label(frame) for frame in frames_for_rows(root, "observation.images.top", rows)] == rows


# --- parameters -----------------------------------------------------------------------------------------------


def test_videos_leave_the_data_files_unchanged(tmp_path: Path) -> None:
    with_video = write_demo_dataset(tmp_path / "video", episodes=6, seed=5, files=2)
    without = write_demo_dataset(tmp_path / "plain", episodes=6, seed=5, files=2, cameras=None)
    names = sorted(p.relative_to(without) for p in without.glob("data/*/*.parquet"))
    assert names == sorted(p.relative_to(with_video) for p in with_video.glob("data/*/*.parquet"))
    for name in names:
        assert pq.read_table(with_video / name).equals(pq.read_table(without / name)), name


@pytest.mark.parametrize("format", ["v3.0", "v2.1"])
def test_no_cameras_writes_no_videos(tmp_path: Path, format: str) -> None:
    root = write_demo_dataset(tmp_path / "demo", format=format, episodes=2, cameras={})
    info = read_info(root)
    assert info["video_path"] is None and info.get("total_videos", 0) == 0
    assert not (root / "videos").exists()
    assert all(feature["dtype"] != "video" for feature in info["features"].values())


def test_cli_no_video_flag(tmp_path: Path) -> None:
    assert cli_main(["demo", "--out", str(tmp_path / "demo"), "--episodes", "2", "--no-video"]) == 0
    assert read_info(tmp_path / "demo")["video_path"] is None


@pytest.mark.parametrize(
    ("cameras", "message"),
    [
        ({"cam": (63, 96)}, "must be even"),
        ({"cam": (16, 16)}, "too small for the frame label"),
        ({"a/b": (64, 96)}, "contain no '/'"),
        ({"observation.image": (64, 96)}, "already a feature"),
    ],
)
def test_bad_cameras_raise(tmp_path: Path, cameras: dict[str, tuple[int, int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_demo_dataset(tmp_path / "demo", episodes=1, cameras=cameras)
    assert not (tmp_path / "demo").exists()


def test_bad_video_files_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="video_files must be >= 1"):
        write_demo_dataset(tmp_path / "demo", episodes=1, video_files=0)

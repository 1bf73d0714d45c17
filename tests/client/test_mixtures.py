"""Mixtures against a real server: one schema out of two robots, merged statistics, samples equal to the
components' own, weights in every prefix, draws without replacement, and resumption across world sizes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import episerve
from app.demo import write_demo_dataset
from episerve._global_steps import GlobalSteps
from episerve._mixture_dataset import MixtureDataset
from episerve._mixture_iterable import MixtureIterableDataset
from tests.client.helpers import run_in_process
from tests.support import ServerProcess, eventually, write_generic_dataset
from tests.video_oracle import frames_for_rows

ARM6, ARM9, GENERIC, CHANGING = "robots/arm6", "robots/arm9", "plain/generic", "robots/changing"
CHANGING_NAMED = "robots/changing-named"
TOP, WRIST, HIGH = "observation.images.top", "observation.images.wrist", "observation.images.cam_high"
# Robot B calls its top camera cam_high, has a wrist camera robot A lacks, and 9 joints to A's 6.
CROSS = episerve.Mixture(
    [
        {"dataset": ARM6, "weight": 2},
        {"dataset": ARM9, "weight": 1, "episodes": "1-4", "features": {HIGH: TOP}},
    ]
)
CHEAP = ["action", "observation.state", "index", "episode_index"]
BIG = "robots/big-camera"  # its top camera is 64x96, robot A's 48x64
SIZED = episerve.Mixture(CROSS.components, image_size=(32, 40))


@pytest.fixture(scope="module")
def mixture_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mixture-root")
    write_demo_dataset(root / ARM6, format="v3.0", episodes=6, seed=21, cameras={TOP: (48, 64)})
    write_demo_dataset(
        root / ARM9, format="v2.1", episodes=6, seed=22, joints=9, cameras={HIGH: (48, 64), WRIST: (32, 64)}
    )
    write_demo_dataset(root / BIG, format="v2.1", episodes=2, seed=23, cameras={TOP: (64, 96)})
    write_generic_dataset(root / GENERIC)
    write_demo_dataset(root / CHANGING, format="v2.1", episodes=3, seed=31, cameras=None)
    write_demo_dataset(root / CHANGING_NAMED, format="v2.1", episodes=3, seed=33, cameras=None)
    write_demo_dataset(root.parent / (root.name + "-spare"), format="v2.1", episodes=3, seed=32, cameras=None)
    return root


@pytest.fixture(scope="module")
def mixture_url(mixture_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    named = tmp_path_factory.mktemp("named-mixtures")
    CROSS.to_file(named / "cross.json")
    SIZED.to_file(named / "sized.json")
    (named / "robots").mkdir()
    (named / "robots" / "changing.json").write_text(json.dumps({"components": [{"dataset": CHANGING_NAMED}]}))
    environment = {"EPISERVE_MIXTURES_DIR": str(named), "EPISERVE_RESCAN_INTERVAL_S": "0.5"}
    with ServerProcess([mixture_root], tmp_path_factory.mktemp("mixture-cache"), env=environment) as running:
        yield running.url


def view_index(url: str, dataset: str, episodes: str | None) -> np.ndarray:
    """The `index` value of each row of a component's view."""
    return episerve.Client(url).rows(dataset, episodes, columns=["index"])["index"].to_numpy()


def expected_pairs(dataset: MixtureDataset | MixtureIterableDataset, url: str, epoch: int, positions: Any) -> list:
    """(dataset_index, index) of each position, straight from the plan and the components' views."""
    source = dataset.source
    components, rows = source.plan.locate(epoch, np.asarray(positions))
    views = [view_index(url, c.dataset, c.episodes) for c in source.mixture.components]
    return [(int(k), int(views[k][r])) for k, r in zip(components, rows, strict=True)]


def pairs(batch: dict[str, Any]) -> list[tuple[int, int]]:
    return list(zip(np.asarray(batch["dataset_index"]).tolist(), np.asarray(batch["index"]).tolist(), strict=True))


# --- the document ---------------------------------------------------------------------------------------------


def test_a_mixture_round_trips_through_json_and_yaml_files(tmp_path: Path) -> None:
    CROSS.to_file(tmp_path / "mix.json")
    assert episerve.Mixture.from_file(tmp_path / "mix.json") == CROSS
    yaml_text = "\n".join(
        [
            "components:",
            f"  - dataset: {ARM6}",
            "    weight: 2",
            f"  - dataset: {ARM9}",
            "    episodes: 1-4",
            "    features:",
            f"      {HIGH}: {TOP}",
        ]
    )
    (tmp_path / "mix.yaml").write_text(yaml_text)
    loaded = episerve.Mixture.from_file(tmp_path / "mix.yaml")
    assert loaded.to_dict() == json.loads((tmp_path / "mix.json").read_text())
    assert loaded.version == CROSS.version
    (tmp_path / "sized.yaml").write_text(yaml_text + f"\nimage_size:\n  {TOP}: [32, 40]\n")
    sized = episerve.Mixture.from_file(tmp_path / "sized.yaml")
    assert sized.image_size == {TOP: (32, 40)} and sized.image_size_of(TOP) == (32, 40)
    assert sized.image_size_of(WRIST) is None and sized.version != CROSS.version
    SIZED.to_file(tmp_path / "sized.json")
    assert episerve.Mixture.from_file(tmp_path / "sized.json") == SIZED
    assert json.loads((tmp_path / "sized.json").read_text())["image_size"] == [32, 40]


def test_the_version_changes_with_any_component() -> None:
    heavier = episerve.Mixture([{"dataset": ARM6, "weight": 3}, CROSS.components[1]])
    other_pick = episerve.Mixture([CROSS.components[0], {"dataset": ARM9, "episodes": "0-4", "features": {HIGH: TOP}}])
    assert len({CROSS.version, heavier.version, other_pick.version}) == 3


@pytest.mark.parametrize(
    "document",
    [
        {"components": []},
        {"components": [{"dataset": ARM6, "weight": 0}]},
        {"components": [{"dataset": ARM6, "wieght": 2}]},
        {"components": [{"dataset": ARM6, "features": {"a": "x", "b": "x"}}]},
        {"components": [ARM6], "image_size": [0, 32]},
        {"components": [ARM6], "image_size": [32]},
        {"components": [ARM6], "image_size": {TOP: [32, 40.5]}},
        {"components": [ARM6], "image_size": "32x40"},
        {"components": [ARM6], "image_sizes": [32, 40]},
    ],
)
def test_a_bad_document_is_refused_when_written(document: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        episerve.Mixture.from_dict(document)


def test_the_resolved_version_changes_when_a_component_changes(mixture_url: str, mixture_root: Path) -> None:
    mixture = episerve.Mixture([ARM6, CHANGING])
    before = MixtureDataset(mixture_url, mixture, columns=CHEAP).version
    assert MixtureDataset(mixture_url, mixture, columns=CHEAP).version == before
    spare = mixture_root.parent / (mixture_root.name + "-spare")
    for source in sorted(spare.rglob("episode_000000.parquet")):  # the same episode, recorded again
        shutil.copyfile(source, mixture_root / CHANGING / source.relative_to(spare))
    eventually(lambda: MixtureDataset(mixture_url, mixture, columns=CHEAP).version != before, seconds=30)


def test_named_mixtures_are_listed_with_shares_and_read_like_any_mixture(mixture_url: str) -> None:
    client = episerve.Client(mixture_url)
    listed = {m["id"]: m for m in client.mixtures()}
    assert set(listed) == {"cross", "sized", "robots/changing"}
    cross = listed["cross"]
    assert [c["share"] for c in cross["components"]] == pytest.approx([2 / 3, 1 / 3])
    assert cross["components"][1]["rows"] == len(view_index(mixture_url, ARM9, "1-4"))
    assert episerve.Mixture.named(client, "cross") == CROSS
    dataset = episerve.EpisodeDataset(mixture_url, episerve.Mixture.named(client, "cross"), columns=CHEAP)
    assert pairs(dataset.__getitems__([0, 1, 2]).data) == pairs(
        MixtureDataset(mixture_url, CROSS, CHEAP).__getitems__([0, 1, 2]).data
    )
    with pytest.raises(episerve.NotFound, match="no mixture 'nothing'"):
        client.mixture("nothing")
    assert listed["sized"]["image_size"] == [32, 40] and "image_size" not in cross
    assert listed["sized"]["version"] != cross["version"]
    assert episerve.Mixture.named(client, "sized") == SIZED


def test_a_named_mixtures_version_changes_when_a_component_changes(mixture_url: str, mixture_root: Path) -> None:
    client = episerve.Client(mixture_url)
    before = client.mixture("robots/changing")["version"]
    assert client.mixture("robots/changing")["version"] == before
    data = sorted((mixture_root / CHANGING_NAMED).rglob("episode_000001.parquet"))
    shutil.copyfile(data[0], sorted((mixture_root / CHANGING_NAMED).rglob("episode_000000.parquet"))[0])
    eventually(lambda: client.mixture("robots/changing")["version"] != before, seconds=30)


# --- one schema out of many -----------------------------------------------------------------------------------


def test_the_feature_map_renames_pads_vectors_with_masks_and_flags_a_missing_camera(mixture_url: str) -> None:
    dataset = MixtureDataset(mixture_url, CROSS, columns=["action", TOP, WRIST, "index"])
    assert dataset.features == [
        "action",
        "action_is_real",
        TOP,
        "index",
        WRIST,
        WRIST + "_is_missing",
        "dataset_index",
    ]
    batch = episerve.collate(dataset.__getitems__(list(range(30))))
    robot = batch["dataset_index"].numpy()
    assert set(robot.tolist()) == {0, 1}
    assert batch["action"].shape == (30, 9) and batch[TOP].shape == (30, 3, 48, 64)
    assert batch[WRIST].shape == (30, 3, 32, 64)
    mask = batch["action_is_real"].numpy()
    assert (mask[robot == 0] == [True] * 6 + [False] * 3).all() and mask[robot == 1].all()
    assert (batch["action"].numpy()[robot == 0][:, 6:] == 0).all()
    assert (batch[WRIST + "_is_missing"].numpy() == (robot == 0)).all()
    assert (batch[WRIST].numpy()[robot == 0] == 0).all() and batch[WRIST].numpy()[robot == 1].any()


def test_samples_equal_the_component_datasets_own_samples(mixture_url: str) -> None:
    dataset = MixtureDataset(mixture_url, CROSS, columns=["action", "observation.state", TOP, "index"], seed=3)
    positions = np.arange(5, len(dataset), 37)
    batch = episerve.collate(dataset.__getitems__((2 * len(dataset) + positions).tolist()))  # epoch 2
    components, rows = dataset.plan.locate(2, positions)
    for k, component in enumerate(CROSS.components):
        own_names = {TOP: HIGH} if k == 1 else {}
        own = episerve.EpisodeDataset(
            mixture_url, component.dataset, component.episodes, [own_names.get(n, n) for n in dataset_names()]
        )
        slots = np.flatnonzero(components == k)
        want = episerve.collate(own.__getitems__(rows[slots].tolist()))
        for name in dataset_names():
            got = batch[name].numpy()[slots]
            expected = want[own_names.get(name, name)].numpy()
            np.testing.assert_array_equal(
                got[..., : expected.shape[-1]] if name != TOP else got, expected, err_msg=name
            )


def dataset_names() -> list[str]:
    return ["action", "observation.state", TOP, "index"]


def assert_frames_are_the_components_resized(
    batch: dict[str, Any], root: Path, key: str, sources: list[tuple[str, str | None, tuple[int, int] | None]]
) -> None:
    """`batch[key]` holds, for the samples of component k, `sources[k]` = (dataset, its camera, size): that
    camera's decoded frame area-resized to the size (None: as the files hold it); zeros where it has no camera."""
    robot = np.asarray(batch["dataset_index"])
    for k, (dataset_id, camera, size) in enumerate(sources):
        mine = robot == k
        assert mine.any()
        if camera is None:
            assert not np.asarray(batch[key])[mine].any()
            continue
        rows = zip(np.asarray(batch["episode_index"])[mine], np.asarray(batch["frame_index"])[mine], strict=True)
        want = frames_for_rows(root / dataset_id, camera, [(int(e), int(f)) for e, f in rows], size=size)
        np.testing.assert_array_equal(np.asarray(batch[key])[mine], want.transpose(0, 3, 1, 2), err_msg=key)


def test_cameras_of_different_sizes_come_at_the_smallest_served_size(mixture_url: str, mixture_root: Path) -> None:
    mixture = episerve.Mixture([ARM6, BIG])
    dataset = MixtureDataset(mixture_url, mixture, columns=[TOP, "episode_index", "frame_index"], output="numpy")
    batch = episerve.collate(dataset.__getitems__(list(range(3, 63))))
    assert batch[TOP].shape == (60, 3, 48, 64)
    assert_frames_are_the_components_resized(batch, mixture_root, TOP, [(ARM6, TOP, None), (BIG, TOP, (48, 64))])


def test_a_stated_image_size_downscales_every_component_and_each_camera_may_have_its_own(
    mixture_url: str, mixture_root: Path
) -> None:
    columns = [TOP, WRIST, "episode_index", "frame_index"]
    dataset = MixtureDataset(mixture_url, SIZED, columns=columns, output="numpy", seed=4)
    batch = episerve.collate(dataset.__getitems__(list(range(40))))
    assert batch[TOP].shape == batch[WRIST].shape == (40, 3, 32, 40)
    assert_frames_are_the_components_resized(batch, mixture_root, TOP, [(ARM6, TOP, (32, 40)), (ARM9, HIGH, (32, 40))])
    assert_frames_are_the_components_resized(batch, mixture_root, WRIST, [(ARM6, None, None), (ARM9, WRIST, (32, 40))])
    per_camera = episerve.Mixture(CROSS.components, image_size={WRIST: (16, 32)})
    streamed = MixtureIterableDataset(mixture_url, per_camera, columns, batch_size=30, output="numpy", seed=4)
    batch = next(iter(streamed))
    assert batch[TOP].shape == (30, 3, 48, 64) and batch[WRIST].shape == (30, 3, 16, 32)
    assert_frames_are_the_components_resized(batch, mixture_root, TOP, [(ARM6, TOP, None), (ARM9, HIGH, None)])
    assert_frames_are_the_components_resized(batch, mixture_root, WRIST, [(ARM6, None, None), (ARM9, WRIST, (16, 32))])


def test_an_image_size_a_component_would_have_to_enlarge_is_refused_at_definition(mixture_url: str) -> None:
    too_large = episerve.Mixture([ARM6, BIG], image_size=(64, 96))
    with pytest.raises(
        episerve.MixtureError,
        match=r"'observation.images.top' at image_size 64x96 .*48x64 in component 0 \('robots/arm6'\)",
    ):
        MixtureDataset(mixture_url, too_large, columns=[TOP])
    unknown = episerve.Mixture([ARM6, BIG], image_size={"observation.images.side": (8, 8)})
    with pytest.raises(episerve.MixtureError, match=r"image_size names \['observation.images.side'\]"):
        MixtureDataset(mixture_url, unknown, columns=[TOP])
    with pytest.raises(ValueError, match="states the size of its cameras"):
        episerve.EpisodeDataset(mixture_url, CROSS, columns=[TOP], image_size=(8, 8))


def test_features_that_cannot_be_aligned_are_refused_at_definition(mixture_url: str) -> None:
    scalar_as_vector = episerve.Mixture([ARM6, {"dataset": ARM9, "features": {"action": "act", "index": "action"}}])
    with pytest.raises(episerve.MixtureError, match="different kinds"):
        MixtureDataset(mixture_url, scalar_as_vector, columns=["action"])
    other_type = episerve.Mixture([ARM6, {"dataset": GENERIC, "features": {"value": "timestamp"}}])
    with pytest.raises(episerve.MixtureError, match=r"timestamp.*different types.*float.*int64"):
        MixtureDataset(mixture_url, other_type, columns=["timestamp"])
    with pytest.raises(episerve.MixtureError, match=r"'reading' is missing from component 0"):
        MixtureDataset(mixture_url, episerve.Mixture([ARM6, GENERIC]), columns=["reading", "episode_index"])


def test_windows_are_resolved_per_component_at_its_own_fps(mixture_url: str) -> None:
    # the demo records at 30 fps, the generic dataset at 10: -0.1 s is 3 frames back for one, 1 for the other
    mixture = episerve.Mixture([{"dataset": ARM6, "features": {"timestamp": "reading"}}, GENERIC])
    windows = {"reading": [-0.1, 0.0]}
    dataset = MixtureDataset(mixture_url, mixture, columns=["reading"], delta_timestamps=windows)
    batch = episerve.collate(dataset.__getitems__(list(range(len(dataset)))))
    components, rows = dataset.plan.locate(0, np.arange(len(dataset)))
    for k, (dataset_id, column) in enumerate([(ARM6, "timestamp"), (GENERIC, "reading")]):
        own = episerve.EpisodeDataset(mixture_url, dataset_id, columns=[column], delta_timestamps={column: [-0.1, 0.0]})
        want = episerve.collate(own.__getitems__(rows[components == k].tolist()))
        np.testing.assert_array_equal(batch["reading"].numpy()[components == k], want[column].numpy())
        np.testing.assert_array_equal(batch["reading_is_pad"].numpy()[components == k], want[column + "_is_pad"])
    with pytest.raises(episerve.MixtureError, match=r"component 1 \('plain/generic'\).*off the 1/10 s frame grid"):
        MixtureDataset(mixture_url, mixture, columns=["reading"], delta_timestamps={"reading": [-1 / 30, 0.0]})


# --- statistics -----------------------------------------------------------------------------------------------


def reference_aggregate(stats_list: list[dict[str, dict[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """LeRobot's aggregate_stats written out plainly: count-weighted mean, pooled variance, min of mins, max of
    maxes, summed counts, over the datasets that have each feature."""
    merged = {}
    for key in {key for stats in stats_list for key in stats}:
        parts = [stats[key] for stats in stats_list if key in stats]
        total = sum(float(p["count"][0]) for p in parts)
        mean = sum(p["mean"] * float(p["count"][0]) for p in parts) / total
        variance = sum((p["std"] ** 2 + (p["mean"] - mean) ** 2) * float(p["count"][0]) for p in parts) / total
        merged[key] = {
            "min": np.min(np.stack([p["min"] for p in parts]), axis=0),
            "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
            "mean": mean,
            "std": np.sqrt(variance),
            "count": np.array([total]),
        }
    return merged


def dataset_stats(url: str, dataset: str, renames: dict[str, str]) -> dict[str, dict[str, np.ndarray]]:
    raw = episerve.Client(url).stats(dataset)
    return {renames.get(k, k): {s: np.asarray(v, dtype=np.float64) for s, v in vs.items()} for k, vs in raw.items()}


def test_merged_statistics_equal_lerobots_aggregate_and_padded_dimensions_come_from_who_has_them(
    mixture_url: str,
) -> None:
    stats = MixtureDataset(mixture_url, CROSS, columns=CHEAP).stats()
    arm6, arm9 = dataset_stats(mixture_url, ARM6, {}), dataset_stats(mixture_url, ARM9, {HIGH: TOP})
    vectors = ("action", "observation.state")
    reference = reference_aggregate([{k: v for k, v in part.items() if k not in vectors} for part in (arm6, arm9)])
    assert set(stats) == set(reference) | set(vectors)
    for name in ("timestamp", "index", "observation.image", TOP, WRIST):
        for stat in ("min", "max", "mean", "std", "count"):
            np.testing.assert_allclose(stats[name][stat], reference[name][stat], rtol=1e-12, err_msg=f"{name} {stat}")
    shared = reference_aggregate(
        [{"action": {s: v[:6] if s != "count" else v for s, v in arm9["action"].items()}}, arm6]
    )
    for stat in ("min", "max", "mean", "std"):
        np.testing.assert_allclose(stats["action"][stat][:6], shared["action"][stat], rtol=1e-12)
        np.testing.assert_allclose(stats["action"][stat][6:], arm9["action"][stat][6:], rtol=1e-12)
    assert stats["action"]["count"][0] == arm6["action"]["count"][0] + arm9["action"]["count"][0]


# --- the plan, read through the server ------------------------------------------------------------------------


def test_an_epoch_honours_the_weights_in_every_prefix_and_draws_without_replacement(mixture_url: str) -> None:
    mixture = episerve.Mixture([{"dataset": ARM6, "weight": 5}, {"dataset": ARM9, "episodes": "2", "weight": 1}])
    dataset = MixtureIterableDataset(mixture_url, mixture, CHEAP, batch_size=64, seed=5, epoch_size=2000)
    delivered = [pair for batch in dataset for pair in pairs(batch)]
    assert len(delivered) == dataset.epoch_size
    robots = np.asarray([k for k, _ in delivered])
    n = np.arange(1, len(robots) + 1)
    for k, share in enumerate([5 / 6, 1 / 6]):
        filled = np.cumsum(robots == k)
        assert (np.abs(filled - n * share) < 1).all()
    for k, component in enumerate(mixture.components):
        view = view_index(mixture_url, component.dataset, component.episodes)
        drawn = [index for robot, index in delivered if robot == k]
        for start in range(0, len(drawn) - len(view) + 1, len(view)):  # every full pass is the view once
            assert sorted(drawn[start : start + len(view)]) == sorted(view.tolist())
    small = [index for robot, index in delivered if robot == 1]
    assert len(small) > 2 * len(view_index(mixture_url, ARM9, "2"))  # the small component cycled


# --- ranks and workers ----------------------------------------------------------------------------------------


def run_rank(
    url: str,
    rank: int,
    world: int,
    workers: int,
    batch_size: int,
    state: dict | None,
    batches: int | None,
    chunk_rows: int | None,
):
    """One rank's process: a DataLoader with `workers` workers from `state`, `batches` batches (all when None),
    reading `chunk_rows` rows per request."""
    dataset = MixtureIterableDataset(
        url, CROSS, CHEAP, batch_size=batch_size, rank=rank, world_size=world, seed=8, chunk_rows=chunk_rows
    )
    dataset.set_epoch(1)
    if state is not None:
        dataset.load_state_dict(state)
    seen = []
    taken = 0
    for batch in DataLoader(dataset, batch_size=None, num_workers=workers):
        if batches is not None and taken == batches:
            break
        seen.extend(pairs(batch))
        taken += 1
    return seen, dataset.state_dict(batches=taken)


def test_resuming_on_other_world_sizes_workers_and_batches_delivers_every_position_once(mixture_url: str) -> None:
    state = None
    delivered: list[tuple[int, int]] = []
    # Reading several batches per request (two in the second run; three, copied out, in the third) changes nothing.
    for world, workers, batch_size, batches, chunk_rows in [(4, 2, 3, 5, None), (3, 1, 4, 7, 8), (5, 3, 2, None, 6)]:
        results = [
            run_in_process(run_rank, mixture_url, rank, world, workers, batch_size, state, batches, chunk_rows)
            for rank in range(world)
        ]
        states = [saved for _, saved in results]
        assert all(saved == states[0] for saved in states)
        start = 0 if state is None else state["position"]
        stop = states[0]["position"]
        ranks = [seen for seen, _ in results]
        reference = MixtureIterableDataset(mixture_url, CROSS, CHEAP, batch_size=batch_size, seed=8)
        for rank, seen in enumerate(ranks):  # each rank got its consecutive part of each global step
            steps = range(start, stop, world * batch_size)
            mine = [p for s in steps for p in range(*_part(s, min(stop, s + world * batch_size), rank, world))]
            assert seen == expected_pairs(reference, mixture_url, 1, mine)
        delivered += [pair for seen in ranks for pair in seen]
        state = states[0]
    assert state["position"] == reference.epoch_size and state["epoch"] == 1
    everything = expected_pairs(reference, mixture_url, 1, np.arange(reference.epoch_size))
    assert sorted(delivered) == sorted(everything) and len(delivered) == reference.epoch_size


@pytest.mark.parametrize("chunk_rows", [None, 10, 15])
def test_streamed_batches_are_the_map_style_samples_however_many_a_request_reads(
    mixture_url: str, chunk_rows: int | None
) -> None:
    columns = [TOP, "observation.state", "index"]
    streamed = MixtureIterableDataset(mixture_url, CROSS, columns, batch_size=5, seed=6, chunk_rows=chunk_rows)
    streamed.set_epoch(1)
    reference = MixtureDataset(mixture_url, CROSS, columns, seed=6)
    batches = list(DataLoader(streamed, batch_size=None, num_workers=2))
    assert sum(len(batch["index"]) for batch in batches) == len(reference)
    steps = GlobalSteps(len(reference), 0, 5, 1, False)
    for worker in range(2):  # worker w yields steps w, w + 2, ...; the DataLoader takes the workers in turn
        for number, step in enumerate(range(worker, steps.num_steps, 2)):
            low, high = steps.span(step, 0)
            want = episerve.collate(reference.__getitems__((len(reference) + np.arange(low, high)).tolist()))
            got = batches[2 * number + worker]
            for name in [*columns, "observation.state_is_real", "dataset_index"]:
                np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


@pytest.mark.parametrize("chunk_rows", [None, 8])
def test_a_stream_deep_into_an_epoch_of_a_trillion_positions_starts_at_once(
    mixture_url: str, chunk_rows: int | None
) -> None:
    """Nothing per step of the epoch is made before the first batch (listing 10^11 steps would never end)."""
    dataset = MixtureIterableDataset(
        mixture_url, CROSS, CHEAP, batch_size=4, epoch_size=10**12, rank=1, world_size=3, chunk_rows=chunk_rows
    )
    state = {"mixture": dataset.version, "seed": 0, "epoch": 0, "position": 5 * 10**11 + 7}
    dataset.load_state_dict(state)
    first = next(iter(dataset))
    low, high = dataset._steps().span(0, 1)
    assert (low, high) == (5 * 10**11 + 11, 5 * 10**11 + 15)  # this rank's part of the first global step
    assert pairs(first) == expected_pairs(dataset, mixture_url, 0, np.arange(low, high))


def _part(low: int, high: int, rank: int, world: int) -> tuple[int, int]:
    size = high - low
    return low + rank * size // world, low + (rank + 1) * size // world


def test_the_map_style_sampler_resumes_on_another_world_size(mixture_url: str) -> None:
    dataset = MixtureDataset(mixture_url, CROSS, CHEAP, seed=2)
    first = [dataset.sampler(4, rank, 2) for rank in range(2)]
    delivered = []
    for sampler in first:
        sampler.set_epoch(3)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=episerve.collate, num_workers=2)
        for taken, batch in enumerate(loader):
            if taken == 6:
                break
            delivered += pairs(batch)
    state = first[0].state_dict(batches=6)
    assert state == first[1].state_dict(batches=6) and state["position"] == 48
    for rank in range(3):
        sampler = dataset.sampler(5, rank, 3)
        sampler.load_state_dict(state)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=episerve.collate)
        delivered += [pair for batch in loader for pair in pairs(batch)]
    assert sorted(delivered) == sorted(expected_pairs(dataset, mixture_url, 3, np.arange(len(dataset))))


def test_a_state_from_another_mixture_or_seed_is_refused(mixture_url: str) -> None:
    dataset = MixtureIterableDataset(mixture_url, CROSS, CHEAP, batch_size=4, seed=1)
    state = dataset.state_dict(batches=0)
    with pytest.raises(ValueError, match="seed"):
        MixtureIterableDataset(mixture_url, CROSS, CHEAP, batch_size=4, seed=2).load_state_dict(state)
    other = episerve.Mixture([ARM6, {"dataset": ARM9, "features": {HIGH: TOP}}])
    with pytest.raises(ValueError, match="mixture version"):
        MixtureIterableDataset(mixture_url, other, CHEAP, batch_size=4, seed=1).load_state_dict(state)


def test_a_mixture_is_accepted_wherever_a_dataset_id_is(mixture_url: str) -> None:
    mapped = episerve.EpisodeDataset(mixture_url, CROSS, None, CHEAP, seed=0)
    assert isinstance(mapped, episerve.MixtureDataset) and mapped.plan.seed == 0
    streamed = episerve.EpisodeIterableDataset(mixture_url, CROSS, columns=CHEAP, batch_size=8, shuffle=True)
    assert isinstance(streamed, episerve.MixtureIterableDataset)
    assert pairs(next(iter(streamed))) == pairs(mapped.__getitems__(list(range(8))).data)
    with pytest.raises(ValueError, match="per component"):
        episerve.EpisodeDataset(mixture_url, CROSS, episodes=[1, 2])
    plain = episerve.EpisodeDataset(mixture_url, ARM6, columns=CHEAP)
    assert type(plain) is episerve.EpisodeDataset and len(plain) > 0

"""`RemoteLeRobotDataset` over a mixture, against a real server: each sample is its component's own
`RemoteLeRobotDataset` sample (after the feature map and padding) with `dataset_index`; `meta` describes the
mixture in LeRobot's shapes; a list of dataset ids is weighted by rows (every row once per epoch), and named
mixtures and mixture documents are accepted where a repo id is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import episerve
from app.demo import IMAGE
from episerve._mixture_dataset import MixtureDataset
from episerve.lerobot import RemoteLeRobotDataset, RemoteLeRobotMixture, collate
from tests.client.helpers import ARM6, ARM9, CROSS_DOCUMENT, FOLD, HIGH, PICK, SLOW, TOP, WRIST

CROSS = episerve.Mixture.from_dict(CROSS_DOCUMENT)
WINDOWS = {"action": [0.0, 1 / 30, 2 / 30], "observation.state": [-1 / 30, 0.0], TOP: [-1 / 30, 0.0]}


def own_windows(k: int) -> dict[str, list[float]]:
    """The mixture's windows in component `k`'s names."""
    return {HIGH if (k == 1 and key == TOP) else key: deltas for key, deltas in WINDOWS.items()}


def assert_component_sample(sample: dict[str, Any], own: dict[str, Any], k: int) -> None:
    """A mixture sample is component `k`'s own sample renamed (`cam_high` is `top`), its vectors padded with zeros
    and masked, a camera it lacks zeros and flagged, plus `dataset_index`."""
    renamed = {key.replace(HIGH, TOP): value for key, value in own.items()}
    for key, value in renamed.items():
        got = sample[key]
        if isinstance(value, str):
            assert got == value, key
            continue
        assert got.dtype == value.dtype, key
        mask = sample.get(key + "_is_real")
        if mask is None:
            assert torch.equal(got, value), key
            continue
        width = value.shape[-1]
        assert torch.equal(got[..., :width], value) and not got[..., width:].any(), key
        assert mask.tolist() == [True] * width + [False] * (got.shape[-1] - width), key
    missing = WRIST not in renamed
    added = {"action_is_real", "observation.state_is_real", WRIST + "_is_missing", "dataset_index"}
    assert set(sample) - set(renamed) == added | ({WRIST} if missing else set())
    assert sample["dataset_index"].dtype == torch.int64 and sample["dataset_index"].item() == k
    assert sample[WRIST + "_is_missing"].item() == missing
    if missing:
        assert sample[WRIST].shape == (3, 32, 64) and sample[WRIST].dtype == torch.float32
        assert not sample[WRIST].any()


def test_samples_equal_each_components_own_samples_after_the_feature_map_and_padding(robots_url: str) -> None:
    dataset = RemoteLeRobotDataset(robots_url, CROSS, delta_timestamps=WINDOWS, seed=4)
    assert isinstance(dataset, RemoteLeRobotMixture)
    owns = [
        RemoteLeRobotDataset(robots_url, PICK, delta_timestamps=own_windows(0)),
        RemoteLeRobotDataset(robots_url, FOLD, episodes=[1, 2, 3], delta_timestamps=own_windows(1)),
    ]
    dataset.set_epoch(2)
    positions = np.arange(3, len(dataset), 17)
    components, rows = dataset.plan.locate(2, positions)
    assert set(components.tolist()) == {0, 1}
    for position, sample in zip(positions.tolist(), dataset.__getitems__(positions.tolist()), strict=True):
        k, row = int(components[positions == position][0]), int(rows[positions == position][0])
        assert_component_sample(sample, owns[k][row], k)
        assert list(sample)[:2] == [TOP, WRIST] and list(sample)[-1] == "dataset_index"
    assert dataset[-1].keys() == dataset[len(dataset) - 1].keys()
    with pytest.raises(IndexError):
        dataset[len(dataset)]


def test_dataloader_batches_equal_the_stacked_samples(robots_url: str) -> None:
    dataset = RemoteLeRobotDataset(robots_url, CROSS, delta_timestamps=WINDOWS)
    order = np.random.default_rng(3).permutation(len(dataset)).tolist()[:24]
    for collate_fn in (collate, None):
        loader = DataLoader(dataset, batch_size=8, sampler=order, num_workers=2, collate_fn=collate_fn)
        for number, batch in enumerate(loader):
            stacked = default_collate([dataset[i] for i in order[number * 8 : (number + 1) * 8]])
            assert list(batch) == list(stacked)
            for key, value in stacked.items():
                if isinstance(value, torch.Tensor):
                    assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), key
                else:
                    assert list(batch[key]) == value, key


def test_a_spawned_worker_unpickles_the_mixture(robots_url: str) -> None:
    dataset = RemoteLeRobotDataset(robots_url, CROSS, delta_timestamps=WINDOWS)
    dataset.set_epoch(1)
    loader = DataLoader(dataset, batch_size=4, num_workers=1, multiprocessing_context="spawn", collate_fn=collate)
    batch = next(iter(loader))
    expected = collate(dataset.__getitems__([0, 1, 2, 3]))
    for key, value in expected.items():
        assert torch.equal(batch[key], value) if isinstance(value, torch.Tensor) else batch[key] == value, key


def test_meta_describes_the_mixture_in_lerobots_shapes(robots_url: str) -> None:
    dataset = RemoteLeRobotDataset(robots_url, CROSS, delta_timestamps=WINDOWS)
    meta = dataset.meta
    pick, fold = (RemoteLeRobotDataset(robots_url, name).meta for name in (PICK, FOLD))
    fold_rows = sum(fold.episodes[e]["length"] for e in (1, 2, 3))
    assert (meta.total_frames, meta.total_episodes) == (pick.total_frames + fold_rows, pick.total_episodes + 3)
    assert len(dataset) == dataset.num_frames == meta.total_frames and dataset.num_episodes == meta.total_episodes
    assert list(meta.features) == [*pick.features, WRIST]  # the first robot's order, then what it lacks
    assert meta.features["action"] == fold.features["action"] and meta.shapes["action"] == (9,)
    assert meta.features["observation.state"]["shape"] == (9,)
    assert meta.features[TOP] == pick.features[TOP] and meta.features[WRIST] == fold.features[WRIST]
    assert meta.camera_keys == [IMAGE, TOP, WRIST] and meta.video_keys == [TOP, WRIST]
    assert not any(key.endswith(("_is_real", "_is_missing")) for key in meta.features)  # not policy inputs
    assert (meta.fps, meta.fps_by_component, dataset.fps) == (30, (30, 30), 30)
    assert meta.info["features"] == meta.features and meta.robot_type == pick.robot_type
    assert meta.episodes["dataset_from_index"] == [0] and meta.episodes["dataset_to_index"] == [len(dataset)]
    assert dataset.episodes is None and dataset.disabled_features == set()
    assert dataset.repo_ids == [PICK, FOLD] and dataset.repo_id_to_index == {PICK: 0, FOLD: 1}
    assert dataset.delta_indices == {"action": [0, 1, 2], "observation.state": [-1, 0], TOP: [-1, 0]}
    merged = MixtureDataset(robots_url, CROSS, columns=["action"]).stats()
    assert set(meta.stats) == set(merged) and dataset.stats is meta.stats
    for feature, stats in merged.items():
        for name, value in stats.items():
            assert meta.stats[feature][name].dtype == value.dtype, (feature, name)
            np.testing.assert_array_equal(meta.stats[feature][name], value, err_msg=f"{feature} {name}")
    assert meta.tasks["dataset_index"].tolist() == [0] * pick.total_tasks + [1] * fold.total_tasks
    assert [meta.tasks.iloc[i].name for i in range(pick.total_tasks)] == list(pick.tasks_by_index.values())
    assert meta.components[1].tasks_by_index == fold.tasks_by_index


def test_columns_only_some_components_have_are_padded_flagged_or_left_out(robots_url: str) -> None:
    """A scalar one component lacks is left out (as MultiLeRobotDataset keeps only common keys); vectors and
    cameras are padded and flagged."""
    mixture = episerve.Mixture([PICK, {"dataset": FOLD, "features": {"index": "global_index", HIGH: TOP}}])
    dataset = RemoteLeRobotDataset(robots_url, mixture)
    assert dataset.disabled_features == {"index", "global_index"}
    assert "index" not in dataset.meta.features and "global_index" not in dataset.meta.features
    sample = dataset[0]
    assert "index" not in sample and "global_index" not in sample
    assert {"action_is_real", "observation.state_is_real", WRIST + "_is_missing", "dataset_index"} <= set(sample)


def test_components_at_different_fps_window_each_at_its_own(robots_url: str) -> None:
    """`meta.fps` is the first component's; offsets in seconds are resolved per component at its own fps, and
    one off a component's frame grid is refused at construction, naming it."""
    mixture = episerve.Mixture([ARM6, SLOW])
    windows = {"action": [0.0, 2 / 30]}  # 2 frames at 30 fps, 1 at 15
    dataset = RemoteLeRobotDataset(robots_url, mixture, delta_timestamps=windows)
    assert (dataset.meta.fps, dataset.meta.fps_by_component) == (30, (30, 15))
    components, rows = dataset.plan.locate(0, np.arange(len(dataset)))
    picks = [int(np.flatnonzero(components == k)[5]) for k in (0, 1)]
    for k, name in enumerate((ARM6, SLOW)):
        own = RemoteLeRobotDataset(robots_url, name, delta_timestamps=windows)[int(rows[picks[k]])]
        assert torch.equal(dataset[picks[k]]["action"], own["action"])
    with pytest.raises(episerve.MixtureError, match=r"component 1 \('images/slow'\)"):
        RemoteLeRobotDataset(robots_url, mixture, delta_timestamps={"action": [0.0, 1 / 30]})


@pytest.mark.parametrize(
    "repo_id",
    [[ARM6, ARM9], f"[{ARM6},{ARM9}]", f"['{ARM6}', '{ARM9}']"],
    ids=["list", "cli-text", "parsed-cli-text"],
)
def test_a_list_of_ids_is_weighted_by_rows_so_an_epoch_holds_every_row_once(robots_url: str, repo_id: Any) -> None:
    dataset = RemoteLeRobotDataset(robots_url, repo_id)
    rows = [len(RemoteLeRobotDataset(robots_url, name)) for name in (ARM6, ARM9)]
    assert dataset.mixture.weights == tuple(rows) and len(dataset) == sum(rows)
    assert dataset.repo_id == f"[{ARM6},{ARM9}]" and dataset.repo_ids == [ARM6, ARM9]
    batch = collate(dataset.__getitems__(list(range(len(dataset)))))
    seen = sorted(zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True))
    client = episerve.Client(robots_url)
    every_row = [(k, i) for k, name in enumerate((ARM6, ARM9)) for i in client.rows(name)["index"].to_pylist()]
    assert seen == sorted(every_row)
    picked = RemoteLeRobotDataset(robots_url, repo_id, episodes={ARM9: [0, 2]})
    assert picked.mixture.components[1].episodes == "0,2"
    assert picked.mixture.weights[1] == len(RemoteLeRobotDataset(robots_url, ARM9, episodes=[0, 2]))


def test_a_named_mixture_and_a_mixture_document_are_repo_ids(robots_url: str, tmp_path: Path) -> None:
    document = tmp_path / "cross.yaml"
    document.write_text(json.dumps(CROSS_DOCUMENT))  # JSON is YAML
    plain = RemoteLeRobotDataset(robots_url, CROSS)
    for repo_id in ("mixture:cross", f"mixture:{document}"):
        dataset = RemoteLeRobotDataset(robots_url, repo_id)
        assert dataset.repo_id == repo_id and dataset.mixture == CROSS and dataset.version == plain.version
        assert torch.equal(dataset[7]["action"], plain[7]["action"])


def test_mistakes_fail_at_construction(robots_url: str) -> None:
    with pytest.raises(ValueError, match="picks the episodes of each component itself"):
        RemoteLeRobotDataset(robots_url, "mixture:cross", episodes={PICK: [1]})
    with pytest.raises(ValueError, match="per dataset"):
        RemoteLeRobotDataset(robots_url, [ARM6, ARM9], episodes=[1, 2])
    with pytest.raises(ValueError, match="not in the list"):
        RemoteLeRobotDataset(robots_url, [ARM6, ARM9], episodes={PICK: [1]})
    with pytest.raises(episerve.NotFound, match="no mixture 'nothing'"):
        RemoteLeRobotDataset(robots_url, "mixture:nothing")
    with pytest.raises(FileNotFoundError, match="no mixture document"):
        RemoteLeRobotDataset(robots_url, "mixture:nowhere/mix.yaml")
    with pytest.raises(ValueError, match="at least one id"):
        RemoteLeRobotDataset(robots_url, "[]")
    with pytest.raises(episerve.NotFound):
        RemoteLeRobotDataset(robots_url, [ARM6, "images/none"])

"""Several datasets through the LeRobot switch, against a real server with LeRobot 0.4.4: `--dataset.repo_id='[a,b]'`
(which LeRobot refuses) trains a tiny ACT on the mixture of two robots with different action widths, every batch
being the mixture's own samples; a named mixture with a feature map trains too; `MultiLeRobotDataset` and LeRobot's
`make_dataset` serve mixtures."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import episerve
from app.demo import IMAGE
from episerve._mixture_dataset import MixtureDataset
from episerve.lerobot import RemoteLeRobotDataset, RemoteLeRobotMixture
from episerve.lerobot._mixture_repo import lerobot_mixture
from tests.client.helpers import ARM6, ARM9, FOLD, PICK, TOP, WRIST, LeRobotTrainer
from tests.client.test_lerobot_train import STEPS, TINY_ACT, _common

lerobot_dataset = pytest.importorskip("lerobot.datasets.lerobot_dataset", reason="LeRobot is installed by make venv")


def positions_of(dataset: MixtureDataset, url: str) -> dict[tuple[int, int], int]:
    """The epoch-0 position of each (dataset_index, index) pair: unique when every row comes once per epoch."""
    located, rows = dataset.plan.locate(0, np.arange(len(dataset)))
    client = episerve.Client(url)
    views = [client.rows(c.dataset, c.episodes, columns=["index"])["index"] for c in dataset.mixture.components]
    pairs = [(int(k), views[k][int(r)].as_py()) for k, r in zip(located, rows, strict=True)]
    assert len(set(pairs)) == len(pairs)
    return {pair: position for position, pair in enumerate(pairs)}


def assert_batch_is_the_mixtures_own(batch: dict[str, Any], oracle: MixtureDataset, url: str) -> None:
    """Every key of a training batch equals the mixture's own samples (MixtureDataset) at the same positions:
    cameras as LeRobot's float32 x / 255, other tensors in LeRobot's dtypes, `task` the component's task string."""
    where = positions_of(oracle, url)
    pairs = zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True)
    expected = episerve.collate(oracle.__getitems__([where[pair] for pair in pairs]))
    for key, value in batch.items():
        if key == "task":
            tasks = [RemoteLeRobotDataset(url, c.dataset).meta.tasks_by_index for c in oracle.mixture.components]
            indices = zip(expected["dataset_index"].tolist(), expected["task_index"].tolist(), strict=True)
            assert value == [tasks[k][i] for k, i in indices]
            continue
        want = expected[key]
        if want.dtype == torch.uint8:
            want = want.to(torch.float32) / 255
        assert torch.equal(value, want.to(value.dtype)), key
        assert value.dtype == (torch.float32 if want.is_floating_point() else want.dtype), key


def test_act_trains_on_a_list_of_datasets_with_the_mixtures_samples(
    lerobot_trainer: LeRobotTrainer, robots_url: str, tmp_path: Path
) -> None:
    """`--dataset.repo_id='[a,b]'` with two robots of 6 and 9 joints, 2 forked DataLoader workers: finite losses,
    and every batch is the row-weighted mixture's own samples."""
    repo_id = f"[{ARM6},{ARM9}]"
    (record,) = lerobot_trainer.train(
        ("episerve", ["--episerve-url", robots_url, *_common(repo_id, tmp_path, "out", workers=2), *TINY_ACT])
    )
    assert record["dataset_class"] == "RemoteLeRobotMixture"
    assert len(record["losses"]) == STEPS and all(math.isfinite(loss) for loss in record["losses"])
    assert len(record["batches"]) == STEPS
    mixture, _, _ = lerobot_mixture(episerve.Client(robots_url), repo_id)
    windows = record["delta_timestamps"]
    assert windows == {"action": [i / 30 for i in range(10)]}
    oracle = MixtureDataset(robots_url, mixture, delta_timestamps=windows, decode_images=True)
    for batch in record["batches"]:
        assert batch["action"].shape == (4, 10, 9) and batch[IMAGE].shape == (4, 3, 32, 32)
        assert_batch_is_the_mixtures_own(batch, oracle, robots_url)
    robots = torch.cat([batch["dataset_index"] for batch in record["batches"]])
    assert set(robots.tolist()) == {0, 1}


def test_a_named_mixture_with_a_feature_map_trains(
    lerobot_trainer: LeRobotTrainer, robots_url: str, tmp_path: Path
) -> None:
    """`--dataset.repo_id=mixture:cross`: two video robots, one's `cam_high` renamed `top`, a wrist camera only one
    has; its weights, picks and map come from the server's document."""
    (record,) = lerobot_trainer.train(
        ("episerve", ["--episerve-url", robots_url, *_common("mixture:cross", tmp_path, "out"), *TINY_ACT])
    )
    assert all(math.isfinite(loss) for loss in record["losses"]) and len(record["losses"]) == STEPS
    batch = record["first_batch"]
    assert batch[TOP].shape == batch[WRIST].shape == (4, 3, 32, 64)
    assert (batch[WRIST + "_is_missing"] == (batch["dataset_index"] == 0)).all()


# ----------------------------------------------------------------------------------------------------
# In this process: LeRobot's classes and factory through the switch


@pytest.fixture
def switched(robots_url: str) -> Any:
    from episerve.lerobot import _switch

    _switch.use_server(robots_url)
    try:
        yield robots_url
    finally:
        _switch._restore_lerobot()


def test_multi_lerobot_dataset_is_a_mixture_weighted_by_rows(switched: str) -> None:
    windows = {"action": [0.0, 1 / 30]}
    dataset = lerobot_dataset.MultiLeRobotDataset([PICK, FOLD], episodes={FOLD: [0, 2]}, delta_timestamps=windows)
    plain = RemoteLeRobotDataset(switched, [PICK, FOLD], episodes={FOLD: [0, 2]}, delta_timestamps=windows)
    assert type(dataset).__name__ == "ServedMultiLeRobotDataset" and isinstance(dataset, RemoteLeRobotMixture)
    assert dataset.repo_id_to_index == {PICK: 0, FOLD: 1} and dataset.version == plain.version
    assert dataset.tolerances_s == {PICK: 1e-4, FOLD: 1e-4}
    assert dataset.stats.keys() == plain.meta.stats.keys()
    for index in (0, len(dataset) // 2, len(dataset) - 1):
        assert dataset[index].keys() == plain[index].keys()
        assert torch.equal(dataset[index]["action"], plain[index]["action"])
    with pytest.raises(ValueError, match="one tolerance"):
        lerobot_dataset.MultiLeRobotDataset([PICK, FOLD], tolerances_s={PICK: 1e-4, FOLD: 1e-3})


def test_lerobot_dataset_of_a_mixture_repo_id_is_a_mixture(switched: str) -> None:
    dataset = lerobot_dataset.LeRobotDataset("mixture:cross", tolerance_s=1e-4)
    assert isinstance(dataset, RemoteLeRobotMixture) and dataset.repo_id == "mixture:cross"
    assert dataset.version == RemoteLeRobotDataset(switched, "mixture:cross").version


def test_episode_aware_sampler_permutes_the_mixtures_positions(switched: str) -> None:
    """lerobot_train builds EpisodeAwareSampler from `meta.episodes` and `dataset.episodes` (policies with
    `drop_n_last_frames`): over a mixture it shuffles the epoch's positions, dropping that many at its end."""
    from lerobot.datasets.sampler import EpisodeAwareSampler

    dataset = lerobot_dataset.LeRobotDataset(f"[{ARM6},{ARM9}]")
    sampler = EpisodeAwareSampler(
        dataset.meta.episodes["dataset_from_index"],
        dataset.meta.episodes["dataset_to_index"],
        episode_indices_to_use=dataset.episodes,
        drop_n_last_frames=7,
        shuffle=True,
    )
    assert sorted(sampler) == list(range(len(dataset) - 7))


def test_make_dataset_makes_a_mixture_as_lerobot_makes_one_dataset(switched: str) -> None:
    """Windows from the policy's delta indices at the metadata's fps, ImageNet statistics for every camera."""
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import IMAGENET_STATS, make_dataset
    from lerobot.policies.act.configuration_act import ACTConfig

    policy = ACTConfig(chunk_size=5, n_action_steps=5, device="cpu")
    config = TrainPipelineConfig(dataset=DatasetConfig(repo_id=f"['{PICK}', '{FOLD}']"), policy=policy)
    dataset = make_dataset(config)
    assert isinstance(dataset, RemoteLeRobotMixture)
    assert dataset.delta_timestamps == {"action": [i / 30 for i in range(5)]}
    assert dataset[0]["action"].shape == (5, 9)
    for key in (IMAGE, TOP, WRIST):
        assert torch.equal(dataset.meta.stats[key]["std"], torch.tensor(IMAGENET_STATS["std"], dtype=torch.float32))
    picked = TrainPipelineConfig(dataset=DatasetConfig(repo_id=f"[{PICK},{FOLD}]", episodes=[1]), policy=policy)
    with pytest.raises(ValueError, match="mixture document"):
        make_dataset(picked)


def test_lerobot_dataset_metadata_of_a_mixture_repo_id_is_the_mixtures_metadata(switched: str) -> None:
    from episerve.lerobot import RemoteLeRobotMixtureMetadata

    meta = lerobot_dataset.LeRobotDatasetMetadata("mixture:cross")
    assert isinstance(meta, RemoteLeRobotMixtureMetadata) and meta.repo_id == "mixture:cross"
    own = RemoteLeRobotDataset(switched, "mixture:cross").meta
    assert meta.total_frames == own.total_frames and meta.features == own.features and meta.fps == own.fps
    listed = lerobot_dataset.LeRobotDatasetMetadata(repo_id=f"[{ARM6},{ARM9}]")
    assert [component.repo_id for component in listed.components] == [ARM6, ARM9]
    assert lerobot_dataset.LeRobotDatasetMetadata(ARM6).repo_id == ARM6  # one dataset: its own metadata


def test_a_list_of_repo_ids_given_from_python_passes_lerobots_validation_as_a_mixture(switched: str) -> None:
    """`lerobot_train.train(cfg)` validates `cfg` first; LeRobot 0.4.4 refuses a list of repo ids there."""
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_dataset
    from lerobot.policies.act.configuration_act import ACTConfig

    policy = ACTConfig(chunk_size=5, n_action_steps=5, device="cpu", push_to_hub=False)
    config = TrainPipelineConfig(dataset=DatasetConfig(repo_id=[PICK, FOLD]), policy=policy)
    config.validate()
    assert config.dataset.repo_id == f"[{PICK},{FOLD}]"
    dataset = make_dataset(config)
    assert isinstance(dataset, RemoteLeRobotMixture) and dataset.repo_ids == [PICK, FOLD]
    assert dataset[0]["action"].shape == (5, 9)

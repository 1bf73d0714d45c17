"""LeRobot's own training script, unchanged, through the one switch (`episerve.lerobot.use_server`, and `python -m
episerve.lerobot.train`), against a real server.

LeRobot 0.4.4 (installed by `make venv`, see tests/lerobot_env/) runs `lerobot_train` for a few steps of a tiny ACT
and a tiny diffusion policy (whose `drop_n_last_frames` makes the script build `EpisodeAwareSampler` from
`meta.episodes`): over a parquet-image dataset, the per-step losses and gradient norms equal those of the same run
on LeRobot's own `LeRobotDataset` over the same files, and so does the first batch. Over a two-camera AV1 dataset
(which LeRobot cannot decode on a CPU-only torch here) and a v2.1 dataset (which LeRobot 0.4.4 refuses) the losses
are finite and the first batch equals `RemoteLeRobotDataset`'s samples. The metadata has LeRobot's shapes, the
served classes LeRobot's signatures, and what the switch does not serve is a clear error.
"""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from app.demo import IMAGE, write_demo_dataset
from episerve.lerobot import RemoteLeRobotDataset
from episerve.lerobot.train import split_arguments
from tests.client.helpers import LeRobotTrainer
from tests.support import ServerProcess

lerobot_dataset = pytest.importorskip("lerobot.datasets.lerobot_dataset", reason="LeRobot is installed by make venv")
LeRobotDataset = lerobot_dataset.LeRobotDataset  # as `from lerobot... import LeRobotDataset` before the switch

TINY_ACT = [
    "--policy.type=act",
    "--policy.pretrained_backbone_weights=null",  # no download: a randomly initialised ResNet-18
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.latent_dim=8",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
]
TINY_DIFFUSION = [
    "--policy.type=diffusion",
    "--policy.pretrained_backbone_weights=null",
    "--policy.crop_shape=null",
    "--policy.down_dims=[16,32]",
    "--policy.diffusion_step_embed_dim=16",
    "--policy.n_groups=4",
    "--policy.kernel_size=3",
    "--policy.horizon=8",
    "--policy.n_action_steps=4",
    "--policy.n_obs_steps=2",
    "--policy.spatial_softmax_num_keypoints=8",
]
STEPS = 3


@pytest.fixture(scope="module")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Parquet-image datasets (32x32 PNGs, no videos), which LeRobot itself can read here: v3.0 and v2.1."""
    root = tmp_path_factory.mktemp("lerobot-images")
    write_demo_dataset(root / "img-v3", format="v3.0", episodes=8, seed=7, cameras={}, image_size=32, files=2)
    write_demo_dataset(root / "img-v21", format="v2.1", episodes=8, seed=8, cameras={}, image_size=32)
    return root


@pytest.fixture(scope="module")
def train_server(
    image_root: Path, video_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with ServerProcess([image_root, video_root], tmp_path_factory.mktemp("lerobot-train-cache")) as running:
        yield running


def _common(repo_id: str, tmp: Path, name: str, workers: int = 0) -> list[str]:
    return [
        f"--dataset.repo_id={repo_id}",
        "--policy.device=cpu",
        "--policy.push_to_hub=false",
        "--batch_size=4",
        f"--steps={STEPS}",
        f"--num_workers={workers}",
        "--log_freq=1",
        "--save_checkpoint=false",
        "--seed=1",
        f"--output_dir={tmp / name}",
    ]


def _run_both(
    trainer: LeRobotTrainer, url: str, image_root: Path, tmp_path: Path, policy: list[str], workers: int
) -> list[dict[str, Any]]:
    """The same training run on LeRobot's `LeRobotDataset` over the files and through the switch, concurrently."""
    return trainer.train(
        (
            "lerobot",
            [*_common("img-v3", tmp_path, "out-lerobot", workers), f"--dataset.root={image_root / 'img-v3'}", *policy],
        ),
        ("episerve", ["--episerve-url", url, *_common("img-v3", tmp_path, "out-episerve", workers), *policy]),
    )


def _assert_same_batch(actual: dict[str, Any], expected: dict[str, Any], root: Path) -> None:
    """Every key of LeRobot's batch equal in dtype, shape and value, but `task`: the demo writes meta/tasks.parquet
    with a plain `task` column, which LeRobot 0.4.4 reads as a column, so it gives the row number as the task (a
    tensor once collated); the switch gives the task string, as LeRobot does for files it wrote itself."""
    assert set(actual) == set(expected)
    for key, value in expected.items():
        if key != "task":
            assert actual[key].dtype == value.dtype, key
            assert torch.equal(actual[key], value), key
    tasks = {row["task_index"]: row["task"] for row in pq.read_table(root / "meta/tasks.parquet").to_pylist()}
    assert actual["task"] == [tasks[int(i)] for i in actual["task_index"]]


def test_act_trains_with_lerobots_losses(
    lerobot_trainer: LeRobotTrainer, train_server: ServerProcess, image_root: Path, tmp_path: Path
) -> None:
    """A tiny ACT, 2 DataLoader workers: the same losses, gradient norms and first batch as on LeRobotDataset."""
    lerobot, served = _run_both(lerobot_trainer, train_server.url, image_root, tmp_path, TINY_ACT, workers=2)
    assert (lerobot["dataset_class"], served["dataset_class"]) == ("LeRobotDataset", "ServedLeRobotDataset")
    assert len(served["losses"]) == STEPS
    assert served["losses"] == lerobot["losses"]
    assert served["grad_norms"] == lerobot["grad_norms"]
    _assert_same_batch(served["first_batch"], lerobot["first_batch"], image_root / "img-v3")


def test_diffusion_with_episode_aware_sampler(
    lerobot_trainer: LeRobotTrainer, train_server: ServerProcess, image_root: Path, tmp_path: Path
) -> None:
    """A tiny diffusion policy: lerobot_train builds EpisodeAwareSampler from `meta.episodes["dataset_from_index"]`
    and `["dataset_to_index"]` (dropping each episode's last frames); the same losses as on LeRobotDataset."""
    lerobot, served = _run_both(lerobot_trainer, train_server.url, image_root, tmp_path, TINY_DIFFUSION, workers=0)
    assert served["sampler"] == lerobot["sampler"] == "EpisodeAwareSampler"
    assert served["losses"] == lerobot["losses"]
    assert served["grad_norms"] == lerobot["grad_norms"]
    _assert_same_batch(served["first_batch"], lerobot["first_batch"], image_root / "img-v3")


@pytest.mark.parametrize(
    ("repo_id", "policy"),
    [("cams-v3", TINY_ACT), ("img-v21", TINY_DIFFUSION)],
    ids=["two-camera-av1-v3.0", "v2.1"],
)
def test_where_lerobot_cannot_go(
    lerobot_trainer: LeRobotTrainer, train_server: ServerProcess, tmp_path: Path, repo_id: str, policy: list[str]
) -> None:
    """A two-camera AV1 dataset (LeRobot cannot decode it on a CPU-only torch here) and a v2.1 dataset (LeRobot
    0.4.4 refuses it) train through the switch: finite losses, and the first batch is RemoteLeRobotDataset's."""
    (record,) = lerobot_trainer.train(
        ("episerve", ["--episerve-url", train_server.url, *_common(repo_id, tmp_path, "out"), *policy])
    )
    assert len(record["losses"]) == STEPS and all(math.isfinite(loss) for loss in record["losses"])
    batch = record["first_batch"]
    dataset = RemoteLeRobotDataset(train_server.url, repo_id, delta_timestamps=record["delta_timestamps"])
    samples = [dataset[int(index)] for index in batch["index"]]
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, torch.stack([sample[key] for sample in samples])), key
        else:
            assert value == [sample[key] for sample in samples], key


# ----------------------------------------------------------------------------------------------------
# Metadata in LeRobot's shapes, LeRobot's signatures, and the switch itself (in this process)


@pytest.fixture
def switched(train_server: ServerProcess) -> Iterator[str]:
    from episerve.lerobot import _switch

    _switch.use_server(train_server.url)
    try:
        yield train_server.url
    finally:
        _switch._restore_lerobot()


def test_metadata_has_lerobots_shapes(train_server: ServerProcess, image_root: Path) -> None:
    """`meta` through the switch equals LeRobot's own `LeRobotDatasetMetadata` over the same files: info, features
    (tuple shapes), fps, robot_type, totals, stats (numpy, same dtypes and values), episodes by column and by
    episode; tasks a DataFrame indexed by task."""
    from episerve.lerobot._switch import ServedLeRobotDatasetMetadata, use_server

    own = lerobot_dataset.LeRobotDatasetMetadata("img-v3", root=image_root / "img-v3")
    use_server(train_server.url)
    try:
        served = ServedLeRobotDatasetMetadata("img-v3", root="/nowhere", force_cache_sync=True)
    finally:
        from episerve.lerobot import _switch

        _switch._restore_lerobot()
    for field in ("fps", "robot_type", "total_episodes", "total_frames", "total_tasks", "chunks_size", "data_path"):
        assert getattr(served, field) == getattr(own, field), field
    assert served.features == own.features and served.shapes == own.shapes
    assert served.camera_keys == own.camera_keys == [IMAGE]
    assert served.info == own.info
    assert served.stats.keys() == own.stats.keys()
    for feature, stats in own.stats.items():
        for name, value in stats.items():
            assert served.stats[feature][name].dtype == value.dtype, (feature, name)
            np.testing.assert_array_equal(served.stats[feature][name], value)
    for column in ("episode_index", "length", "dataset_from_index", "dataset_to_index", "tasks"):
        assert served.episodes[column] == list(own.episodes[column]), column
    assert len(served.episodes) == len(own.episodes)
    row, own_row = served.episodes[3], own.episodes[3]
    assert {k: row[k] for k in row} == {k: own_row[k] for k in row}
    assert list(served.tasks["task_index"]) == list(range(served.total_tasks))
    assert [served.tasks.iloc[i].name for i in range(served.total_tasks)] == list(own.tasks["task"])
    assert served.get_task_index(own.tasks["task"][1]) == 1
    assert served.episodes.to_pandas()["length"].tolist() == list(own.episodes["length"])
    assert served.episodes[[1, 3]] == {k: [served.episodes[1][k], served.episodes[3][k]] for k in row}
    assert served.episodes[1:3]["length"] == list(own.episodes[1:3]["length"])


def test_served_classes_take_lerobots_signatures() -> None:
    from episerve.lerobot._switch import ServedLeRobotDataset, ServedLeRobotDatasetMetadata, ServedMultiLeRobotDataset

    for served, own in (
        (ServedLeRobotDataset, lerobot_dataset.LeRobotDataset),
        (ServedLeRobotDatasetMetadata, lerobot_dataset.LeRobotDatasetMetadata),
        (ServedMultiLeRobotDataset, lerobot_dataset.MultiLeRobotDataset),
    ):
        theirs = inspect.signature(own).parameters
        ours = inspect.signature(served).parameters
        assert [(p.name, p.default) for p in ours.values()] == [(p.name, p.default) for p in theirs.values()]


def test_switch_replaces_lerobots_classes(switched: str) -> None:
    """After use_server, LeRobot's modules hold the served classes; LeRobot's whole signature is accepted, the
    arguments meaningless on a server change nothing, and what cannot be honoured is a clear error."""
    import lerobot.datasets.factory as factory
    import lerobot.scripts.lerobot_train as lerobot_train

    from episerve.lerobot._switch import ServedLeRobotDataset, ServedLeRobotDatasetMetadata

    assert factory.LeRobotDataset is lerobot_dataset.LeRobotDataset is ServedLeRobotDataset
    assert LeRobotDataset is ServedLeRobotDataset  # the name imported into this module before the switch
    assert factory.LeRobotDatasetMetadata is ServedLeRobotDatasetMetadata
    assert lerobot_train.make_dataset is factory.make_dataset
    dataset = lerobot_dataset.LeRobotDataset(
        "img-v3",
        "/no/local/copy",
        [1, 3],
        None,
        {"action": [0.0, 1 / 30]},
        1e-4,
        "v3.0",
        True,
        False,
        "torchcodec",
        5,
        "h264",
        True,
        10,
        2,
    )
    plain = RemoteLeRobotDataset(switched, "img-v3", episodes=[1, 3], delta_timestamps={"action": [0.0, 1 / 30]})
    assert len(dataset) == len(plain) == dataset.num_frames
    assert torch.equal(dataset[5]["action"], plain[5]["action"])
    assert dataset.root == Path("/no/local/copy") and dataset.revision == "v3.0"
    with pytest.raises(ValueError, match="revision='main' cannot be honoured"):
        lerobot_dataset.LeRobotDataset("img-v3", revision="main")
    with pytest.raises(ValueError, match="Unsupported video backend"):
        lerobot_dataset.LeRobotDataset("img-v3", video_backend="opencv")


def test_make_dataset_refuses_streaming_clearly(switched: str) -> None:
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_dataset

    config = TrainPipelineConfig(dataset=DatasetConfig(repo_id="img-v3", streaming=True))
    with pytest.raises(NotImplementedError, match="streaming"):
        make_dataset(config)


def _worker_sees_switch(worker_id: int) -> None:
    from lerobot.datasets import factory

    assert factory.LeRobotDataset.__name__ == "ServedLeRobotDataset", "the spawned worker is not switched"


def test_spawned_workers_are_switched(switched: str) -> None:
    """A spawned DataLoader worker (no inherited memory) finds the switch again from the environment."""
    dataset = lerobot_dataset.LeRobotDataset("img-v3", episodes=[2])
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=1,
        multiprocessing_context="spawn",
        worker_init_fn=_worker_sees_switch,
    )
    first = next(iter(loader))
    expected = RemoteLeRobotDataset(switched, "img-v3", episodes=[2])
    assert torch.equal(first["observation.state"], torch.stack([expected[i]["observation.state"] for i in range(4)]))


def test_train_command_arguments() -> None:
    ours, rest = split_arguments(["--episerve-url", "http://h:1", "--steps=3", "--episerve-token=t", "--x", "y"])
    assert ours == {"url": "http://h:1", "token": "t"} and rest == ["--steps=3", "--x", "y"]
    env = {k: v for k, v in os.environ.items() if k != "EPISERVE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "episerve.lerobot.train", "--steps=1"], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and "--episerve-url URL or set EPISERVE_URL" in done.stderr

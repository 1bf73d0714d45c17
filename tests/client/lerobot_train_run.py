"""Runs LeRobot's own `lerobot_train` and records what it did, for tests/client/test_lerobot_train.py and
tests/client/test_lerobot_train_mixtures.py.

    python -m tests.client.lerobot_train_run

imports LeRobot's training script once (torch, LeRobot and their dependencies: most of a run's start-up) and builds
its command-line parser once (see `_remember_help_texts`), then reads requests from its standard input, one JSON
line each: a list of runs, each `{"record": RECORD.pt, "log": LOG, "mode": MODE, "arguments": [...]}`. Every run of
a request is forked from this process at once, so it starts from the state the imports left and shares nothing with
another run; when all have ended, the line of answer on standard output is the list of their exit statuses. A run
writes its output into LOG and, when training ends, RECORD.pt (`torch.save`).

MODE `lerobot` runs `lerobot.scripts.lerobot_train.main()` as is; `episerve` runs `python -m episerve.lerobot.train`'s
`main()` (its arguments begin with `--episerve-url URL`). Either way the training script is LeRobot's, unchanged:
this only wraps two of its module functions to watch it, `update_policy` (each step's loss and gradient norm) and
`cycle` (every batch the DataLoader gave, the first as `first_batch`, and the dataset's class and windows).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from typing import Any

import torch
from lerobot.scripts import lerobot_train

record: dict[str, Any] = {"losses": [], "grad_norms": []}


def _watch_update_policy(original: Any) -> Any:
    def update_policy(*args: Any, **kwargs: Any) -> Any:
        metrics, output = original(*args, **kwargs)
        record["losses"].append(float(metrics.loss.val))
        record["grad_norms"].append(float(metrics.grad_norm.val))
        return metrics, output

    return update_policy


def _watch_cycle(original: Any) -> Any:
    def cycle(dataloader: Any) -> Any:
        dataset = getattr(dataloader, "dataset", None)
        record["dataset_class"] = type(dataset).__name__
        record["delta_timestamps"] = getattr(dataset, "delta_timestamps", None)
        record["sampler"] = _sampler_name(dataloader)
        record["batches"] = []
        for batch in original(dataloader):
            record["batches"].append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
            record["first_batch"] = record["batches"][0]
            yield batch

    return cycle


def _sampler_name(loader: Any) -> str:
    """The class name of the sampler under accelerate's wrappers (`base_dataloader`, `batch_sampler`, ...)."""
    seen: list[Any] = [loader]
    while seen:
        node = seen.pop()
        sampler = getattr(node, "sampler", None)
        if sampler is not None and type(sampler).__name__ not in ("SequentialSampler", "RandomSampler"):
            return type(sampler).__name__
        seen += [getattr(node, name) for name in ("base_dataloader", "batch_sampler") if hasattr(node, name)]
    return type(getattr(loader, "sampler", None)).__name__


def train(out: str, mode: str, arguments: list[str]) -> None:
    """One training run in this process, watched; what it did is saved to `out`."""
    lerobot_train.update_policy = _watch_update_policy(lerobot_train.update_policy)
    lerobot_train.cycle = _watch_cycle(lerobot_train.cycle)
    sys.argv = [sys.argv[0], *arguments]
    if mode == "episerve":
        from episerve.lerobot.train import main as train_main
    else:
        train_main = lerobot_train.main
    train_main()
    torch.save(record, out)


def _run_forked(run: dict[str, Any]) -> int:
    """Fork a process for `run` (its output into the run's log); return its pid."""
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        train(run["record"], run["mode"], run["arguments"])
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _remember_help_texts() -> None:
    """draccus, LeRobot's command-line parser, reads the source of every config class of every choice (policies,
    environments, robots...) for its help texts each time it builds a parser: most of the CPU of a tiny run. Its
    lookup of a field's help text, a function of the source alone, is remembered here, and filled by building the
    training script's parser once before any run is forked."""
    from draccus.argparsing import ArgumentParser
    from draccus.wrappers import docstring
    from lerobot.configs.train import TrainPipelineConfig

    docstring.get_attribute_docstring = functools.cache(docstring.get_attribute_docstring)
    ArgumentParser(config_class=TrainPipelineConfig)


def main() -> None:
    _remember_help_texts()
    for line in sys.stdin:
        pids = [_run_forked(run) for run in json.loads(line)]
        statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    main()

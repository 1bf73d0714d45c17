"""Several datasets where LeRobot takes one `repo_id`: the forms of a mixture the LeRobot drop-in accepts.

- an `episerve.Mixture` (Python only);
- a list of dataset ids, `["a", "b"]`, or its text as `lerobot-train --dataset.repo_id='[a,b]'` hands it over
  (LeRobot 0.4.4's parser makes the list the text `"['a', 'b']"`): a mixture of those datasets weighted by their
  rows (their episode picks' rows), so that an epoch holds every row once, as `MultiLeRobotDataset`
  concatenated them (exactly so when the datasets have at most 65,536 rows together; beyond, the shares are
  rounded to 1/65,536 and a row may come once more or once less in an epoch);
- `"mixture:NAME"`: the server's named mixture `NAME` (weights, episode picks and feature maps as its document
  says), or `"mixture:PATH"` with PATH ending in `.json`, `.yaml` or `.yml`: a mixture document on this machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from episerve._client import Client
from episerve._mixture import Mixture
from episerve._selection import Selection

MIXTURE_PREFIX = "mixture:"
DOCUMENT_SUFFIXES = (".json", ".yaml", ".yml")


def is_mixture_repo(repo_id: Any) -> bool:
    """Whether `repo_id` names several datasets (any form above) rather than one dataset id."""
    if isinstance(repo_id, Mixture | list | tuple):
        return True
    return isinstance(repo_id, str) and (repo_id.startswith(MIXTURE_PREFIX) or _is_list_text(repo_id))


def lerobot_mixture(
    client: Client, repo_id: Any, episodes: Mapping[str, Any] | None = None
) -> tuple[Mixture, str, list[str]]:
    """The mixture `repo_id` names, the repo id to report for it and its dataset ids.

    `episodes` may pick episodes per dataset id for the list form, as `MultiLeRobotDataset`'s `{repo_id:
    [episode ids]}` does; a mixture document picks its own (`episodes` must then be None)."""
    if isinstance(repo_id, str) and repo_id.startswith(MIXTURE_PREFIX):
        mixture = _document(client, repo_id.removeprefix(MIXTURE_PREFIX))
        label = repo_id
    elif isinstance(repo_id, Mixture):
        mixture, label = repo_id, f"{MIXTURE_PREFIX}{repo_id.version}"
    else:
        ids = dataset_ids(repo_id)
        return _by_rows(client, ids, episodes), "[" + ",".join(ids) + "]", ids
    if episodes is not None:
        raise ValueError(
            f"{label} is a mixture document, which picks the episodes of each component itself "
            "(its components' `episodes`); pass episodes=None"
        )
    return mixture, label, [component.dataset for component in mixture.components]


def dataset_ids(repo_id: Sequence[str] | str) -> list[str]:
    """The dataset ids of a list, or of its text (`[a,b]`, `['a', 'b']`, `["a", "b"]`)."""
    if isinstance(repo_id, str):
        inner = repo_id.strip()[1:-1]
        ids = [part.strip().strip("'\"").strip() for part in inner.split(",")] if inner.strip() else []
    else:
        ids = [str(part) for part in repo_id]
    if not ids or not all(ids):
        raise ValueError(f"a list of dataset ids needs at least one id and no empty ones, got {repo_id!r}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"a dataset is named twice in {repo_id!r}; give a mixture document weights instead")
    return ids


def _by_rows(client: Client, ids: list[str], episodes: Mapping[str, Any] | None) -> Mixture:
    if episodes is not None and not isinstance(episodes, Mapping):
        raise ValueError(
            f"the episodes of several datasets are picked per dataset: {{repo_id: [episode ids]}}, got {episodes!r}"
        )
    picks = dict(episodes or {})
    unknown = sorted(set(picks) - set(ids))
    if unknown:
        raise ValueError(f"episodes names datasets that are not in the list: {unknown}")
    components = []
    for dataset in ids:
        rows = client.count(Selection.of(dataset, picks.get(dataset)))
        if rows == 0:
            raise ValueError(f"dataset {dataset!r} has no rows in its episode pick")
        components.append({"dataset": dataset, "weight": rows, "episodes": picks.get(dataset)})
    return Mixture(components)


def _document(client: Client, name: str) -> Mixture:
    """A local mixture document (a path ending in .json, .yaml or .yml), else the server's named mixture."""
    if name.lower().endswith(DOCUMENT_SUFFIXES):
        path = Path(name).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"no mixture document {name!r} (a path ending in {', '.join(DOCUMENT_SUFFIXES)})")
        return Mixture.from_file(path)
    return Mixture.named(client, name)


def _is_list_text(text: str) -> bool:
    stripped = text.strip()
    return stripped.startswith("[") and stripped.endswith("]")

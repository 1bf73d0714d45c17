"""Named mixtures: documents in the configured mixtures directory, each many datasets read as one.

A mixture `<id>` is the file `<id>.json` (or `<id>.yaml`/`.yml` where PyYAML is installed) below
`EPISERVE_MIXTURES_DIR`: `{"components": [{"dataset", "weight", "episodes", "features"}, ...], "image_size": ...}`
(`image_size` optional: `[h, w]` or `{camera: [h, w]}`), the document the client's `episerve.Mixture` reads.
Files are read on every request (they are small), so an edited mixture is seen at once; ids follow the dataset id
rules (`name` or `group/name`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from app.errors import DoesNotExist, TryLater
from app.store.catalog import validate_dataset_id

SUFFIXES = (".json", ".yaml", ".yml")
Side = Annotated[StrictInt, Field(ge=1)]
Size = tuple[Side, Side]


class ComponentDocument(BaseModel):
    """One dataset of a mixture: its id, weight, episode pick and feature map (its key -> the mixture's)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    episodes: str | None = None
    features: dict[str, str] = Field(default_factory=dict)


class MixtureDocument(BaseModel):
    """A mixture: one or more components, and optionally the size its cameras come at (`[h, w]` for every
    camera, or per camera by the mixture's names)."""

    model_config = ConfigDict(extra="forbid")

    components: list[ComponentDocument] = Field(min_length=1)
    image_size: Size | dict[str, Size] | None = None


def mixture_ids(directory: Path | None) -> list[str]:
    """The ids of the mixtures in `directory` (none when it is not configured), sorted."""
    if directory is None or not directory.is_dir():
        return []
    found = {
        path.relative_to(directory).with_suffix("").as_posix()
        for path in directory.rglob("*")
        if path.suffix in SUFFIXES and path.is_file() and not path.name.startswith(".")
    }
    return sorted(found)


def load_mixture(directory: Path | None, mixture_id: str) -> MixtureDocument:
    """The document of mixture `mixture_id`; 404 when there is none, 503 naming the file when it is invalid."""
    validate_dataset_id(mixture_id)
    path = _path(directory, mixture_id)
    if path is None:
        raise DoesNotExist(f"no mixture {mixture_id!r}")
    try:
        return MixtureDocument.model_validate(_parse(path))
    except (ValueError, ValidationError) as exc:
        raise TryLater(f"the mixture file {path.name!r} of {mixture_id!r} is invalid: {exc}") from exc


def _path(directory: Path | None, mixture_id: str) -> Path | None:
    if directory is None:
        return None
    for suffix in SUFFIXES:
        path = directory / f"{mixture_id}{suffix}"
        if path.is_file():
            return path
    return None


def _parse(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    try:
        import yaml
    except ImportError as exc:
        raise ValueError("YAML mixtures need PyYAML installed on the server; write it as JSON") from exc
    return yaml.safe_load(text)

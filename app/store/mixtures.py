"""Named mixtures: documents in the configured mixtures directory, each many datasets read as one.

A mixture `<id>` is the file `<id>.json` (or `<id>.yaml`/`.yml` where PyYAML is installed) below
`EPISERVE_MIXTURES_DIR`: `{"components": [{"dataset", "weight", "episodes", "features"}, ...], "image_size": ...}`
(`image_size` optional: `[h, w]` or `{camera: [h, w]}`), the document the client's `episerve.Mixture` reads.
Files are read on every request (they are small), so an edited mixture is seen at once; ids follow the dataset id
rules (`name` or `group/name`).

The directory may be writable by others than the operator, so a document is read as hostile input: only regular
files inside the directory (no symlink out of it), at most `MAX_DOCUMENT_BYTES`, YAML without aliases (an alias bomb
expands a few lines into gigabytes), nesting bounded, and no problem ever quotes the document's content.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from app.errors import DatasetError, DoesNotExist, ProblemError
from app.store.catalog import validate_dataset_id

SUFFIXES = (".json", ".yaml", ".yml")
MAX_DOCUMENT_BYTES = 1024 * 1024  # a mixture of thousands of components is ~100 KB
MAX_WEIGHT_RATIO = 1e9  # largest ÷ smallest weight: beyond it a share rounds away, or the sum is not finite
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

    @model_validator(mode="after")
    def _weights_in_proportion(self) -> MixtureDocument:
        weights = [component.weight for component in self.components]
        total = sum(weights)  # inf past the float range (math.fsum would raise)
        if not math.isfinite(total) or max(weights) > MAX_WEIGHT_RATIO * min(weights):
            raise ValueError(
                f"weights range from {min(weights):g} to {max(weights):g}; the largest may be at most "
                f"{MAX_WEIGHT_RATIO:g} times the smallest, and their sum must be finite"
            )
        return self


def mixture_ids(directory: Path | None) -> list[str]:
    """The ids of the mixtures in `directory` (none when it is not configured), sorted: regular files inside it."""
    if directory is None or not directory.is_dir():
        return []
    found = {
        path.relative_to(directory).with_suffix("").as_posix()
        for path in directory.rglob("*")
        if path.suffix in SUFFIXES and not path.name.startswith(".") and _inside(directory, path)
    }
    return sorted(found)


class InvalidMixture(DatasetError):
    """A mixture file that does not parse or validate: a 503 until the operator fixes the file, not retried."""

    title = "Mixture unavailable"


def load_mixture(directory: Path | None, mixture_id: str) -> MixtureDocument:
    """The document of mixture `mixture_id`; 404 when there is none, 503 naming the file when it is invalid (the
    problem says where and what, never the content)."""
    validate_dataset_id(mixture_id)
    path = _path(directory, mixture_id)
    if path is None:
        raise DoesNotExist(f"no mixture {mixture_id!r}")
    try:
        return MixtureDocument.model_validate(_parse(path))
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors())
        raise InvalidMixture(f"the mixture file {path.name!r} of {mixture_id!r} is invalid: {detail}") from None
    except ValueError as exc:
        raise InvalidMixture(f"the mixture file {path.name!r} of {mixture_id!r} is invalid: {exc}") from None


def mixture_status(directory: Path | None, mixture_id: str) -> tuple[MixtureDocument | None, str]:
    """A mixture's document and `valid`, or None and the problem of that one document."""
    try:
        return load_mixture(directory, mixture_id), "valid"
    except ProblemError as exc:
        return None, exc.detail


def _inside(directory: Path, path: Path) -> bool:
    """Whether `path` is a regular file that lies inside `directory` once every symlink is followed."""
    try:
        return path.is_file() and path.resolve().is_relative_to(directory.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def _path(directory: Path | None, mixture_id: str) -> Path | None:
    if directory is None:
        return None
    for suffix in SUFFIXES:
        path = directory / f"{mixture_id}{suffix}"
        if _inside(directory, path):
            return path
    return None


def _parse(path: Path) -> Any:
    """The document in `path`, within the limits (ValueError saying which, never quoting the content)."""
    with open(path, "rb") as handle:
        raw = handle.read(MAX_DOCUMENT_BYTES + 1)
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"it is larger than {MAX_DOCUMENT_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"it is not UTF-8 text (byte {exc.start})") from None
    try:
        if path.suffix == ".json":
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        return _parse_yaml(text)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None


def _parse_yaml(text: str) -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise ValueError("YAML mixtures need PyYAML installed on the server; write it as JSON") from exc

    class NoAliases(yaml.SafeLoader):
        """PyYAML's safe loader, refusing aliases: a mixture never needs them, and they are how a document of a
        few lines expands into gigabytes."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise ValueError(f"YAML aliases are not allowed (line {mark.line + 1}, column {mark.column + 1})")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=NoAliases)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"YAML syntax error{where}: {exc.problem}") from None
    except yaml.YAMLError:
        raise ValueError("YAML syntax error") from None

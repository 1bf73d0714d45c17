"""`Mixture`: many datasets, each with a weight, read as one — a small document of components.

A mixture is data, not code: each component names a dataset, optionally an episode pick, a weight, and a feature
map renaming the component's keys to the mixture's (`{"observation.images.cam_high": "observation.images.top"}`);
the mixture may state the size its cameras come at (`image_size`).
It is written in Python or loaded from a JSON or YAML file (YAML needs PyYAML: `pip install 'episerve[yaml]'`).
Its `version` is a digest of the components; resolved against a server (`episerve.ResolvedMixture`), the digest
also covers each dataset's version, so it changes whenever any component's data changes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from episerve._documents import read_document
from episerve._episodes import episode_spec
from episerve._errors import EpiserveError
from episerve._selection import ImageSize, Size, parse_image_size

_FIELDS = {"dataset", "weight", "episodes", "features"}
MAX_WEIGHT_RATIO = 1e9  # largest ÷ smallest weight: beyond it a share rounds away, or the sum is no longer finite


def check_weight_ratio(weights: Sequence[float]) -> None:
    """ValueError when the weights' shares cannot be told apart reliably (largest ÷ smallest > MAX_WEIGHT_RATIO) or
    their sum is not finite."""
    total = sum(float(w) for w in weights)  # inf past the float range (math.fsum would raise)
    if not math.isfinite(total) or max(weights) > MAX_WEIGHT_RATIO * min(weights):
        raise ValueError(
            f"mixture weights range from {min(weights):g} to {max(weights):g}; the largest may be at most "
            f"{MAX_WEIGHT_RATIO:g} times the smallest, and their sum must be finite"
        )


class MixtureError(EpiserveError, ValueError):
    """A mixture that cannot be read as one dataset (features that do not align, a bad document), raised when
    it is defined, never mid-epoch; the message names the components concerned."""


@dataclass(frozen=True)
class Component:
    """One dataset of a mixture: its id, weight (any positive number; shares are weights over their sum), episode
    pick (a spec like `"0-49"`, ids, or None for all) and feature map (component key -> mixture key)."""

    dataset: str
    weight: float = 1.0
    episodes: str | None = None
    features: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or not self.dataset:
            raise ValueError(f"a component's dataset is a dataset id, got {self.dataset!r}")
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"the weight of component {self.dataset!r} must be a positive number, got {weight!r}")
        object.__setattr__(self, "weight", int(weight) if float(weight).is_integer() else float(weight))  # 2 == 2.0
        object.__setattr__(self, "episodes", episode_spec(self.episodes))
        features = dict(self.features)
        for source, target in features.items():
            if not isinstance(source, str) or not isinstance(target, str) or not source or not target:
                raise ValueError(f"the feature map of {self.dataset!r} maps names to names, got {source!r}: {target!r}")
        targets = list(features.values())
        if len(set(targets)) != len(targets):
            raise ValueError(f"the feature map of {self.dataset!r} maps two keys to one name: {features}")
        object.__setattr__(self, "features", features)

    @classmethod
    def of(cls, value: Component | Mapping[str, Any] | str) -> Component:
        """A component from itself, a dataset id (weight 1), or a dict with `dataset`, `weight`, `episodes`,
        `features`."""
        if isinstance(value, Component):
            return value
        if isinstance(value, str):
            return cls(value)
        if not isinstance(value, Mapping):
            raise TypeError(f"a component is a dataset id, a dict or a Component, got {value!r}")
        unknown = set(value) - _FIELDS
        if unknown or "dataset" not in value:
            raise ValueError(
                f"a component has the fields {sorted(_FIELDS)} (dataset required); got {sorted(value)} in {value!r}"
            )
        return cls(value["dataset"], value.get("weight", 1.0), value.get("episodes"), value.get("features") or {})

    def name_of(self, key: str) -> str:
        """The mixture's name of this component's `key`."""
        return self.features.get(key, key)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dataset": self.dataset, "weight": self.weight}
        if self.episodes is not None:
            out["episodes"] = self.episodes
        if self.features:
            out["features"] = dict(self.features)
        return out


class Mixture:
    """Weighted datasets read as one dataset, accepted wherever a dataset id is.

    `components` are `Component`s, dataset ids (weight 1) or dicts (`{"dataset": ..., "weight": ..., "episodes":
    ..., "features": {component key: mixture key}}`). Samples of a mixture carry `dataset_index`, the component's
    position in this list. See `MixtureDataset` for the schema a mixture is read with (padding masks, missing
    cameras) and `MixturePlan` for the order its positions come in.

    Every camera of a mixture comes at one size: `image_size` — `(height, width)` for every camera, or
    `{camera: (height, width)}` by the mixture's camera names — or, for a camera it does not name, the smallest
    height and the smallest width among the sizes the components' datasets are served at. The server downscales
    each component's frames to it (area averaging); a size larger than a component serves is refused.
    """

    def __init__(
        self, components: Iterable[Component | Mapping[str, Any] | str], *, image_size: ImageSize | None = None
    ) -> None:
        self.components: tuple[Component, ...] = tuple(Component.of(c) for c in components)
        if not self.components:
            raise ValueError("a mixture needs at least one component")
        check_weight_ratio(self.weights)
        self.image_size: Size | dict[str, Size] | None = parse_image_size(image_size)

    @classmethod
    def from_dict(cls, document: Mapping[str, Any] | Sequence[Any]) -> Mixture:
        """A mixture from `{"components": [...], "image_size": ...}` (`image_size` optional) or the bare list of
        components."""
        size = None
        if isinstance(document, Mapping):
            unknown = set(document) - {"components", "image_size"}
            if unknown or "components" not in document:
                raise ValueError(
                    f"a mixture document has the fields components and image_size (optional); got {sorted(document)}"
                )
            size = document.get("image_size")
            document = document["components"]
        if isinstance(document, str | bytes) or not isinstance(document, Sequence):
            raise ValueError("a mixture's components are a list")
        return cls(document, image_size=size)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Mixture:
        """A mixture from a JSON file, or a YAML file (`.yaml`/`.yml`, needs PyYAML)."""
        try:
            document = read_document(Path(path))
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
            raise MixtureError(f"{Path(path).name} is not a valid mixture document: {exc}") from None
        return cls.from_dict(document)

    @classmethod
    def named(cls, client: Any, mixture_id: str) -> Mixture:
        """The server's named mixture `mixture_id` (`client` is an `episerve.Client`)."""
        described = client.mixture(mixture_id)
        fields = ("dataset", "weight", "episodes", "features")
        components = [{k: c[k] for k in fields if k in c} for c in described["components"]]
        return cls(components, image_size=described.get("image_size"))

    def to_dict(self) -> dict[str, Any]:
        """The document (`Mixture.from_dict(m.to_dict())` is `m` again); JSON- and YAML-serialisable."""
        document: dict[str, Any] = {"components": [component.to_dict() for component in self.components]}
        if isinstance(self.image_size, dict):
            document["image_size"] = {camera: list(size) for camera, size in self.image_size.items()}
        elif self.image_size is not None:
            document["image_size"] = list(self.image_size)
        return document

    def image_size_of(self, camera: str) -> Size | None:
        """The size the mixture states for `camera` (one of its names), if any."""
        if isinstance(self.image_size, dict):
            return self.image_size.get(camera)
        return self.image_size

    def to_file(self, path: str | os.PathLike[str]) -> None:
        """Write the document as JSON."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(component.weight for component in self.components)

    @property
    def version(self) -> str:
        """A digest of the document: the same components, weights, picks and maps give the same version."""
        return digest(self.to_dict())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mixture) and other.to_dict() == self.to_dict()

    def __hash__(self) -> int:
        return hash(self.version)

    def __repr__(self) -> str:
        parts = ", ".join(f"{c.dataset!r}: {c.weight:g}" for c in self.components)
        size = "" if self.image_size is None else f", image_size={self.image_size!r}"
        return f"Mixture({{{parts}}}{size})"


def digest(value: Any) -> str:
    """A short stable digest of a JSON-serialisable value."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

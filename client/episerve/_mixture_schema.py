"""One schema out of many: a mixture's components resolved against a server into the features it hands out.

Resolution happens once, when a mixture dataset is created, so features that cannot be aligned fail there,
never mid-epoch. Each component is asked for a zero-row slice of its selection (columns and windows mapped to its
own names; windows resolved by the server at the component's own fps), which gives exact Arrow types. Then, per
mixture feature:

- **vectors** (fixed-size lists of numbers, windows `(T, d)` included) of different widths are padded with zeros
  to the widest; a bool `<name>_is_real` of shape `(d,)` says which dimensions are the component's own (all False
  where a component lacks the feature). Value types and the leading dims (the window) must agree.
- **cameras** come at one size: the mixture's `image_size` for that camera, else the smallest height and the
  smallest width the components' datasets serve it at. A component served at another size asks the server for
  its frames at that size (`frame_size`: downscaled by area averaging, decoded on demand rather than read from
  the decoded-frame cache); a size larger than a component serves is refused. A camera a component lacks comes
  as zeros with a bool `<name>_is_missing`.
- **window flags** (`<name>_is_pad`) of a feature a component lacks are all True.
- anything else (scalars, strings, images) must exist in every component with the same type.

Every sample also carries `dataset_index` (int64), the component it comes from, as LeRobot names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import pyarrow as pa

from episerve._client import Client
from episerve._errors import ServerError
from episerve._mixture import Component, Mixture, MixtureError, digest
from episerve._selection import DeltaTimestamps, Selection, Size

DATASET_INDEX = "dataset_index"
MASK_SUFFIX = "_is_real"
MISSING_SUFFIX = "_is_missing"
PAD_SUFFIX = "_is_pad"

Kind = Literal["camera", "vector", "pad", "value"]


@dataclass(frozen=True)
class Feature:
    """One feature of the mixture: its kind, Arrow type (the widest, for vectors) and, per component, the name
    it has there (None where the component lacks it) and its width (vectors)."""

    name: str
    kind: Kind
    arrow_type: pa.DataType
    sources: tuple[str | None, ...]
    widths: tuple[int | None, ...] = ()
    mask: str | None = None  # `<name>_is_real`, for a padded vector
    flag: str | None = None  # `<name>_is_missing`, for a camera some component lacks

    @property
    def width(self) -> int | None:
        known = [w for w in self.widths if w is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class ComponentView:
    """What is read from one component: its selection (in its own names), view rows, fps and data version."""

    component: Component
    selection: Selection
    rows: int
    fps: float | None
    version: str | None


@dataclass(frozen=True)
class ResolvedMixture:
    """A mixture resolved against a server: its components' views and the features it hands out."""

    mixture: Mixture
    components: tuple[ComponentView, ...]
    features: tuple[Feature, ...]

    @property
    def version(self) -> str:
        """A digest of the document and every component's dataset version: it changes when any component's data
        does."""
        versions = [(view.component.dataset, view.version, view.rows) for view in self.components]
        return digest({"mixture": self.mixture.to_dict(), "datasets": versions})

    @property
    def names(self) -> list[str]:
        """The keys of every sample, in order."""
        names: list[str] = []
        for feature in self.features:
            names.append(feature.name)
            names += [extra for extra in (feature.mask, feature.flag) if extra is not None]
        return [*names, DATASET_INDEX]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(view.rows for view in self.components)


def resolve(
    client: Client,
    mixture: Mixture,
    columns: Sequence[str] | None = None,
    delta_timestamps: DeltaTimestamps | None = None,
    tolerance_s: float | None = None,
) -> ResolvedMixture:
    """Resolve `mixture` against the server of `client`: `columns` and `delta_timestamps` use the mixture's
    names. Raises `MixtureError` naming the components when features cannot be aligned."""
    windows = {name: [float(d) for d in deltas] for name, deltas in (delta_timestamps or {}).items()}
    views, schemas, cameras = [], [], set()
    for number, component in enumerate(mixture.components):
        view, schema, own_cameras = _component_view(client, number, component, columns, windows, tolerance_s)
        views.append(view)
        schemas.append(schema)
        cameras |= own_cameras
    if isinstance(mixture.image_size, Mapping):
        unknown = sorted(set(mixture.image_size) - cameras)
        if unknown:
            raise MixtureError(f"image_size names {unknown}, which no component has as a camera: {sorted(cameras)}")
    for number, size in _resizes(mixture, schemas).items():
        views[number], schemas[number] = _resized_view(client, number, views[number], size)
    if columns is not None:
        for name in columns:
            if not any(name in schema.names for schema in schemas):
                raise MixtureError(f"no component of the mixture has a feature {name!r}")
    for name in windows:
        if not any(name in schema.names for schema in schemas):
            raise MixtureError(f"delta_timestamps names {name!r}, which no component of the mixture has")
    features = _features(mixture, schemas)
    return ResolvedMixture(mixture, tuple(views), features)


def _component_view(
    client: Client,
    number: int,
    component: Component,
    columns: Sequence[str] | None,
    windows: dict[str, list[float]],
    tolerance_s: float | None,
) -> tuple[ComponentView, pa.Schema, set[str]]:
    """The component's selection, its schema in the mixture's names, and its cameras (the mixture's names)."""
    label = _label(number, component)
    try:
        info = client.info(component.dataset)
    except ServerError as exc:
        raise MixtureError(f"{label}: {exc.detail}") from exc
    available = [column["name"] for column in info.get("columns") or []]
    unknown = [key for key in component.features if key not in available]
    if unknown:
        raise MixtureError(f"{label}: its feature map renames {unknown}, which the dataset does not have")
    own = {component.name_of(key): key for key in available}  # mixture name -> the component's name
    wanted = None if columns is None else [own[name] for name in columns if name in own]
    if wanted == []:
        raise MixtureError(f"{label}: has none of the columns {list(columns or [])}")
    own_windows = {own[name]: deltas for name, deltas in windows.items() if name in own}
    selection = Selection(component.dataset, component.episodes, _tuple(wanted), own_windows or None, tolerance_s)
    rows, renamed = _schema(client, label, component, selection)
    view = ComponentView(component, selection, rows, info.get("fps"), info.get("version"))
    cameras = {component.name_of(column["name"]) for column in info.get("columns") or [] if column.get("video")}
    return view, renamed, cameras


def _schema(client: Client, label: str, component: Component, selection: Selection) -> tuple[int, pa.Schema]:
    """The rows of the selection's view and its schema in the mixture's names, from a zero-row slice (which also
    has the server check the selection)."""
    try:
        pages = client.read_slice(selection, 0, 0)
    except ServerError as exc:
        raise MixtureError(f"{label}: {exc.detail}") from exc
    windows = selection.delta_timestamps or {}
    fields = pages.table.schema
    return pages.total_rows, pa.schema([f.with_name(_mixture_name(component, f.name, windows)) for f in fields])


def _resizes(mixture: Mixture, schemas: list[pa.Schema]) -> dict[int, dict[str, Size]]:
    """Per component that serves a camera at another size than the mixture's, {its camera name: the mixture's
    size}. A camera's size is the mixture's `image_size` for it, else the smallest height and width it is served
    at; larger than a component serves it is a `MixtureError` (the server only downscales)."""
    resizes: dict[int, dict[str, Size]] = {}
    names = dict.fromkeys(name for schema in schemas for name in schema.names)
    for name in names:
        served = [(k, _frame_size(s.field(name).type)) for k, s in enumerate(schemas) if name in s.names]
        if any(size is None for _, size in served):
            continue  # not a camera everywhere: `_features` says what is wrong
        sizes = [(k, size) for k, size in served if size is not None]
        stated = mixture.image_size_of(name)
        target = stated or (min(h for _, (h, _) in sizes), min(w for _, (_, w) in sizes))
        larger = [(k, f"{h}x{w}") for k, (h, w) in sizes if target[0] > h or target[1] > w]
        if larger:
            raise MixtureError(
                f"camera {name!r} at image_size {target[0]}x{target[1]} would be enlarged: it is served at "
                f"{_listing(mixture, larger)}; a mixture only downscales (state a smaller image_size, or serve the "
                "camera larger with EPISERVE_VIDEO_CACHE_SIZE)"
            )
        for k, size in sizes:
            if size != target:
                own = _source(mixture.components[k], name, schemas[k])
                assert own is not None
                resizes.setdefault(k, {})[own] = target
    return resizes


def _frame_size(kind: pa.DataType) -> Size | None:
    """(height, width) of a camera column's frames (windowed or not); None for other columns."""
    if not isinstance(kind, pa.FixedShapeTensorType) or kind.value_type != pa.uint8():
        return None
    height, width = kind.shape[-3:-1]
    return int(height), int(width)


def _resized_view(
    client: Client, number: int, view: ComponentView, sizes: dict[str, Size]
) -> tuple[ComponentView, pa.Schema]:
    """The component's view with its cameras asked for at `sizes`, checked by the server."""
    selection = replace(view.selection, frame_size=sizes)
    _, schema = _schema(client, _label(number, view.component), view.component, selection)
    return replace(view, selection=selection), schema


def _mixture_name(component: Component, name: str, windows: Mapping[str, Any]) -> str:
    if name.endswith(PAD_SUFFIX) and name[: -len(PAD_SUFFIX)] in windows:
        return component.name_of(name[: -len(PAD_SUFFIX)]) + PAD_SUFFIX
    return component.name_of(name)


def _features(mixture: Mixture, schemas: list[pa.Schema]) -> tuple[Feature, ...]:
    order = list(dict.fromkeys(name for schema in schemas for name in schema.names))
    taken = set(order)
    features = []
    for name in order:
        types = [schema.field(name).type if name in schema.names else None for schema in schemas]
        sources = tuple(_source(c, name, s) for c, s in zip(mixture.components, schemas, strict=True))
        feature = _feature(mixture, name, types, sources)
        for extra in (feature.mask, feature.flag):
            if extra is not None and extra in taken:
                raise MixtureError(f"the mixture needs a feature {extra!r} for {name!r}, but a component has one")
        features.append(feature)
    if DATASET_INDEX in taken:
        raise MixtureError(f"a component has a feature {DATASET_INDEX!r}, which a mixture adds to every sample")
    return tuple(features)


def _source(component: Component, name: str, schema: pa.Schema) -> str | None:
    if name not in schema.names:
        return None
    reverse = {target: key for key, target in component.features.items()}
    if name.endswith(PAD_SUFFIX) and name[: -len(PAD_SUFFIX)] in reverse:
        return reverse[name[: -len(PAD_SUFFIX)]] + PAD_SUFFIX
    return reverse.get(name, name)


def _feature(mixture: Mixture, name: str, types: list[pa.DataType | None], sources: tuple[str | None, ...]) -> Feature:
    present = [(k, t) for k, t in enumerate(types) if t is not None]
    kinds = {_kind(name, t) for _, t in present}
    if len(kinds) > 1:
        raise MixtureError(f"feature {name!r} is {_listing(mixture, present)}: different kinds of data")
    [kind] = kinds
    missing = [k for k, t in enumerate(types) if t is None]
    if kind == "camera":
        if len({str(t) for _, t in present}) > 1:  # sizes are made one by `_resizes`: windows or channels differ
            shapes = [(k, "x".join(map(str, t.shape))) for k, t in present]
            raise MixtureError(f"camera {name!r} has different frame shapes: {_listing(mixture, shapes)}")
        flag = name + MISSING_SUFFIX if missing else None
        return Feature(name, kind, present[0][1], sources, flag=flag)
    if kind == "vector":
        shapes = [(k, vector_shape(t)) for k, t in present]
        leaves = {str(leaf) for _, (_, leaf) in shapes}
        if len(leaves) > 1:
            listing = _listing(mixture, [(k, str(leaf)) for k, (_, leaf) in shapes])
            raise MixtureError(f"feature {name!r} has different value types: {listing}")
        leading = {tuple(dims[:-1]) for _, (dims, _) in shapes}
        if len(leading) > 1:
            listing = _listing(mixture, [(k, "x".join(map(str, dims))) for k, (dims, _) in shapes])
            raise MixtureError(f"feature {name!r} has different ranks or windows: {listing}")
        widths = tuple(vector_shape(t)[0][-1] if t is not None else None for t in types)
        widest = max(present, key=lambda item: vector_shape(item[1])[0][-1])[1]
        padded = bool(missing) or len({w for w in widths if w is not None}) > 1
        return Feature(name, kind, widest, sources, widths, mask=name + MASK_SUFFIX if padded else None)
    if len({str(t) for _, t in present}) > 1:
        raise MixtureError(f"feature {name!r} has different types: {_listing(mixture, present)}")
    if missing and kind != "pad":
        lacking = ", ".join(_label(k, mixture.components[k]) for k in missing)
        raise MixtureError(
            f"feature {name!r} is missing from {lacking}; rename a feature of theirs to it, or leave it out of "
            "`columns`"
        )
    return Feature(name, kind, present[0][1], sources)


def _kind(name: str, kind: pa.DataType) -> Kind:
    if isinstance(kind, pa.FixedShapeTensorType) and kind.value_type == pa.uint8():
        return "camera"
    if name.endswith(PAD_SUFFIX) and pa.types.is_fixed_size_list(kind) and pa.types.is_boolean(kind.value_type):
        return "pad"
    if pa.types.is_fixed_size_list(kind):
        _, leaf = vector_shape(kind)
        if pa.types.is_integer(leaf) or pa.types.is_floating(leaf):
            return "vector"
    return "value"


def vector_shape(kind: pa.DataType) -> tuple[list[int], pa.DataType]:
    """The dims of nested fixed-size lists and the type of their values."""
    dims = []
    while pa.types.is_fixed_size_list(kind):
        dims.append(kind.list_size)
        kind = kind.value_type
    return dims, kind


def _label(number: int, component: Component) -> str:
    return f"component {number} ({component.dataset!r})"


def _listing(mixture: Mixture, items: Sequence[tuple[int, Any]]) -> str:
    return ", ".join(f"{value} in {_label(k, mixture.components[k])}" for k, value in items)


def _tuple(columns: list[str] | None) -> tuple[str, ...] | None:
    return None if columns is None else tuple(columns)

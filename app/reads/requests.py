"""What a row request asks for, defined once: the JSON bodies validate into these models, and a `GET /rows`
query is parsed into the same `SliceRequest`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, TypeAdapter, ValidationError

from app.errors import InvalidInput, OverLimit
from app.reads.episode_spec import EpisodeRanges, parse_episode_spec, ranges_from_ids
from app.reads.windows import DEFAULT_TOLERANCE_S, WindowRequest
from app.settings import Settings

MAX_ROW = 2**62
_MAX_INTEGER_CHARS = 20  # longer digit strings are out of range anyway; never hand them to int()

DeltaTimestamps = dict[str, list[StrictInt | StrictFloat]]
Compression = Literal["none", "lz4", "zstd"] | None
COMPRESSION_HELP = "Arrow IPC body compression (lz4 or zstd) for slow links; every Arrow reader decompresses it."
_DELTA_TIMESTAMPS = TypeAdapter(DeltaTimestamps)
EpisodeSelection = str | list[Annotated[StrictInt, Field(ge=0, le=MAX_ROW)]] | None
MAX_FRAME_SIDE = 65_535
FrameSide = Annotated[StrictInt, Field(ge=1, le=MAX_FRAME_SIDE)]
FrameSize = tuple[FrameSide, FrameSide]
FrameSizes = FrameSize | dict[str, FrameSize]
FRAME_SIZE_HELP = (
    "Camera frames at another (height, width) than they are served at: `[h, w]` for every camera of the answer, "
    "or `{camera: [h, w]}`; in a query `HxW` or that JSON object. Downscale only (no larger than the camera's "
    "served `shape`), by the area averaging the decoded-frame cache uses; frames at a size other than the served "
    "one are decoded on demand."
)
FRAMES_HELP = (
    "How camera columns come: `pixels` (uint8 (H, W, C) tensors, exact as the dataset's frame tier serves them) or "
    "`encoded` (one JPEG per frame in a binary column whose field metadata gives `episerve.encoding`, `shape` and "
    "`episerve.quality`, for the client to decode: the bytes as the JPEG tier keeps them, else encoded at quality "
    "95). Cameras with `delta_timestamps` windows come as pixels."
)
_FRAME_SIZES = TypeAdapter(dict[str, FrameSize])


class RowSelection(BaseModel):
    """What every row request selects: episodes, columns and optional temporal windows."""

    model_config = ConfigDict(extra="forbid")

    episodes: EpisodeSelection = Field(
        None, description="Episode spec ('0,3-5') or list of episode ids; absent means every episode."
    )
    columns: list[str] | None = Field(None, description="Columns to return, in this order; absent means all.")
    delta_timestamps: DeltaTimestamps | None = Field(
        None,
        description="LeRobot temporal windows: {column: [offset seconds, ...]}. Each windowed column becomes a "
        "fixed-size list of len(offsets) values, plus a boolean `<column>_is_pad` list.",
    )
    tolerance_s: float = Field(
        DEFAULT_TOLERANCE_S, ge=0, le=1e6, description="How far offsets may be off the 1/fps grid."
    )
    compression: Compression = Field(None, description=COMPRESSION_HELP)
    frame_size: FrameSizes | None = Field(None, description=FRAME_SIZE_HELP)
    frames: Literal["pixels", "encoded"] = Field("pixels", description=FRAMES_HELP)

    def episode_ranges(self, settings: Settings) -> EpisodeRanges | None:
        """The selected episodes as merged ranges (None: all), within the configured limits."""
        return episode_ranges(self.episodes, settings)

    def windows(self) -> WindowRequest | None:
        return None if self.delta_timestamps is None else WindowRequest(self.delta_timestamps, self.tolerance_s)

    @property
    def codec(self) -> str | None:
        """The IPC body compression to apply, if any."""
        return None if self.compression in (None, "none") else self.compression


class TakeRequest(RowSelection):
    """Rows by position in the view of `episodes` (all episodes when absent)."""

    indices: list[Annotated[StrictInt, Field(ge=0, le=MAX_ROW)]] = Field(
        description="View row positions; order is kept and duplicates are allowed."
    )
    frames: Literal["pixels", "encoded", "references"] = Field(
        "pixels",
        description=FRAMES_HELP
        + " `references` (for a client that reads the server's cache directory itself): references to rows of the "
        "decoded-frame segments where every frame of the camera lies in one; windowed cameras come as pixels.",
    )
    rows: Literal["values", "references"] = Field(
        "values",
        description="How the rows come: `values` (the columns themselves) or `references` (for a client that reads "
        "the server's cache directory itself): where each row lies, a `segment` (int32, an index into the segments "
        "the schema's metadata `episerve.rows` describes) and a `row` of that segment file, when every column asked "
        "is stored (no camera, no `delta_timestamps`) and every row's segment is built; otherwise the values.",
    )


class RowLayoutRequest(BaseModel):
    """The view whose layout in the segment cache is asked (`POST /rows/layout`), and the stored columns read."""

    model_config = ConfigDict(extra="forbid")

    episodes: EpisodeSelection = Field(
        None, description="Episode spec ('0,3-5') or list of episode ids; absent means every episode."
    )
    columns: list[str] | None = Field(
        None, description="Stored columns the rows are read from, in this order; absent means all (no camera)."
    )

    def selection(self) -> RowSelection:
        """The same view and columns as a row request selects them."""
        return RowSelection(episodes=self.episodes, columns=self.columns)


MAX_TAKES = 1024


class DatasetTake(TakeRequest):
    """One take of a `POST /takes` request: rows of `dataset`'s view, as `POST /datasets/{dataset}/rows/take`
    reads them."""

    dataset: str = Field(min_length=1, description="The dataset the rows are taken from.")


class TakesRequest(BaseModel):
    """Takes of one or more datasets' views in one request (a mixture's batch): answered as their Arrow IPC
    streams one after another, in this order."""

    model_config = ConfigDict(extra="forbid")

    takes: list[DatasetTake] = Field(
        min_length=1, max_length=MAX_TAKES, description="The takes, answered in this order."
    )

    @property
    def indices(self) -> int:
        """Indices the takes ask for in all."""
        return sum(len(take.indices) for take in self.takes)


def few_enough_takes(document: Any) -> None:
    """422 before validation when a `POST /takes` document lists more than `MAX_TAKES` takes: validating every one
    of hundreds of thousands first would cost seconds of a worker."""
    takes = document.get("takes") if isinstance(document, dict) else None
    if isinstance(takes, list) and len(takes) > MAX_TAKES:
        raise InvalidInput(f"invalid body: takes: at most {MAX_TAKES} takes per request, not {len(takes)}")


class SliceRequest(RowSelection):
    """A contiguous slice of the view of `episodes`; `GET /rows` takes it in its query."""

    start: StrictInt = Field(0, ge=0, le=MAX_ROW, description="First view row (inclusive).")
    stop: StrictInt | None = Field(None, ge=0, le=MAX_ROW, description="End view row (exclusive); clamped.")

    @classmethod
    def from_query(cls, pairs: Iterable[tuple[str, str]]) -> SliceRequest:
        """The request a `GET /rows` query string states (repeated `episodes` or `columns` are joined, see
        `merged_query`)."""
        given: dict[str, Any] = {}
        for name, text in merged_query(pairs).items():
            given[name] = _QUERY_VALUES.get(name, _as_text)(name, text)
        return validated(cls, given, "query")


class WarmRequest(BaseModel):
    """Which episodes to warm; every episode when absent."""

    model_config = ConfigDict(extra="forbid")
    episodes: EpisodeSelection = Field(
        None, description="Episode spec ('0,3-5') or list of ids; absent means every episode."
    )

    def episode_ranges(self, settings: Settings) -> EpisodeRanges | None:
        return episode_ranges(self.episodes, settings)


LIST_PARAMETERS = ("episodes", "columns")


def merged_query(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """A query's parameters by name. A repeated list-valued parameter (`episodes=1&episodes=2`, as HTTP clients send
    a list) stands for the union of its values, joined by commas in the order given; any other repeated parameter
    is `InvalidInput`, never silently its last value."""
    merged: dict[str, str] = {}
    for name, text in pairs:
        if name not in merged:
            merged[name] = text
        elif name in LIST_PARAMETERS:
            merged[name] += "," + text
        else:
            raise InvalidInput(
                f"query parameter {name!r} is given more than once; only {' and '.join(LIST_PARAMETERS)} may repeat "
                "(their values are joined)"
            )
    return merged


def validated(model: type[BaseModel], document: Any, where: str) -> Any:
    """`document` as a `model`, or `InvalidInput` naming each invalid field."""
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise InvalidInput(f"invalid {where}: {validation_detail(exc, where)}") from exc


def validation_detail(exc: ValidationError, where: str) -> str:
    """Each invalid field and what is wrong with it."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or where}: {_message(e)}" for e in exc.errors(include_url=False))


def _message(error: Any) -> str:
    """Pydantic's message, but an integer past 64 bits (which orjson reads as a float) is called out of range."""
    value = error.get("input")
    if error["type"] in ("int_type", "int_from_float") and isinstance(value, float) and abs(value) >= 2**63:
        return "integer out of range (more than 64 bits)"
    return error["msg"]


def episode_ranges(spec: str | list[int] | None, settings: Settings) -> EpisodeRanges | None:
    """An episode spec or id list as merged ranges, within the configured limits."""
    if spec is None:
        return None
    if isinstance(spec, str):
        return parse_episode_spec(spec, settings.max_episode_spec_chars)
    if len(spec) > settings.max_take_indices:
        raise OverLimit(f"{len(spec)} episode ids; the limit is {settings.max_take_indices}", settings.max_take_indices)
    return ranges_from_ids(spec)


def _as_text(name: str, text: str) -> str:
    return text


def _as_integer(name: str, text: str) -> int | str:
    """Digits as an int; anything else as given, for the model to reject with the parameter's name."""
    if text.isascii() and text.isdigit():
        # Past `MAX_ROW` anyway, and never handed to int() (4,300 digits would raise): the model's bound says so.
        return MAX_ROW + 1 if len(text.lstrip("0")) > _MAX_INTEGER_CHARS else int(text)
    return text


def _as_float(name: str, text: str) -> float | str:
    try:
        return float(text) if len(text) <= 64 else text
    except ValueError:
        return text


def _as_columns(name: str, text: str) -> list[str]:
    return [c.strip() for c in text.split(",")]


def _as_windows(name: str, text: str) -> dict:
    try:
        return _DELTA_TIMESTAMPS.validate_json(text)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
        raise InvalidInput(f"delta_timestamps must be a JSON object of column -> list of seconds: {detail}") from exc


def _as_frame_size(name: str, text: str) -> Any:
    """`HxW` as [h, w], a JSON object as itself (each checked by the model); anything else as given, for the model
    to reject with the parameter's name."""
    if text.lstrip().startswith("{"):
        try:
            return _FRAME_SIZES.validate_json(text)
        except ValidationError as exc:
            detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors())
            raise InvalidInput(f"frame_size must be HxW or a JSON object of camera -> [h, w]: {detail}") from exc
    height, x, width = text.strip().lower().partition("x")
    if x and height.isascii() and height.isdigit() and width.isascii() and width.isdigit():
        return [_as_integer(name, height), _as_integer(name, width)]
    raise InvalidInput(f"frame_size must be HxW (two positive integers, e.g. 224x224) or a JSON object; got {text!r}")


_QUERY_VALUES = {
    "start": _as_integer,
    "stop": _as_integer,
    "tolerance_s": _as_float,
    "columns": _as_columns,
    "delta_timestamps": _as_windows,
    "frame_size": _as_frame_size,
}

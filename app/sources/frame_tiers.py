"""How a camera's frames are kept in its per-video-file segments: the frame tiers.

- `RawTier`: each frame's exact RGB pixels (what the decoder gives, LeRobot's frames), a fixed-size list column the
  read path maps and sends as views. 36-201x the MP4s on camera-like content.
- `JpegTier`: each frame as one independently decodable JPEG (libjpeg-turbo through `simplejpeg`) at the served
  size, a binary column: a random access is one decode, the disk 4-6x the MP4s at quality 90-95. Lossy: the
  quality setting is stated wherever frames are described, and raw stays the default.
- `HotPixels`: the hot layer over an encoded tier, for the files read most (`EPISERVE_VIDEO_HOT_BYTES`): raw-layout
  pixels like `RawTier`'s, read as views of the map, but each frame is its tier's round trip (encoded and decoded
  as that tier keeps it), so an answer is the same whether its frames came from the hot layer, the encoded
  segments or the MP4.

A tier is a small frozen value each camera carries (`VideoFeature.tier` in `app.sources.source`), so every piece
of the read path asks the camera's tier instead of branching on it: the segment schema, the batches a build writes,
the pictures a read gathers, and how a `frames=encoded` answer encodes. A tier knows frames by their shape only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson
import pyarrow as pa

Shape = tuple[int, int, int]  # a frame's (height, width, channels)

PTS, FRAME = "pts", "frame"
# Field metadata of an encoded camera column (in segments, and on the wire with `frames=encoded`).
ENCODING_KEY, SHAPE_KEY, QUALITY_KEY = b"episerve.encoding", b"shape", b"episerve.quality"
ROUND_TRIP_KEY = b"episerve.round_trip"  # a hot segment's pixels: the round trip through this encoded tier
SUBSAMPLINGS = ("420", "422", "444")
DEFAULT_QUALITY, DEFAULT_SUBSAMPLING = 92, "444"  # `jpeg` alone (see `JpegTier`)
# What a raw-tier camera is encoded at when a client asks for encoded frames: fewer bytes on the wire than the
# stored default (a tenth of the raw pixels at 480x640), decoded once by the trainer.
DEFAULT_WIRE_QUALITY, DEFAULT_WIRE_SUBSAMPLING = 95, "420"


class Pictures(Protocol):
    """One segment batch's frames: `pictures[row]` is frame `row` as a (H, W, C) uint8 array."""

    def __getitem__(self, row: int) -> np.ndarray: ...

    def copy_into(self, out: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> None:
        """`out[positions[i]] = self[rows[i]]`, each frame written straight into place."""
        ...


class FrameTier(Protocol):
    """One way of keeping a camera's frames in its segments."""

    name: str
    decodes: bool  # reading pixels costs a decode per frame (not a view of the map)
    lossy: bool  # its frames differ from the exact ones (`/datasets/<id>` then states how much)

    def schema(self, shape: Shape) -> pa.Schema:
        """A segment of this tier's frames of `shape`: each frame's presentation time and its frame."""
        ...

    def batch(self, schema: pa.Schema, times: Sequence[float], images: np.ndarray) -> pa.RecordBatch:
        """Decoded frames `images` (n, H, W, C uint8) at presentation `times`, as a batch of this tier's segment."""
        ...

    def pictures(self, frames: pa.Array, shape: Shape) -> Pictures:
        """The frames of one segment batch (its frame column), readable as pixels."""
        ...

    def as_kept(self, frames: np.ndarray, positions: np.ndarray) -> None:
        """Turn the freshly decoded `frames[positions]` into what this tier keeps, in place, so a frame decoded on
        demand equals the same frame read from a built segment: an answer never depends on what is cached."""
        ...

    def describe(self) -> dict[str, Any]:
        """What `/datasets/<id>` says of the tier."""
        ...


@dataclass(frozen=True)
class RawTier:
    """Exact RGB pixels, (height, width, channels) row-major per frame."""

    name: str = "raw"
    decodes: bool = False
    lossy: bool = False

    def schema(self, shape: Shape) -> pa.Schema:
        pixels = pa.list_(pa.uint8(), shape[0] * shape[1] * shape[2])
        frame = pa.field(FRAME, pixels, metadata={SHAPE_KEY: orjson.dumps(list(shape))})
        return pa.schema([pa.field(PTS, pa.float64()), frame])

    def batch(self, schema: pa.Schema, times: Sequence[float], images: np.ndarray) -> pa.RecordBatch:
        flat = pa.array(images.reshape(-1), pa.uint8())  # no copy: Arrow wraps the numpy buffer
        frames = pa.FixedSizeListArray.from_arrays(flat, schema.field(FRAME).type.list_size)
        return pa.RecordBatch.from_arrays([pa.array(times, pa.float64()), frames], schema=schema)

    def pictures(self, frames: pa.Array, shape: Shape) -> Pictures:
        values = frames.values.to_numpy(zero_copy_only=True)[frames.offset * frames.type.list_size :]
        return _MappedPixels(values[: len(frames) * frames.type.list_size].reshape(len(frames), *shape))

    def as_kept(self, frames: np.ndarray, positions: np.ndarray) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"tier": self.name, "lossy": self.lossy}

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class JpegTier:
    """One baseline JPEG per frame at `quality` (1-100) with `subsampling` chroma (`420`, `422` or `444`).

    The default, quality 92 with full chroma (4:4:4), is both smaller and closer to the exact frames than quality 95
    with 4:2:0 on AV1 camera content (photo content re-encoded from LeRobot's MP4s: 4.0x the MP4s and 40.6 dB at
    224x224 against 4.1x and 39.6 dB; 5.3x and 42.8 dB at 480x640 against 5.5x and 41.6 dB): the MP4's chroma is
    already subsampled, and subsampling it again costs more than a few quality steps. It decodes ~25 % slower."""

    quality: int = DEFAULT_QUALITY
    subsampling: str = DEFAULT_SUBSAMPLING
    name: str = "jpeg"
    decodes: bool = True
    lossy: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.quality <= 100:
            raise ValueError(f"JPEG quality {self.quality} is not within 1-100")
        if self.subsampling not in SUBSAMPLINGS:
            raise ValueError(f"JPEG chroma subsampling {self.subsampling!r} is not one of {', '.join(SUBSAMPLINGS)}")

    def schema(self, shape: Shape) -> pa.Schema:
        return pa.schema([pa.field(PTS, pa.float64()), self.field(FRAME, shape)])

    def field(self, name: str, shape: Shape) -> pa.Field:
        """A binary column of this tier's JPEGs of frames of `shape`, its metadata saying how to decode them."""
        metadata = {
            ENCODING_KEY: b"jpeg",
            SHAPE_KEY: orjson.dumps(list(shape)),
            QUALITY_KEY: f"{self.quality}:{self.subsampling}".encode(),
        }
        return pa.field(name, pa.binary(), metadata=metadata)

    def batch(self, schema: pa.Schema, times: Sequence[float], images: np.ndarray) -> pa.RecordBatch:
        frames = pa.array([self.encode(image) for image in images], pa.binary())
        return pa.RecordBatch.from_arrays([pa.array(times, pa.float64()), frames], schema=schema)

    def encode(self, image: np.ndarray) -> bytes:
        """One (H, W, 3) uint8 frame as a JPEG."""
        import simplejpeg

        contiguous = np.ascontiguousarray(image)
        return simplejpeg.encode_jpeg(
            contiguous, quality=self.quality, colorspace="RGB", colorsubsampling=self.subsampling, fastdct=False
        )

    def pictures(self, frames: pa.Array, shape: Shape) -> Pictures:
        return _DecodedOnRead(frames, shape)

    def as_kept(self, frames: np.ndarray, positions: np.ndarray) -> None:
        shape = frames.shape[1:]
        for position in np.unique(positions).tolist():
            decode_jpeg(self.encode(frames[position]), shape, into=frames[position])

    def describe(self) -> dict[str, Any]:
        return {"tier": self.name, "lossy": self.lossy, "quality": self.quality, "chroma_subsampling": self.subsampling}

    def __str__(self) -> str:
        return f"{self.name}:{self.quality}:{self.subsampling}"


@dataclass(frozen=True)
class HotPixels:
    """The hot layer over the encoded tier `of`: raw-layout pixels, each frame `of`'s round trip.

    Its segments read like raw ones (views of the map, sent from it, mapped by same-machine clients) but hold what
    `of` serves, never the exact frames: which files happen to be hot never changes an answer. Its schema names
    `of` (`episerve.round_trip`), so it differs from raw's and from `of`'s, and a hot segment is never taken for
    one of theirs, nor for one over another quality."""

    of: JpegTier
    name: str = "hot"
    decodes: bool = False
    lossy: bool = True

    def schema(self, shape: Shape) -> pa.Schema:
        schema = RAW.schema(shape)
        pixels = schema.field(FRAME)
        kept = pixels.with_metadata({**pixels.metadata, ROUND_TRIP_KEY: str(self.of).encode()})
        return schema.set(schema.get_field_index(FRAME), kept)

    def batch(self, schema: pa.Schema, times: Sequence[float], images: np.ndarray) -> pa.RecordBatch:
        self.of.as_kept(images, np.arange(len(images)))
        return RAW.batch(schema, times, images)

    def pictures(self, frames: pa.Array, shape: Shape) -> Pictures:
        return RAW.pictures(frames, shape)

    def as_kept(self, frames: np.ndarray, positions: np.ndarray) -> None:
        self.of.as_kept(frames, positions)

    def describe(self) -> dict[str, Any]:
        return self.of.describe()

    def __str__(self) -> str:
        return f"{self.name}:{self.of}"


def hot_layer_of(schema: pa.Schema) -> tuple[HotPixels, Shape] | None:
    """The hot layer whose segments have `schema`, and the frames' shape; None for a schema of another tier."""
    field_ = schema.field(FRAME) if FRAME in schema.names else None
    if field_ is None or not field_.metadata or ROUND_TRIP_KEY not in field_.metadata:
        return None
    tier = parse_tier(field_.metadata[ROUND_TRIP_KEY].decode())
    if not isinstance(tier, JpegTier):
        return None
    return HotPixels(tier), tuple(orjson.loads(field_.metadata[SHAPE_KEY]))  # type: ignore[return-value]


def hot_batches(
    kept: Iterable[pa.RecordBatch], hot: HotPixels, schema: pa.Schema, shape: Shape, batch_bytes: int
) -> Iterator[pa.RecordBatch]:
    """The hot layer's batches (`schema`) of a video file, from the batches of its encoded tier's segment (`kept`):
    each stored JPEG decoded, which is the round trip `HotPixels.batch` makes of the exact frames (the same encoder
    on the same frames), with no video decode and no encode. About `batch_bytes` of pixels a batch, whatever the
    batches of `kept`."""
    per_batch = max(1, batch_bytes // int(np.prod(shape)))
    images, times = np.empty((per_batch, *shape), np.uint8), []
    for batch in kept:
        stamps = batch.column(PTS).to_pylist()
        pictures = hot.of.pictures(batch.column(FRAME), shape)
        start = 0
        while start < batch.num_rows:
            count = min(per_batch - len(times), batch.num_rows - start)
            pictures.copy_into(images, np.arange(len(times), len(times) + count), np.arange(start, start + count))
            times += stamps[start : start + count]
            start += count
            if len(times) == per_batch:
                yield RAW.batch(schema, times, images)
                images, times = np.empty((per_batch, *shape), np.uint8), []
    if times:
        yield RAW.batch(schema, times, images[: len(times)])


def hot_tier(tier: FrameTier) -> HotPixels | None:
    """The hot layer over `tier`: raw pixels of its round trip for a tier that decodes on every read; None for raw
    frames, which are read as views already."""
    return HotPixels(tier) if isinstance(tier, JpegTier) else None


def kept_tier(tier: FrameTier, schema: pa.Schema, shape: Shape) -> FrameTier:
    """Which of `tier` and its hot layer keeps segments of `schema` (a ValueError for neither)."""
    for candidate in (tier, hot_tier(tier)):
        if candidate is not None and candidate.schema(shape).equals(schema, check_metadata=True):
            return candidate
    raise ValueError(f"a segment schema that is neither the {tier} tier's nor its hot layer's")


def decode_jpeg(data: bytes | pa.Buffer, shape: tuple[int, ...], into: np.ndarray | None = None) -> np.ndarray:
    """One JPEG as a (H, W, 3) uint8 array (written into `into` if given); a problem when it does not hold a frame
    of `shape`."""
    import simplejpeg

    data = np.frombuffer(data, np.uint8)
    image = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False, buffer=into)
    if image.shape != shape:
        raise ValueError(f"an encoded frame is {image.shape}, the camera's frames are {shape}")
    return image


class _MappedPixels:
    """A raw segment batch's frames: (n, H, W, C) uint8 views of the memory map."""

    def __init__(self, views: np.ndarray) -> None:
        self._views = views

    def __getitem__(self, row: int) -> np.ndarray:
        return self._views[row]

    def copy_into(self, out: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> None:
        # Large frames one by one, straight into place (a vectorised scatter would first gather them into a
        # temporary, a second copy of every byte); small ones by one vectorised copy.
        if out[0].nbytes >= _ONE_BY_ONE_BYTES:
            for position, row in zip(positions.tolist(), rows.tolist(), strict=True):
                out[position] = self._views[row]
        else:
            out[positions] = self._views[rows]


_ONE_BY_ONE_BYTES = 32 * 1024


class _DecodedOnRead:
    """A JPEG segment batch's frames, each decoded when it is read."""

    def __init__(self, frames: pa.Array, shape: tuple[int, int, int]) -> None:
        self._frames, self._shape = frames, shape

    def __getitem__(self, row: int) -> np.ndarray:
        return decode_jpeg(self._frames[int(row)].as_buffer(), self._shape)

    def copy_into(self, out: np.ndarray, positions: np.ndarray, rows: np.ndarray) -> None:
        # Decoded straight into place: a fresh array per frame costs more than the decode on first touch.
        for position, row in zip(positions.tolist(), rows.tolist(), strict=True):
            decode_jpeg(self._frames[row].as_buffer(), self._shape, into=out[position])


RAW = RawTier()


def wire_encoding(tier: FrameTier) -> JpegTier:
    """How a camera's frames are encoded for a client that decodes them itself: as its tier keeps them where that
    is JPEG (the bytes are sent as stored), else JPEG at `DEFAULT_WIRE_QUALITY` and `DEFAULT_WIRE_SUBSAMPLING`."""
    return tier if isinstance(tier, JpegTier) else JpegTier(DEFAULT_WIRE_QUALITY, DEFAULT_WIRE_SUBSAMPLING)


def parse_tier(text: str) -> FrameTier:
    """`raw`, `jpeg`, `jpeg:90` or `jpeg:100:444` as a tier (ValueError naming what is wrong)."""
    name, *options = [part.strip() for part in text.strip().lower().split(":")]
    if name == "raw" and not options:
        return RAW
    if name == "jpeg" and len(options) <= 2:
        quality = options[0] if options else str(DEFAULT_QUALITY)
        if not quality.isdigit():
            raise ValueError(f"frame tier {text!r}: the JPEG quality must be an integer 1-100")
        return JpegTier(int(quality), *options[1:2])
    raise ValueError(f"frame tier {text!r} is not `raw`, `jpeg`, `jpeg:QUALITY` or `jpeg:QUALITY:SUBSAMPLING`")


def parse_tiers(text: str) -> dict[str, FrameTier]:
    """`jpeg:90,pusht=raw` -> {"*": JpegTier(90), "pusht": RAW}."""
    tiers: dict[str, FrameTier] = {}
    for entry in (part.strip() for part in text.split(",")):
        if entry:
            dataset_id, _, tier = entry.rpartition("=")
            tiers[dataset_id.strip() or "*"] = parse_tier(tier)
    return tiers


def estimated_frame_segment_bytes(schema: pa.Schema, frames: int) -> int:
    """About how large a segment of `frames` frames of `schema` is on disk, for the cache budget before a build:
    exact for raw pixels; for JPEG, a generous estimate from camera-like content (an eighth of raw up to quality
    95 with subsampled chroma, a sixth with full chroma, a quarter above 95; measured 1/7-1/40)."""
    field_ = schema.field(FRAME)
    raw = int(np.prod(orjson.loads(field_.metadata[SHAPE_KEY])))
    if pa.types.is_binary(field_.type):
        quality, _, subsampling = field_.metadata[QUALITY_KEY].decode().partition(":")
        raw //= 4 if int(quality) > 95 else 6 if subsampling == "444" else 8
    return frames * (raw + 8) + 64 * 1024  # plus presentation times and the IPC file's framing


def projected_frame_disk(cameras: Sequence[Any], frames: int, budget_bytes: int | None) -> dict[str, Any]:
    """What the decoded-frame segments of `frames` frames of each of `cameras` (`VideoFeature`s) take on disk:
    under their tiers (`bytes`; estimated for encoded tiers, see `estimated_frame_segment_bytes`) and as exact
    pixels (`raw_bytes`), and whether that fits `budget_bytes` (the video cache budget, which every dataset
    shares; None: no limit); when it does not, a `note` saying what happens and what would fit."""
    kept = sum(estimated_frame_segment_bytes(camera.tier.schema(camera.shape), frames) for camera in cameras)
    raw = sum(estimated_frame_segment_bytes(RAW.schema(camera.shape), frames) for camera in cameras)
    report: dict[str, Any] = {
        "tiers": sorted({str(camera.tier) for camera in cameras}),
        "frames_per_camera": frames,
        "bytes": kept,
        "estimated": any(camera.tier.decodes for camera in cameras),
        "raw_bytes": raw,
        "fits_budget": budget_bytes is None or kept <= budget_bytes,
    }
    if budget_bytes is not None and kept > budget_bytes:
        note = (
            f"the decoded frames need about {_gigabytes(kept)}; the video cache budget "
            f"(EPISERVE_VIDEO_CACHE_BYTES) is {_gigabytes(budget_bytes)}, shared by every dataset: frames beyond "
            "it are decoded on demand"
        )
        if not report["estimated"]:
            jpeg = sum(estimated_frame_segment_bytes(JpegTier().schema(camera.shape), frames) for camera in cameras)
            note += f"; as JPEG (EPISERVE_VIDEO_FRAME_TIER=jpeg, lossy) they would need at most {_gigabytes(jpeg)}"
        report["note"] = note
    return report


def _gigabytes(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"

"""Server configuration: `EPISERVE_*` environment variables, overridable from the command line."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/episerve`, else `~/.cache/episerve`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "episerve"


class Settings(BaseSettings):
    """Everything the server can be configured with. Each field maps to `EPISERVE_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="EPISERVE_", extra="ignore")

    roots: Annotated[list[Path | str], NoDecode] = Field(
        default_factory=list,
        description="Dataset roots: directories, or object-store locations `s3://bucket/prefix` (os.pathsep-separated "
        "in the environment). Empty: serve the demo dataset.",
    )
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Where segment caches live.")
    mixtures_dir: Path | None = Field(
        None,
        description="A directory of named mixtures, one JSON (or YAML, with PyYAML) document each: "
        "`<id>.json` is mixture `<id>` at /mixtures/<id>. Unset: no named mixtures.",
    )
    hub: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Datasets served from the Hugging Face Hub by repo id, `OWNER/NAME[@REVISION]`, comma-separated "
        "(e.g. `lerobot/pusht@main`): metadata fetched into LeRobot's place for them (HF_HOME) from the start, in "
        "the background; a LeRobot dataset's data files and camera videos as reads need them.",
    )
    hub_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hub repo ids a client may name on first use (fetched from then on), as patterns, comma-separated "
        "(e.g. `lerobot/*`). Unset: only the `hub` datasets.",
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=256)
    log_level: str = "info"

    log_format: str = Field("text", pattern="^(text|json)$", description="Request and build log lines: text or json.")
    tokens: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        repr=False,
        description="Accepted bearer tokens (comma-separated). Empty: no authentication.",
    )
    tokens_file: Path | None = Field(None, description="File of accepted bearer tokens, one per line.")
    metrics_require_token: bool = Field(False, description="Protect /metrics with the tokens too.")
    verify_on_open: bool = Field(True, description="Checksum a segment built by another process when first mapped.")

    episode_column: str = Field("episode_index", description="Episode column of generic parquet datasets.")
    max_rows_per_response: int = Field(1_000_000, ge=1, description="Rows one /rows response may hold.")
    max_take_indices: int = Field(100_000, ge=1, description="Indices one take request may ask for.")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Largest accepted request body.")
    max_header_bytes: int = Field(
        384 * 1024,
        ge=8 * 1024,
        description="Largest request line plus headers (431 beyond); fits an `episodes` spec of the default "
        "maximum length even with every character percent-encoded.",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Time a request line and headers may take to arrive (408 and close beyond)."
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Time a request body may take to arrive, in all (408 and close beyond)."
    )
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="Time a response may wait for its client to read on: a client that reads nothing of it for this "
        "long is disconnected, and the unsent rest freed (a slow but steady reader never is).",
    )
    worker_healthcheck_timeout_s: int = Field(
        30,
        ge=1,
        le=3600,
        description="Time a worker may take to answer its supervisor's health check before it is taken as hung, "
        "killed and replaced (logged). Long enough that a worker merely slowed by load is never killed.",
    )
    max_episode_spec_chars: int = Field(100_000, ge=16, description="Longest accepted `episodes` spec.")
    max_window_offsets: int = Field(1024, ge=1, description="Offsets one delta_timestamps column may list.")
    max_window_values: int = Field(
        10_000_000, ge=1, description="Rows x offsets one windowed request may gather (per column)."
    )
    max_frame_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1,
        description="Decoded camera-frame bytes one response may hold (413 beyond, stating how many rows fit; the "
        "client pages by itself). Bounds the server's memory per request.",
    )
    cold_read_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="Row-group bytes a take may decode straight from parquet while its segment builds (0: wait).",
    )
    cold_read_memory: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="Resident memory all cold reads and segment builds of one worker may hold at once (each "
        "estimated from the file's metadata before it reads: a batch of about 1 MiB of a row group, its column "
        "buffers and the rows kept); more wait their turn.",
    )
    max_concurrent_reads: int = Field(
        8, ge=1, le=1024, description="Row reads one worker runs at once; more wait (bounds memory under load)."
    )
    max_inflight_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=16 * 1024 * 1024,
        description="Response bytes one worker holds in flight at once (rows read and not yet sent, and what the "
        "transport buffers of a send); new reads wait while it is spent, so clients that stop reading cost at most "
        "their piece each.",
    )
    inline_read_bytes: int = Field(
        4 * 1024 * 1024,
        ge=0,
        description="Takes of at most this many bytes, and plain GET /rows slices, from already-mapped segments are "
        "answered on the event loop, without the framework and thread-pool hand-off (0: never).",
    )
    row_layout_s: float = Field(
        1.0,
        ge=0,
        le=3600,
        description="How long a client on the server's machine (`cache_dir=`) takes rows from the segment files by "
        "a view's layout before asking for it again: how stale its rows may be after a source file changes (0: it "
        "asks the server at every take).",
    )
    rescan_interval_s: float = Field(
        5.0,
        ge=0,
        description="Seconds between looks at a dataset's files (directory and metadata stats, one stat per source "
        "file): added, removed or rewritten files are noticed within this time; also how often an unknown dataset "
        "id makes the roots be listed again (0: look on every request).",
    )
    video_cache_policy: Literal["on-demand", "first-touch", "warmed"] = Field(
        "first-touch",
        description="Camera frames: decode on demand only; build each video file's decoded-frame segment in the "
        "background on first touch and serve from it once built; or serve from segments only where `warm --videos` "
        "built them.",
    )
    video_cache_bytes: int | None = Field(
        None,
        ge=0,
        description="Disk budget of the decoded-frame segments of all datasets in the cache directory: the least "
        "recently used are evicted to make room for a new one, and a video whose segment alone exceeds the budget is "
        "decoded on demand. Unset: no limit.",
    )
    video_hot_bytes: int = Field(
        0,
        ge=0,
        description="Disk budget of hot pixel segments over encoded frame tiers (`video_frame_tier` `jpeg...`), on "
        "top of `video_cache_bytes`: the video files read most recently also keep their frames as the tier's round "
        "trip in raw pixels, read without a decode and with the same answers; least recently used evicted first. "
        "0 (the default): no hot layer, every frame of an encoded tier is decoded when read.",
    )
    video_hot_min_idle_s: float = Field(
        30.0,
        ge=0,
        description="A hot pixel segment used within this many seconds is never evicted for another: when the hot "
        "budget is full of segments in use (a shuffled read over more files than it holds), a file that is not hot "
        "stays on its encoded segment instead of evicting one in use and rebuilding it again and again. 0: evict "
        "the least recently used whatever its age.",
    )
    video_cache_size: Annotated[dict[str, tuple[int, int]], NoDecode] = Field(
        default_factory=dict,
        description="Serve camera frames downscaled (decoded-frame segments are stored at that size too): `HxW` for "
        "every dataset, `DATASET=HxW` for one, comma-separated (e.g. `224x224,pusht=96x96`). Unset: the files' size.",
    )
    video_frame_tier: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="How decoded-frame segments keep camera frames: `raw` (exact pixels, the default) or "
        "`jpeg[:Q[:S]]` (one JPEG per frame, quality Q 1-100, default 92, chroma subsampling S `444` (default), "
        "`422` or `420`: "
        "lossy, 4-6x the MP4s on camera-like content instead of 36-201x), for every dataset or `DATASET=TIER` for "
        "one, comma-separated (e.g. `jpeg,pusht=raw`).",
    )
    video_decoders: int = Field(
        4,
        ge=1,
        le=256,
        description="Open video decoders kept per process for reads that continue where the last one stopped.",
    )
    video_decode_threads: int = Field(
        1,
        ge=0,
        le=64,
        description="FFmpeg decoding threads for reads of consecutive frames (0: FFmpeg picks). One decodes the "
        "most frames per CPU second when requests decode side by side, as under DataLoader workers; more decodes a "
        "lone sequential reader faster on an idle machine. Scattered reads always decode single-threaded.",
    )
    remote_list_ttl: float = Field(
        30.0,
        ge=0,
        description="Seconds an object-store root's listing (which objects exist, their sizes and modification "
        "times) is reused before the store is listed again: objects added, removed or re-uploaded are noticed "
        "within this time (plus `rescan_interval_s`).",
    )
    remote_attempts: int = Field(
        3, ge=1, le=20, description="Attempts per object-store request (retried with exponential backoff)."
    )
    remote_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Connect timeout, and longest wait for data, of one object-store request; with "
        "`remote_attempts` it bounds how long one store request may take before it counts as failed.",
    )
    remote_wait_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Longest a request waits on an object store in all (loading an index, building a segment, "
        "reading rows cold), however many store requests that takes: then a 503 naming the object, while the work "
        "goes on in the background (a segment still built serves a later request).",
    )
    max_open_segments: int = Field(256, ge=1, description="Memory-mapped segments kept open per process.")
    build_batch_bytes: int = Field(
        4 * 1024 * 1024, ge=64 * 1024, description="Target size of one record batch while building a segment."
    )
    build_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Segments a warm-up (CLI `warm`, `POST /cache`) builds at once; each build adds about 60 MB "
        "of memory at the default batch size.",
    )

    @field_validator("roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str):
            # `s3://` keeps its colon: on POSIX, a separator is a colon not followed by `//`.
            parts = re.split(r":(?!//)", value) if os.pathsep == ":" else value.split(os.pathsep)
            return [part for part in parts if part.strip()]
        return value

    @field_validator("video_cache_size", mode="before")
    @classmethod
    def _parse_frame_sizes(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_frame_sizes(value)
        return value

    @field_validator("video_frame_tier", mode="before")
    @classmethod
    def _parse_frame_tiers(cls, value: object) -> object:
        if isinstance(value, str):
            from app.sources.frame_tiers import parse_tiers

            return {dataset_id: str(text) for dataset_id, text in parse_tiers(value).items()}
        return value

    def frame_tier(self, dataset_id: str) -> str:
        """The frame tier of this dataset's cameras, as `app.sources.frame_tiers.parse_tier` reads it."""
        return self.video_frame_tier.get(dataset_id, self.video_frame_tier.get("*", "raw"))

    def frame_size(self, dataset_id: str) -> tuple[int, int] | None:
        """(height, width) camera frames of this dataset are served at, if downscaled."""
        return self.video_cache_size.get(dataset_id, self.video_cache_size.get("*"))

    @field_validator("hub", "hub_allow", mode="before")
    @classmethod
    def _split_hub(cls, value: object) -> object:
        if isinstance(value, str):
            return [entry.strip() for entry in value.split(",") if entry.strip()]
        return value

    @field_validator("hub")
    @classmethod
    def _check_hub(cls, value: list[str]) -> list[str]:
        from app.sources.hub import parse_hub_datasets

        parse_hub_datasets(value)  # a ValueError naming a malformed entry
        return value

    @field_validator("tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            return [token.strip() for token in value.split(",") if token.strip()]
        return value

    @field_validator("roots", "cache_dir", "tokens_file")
    @classmethod
    def _absolute(cls, value: object) -> object:
        if value is None:
            return None
        if isinstance(value, list):
            return [p if isinstance(p, str) and is_remote_root(p) else Path(p).expanduser().resolve() for p in value]
        return Path(value).expanduser().resolve()  # type: ignore[arg-type]

    def accepted_tokens(self) -> list[str]:
        """Tokens from `tokens` and `tokens_file` (blank lines and `#` comments ignored)."""
        tokens = list(self.tokens)
        if self.tokens_file is not None:
            lines = self.tokens_file.read_text().splitlines()
            tokens += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        return tokens


def is_remote_root(root: str) -> bool:
    """Whether a configured root names an object-store location (`s3://bucket[/prefix]`) rather than a directory."""
    return root.startswith("s3://")


def parse_frame_sizes(text: str) -> dict[str, tuple[int, int]]:
    """`224x224,pusht=96x128` -> {"*": (224, 224), "pusht": (96, 128)} (height x width)."""
    sizes: dict[str, tuple[int, int]] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        dataset_id, _, size = entry.rpartition("=")
        height, x, width = size.strip().lower().partition("x")
        if not x or not height.isdigit() or not width.isdigit() or int(height) < 1 or int(width) < 1:
            raise ValueError(f"frame size {size!r} is not HxW (two positive integers, e.g. 224x224)")
        sizes[dataset_id.strip() or "*"] = (int(height), int(width))
    return sizes

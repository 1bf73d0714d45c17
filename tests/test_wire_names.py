"""The server and the client are installed apart, so each defines the names and defaults of the wire once, for
itself; these tests hold the two definitions equal."""

from __future__ import annotations

from app.reads import arrow_ipc, frame_references, row_references, windows
from app.settings import Settings
from episerve import _client, _local_frames, _local_rows, _output_lerobot


def test_frame_references_are_described_under_one_metadata_key() -> None:
    assert _local_frames.METADATA_KEY == frame_references.METADATA_KEY


def test_row_references_are_described_under_one_metadata_key() -> None:
    assert _local_rows.METADATA_KEY == row_references.METADATA_KEY


def test_arrow_bodies_have_one_media_type() -> None:
    assert _client.ARROW_STREAM == arrow_ipc.ARROW_STREAM_MEDIA_TYPE


def test_the_client_first_pages_by_the_server_default_limits() -> None:
    defaults = Settings.model_fields
    assert defaults["max_rows_per_response"].default == _client._PAGE_ROWS
    assert defaults["max_take_indices"].default == _client._TAKE_INDICES


def test_window_padding_masks_have_one_suffix() -> None:
    assert _output_lerobot.PAD_SUFFIX == windows.PAD_SUFFIX

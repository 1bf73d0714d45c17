"""Prometheus metrics, safe with several worker processes (prometheus-client's multiprocess mode).

In multiprocess mode (`PROMETHEUS_MULTIPROC_DIR` set by the CLI before workers start) every worker writes its
samples to files in that directory and `/metrics` aggregates them.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

REQUESTS = Counter("episerve_requests_total", "HTTP requests", ["endpoint", "method", "status"])
REQUEST_SECONDS = Histogram(
    "episerve_request_duration_seconds",
    "Time from request to the last byte of the response",
    ["endpoint"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
BYTES_SERVED = Counter("episerve_response_bytes_total", "Response body bytes sent", ["endpoint"])
ROWS_SERVED = Counter("episerve_rows_served_total", "Rows sent in Arrow responses", ["endpoint"])
INLINE_TAKES = Counter(
    "episerve_inline_takes_total", "Takes answered on the event loop, from mapped segments, without a thread hand-off"
)
INLINE_SLICES = Counter(
    "episerve_inline_slices_total",
    "Row slices (GET /rows) answered on the event loop, from mapped segments, without a thread hand-off",
)
CACHE_HITS = Counter("episerve_cache_hits_total", "Segment opens served from the open-segment LRU")
CACHE_MISSES = Counter("episerve_cache_misses_total", "Segment opens that had to map (or build) the segment")
CACHE_BUILDS = Counter("episerve_cache_builds_total", "Segments converted from parquet")
BUILD_SECONDS = Histogram(
    "episerve_cache_build_seconds", "Time to convert one segment", buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
)
BUILD_BYTES = Counter("episerve_cache_build_bytes_total", "Bytes of segments written by builds")
SEGMENTS_ON_DISK = Gauge(
    "episerve_cache_segments", "Valid segments on disk, over all datasets", multiprocess_mode="mostrecent"
)
SEGMENT_BYTES_ON_DISK = Gauge(
    "episerve_cache_bytes", "Bytes of segments on disk, over all datasets", multiprocess_mode="mostrecent"
)
OPEN_SEGMENTS = Gauge("episerve_open_segments", "Memory-mapped segments held open", multiprocess_mode="livesum")
INFLIGHT_BYTES = Gauge(
    "episerve_inflight_bytes", "Response bytes held in flight (the in-flight budget)", multiprocess_mode="livesum"
)


def render() -> tuple[bytes, str]:
    """The exposition text of every worker's metrics, and its content type."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST

"""The one seam between the client and the network: `Transport.handle_request(Request) -> Response`.

Every request the client makes, JSON or Arrow, goes through `handle_request` of the transport chosen for its URL
(`_transport_choice`). A transport returns the whole response, body included, or raises a `TransportError`; the
client's retry loop knows nothing else about transports. This module names no concrete transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa


@dataclass(frozen=True)
class Timeouts:
    """Seconds to wait for a connection and for each read or write on it."""

    connect: float | None
    read: float | None


@dataclass(frozen=True)
class Request:
    """One HTTP request: `target` is the path and query (no scheme or host); header names as sent."""

    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes = b""


@dataclass(frozen=True)
class Response:
    """A complete response: status, reason, headers (lower-case names) and the body in one pyarrow buffer.

    A mutable `body` is the client's own memory: columns decoded from it may be handed out as writable arrays.
    """

    status: int
    reason: str
    headers: Mapping[str, str]
    body: pa.Buffer


class Transport(Protocol):
    """Sends requests to one server (scheme, host and port fixed at construction)."""

    def handle_request(self, request: Request) -> Response:
        """Send `request` and return the whole response; raise a `TransportError` when no response arrived."""
        ...

    def close(self) -> None:
        """Close idle connections (only in the process that opened them)."""
        ...


class TransportError(Exception):
    """No (complete) response: the request may be retried."""


class ConnectError(TransportError):
    """The server could not be connected to (refused, unreachable, name not resolved)."""


class ConnectTimeout(ConnectError):
    """Connecting took longer than the connect timeout."""


class ReadError(TransportError):
    """The connection failed or closed while sending the request or reading the response."""


class ReadTimeout(ReadError):
    """The server sent nothing for longer than the read timeout."""


class ProtocolError(TransportError):
    """The server's answer is not valid HTTP/1.1."""


class UnsupportedURL(Exception):
    """The URL's scheme is not http or https: retrying cannot help."""

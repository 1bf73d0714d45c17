"""The transport for `https://` servers and servers behind a proxy: httpx, which does TLS and proxies well.

Bodies arrive through httpx's layers, slower than the socket transport's in-place receive for large Arrow
bodies, and are handed over as one read-only buffer (so columns decoded from them are copied once when made
writable).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pyarrow as pa

from episerve._transport import (
    ConnectError,
    ConnectTimeout,
    ProtocolError,
    ReadError,
    ReadTimeout,
    Request,
    Response,
    Timeouts,
    TransportError,
)


class HttpxTransport:
    """Requests to one origin through a keep-alive `httpx.Client` (proxies from the environment)."""

    def __init__(self, url: str, timeouts: Timeouts) -> None:
        parts = urlsplit(url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        timeout = httpx.Timeout(timeouts.read, connect=timeouts.connect)
        self._client = httpx.Client(timeout=timeout)

    def handle_request(self, request: Request) -> Response:
        """Send one request and return the complete response (content codings undone by httpx)."""
        try:
            response = self._client.request(
                request.method, self.origin + request.target, headers=dict(request.headers), content=request.body
            )
        except httpx.ConnectTimeout as exc:
            raise ConnectTimeout(str(exc)) from exc
        except httpx.ConnectError as exc:
            raise ConnectError(str(exc)) from exc
        except httpx.TimeoutException as exc:
            raise ReadTimeout(str(exc)) from exc
        except (httpx.RemoteProtocolError, httpx.DecodingError) as exc:
            raise ProtocolError(str(exc)) from exc
        except (httpx.ReadError, httpx.WriteError) as exc:
            raise ReadError(str(exc)) from exc
        except httpx.TransportError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        headers = {name.lower(): value for name, value in response.headers.items()}
        headers.pop("content-encoding", None)  # httpx has decoded the body already
        return Response(response.status_code, response.reason_phrase, headers, pa.py_buffer(response.content))

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()

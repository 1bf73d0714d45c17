"""Which transport carries a client's requests: the keep-alive socket transport for plain `http://` servers, httpx
for `https://` and for servers reached through a proxy.

The choice lives here, above the transports, so the interface (`_transport`) knows no concrete transport.
"""

from __future__ import annotations

from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from episerve._transport import Timeouts, Transport, UnsupportedURL


def transport_for(url: str, timeouts: Timeouts) -> Transport:
    """The transport for `url`: raw keep-alive sockets for `http://` without a proxy, httpx otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsupportedURL(f"cannot reach {url!r}: the URL must start with http:// or https:// and name a host")
    if parts.scheme == "http" and not _proxied(parts.hostname):
        from episerve._socket_transport import SocketTransport  # imported when first used: it loads httptools

        return SocketTransport(parts.hostname, parts.port or 80, timeouts)
    from episerve._httpx_transport import HttpxTransport  # imported when first used: httpx takes a while

    return HttpxTransport(url, timeouts)


def _proxied(host: str) -> bool:
    """Whether requests to `host` must go through a proxy named in the environment."""
    proxies = getproxies()
    return bool(proxies.get("http") or proxies.get("all")) and not proxy_bypass(host)

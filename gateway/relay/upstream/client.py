"""The send: a request to a replica, on a kept-alive connection of that replica's pool, up to the answer's
headers (module docstring of `gateway.relay.upstream`: why not aiohttp's client)."""

from __future__ import annotations

import asyncio
import ssl
from base64 import b64encode
from functools import partial
from urllib.parse import unquote, urlsplit

from multidict import CIMultiDict

from gateway.relay.upstream.connection import NoConnection, UpstreamAnswer, UpstreamConnection

# A connection idle this long is closed, not reused: below uvicorn's 5 s keep-alive (vLLM's server), so the
# gateway closes an idle connection before the replica does, and never writes a request into one it is closing.
KEEPALIVE_S = 4.0
_ORIGINS_MAX = 256  # replicas come and go (reloads, discovery): origins with nothing idle are forgotten past this


class _Origin:
    """One replica URL: where to connect, what every request's head starts with, its idle connections."""

    __slots__ = ("host", "port", "tls", "prefix", "head_fields", "basic_auth", "idle", "forgotten")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host, self.tls = parts.hostname, parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")  # a replica behind a path: every target goes under it
        self.head_fields = f"Host: {parts.netloc.rpartition('@')[2]}\r\n"
        self.basic_auth = None  # user:password in the URL, sent as HTTP basic auth unless the request has its own
        if parts.username is not None:
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            self.basic_auth = f"Authorization: Basic {b64encode(secret).decode()}\r\n"
        self.idle: list[UpstreamConnection] = []
        self.forgotten = False


class Upstream:
    """Every replica's pool of kept-alive connections, and the send on them."""

    def __init__(self) -> None:
        self._origins: dict[str, _Origin] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    async def send(
        self, method: str, origin: str, target: str, body: bytes, headers: CIMultiDict[str], connect_s: float
    ) -> UpstreamAnswer:
        """`method` `origin + target` with `body` and `headers` (none of Host, Content-Length, Transfer-Encoding:
        the send sets them), up to the answer's headers; read its body, then `release()` (or `close()`) it.
        Raises `NoConnection` when no connection could be made within `connect_s`, `Dropped` when the one used
        broke before the headers came. Nothing else bounds the wait: the relay's silence watch does."""
        if self._closed:
            raise NoConnection("the gateway is stopping")
        site = self._origins.get(origin) or self._origin(origin)
        fields = [f"{name}: {value}\r\n" for name, value in headers.items()]
        if site.basic_auth is not None and "Authorization" not in headers:
            fields.append(site.basic_auth)
        head = (
            f"{method} {site.prefix}{target} HTTP/1.1\r\n{site.head_fields}{''.join(fields)}"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        lines = len(fields) + 4  # the request line, Host, the fields, Content-Length, the blank line
        if head.count("\n") != lines or head.count("\r") != lines:
            raise ValueError("a header of the request holds a line break")  # the server's parser lets none through
        request = b"".join((head.encode("utf-8", "surrogateescape"), body))
        connection = self._take(site) or await self._connect(site, connect_s)
        return await connection.exchange(request)

    async def close(self) -> None:
        """Close every idle connection; no send after this."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for site in self._origins.values():
            for connection in site.idle:
                connection.abort()
            site.idle.clear()
        await asyncio.sleep(0)  # the transports' connection_lost, before the loop may close

    def _origin(self, url: str) -> _Origin:
        site = self._origins[url] = _Origin(url)
        return site

    def _take(self, site: _Origin) -> UpstreamConnection | None:
        """The most recently used idle connection that is young enough (closing the others found on the way)."""
        idle = site.idle
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < KEEPALIVE_S:
                return connection
            connection.abort()
        return None

    async def _connect(self, site: _Origin, connect_s: float) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        tls = None
        if site.tls:
            tls = self._tls = self._tls or ssl.create_default_context()  # verified, as aiohttp's default
        factory = partial(UpstreamConnection, partial(self._idle, site), partial(self._lost, site))
        try:
            async with asyncio.timeout(connect_s):
                _, connection = await loop.create_connection(
                    factory, site.host, site.port, ssl=tls, server_hostname=site.host if tls else None
                )
        except TimeoutError as exc:
            raise NoConnection(f"connect timed out after {connect_s:g}s", timed_out=True) from exc
        except OSError as exc:  # refused, unreachable, the name not found, TLS
            raise NoConnection(type(exc).__name__) from exc
        return connection

    def _idle(self, site: _Origin, connection: UpstreamConnection) -> None:
        if self._closed or site.forgotten:
            connection.abort()
            return
        connection.idle_since = asyncio.get_running_loop().time()
        site.idle.append(connection)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(KEEPALIVE_S, self._sweep_idle)

    @staticmethod
    def _lost(site: _Origin, connection: UpstreamConnection) -> None:
        if connection in site.idle:  # closed by its replica while idle
            site.idle.remove(connection)

    def _sweep_idle(self) -> None:
        """Close the connections idle for `KEEPALIVE_S` (a replica no longer used keeps none open for long);
        runs again while any stay idle."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        for site in self._origins.values():
            old = [c for c in site.idle if now - c.idle_since >= KEEPALIVE_S]
            for connection in old:
                site.idle.remove(connection)
                connection.abort()
        if len(self._origins) > _ORIGINS_MAX:
            for url, site in list(self._origins.items()):
                if not site.idle:
                    site.forgotten = True
                    del self._origins[url]
        if any(site.idle for site in self._origins.values()):
            self._sweep = asyncio.get_running_loop().call_later(KEEPALIVE_S, self._sweep_idle)

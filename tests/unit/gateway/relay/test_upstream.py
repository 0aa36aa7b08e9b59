"""The lean upstream send against `ClientSession.request`: the same bytes on the wire, keep-alive, and the
same exceptions for every failure the proxy maps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from gateway.relay.upstream import INLINE_BODY_MAX, Upstream
from gateway.relay.watch import attempt_timeout

pytestmark = pytest.mark.timeout(10)

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"
HEADERS = CIMultiDict([("Content-Type", "application/json"), ("X-Request-Id", "r1"), ("Accept", "text/plain")])


def _session(**extra: Any) -> aiohttp.ClientSession:
    """As gateway.serving.app's `_upstream_ctx` builds it."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, enable_cleanup_closed=False),
        timeout=attempt_timeout(5.0),
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        cookie_jar=extra.pop("cookie_jar", aiohttp.DummyCookieJar()),
        **extra,
    )


class _Raw:
    """A raw HTTP/1.1 server: keeps every request's bytes and connection count; `answer` says what to do."""

    def __init__(self, answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.lower().split(b"\r\n")
                length = next((int(line[15:]) for line in lines if line.startswith(b"content-length:")), 0)
                self.requests.append(head + await reader.readexactly(length))
                await self.answer(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            writer.close()


async def _answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(ANSWER)
    await writer.drain()


async def _reset(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()


async def _stall(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
    await reader.read()  # until the client drops the connection


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[tuple[_Raw, str]]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Callable[..., Awaitable[None]] = _answer) -> tuple[_Raw, str]:
        raw = _Raw(answer)
        server = await asyncio.start_server(raw._serve, "127.0.0.1", 0)
        servers.append(server)
        return raw, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()


@pytest.mark.parametrize("body", [b'{"model": "m1", "prompt": "hi"}', b"", b"x" * (INLINE_BODY_MAX + 1)])
async def test_the_same_bytes_as_client_session_request(
    serve: Callable[..., Awaitable[tuple[_Raw, str]]], body: bytes
) -> None:
    raw, origin = await serve()
    async with _session() as session:
        by_session = await session.request(
            "POST", origin + "/v1/completions?a=b", data=body, headers=HEADERS, timeout=attempt_timeout(5.0)
        )
        assert await by_session.read() == b"{}"
        upstream = await Upstream(session).send(
            "POST", origin, "/v1/completions?a=b", body, HEADERS, attempt_timeout(5.0)
        )
        assert (upstream.status, upstream.reason, upstream.headers["Content-Type"]) == (200, "OK", "application/json")
        assert await upstream.content.read() == b"{}"
        upstream.release()
    assert raw.requests[0] == raw.requests[1]
    assert raw.requests[0].startswith(b"POST /v1/completions?a=b HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_a_released_connection_is_kept_alive(serve: Callable[..., Awaitable[tuple[_Raw, str]]]) -> None:
    raw, origin = await serve()
    async with _session() as session:
        upstream = Upstream(session)
        for _ in range(3):
            answer = await upstream.send("POST", origin, "/v1/completions", b"{}", HEADERS, attempt_timeout(5.0))
            await answer.content.read()
            answer.release()
    assert (len(raw.requests), raw.connections) == (3, 1)


async def test_a_reset_after_sending_is_a_client_error(serve: Callable[..., Awaitable[tuple[_Raw, str]]]) -> None:
    _, origin = await serve(_reset)
    async with _session() as session:
        with pytest.raises(aiohttp.ClientError) as raised:
            await Upstream(session).send("POST", origin, "/v1/completions", b"{}", HEADERS, attempt_timeout(5.0))
    assert not isinstance(raised.value, aiohttp.ClientConnectorError)


async def test_no_connection_is_a_connector_error() -> None:
    async with _session() as session:
        with pytest.raises(aiohttp.ClientConnectorError):  # nothing listens on port 1
            await Upstream(session).send("POST", "http://127.0.0.1:1", "/", b"{}", HEADERS, attempt_timeout(5.0))


async def test_a_connect_timeout_is_a_connection_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async with _session() as session:

        async def slow(*_: object, **__: object) -> None:
            raise TimeoutError

        assert session.connector is not None
        monkeypatch.setattr(session.connector, "connect", slow)
        with pytest.raises(aiohttp.ConnectionTimeoutError):
            await Upstream(session).send("POST", "http://127.0.0.1:1", "/", b"{}", HEADERS, attempt_timeout(0.1))


async def test_a_cancelled_send_drops_its_connection(serve: Callable[..., Awaitable[tuple[_Raw, str]]]) -> None:
    raw, origin = await serve(_stall)
    async with _session() as session:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await Upstream(session).send("POST", origin, "/v1/completions", b"{}", HEADERS, attempt_timeout(5.0))
        await asyncio.wait_for(raw.closed.wait(), 5)  # the replica sees the connection close


async def test_a_session_the_send_would_not_behave_as_is_refused() -> None:
    async with _session(cookie_jar=aiohttp.CookieJar(), headers={"X-Default": "1"}) as session:
        with pytest.raises(ValueError, match="default headers, a cookie jar"):
            Upstream(session)

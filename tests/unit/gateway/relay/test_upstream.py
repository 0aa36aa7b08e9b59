"""The gateway's own upstream client against raw HTTP/1.1 servers on loopback: what a replica receives,
keep-alive, every body framing, back-pressure, and a defined failure for every way a replica can fail."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from multidict import CIMultiDict

from gateway.relay.upstream import Dropped, NoConnection, Upstream, UpstreamAnswer, client

pytestmark = pytest.mark.timeout(10)

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"
HEADERS = CIMultiDict([("Content-Type", "application/json"), ("X-Request-Id", "r1"), ("Accept", "text/plain")])

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Raw:
    """A raw HTTP/1.1 server: keeps every request's bytes and counts connections; `answer` says what to do."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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


def _writes(*parts: bytes, then_close: bool = False) -> Answer:
    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.01)
        if then_close:
            writer.close()

    return answer


async def _reset(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()


async def _stall(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
    await reader.read()  # until the client drops the connection


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[tuple[_Raw, str]]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer | None = None) -> tuple[_Raw, str]:
        raw = _Raw(answer or _writes(ANSWER))
        server = await asyncio.start_server(raw.serve, "127.0.0.1", 0)
        servers.append(server)
        return raw, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    sending = Upstream()
    yield sending
    await sending.close()


async def _body(answer: UpstreamAnswer) -> bytes:
    pieces = []
    while piece := await answer.read_any():
        pieces.append(piece)
    return b"".join(pieces)


@pytest.mark.parametrize("body", [b'{"model": "m1", "prompt": "hi"}', b"", b"x" * (1 << 20)])
async def test_the_replica_receives_the_request_as_sent(serve: Callable, upstream: Upstream, body: bytes) -> None:
    raw, origin = await serve()
    answer = await upstream.send("POST", origin, "/v1/completions?a=b", body, HEADERS, 5.0)
    assert (answer.status, answer.reason, answer.content_type) == (200, "OK", "application/json")
    assert (await _body(answer), answer.content_length) == (b"{}", 2)
    answer.release()
    port = origin.rsplit(":", 1)[1]
    assert raw.requests == [
        b"POST /v1/completions?a=b HTTP/1.1\r\n"
        b"Host: 127.0.0.1:" + port.encode() + b"\r\n"
        b"Content-Type: application/json\r\nX-Request-Id: r1\r\nAccept: text/plain\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    ]


async def test_a_replica_behind_a_path_with_credentials_in_its_url(serve: Callable, upstream: Upstream) -> None:
    raw, origin = await serve()
    with_auth = origin.replace("http://", "http://user:p%40ss@") + "/base/"
    (await upstream.send("POST", with_auth, "/v1/models", b"", CIMultiDict(), 5.0)).close()
    (
        await upstream.send("POST", with_auth, "/v1/models", b"", CIMultiDict([("Authorization", "Bearer k")]), 5.0)
    ).close()
    first, second = raw.requests
    assert first.startswith(b"POST /base/v1/models HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nAuthorization: Basic dXNlcjpwQHNz\r\n" in first  # user:p@ss
    assert b"\r\nAuthorization: Bearer k\r\n" in second and b"Basic" not in second


async def test_a_header_with_a_line_break_is_refused(serve: Callable, upstream: Upstream) -> None:
    raw, origin = await serve()
    with pytest.raises(ValueError, match="line break"):
        await upstream.send("POST", origin, "/", b"", CIMultiDict([("X-A", "1\r\nX-Injected: 2")]), 5.0)
    assert raw.connections == 0


async def test_a_released_connection_is_kept_alive_until_it_is_old(
    serve: Callable, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, origin = await serve()
    for _ in range(3):
        answer = await upstream.send("POST", origin, "/v1/completions", b"{}", HEADERS, 5.0)
        assert await _body(answer) == b"{}"
        answer.release()
    assert (len(raw.requests), raw.connections) == (3, 1)
    monkeypatch.setattr(client, "KEEPALIVE_S", 0.05)
    await asyncio.sleep(0.1)  # idle longer than the keep-alive: closed rather than reused
    (await upstream.send("POST", origin, "/v1/completions", b"{}", HEADERS, 5.0)).release()
    assert raw.connections == 2


async def test_idle_connections_are_closed_by_the_sweep_and_at_close(
    serve: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw, origin = await serve()
    monkeypatch.setattr(client, "KEEPALIVE_S", 0.1)
    upstream = Upstream()
    answer = await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)
    await _body(answer)
    answer.release()
    await asyncio.wait_for(raw.closed.wait(), 2)  # nothing used it: the sweep closed it
    answer = await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)
    await _body(answer)
    answer.release()
    raw.closed.clear()
    await upstream.close()
    await asyncio.wait_for(raw.closed.wait(), 2)
    with pytest.raises(NoConnection, match="stopping"):
        await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)


@pytest.mark.parametrize(
    ("parts", "then_close", "body"),
    [
        (
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"3\r\nabc\r\n", b"2\r\nde\r\n0\r\n\r\n"),
            False,
            b"abcde",
        ),
        ((b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil", b" the end"), True, b"until the end"),
        ((b"HTTP/1.1 204 No Content\r\n\r\n",), False, b""),
        ((b"HTTP/1.1 100 Continue\r\n\r\n", ANSWER), False, b"{}"),
    ],
    ids=["chunked", "until-close", "no-content", "interim-answer"],
)
async def test_every_body_framing_is_read_to_its_end(
    serve: Callable, upstream: Upstream, parts: tuple[bytes, ...], then_close: bool, body: bytes
) -> None:
    _, origin = await serve(_writes(*parts, then_close=then_close))
    answer = await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)
    assert await _body(answer) == body
    assert await answer.read_any() == b""  # and stays ended
    answer.release()


@pytest.mark.parametrize(
    ("parts", "then_close"),
    [
        ((b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",), True),
        ((b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", b"zz\r\nbad\r\n"), False),
    ],
    ids=["closed-mid-body", "bad-chunk-size"],
)
async def test_a_body_cut_short_fails_its_read(
    serve: Callable, upstream: Upstream, parts: tuple[bytes, ...], then_close: bool
) -> None:
    raw, origin = await serve(_writes(*parts, then_close=then_close))
    answer = await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)
    with pytest.raises(Dropped):
        await _body(answer)
    answer.release()
    (await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)).close()
    assert raw.connections == 2  # the broken connection was not reused


async def test_an_answer_released_before_its_end_closes_its_connection(serve: Callable, upstream: Upstream) -> None:
    raw, origin = await serve(_writes(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"))
    answer = await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)
    assert await answer.read_any() == b"abc"
    answer.release()
    await asyncio.wait_for(raw.closed.wait(), 2)  # the replica sees it, and aborts the request


async def test_a_closed_answer_fails_a_waiting_read(serve: Callable, upstream: Upstream) -> None:
    raw, origin = await serve(_writes(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"))
    answer = await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)
    assert await answer.read_any() == b"abc"
    reading = asyncio.create_task(answer.read_any())
    await asyncio.sleep(0.05)
    answer.close()  # as the silence watch cuts an attempt
    with pytest.raises(Dropped):
        await reading
    await asyncio.wait_for(raw.closed.wait(), 2)


async def test_a_body_nobody_reads_holds_its_replica_back(serve: Callable, upstream: Upstream) -> None:
    size = 32 << 20
    drained = asyncio.Event()

    async def big(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()
        drained.set()

    _, origin = await serve(big)
    answer = await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)
    await asyncio.sleep(0.3)
    assert not drained.is_set()  # the socket was paused: the replica waits, the gateway does not buffer it all
    assert len(await _body(answer)) == size
    await asyncio.wait_for(drained.wait(), 2)
    answer.release()


async def test_a_reset_after_sending_is_dropped(serve: Callable, upstream: Upstream) -> None:
    _, origin = await serve(_reset)
    with pytest.raises(Dropped):
        await upstream.send("POST", origin, "/v1/completions", b"{}", HEADERS, 5.0)


async def test_an_answer_that_does_not_parse_is_dropped(serve: Callable, upstream: Upstream) -> None:
    _, origin = await serve(_writes(b"NOT HTTP AT ALL\r\n\r\n"))
    with pytest.raises(Dropped, match="does not parse"):
        await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)


async def test_no_listener_is_no_connection(upstream: Upstream) -> None:
    with socket.socket() as unused:  # bound, never listening: a connect is refused
        unused.bind(("127.0.0.1", 0))
        origin = f"http://127.0.0.1:{unused.getsockname()[1]}"
        with pytest.raises(NoConnection, match="ConnectionRefusedError") as raised:
            await upstream.send("POST", origin, "/", b"{}", HEADERS, 5.0)
    assert not raised.value.timed_out


async def test_a_connect_that_hangs_times_out(upstream: Upstream) -> None:
    with socket.socket() as full:  # a listener whose accept queue is full drops new SYNs: a connect hangs
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        address = full.getsockname()
        queued = [socket.create_connection(address, timeout=1)]  # the one place a backlog of 0 leaves
        try:
            with pytest.raises(NoConnection) as raised:
                await upstream.send("POST", f"http://127.0.0.1:{address[1]}", "/", b"{}", HEADERS, 0.2)
        finally:
            for sock in queued:
                sock.close()
    assert raised.value.timed_out


async def test_a_cancelled_send_drops_its_connection(serve: Callable, upstream: Upstream) -> None:
    raw, origin = await serve(_stall)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await upstream.send("POST", origin, "/v1/completions", b"{}", HEADERS, 5.0)
    await asyncio.wait_for(raw.closed.wait(), 5)  # the replica sees the connection close


async def test_bytes_after_the_answer_end_its_connection(serve: Callable, upstream: Upstream) -> None:
    raw, origin = await serve(_writes(ANSWER + ANSWER))  # a second answer to one request
    answer = await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)
    assert await _body(answer) == b"{}"  # the first, whole
    answer.release()
    (await upstream.send("POST", origin, "/", b"", HEADERS, 5.0)).close()
    assert raw.connections == 2


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl, Debian's): (certificate, key)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


async def _tls_server(cert: Path, key: Path) -> tuple[asyncio.Server, str]:
    raw = _Raw(_writes(ANSWER))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = await asyncio.start_server(raw.serve, "127.0.0.1", 0, ssl=context)
    return server, f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_an_https_replica_is_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verified against the system's trust store, as aiohttp's default was: trusted here through SSL_CERT_FILE
    (OpenSSL reads it when the client's context is made, at its first https connection)."""
    cert, key = _certificate(tmp_path)
    server, origin = await _tls_server(cert, key)
    try:
        untrusting = Upstream()
        with pytest.raises(NoConnection, match="SSLCertVerificationError"):
            await untrusting.send("POST", origin, "/", b"{}", HEADERS, 5.0)
        await untrusting.close()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        trusting = Upstream()
        answer = await trusting.send("POST", origin, "/", b"{}", HEADERS, 5.0)
        assert (answer.status, await _body(answer)) == (200, b"{}")
        answer.release()
        await trusting.close()
    finally:
        server.close()

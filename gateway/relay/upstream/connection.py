"""One keep-alive HTTP/1.1 connection to a replica, and the answer it is reading.

The answer is parsed by llhttp (through httptools, the parser uvicorn uses): status, headers, Content-Length
or chunked bodies, keep-alive, all in C; what is left in Python is a handful of callbacks per answer and a
buffer of body pieces. That buffer pauses the socket once more than `_HIGH_WATER` bytes wait for a reader
that is behind (a slow client), and resumes it once read, so memory per answer stays bounded.

A connection serves one exchange at a time. Once an answer ends (`on_message_complete`) and its replica
keeps the connection alive, `UpstreamAnswer.release` hands it back to its pool; anything else — an answer
not read to its end, a parse error, bytes arriving while idle — closes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import httptools

_HIGH_WATER = 1 << 16  # body bytes buffered before the socket is paused (asyncio's and uvloop's write default)


class UpstreamFailure(Exception):
    """A replica's answer failed at the transport; its message says how, without an address."""


class NoConnection(UpstreamFailure):
    """No connection was made (refused, unreachable, name not found, TLS, timed out): the request never left."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class Dropped(UpstreamFailure):
    """The request was sent, then the connection closed, broke or carried an answer that does not parse,
    before the answer's end."""


class UpstreamAnswer:
    """A replica's answer: status, reason and headers, and its body read piece by piece (`read_any`).

    End it with `release()` (the connection goes back to its pool if the body was read to its end) or
    `close()` (the connection is dropped: the replica sees it and aborts the request).

    Its headers stay as llhttp gave them (`raw_headers`, bytes): the relay builds the client's headers from
    them in one pass (`gateway.relay.headers.passed_on`); only the three the client itself reads are
    decoded here."""

    __slots__ = (
        "status",
        "reason",
        "raw_headers",
        "content_type",
        "content_length",
        "_framed",
        "_connection",
        "_pieces",
        "_size",
        "_waiter",
        "_ended",
        "_error",
    )

    def __init__(
        self, connection: UpstreamConnection, status: int, reason: str, raw_headers: list[tuple[bytes, bytes]]
    ) -> None:
        self.status, self.reason, self.raw_headers = status, reason, raw_headers
        self.content_type = ""
        self.content_length: int | None = None
        self._framed = False  # a Content-Length or a Transfer-Encoding says where the body ends
        for name, value in raw_headers:
            lower = name.lower()
            if lower == b"content-type":
                self.content_type = value.decode("latin-1")
            elif lower == b"content-length":
                self._framed = True
                self.content_length = int(value) if value.isdigit() else None
            elif lower == b"transfer-encoding":
                self._framed = True
        self._connection: UpstreamConnection | None = connection
        self._pieces: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._error: UpstreamFailure | None = None

    @property
    def until_eof(self) -> bool:
        """The body runs to the connection's close: no Content-Length, not chunked (HTTP/1.1's last resort)."""
        return not self._framed

    async def read_any(self) -> bytes:
        """The body bytes that came since the last read, waiting for some; b"" once the body has ended.
        Raises `Dropped` once the connection broke (or was closed) before the body's end."""
        while not self._pieces:
            if self._error is not None:
                raise self._error
            if self._ended:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        pieces = self._pieces
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        if self._size > _HIGH_WATER and self._connection is not None:
            self._connection.resume()
        self._size = 0
        return data

    def release(self) -> None:
        """The exchange is over: a connection whose answer ended goes back to its pool, any other is closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            if self._ended and self._error is None:
                connection.exchange_done()
            else:
                connection.abort()

    def close(self) -> None:
        """Drop the connection now; a read waiting or to come raises `Dropped` unless the body had ended."""
        if not self._ended:
            self.fail(Dropped("the answer was closed before its end"))
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abort()

    def feed(self, piece: bytes) -> None:
        self._pieces.append(piece)
        self._size += len(piece)
        if self._size > _HIGH_WATER and self._connection is not None:
            self._connection.pause()
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def fail(self, error: UpstreamFailure) -> None:
        if not self._ended and self._error is None:
            self._error = error
            self._pieces.clear()
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class UpstreamConnection(asyncio.Protocol):
    """The protocol of one connection to a replica; `exchange` sends a request on it and waits for the
    answer's headers. `on_idle` is called when a finished exchange leaves it reusable."""

    def __init__(
        self, on_idle: Callable[[UpstreamConnection], None], on_lost: Callable[[UpstreamConnection], None]
    ) -> None:
        self._on_idle, self._on_lost = on_idle, on_lost
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self.idle_since = 0.0  # loop time it went back to its pool
        # the exchange in progress
        self._headers_ready: asyncio.Future[UpstreamAnswer] | None = None
        self._answer: UpstreamAnswer | None = None
        self._reason = b""
        self._header_list: list[tuple[bytes, bytes]] = []
        self._complete = False
        self._keep_alive = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        if self._headers_ready is None and self._answer is None:
            self.abort()  # bytes while idle: nothing asked for them, and the next answer cannot be trusted
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            self._broke(exc.__context__ if isinstance(exc.__context__, Dropped) else Dropped(str(exc)))
        except httptools.HttpParserUpgrade:
            self._broke(Dropped("the replica switched protocols"))
        except httptools.HttpParserError as exc:
            self._broke(Dropped(f"the replica's answer does not parse: {exc}"))

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost says what that means for the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        answer = self._answer
        if answer is not None and exc is None and not self._complete and answer.until_eof:
            answer.end()  # neither a length nor chunks: the body is all that came before the close
        else:
            reason = f"the connection closed: {type(exc).__name__}" if exc is not None else "the connection closed"
            self._broke(Dropped(reason))
        self._on_lost(self)

    # httptools' callbacks

    def on_message_begin(self) -> None:
        if self._complete:  # a second answer to one request: the connection cannot be trusted
            raise Dropped("the replica sent more than one answer")

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_list.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue): the real one follows on the same connection
            self._reason, self._header_list = b"", []
            return
        self._answer = UpstreamAnswer(self, status, self._reason.decode("latin-1"), self._header_list)
        ready = self._headers_ready
        if ready is not None and not ready.done():
            ready.set_result(self._answer)

    def on_body(self, body: bytes) -> None:
        if self._answer is not None:
            self._answer.feed(body)

    def on_message_complete(self) -> None:
        if self._answer is None:  # the interim answer's end
            return
        self._complete, self._keep_alive = True, self._parser.should_keep_alive()
        self._answer.end()

    # the exchange

    async def exchange(self, request: bytes) -> UpstreamAnswer:
        """Write `request` (head and body, whole) and wait for the answer's headers."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise Dropped("the connection closed before the request was sent")
        ready: asyncio.Future[UpstreamAnswer] = asyncio.get_running_loop().create_future()
        self._headers_ready = ready
        self._answer, self._reason, self._header_list, self._complete = None, b"", [], False
        transport.write(request)
        try:
            return await ready
        except BaseException:  # a failure, or cancelled (the silence watch, the client gone): drop it
            self.abort()
            raise
        finally:
            self._headers_ready = None

    def exchange_done(self) -> None:
        """Its answer ended and was released: back to the pool if both sides keep it alive."""
        self._answer = None
        if self._keep_alive and self._transport is not None and not self._transport.is_closing():
            self._on_idle(self)
        else:
            self.abort()

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()  # connection_lost follows, in a later turn of the loop

    def _broke(self, error: Dropped) -> None:
        """Fail the exchange in progress (its headers' wait or its body's reads) and drop the connection."""
        ready = self._headers_ready
        if ready is not None and not ready.done():
            ready.set_exception(error)
        if self._answer is not None:
            self._answer.fail(error)
        self.abort()

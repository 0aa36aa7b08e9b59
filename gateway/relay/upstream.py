"""The upstream send: one request to a replica up to its response headers, on aiohttp's own primitives.

Why not `ClientSession.request`: per request it costs about a sixth of the gateway's CPU (a py-spy profile of
bench.hop), most of it for features the gateway never uses on this session: the total-timeout timer
contexts, trace hooks, the cookie jar, redirects, proxy and netrc look-ups, middlewares, a `ClientRequest`
that rebuilds the headers and works out the auto headers, and a task to write the body in. `Upstream.send`
keeps the parts the gateway relies on and does the rest once per replica:

- the session's connector hands out the connection (`TCPConnector.connect`), so keep-alive, the pool shared
  with the session's other calls and the connect timeout (`ClientTimeout.sock_connect`) are aiohttp's own;
  its key comes from one `ClientRequest` per replica origin, built once;
- the request goes out with aiohttp's `StreamWriter`: the same bytes `ClientSession.request` writes for the
  session `gateway.serving.app` builds (Host first, then the caller's headers, the auto headers the session
  does not skip, Content-Length; tested byte for byte), headers and body in one write, without a task;
- the answer is aiohttp's own `ClientResponse`, started on the connection as `ClientSession.request` starts
  it: released to the pool at the end of its body or by `release()`, dropped by `close()`;
- failures are aiohttp's, mapped as `ClientSession.request` maps them: `ConnectionTimeoutError` for a connect
  timeout, `ClientConnectorError` for no connection, a `ClientError` (`ClientOSError` for a bare `OSError`)
  once the request was sent; a cancellation (the relay's silence watch) closes the connection.

A body over `INLINE_BODY_MAX` goes through `ClientSession.request` instead: writing it could fill the socket,
and aiohttp then writes it in a task while the answer is read (a replica may answer before it has read all
of it). A small one cannot: headers and body fit under the transport's high-water mark, so nothing waits.

The session must be one this send behaves the same as: `Upstream` refuses one with default headers, trace
configs, middlewares, cookies, a base URL, a proxy, auth, raise_for_status, force_close or a version other
than HTTP/1.1 (`_unlike_request`).
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import ClientResponse, ClientTimeout, RequestInfo, hdrs
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.helpers import EMPTY_BODY_METHODS, TimerNoop
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11, StreamWriter
from aiohttp.tracing import Trace
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

INLINE_BODY_MAX = 1 << 15  # with its headers under the 64 KiB high-water mark of asyncio's and uvloop's transports

_ORIGINS_MAX = 256
_NO_TIMER = TimerNoop()  # the session has no total timeout: aiohttp's timer for that case
_NO_TRACES: list[Trace] = []  # the session has no trace configs (read, never changed, by aiohttp)


def _unlike_request(session: aiohttp.ClientSession) -> list[str]:
    """The session's settings `ClientSession.request` would apply and `Upstream.send` does not."""
    connector = session.connector
    checks = {
        "default headers": bool(session.headers),
        "trace configs": bool(session.trace_configs),
        "middlewares": bool(session._middlewares),
        "a cookie jar": not isinstance(session.cookie_jar, aiohttp.DummyCookieJar),
        "a base URL": session._base_url is not None,
        "a proxy": session._default_proxy is not None or session.trust_env,
        "auth": session.auth is not None,
        "raise_for_status": session.raise_for_status is not False,
        "force_close": connector is None or connector.force_close,
        "a version other than HTTP/1.1": session.version != HttpVersion11,
    }
    return [name for name, differs in checks.items() if differs]


class Upstream:
    """Sends requests to replicas on one session's connections (module docstring: why not its `request`)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        if unlike := _unlike_request(session):
            raise ValueError(f"the lean upstream send does not apply the session's {', '.join(unlike)}")
        assert session.connector is not None  # _unlike_request refused a session without one
        self._session, self._connector = session, session.connector
        skipped = session.skip_auto_headers
        # what ClientRequest adds when the caller did not, unless skipped: Accept, Accept-Encoding, User-Agent;
        # after Content-Length, its body's type
        self._auto = [
            (name, value)
            for name, value in (*ClientRequest.DEFAULT_HEADERS.items(), (hdrs.USER_AGENT, SERVER_SOFTWARE))
            if name not in skipped
        ]
        self._body_type = hdrs.CONTENT_TYPE not in skipped
        self._origins: dict[str, ClientRequest] = {}  # by origin: the request the connector keys connections by

    async def send(
        self, method: str, origin: str, target: str, body: bytes, headers: CIMultiDict[str], timeout: ClientTimeout
    ) -> ClientResponse:
        """`method` `origin + target` with `body` and `headers` (none of Host, Content-Length, Transfer-Encoding:
        the send sets them), up to the response headers; the body is the caller's to read, then `release()`
        (or `close()`) the response. `timeout`'s connect parts and `sock_read` apply, not its total (the gateway's
        is None: the relay's silence watch bounds an attempt)."""
        if len(body) > INLINE_BODY_MAX:
            return await self._session.request(
                method, origin + target, data=body, headers=headers, timeout=timeout, allow_redirects=False
            )
        if self._session.closed:
            raise RuntimeError("Session is closed")
        url = URL(origin + target)
        key = self._origins.get(origin)
        if key is None:
            key = self._origin(origin)
        out = CIMultiDict([(hdrs.HOST, key.headers[hdrs.HOST])])
        out.extend(headers)
        for name, value in self._auto:
            if name not in out:
                out[name] = value
        out[hdrs.CONTENT_LENGTH] = str(len(body))
        if self._body_type and hdrs.CONTENT_TYPE not in out:
            out[hdrs.CONTENT_TYPE] = "application/octet-stream"
        try:
            try:
                conn = await self._connector.connect(key, traces=_NO_TRACES, timeout=timeout)
            except TimeoutError as exc:
                raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {url}") from exc
            return await self._exchange(conn, method, url, out, body, timeout)
        except aiohttp.ClientError:
            raise
        except OSError as exc:  # as ClientSession.request: a bare OSError is a ClientOSError, a timeout is not
            if exc.errno is None and isinstance(exc, TimeoutError):
                raise
            raise aiohttp.ClientOSError(*exc.args) from exc

    def _origin(self, origin: str) -> ClientRequest:
        if len(self._origins) >= _ORIGINS_MAX:  # replicas come and go (reloads, discovery): keep the live ones
            self._origins.clear()
        key = ClientRequest(hdrs.METH_GET, URL(origin), loop=asyncio.get_running_loop(), session=self._session)
        self._origins[origin] = key
        return key

    async def _exchange(
        self,
        conn: Connection,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        body: bytes,
        timeout: ClientTimeout,
    ) -> ClientResponse:
        """Write the request on `conn` and read the response headers; `conn` is closed on any failure."""
        session, loop = self._session, asyncio.get_running_loop()
        try:
            protocol = conn.protocol
            assert protocol is not None
            protocol.set_response_params(
                timer=_NO_TIMER,
                skip_payload=method in EMPTY_BODY_METHODS,
                read_until_eof=True,
                auto_decompress=session.auto_decompress,
                read_timeout=timeout.sock_read,
                read_bufsize=session._read_bufsize,
                timeout_ceil_threshold=self._connector._timeout_ceil_threshold,
                max_line_size=session._max_line_size,
                max_field_size=session._max_field_size,
                max_headers=session._max_headers,
            )
            writer = StreamWriter(protocol, loop)
            await writer.write_headers(f"{method} {url.raw_path_qs} HTTP/1.1", headers)
            await writer.write_eof(body)  # headers and body in one write; the body is small: nothing waits
            protocol.start_timeout()
            response = ClientResponse(
                method,
                url,
                writer=None,
                continue100=None,
                timer=_NO_TIMER,
                request_info=RequestInfo(url, method, CIMultiDictProxy(headers), url),
                traces=_NO_TRACES,
                loop=loop,
                session=session,
                stream_writer=writer,
            )
            try:
                return await response.start(conn)
            except BaseException:
                response.close()
                raise
        except BaseException:  # cancellation included: the replica sees the connection drop
            conn.close()
            raise

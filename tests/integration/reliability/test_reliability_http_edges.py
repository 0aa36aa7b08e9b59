"""Hostile HTTP over one keep-alive connection, against real processes: encoded bodies, Expect, bad
methods, header bytes. Every answer is a 4xx in the OpenAI shape (or a 200), and the same connection
serves the next request unless the answer said `Connection: close`."""

from __future__ import annotations

import gzip
import socket
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.integration.gateway_procs import MODEL, Gateway, pool, running, start_gateway, start_stub
from tests.integration.reliability.test_reliability_fuzz_wire import Conn as WireConn  # reads chunked answers
from tests.integration.reliability_tools import eventually
from tests.upstream import FakeReplica, ThreadServer

pytestmark = pytest.mark.timeout(60)
BODY = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running() as track:
        stub = track(start_stub("edge"))
        yield track(
            start_gateway(
                tmp_path_factory.mktemp("edges"), {MODEL: pool(("edge", stub.url))}, limits={"max_body_bytes": 4096}
            )
        )


class Conn:
    """One client connection, read by hand: status, headers and body of each answer."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""

    def send(self, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        self.sock.sendall(head + body)
        while b"\r\n\r\n" not in self.buf:
            self._more()
        raw_head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw_head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            self._more()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(lines[0].split()[1]), headers, body

    def _more(self) -> None:
        part = self.sock.recv(65536)
        assert part, "connection closed without an answer"
        self.buf += part


def post(body: bytes, *extra: str, path: str = "/v1/chat/completions", method: str = "POST") -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: gw",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


CASES = {
    # name: (body, Content-Encoding, expected status)
    "gzip body": (gzip.compress(BODY), "gzip", 200),
    "deflate body": (zlib.compress(BODY), "deflate", 200),
    "raw deflate body": (_raw_deflate(BODY), "deflate", 200),
    "plain body marked gzip": (BODY, "gzip", 400),
    "plain body marked deflate": (BODY, "deflate", 400),
    "truncated gzip": (gzip.compress(BODY)[:-6], "gzip", 400),
    "br body": (b"\x0b\x02\x80{}\x03", "br", 415),
    "zstd body": (b"(\xb5/\xfd\x00X\x11\x00\x00{}", "zstd", 415),
    "gzip bomb": (gzip.compress(b" " * 100_000), "gzip", 413),
}


@pytest.mark.parametrize("name", list(CASES))
def test_encoded_bodies_then_the_connection_is_reused(gateway: Gateway, name: str) -> None:
    """gzip/deflate are decoded and forwarded decoded (the stub answers 200); others get 4xx JSON."""
    body, coding, expected = CASES[name]
    conn = Conn(gateway.port)
    with conn.sock:  # closed here, not by the garbage collector
        status, headers, answer = conn.send(post(body, f"Content-Encoding: {coding}"), body)
        assert status == expected, answer[:300]
        _assert_json(status, headers, answer)
        _assert_reusable(conn, headers)


HEADS = {
    "unknown Expect": (post(BODY, "Expect: fancy"), BODY, 417),
    "invalid method": (b"P\x01ST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\r\n", b"", 400),
    "bad request line": (b"GARBAGE\r\n\r\n", b"", 400),
    "oversized Content-Length": (post(b"x" * 100_000), b"x" * 5000, 413),
    "non-UTF-8 request id": (post(BODY, "X-Request-Id: caf\xe9\xff"), BODY, 200),
    "non-UTF-8 session id and other header": (post(BODY, "X-Session-ID: \xff\xfe", "X-Other: \xe9"), BODY, 200),
}


@pytest.mark.parametrize("name", list(HEADS))
def test_aiohttp_level_errors_are_openai_shaped(gateway: Gateway, name: str) -> None:
    head, body, expected = HEADS[name]
    conn = Conn(gateway.port)
    with conn.sock:  # closed here, not by the garbage collector
        status, headers, answer = conn.send(head, body)
        assert status == expected, answer[:300]
        _assert_json(status, headers, answer)
        if expected == 200:
            assert headers["x-request-id"].isascii() and headers["x-request-id"].isprintable()
        _assert_reusable(conn, headers)
        assert gateway.proc.alive()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_non_utf8_request_id_is_replaced_and_logged(gateway: Gateway, stream: bool) -> None:
    """A stream too ends with [DONE] (it was cut unterminated) and its request log line is written."""
    body = orjson.dumps({**orjson.loads(BODY), "stream": stream})
    conn = WireConn(gateway.port)
    with conn.sock:  # closed here, not by the garbage collector
        conn.sock.sendall(post(body, "X-Request-Id: id-\xff", "X-Session-ID: s") + body)
        status, headers, answer = conn.response()
        assert status == 200
        assert answer.endswith(b"data: [DONE]\n\n") if stream else answer.startswith(b'{"id"'), answer[-200:]
        rid = headers[b"x-request-id"].decode()
        assert rid.isascii() and rid.isprintable()
        # the request's log line is written once its answer has gone (gateway.request.observers)
        eventually(lambda: f'"request_id":"{rid}"' in gateway.proc.output(), timeout_s=5)


def _assert_json(status: int, headers: dict[str, str], answer: bytes) -> None:
    assert headers.get("content-type", "").startswith("application/json"), (headers, answer[:200])
    if status >= 400:
        error = orjson.loads(answer)["error"]
        assert error["code"] == status and error["message"] and error["type"]


def _assert_reusable(conn: Conn, headers: dict[str, str]) -> None:
    """The same connection answers a valid request next, unless the server said it would close."""
    if headers.get("connection", "").lower() == "close":
        return
    status, _, answer = conn.send(post(BODY), BODY)
    assert status == 200, answer[:300]


LEAKY = {
    "Server": "replica/1.0",
    "Set-Cookie": "session=secret",
    "X-Debug-Trace": "internal",
    "X-Replica-Id": "own-id",
    "X-Affinity-Reason": "forged",
}


@pytest.mark.parametrize("ids", [True, False], ids=["ids-on", "ids-off"])
def test_replica_response_headers_do_not_leak(tmp_path: Path, ids: bool) -> None:
    """Server, Set-Cookie and the configured deny list are stripped; the gateway's X-Replica-Id wins, and
    both id headers can be turned off (`headers.replica_id`, `headers.affinity_reason`). The replica's
    cookie is not kept by the gateway's client either: no later request carries it to a replica."""
    replica = FakeReplica("fake", headers=LEAKY)
    with ThreadServer(replica.app) as url, running() as track:
        gateway = track(
            start_gateway(
                tmp_path,
                {MODEL: pool(("gateway-name", url.replace("127.0.0.1", "localhost")))},  # a name keeps cookies
                headers={"drop_response": ["x-debug-trace"], "replica_id": ids, "affinity_reason": ids},
            )
        )
        resp = httpx.post(f"{gateway.url}/v1/chat/completions", content=BODY, timeout=10)
        assert httpx.post(f"{gateway.url}/v1/chat/completions", content=BODY, timeout=10).status_code == 200
    assert [seen.headers.get("Cookie") for seen in replica.seen] == [None, None]
    assert resp.status_code == 200 and resp.headers["X-Custom"] == "kept"
    assert "replica" not in resp.headers.get("Server", "") and "Set-Cookie" not in resp.headers
    assert "X-Debug-Trace" not in resp.headers
    assert resp.headers.get("X-Replica-Id") == ("gateway-name" if ids else None)
    assert resp.headers.get("X-Affinity-Reason") == ("round_robin" if ids else None)

"""Fuzzing what httpx cannot send: deep JSON, encoded bodies and raw header bytes, and
test_reliability_fuzz's bodies and headers (Expect, Transfer-Encoding, Connection among them) on
every API path, each followed by a second request on the same keep-alive connection.

A raw socket speaks HTTP/1.1, so header values may hold any byte but CR/LF. For every case: an
answer below 500 within the socket timeout (no hang), the OpenAI error shape on every 4xx, and
the connection either serves the next request or the answer said `Connection: close`.
FUZZ_EXAMPLES sets the number of cases (the same variable as test_reliability_fuzz).
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import zlib
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.gateway_procs import MODEL, Gateway
from tests.integration.reliability.test_reliability_fuzz import (  # noqa: F401 (the module's gateway)
    FUZZ,
    _dump,
    gateway,
    rss_kb,
)
from tests.integration.reliability.test_reliability_fuzz import body as json_body
from tests.integration.reliability.test_reliability_fuzz import headers as http_headers
from tests.integration.reliability.test_reliability_fuzz import path as api_path

pytestmark = pytest.mark.timeout(3600)  # FUZZ_EXAMPLES=10000 runs long; the default 300 takes seconds
WIRE = settings(FUZZ, max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")))
STATUSES: Counter[str] = Counter()
RSS_KB: list[int] = []  # the gateway's RSS after the warm-up cases (the report adds the last)
MAX_RSS_GROWTH_KB = 16 * 1024


PLACEHOLDER = "__nested__"


def _nest(depth: int, leaf: bytes, as_dict: bool) -> bytes:
    """JSON text nested `depth` levels, written by hand: encoders refuse the deepest ones."""
    opening, closing = (b'{"a":', b"}") if as_dict else (b"[", b"]")
    return opening * depth + leaf + closing * depth


WHERE = ["content", "tools", "tool_calls", "content_part"]


def nested_body(where: str, nested: bytes) -> bytes:
    """A chat body with `nested` (JSON text) in one of WHERE's places."""
    message: dict[str, Any] = {"role": "user", "content": "hi"}
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "messages": [message]}
    if where == "content":
        message["content"] = PLACEHOLDER
    elif where == "content_part":
        message["content"] = [{"type": "text", "text": PLACEHOLDER}]
    elif where == "tools":
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": PLACEHOLDER}}]
    else:
        body["messages"].append(
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": PLACEHOLDER}}],
            }
        )
    return json.dumps(body).encode().replace(f'"{PLACEHOLDER}"'.encode(), nested)


@st.composite
def deep_body(draw: st.DrawFn) -> bytes:
    """A chat body with one field nested 1..1100 levels (orjson reads 1024, writes 254)."""
    nested = _nest(draw(st.integers(1, 1100)), draw(st.sampled_from([b'"x"', b"1", b"null"])), draw(st.booleans()))
    return nested_body(draw(st.sampled_from(WHERE)), nested)


@st.composite
def encoded_body(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(body, Content-Encoding): valid and broken gzip/deflate, br/zstd/identity/unknown codings."""
    plain = json.dumps({"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
    coding = draw(
        st.sampled_from(
            [b"gzip", b"x-gzip", b"deflate", b"br", b"zstd", b"identity", b"gzip, identity", b"GZIP", b"compress", b""]
        )
    )
    how = draw(st.sampled_from(["gzip", "zlib", "raw_deflate", "plain", "truncated", "trailing", "junk"]))
    if how == "gzip":
        data = gzip.compress(plain)
    elif how == "zlib":
        data = zlib.compress(plain)
    elif how == "raw_deflate":
        packer = zlib.compressobj(wbits=-15)
        data = packer.compress(plain) + packer.flush()
    elif how == "plain":
        data = plain
    elif how == "truncated":
        data = gzip.compress(plain)[: draw(st.integers(0, 20))]
    elif how == "trailing":
        data = gzip.compress(plain) + draw(st.binary(min_size=1, max_size=20))
    else:
        data = draw(st.binary(max_size=200))
    return data, coding


header_bytes = st.binary(max_size=80).map(lambda b: b.replace(b"\r", b"\x01").replace(b"\n", b"\x02"))
header_name = st.sampled_from(
    [
        b"X-Request-Id",
        b"X-Session-ID",
        b"User-Agent",
        b"Content-Type",
        b"Accept",
        b"X-Custom",
        b"Authorization",
        b"Cookie",
    ]
)
case = st.one_of(
    st.tuples(st.just("depth"), deep_body(), st.just(b""), st.just({}), st.just(b"/v1/chat/completions")),
    st.tuples(
        st.just("encoding"),
        encoded_body().map(lambda e: e[0]),
        encoded_body().map(lambda e: e[1]),
        st.just({}),
        st.just(b"/v1/chat/completions"),
    ),
    st.tuples(
        st.just("header"),
        deep_body().filter(lambda b: len(b) < 3000) | st.just(b'{"model":"x"}'),
        st.just(b""),
        st.dictionaries(header_name, header_bytes, min_size=1, max_size=3),
        st.just(b"/v1/chat/completions"),
    ),
    # test_reliability_fuzz's bodies and headers (Expect, Transfer-Encoding, Connection...) on this socket
    st.tuples(
        st.just("body"),
        json_body.map(_dump),
        st.just(b""),
        http_headers.map(lambda h: {k.encode(): v.encode() for k, v in h.items()}),
        api_path.map(str.encode),
    ),
)
WARMUP = min(100, WIRE.max_examples // 5)  # cases before the RSS baseline: allocator and caches warm


def _request(target: bytes, body: bytes, headers: dict[bytes, bytes]) -> bytes:
    head = [b"POST " + target + b" HTTP/1.1", b"Host: gw", b"Content-Length: " + str(len(body)).encode()]
    if not any(name.lower() == b"content-type" for name in headers):
        head.append(b"Content-Type: application/json")
    head += [name + b": " + value for name, value in headers.items()]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class Conn:
    """One keep-alive connection with a minimal response reader (Content-Length or chunked)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)  # a hang fails on recv
        self.buf = b""

    def _more(self) -> bytes:
        part = self.sock.recv(65536)
        if not part:
            raise EOFError
        self.buf += part
        return part

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._more()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def response(self) -> tuple[int, dict[bytes, bytes], bytes]:
        status = 100
        while status < 200:  # an interim 100 Continue comes before the answer
            while b"\r\n\r\n" not in self.buf:
                self._more()
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines[1:])}
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while size := int(self._line().split(b";")[0], 16):
                body += self._take(size)
                self._take(2)
            self._line()
        else:
            body = self._take(int(headers.get(b"content-length", b"0")))
        return status, headers, body

    def close(self) -> None:
        self.sock.close()


def _openai_error(body: bytes) -> bool:
    try:
        error = orjson.loads(body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str) and isinstance(error.get("type"), str)


def _exchange(port: int, kind: str, target: bytes, content: bytes, sent: dict[bytes, bytes]) -> int:
    """One request on a fresh connection: below 500, a 4xx in the OpenAI shape, and the connection
    serves GET /health next unless the answer said Connection: close. Returns the status."""
    conn = Conn(port)
    try:
        conn.sock.sendall(_request(target, content, sent))
        try:
            status, answer_headers, answer = conn.response()
        except (EOFError, ConnectionResetError):
            pytest.fail(f"connection dropped without an answer: {kind} {target!r} {sent} {content[:200]!r}")
        assert status < 500, (kind, status, answer[:300], sent, content[:200])
        if 400 <= status < 500:
            assert _openai_error(answer), (kind, status, answer[:300])
        if answer_headers.get(b"connection", b"").lower() != b"close":
            conn.sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
            try:
                again, _, _ = conn.response()
            except (EOFError, ConnectionResetError):
                pytest.fail(f"keep-alive dropped without Connection: close after {kind} {status}")
            assert again == 200
        return status
    finally:
        conn.close()


@WIRE
@given(case)
def test_wire_fuzz_no_5xx_openai_errors_and_keepalive_kept(
    gateway: Gateway,  # noqa: F811
    one: tuple[str, bytes, bytes, dict[bytes, bytes], bytes],
) -> None:
    kind, content, coding, extra, target = one
    if sum(STATUSES.values()) == WARMUP:
        RSS_KB.append(rss_kb(gateway))
    sent = {**extra, **({b"Content-Encoding": coding} if coding else {})}
    STATUSES[f"{kind}:{_exchange(gateway.port, kind, target, content, sent)}"] += 1


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("depth", [255, 1100])
def test_bodies_past_orjson_depths_get_400_on_a_kept_connection(
    gateway: Gateway,  # noqa: F811
    where: str,
    depth: int,
) -> None:
    """Past orjson's write depth (the prefix rendering of prefix_affinity) and past its read depth."""
    for as_dict in (False, True):
        body = nested_body(where, _nest(depth, b'"x"', as_dict))
        assert _exchange(gateway.port, "depth", b"/v1/chat/completions", body, {}) == 400


def test_wire_fuzz_report(gateway: Gateway) -> None:  # noqa: F811
    """Runs after the fuzz test in this module: its figures, and the gateway still up and small."""
    assert gateway.proc.alive()
    after = rss_kb(gateway)
    print(
        f"\nRELIABILITY fuzz_wire: cases={sum(STATUSES.values())} statuses={dict(sorted(STATUSES.items()))} "
        f"rss_after_warmup_kb={RSS_KB[:1]} rss_after_kb={after}"
    )
    assert not RSS_KB or after - RSS_KB[0] < MAX_RSS_GROWTH_KB

"""Fuzzing the gateway's HTTP API with hypothesis: malformed bodies, headers and request heads.

A real gateway process (prefix_affinity, so every body is also hashed) in front of a real replica
stub. Every answer must be below 500, the gateway must stay up, and its resident memory must stay
flat. FUZZ_EXAMPLES sets the number of cases (default 1500, plus a fifth of that as raw heads).
"""

from __future__ import annotations

import os
import socket
import string
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from tests.integration.gateway_procs import MODEL, Gateway, running, start_gateway, start_stub
from tests.integration.reliability_tools import chat

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1500"))
pytestmark = pytest.mark.timeout(max(120, EXAMPLES // 20))  # ~30 s per 1500 cases on 2 busy cores
MAX_RSS_GROWTH_KB = 16 * 1024
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=40)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20,
)
message = st.one_of(
    json_value,
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "", "x"])},
        optional={"content": json_value, "name": json_value, "tool_calls": json_value, "tool_call_id": json_value},
    ),
)
body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just(MODEL), json_value),
        "messages": st.one_of(st.lists(message, max_size=6), json_value),
        "prompt": st.one_of(st.text(max_size=200), st.lists(st.integers(-5, 2**33), max_size=40), json_value),
        "stream": st.one_of(st.booleans(), json_value),
        "max_tokens": st.one_of(st.integers(-3, 8), json_value),
        "stream_options": json_value,
        "tools": json_value,
        "user": json_value,
        "prompt_cache_key": json_value,
        "cache_salt": json_value,
        "n": json_value,
        "temperature": json_value,
    },
)
header_name = st.text(string.ascii_letters + string.digits + "-", min_size=1, max_size=20)
header_value = st.text(string.printable.strip() + " ", max_size=300).map(str.strip)
headers = st.dictionaries(
    st.one_of(
        header_name,
        st.sampled_from(
            [
                "Content-Type",
                "X-Request-Id",
                "X-Session-ID",
                "Authorization",
                "Content-Encoding",
                "Transfer-Encoding",
                "Connection",
                "Expect",
            ]
        ),
    ),
    header_value,
    max_size=6,
)
path = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/admin/route/explain"])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running() as track:
        stub = track(start_stub("fuzzed", MODEL, 1000, "--max-model-len", "64"))
        pools = {MODEL: {"replicas": [{"url": stub.url, "name": "fuzzed"}], "routing": {"policy": "prefix_affinity"}}}
        yield track(
            start_gateway(
                tmp_path_factory.mktemp("fuzz"), pools, limits={"max_body_bytes": 65536}, logging={"requests": False}
            )
        )


def rss_kb(gateway: Gateway) -> int:
    status = Path(f"/proc/{gateway.proc.popen.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_fuzzed_requests_get_only_4xx_and_memory_stays_flat(gateway: Gateway) -> None:
    statuses: Counter[int] = Counter()
    with httpx.Client(base_url=gateway.url, timeout=10) as http:

        def send(target: str, content: bytes, extra: dict[str, str]) -> int:
            try:
                status = http.post(target, content=content, headers=extra).status_code
            except httpx.RemoteProtocolError:  # the server closed an unparseable request: fine, not a 5xx
                status = 0
            except httpx.LocalProtocolError:  # httpx itself refuses to send it (e.g. a bad Transfer-Encoding)
                reject()
            statuses[status] += 1
            assert status < 500, (target, content[:300], extra)
            return status

        @FUZZ
        @given(path, st.one_of(body.map(_dump), st.binary(max_size=300), json_value.map(_dump)), headers)
        def fuzz(target: str, content: bytes, extra: dict[str, str]) -> None:
            status = send(target, content, extra)
            if not _looks_valid(content):
                assert status == 0 or 400 <= status < 500, (status, content[:300])

        for i in range(200):  # warm up allocator, caches and connection pools before the baseline
            send("/v1/chat/completions", _dump({"model": MODEL if i % 2 else "x", "messages": [i]}), {})
        before = rss_kb(gateway)
        fuzz()
        after = rss_kb(gateway)
        assert http.post("/v1/chat/completions", json=chat(max_tokens=2)).status_code == 200
    assert gateway.proc.alive()
    print(
        f"\nRELIABILITY fuzz: cases={sum(statuses.values())} statuses={dict(sorted(statuses.items()))} "
        f"rss_before_kb={before} rss_after_kb={after}"
    )
    assert after - before < MAX_RSS_GROWTH_KB


@settings(max_examples=max(50, EXAMPLES // 5), deadline=None, database=None)
@given(st.binary(max_size=200), st.sampled_from([b"POST", b"GET", b"PUT", b"\x00", b"POST /v1/completions"]))
def test_fuzzed_request_heads_never_get_5xx(gateway: Gateway, junk: bytes, method: bytes) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(method + b" /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n" + junk + b"\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        head = b""
        try:
            while b"\r\n" not in head and (part := sock.recv(4096)):
                head += part
        except ConnectionResetError:
            head = b""
    if head:
        assert head.startswith(b"HTTP/1.") and head[9:10] != b"5", head[:200]
    assert gateway.proc.alive()


def _dump(value: Any) -> bytes:
    import orjson

    try:
        return orjson.dumps(value)
    except TypeError:  # integers beyond 64 bits: send them as text, still JSON
        import json

        return json.dumps(value).encode()


def _looks_valid(content: bytes) -> bool:
    """A JSON object naming the served model: may legitimately be answered (200) by the replica."""
    return content.startswith(b"{") and f'"model":"{MODEL}"'.encode() in content.replace(b" ", b"")

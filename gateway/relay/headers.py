"""Header sets for the proxy: what never crosses a hop, and what the gateway adds."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from multidict import CIMultiDict

from gateway.config.features import HeadersConfig

# RFC 9110 §7.6.1 connection-specific headers, plus framing the gateway's own connection re-does.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
    )
)
STREAM_CHUNKING = "X-Stream-Chunking"  # the client's opt-in to phrase chunking (gateway.relay.phrase_chunking)
# Bodies go on decoded (gateway.edge.encoding); the gateway's own request options are not the replica's business.
REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "content-encoding", STREAM_CHUNKING.lower()}
# The replica's identity and cookies are its own business; the gateway sets its own id headers.
RESPONSE_DROP = HOP_BY_HOP | {
    "content-length",
    "server",
    "set-cookie",
    "x-replica-id",
    "x-affinity-reason",
    "x-gateway-route",
}

REQUEST_ID = "X-Request-Id"
REPLICA_ID = "X-Replica-Id"
ROUTE_REASON = "X-Affinity-Reason"
ROUTE_EXPLAIN = "X-Gateway-Route"  # opt-in: routing.explain_header


def response_drop(config: HeadersConfig) -> frozenset[str]:
    """The replica's response headers never passed on: `RESPONSE_DROP` and the config's `drop_response`."""
    return _response_drop(config.dropped)


@lru_cache(maxsize=8)
def _response_drop(extra: frozenset[str]) -> frozenset[str]:
    return RESPONSE_DROP | extra


def filtered(
    headers: Mapping[str, str] | Iterable[tuple[str, str]], drop: frozenset[str] | set[str]
) -> CIMultiDict[str]:
    """Copy headers minus `drop` and minus any header the `Connection` header names. A copy of the whole
    multidict with the dropped names popped, in C, not a Python pass lowering every name (every proxied
    request's own headers go through it)."""
    out = CIMultiDict(headers)
    connection = out.getall("Connection", None)
    if connection is not None:
        drop = drop | {token.strip().lower() for value in connection for token in value.split(",")}
    for name in drop:
        out.popall(name, None)
    return out


def passed_on(raw: list[tuple[bytes, bytes]], drop: frozenset[str]) -> CIMultiDict[str]:
    """A replica's headers as llhttp gave them, minus `drop` and any its `Connection` header names, decoded
    once (names as Latin-1, values as aiohttp decodes them): one pass over the few an answer has, where a
    decoded copy then `filtered` would build the multidict twice and pop every name of `drop` from it."""
    pairs = [(name.decode("latin-1"), value.decode("utf-8", "surrogateescape")) for name, value in raw]
    named = [value for name, value in pairs if name.lower() == "connection"]
    if named:
        drop = drop | {token.strip().lower() for value in named for token in value.split(",")}
    return CIMultiDict([(name, value) for name, value in pairs if name.lower() not in drop])


_REQUEST_ID = re.compile(r"[!-~]{1,128}")  # visible ASCII: safe in every header, log line and metric label


def request_id(sent: str | None) -> str:
    """The client's X-Request-Id if it is 1-128 visible ASCII characters, else a fresh one: a request id
    with other bytes (non-UTF-8 ones arrive as surrogates) cannot be echoed in a response header. A fresh one
    is 128 random bits in hex, like `uuid4().hex` at a quarter of its cost (no UUID object per request)."""
    return sent if sent is not None and _REQUEST_ID.fullmatch(sent) else os.urandom(16).hex()

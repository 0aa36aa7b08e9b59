"""Request bodies sent with a Content-Encoding: decoded here, once, so every replica reads plain JSON.

The rule: `gzip` (`x-gzip`) and `deflate` bodies are decoded for parsing and forwarded decoded, without
the Content-Encoding header (the proxy sets a fresh Content-Length). `identity` is no encoding. Any other
coding (`br`, `zstd`, unknown names) is a 415, since no replica is promised to read it. A body that does
not decode (not gzip at all, truncated, trailing junk) is a 400. The decoded size is bounded by
`limits.max_body_bytes` too (413), so a small compressed body cannot expand without limit.

The HTTP server must not decode bodies itself (`auto_decompress=False`, see `gateway.serving.http_server`).
"""

from __future__ import annotations

import zlib

from gateway.errors import BadRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decode_body(content_encoding: str | None, raw: bytes, limit: int) -> bytes:
    """The body with every listed coding undone (the last applied first), or the error for the client."""
    if not content_encoding:
        return raw
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    codings = [c for c in codings if c and c != "identity"]
    for coding in codings:
        if coding not in _WBITS:
            raise UnsupportedMediaTypeError(
                f"Content-Encoding {coding!r} is not supported; send the body plain, gzip or deflate"
            )
    for coding in reversed(codings):
        raw = _inflate(raw, coding, limit)
    return raw


def _inflate(raw: bytes, coding: str, limit: int) -> bytes:
    try:
        return _inflate_with(raw, coding, _WBITS[coding], limit)
    except BadRequestError:
        if coding != "deflate":
            raise
        return _inflate_with(raw, coding, -zlib.MAX_WBITS, limit)  # raw deflate without the zlib header: some
        # clients send it for `deflate` (aiohttp and browsers accept both)


def _inflate_with(raw: bytes, coding: str, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise BadRequestError(f"request body is not valid {coding} data: {exc}") from None
    if len(out) > limit:
        raise PayloadTooLargeError(f"decoded request body exceeds the limit of {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise BadRequestError(f"request body is not valid {coding} data: truncated or followed by extra bytes")
    return out

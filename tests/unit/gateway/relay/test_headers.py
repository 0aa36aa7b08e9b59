"""Hop-by-hop filtering, including headers named by `Connection`."""

from __future__ import annotations

from gateway.relay.headers import REQUEST_DROP, RESPONSE_DROP, filtered, passed_on


def test_request_headers_drop_hop_by_hop_and_connection_named() -> None:
    out = filtered(
        [
            ("Host", "gw"),
            ("Connection", "keep-alive, X-Secret"),
            ("X-Secret", "1"),
            ("Transfer-Encoding", "chunked"),
            ("Authorization", "Bearer k"),
            ("Content-Length", "9"),
            ("X-Session-ID", "s1"),
        ],
        REQUEST_DROP,
    )
    assert list(out.items()) == [("Authorization", "Bearer k"), ("X-Session-ID", "s1")]


def test_response_headers_keep_duplicates_and_encoding() -> None:
    out = passed_on(
        [
            (b"Link", b"<a>"),
            (b"link", b"<b>"),
            (b"Content-Encoding", b"gzip"),
            (b"Set-Cookie", b"a=1"),
            (b"Server", b"vllm"),
            (b"Content-Length", b"5"),
            (b"Keep-Alive", b"timeout=5"),
            (b"Connection", b"keep-alive, X-Hop"),
            (b"x-hop", b"1"),
            (b"X-Name", "caf\u00e9".encode() + b"\xff"),
        ],
        RESPONSE_DROP,
    )
    assert out.getall("Link") == ["<a>", "<b>"] and out["Content-Encoding"] == "gzip"
    assert not {"Content-Length", "Keep-Alive", "Set-Cookie", "Server", "Connection", "X-Hop"} & set(out)
    assert out["X-Name"].encode("utf-8", "surrogateescape") == "caf\u00e9".encode() + b"\xff"  # the bytes go on

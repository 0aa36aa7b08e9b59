"""Hop-by-hop filtering, including headers named by `Connection`."""

from __future__ import annotations

from gateway.relay.headers import REQUEST_DROP, RESPONSE_DROP, filtered


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
    out = filtered(
        [
            ("Link", "<a>"),
            ("Link", "<b>"),
            ("Content-Encoding", "gzip"),
            ("Set-Cookie", "a=1"),
            ("Server", "vllm"),
            ("Content-Length", "5"),
            ("Keep-Alive", "timeout=5"),
        ],
        RESPONSE_DROP,
    )
    assert out.getall("Link") == ["<a>", "<b>"] and out["Content-Encoding"] == "gzip"
    assert not {"Content-Length", "Keep-Alive", "Set-Cookie", "Server"} & set(out)

from __future__ import annotations

import asyncio

import pytest

from replica_stub.output import RequestStream
from replica_stub.tokenizer import SimTokenizer
from tests.unit.replica_stub.factories import make_request


def _stream(stop: tuple[str, ...]) -> tuple[RequestStream, SimTokenizer]:
    tok = SimTokenizer()
    return RequestStream(make_request(4), tok, stop), tok


def _texts(stream: RequestStream) -> list[str]:
    return [delta.text for delta in stream.take()]


def test_text_is_streamed_token_by_token_without_stop_strings() -> None:
    stream, tok = _stream(())
    for word in ("one ", "two "):
        assert not stream.add_tokens(tok.encode(word), None)
    stream.add_tokens([tok.eos_token_id], "stop")
    assert _texts(stream) == ["one ", "two ", ""] and stream.num_output_tokens == 3


def test_stop_string_split_across_tokens_is_held_back_and_cut() -> None:
    stream, tok = _stream(("END",))
    assert not stream.add_tokens(tok.encode("alpha "), None)
    assert not stream.add_tokens(tok.encode("E"), None)
    assert stream.add_tokens(tok.encode("ND tail "), None)
    assert "".join(_texts(stream)) == "alpha "
    assert stream.finish_reason == "stop" and stream.stop_reason == "END"


def test_held_back_text_is_flushed_at_the_end() -> None:
    stream, tok = _stream(("zzz",))
    stream.add_tokens(tok.encode("ab "), None)
    stream.add_tokens(tok.encode("cd "), "length")
    assert "".join(_texts(stream)) == "ab cd "


async def test_batches_deliver_everything_pending_then_stop_after_the_finish() -> None:
    stream, tok = _stream(())
    stream.add_tokens(tok.encode("a "), None)
    stream.add_tokens(tok.encode("b "), None)
    batches = stream.batches()
    assert [d.text for d in await anext(batches)] == ["a ", "b "]
    waiting = asyncio.ensure_future(anext(batches))
    await asyncio.sleep(0)
    stream.add_tokens(tok.encode("c "), "length")
    assert [d.finish_reason for d in await waiting] == ["length"]
    with pytest.raises(StopAsyncIteration):
        await anext(batches)


class _ByteTokenizer:
    """Byte-level ids (id = byte value), decoded like a byte-level BPE: invalid UTF-8 -> U+FFFD."""

    eos_token_id = 256

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


def test_a_character_split_over_tokens_is_streamed_whole() -> None:
    stream = RequestStream(make_request(4), _ByteTokenizer(), ())  # type: ignore[arg-type]
    for byte in "a😀".encode():
        stream.add_tokens([byte], None)
    stream.add_tokens([0xE6], "length")  # cut inside a character: flushed as it is at the end
    assert _texts(stream) == ["a", "", "", "", "😀", "\ufffd"]
    assert stream.num_output_tokens == 6

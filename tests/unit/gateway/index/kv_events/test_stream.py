"""Events too long to decode in one go: read a window at a time, each window checked, the same events as
a whole decode would give."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import pytest

from gateway.index.kv_events import stream
from gateway.index.kv_events.decode import DecodeError, Stored, decode_batch, decode_slices

pytestmark = pytest.mark.timeout(30)
BLOCK, BLOCKS = 16, 10_000  # the flood's event: 160,000 token ids, 0.7 MB


def _tokens() -> list[int]:
    return list(range(1000, 1000 + BLOCK * BLOCKS))  # ints of 2 to 5 bytes


def _array_event(hashes: list[Any], tokens: list[Any]) -> list[Any]:
    return ["BlockStored", hashes, 7, tokens, BLOCK, None, "GPU"]


def _map_event(hashes: list[Any], tokens: list[Any]) -> dict[str, Any]:
    return {"type": "BlockStored", "token_ids": tokens, "block_hashes": hashes, "block_size": BLOCK, "x": [0] * 9000}


@pytest.mark.parametrize("shape", [_array_event, _map_event])
@pytest.mark.parametrize("digests", [False, True])
def test_a_long_event_decodes_in_windows_to_what_it_says(shape: Any, digests: bool) -> None:
    hashes: list[Any] = [i.to_bytes(32, "big") if digests else 2**64 - 1 - i for i in range(BLOCKS)]
    payload = msgpack.packb([time.time(), [shape(hashes, _tokens()), ["BlockRemoved", [5], "GPU"]], None])
    slices = list(decode_slices(payload, 128))
    assert len(slices) > BLOCK * BLOCKS // stream.WINDOW, "a pause (an empty slice) after every window"
    [event, removed] = [e for part in slices for e in part]
    assert isinstance(event, Stored)
    assert event.block_hashes == tuple(hashes) and list(event.token_ids) == _tokens()
    assert event.parent == (7 if shape is _array_event else None) and event.block_size == BLOCK
    assert removed.block_hashes == (5,)  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", ["a", 1.5, -1, True, None, [1]])
@pytest.mark.parametrize("at", [0, BLOCK * BLOCKS - 1])
def test_a_bad_token_id_anywhere_in_a_long_event_is_a_decode_error(bad: Any, at: int) -> None:
    tokens: list[Any] = _tokens()
    tokens[at] = bad
    with pytest.raises(DecodeError):
        decode_batch(msgpack.packb([0.0, [_array_event(list(range(BLOCKS)), tokens)], None]))


def test_a_bad_hash_in_a_long_event_is_a_decode_error() -> None:
    hashes: list[Any] = list(range(BLOCKS))
    hashes[-1] = "not a hash"
    with pytest.raises(DecodeError):
        decode_batch(msgpack.packb([0.0, [_array_event(hashes, _tokens())], None]))


def test_a_long_event_cut_short_is_a_decode_error() -> None:
    payload = msgpack.packb([0.0, [_array_event(list(range(BLOCKS)), _tokens())], None])
    with pytest.raises(DecodeError):
        decode_batch(payload[: len(payload) // 2])


def test_no_step_of_a_long_event_takes_long() -> None:
    """The whole event in one go took ~18 ms (msgpack, then a Python check over every token id)."""
    payload = msgpack.packb([0.0, [_array_event(list(range(BLOCKS)), _tokens())] * 3, None])
    steps = []
    started = time.thread_time()
    for _ in decode_slices(payload, 128):
        steps.append(time.thread_time() - started)
        started = time.thread_time()
    assert sorted(steps)[len(steps) // 2] < 0.002, f"median step {sorted(steps)[len(steps) // 2] * 1000:.1f} ms"
    assert max(steps) < 0.008, f"longest step {max(steps) * 1000:.1f} ms"

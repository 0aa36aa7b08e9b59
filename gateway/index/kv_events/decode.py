"""Decoding vLLM KV-event batches: the wire format, whatever vLLM version sent it.

Wire format (vLLM `vllm/distributed/kv_events.py`): PUB multipart `(topic, seq, payload)`, `seq`
an 8-byte big-endian counter from 0 per publisher process, payload a msgpack `EventBatch`
`[ts, events, data_parallel_rank]` (or the same as a map). Events are tagged arrays
`["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, lora_name, ...]` or tagged
maps `{"type": "BlockStored", ...}`; vLLM has sent both, so payloads are decoded as raw msgpack and
both are accepted. Hashes are uint64 ints or raw digest bytes, kept as they come. Unknown
event types and extra fields are ignored. Events whose `medium` is neither absent nor "GPU"
(CPU or storage offload tiers) are dropped: the table mirrors the GPU prefix cache, the one a
request hits without a transfer. The replay socket (ROUTER) answers a start seq with one
`(seq, payload)` message per buffered batch, then `seq == -1` with an empty payload.
"""

from __future__ import annotations

from array import array
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from gateway.index.kv_events import stream

EngineHash = int | bytes
"""A block hash as the engine sends it: uint64 (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`) or digest bytes."""

_GPU_MEDIA = (None, "GPU")
_HASH_TYPES, _TOKEN_TYPES = frozenset({int, bytes}), frozenset({int})  # exact types: a bool is no token id


@dataclass(frozen=True)
class Stored:
    """Blocks became resident; `block_hashes[0]` continues the chain at `parent`."""

    block_hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    token_ids: Sequence[int]  # a tuple; a long event's, uint64s (`array`: no int object per token)
    block_size: int
    lora_id: int | None = None  # the LoRA adapter whose blocks these are: vLLM's id (deprecated) ...
    lora_name: str | None = None  # ... and, in newer versions, its name


@dataclass(frozen=True)
class Removed:
    """Blocks were evicted."""

    block_hashes: tuple[EngineHash, ...]


@dataclass(frozen=True)
class Cleared:
    """The whole cache was emptied (AllBlocksCleared)."""


Event = Stored | Removed | Cleared


class DecodeError(ValueError):
    """The payload is not an event batch this module understands."""


def decode_batch(payload: bytes) -> list[Event]:
    """The GPU-cache events of one msgpack EventBatch, in order; raises DecodeError if malformed."""
    return [event for part in decode_slices(payload) for event in part]


def decode_slices(payload: bytes, size: int = 512) -> Generator[list[Event], None, None]:
    """`decode_batch` a slice of `size` raw events at a time, so that a caller on the event loop can let
    other work run between slices (one 30 MB batch decoded in one go held the loop for 0.3-0.4 s). The
    array form (what vLLM sends) is read event by event with msgpack's streaming Unpacker, and an event's
    long arrays a window at a time (`stream`: one event of 160,000 token ids held the loop 18 ms); an
    empty slice is such a pause. A map-form batch is decoded whole, then handed out in slices. Raises
    DecodeError at the first malformed part: a caller that must skip a bad batch whole collects every
    slice before applying one."""
    if not stream.is_array(payload):
        yield from _slices(_events_of(payload), size)
        return
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(payload))
    unpacker.feed(payload)
    view = memoryview(payload)
    try:
        if unpacker.read_array_header() < 2:
            raise DecodeError("batch is neither [ts, events, ...] nor a map")
        unpacker.skip()  # ts
        try:
            left = unpacker.read_array_header()
        except ValueError:
            raise DecodeError("batch events is not a list") from None
        while left:
            part = []
            for _ in range(min(size, left)):
                start = unpacker.tell()
                unpacker.skip()  # where the event ends: C, ~1 ms for 700 KB
                if unpacker.tell() - start <= stream.EVENT_BYTES:
                    raw = msgpack.unpackb(view[start : unpacker.tell()], raw=False, strict_map_key=False)
                else:
                    raw = yield from _paused(stream.read_event(payload[start : unpacker.tell()], _fields, _CHECKS))
                event = _decode_event(raw)
                if event is not None:
                    part.append(event)
            left -= min(size, left)
            yield part
    except (ValueError, TypeError, msgpack.UnpackException) as exc:  # DecodeError is a ValueError: as it is
        if isinstance(exc, DecodeError):
            raise
        raise DecodeError(f"not msgpack: {type(exc).__name__}") from exc


def _paused(reading: stream.Pauses) -> Generator[list[Event], None, Any]:
    """What `reading` returns, each of its pauses handed out as an empty slice."""
    while True:
        try:
            next(reading)
        except StopIteration as done:
            return done.value
        yield []


def _slices(raw_events: list[Any], size: int) -> Iterator[list[Event]]:
    for start in range(0, len(raw_events), size):
        yield [e for raw in raw_events[start : start + size] if (e := _decode_event(raw)) is not None]


def _events_of(payload: bytes) -> list[Any]:
    """The raw events of a batch decoded whole (the map form, or what is not an array at all)."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError) as exc:  # msgpack's errors are ValueErrors; unhashable map keys TypeError
        raise DecodeError(f"not msgpack: {type(exc).__name__}") from exc
    if isinstance(batch, dict):
        events = batch.get("events")
    elif isinstance(batch, list) and len(batch) >= 2:
        events = batch[1]
    else:
        raise DecodeError("batch is neither [ts, events, ...] nor a map")
    if not isinstance(events, list):
        raise DecodeError("batch events is not a list")
    return events


# Positional fields after the tag, in vLLM's struct order (array_like encoding; trailing defaults may be omitted).
_ARRAY_FIELDS: dict[str, tuple[str, ...]] = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": ("medium",),  # vLLM sends no fields; some engines name the medium cleared
}


def _fields(tag: str) -> tuple[str, ...]:
    return _ARRAY_FIELDS.get(tag, ())


def _decode_event(raw: Any) -> Event | None:
    """One event; None for unknown types and non-GPU media."""
    kind: object
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        kind, fields = raw[0], dict(zip(_fields(raw[0]), raw[1:]))
    elif isinstance(raw, dict):
        kind, fields = raw.get("type"), raw
    else:
        raise DecodeError("event is neither a tagged array nor a map")
    if not isinstance(kind, str) or kind not in _ARRAY_FIELDS or fields.get("medium") not in _GPU_MEDIA:
        return None
    if kind == "AllBlocksCleared":
        return Cleared()
    hashes = _hashes(fields.get("block_hashes"))
    if kind == "BlockRemoved":
        return Removed(hashes)
    parent, tokens, block_size = fields.get("parent_block_hash"), fields.get("token_ids"), fields.get("block_size")
    if parent is not None:
        _check_hashes([parent])
    if isinstance(tokens, stream.Checked):  # a long one: uint64s, read and checked in windows
        tokens = tokens.items
    elif isinstance(tokens, list):
        _check_tokens(tokens)
        tokens = tuple(tokens)
    else:
        raise DecodeError("BlockStored token_ids is not a list of ints")
    if type(block_size) is not int or block_size < 1:
        raise DecodeError("BlockStored block_size is not a positive int")
    lora_id, lora_name = fields.get("lora_id"), fields.get("lora_name")
    return Stored(
        hashes,
        parent,
        tokens,
        block_size,
        lora_id if type(lora_id) is int else None,
        lora_name if isinstance(lora_name, str) and lora_name else None,
    )


def _hashes(value: Any) -> tuple[EngineHash, ...]:
    if isinstance(value, stream.Checked):  # a long one, read and checked in windows
        return tuple(value.items)
    if not isinstance(value, list):
        raise DecodeError("block_hashes is not a list")
    return tuple(_check_hashes(value))


def _check_hashes(values: list[Any]) -> list[Any]:
    if not set(map(type, values)) <= _HASH_TYPES:  # in C: a Python loop over 10,000 hashes took 2 ms
        raise DecodeError("a block hash is neither an int nor bytes")
    return values


def _check_tokens(values: list[Any]) -> list[Any]:
    if not set(map(type, values)) <= _TOKEN_TYPES:  # in C: 3x faster than a Python loop
        raise DecodeError("BlockStored token_ids is not a list of ints")
    return values


def _uint64_tokens(values: list[Any]) -> array[int]:
    """A window of a long event's token ids, checked, as uint64s: 160,000 int objects cost 1-2 ms to
    make into a tuple and as long again to free, in one go."""
    try:
        return array("Q", _check_tokens(values))
    except OverflowError:
        raise DecodeError("BlockStored token_ids is not a list of uint64s") from None


_CHECKS: dict[str, stream.Check] = {"block_hashes": _check_hashes, "token_ids": _uint64_tokens}  # long: windowed

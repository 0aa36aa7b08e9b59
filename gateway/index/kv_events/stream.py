"""Reading one msgpack event in bounded steps, so that a single huge event cannot hold the event loop.

A vLLM BlockStored event carries the token ids of every block it names: a long prompt stored in one step
is one msgpack array of hundreds of thousands of ints. msgpack decodes an object in one C call, and the
decoder's checks then walk it in Python: one event of 10,000 blocks (160,000 token ids) held the loop
for about 18 ms, and a request meets the loop several times, so a flood of them raised innocent p99 from
8 ms to 62 ms. Here the long arrays of an event (`block_hashes`, `token_ids`) are read `WINDOW` items at
a time, each window checked as it comes, with a pause (the generator yields) between windows; the
caller lets the loop run at each pause.

A window is decoded in one C call by a second Unpacker fed an array header of the window's count and the
next bytes of the payload (an int takes at most 9 bytes of msgpack), then the main Unpacker skips the
bytes that window used. Items larger than that (digest-bytes hashes) are read one by one instead: slower,
and still a pause per window.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, MutableSequence
from dataclasses import dataclass
from typing import Any

import msgpack

WINDOW = 4096  # items of one long array decoded between two pauses (~0.3 ms with its check)
EVENT_BYTES = 8 * WINDOW  # an event up to this size is decoded in one go (~1 ms at most), a larger one by `read_event`
_INT_BYTES = 9  # the most bytes a msgpack int takes (0xcf/0xd3 and 8 bytes)
_ARRAY_HEADS = frozenset(range(0x90, 0xA0)) | {0xDC, 0xDD}  # fixarray, array16, array32
_MAP_HEADS = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}  # fixmap, map16, map32

Kept = MutableSequence[Any]
Check = Callable[[list[Any]], Kept]
"""A window of an array's items in the form kept (a list, or uint64s with no object per item); raises
(a ValueError) if they are not what the field holds."""


@dataclass(frozen=True)
class Checked:
    """A long field read in windows, every one checked: its items, in the form its check keeps."""

    items: Kept


Pauses = Generator[None, None, Any]
"""Yields where the caller may let other work run; returns the value read."""


def is_array(payload: bytes) -> bool:
    """Whether `payload` starts with an array."""
    return bool(payload) and payload[0] in _ARRAY_HEADS


def read_event(payload: bytes, fields: Callable[[str], tuple[str, ...]], checks: dict[str, Check]) -> Pauses:
    """The event that is `payload`: a tagged array (its positional field names from `fields(tag)`) or a
    map. A field named in `checks` whose array is longer than `WINDOW` is read in windows, each checked,
    and comes back `Checked`; any other field as msgpack decodes it."""
    yield  # the caller has just walked the event to find its end (~1 ms for 700 KB)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(payload))
    unpacker.feed(payload)
    head = payload[0] if payload else None
    if head in _ARRAY_HEADS:
        count = unpacker.read_array_header()
        if not count:
            return []
        tag = unpacker.unpack()
        names = fields(tag) if isinstance(tag, str) else ()
        items = [tag]
        for i in range(count - 1):
            check = checks.get(names[i]) if i < len(names) else None
            items.append((yield from _read_field(payload, unpacker, check)))
        return items
    if head in _MAP_HEADS:
        event = {}
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            check = checks.get(key) if isinstance(key, str) else None
            event[key] = yield from _read_field(payload, unpacker, check)
        return event
    return unpacker.unpack()


def _read_field(payload: bytes, unpacker: msgpack.Unpacker, check: Check | None) -> Pauses:
    if check is None or _array_len(payload, unpacker.tell()) <= WINDOW:
        return unpacker.unpack()  # short or no array: in one go, checked by the decoder
    left = unpacker.read_array_header()
    items = check(_window(payload, unpacker, WINDOW))
    left -= WINDOW
    while left:
        yield
        count = min(WINDOW, left)
        items.extend(check(_window(payload, unpacker, count)))
        left -= count
    return Checked(items)


def _array_len(payload: bytes, at: int) -> int:
    """The item count of the array that starts at `at`; 0 for anything else."""
    head = payload[at] if at < len(payload) else None
    if head not in _ARRAY_HEADS:
        return 0
    if head == 0xDC:
        return int.from_bytes(payload[at + 1 : at + 3], "big")
    if head == 0xDD:
        return int.from_bytes(payload[at + 1 : at + 5], "big")
    return head & 0x0F


def _window(payload: bytes, unpacker: msgpack.Unpacker, count: int) -> list[Any]:
    """The next `count` items of an array whose header `unpacker` has read, in one C call if they are ints."""
    at = unpacker.tell()
    header = b"\xdd" + count.to_bytes(4, "big")
    reader = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(header) + _INT_BYTES * count)
    reader.feed(header + payload[at : at + _INT_BYTES * count])
    try:
        items: list[Any] = reader.unpack()
    except msgpack.OutOfData:  # items larger than ints: one by one
        return [unpacker.unpack() for _ in range(count)]
    unpacker.read_bytes(reader.tell() - len(header))
    return items

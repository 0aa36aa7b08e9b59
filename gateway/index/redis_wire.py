"""The Redis index's wire formats: its Lua scripts, packed hash chains, pub/sub messages and snapshot reads
(split from `redis_store` so each file holds one concern)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable, Sequence
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.client import PubSub

# Hashes travel as one packed string (8 bytes each, little-endian): encoding hundreds of
# separate integer arguments costs the client more than the whole lookup costs Redis.

# No KEYS (64 key arguments cost the client ~0.15 ms to encode, more than the whole script costs
# Redis; standalone Redis lets a script build its key names). ARGV[1]: packed hashes in chain
# order; ARGV[2]: per candidate, its hint (uint32, the local table's answer) and the byte length
# of its replica id (uint32), little-endian; ARGV[3]: the replica ids, concatenated; ARGV[4]: the
# tables' key prefix. Returns, per candidate, how many leading hashes its table holds, as one
# space-separated string (cheaper for the client to parse than a 64-element array).
# A table holds a chain's blocks as a prefix (see `RECORD_LUA`), so presence is monotone along
# the chain and a binary search finds the answer. Its first pivots are guesses, each checked with
# one ZMSCORE of blocks g and g+1 (right if g is held and g+1 is not): the hint, then the commonest
# answer among earlier candidates, then the previous candidate's (candidates mostly share a few
# answers: a system prompt many hold, a conversation's home). A table that misses the first block
# costs one ZSCORE; a wrong guess still narrows the range; plain bisection (ZSCORE) finishes.
# (Probing all guesses in one ZMSCORE per candidate makes fewer calls but builds more Lua tables:
# slower, measured.)
MATCH_LUA = """
local blob, meta, names, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = #blob / 8
local sub, counts, out = {}, {}, {}
local best, prev, at = 0, 0, 1
local key, lo, hi
local function h(i)
  local s = sub[i]
  if not s then
    s = string.sub(blob, i * 8 - 7, i * 8)
    sub[i] = s
  end
  return s
end
local function probe(i)
  if redis.call('ZSCORE', key, h(i)) then lo = i else hi = i - 1 end
end
local function try(g)
  if lo < g and g < hi then
    local s = redis.call('ZMSCORE', key, h(g), h(g + 1))
    if not s[1] then hi = g - 1 elseif s[2] then lo = g + 1 else lo, hi = g, g end
  elseif lo < g and g == hi then
    probe(g)
  elseif lo == g and g < hi then
    probe(g + 1)
  end
end
for k = 1, #meta / 8 do
  local hint, len = struct.unpack('<I4I4', meta, k * 8 - 7)
  key = prefix .. string.sub(names, at, at + len - 1)
  at = at + len
  lo, hi = 0, n
  try(hint)
  try(best)
  try(prev)
  while lo < hi do probe(math.floor((lo + hi + 1) / 2)) end
  out[k] = lo
  counts[lo] = (counts[lo] or 0) + 1
  if counts[lo] > (counts[best] or 0) then best = lo end
  prev = lo
end
return table.concat(out, ' ')
"""

# KEYS[1]: one replica's table; ARGV: packed hashes, wall time, capacity, ttl seconds.
# Block i scores time - i µs and scores only grow (GT): every block then scores above its
# descendants, so the capacity trim drops tails first and a table holds each chain as a prefix.
RECORD_LUA = """
local blob, now = ARGV[1], tonumber(ARGV[2])
local n = #blob / 8
local i = 0
while i < n do
  local args = {}
  for m = i, math.min(i + 1000, n) - 1 do
    args[#args + 1] = now - m * 0.000001
    args[#args + 1] = string.sub(blob, m * 8 + 1, m * 8 + 8)
  end
  redis.call('ZADD', KEYS[1], 'GT', unpack(args))
  i = i + 1000
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[3]) + 1))
redis.call('EXPIRE', KEYS[1], ARGV[4])
return n
"""
MAX_HINT = 2**32 - 1

Op = tuple[str, bytes | None, float]  # (replica_id, packed hashes or None = forget, wall time)

# A published message: sender id (8 bytes), then b"W" and ops, each (uint16 id length, uint32 hash
# count or FORGET, id, packed hashes), or b"S" and an 8-byte marker nonce.
WRITES, MARKER = b"W", b"S"
OP_HEAD = struct.Struct("<HI")
FORGET = 2**32 - 1


def pack(hashes: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(hashes)}Q", *hashes)


def unpack(packed: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(packed) // 8}Q", packed)


def encode_ops(sender: bytes, ops: Iterable[Op]) -> bytes:
    parts = [sender, WRITES]
    for replica_id, packed, _ in ops:
        name = replica_id.encode()
        parts += [OP_HEAD.pack(len(name), FORGET if packed is None else len(packed) // 8), name, packed or b""]
    return b"".join(parts)


def decode_ops(data: bytes, at: int) -> list[tuple[str, bytes | None]]:
    """The (replica_id, packed hashes or None = forget) of a writes message, from offset `at`."""
    ops: list[tuple[str, bytes | None]] = []
    while at < len(data):
        name_len, count = OP_HEAD.unpack_from(data, at)
        at += OP_HEAD.size
        name = data[at : at + name_len].decode()
        at += name_len
        if count == FORGET:
            ops.append((name, None))
            continue
        packed = data[at : at + 8 * count]
        if len(packed) != 8 * count:
            raise ValueError("truncated writes message")
        ops.append((name, packed))
        at += 8 * count
    return ops


async def read_messages(
    pubsub: PubSub, queue: asyncio.Queue[bytes | BaseException], errors: tuple[type[BaseException], ...]
) -> None:
    """Move every message of the subscription into `queue`; end with the error (of `errors`) that broke it."""
    try:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if message is not None:
                queue.put_nowait(message["data"])
    except errors as exc:
        queue.put_nowait(exc)


def glob_escape(text: str) -> str:
    """`text` matched literally in a SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def read_tables(client: Redis, prefix: str, page_size: int) -> dict[str, Sequence[int]]:
    """Every table under `prefix` (replica id -> block hashes, most recently used first), a page of members
    per ZRANGE. Pages go by rank: a table written meanwhile can shift a member across a page edge (a
    duplicate is dropped, a miss comes back with that chain's next use)."""
    tables: dict[str, Sequence[int]] = {}
    async for key in client.scan_iter(match=glob_escape(prefix) + "*", count=1000):
        members: list[bytes] = []
        while True:
            page = await client.zrange(key, len(members), len(members) + page_size - 1)
            members += cast(list[bytes], page)  # a sorted set's members, no scores asked for
            if len(page) < page_size:
                break
        tables[key[len(prefix) :].decode()] = unpack(b"".join(members))
    return tables

"""The rule of every rate limit, in Redis and in memory alike: no window of `window_s` (60 s: a minute),
aligned or not, admits more than the limit.

Time is cut into BUCKETS buckets per window and each admission is counted in its bucket; a new one is
admitted while the buckets of the last SPAN (the window, the bucket it started in, and one more for a
shared lease's life: `gateway.edge.shared_quota`) hold less than the limit. Counting whole buckets
over-counts the oldest one, so a key is turned away up to two buckets (2 s of a minute) early, never
late. A fixed wall-clock window, what this replaced, admitted up to twice the limit across its edge.

The shared quota runs the same arithmetic in a Lua script (`SCRIPT` below, on a hash of bucket ->
amount per key and kind), so a key's quota is the same with Redis up or down.
"""

from __future__ import annotations

import math

BUCKETS = 60  # per window: a second each for a minute
SPAN = BUCKETS + 2  # buckets counted: the window's, the one it starts inside, one for a lease's life

# KEYS[1]: hash bucket -> amount. ARGV: now's bucket, SPAN, limit, want, need, expire_s.
# Returns {granted, 0}, or {0, the bucket from which `need` fits} when refused.
SCRIPT = """
local now, span, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local want, need = tonumber(ARGV[4]), tonumber(ARGV[5])
local flat = redis.call('HGETALL', KEYS[1])
local used, stale, live = 0, {}, {}
for i = 1, #flat, 2 do
  local b, n = tonumber(flat[i]), tonumber(flat[i + 1])
  if b <= now - span then stale[#stale + 1] = flat[i] else used = used + n; live[#live + 1] = {b, n} end
end
if #stale > 0 then redis.call('HDEL', KEYS[1], unpack(stale)) end
local grant = math.min(want, limit - used)
if grant >= need then
  redis.call('HINCRBY', KEYS[1], now, grant)
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  return {grant, 0}
end
table.sort(live, function(x, y) return x[1] < y[1] end)
local over = used + need - limit
for _, entry in ipairs(live) do
  over = over - entry[2]
  if over <= 0 then return {0, entry[1] + span} end
end
return {0, now + span}
"""


class SlidingWindow:
    """One key's counts of one kind (requests or tokens), in memory."""

    __slots__ = ("_counts", "_current", "_total", "width")

    def __init__(self, window_s: float) -> None:
        self.width = window_s / BUCKETS
        self._counts: dict[int, float] = {}  # bucket -> amount, oldest first
        self._total = 0.0  # what _counts holds
        self._current = -1  # the bucket of the last call: older ones are dropped once per bucket, not per call

    def bucket(self, now: float) -> int:
        return math.floor(now / self.width)

    def used(self, now: float) -> float:
        """What the last SPAN buckets hold."""
        self._advance(self.bucket(now))
        return self._total

    def add(self, now: float, amount: float) -> None:
        current = self.bucket(now)
        self._advance(current)
        self._counts[current] = self._counts.get(current, 0.0) + amount
        self._total += amount

    def retry_after(self, now: float, need: float, limit: float) -> float:
        """Seconds until `need` fits under `limit` (after `used(now)`)."""
        return seconds_until(_from_bucket(sorted(self._counts.items()), need, limit, self.bucket(now)), self.width, now)

    def _advance(self, current: int) -> None:
        if current == self._current:
            return
        self._current = current
        while self._counts:
            oldest = next(iter(self._counts))
            if oldest > current - SPAN:
                break
            self._total -= self._counts.pop(oldest)
        if not self._counts:
            self._total = 0.0  # no float drift carried over an idle spell


def seconds_until(bucket: int, width: float, now: float) -> float:
    return max(0.0, bucket * width - now)


def _from_bucket(counts: list[tuple[int, float]], need: float, limit: float, current: int) -> int:
    """The first bucket from which `need` fits: the one where enough of the oldest counts have aged out."""
    over = sum(n for _, n in counts) + need - limit
    for bucket, amount in counts:
        over -= amount
        if over <= 0:
            return bucket + SPAN
    return current + SPAN

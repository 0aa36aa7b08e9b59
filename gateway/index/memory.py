"""In-process warm-prefix tables: one LRU of block hashes per replica (the default store).

Recording inserts a request's blocks tail first, so the prefix is the most recently used
and capacity trimming evicts tails before heads, as vLLM's block pool does. So a table holds
every chain as a prefix (block k present means blocks 0..k-1 are), and a lookup binary-searches
the chain: about log2(blocks) dict probes, 9 for an 8k-token prompt (4 more at worst).
Candidates mostly share a few answers (a system prompt many replicas hold, a conversation's
home), so the search tries the commonest answer so far and the previous candidate's first:
two probes when one is right.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence


class MemoryIndex:
    def __init__(self, capacity_blocks: int) -> None:
        self._default_capacity = capacity_blocks
        self._capacity: dict[str, int] = {}
        self._tables: dict[str, OrderedDict[int, None]] = {}

    @property
    def degraded(self) -> bool:
        return False

    @property
    def mirrored(self) -> bool:
        return False  # no shared store to mirror

    async def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        return self.match_now(hashes, replica_ids)

    def match_now(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        result: dict[str, int] = {}
        n = len(hashes)
        counts: dict[int, int] = {}  # answers so far -> how many candidates had them
        best = prev = 0  # the commonest answer so far, the previous candidate's
        for replica_id in replica_ids:
            table = self._tables.get(replica_id)
            if not table or not n or hashes[0] not in table:
                result[replica_id] = 0
                continue
            lo, hi = 1, n  # the answer lies in [lo, hi]
            # Candidates mostly share a few answers (a common system prompt, a conversation's
            # home): try those first, two probes each when right; plain bisection otherwise.
            for g in (best, prev):
                if lo < g <= hi:
                    if hashes[g - 1] in table:
                        lo = g
                    else:
                        hi = g - 1
                if lo == g < hi:
                    if hashes[g] in table:
                        lo = g + 1
                    else:
                        hi = g
            if lo < hi:  # a guess settled most candidates: no call
                lo = held(table, hashes, lo, hi)
            result[replica_id] = lo
            c = counts[lo] = counts.get(lo, 0) + 1
            if c > counts.get(best, 0):
                best = lo
            prev = lo
        return result

    def record(self, replica_id: str, hashes: Sequence[int]) -> int:
        if not hashes:
            return 0
        table = self._tables.get(replica_id)
        if table is None:
            table = self._tables[replica_id] = OrderedDict()
        # The table holds the chain's first `head` blocks and none after: append the new tail
        # in one C call (tail first), then move the head to the recent end, last block first.
        head = held(table, hashes, 0, len(hashes))
        if head < len(hashes):
            table.update(dict.fromkeys(reversed(hashes[head:])))
        move = table.move_to_end
        for h in reversed(hashes[:head]):
            move(h)
        self._trim(replica_id, table)
        return len(hashes) - head

    def unrecord(self, replica_id: str, hashes: Sequence[int]) -> None:
        table = self._tables.get(replica_id)
        if table is not None:
            for h in hashes:
                table.pop(h, None)

    async def forget(self, replica_id: str) -> None:
        self.drop(replica_id)

    def drop(self, replica_id: str) -> None:
        self._tables.pop(replica_id, None)

    def load(self, tables: dict[str, Sequence[int]]) -> None:
        """Replace every table with a snapshot of a shared store's, each least recently used first."""
        self._tables = {replica_id: OrderedDict.fromkeys(hashes) for replica_id, hashes in tables.items() if hashes}
        for replica_id, table in self._tables.items():
            self._trim(replica_id, table)

    def set_capacity(self, replica_id: str, blocks: int) -> None:
        self._capacity[replica_id] = max(1, blocks)
        table = self._tables.get(replica_id)
        if table is not None:
            self._trim(replica_id, table)

    def capacity(self, replica_id: str) -> int:
        return self._capacity.get(replica_id, self._default_capacity)

    def size(self, replica_id: str) -> int:
        return len(self._tables.get(replica_id, ()))

    def fill(self, replica_id: str) -> float:
        return self.size(replica_id) / self.capacity(replica_id)

    def _trim(self, replica_id: str, table: OrderedDict[int, None]) -> None:
        excess = len(table) - self.capacity(replica_id)
        for _ in range(excess):
            table.popitem(last=False)

    async def flush(self) -> None:
        """Writes are immediate here."""

    async def close(self) -> None:
        self._tables.clear()


def held(table: Container[int], hashes: Sequence[int], lo: int, hi: int) -> int:
    """How many leading blocks of `hashes` the table holds, known to lie in [lo, hi]: a table
    holds every chain as a prefix, so presence is monotone along the chain and bisection finds it."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] in table:
            lo = mid
        else:
            hi = mid - 1
    return lo

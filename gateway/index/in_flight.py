"""Blocks of the requests each replica is serving now: warm there, whatever the history table says.

A replica cannot evict the KV blocks of a request it is serving (vLLM frees them when the
request ends), but the history table trims by the order requests were *sent*: under a deep
queue it ages a long shared prompt out while requests carrying it still run there. The next
request of that prompt then looked cold at its home, went wherever the wait was shortest and
was prefilled a second time, evicting another prompt there (prefix-groups at 90 % load, in the
simulator: 28–39 of 480 repeats moved home). Counting the in-flight requests' chains as held
keeps such a prompt where it runs. When the request ends its blocks become evictable, most
recently used first, which is what recording its answer at finish tells the table.

Local to this gateway (its own requests) and in memory: nothing to share, nothing to flush.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.index.memory import held

MAX_TRACKED = 100_000  # requests held at once (bounds a leak should one never end)


class InFlightBlocks:
    def __init__(self) -> None:
        self._blocks: dict[str, dict[int, int]] = {}  # replica -> block hash -> requests holding it
        self._requests: dict[str, tuple[str, Sequence[int]]] = {}  # request -> (replica, its chain)

    def add(self, request_id: str, replica_id: str, hashes: Sequence[int]) -> None:
        """`request_id` now runs on `replica_id` (a retry elsewhere replaces its earlier attempt)."""
        self.remove(request_id)
        if not hashes:
            return
        if len(self._requests) >= MAX_TRACKED:
            self.remove(next(iter(self._requests)))
        self._requests[request_id] = (replica_id, hashes)
        counts = self._blocks.setdefault(replica_id, {})
        get = counts.get
        for h in hashes:
            counts[h] = get(h, 0) + 1

    def remove(self, request_id: str) -> None:
        """It ended, or its attempt failed: its blocks are no longer pinned there."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        replica_id, hashes = entry
        counts = self._blocks[replica_id]
        for h in hashes:
            n = counts[h] - 1
            if n:
                counts[h] = n
            else:
                del counts[h]

    def match(self, hashes: Sequence[int], replica_id: str) -> int:
        """Leading blocks of `hashes` that a request running on `replica_id` holds. Each chain is
        held whole, so the set is prefix-closed (a block's hash names its whole prefix): bisection."""
        counts = self._blocks.get(replica_id)
        if not counts or not hashes or hashes[0] not in counts:
            return 0
        return held(counts, hashes, 1, len(hashes))

"""The WarmIndex interface (its config is `gateway.config.features.IndexConfig`, its factory `build`).

An index answers "how many leading blocks of this prefix does each replica hold?" for all
candidates in one call (one network round trip for a remote store), and learns what a
replica holds from the requests routed to it. Each replica's table is an LRU bounded by the
replica's KV capacity in blocks, so the index forgets what the replica has evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class WarmIndex(Protocol):
    """Per-replica warm-prefix tables. Stores: `MemoryIndex`, `RedisIndex`."""

    @property
    def degraded(self) -> bool:
        """True while the shared store is unreachable and lookups use the local table."""

    @property
    def mirrored(self) -> bool:
        """True while lookups answer from an in-process mirror of the shared store (no round trip)."""

    async def match(self, hashes: Sequence[int], replica_ids: Iterable[str]) -> dict[str, int]:
        """Leading blocks of `hashes` each replica holds (0 if none); marks nothing as used."""

    def record(self, replica_id: str, hashes: Sequence[int]) -> int:
        """`replica_id` now holds `hashes`; refreshes their last use. Never waits: a shared
        store queues the write and sends it in the background. Returns how many of the chain's
        last blocks were new to this gateway's table (what `unrecord` may take back)."""

    def unrecord(self, replica_id: str, hashes: Sequence[int]) -> None:
        """Take back blocks `record` just added: the request never reached the replica."""

    def fill(self, replica_id: str) -> float:
        """How full the replica's table is, 0..1: at 1 every new block evicts a warm one."""

    async def forget(self, replica_id: str) -> None:
        """Drop a replica's table (removed, restarted, or its cache was reset)."""

    def set_capacity(self, replica_id: str, blocks: int) -> None:
        """Bound the replica's table to its KV pool size (`Router.set_capacity`)."""

    async def flush(self) -> None:
        """Return once every earlier `record`/`forget` is in the shared store and, where this
        gateway mirrors the store, once every write other gateways made before is applied here."""

    async def close(self) -> None:
        """Flush what can be flushed and release connections."""

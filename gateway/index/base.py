"""The WarmIndex interface, its config, and the factory that picks a store.

An index answers "how many leading blocks of this prefix does each replica hold?" for all
candidates in one call (one network round trip for a remote store), and learns what a
replica holds from the requests routed to it. Each replica's table is an LRU bounded by the
replica's KV capacity in blocks, so the index forgets what the replica has evicted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol
from urllib.parse import urlsplit

from gateway.config.secret_files import read_secret_file
from gateway.errors import ConfigError

_REDIS_SCHEMES = ("redis", "rediss", "unix")
_URL_FILE_KEY = "index.redis_url_file"  # IndexParams is the config's top-level `index`


@dataclass(frozen=True)
class IndexParams:
    """YAML top-level `index`: where the warm-prefix tables live."""

    store: str = "memory"  # "memory" (one gateway) or redis://host:port/db (shared by many)
    key_prefix: str = "affinity:"  # Redis key namespace
    capacity_blocks: int = 65536  # per replica, until set_capacity() learns the real KV pool size
    ttl_s: float = 3600.0  # a Redis table untouched this long disappears (removed replicas)
    timeout_s: float = 0.05  # Redis socket timeout; on expiry the lookup falls back to the local table
    max_pending_writes: int = 10000  # records queued for Redis while it is slow or down
    reconnect_max_s: float = 5.0  # backoff cap between reconnect attempts
    mirror: bool = True  # keep every table in memory, fed by the others' writes: lookups skip Redis
    redis_url_file: str | None = None  # or the redis:// URL (with its password) in this file: a mounted Secret

    @cached_property
    def resolved_store(self) -> str:
        """`store`, or the URL in `redis_url_file`: read once per loaded config, by validate."""
        return self.store if self.redis_url_file is None else read_secret_file(self.redis_url_file, _URL_FILE_KEY)

    def for_pool(self, model: str) -> IndexParams:
        """A pool's tables and its mirror's feed live under `<key_prefix><model>:`, so each pool
        mirrors its own replicas only. The store is resolved: the file is not read again."""
        return dataclasses.replace(self, key_prefix=f"{self.key_prefix}{model}:", store=self.resolved_store,
                                   redis_url_file=None)

    def validate(self, key: str) -> None:
        if self.redis_url_file is not None:
            if self.store != "memory":
                raise ConfigError("set store or redis_url_file, not both", key=f"{key}.redis_url_file")
            if urlsplit(self.resolved_store).scheme not in _REDIS_SCHEMES:  # a secret: not in the message
                raise ConfigError("the file must hold a redis://, rediss:// or unix:// URL", key=_URL_FILE_KEY)
        elif self.store != "memory" and urlsplit(self.store).scheme not in _REDIS_SCHEMES:
            raise ConfigError(f"expected 'memory' or a redis:// URL, got {self.store!r}", key=f"{key}.store")
        for name in ("capacity_blocks", "max_pending_writes"):
            if getattr(self, name) < 1:
                raise ConfigError("must be at least 1", key=f"{key}.{name}")
        for name in ("ttl_s", "timeout_s", "reconnect_max_s"):
            if getattr(self, name) <= 0:
                raise ConfigError("must be > 0", key=f"{key}.{name}")


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


def build_index(params: IndexParams) -> WarmIndex:
    """The store named by `params.store`. Redis connects lazily, on first use inside the event loop."""
    from gateway.index.memory import MemoryIndex

    if params.store == "memory":
        return MemoryIndex(params.capacity_blocks)
    from gateway.index.redis_store import RedisIndex

    return RedisIndex(params)

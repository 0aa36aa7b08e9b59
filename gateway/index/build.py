"""The warm-prefix index a pool's router uses, built from where the config keeps it (`IndexStore`): the
one module that knows every store, so the stores (`memory`, `redis_store`) and their interface (`base`)
need not know each other."""

from __future__ import annotations

from gateway.config.features import IndexStore
from gateway.index.base import WarmIndex


def build_index(store: IndexStore) -> WarmIndex:
    """In memory, or in the shared Redis (`store.url`). Redis connects lazily, on first use inside the event loop."""
    from gateway.index.memory import MemoryIndex

    if store.url is None:
        return MemoryIndex(store.params.capacity_blocks)
    from gateway.index.redis_store import RedisIndex

    return RedisIndex(store)


__all__ = ["build_index"]

"""The warm-prefix index a pool's router uses, built from the config's `index` section: the one module
that knows every store, so the stores (`memory`, `redis_store`) and their interface (`base`) need not
know each other."""

from __future__ import annotations

from gateway.config.features import IndexConfig
from gateway.index.base import WarmIndex


def build_index(params: IndexConfig) -> WarmIndex:
    """The store named by `params.store`. Redis connects lazily, on first use inside the event loop."""
    from gateway.index.memory import MemoryIndex

    if params.store == "memory":
        return MemoryIndex(params.capacity_blocks)
    from gateway.index.redis_store import RedisIndex

    return RedisIndex(params)


__all__ = ["build_index"]

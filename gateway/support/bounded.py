"""Tables bounded by evicting their oldest entry: a dict keeps insertion order, so its first key is its
oldest, and putting a key anew moves it to the end (the newest)."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def put_newest(table: dict[K, V], key: K, value: V, limit: int) -> tuple[K, V] | None:
    """Put `key` as the newest entry; when that makes more than `limit` entries, evict the oldest and return
    it (for a caller that must undo what it held)."""
    table.pop(key, None)
    table[key] = value
    if len(table) > limit:
        oldest = next(iter(table))
        return oldest, table.pop(oldest)
    return None

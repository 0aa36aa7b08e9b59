"""Work that only records, handled in one batch when the event loop next turns.

Recording each request's metrics in place, between its parsing, routing and relay and the next
request's, costs the process several times what the same calls cost run together: their code and data
are never in the CPU's caches (docs/benchmarks/hop.md). `Soon` collects such items and hands them all to
one call on the loop's next turn, before the loop reads any socket again, so what they record is there
for whatever a client asks next (a `/metrics` scrape after its answer). With no loop running (a
synchronous caller) each item is handled at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Soon(Generic[T]):
    """Items for `handle`, in batches: one call per loop turn with every item added since the last."""

    __slots__ = ("_handle", "_items", "_scheduled")

    def __init__(self, handle: Callable[[list[T]], None]) -> None:
        self._handle = handle
        self._items: list[T] = []
        self._scheduled = False

    def add(self, item: T) -> None:
        self._items.append(item)
        if self._scheduled:
            return
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop: now
            self.flush()
            return
        self._scheduled = True

    def flush(self) -> None:
        """Handle what is queued now (the loop calls it; so may a closing owner)."""
        items, self._items, self._scheduled = self._items, [], False
        if items:
            self._handle(items)

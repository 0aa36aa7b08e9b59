"""Cancelling a background task so that it really ends, on every Python the gateway supports."""

from __future__ import annotations

import asyncio


async def cancel_until_done(task: asyncio.Task[None], timeout_s: float = 1.0) -> None:
    """Cancel `task` until it has ended (for at most `timeout_s`). Once is not enough on Python 3.11:
    its asyncio.wait_for, which redis-py puts around every socket write, returns the write's result
    and drops a cancel that lands as the write completes (bpo-42130, fixed in 3.12). A Redis index's
    flusher then waited on for a wake-up its closed index never sends, holding the index's tables."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait([task], timeout=0.05)

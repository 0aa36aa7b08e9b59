"""Cancels that take effect on Python 3.11 too, whose asyncio.wait_for can drop one (bpo-42130)."""

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


def raise_lost_cancel() -> None:
    """Raise the cancel an await dropped (the task's cancel count stays up when one is swallowed),
    so a request whose client left during a Redis lookup stops here, not at a replica."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError

"""A task that runs as long as the app: started after startup, cancelled at cleanup (for the work
the request path hands off, such as the session sweep and the prefix report)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import suppress
from typing import Any

from aiohttp import web


def background(
    name: str, work: Callable[[], Coroutine[Any, Any, None]]
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An `app.cleanup_ctx` entry running `work()` for the app's life."""

    async def running(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(work(), name=name)
        yield
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task

    return running

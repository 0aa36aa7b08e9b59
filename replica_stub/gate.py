"""ArrivalGate: spreads a burst of new requests over event-loop iterations.

asyncio runs every ready callback of an iteration before it looks at timers again, so a
thousand connections arriving together would run a thousand parse/tokenize/submit steps
back to back and stall every running stream for that long. The gate lets at most
`per_iteration` requests start per iteration; the rest wait in FIFO order.
"""

from __future__ import annotations

import asyncio
from collections import deque


class ArrivalGate:
    def __init__(self, per_iteration: int = 32) -> None:
        self.per_iteration = per_iteration
        self._started = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._pump_scheduled = False

    async def enter(self) -> None:
        self._schedule_pump()
        if self._started < self.per_iteration and not self._waiters:
            self._started += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Once per iteration while busy: reset the count and release the next waiters."""
        self._pump_scheduled = False
        self._started = 0
        while self._waiters and self._started < self.per_iteration:
            waiter = self._waiters.popleft()
            if not waiter.done():  # a cancelled waiter's client is gone
                waiter.set_result(None)
                self._started += 1
        if self._waiters or self._started:
            self._schedule_pump()

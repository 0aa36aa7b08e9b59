from __future__ import annotations

import asyncio

from replica_stub.gate import ArrivalGate


async def test_a_burst_is_spread_over_iterations_in_fifo_order() -> None:
    gate = ArrivalGate(per_iteration=4)
    order: list[int] = []

    async def arrive(i: int) -> None:
        await gate.enter()
        order.append(i)

    tasks = [asyncio.create_task(arrive(i)) for i in range(10)]
    await asyncio.sleep(0)  # one iteration: the tasks' first steps
    assert order == [0, 1, 2, 3]
    await asyncio.gather(*tasks)
    assert order == list(range(10))


async def test_cancelled_waiters_are_skipped() -> None:
    gate = ArrivalGate(per_iteration=1)
    first, cancelled, behind = (asyncio.create_task(gate.enter()) for _ in range(3))
    await asyncio.sleep(0)
    assert first.done() and not cancelled.done()
    cancelled.cancel()
    await asyncio.wait_for(behind, 1)
    assert cancelled.cancelled()

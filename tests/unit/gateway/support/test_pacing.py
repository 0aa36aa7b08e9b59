"""A paced job works in bursts and rests between them, so the process is not kept busy by it alone."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.support.pacing import Pacer

pytestmark = pytest.mark.timeout(10)


async def test_a_job_rests_in_proportion_to_its_work() -> None:
    pacer = Pacer(burst_s=0.002, rest_ratio=2.0)
    started = time.perf_counter()
    worked = 0.0
    pacer.start()
    for _ in range(50):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.001:  # a 1 ms slice of work
            pass
        worked += time.perf_counter() - t
        await pacer.pause()
    elapsed = time.perf_counter() - started
    assert pacer.rested_s >= 1.5 * worked, (pacer.rested_s, worked)
    assert elapsed >= 2.5 * worked


async def test_short_work_only_yields_and_waiting_for_input_is_not_work() -> None:
    pacer = Pacer(burst_s=0.002, rest_ratio=2.0)
    for _ in range(20):
        await asyncio.sleep(0.005)  # waiting for the next batch
        pacer.start()
        await pacer.pause()  # almost no work since
    assert pacer.rested_s < 0.005

"""The silence limits of upstream attempts, all kept by one timer: each attempt is cut once its first byte
or its next byte is late, whatever the others do, and not before."""

from __future__ import annotations

import asyncio

import pytest

from gateway.relay.watch import Watches

pytestmark = pytest.mark.timeout(10)


async def test_an_attempt_without_a_first_byte_is_cut_when_its_limit_passes() -> None:
    watches = Watches()
    watch = watches.start("r0", first_byte_s=0.05, idle_s=5.0)
    await asyncio.sleep(0.02)
    assert watch.kind is None
    await asyncio.sleep(0.08)
    assert (watch.kind, watch.message) == ("first_byte", "no first byte in 0.05s")


async def test_a_first_byte_brings_the_idle_limit_forward_of_the_timer() -> None:
    """The timer was set for the first-byte limit (10 s); the first byte makes the idle limit (0.05 s) the
    earliest, and the timer follows it."""
    watches = Watches()
    watch = watches.start("r0", first_byte_s=10.0, idle_s=0.05)
    watch.touch()
    await asyncio.sleep(0.15)
    assert (watch.kind, watch.message) == ("idle", "no byte from the replica for 0.05s")


async def test_bytes_that_keep_coming_keep_an_attempt_alive_while_a_silent_one_is_cut() -> None:
    watches = Watches()
    moving = watches.start("r0", first_byte_s=0.05, idle_s=0.05)
    silent = watches.start("r1", first_byte_s=0.05, idle_s=0.05)
    for _ in range(10):
        moving.touch()
        await asyncio.sleep(0.02)
    assert moving.kind is None
    assert silent.kind == "first_byte"
    watches.end(moving)
    watches.end(silent)


async def test_an_ended_attempt_is_never_cut_and_a_later_one_still_is() -> None:
    watches = Watches()
    ended = watches.start("r0", first_byte_s=0.03, idle_s=0.03)
    watches.end(ended)
    await asyncio.sleep(0.08)
    assert ended.kind is None
    later = watches.start("r0", first_byte_s=0.03, idle_s=0.03)
    await asyncio.sleep(0.08)
    assert later.kind == "first_byte"


async def test_cutting_a_replica_cuts_its_attempts_only() -> None:
    watches = Watches()
    on_r0 = [watches.start("r0", 60.0, 60.0) for _ in range(2)]
    on_r1 = watches.start("r1", 60.0, 60.0)
    assert watches.cut("ejected", "replica ejected", "r0") == 2
    assert [w.kind for w in on_r0] == ["ejected", "ejected"] and on_r1.kind is None
    assert watches.cut("shutdown", "stopping") == 3  # every live one (a cut one stays cut as it was)
    assert on_r1.kind == "shutdown" and on_r0[0].kind == "ejected"

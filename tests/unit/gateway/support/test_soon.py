"""Recording work queued with `Soon` runs in one batch when the loop next turns, before it reads a socket
again; with no loop it runs at once."""

from __future__ import annotations

import asyncio

import pytest

from gateway.support.soon import Soon

pytestmark = pytest.mark.timeout(10)


async def test_items_are_handled_together_when_the_loop_turns() -> None:
    batches: list[list[int]] = []
    soon: Soon[int] = Soon(batches.append)
    for item in range(3):
        soon.add(item)
    assert batches == []  # nothing yet: the loop has not turned
    await asyncio.sleep(0)
    assert batches == [[0, 1, 2]]
    soon.add(3)
    await asyncio.sleep(0)
    assert batches == [[0, 1, 2], [3]]


async def test_a_flush_handles_what_is_queued_and_the_scheduled_turn_finds_nothing() -> None:
    batches: list[list[str]] = []
    soon: Soon[str] = Soon(batches.append)
    soon.add("a")
    soon.flush()
    assert batches == [["a"]]
    await asyncio.sleep(0)
    assert batches == [["a"]]  # no empty batch


def test_without_a_loop_each_item_is_handled_at_once() -> None:
    batches: list[list[str]] = []
    soon: Soon[str] = Soon(batches.append)
    soon.add("x")
    soon.add("y")
    assert batches == [["x"], ["y"]]

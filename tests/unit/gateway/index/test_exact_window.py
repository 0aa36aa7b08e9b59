"""The events window of a replica's exact table: speculation lasts until the request's events
arrive, bounded by a multiple of the replica's observed prefill time; a table whose due events
never come turns uncertain."""

from __future__ import annotations

import pytest

from gateway.index.exact import EVENTS, PREFILL_MULTIPLE, SPECULATIVE, ExactTables
from gateway.prompt import prefix_keys as prefix

pytestmark = pytest.mark.timeout(30)
MODEL, BS = "m", 16


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def chain(n_blocks: int, start: int = 1) -> tuple[int, ...]:
    return prefix.chain_hash_tokens(list(range(start, start + n_blocks * BS)), BS, prefix.model_seed(MODEL), 1000)


def tables_with_feed(clock: Clock) -> ExactTables:
    tables = ExactTables(prefix.model_seed(MODEL), BS, speculative_ttl_s=2.0, clock=clock)
    tables.set_certain("a", True)
    return tables


def test_speculation_follows_a_slow_replicas_prefill_time() -> None:
    clock = Clock()
    tables = tables_with_feed(clock)
    tables.completed("a", prompt_tokens=4 * BS, cached_tokens=4 * BS, ttft_s=5.0)  # a CPU prefill: 5 s
    tables.speculate("a", chain(4))
    clock.now += 3.0  # past the configured 2 s, well inside 4 x 5 s
    assert tables.match(chain(4), "a") == (4, SPECULATIVE)
    clock.now += PREFILL_MULTIPLE * 5.0
    assert tables.match(chain(4), "a") == (0, EVENTS)
    assert tables.describe("a")["events_window_s"] == PREFILL_MULTIPLE * 5.0


def test_a_fast_replica_keeps_the_configured_floor() -> None:
    clock = Clock()
    tables = tables_with_feed(clock)
    tables.completed("a", prompt_tokens=BS, cached_tokens=BS, ttft_s=0.01)
    tables.speculate("a", chain(2))
    clock.now += 1.5
    assert tables.match(chain(2), "a") == (2, SPECULATIVE)
    clock.now += 1.0
    assert tables.match(chain(2), "a") == (0, EVENTS)


def test_due_events_that_never_come_make_the_table_uncertain_until_one_does() -> None:
    clock = Clock()
    tables = tables_with_feed(clock)
    tables.speculate("a", chain(3))  # sent there with blocks the table lacks
    tables.completed("a", prompt_tokens=3 * BS + 5, cached_tokens=BS, ttft_s=0.1)  # filled two new blocks
    clock.now += 1.0
    assert tables.certain("a")
    clock.now += 1.5  # past the 2 s window: the publisher is not reaching us
    assert not tables.certain("a") and tables.describe("a")["silent"]
    tables.removed("a", [12345])  # any event: the feed is live again
    assert tables.certain("a")


def test_events_heard_during_the_request_satisfy_it() -> None:
    clock = Clock()
    tables = tables_with_feed(clock)
    tables.speculate("a", chain(3))
    tables.removed("a", [12345])  # its events arrive while it decodes
    tables.completed("a", prompt_tokens=3 * BS, cached_tokens=0, ttft_s=0.1)
    clock.now += 60  # idle afterwards: nothing more is due
    assert tables.certain("a")


def test_a_request_that_filled_no_new_block_expects_no_event() -> None:
    clock = Clock()
    tables = tables_with_feed(clock)
    tables.speculate("a", chain(3))
    tables.completed("a", prompt_tokens=2 * BS + 15, cached_tokens=2 * BS, ttft_s=0.1)  # partial block only
    tables.completed("a", prompt_tokens=BS - 1, cached_tokens=0, ttft_s=0.1)
    clock.now += 60
    assert tables.certain("a")

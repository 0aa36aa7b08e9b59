"""prefix_affinity's `return_weight`: a new conversation pays for the later turns it would delay where conversations
are between turns (`gateway.routing.policies.conversations`)."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from gateway.errors import ConfigError
from gateway.request.decision import Outcome
from gateway.routing.policies.conversations import BetweenTurns
from gateway.routing.policies.registry import build_policy
from tests.unit.gateway.routing.policies.test_prefix_affinity import make_candidates, make_view, prefix_policy
from tests.unit.gateway.routing.policies.test_prefix_affinity_preamble import continuing_view

pytestmark = pytest.mark.timeout(30)


def new_conversation_picks(**params: float) -> collections.Counter[str]:
    """Where a new conversation goes when replica a has a conversation between turns and b has none; all else
    equal (one turn each, loads, caches), so without the price the tie goes to a, sent its turn first (the least
    recent work)."""
    picks: collections.Counter[str] = collections.Counter()
    for seed in range(30):
        policy = prefix_policy(seed=seed, tie_s=0.0, tie_ratio=0.0, **params)
        for replica, ok in (("a", True), ("b", False)):  # b's turn failed: that conversation is not coming back
            view = continuing_view()
            decision = policy.choose(view, make_candidates(cached_tokens=[0, 0]))
            policy.on_dispatched(view, dataclasses.replace(decision, replica_id=replica))
            policy.on_finished(view, replica, Outcome(ok=ok))
        picks[policy.choose(make_view(), make_candidates(cached_tokens=[0, 0])).replica_id] += 1
    return picks


def test_a_new_conversation_avoids_the_replica_whose_conversation_is_due_back() -> None:
    assert set(new_conversation_picks(return_weight=1.0)) == {"b"}


def test_off_by_default_the_tie_is_broken_as_before() -> None:
    assert set(new_conversation_picks()) == {"a"}


def test_between_turns_counts_answered_turns_until_they_come_back() -> None:
    between = BetweenTurns(weight=1.0, window_s=5.0)
    now = 100.0
    between.dispatched("t1", "a", returning=False, conversational=True, now=now)
    between.dispatched("t2", "a", returning=False, conversational=True, now=now)
    between.dispatched("single", "a", returning=False, conversational=False, now=now)
    between.ended("t1", "a", ok=True, now=now)
    between.ended("t2", "a", ok=False, now=now)  # a failed answer: no next turn is due
    between.ended("single", "a", ok=True, now=now)  # not a conversation's turn
    # One conversation due back at a: a 1 s prefill there costs it 1 × 1² / (2 × 5) s; nothing at b.
    assert between.prices(["a", "b"], [0.001, 0.001], [0, 0], 1000, now) == pytest.approx([0.1, 0.0])
    # Tokens a replica holds already are no prefill: no delay.
    assert between.prices(["a"], [0.001], [1000], 1000, now) == [0.0]
    between.dispatched("t3", "a", returning=True, conversational=True, now=now)  # it came back
    assert between.prices(["a"], [0.001], [0], 1000, now) == [0.0]
    between.dispatched("t4", "a", returning=True, conversational=True, now=now)  # never below zero
    assert between.prices(["a"], [0.001], [0], 1000, now) == [0.0]
    # An attempt that never ran is forgotten: its end adds nothing.
    between.forget("t3")
    between.ended("t3", "a", ok=True, now=now)
    assert between.prices(["a"], [0.001], [0], 1000, now) == [0.0]


def test_a_conversation_that_never_returns_is_forgotten() -> None:
    between = BetweenTurns(weight=1.0, window_s=5.0)
    between.dispatched("t1", "a", returning=False, conversational=True, now=0.0)
    between.ended("t1", "a", ok=True, now=0.0)
    (later,) = between.prices(["a"], [0.001], [0], 1000, 50.0)  # ten windows on
    assert 0.0 < later < 0.1 * 1e-4


@pytest.mark.parametrize("key,value", [("return_weight", -1.0), ("return_window_s", 0.0)])
def test_bad_return_params_name_their_key(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=key):
        build_policy("prefix_affinity", {key: value}, "routing")

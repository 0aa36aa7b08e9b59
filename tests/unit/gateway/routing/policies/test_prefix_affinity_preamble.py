"""prefix_affinity and the shared preamble (tools + system prompt): replicated in proportion to its
traffic, attracting new conversations only once enough replicas hold it; a conversation's own
history attracts; a new conversation goes to the least full cache when conversations come back."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest

from gateway.request.decision import Candidate, Decision
from gateway.routing.policies.prefix_affinity import PrefixAffinityPolicy
from gateway.view import RequestView
from tests.unit.gateway.routing.policies.test_prefix_affinity import (
    IDS,
    dispatch,
    make_candidates,
    make_view,
    preamble_view,
    prefix_policy,
)


def popular_preamble_policy(**params: Any) -> PrefixAffinityPolicy:
    """A policy that has seen the preamble carried by every recent request (it wants replicas)."""
    policy = prefix_policy(**params)
    for _ in range(policy.params.shared_preamble_requests):
        policy.on_dispatched(preamble_view(), Decision("c", "test"))
    return policy


def test_warm_popular_preamble_does_not_pin_new_conversations() -> None:
    """`a` alone holds a popular system prompt: with equal waits, a and b tie for a new conversation."""
    picks = collections.Counter(
        popular_preamble_policy(seed=seed).choose(preamble_view(), make_candidates(cached_tokens=[500, 0])).replica_id
        for seed in range(40)
    )
    assert picks["a"] > 5 and picks["b"] > 5
    decision = popular_preamble_policy().choose(preamble_view(), make_candidates(cached_tokens=[500, 0]))
    assert decision.reason == "least_wait"
    # Spreading follows: each dispatch queues its prefill, so the next one goes to the other replica.
    policy = popular_preamble_policy()
    chosen = [dispatch(policy, preamble_view(), make_candidates(cached_tokens=[500, 0])) for _ in range(2)]
    assert sorted(chosen) == ["a", "b"]


def test_a_preamble_with_enough_holders_for_its_traffic_attracts_again() -> None:
    """One of many system prompts (a small share of the traffic): one holder is enough, so the
    holder wins its new conversations instead of every cache taking every prompt."""
    for seed in range(10):
        policy = popular_preamble_policy(seed=seed)
        for _ in range(40):  # other traffic: the preamble now carries a tenth of it
            other = make_view()
            other.preamble_tokens, other.preamble_key = 500, 7
            policy.on_dispatched(other, Decision("c", "test"))
        assert policy.choose(preamble_view(), make_candidates(cached_tokens=[500, 0, 0, 0])).replica_id == "a"


def test_preamble_weight_one_counts_it_like_any_overlap() -> None:
    for seed in range(10):
        policy = prefix_policy(preamble_weight=1.0, seed=seed)
        assert policy.choose(preamble_view(), make_candidates(cached_tokens=[500, 0])).replica_id == "a"


def test_history_beyond_the_preamble_attracts() -> None:
    policy = prefix_policy()
    decision = policy.choose(preamble_view(), make_candidates(cached_tokens=[500, 1500, 500, 0]))
    assert decision.replica_id == "b" and decision.reason == "prefix_hit"


def test_a_short_history_keeps_its_home_even_against_an_idle_replica() -> None:
    """Turn 2 of a conversation: its home holds the preamble *and* a short history; the idle
    replica holds neither, so it would pay both. The preamble is only discounted for new ones."""
    for seed in range(10):
        policy = prefix_policy(seed=seed)
        view = preamble_view(preamble=500, prompt=560)
        decision = policy.choose(view, make_candidates(cached_tokens=[520, 0], in_flight=[1, 0]))
        assert decision.replica_id == "a" and decision.reason == "prefix_hit"


def test_a_preamble_counts_as_shared_only_once_enough_requests_carried_it() -> None:
    """One conversation's own system prompt attracts like any prefix; a popular one stops attracting."""
    picks: collections.Counter[str] = collections.Counter()
    for seed in range(20):
        policy = prefix_policy(seed=seed, shared_preamble_requests=3)
        for _ in range(2):  # seen twice: still private, the replica holding it wins
            assert policy.choose(preamble_view(), make_candidates(cached_tokens=[500, 0])).replica_id == "a"
            policy.on_dispatched(preamble_view(), Decision("c", "test"))
        policy.on_dispatched(preamble_view(), Decision("c", "test"))  # the third request makes it shared
        picks[policy.choose(preamble_view(), make_candidates(cached_tokens=[500, 0])).replica_id] += 1
    assert picks["a"] > 2 and picks["b"] > 2


def test_a_shared_preamble_is_not_duplicated_into_a_full_cache_for_less_than_it_evicts() -> None:
    """a holds the 2000-token preamble behind a 0.5 s queue; b would prefill it in 0.4 s, but b's cache
    is full, so writing it there evicts as much someone re-prefills later: a is the cheaper home."""
    view = make_view(prompt_tokens=2100)
    view.preamble_tokens, view.preamble_key, view.tokens_per_block = 2000, 42, 16.0
    candidates = [Candidate("a", in_flight=50, cached_tokens=2000, cache_fill=1.0), Candidate("b", cache_fill=1.0)]
    assert prefix_policy(load_epsilon=100.0).choose(view, candidates).replica_id == "a"
    assert prefix_policy(load_epsilon=100.0, eviction_weight=0.0).choose(view, candidates).replica_id == "b"
    candidates[1].cache_fill = 0.0  # room to spare on b: nothing is evicted, the faster TTFT wins
    assert prefix_policy(load_epsilon=100.0).choose(view, candidates).replica_id == "b"


def continuing_view() -> RequestView:
    view = make_view()
    view.body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ]
    }
    return view


@pytest.mark.parametrize(
    "params,conversational,always_b",
    [
        ({}, True, True),  # later turns are most of the traffic: the least full cache takes the new conversation
        ({}, False, False),  # single requests: a new prompt brings no later turns, the tie stays a tie
        ({"conversation_share": 1.0}, True, False),  # switched off
    ],
)
def test_a_new_conversation_goes_to_the_least_full_cache_when_conversations_come_back(
    params: dict[str, Any], conversational: bool, always_b: bool
) -> None:
    picks: collections.Counter[str] = collections.Counter()
    for seed in range(20):
        policy = prefix_policy(seed=seed, **params)
        for replica in IDS * 3:  # recent traffic, spread evenly (equal recent work everywhere)
            view = continuing_view() if conversational else make_view()
            decision = policy.choose(view, make_candidates(cached_tokens=[0] * 4))
            policy.on_dispatched(view, dataclasses.replace(decision, replica_id=replica))
        candidates = make_candidates(cache_fill=[0.9, 0.2, 0.6, 0.5])
        picks[policy.choose(make_view(), candidates).replica_id] += 1
    assert (set(picks) == {"b"}) == always_b, picks

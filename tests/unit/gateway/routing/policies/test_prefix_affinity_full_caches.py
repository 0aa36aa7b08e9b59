"""prefix_affinity over the load bound once the caches are full (`full_cache_fill`): a request with
no conversation of its own stays on its prompt's home unless it would be slower there outright; with
room in the caches, or for a conversation, the bound moves it as before."""

from __future__ import annotations

import pytest

from gateway.errors import ConfigError
from gateway.request.decision import Candidate
from gateway.routing.policies.registry import build_policy
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(10)


def choose(fill: float, cached: int, in_flight: int = 21, **params: float) -> tuple[str, str]:
    policy = build_policy("prefix_affinity", {"seed": 7, "min_bound_requests": 2, **params}, "routing")
    view = RequestView(
        "r",
        "completions",
        "m",
        False,
        {},
        b"",
        prompt_tokens_estimate=2100,
        preamble_tokens=2000,
        preamble_key=42,
        tokens_per_block=16,
    )
    # a: the prompt's home, 21 requests deep (over the bound; 0.23 s predicted against 0.42 s elsewhere)
    candidates = [
        Candidate("a", in_flight=in_flight, cached_tokens=cached, cache_fill=fill),
        *(Candidate(r, cache_fill=fill) for r in "bcd"),
    ]
    decision = policy.choose(view, candidates)
    return decision.replica_id, decision.reason


def test_full_caches_keep_a_shared_prompt_home_over_the_bound() -> None:
    assert choose(fill=1.0, cached=2000) == ("a", "least_wait")
    assert choose(fill=0.5, cached=2000)[1] == "load_bound"  # room to spare: the bound moves it
    assert choose(fill=1.0, cached=2000, full_cache_fill=1.5)[1] == "load_bound"  # above 1: never


def test_a_conversation_follows_the_bound_as_before() -> None:
    # its own history, 0.25 s behind 25 requests against 0.42 s elsewhere: bound_margin's rule moves it
    assert choose(fill=1.0, cached=2100, in_flight=25)[1] == "load_bound"
    assert choose(fill=1.0, cached=2000, in_flight=25) == ("a", "least_wait")  # a shared prompt stays


def test_full_cache_fill_must_be_positive() -> None:
    with pytest.raises(ConfigError) as err:
        build_policy("prefix_affinity", {"full_cache_fill": 0}, "routing")
    assert err.value.key == "routing.params.full_cache_fill"

"""prefix_affinity prices the prompts it has in flight at each replica (`context_weight`), per
preamble, and a preamble's own requests there beyond the first (`burst_weight`), so a tenant's burst
spills off its home before the home's batch is long, and comes back after."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gateway.config.policy_params import CostModelConfig
from gateway.request.decision import Candidate, Outcome
from gateway.routing.policies.cost import CostModel
from gateway.routing.policies.prefix_affinity import PrefixAffinityPolicy
from gateway.routing.policies.registry import build_policy
from gateway.view import RequestView

pytestmark = pytest.mark.timeout(30)
_ids = itertools.count()
TENANT = 0xBEEF


def tenant_request(prompt_tokens: int = 1600, preamble_key: int = TENANT) -> RequestView:
    return RequestView(
        f"req-{next(_ids)}",
        "chat",
        "m",
        False,
        {},
        b"",
        prompt_tokens_estimate=prompt_tokens,
        preamble_tokens=1500,
        preamble_key=preamble_key,
        tokens_per_block=16.0,
    )


def policy(**params: Any) -> PrefixAffinityPolicy:
    # The bound and the preamble's spread out of the way: the predicted TTFTs alone decide.
    settings = {"seed": 3, "load_epsilon": 100.0, "preamble_spread": 0.5, **params}
    built = build_policy("prefix_affinity", settings, "routing")
    assert isinstance(built, PrefixAffinityPolicy)
    return built


def burst_until_spill(p: PrefixAffinityPolicy, limit: int = 60, fill: float = 0.0) -> tuple[int, list[RequestView]]:
    """Send one tenant's requests (home "a" holds its system prompt, "b" is cold; both caches `fill` full),
    each prefilled at once and decoding; returns how many "a" took before the first went to "b", and the
    ones at "a"."""
    at_home: list[RequestView] = []
    for n in range(limit):
        view = tenant_request()
        candidates = [
            Candidate("a", in_flight=len(at_home), cached_tokens=1504, cache_fill=fill),
            Candidate("b", cache_fill=fill),
        ]
        decision = p.choose(view, candidates)
        p.on_dispatched(view, decision)
        p.on_first_token(view, decision.replica_id)  # its prefill is over: only its place in the batch is left
        if decision.replica_id == "b":
            return n, at_home
        at_home.append(view)
    return limit, at_home


def test_in_flight_context_raises_the_wait_of_its_group_only() -> None:
    cost = CostModel(CostModelConfig(prefill_s_per_token=0.001, per_request_tokens=0.0, context_weight=0.1))
    a = Candidate("a", in_flight=1)
    assert cost.predict_many([a], [1.0], 100, 0.0, group=TENANT)[0] == [0.0]
    cost.started("a", TENANT, 2000)
    waits = [cost.predict_many([a], [1.0], 100, 0.0, group=g)[0][0] for g in (TENANT, 7, None)]
    assert waits == [pytest.approx(0.2), 0.0, 0.0]  # 0.1 × 2000 tokens × 1 ms; another tenant's, or unpriced
    cost.ended("a", TENANT, 2000)
    assert cost.predict_many([a], [1.0], 100, 0.0, group=TENANT)[0] == [0.0]


def test_a_burst_spills_sooner_and_comes_home_after() -> None:
    flat, _ = burst_until_spill(policy(context_weight=0.0, burst_weight=0.0))
    priced = policy()
    spilled_after, at_home = burst_until_spill(priced)
    assert 1 <= spilled_after < flat, (spilled_after, flat)
    for view in at_home:  # the burst's requests at home finish
        priced.on_finished(view, "a", Outcome(ok=True))
    assert priced.choose(tenant_request(), [Candidate("a", cached_tokens=1504), Candidate("b")]).replica_id == "a"


def test_a_conversation_continuing_at_home_is_not_priced_by_the_batch() -> None:
    # A later turn (its home holds its history, past the preamble) stays where the history is.
    p = policy()
    for _ in range(30):
        view = tenant_request()
        p.on_dispatched(view, p.choose(view, [Candidate("a", cached_tokens=1504), Candidate("b", cached_tokens=1504)]))
    later_turn = tenant_request(prompt_tokens=3000)
    busy_home = [Candidate("a", in_flight=12, cached_tokens=2900), Candidate("b", in_flight=12)]
    assert p.choose(later_turn, busy_home).replica_id == "a"


def test_a_groups_own_requests_in_flight_beyond_the_first_raise_its_wait_only() -> None:
    params = CostModelConfig(prefill_s_per_token=0.001, per_request_tokens=10.0, context_weight=0.0, burst_weight=2.0)
    cost = CostModel(params)
    a = Candidate("a", in_flight=3)
    for _ in range(3):
        cost.started("a", TENANT, 100)
    waits = [cost.predict_many([a], [3.0], 100, 0.0, burst_group=g)[0][0] for g in (TENANT, 7, 0)]
    # 10 tokens × 3 in flight × 1 ms, plus 2 × 10 tokens × the tenant's 2 beyond its first; another tenant's: none
    assert waits == [pytest.approx(0.07), pytest.approx(0.03), pytest.approx(0.03)]
    cost.ended("a", TENANT, 100)
    cost.ended("a", TENANT, 100)
    assert cost.predict_many([a], [3.0], 100, 0.0, burst_group=TENANT)[0] == [pytest.approx(0.03)]
    cost.forget("a")
    cost.started("a", TENANT, 100)
    cost.started("a", TENANT, 100)
    assert cost.predict_many([a], [3.0], 100, 0.0, burst_group=TENANT)[0] == [pytest.approx(0.05)]


@pytest.mark.parametrize("fill", [0.0, 1.0], ids=["caches-with-room", "full-caches"])
def test_a_priced_burst_spills_sooner_with_full_caches_too(fill: float) -> None:
    flat, _ = burst_until_spill(policy(context_weight=0.0, burst_weight=0.0), fill=fill)
    priced = policy(context_weight=0.0)  # the default burst_weight
    spilled_after, at_home = burst_until_spill(priced, fill=fill)
    assert 1 <= spilled_after < flat, (spilled_after, flat)
    for view in at_home:
        priced.on_finished(view, "a", Outcome(ok=True))
    home = [Candidate("a", cached_tokens=1504, cache_fill=fill), Candidate("b", cache_fill=fill)]
    assert priced.choose(tenant_request(), home).replica_id == "a"

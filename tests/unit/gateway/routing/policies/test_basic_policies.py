"""round_robin, random, least_loaded, power_of_two: each picks from the candidates it is given."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.errors import ConfigError
from gateway.request.decision import Candidate
from gateway.routing.policies import Policy
from gateway.routing.policies.registry import build_policy
from gateway.view import RequestView


def make_view() -> RequestView:
    return RequestView(request_id="r", endpoint="chat", model="m", stream=False, body={}, raw=b"{}")


def picks(policy: Policy, candidates: list[Candidate], n: int) -> Counter[str]:
    return Counter(policy.choose(make_view(), candidates).replica_id for _ in range(n))


def test_round_robin_is_even_and_in_order() -> None:
    policy = build_policy("round_robin", {}, "routing")
    cands = [Candidate("a"), Candidate("b"), Candidate("c")]
    assert [policy.choose(make_view(), cands).replica_id for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]


def test_round_robin_respects_weights_smoothly() -> None:
    policy = build_policy("round_robin", {}, "routing")
    cands = [Candidate("a", weight=2), Candidate("b", weight=1)]
    order = [policy.choose(make_view(), cands).replica_id for _ in range(6)]
    assert order == ["a", "b", "a", "a", "b", "a"]


def test_round_robin_stays_even_when_a_replica_leaves_and_returns() -> None:
    policy = build_policy("round_robin", {}, "routing")
    a, b, c = Candidate("a"), Candidate("b"), Candidate("c")
    policy.choose(make_view(), [a, b, c])
    assert all(9 <= n <= 11 for n in picks(policy, [a, c], 20).values())
    assert all(29 <= n <= 31 for n in picks(policy, [a, b, c], 90).values())


def test_random_is_weighted_and_seeded() -> None:
    policy = build_policy("random", {"seed": 1}, "routing")
    counts = picks(policy, [Candidate("a", weight=3), Candidate("b", weight=1)], 4000)
    assert 2800 < counts["a"] < 3200
    again = build_policy("random", {"seed": 1}, "routing")
    assert picks(again, [Candidate("a", weight=3), Candidate("b", weight=1)], 4000) == counts


@pytest.mark.parametrize(
    ("cands", "expected"),
    [
        ([Candidate("a", in_flight=3), Candidate("b", in_flight=1)], "b"),
        ([Candidate("a", in_flight=0, running=5), Candidate("b", in_flight=2)], "b"),
        ([Candidate("a", in_flight=2, weight=2), Candidate("b", in_flight=2)], "a"),
        ([Candidate("a", kv_usage=0.9), Candidate("b", kv_usage=0.1)], "b"),
    ],
    ids=["in-flight", "scraped-queue", "weight", "kv-tie-break"],
)
def test_least_loaded_picks_lowest_load(cands: list[Candidate], expected: str) -> None:
    decision = build_policy("least_loaded", {}, "routing").choose(make_view(), cands)
    assert decision.replica_id == expected and decision.reason == "least_loaded"
    assert {s.replica_id: s.load for s in decision.scores} == {c.replica_id: c.load for c in cands}


def test_least_loaded_breaks_exact_ties_randomly() -> None:
    counts = picks(build_policy("least_loaded", {"seed": 3}, "routing"), [Candidate("a"), Candidate("b")], 200)
    assert counts["a"] > 50 and counts["b"] > 50


def test_power_of_two_never_picks_the_most_loaded_of_three() -> None:
    policy = build_policy("power_of_two", {"seed": 5}, "routing")
    cands = [Candidate("idle"), Candidate("busy", in_flight=9), Candidate("mid", in_flight=4)]
    counts = picks(policy, cands, 300)
    assert counts["busy"] == 0 and counts["idle"] > counts["mid"] > 0
    decision = policy.choose(make_view(), cands)
    assert len(decision.scores) == 2


def test_power_of_two_single_candidate() -> None:
    decision = build_policy("power_of_two", {}, "routing").choose(make_view(), [Candidate("a")])
    assert decision.replica_id == "a" and decision.reason == "only_candidate"


@pytest.mark.parametrize(
    ("type_", "params", "key"),
    [
        ("round_robin", {"x": 1}, "pools.m.routing.params.x"),
        ("random", {"seed": "one"}, "pools.m.routing.params.seed"),
        ("nope", {}, "pools.m.routing.policy"),
    ],
)
def test_bad_policy_config_names_the_key(type_: str, params: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_policy(type_, params, "pools.m.routing")
    assert info.value.key == key


def test_every_policy_has_its_config_class_and_no_more() -> None:
    from gateway.config.policy_params import POLICY_CONFIGS
    from gateway.routing.policies.registry import REGISTRY

    assert set(REGISTRY) == set(POLICY_CONFIGS), "gateway.config.policy_params.POLICY_CONFIGS and the policies differ"

"""session_affinity: a session goes to its home replica (rendezvous hashing), softly off a busy one."""

from __future__ import annotations

import collections

from gateway.routing.policies.registry import build_policy
from gateway.routing.policies.session_affinity import home_replica
from tests.unit.gateway.routing.policies.test_prefix_affinity import IDS, make_candidates, make_view


def test_session_goes_home_across_policy_instances() -> None:
    home = home_replica("conv-42", IDS)
    for seed in range(3):
        policy = build_policy("session_affinity", {"seed": seed}, "r")
        decision = policy.choose(make_view(session="conv-42"), make_candidates(in_flight=[1, 1, 1, 1]))
        assert decision.replica_id == home and decision.reason == "session_home"


def test_busy_home_loses_the_session_softly() -> None:
    policy = build_policy("session_affinity", {"bonus_requests": 2}, "r")
    home = home_replica("s", IDS)
    in_flight = [6 if r == home else 1 for r in IDS]
    decision = policy.choose(make_view(session="s"), make_candidates(in_flight=in_flight))
    assert decision.replica_id != home


def test_no_session_is_least_loaded() -> None:
    policy = build_policy("session_affinity", {}, "r")
    decision = policy.choose(make_view(), make_candidates(in_flight=[3, 1, 2, 3]))
    assert decision.replica_id == "b" and decision.reason == "no_session"


def test_sessions_spread_evenly_over_homes() -> None:
    counts = collections.Counter(home_replica(f"s{i}", IDS) for i in range(8000))
    assert max(counts.values()) < 1.1 * 2000

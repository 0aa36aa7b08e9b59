"""consistent_hash: a balanced, stable ring with bounded loads; a removed replica moves only its keys."""

from __future__ import annotations

import collections

from gateway.routing.policies.registry import build_policy
from tests.unit.gateway.routing.policies.test_prefix_affinity import IDS, make_candidates, make_view


def test_ring_is_balanced_and_stable() -> None:
    policy = build_policy("consistent_hash", {}, "r")
    counts = collections.Counter(
        policy.choose(make_view(session=f"k{i}"), make_candidates(in_flight=[0] * 4)).replica_id for i in range(8000)
    )
    assert max(counts.values()) < 1.2 * 2000 and min(counts.values()) > 0.8 * 2000
    other = build_policy("consistent_hash", {}, "r")
    same = other.choose(make_view(session="k1"), make_candidates(in_flight=[0] * 4)).replica_id
    assert same == policy.choose(make_view(session="k1"), make_candidates(in_flight=[0] * 4)).replica_id


def test_ring_falls_back_to_the_first_block_then_skips_full_replicas() -> None:
    policy = build_policy("consistent_hash", {}, "r")
    view = make_view(hashes=(123456789, 1))
    owner = policy.choose(view, make_candidates(in_flight=[0] * 4))
    assert owner.reason == "ring_owner"
    loads = [5 if r == owner.replica_id else 1 for r in IDS]
    moved = policy.choose(view, make_candidates(in_flight=loads))
    assert moved.replica_id != owner.replica_id and moved.reason == "load_bound"


def test_removing_a_replica_moves_only_its_keys() -> None:
    policy = build_policy("consistent_hash", {}, "r")
    full, less = make_candidates(in_flight=[0] * 4), make_candidates(in_flight=[0] * 3)
    moved = 0
    for i in range(2000):
        before = policy.choose(make_view(session=f"k{i}"), full).replica_id
        after = policy.choose(make_view(session=f"k{i}"), less).replica_id
        moved += before != after
        assert before == "d" or before == after
    assert 0 < moved < 0.35 * 2000

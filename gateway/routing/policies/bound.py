"""The bounded-load rule shared by the affinity policies (consistent hashing with bounded loads).

A replica may take one more request only while its requests stay within
`max(ceil((1 + epsilon) × mean × weight), min_requests)`, where mean is the fleet's requests per
unit of weight counting the new one. Affinity then spreads a hot key to a second replica
instead of queueing on one; `min_requests` keeps a light load from scattering every
conversation (a replica batches a few requests at almost no cost).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gateway.request.decision import Candidate


def has_room(candidates: Sequence[Candidate], epsilon: float, min_requests: int) -> list[bool]:
    """For each candidate: may it take the next request without breaking the bound?"""
    return has_room_loads([c.load for c in candidates], [c.weight for c in candidates], epsilon, min_requests)


def has_room_loads(loads: Sequence[float], weights: Sequence[float], epsilon: float, min_requests: int) -> list[bool]:
    """`has_room` given each candidate's load and weight (callers that have them computed already).
    The limit is computed once per distinct weight (usually one), not once per candidate."""
    first = weights[0]
    alike = weights.count(first) == len(weights)
    # x * 1.0 is x: replicas of weight 1 need no weighted copy
    weighted = loads if alike and first == 1.0 else [load * weight for load, weight in zip(loads, weights)]
    scaled_mean = (1 + epsilon) * ((_total(weighted) + 1) / _total(weights))
    if alike:  # one limit
        shared = max(math.ceil(scaled_mean * first - 1e-9), min_requests)
        return [requests + 1 <= shared for requests in weighted]
    limits: dict[float, int] = {}
    room = []
    for requests, weight in zip(weighted, weights):
        limit = limits.get(weight)
        if limit is None:
            limit = limits[weight] = max(math.ceil(scaled_mean * weight - 1e-9), min_requests)
        room.append(requests + 1 <= limit)
    return room


def _total(values: Sequence[float]) -> float:
    """`sum(values)` for floats, the same additions in the same order. mypyc types `sum` of floats as an int
    (typeshed's `float | Literal[0]`) and raises TypeError on the first float."""
    total = 0.0
    for value in values:
        total += value
    return total

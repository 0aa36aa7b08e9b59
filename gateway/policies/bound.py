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

from gateway.policies.base import Candidate


def has_room(candidates: Sequence[Candidate], epsilon: float, min_requests: int) -> list[bool]:
    """For each candidate: may it take the next request without breaking the bound?"""
    total = sum(c.load * c.weight for c in candidates) + 1
    mean = total / sum(c.weight for c in candidates)
    return [
        c.load * c.weight + 1 <= max(math.ceil((1 + epsilon) * mean * c.weight - 1e-9), min_requests)
        for c in candidates
    ]

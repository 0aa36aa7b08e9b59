"""consistent_hash: a ring of virtual nodes with bounded loads (CHWBL).

    replica = first replica clockwise from hash(key) whose requests + 1 stay within
              max(ceil((1 + load_epsilon) × mean × weight), min_bound_requests)

Key: `view.session_key` if the client sent one, else the hash of the prompt's first block
(tools and system prompt), else the request id (random spread). Each replica owns
`virtual_nodes × weight` points on the ring: few points skew the ring (KubeAI saw most traffic
on one pod until raising them to 256). The ring is cached per candidate set.

YAML:
    routing:
      policy: consistent_hash
      params: {virtual_nodes: 256, load_epsilon: 0.25}
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import xxhash

from gateway.config.policy_params import ConsistentHashPolicyConfig
from gateway.request.decision import Candidate, Decision
from gateway.routing.policies.base import Policy, scores_by_load
from gateway.routing.policies.bound import has_room
from gateway.view import RequestView

_Ring = tuple[list[int], list[str]]


class ConsistentHashPolicy(Policy):
    type = "consistent_hash"
    needs_prefix = True  # the first block hash is the fallback key

    def __init__(self, params: ConsistentHashPolicyConfig) -> None:
        super().__init__(params)
        self._rings: dict[tuple[tuple[str, float], ...], _Ring] = {}

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        points, owners = self._ring(candidates)
        if view.session_key:
            key = xxhash.xxh3_64_intdigest(view.session_key.encode())
        elif view.block_hashes:
            key = view.block_hashes[0]
        else:
            key = xxhash.xxh3_64_intdigest(view.request_id.encode())
        room = dict(
            zip(
                (c.replica_id for c in candidates),
                has_room(candidates, self.params.load_epsilon, self.params.min_bound_requests),
            )
        )
        start = bisect.bisect(points, key)
        first = owners[start % len(owners)]
        chosen = first
        for i in range(len(owners)):
            owner = owners[(start + i) % len(owners)]
            if room[owner]:
                chosen = owner
                break
        return Decision(chosen, "ring_owner" if chosen == first else "load_bound", scores_by_load(candidates))

    def _ring(self, candidates: Sequence[Candidate]) -> _Ring:
        members = tuple(sorted((c.replica_id, c.weight) for c in candidates))
        ring = self._rings.get(members)
        if ring is None:
            if len(self._rings) >= 16:  # candidate sets change only with health; keep a few
                self._rings.clear()
            nodes = sorted(
                (xxhash.xxh3_64_intdigest(f"{rid}#{i}".encode()), rid)
                for rid, weight in members
                for i in range(max(1, round(self.params.virtual_nodes * weight)))
            )
            ring = self._rings[members] = ([p for p, _ in nodes], [rid for _, rid in nodes])
        return ring

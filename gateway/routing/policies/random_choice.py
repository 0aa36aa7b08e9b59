"""random: a uniformly random replica, or weighted by `weight` when weights differ.

YAML: `routing: {policy: random, params: {seed: 7}}` (seed optional, for reproducible tests).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.request.decision import Candidate, Decision
from gateway.routing.policies.base import SeededPolicy, scores_by_load
from gateway.view import RequestView


class RandomPolicy(SeededPolicy):
    type = "random"

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        chosen = self.rng.choices(candidates, weights=[c.weight for c in candidates])[0]
        return Decision(chosen.replica_id, "random", scores_by_load(candidates))

"""least_loaded: the replica with the fewest requests per unit of weight.

load = max(in_flight, running + waiting) / weight  (see `Candidate.load`): the gateway's own exact
count, or the replica's scraped queue when other clients load it too. Ties go to the replica with the
lower KV-cache usage, then to a random one, so identical bursts do not herd onto the first replica.
YAML: `routing: {policy: least_loaded, params: {seed: null}}`.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.request.decision import Candidate, Decision
from gateway.routing.policies.base import SeededPolicy, scores_by_load
from gateway.view import RequestView


class LeastLoadedPolicy(SeededPolicy):
    type = "least_loaded"

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        best = min((c.load, c.kv_usage) for c in candidates)
        tied = [c for c in candidates if (c.load, c.kv_usage) == best]
        chosen = tied[0] if len(tied) == 1 else self.rng.choice(tied)
        return Decision(chosen.replica_id, "least_loaded", scores_by_load(candidates))

"""power_of_two: sample two replicas (weighted), keep the less loaded one.

Nearly as good as least_loaded at spreading load, but with stale load signals (several gateways,
slow scrapes) it does not herd every request onto the one replica that looked idle.
YAML: `routing: {policy: power_of_two, params: {seed: null}}`.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.request.decision import Candidate, Decision
from gateway.routing.policies.base import SeededPolicy, scores_by_load
from gateway.view import RequestView


class PowerOfTwoPolicy(SeededPolicy):
    type = "power_of_two"

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        if len(candidates) == 1:
            return Decision(candidates[0].replica_id, "only_candidate", scores_by_load(candidates))
        weights = [c.weight for c in candidates]
        first = self.rng.choices(range(len(candidates)), weights=weights)[0]
        rest = [i for i in range(len(candidates)) if i != first]
        second = self.rng.choices(rest, weights=[weights[i] for i in rest])[0]
        a, b = candidates[first], candidates[second]
        chosen = a if (a.load, a.kv_usage) <= (b.load, b.kv_usage) else b
        return Decision(chosen.replica_id, "power_of_two", scores_by_load((a, b)))

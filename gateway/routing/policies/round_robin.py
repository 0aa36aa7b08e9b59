"""round_robin: each replica in turn; a replica of weight w gets w turns per cycle (smooth weighted RR).

YAML: `routing: {policy: round_robin}` (no parameters).
Score rows carry the load only, for the log; the pick ignores load.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.request.decision import Candidate, Decision
from gateway.routing.policies.base import Policy, scores_by_load
from gateway.view import RequestView


class RoundRobinPolicy(Policy):
    type = "round_robin"

    def __init__(self, params: object) -> None:
        super().__init__(params)
        # nginx's smooth weighted round robin state; a replica absent from a call (down, or excluded
        # on a retry) keeps its value, which is at most one cycle out of step when it returns.
        self._current: dict[str, float] = {}

    def on_removed(self, replica_id: str) -> None:
        self._current.pop(replica_id, None)

    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        total = 0.0
        best: Candidate | None = None
        for c in candidates:
            current = self._current.get(c.replica_id, 0.0) + c.weight
            self._current[c.replica_id] = current
            total += c.weight
            if best is None or current > self._current[best.replica_id]:
                best = c
        assert best is not None, "choose() needs candidates"
        self._current[best.replica_id] -= total
        return Decision(best.replica_id, "round_robin", scores_by_load(candidates))

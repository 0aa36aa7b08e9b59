"""Router: turns a request and the pool's candidates into a Decision, for one pool.

The request path calls `route()` once per attempt and `finished()` once per request.
Prefix hashing and the warm-prefix index lookup happen here, only for policies that need them.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.policies import Candidate, Decision, Outcome, Policy
from gateway.view import RequestView


class Router:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    async def route(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        decision = self.policy.choose(view, candidates)
        self.policy.on_dispatched(view, decision.replica_id)
        return decision

    def finished(self, view: RequestView, replica_id: str, outcome: Outcome) -> None:
        self.policy.on_finished(view, replica_id, outcome)

    async def close(self) -> None:
        return None

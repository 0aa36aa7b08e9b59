"""The routing-policy interface: gather data first, then decide purely and synchronously.

The request path fills each `Candidate` (load, scraped queue, matched warm prefix) and calls
`Policy.choose`, which does no I/O and returns a `Decision` with one `Score` row per candidate,
so every decision can be logged and explained.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from gateway.config.policy_params import SeededPolicyConfig
from gateway.request.decision import Candidate, Decision, Outcome, Score
from gateway.view import RequestView


class Policy(ABC):
    """One routing policy. `type` is its YAML name; `params` its validated parameters, of the class
    `gateway.config.policy_params.POLICY_CONFIGS` names for `type`."""

    type: ClassVar[str]
    needs_prefix: ClassVar[bool] = False  # the Router hashes the prompt into view.block_hashes
    needs_index: ClassVar[bool] = False  # ...and fills Candidate.cached_tokens from the warm index

    def __init__(self, params: Any) -> None:
        self.params = params

    @abstractmethod
    def choose(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        """Pick one of `candidates` (never empty). Pure: no I/O, no awaits."""

    def on_dispatched(self, view: RequestView, decision: Decision) -> None:
        """The request holds its slot on `decision.replica_id` and is sent next: the decision is committed.
        A decision that is never committed (the client left, the slot went elsewhere) reaches no hook."""

    def on_failed(self, view: RequestView, replica_id: str) -> None:
        """That attempt failed before any answer (connect error, 5xx): undo what `on_dispatched` counted."""

    def on_first_token(self, view: RequestView, replica_id: str) -> None:
        """Called when the first byte of the answer arrives: the replica's prefill of it is over."""

    def on_finished(self, view: RequestView, replica_id: str, outcome: Outcome) -> None:
        """Called when the request ended, successfully or not."""

    def on_removed(self, replica_id: str) -> None:
        """The replica left the pool (reload, discovery): drop what is kept about it. With Kubernetes
        discovery every restarted pod is a new id, so per-replica state would otherwise only grow."""

    def prefill_s_per_token(self, replica_id: str) -> float | None:
        """The prefill cost per token the policy has learned, if it models one (gateway.insights.prefix_report)."""
        return None


class SeededPolicy(Policy, ABC):
    """A policy that draws random numbers (sampling, tie-breaks) from its own seeded generator."""

    def __init__(self, params: SeededPolicyConfig) -> None:
        super().__init__(params)
        self.rng = random.Random(params.seed)


def scores_by_load(candidates: Sequence[Candidate]) -> tuple[Score, ...]:
    return tuple(Score(c.replica_id, c.load, load=c.load) for c in candidates)


__all__ = ["Candidate", "Decision", "Outcome", "Policy", "Score", "SeededPolicy", "scores_by_load"]

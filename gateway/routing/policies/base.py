"""The routing-policy interface: gather data first, then decide purely and synchronously.

The request path fills each `Candidate` (load, scraped queue, matched warm prefix) and calls
`Policy.choose`, which does no I/O and returns a `Decision` with one `Score` row per candidate,
so every decision can be logged and explained.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.config.policy_params import SeededPolicyConfig
from gateway.view import RequestView


@dataclass(slots=True)
class Candidate:
    """One healthy replica as the policy sees it for one request."""

    replica_id: str
    weight: float = 1.0
    in_flight: int = 0  # this gateway's requests now at the replica (exact)
    running: int = 0  # scraped vllm:num_requests_running (0 when unknown)
    waiting: int = 0  # scraped vllm:num_requests_waiting
    kv_usage: float = 0.0  # scraped vllm:kv_cache_usage_perc, 0..1
    cached_tokens: int = 0  # longest warm prefix, filled when the policy needs_prefix
    cache_fill: float = 0.0  # how full its prefix cache is, 0..1, as the warm index sees it (needs_index)

    @property
    def load(self) -> float:
        """Requests queued or running at the replica, as best we know, per unit of weight."""
        return max(self.in_flight, self.running + self.waiting) / self.weight


@dataclass(frozen=True, slots=True)
class Score:
    replica_id: str
    score: float  # lower is better; seconds of predicted TTFT for prefix_affinity
    load: float = 0.0
    cached_tokens: int = 0
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    replica_id: str
    reason: str  # why this replica: "round_robin", "least_loaded", "prefix_hit", "load_bound", ...
    scores: tuple[Score, ...] = ()

    def explain(self) -> dict[str, Any]:
        return {"replica": self.replica_id, "reason": self.reason, "candidates": self.candidates()}

    def candidates(self) -> list[dict[str, Any]]:
        """Every scored row, as `explain` and the request log show them."""
        return [{"replica": s.replica_id, "score": round(s.score, 6), "load": s.load,
                 "cached_tokens": s.cached_tokens, "wait_s": round(s.wait_s, 6)} for s in self.scores]

    def chosen(self) -> Score | None:
        """The chosen replica's row (its last, should an id repeat), if the policy scored it."""
        return next((s for s in reversed(self.scores) if s.replica_id == self.replica_id), None)

    def header_value(self, most: int = 8) -> str:
        """Compact one-line form for the opt-in X-Gateway-Route header: the best `most` candidates."""
        best = sorted(self.scores, key=lambda s: s.score)[:most]
        rows = ",".join(f"{s.replica_id}:ttft={s.score:.4f}:cached={s.cached_tokens}:wait={s.wait_s:.4f}"
                        for s in best)
        return f"replica={self.replica_id};reason={self.reason};candidates={rows}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a dispatched request, fed back to the policy for learning."""

    ok: bool
    ttft_s: float | None = None
    prompt_tokens: int | None = None  # usage.prompt_tokens, when the replica reported it
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    completion_tokens: int | None = None  # usage.completion_tokens, when reported
    predicted: Score | None = None  # the chosen replica's row at dispatch; attached by the Router
    answer: str | None = None  # the answer's text, when the Router asked for it (records_answers)


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

    def on_dispatched(self, view: RequestView, replica_id: str) -> None:
        """Called once the request holds its slot on `replica_id` and is about to be sent."""

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

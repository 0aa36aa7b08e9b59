"""What routing reads and decides for one request: the candidates, their scores, the decision and,
once the request ended, its outcome. Data only: the policies (`gateway.routing.policies`) make them,
the attempt loop commits them, observers read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.request.timing import micro
from gateway.support.records import record


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


@record
class Score:
    replica_id: str
    score: float  # lower is better; seconds of predicted TTFT for prefix_affinity
    load: float = 0.0
    cached_tokens: int = 0
    wait_s: float = 0.0


@record
class Decision:
    replica_id: str
    reason: str  # why this replica: "round_robin", "least_loaded", "prefix_hit", "load_bound", ...
    scores: tuple[Score, ...] = ()
    evidence: str = ""  # the warm-prefix rung behind the chosen row's cached tokens (the Router fills it)
    # What the policy worked out for this choice and needs again when it is committed (`on_dispatched`):
    # it travels with the decision, so a decision that is never committed leaves nothing behind.
    plan: Any = field(default=None, compare=False, repr=False)

    def with_evidence(self, evidence: str) -> Decision:
        """This decision with its rung: `dataclasses.replace` costs six times as much, on every request."""
        return Decision(self.replica_id, self.reason, self.scores, evidence, self.plan)

    def explain(self) -> dict[str, Any]:
        return {"replica": self.replica_id, "reason": self.reason, "candidates": self.candidates()}

    def candidates(self) -> list[dict[str, Any]]:
        """Every scored row, as `explain` and the request log show them."""
        return [
            {
                "replica": s.replica_id,
                "score": micro(s.score),
                "load": s.load,
                "cached_tokens": s.cached_tokens,
                "wait_s": micro(s.wait_s),
            }
            for s in self.scores
        ]

    def chosen(self) -> Score | None:
        """The chosen replica's row (its last, should an id repeat), if the policy scored it."""
        for row in reversed(self.scores):
            if row.replica_id == self.replica_id:
                return row
        return None

    def header_value(self, most: int = 8) -> str:
        """Compact one-line form for the opt-in X-Gateway-Route header: the best `most` candidates."""
        best = sorted(self.scores, key=lambda s: s.score)[:most]
        rows = ",".join(f"{s.replica_id}:ttft={s.score:.4f}:cached={s.cached_tokens}:wait={s.wait_s:.4f}" for s in best)
        return f"replica={self.replica_id};reason={self.reason};candidates={rows}"


@record
class Outcome:
    """What happened to a dispatched request, fed back to the policy for learning."""

    ok: bool
    ttft_s: float | None = None
    prompt_tokens: int | None = None  # usage.prompt_tokens, when the replica reported it
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    completion_tokens: int | None = None  # usage.completion_tokens, when reported
    predicted: Score | None = None  # the chosen replica's row at dispatch; attached by the Router
    answer: str | None = None  # the answer's text, when the Router asked for it (records_answers)

    def with_predicted(self, predicted: Score | None) -> Outcome:
        """This outcome with its prediction attached (`dataclasses.replace` costs six times as much)."""
        return Outcome(
            self.ok, self.ttft_s, self.prompt_tokens, self.cached_tokens, self.completion_tokens, predicted, self.answer
        )

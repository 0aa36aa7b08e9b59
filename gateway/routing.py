"""Router: turns a request and the pool's candidates into a Decision, for one pool.

The request path calls `route()` once per attempt and `finished()` once per request.
For policies that need the prefix, the Router hashes the prompt once (kept on the view for
retries), asks the warm index about all candidates in one call, and after the pick records
the request's blocks as warm on the chosen replica (the answer cannot be recorded: the gateway
relays it without buffering). It keeps the chosen replica's prediction per request until
`finished()`, to learn from the observed TTFT and to export how right the prediction was.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from gateway import prefix
from gateway.index import MemoryIndex, WarmIndex
from gateway.index.base import IndexParams
from gateway.policies import Candidate, Decision, Outcome, Policy, Score
from gateway.prefix import PrefixParams
from gateway.routing_metrics import RoutingMetrics
from gateway.view import RequestView

MAX_TRACKED = 100_000  # predictions kept for requests not yet finished (bounds a leak if one never is)


class Router:
    def __init__(self, policy: Policy, prefix_params: PrefixParams | None = None, index: WarmIndex | None = None,
                 metrics: RoutingMetrics | None = None, pool: str = "default") -> None:
        """`index` is owned (closed by `close()`); a fresh in-memory one when not given."""
        self.policy = policy
        self.prefix_params = prefix_params or PrefixParams()
        self.index: WarmIndex = index if index is not None else MemoryIndex(IndexParams().capacity_blocks)
        self.metrics = metrics
        self.pool = pool
        self._predicted: dict[str, Score] = {}

    async def route(self, view: RequestView, candidates: Sequence[Candidate]) -> Decision:
        start = time.perf_counter()
        await self._fill(view, candidates)
        decision = self.policy.choose(view, candidates)
        replica_id = decision.replica_id
        self.policy.on_dispatched(view, replica_id)
        if self.policy.needs_index and view.block_hashes:
            self.index.record(replica_id, view.block_hashes)
        chosen = next((s for s in decision.scores if s.replica_id == replica_id), None)
        if chosen is not None:
            self._track(view.request_id, chosen)
        if self.metrics is not None:
            self._observe(decision, chosen, time.perf_counter() - start)
        return decision

    def finished(self, view: RequestView, replica_id: str, outcome: Outcome) -> None:
        """An attempt ended: once per failed replica and once for the one that answered (if any).
        `outcome` carries the observed TTFT and the replica's usage counts."""
        predicted = self._predicted.get(view.request_id)
        if predicted is not None and predicted.replica_id == replica_id:
            del self._predicted[view.request_id]
        else:
            predicted = None  # an earlier attempt that failed; the latest attempt is reported separately
        if predicted is not None and outcome.ok and self.metrics is not None:
            if outcome.cached_tokens is not None:
                self.metrics.cached_error.labels(self.pool).observe(predicted.cached_tokens - outcome.cached_tokens)
            if outcome.ttft_s is not None and self.policy.needs_index:
                self.metrics.ttft_error.labels(self.pool).observe(predicted.score - outcome.ttft_s)
        if outcome.ok and outcome.answer and self.records_answers:
            # The replica keeps the answer's KV too; the conversation's next turn starts with it.
            self.index.record(replica_id, prefix.with_answer(view, self.prefix_params, outcome.answer))
        self.policy.on_finished(view, replica_id, dataclasses.replace(outcome, predicted=predicted))

    @property
    def records_answers(self) -> bool:
        """Whether `finished` wants `Outcome.answer` (the request path collects it only then)."""
        return self.policy.needs_index

    async def explain(self, view: RequestView, candidates: Sequence[Candidate]) -> dict[str, Any]:
        """Dry run: what `route` would decide now, recording nothing (a rotating policy still rotates)."""
        await self._fill(view, candidates)
        decision = self.policy.choose(view, candidates)
        return {
            "policy": self.policy.type,
            "prompt_tokens_estimate": view.prompt_tokens_estimate,
            "prefix_blocks": len(view.block_hashes),
            "preamble_tokens": view.preamble_tokens,
            "index_degraded": self.index.degraded,
            **decision.explain(),
        }

    async def close(self) -> None:
        self._predicted.clear()
        await self.index.close()

    async def _fill(self, view: RequestView, candidates: Sequence[Candidate]) -> None:
        """Hash the prompt once per request and fill each candidate's warm-prefix length."""
        if not self.policy.needs_prefix:
            return
        if not view.block_hashes:
            hashed = prefix.compute(view, self.prefix_params)
            view.block_hashes, view.preamble_tokens = hashed.block_hashes, hashed.preamble_tokens
            view.preamble_key, view.tokens_per_block = hashed.preamble_key, hashed.tokens_per_block
            view.prompt_tokens_estimate = view.prompt_tokens_estimate or hashed.prompt_tokens
        if not self.policy.needs_index or not view.block_hashes:
            return
        if self.index.degraded and self.metrics is not None:
            self.metrics.index_fallbacks.labels(self.pool).inc()
        matched = await self.index.match(view.block_hashes, [c.replica_id for c in candidates])
        for c in candidates:
            c.cached_tokens = min(int(matched.get(c.replica_id, 0) * view.tokens_per_block),
                                  view.prompt_tokens_estimate)

    def _track(self, request_id: str, chosen: Score) -> None:
        self._predicted.pop(request_id, None)  # a retry replaces the earlier attempt's prediction
        if len(self._predicted) >= MAX_TRACKED:
            del self._predicted[next(iter(self._predicted))]
        self._predicted[request_id] = chosen

    def _observe(self, decision: Decision, chosen: Score | None, elapsed_s: float) -> None:
        assert self.metrics is not None
        m, pool = self.metrics, self.pool
        m.decisions.labels(pool, self.policy.type, decision.reason).inc()
        m.route_seconds.labels(pool).observe(elapsed_s)
        if self.policy.needs_index:
            m.matched_tokens.labels(pool).observe(chosen.cached_tokens if chosen else 0)
            m.index_degraded.labels(pool).set(1 if self.index.degraded else 0)

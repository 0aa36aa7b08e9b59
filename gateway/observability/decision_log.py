"""The latest routing decisions, each candidate's score with it, for the dashboard (`GET /admin/decisions`).

A ring of the last `SIZE` finished requests that were routed: appending keeps a reference to the
request's `Decision` (already built for routing) and a few numbers, O(1); the JSON is made only when
asked. With each: its TTFT and time to complete (the dashboard plots them over time), and the cached
tokens the policy predicted on the chosen replica next to those the replica reported.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from gateway.request.decision import Decision
from gateway.request.exchange import FinishedRequest
from gateway.request.observers import RequestObserver
from gateway.request.timing import Timing, rounded
from gateway.request.usage import Usage
from gateway.support.records import record

SIZE = 200


@record
class _Entry:
    at: float
    model: str
    request_id: str
    status: int
    decision: Decision
    timing: Timing
    prompt_tokens: int | None
    cached_tokens: int | None


class DecisionLog(RequestObserver):
    """The latest committed decisions, as their requests finish."""

    def __init__(self, size: int = SIZE) -> None:
        self._entries: deque[_Entry] = deque(maxlen=size)

    def finished(self, done: FinishedRequest) -> None:
        if done.decision is not None:
            self.record(done.model, done.view.request_id, done.status, done.decision, done.timing, done.usage)

    def record(
        self, model: str, request_id: str, status: int, decision: Decision, timing: Timing, usage: Usage
    ) -> None:
        self._entries.append(
            _Entry(time.time(), model, request_id, status, decision, timing, usage.prompt_tokens, usage.cached_tokens)
        )

    def latest(self, limit: int) -> list[dict[str, Any]]:
        """The newest first."""
        out: list[dict[str, Any]] = []
        for entry in reversed(self._entries):
            if len(out) >= limit:
                break
            chosen = entry.decision.chosen()
            out.append(
                {
                    "at": round(entry.at, 3),
                    "model": entry.model,
                    "request_id": entry.request_id,
                    "status": entry.status,
                    "ttft_s": rounded(entry.timing.ttft_s),
                    "total_s": rounded(entry.timing.total_s),
                    "prompt_tokens": entry.prompt_tokens,
                    "predicted_cached_tokens": chosen.cached_tokens if chosen is not None else None,
                    "reported_cached_tokens": entry.cached_tokens,
                    **entry.decision.explain(),
                }
            )
        return out

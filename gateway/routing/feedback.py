"""The router hears how each request it decided went: the answer's first byte (its prefill is over) and
the end, with the replica's usage, so that the cost model learns and the warm-prefix index follows.

Its learning is synchronous: the next request's decision reads it. The answer's blocks (the start of a
conversation's next turn) are recorded in the batch after the answer (`AnswerRecords`): no request read
before that batch can be the turn that follows this answer, its client has not had the answer yet."""

from __future__ import annotations

from gateway.request.decision import Outcome
from gateway.request.exchange import Exchange, FinishedRequest
from gateway.request.observers import RequestObserver


class RoutingFeedback(RequestObserver):
    """Feeds each request's router (`Exchange.router`, the one that decided it, kept across a reload)."""

    def first_byte(self, exchange: Exchange, replica_id: str) -> None:
        exchange.router.first_token(exchange.view, replica_id)

    def finished(self, done: FinishedRequest) -> None:
        """Once per request, for the last replica tried (earlier ones were taken back as they failed)."""
        if done.replica_id is None:
            return
        usage, ok = done.usage, done.ok
        done.router.finished(
            done.view,
            done.replica_id,
            Outcome(
                ok=ok,
                ttft_s=done.timing.ttft_s if done.streamed and ok else None,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.cached_tokens,
                completion_tokens=usage.completion_tokens,
            ),
        )


class AnswerRecords(RequestObserver):
    """Each answer recorded with the router that decided its request, as its conversation's next prefix
    (added batched: module docstring)."""

    def finished(self, done: FinishedRequest) -> None:
        usage = done.usage
        if done.replica_id is None or not usage.answer:
            return
        done.router.record_answer(
            done.view,
            done.replica_id,
            Outcome(
                ok=done.ok,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                answer="".join(usage.answer),
            ),
        )

"""The router hears how each request it decided went: the answer's first byte (its prefill is over) and
the end, with the replica's usage, so that the cost model learns and the warm-prefix index follows."""

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
                answer="".join(usage.answer) if usage.answer else None,
            ),
        )
